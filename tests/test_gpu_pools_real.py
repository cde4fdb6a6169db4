"""GPU nodes on demand from the real Karpenter: its core controllers and KWOK cloud provider (sigs.k8s.io/karpenter
v1.14.1, scripts/gomod/karpenter), on the real API server, with the real kube-scheduler as our bin-packing scheduler.

The cluster starts with no GPU node (`scripts/local-cluster up --karpenter --gpu-nodes 0`): Karpenter's instance
types are tests/localcluster/karpenter.py's (8x H100, 4x L4, 1x L4). `up` creates a pool with `cloud: kwok` whose
requirements ask for 8 GPUs per node and whose limit allows 16.

What is faked, because nothing here runs containers: the nodes are KWOK's (the provider makes them, KWOK keeps them
Ready); a GPU pod ends when the test patches its status to Succeeded, as a kubelet reports a container that exited 0.

* 10 pending 1-GPU pods as users write them (no toleration, no scheduler name) bring exactly two 8-GPU nodes; the
  nodes arrive with node-prep's taint and labels and the GPU product label; our admission steered the pods to
  gpu-binpack-scheduler, which binds them there (packed: 8 on one node, 2 on the other);
* when every pod on the full node ends and all but one on the other, the empty node is consolidated after the
  pool's consolidate_after, and the node still running one GPU pod stays; validate's CUDA pod runs there; status
  says the pool cannot serve a pod past its GPU limit, from Karpenter's own count;
* a cluster that grows past 1,500 nodes after `up` (plain Node objects added): doctor and status name it, with the fix;
* teardown removes our NodePool and KWOKNodeClass; the nodes they launched go with them (Karpenter's finalizers),
  and nothing of ours is left.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.localcluster.cluster import HOLD_LABEL, require
from tests.realfaults import UpRun, local_cluster, wait_for
from tests.test_queues_real import end_pods

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.xdist_group("gpu-pools-real")]
POOL = "sim"
STEPS = "node-prep,binpack-scheduler,admission-opa,admission,gpu-pools"
RUN_TIMEOUT = 480
SCHEDULER = "gpu-binpack-scheduler"
NAMESPACE = "train"
PAUSE = "registry.k8s.io/pause:3.10"
CONSOLIDATE_AFTER = 20  # seconds an emptied node waits before Karpenter removes it
WITHIN = 240.0  # seconds for Karpenter, KWOK and the schedulers to act on a loaded CI machine
UNSCHEDULABLE_FLUSH = 300.0  # kube-scheduler's podMaxInUnschedulablePodsDuration
NODEPOOLS = "/apis/karpenter.sh/v1/nodepools"
NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
NODE_CLASSES = "/apis/karpenter.kwok.sh/v1alpha1/kwoknodeclasses"


@dataclass
class Pools:
    """The module's cluster, the config beside its folder, and what the first `up` ended with."""
    cluster: object
    config: Path
    first: object = None

    def gpu_bootstrap(self, *args: str):
        return UpRun([*args, "-c", str(self.config)], self.config.parent).wait(RUN_TIMEOUT)


def write_config(path: Path, kubeconfig: Path) -> None:
    path.write_text(json.dumps({
        "cluster": {"kubeconfig": str(kubeconfig)},
        "nodes": f"karpenter.sh/nodepool={POOL}",  # the GPU nodes are the pool's, found when a run starts
        "admission": {"wait_timeout": 300}, "monitoring": {"enabled": False},
        "pools": [{"name": POOL, "cloud": "kwok", "requirements": {"gpu_count": 8},
                   "limits": {"nvidia.com/gpu": 16},
                   "disruption": {"consolidate_after": f"{CONSOLIDATE_AFTER}s", "budgets": [{"nodes": "100%"}]}}]}))


@pytest.fixture(scope="module")
def pools(tmp_path_factory):
    require("karpenter", "karpenter-crds")
    folder = tmp_path_factory.mktemp("gpu-pools-real")
    with local_cluster(folder, gpu_nodes=0, cpu_nodes=1, karpenter=True) as cluster:
        config = folder / "gpu-bootstrap.yaml"
        write_config(config, cluster.kubeconfig)
        found = Pools(cluster, config)
        cluster.admin().create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        found.first = found.gpu_bootstrap("up", "--only", STEPS)
        yield found


def gpu_pod(name: str) -> dict:
    """A pod as users write it: no scheduler name, no toleration, one GPU in its limits (held Running by KWOK)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {HOLD_LABEL: "true",
                                                                                      "app": "burst"}},
            "spec": {"containers": [{"name": "work", "image": PAUSE,
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def live_pods(api) -> list[dict]:
    return [p for p in api.get(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector="app=burst")["items"]
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


def pool_nodes(api) -> list[dict]:
    return [n for n in api.get("/api/v1/nodes", labelSelector=f"karpenter.sh/nodepool={POOL}")["items"]
            if not n["metadata"].get("deletionTimestamp")]


def by_node(pods: list[dict]) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for pod in pods:
        found.setdefault(pod["spec"].get("nodeName") or "", []).append(pod)
    return found


def karpenter_log(pools: Pools) -> str:
    return pools.cluster.log("karpenter").read_text(errors="replace")[-4000:]


def test_pending_gpu_pods_bring_prepared_nodes_packing_empties_one_and_consolidation_returns_it(pools):
    assert pools.first.code == 0, pools.first.output[-3000:]
    api = pools.cluster.admin()
    assert pool_nodes(api) == []  # no GPU node before the pods come
    for index in range(10):
        api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", gpu_pod(f"burst-{index}"))
    # kube-scheduler may keep a pod it found no room for in its unschedulable queue until an event its queueing hints
    # judge helpful, or at most podMaxInUnschedulablePodsDuration (5 min); a loaded CI machine once missed 240 s
    wait_for(lambda: len([p for p in live_pods(api) if p["spec"].get("nodeName")]) == 10, UNSCHEDULABLE_FLUSH + 60,
             lambda: f"the 10 GPU pods bound on nodes Karpenter launched; Karpenter's log:\n{karpenter_log(pools)}",
             interval=1)

    nodes = pool_nodes(api)
    assert len(nodes) == 2, [n["metadata"]["name"] for n in nodes]
    claims = api.get(NODECLAIMS)["items"]
    assert len(claims) == 2 and {c["metadata"]["labels"]["karpenter.sh/nodepool"] for c in claims} == {POOL}
    for node in nodes:
        labels, taints = node["metadata"]["labels"], node["spec"].get("taints") or []
        assert labels["node.kubernetes.io/instance-type"] == "gpu-h100-8x"
        assert labels["nvidia.com/gpu.present"] == "true"  # node-prep's label
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in [
            {k: t.get(k) for k in ("key", "value", "effect")} for t in taints], taints
    pods = live_pods(api)
    assert {p["spec"]["schedulerName"] for p in pods} == {SCHEDULER}  # steered by our admission
    assert all(any(t.get("key") == "nvidia.com/gpu" for t in p["spec"].get("tolerations") or []) for p in pods)
    placed = by_node(pods)
    assert sorted(len(v) for v in placed.values()) == [2, 8], {k: len(v) for k, v in placed.items()}  # packed

    full = next(name for name, on in placed.items() if len(on) == 8)
    other = next(name for name, on in placed.items() if len(on) == 2)
    end_pods(api, NAMESPACE, placed[full] + placed[other][:1])
    wait_for(lambda: full not in [n["metadata"]["name"] for n in api.get("/api/v1/nodes")["items"]], WITHIN,
             lambda: f"the emptied node {full} consolidated; Karpenter's log:\n{karpenter_log(pools)}", interval=1)
    time.sleep(CONSOLIDATE_AFTER * 2)  # well past consolidate_after: the node still running a GPU pod stays
    assert [n["metadata"]["name"] for n in pool_nodes(api)] == [other]
    assert [p["spec"]["nodeName"] for p in live_pods(api)] == [other]
    validated = pools.gpu_bootstrap("up", "--only", "validate")  # validate's CUDA pod runs on the node Karpenter made
    assert validated.code == 0, validated.output[-3000:]
    assert {s["id"]: s["status"] for s in validated.document["steps"]}["validate"] != "skipped", validated.document

    # Karpenter's own count of the pool's GPUs (the KWOK provider sizes a node's capacity by the pods it was launched
    # for, so it may be fewer than the node's 8); a pod asking for one more than the limit leaves is refused by it
    used = int(api.get(f"{NODEPOOLS}/{POOL}")["status"]["resources"]["nvidia.com/gpu"])
    too_big = {**gpu_pod("too-big"), "metadata": {"name": "too-big", "labels": {HOLD_LABEL: "true"}}}
    too_big["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(16 - used + 1)
    api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", too_big)
    status = pools.gpu_bootstrap("status")
    row = next(p for p in status.document["pending"] if p["name"] == "too-big")
    assert row["pools"] == {POOL: f"at its GPU limit ({used} of 16 in use, the pod asks for {16 - used + 1})"}, row
    api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/too-big")

    done = pools.gpu_bootstrap("teardown", "--only", "gpu-pools", "--yes")
    assert done.code == 0, done.output[-3000:]
    wait_for(lambda: pool_nodes(api) == [] and api.get(NODECLAIMS)["items"] == [], WITHIN,
             lambda: f"the pool's nodes and NodeClaims gone with it; Karpenter's log:\n{karpenter_log(pools)}",
             interval=1)
    assert api.get(NODEPOOLS)["items"] == [] and api.get(NODE_CLASSES)["items"] == []


FLEET_LABEL = "gpu-bootstrap.test/grown"


def fleet_node(index: int) -> dict:
    """A node that joined after `up` (no KWOK annotation: nothing runs it; only its count matters here)."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"grown-{index:04d}", "labels": {FLEET_LABEL: "true"}},
            "status": {"capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                       "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"}}}


def test_a_cluster_that_grows_past_1500_nodes_after_up_is_named_by_doctor_and_status_with_the_fix(pools):
    """`up` rendered the scheduler for this small cluster (1 node, and the pool's limit reaches 2 more): every node
    scored. 1,501 nodes join later, as on a real fleet: doctor warns and names the fix, and status says it too."""
    assert pools.first.code == 0, pools.first.output[-3000:]
    api = pools.cluster.admin()
    live = api.get(f"/api/v1/namespaces/kube-system/configmaps/{SCHEDULER}-config")
    assert "percentageOfNodesToScore: 100" in live["data"]["config.yaml"]
    try:
        for index in range(1501):
            api.create("/api/v1/nodes", fleet_node(index))
        doctor = pools.gpu_bootstrap("doctor", "--no-nodes")
        checks = [c for c in doctor.document["checks"] if c["id"].startswith("binpack-scheduler")]
        grown = [c for c in checks if "rendered for a cluster of at most 1,500 nodes" in c["message"]]
        assert grown and grown[0]["status"] == "warn", checks
        assert "Fix: run gpu-bootstrap up" in grown[0]["message"] and "this one has 1,504" in grown[0]["message"]
        status = pools.gpu_bootstrap("status")
        assert any("this one has 1,504" in note for note in status.document["notes"]), status.document["notes"]
    finally:
        api.request("DELETE", f"/api/v1/nodes?labelSelector={FLEET_LABEL}%3Dtrue")
