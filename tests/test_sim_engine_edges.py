"""The simulator engine's building blocks at their edges: what a pod asks for (defaults, overhead, merged pods),
what fits a node (each resource exactly at its limit and one over, models, CPU pods off GPU nodes), free GPUs by
model, records that cannot change once made; which resources a score counts; placing pods (ties at random, a
unique best without a draw, CPU pods with the default profile, the rotating start of a partial search for GPU and
CPU pods apart), removing them, and the offline reference placing each pod once."""
from __future__ import annotations

import dataclasses
import random

import pytest

from gpu_bootstrap.sim import engine, scoring
from gpu_bootstrap.sim.engine import Cluster, Container, Node, Pod, Scheduler, Scorer, merge_pods
from gpu_bootstrap.sim.scoring import GPU, Profile

pytestmark = pytest.mark.unit


def test_records_cannot_change_once_made():
    for obj, name in ((Node("n", 1, 1, 1), "gpus"), (Container(), "cpu"), (Pod(1, 1, 1), "gpus")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, 2)


def test_a_container_asks_for_nothing_set_and_is_no_sidecar_unless_told():
    assert dataclasses.astuple(Container()) == (None, None, 0, False)


def test_overhead_adds_to_the_plain_and_the_nonzero_requests():
    pod = Pod.from_containers([Container(500, 1024, 1)], overhead=(250, 64))
    assert (pod.cpu, pod.memory, pod.gpus, pod.nonzero_cpu, pod.nonzero_memory) == (750, 1088, 1, 750, 1088)
    unset = Pod.from_containers([Container(None, None, 1)], overhead=(250, 64))
    assert (unset.cpu, unset.memory, unset.nonzero_cpu, unset.nonzero_memory) == (250, 64, 350, 264)


def test_merged_pods_sum_every_count_from_any_iterable():
    merged = merge_pods(p for p in (Pod(100, 10, 1), Pod(0, 0, 2), Pod(50, 5, 0, None, 70, 9)))
    assert (merged.cpu, merged.memory, merged.gpus, merged.models, merged.nonzero_cpu, merged.nonzero_memory) == (
        150, 15, 3, None, 270, 219)  # the empty pod counts the defaults: 100m and 200 MiB


GPU_NODE = Node("g", 4000, 8192, 8, "A100")
CPU_NODE = Node("c", 4000, 8192, 0)


@pytest.mark.parametrize("node, pod, fits", [
    (GPU_NODE, Pod(4000, 8192, 8), True),  # every resource exactly at its limit
    (GPU_NODE, Pod(4001, 8192, 1), False),
    (GPU_NODE, Pod(4000, 8193, 1), False),
    (GPU_NODE, Pod(1, 1, 9), False),
    (GPU_NODE, Pod(1, 1, 1, frozenset({"A100", "H100"})), True),
    (GPU_NODE, Pod(1, 1, 1, frozenset({"H100"})), False),
    (GPU_NODE, Pod(1, 1, 0), False),  # CPU-only pods do not tolerate the GPU nodes' taint
    (CPU_NODE, Pod(4000, 8192, 0), True),
    (CPU_NODE, Pod(4001, 1, 0), False),
    (CPU_NODE, Pod(1, 8193, 0), False),
    (CPU_NODE, Pod(1, 1, 1), False),
])
def test_what_fits_a_node(node, pod, fits):
    assert Cluster([node]).fits(0, pod) is fits


def test_what_runs_already_counts_against_the_limits():
    cluster = Cluster([GPU_NODE], {"g": [Pod(1000, 2000, 2), Pod(1000, 2000, 2)]})
    assert (cluster.cpu, cluster.mem, cluster.gpu) == ([2000], [4000], [4])
    assert cluster.fits(0, Pod(2000, 4192, 4)) is True and cluster.fits(0, Pod(2000, 4193, 4)) is False


def test_free_gpus_by_model():
    cluster = Cluster([Node("a", 1, 1, 8, "A100"), Node("h", 1, 1, 4, "H100"), Node("x", 1, 1, 2)],
                      {"a": Pod(0, 0, 3)})
    assert cluster.free_gpus() == 11
    assert cluster.free_gpus(frozenset({"A100"})) == 5
    assert cluster.free_gpus(frozenset({"H100", "T4"})) == 4


# --- a node's score: which resources count ------------------------------------------------------------------------

ALL_THREE = ("cpu", "memory", GPU)


def test_the_random_strategy_scores_every_node_zero():
    assert Scorer(scoring.RANDOM_PROFILE, Cluster([GPU_NODE])).score(0, Pod(1000, 1024, 1)) == 0


@pytest.mark.parametrize("balanced, pod, score", [
    # cpu 2000/4000 = 0.5, memory 2048/8192 = 0.25, gpu 2/8 = 0.25: std of (0.5, 0.25, 0.25) = 0.1179 -> 88
    (ALL_THREE, Pod(2000, 2048, 2), 88),
    # (0.5, 0.25) -> std 0.125 -> 87
    (("cpu", "memory"), Pod(2000, 2048, 2), 87),
    # gpu and cpu: (0.25, 0.5) -> 87
    ((GPU, "cpu"), Pod(2000, 2048, 2), 87),
    # only memory balanced: one fraction, std 0 -> 100
    (("memory",), Pod(2000, 2048, 2), 100),
    # a CPU-only pod leaves the GPU out: (0.5, 0.25) -> 87
    (ALL_THREE, Pod(2000, 2048, 0), 87),
])
def test_balanced_allocation_counts_the_resources_it_is_given(balanced, pod, score):
    profile = Profile("p", "MostAllocated", resources=(), fit_weight=0, balanced_resources=balanced)
    assert Scorer(profile, Cluster([GPU_NODE])).score(0, pod) == score


def test_a_resource_a_node_has_none_of_is_left_out_of_the_balance():
    node = Node("n", 4000, 0, 0)
    profile = Profile("p", "MostAllocated", resources=(), fit_weight=0, balanced_resources=("cpu", "memory"))
    assert Scorer(profile, Cluster([node])).score(0, Pod(2000, 0, 0)) == 100  # memory left out: cpu alone, std 0
    no_cpu = Node("m", 0, 8192, 8)
    profile = Profile("p", "MostAllocated", resources=(), fit_weight=0, balanced_resources=ALL_THREE)
    # cpu left out: memory 4096/8192 = 0.5, gpu 2/8 = 0.25 -> 87
    assert Scorer(profile, Cluster([no_cpu])).score(0, Pod(0, 4096, 2)) == 87


@pytest.mark.parametrize("balanced, pod, skipped", [
    (("cpu", "memory"), Pod(0, 0, 1), True),  # requests none of the balanced resources
    (ALL_THREE, Pod(0, 0, 1), False),
    ((GPU,), Pod(100, 100, 0), True),
    (("memory",), Pod(100, 0, 1), True),
    (("memory",), Pod(0, 100, 0), False),
    (("cpu",), Pod(100, 0, 0), False),
    (ALL_THREE, Pod(0, 0, 0), True),
])
def test_balanced_allocation_skips_a_pod_that_requests_none_of_its_resources(balanced, pod, skipped):
    scorer = Scorer(Profile("p", "MostAllocated", balanced_resources=balanced), Cluster([GPU_NODE]))
    assert scorer.best_effort(pod) is skipped


def test_an_extended_resource_the_pod_does_not_request_is_left_out_of_fit():
    cluster = Cluster([GPU_NODE], {"g": Pod(0, 0, 6, None, 0, 0)})  # explicit zero cpu: nothing but GPUs
    with_gpu = Profile("p", "MostAllocated", ((GPU, 1), ("cpu", 1)), balanced_weight=0)
    cpu_only = Profile("p", "MostAllocated", (("cpu", 1),), balanced_weight=0)
    pod = Pod(2000, 0, 0)
    assert Scorer(with_gpu, cluster).score(0, pod) == Scorer(cpu_only, cluster).score(0, pod) == 50
    # requested, the GPU counts: (8/8 -> 100 + 2000/4000 -> 50) / 2 = 75
    assert Scorer(with_gpu, cluster).score(0, Pod(2000, 0, 2)) == 75


# --- placing pods ---------------------------------------------------------------------------------------------------
PACK_GPUS = Profile("pack", "MostAllocated", ((GPU, 1),), balanced_weight=0)


def test_a_tie_between_the_best_nodes_is_broken_at_random():
    nodes = [Node("a", 1000, 1000, 1), Node("b", 1000, 1000, 1)]
    chosen = {Scheduler(Cluster(nodes), PACK_GPUS, random.Random(seed)).place(Pod(1, 1, 1)) for seed in range(20)}
    assert chosen == {0, 1}


def test_a_single_best_node_takes_no_random_draw():
    """The draws stay for the ties: after a unique best, the next tie is broken as if it were the first draw."""
    nodes = [Node("best", 1000, 1000, 2), Node("a", 1000, 1000, 4), Node("b", 1000, 1000, 4)]
    for seed in range(10):
        scheduler = Scheduler(Cluster(nodes, {"best": Pod(0, 0, 1)}), PACK_GPUS, random.Random(seed))
        assert scheduler.place(Pod(1, 1, 1)) == 0
        tied = Scheduler(Cluster(nodes[1:]), PACK_GPUS, random.Random(seed)).place(Pod(1, 1, 1)) + 1
        assert scheduler.place(Pod(1, 1, 1)) == tied


def test_cpu_pods_are_placed_with_the_default_profile():
    nodes = [Node("busy", 4000, 8192, 0), Node("idle", 4000, 8192, 0)]
    cluster = Cluster(nodes, {"busy": Pod(2000, 4096, 0)})
    packing_cpu = Profile("pack", "MostAllocated", (("cpu", 1),), balanced_weight=0)
    assert Scheduler(cluster, packing_cpu, random.Random(1)).place(Pod(100, 100, 0)) == 1  # spread: the idle one


def test_scanning_starts_at_the_first_node_for_gpu_and_cpu_pods_alike():
    """With 200 nodes and 50 % to score, the search stops after 100 feasible nodes, starting at node 0; node 0 is
    the only best node, so a search that started anywhere else would miss it."""
    scanning = Profile("p", "MostAllocated", ((GPU, 1),), balanced_weight=0, percentage_of_nodes_to_score=50)
    gpu_nodes = [Node(f"g{i}", 8000, 8192, 2) for i in range(200)]
    cluster = Cluster(gpu_nodes, {"g0": Pod(0, 0, 1)})
    assert Scheduler(cluster, scanning, random.Random(1)).place(Pod(1, 1, 1)) == 0
    cpu_nodes = [Node(f"c{i}", 8000, 8192, 0) for i in range(200)]
    busy = Cluster(cpu_nodes, {f"c{i}": Pod(4000, 4096, 0) for i in range(1, 200)})
    assert Scheduler(busy, scanning, random.Random(1)).place(Pod(100, 100, 0)) == 0  # the default profile spreads


def busy_cpu_nodes_after_gpu_padding() -> tuple[list[Node], dict]:
    """200 GPU nodes (no CPU pod fits them), then CPU nodes 200-399: all busy but node 300, idle."""
    nodes = [Node(f"g{i}", 8000, 8192, 2) for i in range(200)] + [Node(f"c{i}", 8000, 8192, 0)
                                                                  for i in range(200, 400)]
    return nodes, {f"c{i}": Pod(4000, 4096, 0) for i in range(200, 400) if i != 300}


QUARTER = dataclasses.replace(scoring.DEFAULT_PROFILE, percentage_of_nodes_to_score=25)  # 100 of 400 nodes


def test_cpu_pods_keep_their_own_rotating_start_and_stop_at_the_nodes_wanted():
    """The first CPU pod scans 0-299 (100 feasible: 200-299, all busy, a random one); the second starts at 300,
    where the idle node is the only best one."""
    nodes, used = busy_cpu_nodes_after_gpu_padding()
    firsts = set()
    for seed in range(5):
        scheduler = Scheduler(Cluster(nodes, used), PACK_GPUS, random.Random(seed), cpu_profile=QUARTER)
        first, second = scheduler.place(Pod(100, 100, 0)), scheduler.place(Pod(100, 100, 0))
        assert 200 <= first < 300 and second == 300
        firsts.add(first)
    assert len(firsts) > 1  # a tie within the nodes scanned is broken at random


def test_a_removed_pod_frees_what_it_held():
    cluster = Cluster([Node("n", 1000, 1000, 1)])
    scheduler = Scheduler(cluster, PACK_GPUS, random.Random(1))
    assert scheduler.place(Pod(1000, 1000, 1)) == 0 and scheduler.place(Pod(1, 1, 1)) is None
    scheduler.remove(0, Pod(1000, 1000, 1))
    assert (cluster.cpu, cluster.mem, cluster.gpu) == ([0], [0], [0]) and scheduler.place(Pod(1, 1, 1)) == 0


def test_offline_packing_places_each_pod_once_and_never_beyond_capacity():
    nodes = [Node(f"n{i}", 96000, 393216, 8) for i in range(2)]
    assert engine.best_offline(nodes, [Pod(1, 1, 1)])[0] == 1
    assert engine.best_offline(nodes, [Pod(1, 1, 8)] * 3)[0] == 16
