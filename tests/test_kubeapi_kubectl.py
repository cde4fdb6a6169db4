"""The real kubectl (pinned v1.33 from .tools/bin) against the emulator: every command our users and our docs use."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.tools import tool

pytestmark = pytest.mark.tools

MANIFEST = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: demo}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: web, image: "nginx:1.27", ports: [{containerPort: 80}]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cfg, namespace: demo}
data: {a: "1"}
"""


@pytest.fixture
def manifest(tmp_path):
    path = tmp_path / "app.yaml"
    path.write_text(MANIFEST)
    return str(path)


def test_get_nodes_wide_lists_gpu_nodes_with_their_columns(cluster):
    out = cluster.kubectl("get", "nodes", "-o", "wide").stdout
    header, *rows = out.splitlines()
    assert header.split()[:5] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert "INTERNAL-IP" in header and "CONTAINER-RUNTIME" in header
    assert [row.split()[0] for row in rows] == ["cpu-1", "gpu-1", "gpu-2"]
    assert all(row.split()[1] == "Ready" for row in rows)
    gpus = cluster.kubectl("get", "nodes", "-o", "jsonpath={.items[*].status.allocatable.nvidia\\.com/gpu}").stdout
    assert gpus.split() == ["8", "8"]


def test_describe_node_shows_capacity_and_system_info(cluster):
    out = cluster.kubectl("describe", "node", "gpu-1").stdout
    assert "nvidia.com/gpu:     8" in out and "Kubelet Version:            v1.31.0" in out
    assert "Taints:             <none>" in out and "HolderIdentity:  gpu-1" in out


def test_create_namespace_and_client_side_apply_twice(cluster, manifest):
    cluster.kubectl("create", "ns", "demo")
    first = cluster.kubectl("apply", "-f", manifest).stdout
    assert "deployment.apps/web created" in first and "configmap/cfg created" in first
    cluster.emu.requests.clear()
    second = cluster.kubectl("apply", "-f", manifest).stdout
    assert "deployment.apps/web unchanged" in second and "configmap/cfg unchanged" in second
    assert cluster.emu.requests.writes() == []


def test_server_side_apply_twice_second_is_a_no_op(cluster, manifest):
    cluster.kubectl("create", "ns", "demo")
    cluster.kubectl("apply", "--server-side", "-f", manifest)
    assert cluster.emu.settle()  # the controllers' status updates of the new Deployment are not the apply's writes
    before = cluster.emu.get("deployments", "web", "demo")["metadata"]["resourceVersion"]
    cluster.kubectl("apply", "--server-side", "-f", manifest)
    deploy = cluster.emu.get("deployments", "web", "demo")
    assert deploy["metadata"]["resourceVersion"] == before
    managers = {(m["manager"], m["operation"]) for m in deploy["metadata"]["managedFields"]}
    assert ("kubectl", "Apply") in managers


def test_label_taint_untaint_and_annotate_a_node(cluster):
    cluster.kubectl("label", "node", "gpu-1", "team=ml")
    cluster.kubectl("taint", "node", "gpu-1", "nvidia.com/gpu=present:NoSchedule")
    cluster.kubectl("annotate", "node", "gpu-1", "owner=platform")
    node = cluster.emu.get("nodes", "gpu-1")
    assert node["metadata"]["labels"]["team"] == "ml"
    assert node["metadata"]["annotations"]["owner"] == "platform"
    assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    cluster.kubectl("taint", "node", "gpu-1", "nvidia.com/gpu=present:NoSchedule-")
    assert not cluster.emu.get("nodes", "gpu-1")["spec"].get("taints")
    taint_twice = cluster.kubectl("taint", "node", "gpu-2", "x=y:Bogus", check=False)
    assert taint_twice.returncode != 0


def test_patch_merge_json_and_strategic(cluster, manifest):
    cluster.kubectl("create", "ns", "demo")
    cluster.kubectl("apply", "-f", manifest)
    cluster.kubectl("patch", "cm", "cfg", "-n", "demo", "--type", "merge", "-p", '{"data":{"b":"2"}}')
    cluster.kubectl("patch", "cm", "cfg", "-n", "demo", "--type", "json", "-p", '[{"op":"remove","path":"/data/a"}]')
    assert cluster.emu.get("configmaps", "cfg", "demo")["data"] == {"b": "2"}
    cluster.kubectl("patch", "deploy", "web", "-n", "demo", "--type", "strategic", "-p",
                    '{"spec":{"template":{"spec":{"containers":[{"name":"web","image":"nginx:1.28"}]}}}}')
    containers = cluster.emu.get("deployments", "web", "demo")["spec"]["template"]["spec"]["containers"]
    assert containers[0]["image"] == "nginx:1.28" and containers[0]["ports"] == [{"containerPort": 80,
                                                                                  "protocol": "TCP"}]


def test_wait_for_available_and_delete(cluster, manifest):
    cluster.kubectl("create", "ns", "demo")
    cluster.kubectl("apply", "-f", manifest)
    waited = cluster.kubectl("wait", "--for=condition=Available", "deployment/web", "-n", "demo", "--timeout=20s")
    assert "condition met" in waited.stdout
    cluster.kubectl("delete", "-f", manifest)
    cluster.emu.settle()
    assert cluster.emu.get("deployments", "web", "demo") is None
    assert cluster.emu.list("pods", "demo") == []


def test_wait_times_out_while_pods_have_no_scheduler(cluster, tmp_path):
    cluster.kubectl("create", "ns", "demo")
    pending = MANIFEST.replace("containers:", "schedulerName: gpu-binpack-scheduler\n      containers:")
    path = tmp_path / "pending.yaml"
    path.write_text(pending)
    cluster.kubectl("apply", "-f", str(path))
    waited = cluster.kubectl("wait", "--for=condition=Available", "deployment/web", "-n", "demo", "--timeout=2s",
                             check=False)
    assert waited.returncode != 0 and "timed out" in waited.stderr


def test_get_watch_streams_changes_until_its_timeout(cluster):
    watcher = subprocess.Popen([tool("kubectl"), "--kubeconfig", str(cluster.kubeconfig), "get", "cm", "-n", "default",
                                "-w", "--request-timeout=4s"], env=cluster.env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    cluster.kubectl("create", "cm", "late", "-n", "default", "--from-literal=x=1")
    out, _err = watcher.communicate(timeout=15)
    rows = [line.split()[0] for line in out.splitlines()[1:]]
    assert "kube-root-ca.crt" in rows and "late" in rows


def test_token_kubeconfig_and_explain(cluster, tmp_path):
    token_config = cluster.emu.write_kubeconfig(tmp_path / "token-kubeconfig", auth="token")
    from tests.tools import run
    out = run([tool("kubectl"), "--kubeconfig", str(token_config), "get", "ns", "-o", "name"], cluster.env).stdout
    assert "namespace/kube-system" in out
    explained = cluster.kubectl("explain", "deployment.spec.replicas").stdout
    assert "replicas <integer>" in explained


def test_server_side_apply_conflict_is_reported_by_kubectl(cluster, manifest):
    cluster.kubectl("create", "ns", "demo")
    cluster.kubectl("apply", "--server-side", "-f", manifest)
    cluster.kubectl("patch", "cm", "cfg", "-n", "demo", "--type", "merge", "-p", '{"data":{"a":"edited"}}')
    conflict = cluster.kubectl("apply", "--server-side", "-f", manifest, check=False)
    assert conflict.returncode != 0 and "conflict" in conflict.stderr.lower()
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", manifest)
    assert cluster.emu.get("configmaps", "cfg", "demo")["data"] == {"a": "1"}


@pytest.mark.parametrize("emulator_options", [{"kube_version": "1.24.17", "gpu_nodes": ["gpu-1"]}])
def test_kubectl_works_against_legacy_discovery(cluster):
    out = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert out["serverVersion"]["gitVersion"] == "v1.24.17"
    assert "gpu-1" in cluster.kubectl("get", "nodes").stdout
