"""The emulator's kubelet stand-in (tests/kubeapi/kubelet_sim.py), proved with the real kubectl: pods and a
DaemonSet's pods bound to nodes whose file trees are attached really run their init containers' commands against
that tree (/host read-only), share emptyDirs, report exit codes and termination messages within the kubelet's
limits; pods on NotReady nodes or with an unpullable image never start."""
from __future__ import annotations

import json
import time

import pytest

from tests.kubeapi.kubelet_sim import limit_messages
from tests.nodes.farm import Tree

pytestmark = pytest.mark.tools


@pytest.fixture
def emulator_options():
    return {"gpu_nodes": ["tree-1", "tree-2"], "cpu_nodes": ["plain"]}


@pytest.fixture
def kubelet(cluster, tmp_path):
    sim = cluster.emu.kubelet()
    for name in ("tree-1", "tree-2"):
        tree = Tree(tmp_path / name)
        tree.file("/etc/os-release", f"ID=test\nNODE={name}\n")
        sim.attach(name, tree.root)
    return sim


def pod_yaml(name: str, node: str, inits: list[tuple[str, str]], image: str = "busybox:1.37.0",
             read_only: bool = True) -> str:
    containers = "".join(f"""
  - name: {cname}
    image: {image}
    command: ["sh", "-c", {json.dumps(script)}]
    volumeMounts: [{{name: host, mountPath: /host, readOnly: {str(read_only).lower()}}}, {{name: work, mountPath: /work}}]"""
                         for cname, script in inits)
    return f"""apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeName: {node}
  initContainers:{containers}
  containers:
  - {{name: main, image: {image}, command: ["sleep", "2147483647"]}}
  volumes:
  - {{name: host, hostPath: {{path: /, type: Directory}}}}
  - {{name: work, emptyDir: {{}}}}
"""


def pod_status(cluster, name: str, until, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        pod = json.loads(cluster.kubectl("get", "pod", name, "-n", "default", "-o", "json").stdout)
        if until(pod.get("status") or {}) or time.monotonic() > deadline:
            return pod["status"]
        time.sleep(0.1)


def test_init_containers_run_against_the_node_tree_and_report_their_messages(cluster, kubelet):
    cluster.kubectl("apply", "-f", "-", input=pod_yaml("reader", "tree-2", [
        ("first", "cat /host/etc/os-release > /work/seen; echo from-first > /dev/termination-log"),
        ("second", "cat /work/seen > /dev/termination-log; head -c 5000 /dev/zero | tr '\\0' x >> /work/big"),
        ("third", "cat /work/big > /dev/termination-log")]))
    status = pod_status(cluster, "reader", lambda s: s.get("phase") == "Running")
    assert status["phase"] == "Running"
    messages = [s["state"]["terminated"].get("message", "") for s in status["initContainerStatuses"]]
    assert messages[0] == "from-first\n"
    assert messages[1] == "ID=test\nNODE=tree-2\n"  # this node's tree, through an emptyDir shared by the inits
    assert messages[2] == "x" * 3072  # last 4,096 bytes kept, then 12 KiB / 4 containers, first bytes kept
    assert status["containerStatuses"][0]["state"]["running"]
    assert [(n, c) for n, p, c in kubelet.executed if p == "reader"] == [
        ("tree-2", "first"), ("tree-2", "second"), ("tree-2", "third")]


def test_the_host_mount_is_read_only_and_a_failing_init_container_backs_off(cluster, kubelet, tmp_path):
    cluster.kubectl("apply", "-f", "-", input=pod_yaml("writer", "tree-1", [
        ("write", "echo trying > /dev/termination-log; touch /host/etc/owned")]))
    status = pod_status(cluster, "writer", lambda s: s.get("initContainerStatuses"))
    init = status["initContainerStatuses"][0]
    assert status["phase"] == "Pending" and init["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert init["lastState"]["terminated"]["exitCode"] == 1
    assert init["lastState"]["terminated"]["message"] == "trying\n"
    assert not (tmp_path / "tree-1" / "etc" / "owned").exists()


def test_a_daemonset_pod_runs_on_a_tainted_node_and_not_on_a_notready_one(cluster, kubelet):
    for node in ("tree-1", "tree-2"):
        cluster.kubectl("taint", "node", node, "nvidia.com/gpu=present:NoSchedule")
    cluster.emu.set_node_not_ready("tree-2")
    cluster.kubectl("apply", "-f", "-", input="""apiVersion: apps/v1
kind: DaemonSet
metadata: {name: probe, namespace: default}
spec:
  selector: {matchLabels: {app: probe}}
  template:
    metadata: {labels: {app: probe}}
    spec:
      affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [
        {matchFields: [{key: metadata.name, operator: In, values: [tree-1]}]},
        {matchFields: [{key: metadata.name, operator: In, values: [tree-2]}]}]}}}
      tolerations: [{operator: Exists}]
      initContainers:
      - {name: probe, image: busybox:1.37.0, command: [sh, -c, "grep NODE /host/etc/os-release > /dev/termination-log"],
         volumeMounts: [{name: host, mountPath: /host, readOnly: true}]}
      containers:
      - {name: sleep, image: busybox:1.37.0, command: [sleep, "2147483647"]}
      volumes: [{name: host, hostPath: {path: /}}]
""")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pods = json.loads(cluster.kubectl("get", "pods", "-n", "default", "-l", "app=probe", "-o", "json").stdout)
        by_node = {p["spec"].get("nodeName"): p for p in pods["items"]}
        if by_node.get("tree-1", {}).get("status", {}).get("phase") == "Running" and "tree-2" in by_node:
            break
        time.sleep(0.1)
    assert by_node["tree-1"]["status"]["initContainerStatuses"][0]["state"]["terminated"]["message"] == \
        "NODE=tree-1\n"
    stuck = by_node["tree-2"]["status"]  # bound (every taint tolerated) but its kubelet is gone: nothing started
    assert stuck.get("phase", "Pending") == "Pending" and "initContainerStatuses" not in stuck
    assert "plain" not in by_node


def test_an_unpullable_image_never_starts(cluster, kubelet):
    kubelet.unpullable.add("registry.invalid/busybox:1")
    cluster.kubectl("apply", "-f", "-", input=pod_yaml("nopull", "tree-1", [("probe", "true")],
                                                       image="registry.invalid/busybox:1"))
    status = pod_status(cluster, "nopull", lambda s: s.get("initContainerStatuses"))
    waiting = status["initContainerStatuses"][0]["state"]["waiting"]
    assert status["phase"] == "Pending" and waiting["reason"] == "ErrImagePull"
    assert "registry.invalid/busybox:1" in waiting["message"]
    assert not [e for e in kubelet.executed if e[1] == "nopull"]


@pytest.mark.unit
def test_message_limits_are_the_kubelets():
    """Per container the LAST 4,096 bytes; per pod 12 KiB split evenly over the containers, FIRST bytes kept."""
    assert limit_messages({"a": "a" * 10 + "b" * 4096}) == {"a": "b" * 4096}
    limited = limit_messages({"a": "x" * 4000, "b": "", "c": "", "d": "", "e": ""})
    assert limited["a"] == "x" * (12 * 1024 // 5)
