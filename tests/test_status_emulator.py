"""`gpu-bootstrap status` through the CLI against the emulator: every figure of `status -o json` against a hand count
of a seeded cluster (GPU nodes of 1, 4 and 8 GPUs, MIG and time-sliced resources, pods bound by our scheduler and by
the default one, pending pods with the scheduler's condition and event, a cordoned node), the fragmentation figures
against the simulator's own reading of the same cluster, and a --defrag plan replayed with real kubectl.
"""
from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from tests.tools import tool_env

runner = CliRunner()
OURS = "gpu-binpack-scheduler"
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists"}]


@pytest.fixture
def emulator_options():
    return {"cpu_nodes": ["cpu-1"]}


@pytest.fixture(autouse=True)
def no_config(tmp_path, monkeypatch):
    """status needs no config file: the default one is absent here."""
    monkeypatch.chdir(tmp_path)


def status(cluster, tmp_path, *extra: str, parse: bool = True):
    result = runner.invoke(app, ["status", "--kubeconfig", str(cluster.kubeconfig), *extra,
                                 "--log-file", str(tmp_path / "log")], env={"COLUMNS": "240"})  # wide tables fit
    if not parse:
        return result
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def gpu_node(cluster, api, name: str, gpus: int, product: str | None = None, cpu: str | None = None,
             extra: dict | None = None, labels: dict | None = None, cordoned: bool = False) -> None:
    """A GPU node as the device plugin and GFD leave it; `extra` nvidia.com/* resources (MIG, shared)."""
    node_labels = {"nvidia.com/gpu.present": "true", **({"nvidia.com/gpu.product": product} if product else {}),
                   **(labels or {})}
    cluster.emu.add_node(name, gpus=gpus, labels=node_labels, taints=[TAINT], cpu=cpu)
    if extra:
        resources = {k: str(v) for k, v in extra.items()}
        answer = api.patch(f"/api/v1/nodes/{name}/status", {"status": {"allocatable": resources,
                                                                       "capacity": resources}})
        assert answer.status == 200, answer
    if cordoned:
        assert api.patch(f"/api/v1/nodes/{name}", {"spec": {"unschedulable": True}}).status == 200


def pod(namespace: str, name: str, gpus: int = 0, node: str | None = None, scheduler: str = "default-scheduler",
        cpu: str = "1", memory: str = "4Gi", phase: str = "Running", extra: dict | None = None,
        owner: dict | None = None, selector: dict | None = None) -> dict:
    limits = {**({"nvidia.com/gpu": str(gpus)} if gpus else {}), **{k: str(v) for k, v in (extra or {}).items()}}
    resources = {"requests": {"cpu": cpu, "memory": memory, **limits}, **({"limits": limits} if limits else {})}
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
            "spec": {"schedulerName": scheduler, "tolerations": TOLERATION,
                     "containers": [{"name": "main", "image": "cuda", "resources": resources}]}}
    if owner:
        body["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner["kind"], "controller": True,
                                                "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]
    if selector:
        body["spec"]["nodeSelector"] = selector
    if node:
        body["spec"]["nodeName"] = node
        body["status"] = {"phase": phase, "conditions": [{"type": "PodScheduled", "status": "True"}]}
    return body


def namespaces(cluster, *names: str) -> None:
    for name in names:
        cluster.emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


@pytest.fixture
def ground_truth(cluster, api):
    emu = cluster.emu
    namespaces(cluster, "ml", "vision", "web")
    gpu_node(cluster, api, "gpu-8a", 8, "NVIDIA-H100-80GB-HBM3", labels={
        "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0"})
    gpu_node(cluster, api, "gpu-8b", 8, "NVIDIA-A100-SXM4-80GB", labels={  # a minor label GFD never writes
        "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "x"})
    gpu_node(cluster, api, "gpu-4", 4, cpu="8")  # allocatable cpu 7: one pod uses it all
    gpu_node(cluster, api, "gpu-1", 1, "Tesla-T4", cordoned=True)
    gpu_node(cluster, api, "mig-node", 0, "NVIDIA-A100-SXM4-80GB", extra={"nvidia.com/mig-1g.10gb": 7},
             labels={"nvidia.com/mig.strategy": "mixed"})
    gpu_node(cluster, api, "ts-node", 4, "Tesla-T4-SHARED",
             labels={"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"})
    for body in (pod("ml", "train-a", 4, "gpu-8a", OURS), pod("ml", "infer-a", 1, "gpu-8a"),
                 pod("ml", "done-a", 2, "gpu-8a", phase="Succeeded"),
                 pod("vision", "train-b", 8, "gpu-8b", OURS), pod("vision", "cpu-hog", 1, "gpu-4", cpu="7"),
                 pod("ml", "mig-pod", 0, "mig-node", extra={"nvidia.com/mig-1g.10gb": 2}),
                 pod("ml", "shared-pod", 1, "ts-node", OURS),
                 pod("web", "frontend", 0, "cpu-1"),
                 pod("ml", "big", 8, scheduler=OURS),
                 pod("vision", "picky", 2, selector={"pool": "nowhere"})):
        emu.seed(body)
    big = emu.get("pods", "big", "ml")
    big["status"] = {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/7 nodes are available: 1 node(s) were unschedulable, 6 Insufficient nvidia.com/gpu."}]}
    assert api.put("/api/v1/namespaces/ml/pods/big/status", big).status == 200
    for count, (stamp, message) in enumerate((("2026-11-23T07:00:00Z", "older"),
                                              ("2026-11-23T08:00:00Z", "0/7 nodes are available: newest"))):
        emu.seed({"apiVersion": "v1", "kind": "Event",
                  "metadata": {"name": f"big.{count}", "namespace": "ml"},
                  "involvedObject": {"kind": "Pod", "namespace": "ml", "name": "big", "uid": big["metadata"]["uid"]},
                  "reason": "FailedScheduling", "message": message, "type": "Warning", "count": 3 + count,
                  "source": {"component": OURS}, "firstTimestamp": stamp, "lastTimestamp": stamp})
    assert emu.settle()
    return cluster


def test_every_figure_equals_the_hand_count(ground_truth, tmp_path):
    document = status(ground_truth, tmp_path, "-o", "json")
    assert document["apiVersion"] == "gpu-bootstrap.io/status/v1"
    assert document["totals"] == {"gpu_nodes": 6, "gpus_allocatable": 25, "gpus_requested": 15, "gpus_free": 10,
                                  "gpu_pods": 6, "pending_gpu_pods": 2, "pending_gpus": 10}
    nodes = {n["name"]: n for n in document["nodes"]}
    assert set(nodes) == {"gpu-8a", "gpu-8b", "gpu-4", "gpu-1", "mig-node", "ts-node"}  # not cpu-1
    assert nodes["gpu-8a"]["gpus"] == {"allocatable": 8, "requested": 5, "free": 3}  # done-a finished: not counted
    assert nodes["gpu-8a"]["product"] == "NVIDIA-H100-80GB-HBM3" and nodes["gpu-8a"]["gpu_pods"] == 2
    assert nodes["gpu-8b"]["gpus"] == {"allocatable": 8, "requested": 8, "free": 0}
    assert nodes["gpu-4"]["gpus"] == {"allocatable": 4, "requested": 1, "free": 3}
    assert nodes["gpu-4"]["cpu"] == {"allocatable_milli": 7000, "requested_milli": 7000}
    assert nodes["gpu-4"]["product"] is None
    # GPU feature discovery's spec labels, as GPU pods select on them (docs/status-and-simulate.md)
    assert (nodes["gpu-8a"]["gpu_memory_mib"], nodes["gpu-8a"]["compute_capability"]) == (81559, "9.0")
    assert (nodes["gpu-8b"]["gpu_memory_mib"], nodes["gpu-8b"]["compute_capability"]) == (81920, None)
    assert (nodes["gpu-4"]["gpu_memory_mib"], nodes["gpu-4"]["compute_capability"]) == (None, None)
    assert (nodes["gpu-1"]["schedulable"], nodes["gpu-1"]["gpus"]["free"]) == (False, 1)
    assert all(n["schedulable"] for name, n in nodes.items() if name != "gpu-1")
    assert all(n["tainted"] is True and n["ready"] is True for n in nodes.values())
    assert nodes["mig-node"]["resources"] == {"nvidia.com/mig-1g.10gb": {"allocatable": 7, "requested": 2,
                                                                         "free": 5}}
    assert nodes["mig-node"]["mig_strategy"] == "mixed" and nodes["mig-node"]["gpus"]["allocatable"] == 0
    assert nodes["ts-node"]["sharing"] == {"replicas": 4, "strategy": "time-slicing"}
    assert nodes["ts-node"]["gpus"] == {"allocatable": 4, "requested": 1, "free": 3}

    assert document["namespaces"] == [
        {"name": "ml", "gpu_pods": 4, "gpus": 6, "resources": {"nvidia.com/mig-1g.10gb": 2},
         "schedulers": {OURS: 2, "default-scheduler": 2}, "pending_pods": 1, "pending_gpus": 8},
        {"name": "vision", "gpu_pods": 2, "gpus": 9, "resources": {}, "schedulers": {OURS: 1, "default-scheduler": 1},
         "pending_pods": 1, "pending_gpus": 2}]
    pods = {p["name"]: p for p in document["pods"]}
    assert set(pods) == {"train-a", "infer-a", "train-b", "cpu-hog", "mig-pod", "shared-pod"}
    assert [(p["gpus"], p["node"], p["ours"]) for p in (pods["train-a"], pods["infer-a"], pods["shared-pod"])] == [
        (4, "gpu-8a", True), (1, "gpu-8a", False), (1, "ts-node", True)]
    assert pods["infer-a"]["scheduler"] == "default-scheduler" and pods["train-a"]["scheduler"] == OURS
    assert all(isinstance(p["age_seconds"], int) and p["age_seconds"] >= 0 for p in pods.values())

    pending = {p["name"]: p for p in document["pending"]}
    assert pending["big"]["ours"] and pending["big"]["reason"] == "Unschedulable"
    assert "6 Insufficient nvidia.com/gpu" in pending["big"]["message"]
    assert pending["big"]["event"] == {"reason": "FailedScheduling", "message": "0/7 nodes are available: newest",
                                       "count": 4, "time": "2026-11-23T08:00:00Z", "from": OURS}
    assert not pending["picky"]["ours"] and pending["picky"]["reason"] == "Unschedulable"  # the emulator's scheduler
    assert "didn't match Pod's node affinity/selector" in pending["picky"]["message"]
    assert pending["picky"]["event"] is None

    # schedulable GPU nodes: gpu-8a 3 free, gpu-8b 0, gpu-4 3 (cpu used up: stranded), ts-node 3; gpu-1 is cordoned
    assert document["fragmentation"] == {
        "free_gpus": 9, "largest_fit": 3, "fits": {"1": 6, "2": 2, "4": 0, "8": 0}, "stranded_gpus": 3,
        "partial_free_gpus": 9, "free_8gpu_nodes": 0, "free_4gpu_nodes": 0,
        "smallest_pod": {"cpu_milli": 1000, "memory_mib": 4096}}
    # nodes, pods, events (one page each), the discovery of resource.k8s.io/v1 (not served by this cluster's version,
    # so no DRA list follows), that of kueue.x-k8s.io/v1beta2 (no Kueue: no queue list follows), that of
    # karpenter.sh/v1 (no Karpenter: no NodePool list follows), the scheduler's ConfigMap (whether it scores every node
    # of a cluster that outgrew it) and the Service list for Prometheus
    assert document["requests"] == 8


def test_fragmentation_equals_what_simulate_reads_of_the_same_cluster(ground_truth, tmp_path):
    """The simulator's own --from-cluster reading and snapshot code, run here directly, gives the same figures."""
    from gpu_bootstrap.adapters.kube import Kube
    from gpu_bootstrap.sim import replay, trace
    nodes, used = trace.cluster_inventory(Kube(ground_truth.kubeconfig))
    outcome = replay.Outcome()
    replay._snapshot(outcome, replay.Cluster(nodes, used), (1000, 4096))
    figures = status(ground_truth, tmp_path, "-o", "json")["fragmentation"]
    assert (figures["stranded_gpus"], figures["partial_free_gpus"], figures["free_8gpu_nodes"],
            figures["free_4gpu_nodes"]) == (outcome.stranded_gpus, outcome.partial_free_gpus,
                                            outcome.free_8gpu_nodes, outcome.free_4gpu_nodes)
    assert figures["free_gpus"] == replay.Cluster(nodes, used).free_gpus()


def test_namespace_filter_and_views(ground_truth, tmp_path):
    document = status(ground_truth, tmp_path, "-o", "json", "-n", "vision")
    assert {p["name"] for p in document["pods"]} == {"train-b", "cpu-hog"}
    assert [p["name"] for p in document["pending"]] == ["picky"]
    assert [n["name"] for n in document["namespaces"]] == ["vision"]
    assert document["totals"]["gpus_requested"] == 15  # nodes are not namespaced: their figures stay whole
    for by, expected in (("node", "gpu-8a"), ("namespace", "vision"), ("pod", "shared-pod")):
        result = status(ground_truth, tmp_path, "--by", by, parse=False)
        assert result.exit_code == 0, result.output
        assert expected in result.stdout and "pending GPU pods (2)" in result.stdout
        assert "stranded" in result.stdout
    wide = status(ground_truth, tmp_path, "-o", "wide", parse=False)
    assert "memory req/alloc" in wide.stdout and "cordoned" in wide.stdout and "mig-1g.10gb 2/7" in wide.stdout
    h100 = next(line for line in wide.stdout.splitlines() if "gpu-8a" in line)
    assert "80 GiB" in h100 and " 9.0 " in h100, wide.stdout  # GPU memory and compute capability of GFD's labels


def test_status_changes_nothing_and_needs_nothing_of_ours(ground_truth, tmp_path):
    ground_truth.emu.requests.clear()
    status(ground_truth, tmp_path, "-o", "json", "--defrag")
    assert ground_truth.emu.requests.writes() == []


def test_bad_input_is_exit_2_naming_the_flag(ground_truth, tmp_path):
    for flags, named in ((["--window", "an hour"], "--window"), (["--idle-below", "0"], "--idle-below"),
                         (["--prometheus", "no-slash"], "--prometheus")):
        result = status(ground_truth, tmp_path, *flags, parse=False)
        assert result.exit_code == 2 and named in result.output, result.output


# --- --defrag ---------------------------------------------------------------------------------------------------------
def replica_set(cluster, namespace: str, name: str, gpus: int) -> dict:
    return cluster.emu.seed({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                             "metadata": {"name": name, "namespace": namespace},
                             "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                                      "template": {"metadata": {"labels": {"app": name}},
                                                   "spec": pod(namespace, name, gpus)["spec"]}}})


@pytest.fixture
def fragmented(cluster, api):
    """Three 8-GPU nodes: 6 GPUs used on gpu-a and gpu-b, two 1-GPU pods on gpu-c, and an 8-GPU pod waiting."""
    emu = cluster.emu
    namespaces(cluster, "ml")
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        gpu_node(cluster, api, name, 8, "NVIDIA-H100-80GB-HBM3")
    emu.controllers.disable("replicaset")  # our pods take the ReplicaSets' places, bound where we want them
    for name, gpus, node in (("a4", 4, "gpu-a"), ("a2", 2, "gpu-a"), ("b4", 4, "gpu-b"), ("b2", 2, "gpu-b"),
                             ("c1", 1, "gpu-c"), ("c1b", 1, "gpu-c")):
        owner = replica_set(cluster, "ml", name, gpus)
        emu.seed(pod("ml", f"{name}-0", gpus, node, owner=owner))
    emu.controllers.enable("replicaset")
    emu.seed(pod("ml", "whole-node", 8))
    assert emu.settle()
    assert not emu.get("pods", "whole-node", "ml")["spec"].get("nodeName")
    return cluster


@pytest.mark.tools
def test_defrag_plans_a_whole_node_and_replaying_it_frees_it(fragmented, tmp_path):
    emu = fragmented.emu
    before = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in emu.list("pods", "ml") if p["spec"].get("nodeName")}
    plan = status(fragmented, tmp_path, "-o", "json", "--defrag")["defrag"]
    assert plan["wanted"] == [8] and plan["unmet"] == []
    assert [d["node"] for d in plan["drains"]] == ["gpu-c"] and plan["drains"][0]["gpus"] == 8
    assert sorted(m["pod"] for m in plan["drains"][0]["moves"]) == ["ml/c1-0", "ml/c1b-0"]
    assert {m["to"] for m in plan["drains"][0]["moves"]} <= {"gpu-a", "gpu-b"}
    after = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in emu.list("pods", "ml") if p["spec"].get("nodeName")}
    assert after == before  # a plan only

    for command in plan["commands"]:  # what the plan tells the admin to run, run with the real kubectl
        fragmented.kubectl(*shlex.split(command.split("#")[0])[1:], timeout=120)
        assert emu.settle()
    placed = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in emu.list("pods", "ml")
              if not p["metadata"].get("deletionTimestamp")}
    assert placed["whole-node"] == "gpu-c"  # the freed node took the waiting 8-GPU pod
    assert {name: node for name, node in placed.items() if name in before and name[:2] in ("a4", "a2", "b4", "b2")} \
        == {name: node for name, node in before.items() if name[:2] in ("a4", "a2", "b4", "b2")}  # untouched
    moved = [node for name, node in placed.items() if name.startswith("c1")]
    assert len(moved) == 2 and set(moved) <= {"gpu-a", "gpu-b"}  # re-created by their ReplicaSets, elsewhere


def test_defrag_frees_only_a_node_the_pending_pod_may_use(fragmented, api, tmp_path):
    """gpu-c (the least used) turns out to hold T4s, and the waiting pod needs more than 40 GB per GPU: freeing gpu-c
    would not help it, so the plan frees one of the H100 nodes instead (their pods move to the other H100 and gpu-c)."""
    emu = fragmented.emu
    answer = api.patch("/api/v1/nodes/gpu-c", {"metadata": {"labels": {"nvidia.com/gpu.product": "Tesla-T4",
                                                                        "nvidia.com/gpu.memory": "15360"}}})
    assert answer.status == 200, answer
    for name in ("gpu-a", "gpu-b"):
        assert api.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {"nvidia.com/gpu.memory": "81559"}}}).status \
            == 200
    emu.delete("pods", "whole-node", "ml")
    waiting = pod("ml", "whole-h100", 8)
    waiting["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40000"]}]}]}}}
    emu.seed(waiting)
    assert emu.settle()
    plan = status(fragmented, tmp_path, "-o", "json", "--defrag")["defrag"]
    assert plan["wanted"] == [8] and plan["unmet"] == []
    assert [d["node"] for d in plan["drains"]] in (["gpu-a"], ["gpu-b"]), plan
    nodes = status(fragmented, tmp_path, "-o", "json")["nodes"]
    assert {n["name"]: n["gpu_memory_mib"] for n in nodes} == {"gpu-a": 81559, "gpu-b": 81559, "gpu-c": 15360}


def test_defrag_text_view_says_nothing_was_evicted(fragmented, tmp_path):
    result = status(fragmented, tmp_path, "--defrag", parse=False)
    assert result.exit_code == 0, result.output
    assert "nothing was evicted" in result.stdout and "free gpu-c" in result.stdout
    assert "kubectl drain gpu-c" in result.stdout


# --- --watch ----------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_watch_reads_again_and_shows_the_latest_state_until_ctrl_c(cluster, api, tmp_path):
    import signal
    import subprocess
    import sys
    import time
    gpu_node(cluster, api, "gpu-a", 8)
    env = tool_env(HOME=str(tmp_path))
    process = subprocess.Popen([sys.executable, "-m", "gpu_bootstrap", "status", "--watch", "--interval", "1",
                                "--kubeconfig", str(cluster.kubeconfig), "--log-file", str(tmp_path / "log")],
                               env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def reads() -> int:
        return len(cluster.emu.requests.matching("GET", "/api/v1/nodes"))

    try:
        deadline = time.monotonic() + 60
        while reads() < 1 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
        cluster.emu.seed(pod("default", "late", 3, "gpu-a"))  # arrives after the first read
        seen = reads()
        while reads() < seen + 2 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err.decode()
    assert reads() >= seen + 2  # it read the cluster again, and again
    assert "3/8 GPUs requested" in out.decode()  # the last frame shows the pod that came later


def test_events_it_may_not_read_are_unknown_not_absent(ground_truth, tmp_path):
    ground_truth.emu.faults.add("GET", r"/api/v1/events$", status=403, count=None, message="events is forbidden")
    document = status(ground_truth, tmp_path, "-o", "json")
    assert document["events_read"] is False and "events is forbidden" in document["notes"][0]
    assert document["totals"]["pending_gpu_pods"] == 2  # the figures do not depend on events
    assert {p["name"]: p["reason"] for p in document["pending"]} == {"big": "Unschedulable", "picky": "Unschedulable"}


def test_a_cluster_it_cannot_reach_is_exit_1_and_a_missing_kubeconfig_exit_2(ground_truth, tmp_path):
    ground_truth.emu.faults.add("GET", r"/api/v1/pods$", status=403, count=None, message="pods is forbidden")
    result = status(ground_truth, tmp_path, parse=False)
    assert result.exit_code == 1 and "pods is forbidden" in result.output
    missing = runner.invoke(app, ["status", "--kubeconfig", str(tmp_path / "nope"), "--log-file", str(tmp_path / "l")])
    assert missing.exit_code == 2 and "nope" in missing.output


def test_status_shows_each_nodes_driver_upgrade_state(cluster, api, tmp_path):
    """The gpu-operator's upgrade controller labels nodes nvidia.com/gpu-driver-upgrade-state; status shows it (a
    column only while some node carries one)."""
    gpu_node(cluster, api, "gpu-a", 8, labels={"nvidia.com/gpu-driver-upgrade-state": "pod-deletion-required"})
    gpu_node(cluster, api, "gpu-b", 8, labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"})
    gpu_node(cluster, api, "gpu-c", 8)
    document = status(cluster, tmp_path, "-o", "json")
    assert {n["name"]: n["driver_upgrade"] for n in document["nodes"]} == {
        "gpu-a": "pod-deletion-required", "gpu-b": "upgrade-done", "gpu-c": None}
    table = status(cluster, tmp_path, parse=False)
    assert table.exit_code == 0 and "driver upgrade" in table.stdout and "pod-deletion-required" in table.stdout


def test_pending_pods_on_a_scheduler_that_does_not_run_are_said_to_wait_for_nothing(ground_truth, tmp_path):
    """Found by a new user: after a teardown removed the bin-packing scheduler, pods that named it stayed Pending
    for good, and status still showed them under "gpu-binpack-scheduler (ours)" with the reason the scheduler gave
    before it went away. Status now says the scheduler does not run and marks those reasons stale."""
    document = status(ground_truth, tmp_path, "-o", "json")
    big = next(p for p in document["pending"] if p["name"] == "big")
    assert document["scheduler_running"] is False
    assert (big["scheduler_running"], big["stale"]) == (False, True)
    assert "picky" not in [p["name"] for p in document["pending"] if p.get("stale")]  # the default scheduler's
    assert any(f"the scheduler {OURS} does not run" in note and "1 pending GPU pod(s)" in note
               for note in document["notes"])
    text = status(ground_truth, tmp_path, parse=False)
    assert text.exit_code == 0 and f"{OURS} does not run" in text.output and "stale" in text.output

    # a Ready pod of the Deployment `up` makes (its labels) in the scheduler's namespace: it runs again
    scheduler = pod("kube-system", f"{OURS}-abc", 0, "cpu-1")
    scheduler["metadata"]["labels"] = {"app.kubernetes.io/name": OURS, "app.kubernetes.io/managed-by": "gpu-bootstrap",
                                       "app.kubernetes.io/component": "scheduler"}
    scheduler["status"]["conditions"].append({"type": "Ready", "status": "True"})
    ground_truth.emu.seed(scheduler)
    assert ground_truth.emu.settle()
    document = status(ground_truth, tmp_path, "-o", "json")
    big = next(p for p in document["pending"] if p["name"] == "big")
    assert document["scheduler_running"] is True and (big["scheduler_running"], big["stale"]) == (True, False)
    assert not any("does not run" in note for note in document["notes"])
