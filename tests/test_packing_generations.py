"""The default bin-packing profile of each kube-scheduler scoring generation, placed by the real scheduler of that
generation: kube-scheduler 1.37 (BalancedAllocation scores the change a pod makes, from 1.36) and 1.35 (it scores the
balance after placement), both built from their Go modules by scripts/install-test-tools.

The workload is the one that found the flaw: inference-like pods (1 GPU, 500m cpu, 1 Gi) as users write them, on
two 8-GPU nodes. Each pod is created once the one before it is bound, so every choice sees the last.
"""
from __future__ import annotations

import json

import pytest

from gpu_bootstrap.core.config import SchedulerConfig
from gpu_bootstrap.render import scheduler as render
from gpu_bootstrap.sim.engine import Node, Pod

pytestmark = [pytest.mark.tools, pytest.mark.slow]

NODES = [Node("gpu-a", 64_000, 256 * 1024, 8), Node("gpu-b", 64_000, 256 * 1024, 8)]
LIGHT = Pod(500, 1024, 1)
SCHEDULERS = {"1.37": "kube-scheduler", "1.35": "kube-scheduler-1.35"}


def bench():
    """benchmarks/packing_real.py: its API client, node objects and watch."""
    from benchmarks import packing_real
    return packing_real


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    from tests.localcluster import cluster as local
    local.require("etcd", "kube-apiserver", *SCHEDULERS.values())
    folder = tmp_path_factory.mktemp("generations")
    cluster = local.control_plane(folder / "cluster", die_with_parent=True)
    try:
        api = bench().Api(cluster)
        bench().prepare(api, NODES)
        yield cluster, api, folder
    finally:
        local.stop_processes(cluster)


def place_light_pods(control_plane, binary: str, config: dict, count: int) -> list[str]:
    """Start `binary` with `config`, create `count` light GPU pods one at a time, return the nodes they were bound
    to in order; the scheduler is stopped and the pods deleted afterwards."""
    from tests.localcluster.cluster import binaries
    cluster, api, folder = control_plane
    real = bench()
    real.clear_pods(api, cluster)
    config = dict(config, leaderElection={"leaderElect": False},
                  clientConnection={"kubeconfig": str(cluster.folder / "scheduler.kubeconfig")})
    path = folder / f"{binary}.json"
    path.write_text(json.dumps(config))
    listed = cluster.admin("generations").get(f"/api/v1/namespaces/{real.NAMESPACE}/pods")
    outcomes = real.Outcomes(cluster, listed["metadata"]["resourceVersion"])
    cluster.spawn("kube-scheduler", [str(binaries()[binary]), f"--config={path}", "--bind-address=127.0.0.1",
                                     "--secure-port=0"], die_with_parent=True)
    placed = []
    try:
        for index in range(count):
            name = f"light-{index}"
            status, answer = api.request("POST", f"/api/v1/namespaces/{real.NAMESPACE}/pods",
                                         real.pod_object(name, LIGHT, config["profiles"][0]["schedulerName"]))
            assert status == 201, answer
            verdict, where = outcomes.wait(name, 120)
            assert verdict == "bound", f"{name}: {where}"
            placed.append(where)
    finally:
        outcomes.stopped = True
        real.stop_scheduler(cluster)
        real.clear_pods(api, cluster)
    return placed


@pytest.mark.parametrize("generation", sorted(SCHEDULERS))
def test_light_gpu_pods_fill_one_node_before_the_other_on_the_real_scheduler_of_each_generation(control_plane,
                                                                                                 generation):
    """What `up` renders for this scheduler's version and a two-node cluster: the first 8 pods share one node, the
    ninth opens the second."""
    from tests.localcluster.cluster import gomod_version
    component = "kubernetes" if generation == "1.37" else SCHEDULERS[generation]
    version = gomod_version(component, "k8s.io/kubernetes").removeprefix("v")
    assert version.startswith(generation + ".")
    config = render.scheduler_configuration(SchedulerConfig(), version, node_count=len(NODES))
    placed = place_light_pods(control_plane, SCHEDULERS[generation], config, 9)
    assert len(set(placed[:8])) == 1, f"kube-scheduler {version} spread light GPU pods: {placed}"
    assert placed[8] != placed[0], placed


def test_the_previous_default_spread_light_gpu_pods_on_the_1_35_scheduler(control_plane):
    """The reason the default changed, shown on the real 1.35 scheduler: the profile that was the default up to 1.35
    (fit weight 2 against BalancedAllocation 1) opens the second node before the first is full (`simulate` predicts
    the third pod), because 1.35's BalancedAllocation prefers the node whose GPUs are least out of step with its cpu
    and memory. Were this to pack, the test above would prove nothing about the change."""
    from tests.localcluster.cluster import gomod_version
    version = gomod_version(SCHEDULERS["1.35"], "k8s.io/kubernetes").removeprefix("v")
    config = render.scheduler_configuration(SchedulerConfig(fit_weight=2), version, node_count=len(NODES))
    placed = place_light_pods(control_plane, SCHEDULERS["1.35"], config, 8)
    assert len(set(placed)) == 2, f"the old profile packed on kube-scheduler {version}: {placed}"
