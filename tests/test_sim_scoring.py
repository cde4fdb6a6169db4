"""The simulator's scheduling model against scores computed by hand from kube-scheduler's formulas
(pkg/scheduler/framework/plugins/noderesources: least_allocated.go, most_allocated.go,
requested_to_capacity_ratio.go, balanced_allocation.go; helper/shape_score.go; schedule_one.go)."""
from __future__ import annotations

import random

import pytest

from gpu_bootstrap.core.config import SchedulerConfig
from gpu_bootstrap.render import scheduler as render
from gpu_bootstrap.sim import engine, replay, scoring, trace
from gpu_bootstrap.sim.engine import Cluster, Node, Pod, Scheduler, Scorer
from gpu_bootstrap.sim.scoring import GPU, Profile

pytestmark = pytest.mark.unit  # host-free: the fast loop (pytest -m unit)


# --- per-resource formulas --------------------------------------------------------------------------------------
@pytest.mark.parametrize("requested, capacity, least, most", [
    (2000, 4000, 50, 50),
    (3072, 8192, 62, 37),  # 62.5 and 37.5 truncate
    (0, 4000, 100, 0),
    (5000, 4000, 0, 100),  # over capacity: least 0, most clamps to capacity
    (10, 0, 0, 0),  # no capacity: no score
])
def test_least_and_most_requested(requested, capacity, least, most):
    assert scoring.least_requested(requested, capacity) == least
    assert scoring.most_requested(requested, capacity) == most


@pytest.mark.parametrize("shape, utilization, expected", [
    (((0, 0), (50, 30), (100, 100)), 75, 65),  # 30 + 70*25/50
    (((0, 0), (50, 30), (100, 100)), 20, 12),  # 30*20/50 = 12
    (((0, 0), (50, 30), (100, 100)), 0, 0),
    (((0, 100), (30, 0)), 10, 67),  # 100 + (-100*10)/30: Go truncates -33.3 to -33 (Python's // would give 66)
    (((0, 100), (30, 0)), 60, 0),  # past the last point: its score
    (((20, 40), (100, 100)), 5, 40),  # before the first point: its score
])
def test_broken_linear_shape(shape, utilization, expected):
    assert scoring.broken_linear(shape, utilization) == expected


def test_shape_scores_are_scaled_from_0_10_to_0_100():
    assert scoring.scaled_shape(((0, 0), (50, 3), (100, 10))) == ((0, 0), (50, 30), (100, 100))


# --- NodeResourcesFit node scores --------------------------------------------------------------------------------
def test_least_allocated_node_score_floors_the_weighted_mean():
    # cpu (1000+1000)/4000 -> 50, memory (2048+1024)/8192 -> 62; (50 + 62) // 2 = 56
    assert scoring.fit_score("LeastAllocated", [(2000, 4000, 1), (3072, 8192, 1)]) == 56


def test_most_allocated_weights_the_gpu():
    # gpu (3+2)/8 -> 62 with weight 3, cpu 2000/4000 -> 50 with weight 1: (186 + 50) // 4 = 59
    assert scoring.fit_score("MostAllocated", [(5, 8, 3), (2000, 4000, 1)]) == 59


def test_requested_to_capacity_ratio_rounds_and_drops_zero_scores():
    shape = scoring.scaled_shape(((0, 0), (50, 3), (100, 10)))
    # gpu at 75 % -> 65 (weight 2), cpu at 20 % -> 12 (weight 1): round(142 / 3) = 47
    assert scoring.fit_score("RequestedToCapacityRatio", [(6, 8, 2), (800, 4000, 1)], shape) == 47
    # memory at 0 % scores 0 and leaves the average: only the gpu's 65 counts
    assert scoring.fit_score("RequestedToCapacityRatio", [(6, 8, 2), (0, 4000, 5)], shape) == 65


def test_requested_to_capacity_ratio_rounds_half_away_from_zero():
    linear = scoring.scaled_shape(((0, 0), (100, 10)))
    # scores 2 and 3: (2 + 3) / 2 = 2.5 -> 3 (Go's math.Round; Python's round would give 2)
    assert scoring.fit_score("RequestedToCapacityRatio", [(2, 100, 1), (3, 100, 1)], linear) == 3


@pytest.mark.parametrize("fractions, expected", [
    ([0.5, 0.25], 87),  # std |0.5-0.25|/2 = 0.125 -> 87.5 -> 87
    ([0.2, 0.5, 0.8], 75),  # std sqrt(0.06) = 0.2449 -> 75.5 -> 75
    ([1.4, 0.6], 80),  # fractions clamp at 1: std 0.2
    ([0.3], 100),
])
def test_balanced_allocation(fractions, expected):
    assert scoring.balanced_score(fractions) == expected


@pytest.mark.parametrize("nodes, percentage, expected", [
    (50, 0, 50),  # under 100 nodes: all of them
    (1213, 0, 497),  # adaptive: 50 - 1213/125 = 41 %
    (5000, 0, 500),  # 10 %
    (10000, 0, 500),  # floor of 5 %
    (1213, 100, 1213),
    (1213, 5, 100),  # never fewer than 100
])
def test_nodes_to_find(nodes, percentage, expected):
    assert scoring.nodes_to_find(nodes, percentage) == expected


# --- a profile is read from what the renderer deploys ------------------------------------------------------------
def test_the_tool_profile_comes_from_the_rendered_configuration():
    profile = scoring.profile_from_config(render.scheduler_configuration(SchedulerConfig(), "1.31.0", 1213))
    assert profile == Profile("gpu-binpack-scheduler", "RequestedToCapacityRatio", ((GPU, 100),),
                              ((0, 0), (50, 1), (100, 10)), 3, 1, ("cpu", "memory", GPU), 100)
    large = scoring.profile_from_config(render.scheduler_configuration(SchedulerConfig(), "1.31.0", 5000))
    assert large.percentage_of_nodes_to_score == 0  # adaptive, which the model scans as kube-scheduler does


def test_weights_shape_and_balanced_allocation_carry_over():
    settings = SchedulerConfig(name="packer", strategy="RequestedToCapacityRatio", fit_weight=3,
                               balanced_allocation_weight=2, resource_weights={GPU: 50, "cpu": 1},
                               shape=[{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}],
                               percentage_of_nodes_to_score=0)
    profile = scoring.profile_from_config(render.scheduler_configuration(settings, "1.24.0"))
    assert (profile.strategy, profile.resources, profile.shape, profile.fit_weight, profile.balanced_weight,
            profile.percentage_of_nodes_to_score) == (
        "RequestedToCapacityRatio", ((GPU, 50), ("cpu", 1)), ((0, 0), (100, 10)), 3, 2, 0)


# --- a node's whole score -----------------------------------------------------------------------------------------
def two_resource_node(**usage) -> Cluster:
    cluster = Cluster([Node("n", cpu=4000, memory=8192, gpus=8)])
    if usage:
        cluster.add(0, Pod(**usage))
    return cluster


def test_default_profile_sums_fit_and_balanced_allocation():
    cluster = two_resource_node(cpu=1000, memory=2048, gpus=1)
    score = Scorer(scoring.DEFAULT_PROFILE, cluster).score(0, Pod(1000, 1024, 1))
    # Fit: LeastAllocated 56 (above); Balanced: cpu 0.5, memory 0.375 -> std 0.0625 -> 93; total 149
    assert score == 56 + 93


def test_plugin_weights_multiply_plugin_scores():
    cluster = two_resource_node(cpu=1000, memory=2048, gpus=1)
    profile = Profile("p", "MostAllocated", ((GPU, 3), ("cpu", 1)), fit_weight=2, balanced_weight=1)
    # Fit: gpu (1+1)/8 -> 25 x3, cpu 2000/4000 -> 50: (75 + 50) // 4 = 31; x2 = 62; Balanced 93
    assert Scorer(profile, cluster).score(0, Pod(1000, 1024, 1)) == 62 + 93


def test_a_pod_without_requests_counts_the_non_zero_defaults_for_fit_only():
    cluster = two_resource_node()
    profile = Profile("p", "MostAllocated", (("cpu", 1), ("memory", 1)), balanced_weight=0)
    # cpu 100m of 4000 -> 2, memory 200Mi of 8192 -> 2
    assert Scorer(profile, cluster).score(0, Pod(0, 0, 0)) == 2


def test_the_gpu_is_left_out_for_a_pod_that_does_not_request_it():
    cluster = Cluster([Node("cpu-node", cpu=4000, memory=8192, gpus=0)])
    profile = Profile("p", "MostAllocated", ((GPU, 100), ("cpu", 1)), balanced_weight=0)
    # only cpu counts: 2000/4000 -> 50 (with the GPU at weight 100 it would be near 0)
    assert Scorer(profile, cluster).score(0, Pod(2000, 0, 0)) == 50


# --- placement ------------------------------------------------------------------------------------------------------
PACKER = scoring.profile_from_config(render.scheduler_configuration(SchedulerConfig(), "1.31.0"))


def place_all(profile: Profile, nodes: list[Node], pods: list[Pod], seed: int = 1) -> list[int | None]:
    scheduler = Scheduler(Cluster(nodes), profile, random.Random(seed))
    return [scheduler.place(pod) for pod in pods]


def test_spreading_fragments_and_packing_keeps_a_whole_node_free():
    nodes = [Node(f"n{i}", 96000, 393216, 8) for i in range(2)]
    small = [Pod(4000, 16384, 1)] * 8
    assert place_all(scoring.DEFAULT_PROFILE, nodes, small + [Pod(8000, 32768, 8)])[-1] is None
    assert place_all(PACKER, nodes, small + [Pod(8000, 32768, 8)])[-1] is not None


def test_cpu_only_pods_stay_off_gpu_nodes_and_models_are_respected():
    nodes = [Node("gpu-a", 96000, 393216, 8, "A100"), Node("gpu-t", 96000, 393216, 8, "T4"),
             Node("cpu", 32000, 262144, 0)]
    placed = place_all(PACKER, nodes, [Pod(1000, 1024, 0), Pod(1000, 1024, 1, frozenset({"T4"}))])
    assert placed == [2, 1]


def test_percentage_of_nodes_to_score_scans_from_a_rotating_start():
    nodes = [Node(f"n{i}", 8000, 8192, 1) for i in range(200)]
    profile = Profile("p", "MostAllocated", ((GPU, 1),), balanced_weight=0, percentage_of_nodes_to_score=50)
    first, second, third = place_all(profile, nodes, [Pod(1000, 1024, 1)] * 3)
    # every node scores the same, so each pick is random within the 100 feasible nodes that search found:
    # from node 0, then from node 100, then wrapped around to 0 again (skipping the first pick, now full)
    assert first < 100 and 100 <= second < 200 and third <= 100 and third != first


def test_the_same_seed_gives_the_same_placement():
    nodes = [Node(f"n{i}", 96000, 393216, 8) for i in range(20)]
    pods = [Pod(1000 * (i % 7 + 1), 4096, 1 + i % 2) for i in range(60)]
    assert place_all(scoring.DEFAULT_PROFILE, nodes, pods, 7) == place_all(scoring.DEFAULT_PROFILE, nodes, pods, 7)


def test_offline_first_fit_decreasing_packs_powers_of_two_without_waste():
    nodes = [Node(f"n{i}", 96000, 393216, 8) for i in range(3)]
    pods = [Pod(1000, 1024, g) for g in (1, 2, 1, 4, 1, 8, 2, 1, 4)]  # 24 GPUs for 24
    assert engine.best_offline(nodes, pods)[0] == 24


def test_a_fragmentation_failure_is_told_apart_from_a_full_cluster():
    nodes = [Node(f"n{i}", 96000, 393216, 8) for i in range(2)]
    arrivals = replay.Sample([Pod(4000, 16384, 1)] * 8 + [Pod(8000, 32768, 8)] * 2, at_100=10)
    spread = replay.replay(nodes, arrivals, scoring.DEFAULT_PROFILE, seed=1)
    assert spread.frag_failures["8"] == 2  # both times 8 GPUs were free in total, but never on one node
    assert spread.first_frag_failure_pct == 100.0  # the first 8-GPU pod arrives with 16 of 16 GPUs demanded
    packed = replay.replay(nodes, arrivals, PACKER, seed=1)
    assert packed.frag_failures["8"] == 0 and packed.first_failure_pct == 150.0  # the second one: full, not frag


# --- requests, container by container (component-helpers resource.PodRequests; KEP-753 for sidecars) ----------------
def spec(*containers, init=()) -> dict:
    def container(requests, restart=None):
        entry = {"name": "c", "resources": {"requests": requests}}
        return {**entry, "restartPolicy": restart} if restart else entry
    return {"containers": [container(r) for r in containers],
            "initContainers": [container(r, "Always" if sidecar else None) for r, sidecar in init]}


@pytest.mark.parametrize("containers, plain, nonzero", [
    ([{}, {}], (0, 0), (200, 400)),  # the defaults count per container whose request is not set
    ([{"cpu": "0", "memory": "0"}], (0, 0), (0, 0)),  # an explicit 0 stays 0
    ([], (0, 0), (0, 0)),  # no containers: nothing to default
    ([{"cpu": "1"}, {"memory": "1Gi"}], (1000, 1024), (1100, 1224)),  # each container defaults what it lacks
    ([{"cpu": "250m", "memory": "0"}, {}], (250, 0), (350, 200)),
])
def test_non_zero_defaults_apply_per_container_whose_request_is_missing(containers, plain, nonzero):
    pod = trace.pod_from_spec(spec(*containers))
    assert (pod.cpu, pod.memory) == plain
    assert (pod.nonzero_cpu, pod.nonzero_memory) == nonzero


def test_init_containers_set_a_floor_and_sidecars_add_to_the_app_containers():
    # app 1000m + 1Gi; a sidecar (restartPolicy: Always) 500m + 256Mi runs beside them: 1500m, 1280Mi.
    # The plain init container after the sidecar needs 2000m + 512Mi plus the sidecar already running: 2500m, 768Mi.
    # Per resource the larger: cpu 2500 (init phase), memory 1280 (running phase).
    pod = trace.pod_from_spec(spec({"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                                   init=[({"cpu": "500m", "memory": "256Mi"}, True),
                                         ({"cpu": "2", "memory": "512Mi"}, False)]))
    assert (pod.cpu, pod.memory, pod.gpus) == (2500, 1280, 1)
    # an init container before the sidecar does not count it
    early = trace.pod_from_spec(spec({"cpu": "1"}, init=[({"cpu": "2"}, False), ({"cpu": "500m"}, True)]))
    assert early.cpu == 2000  # max(1000 + 500, 2000)
    # a sidecar without requests gets the defaults for Fit, and so do the init containers' missing ones
    assert (early.nonzero_cpu, early.nonzero_memory) == (2000, 400)  # memory: app 200 + sidecar 200 > init's 200


def test_the_overhead_adds_to_both_counts():
    pod = trace.pod_from_spec({**spec({}), "overhead": {"cpu": "250m", "memory": "120Mi"}})
    assert (pod.cpu, pod.memory, pod.nonzero_cpu, pod.nonzero_memory) == (250, 120, 350, 320)


def test_csv_pods_count_a_zero_as_a_missing_request():
    # the openb CSV cannot tell an explicit 0 from a missing request; its pods are one container each
    assert (Pod(0, 0, 1).nonzero_cpu, Pod(0, 0, 1).nonzero_memory) == (100, 200)
    assert Pod.from_containers([engine.Container(0, 0, 1)]).shape[-2:] == (0, 0)


def test_running_pods_keep_their_own_defaults_and_merge_into_sums():
    empty = trace.pod_from_spec(spec({}, {}))  # two containers without requests: 200m, 400Mi for Fit
    per_pod = Cluster([Node("n", 4000, 8192, 8)], {"n": [empty, empty]})
    merged = Cluster([Node("n", 4000, 8192, 8)], {"n": engine.merge_pods([empty, empty])})
    assert (per_pod.nz_cpu, per_pod.nz_mem, per_pod.cpu) == ([400], [800], [0])
    assert (merged.nz_cpu, merged.nz_mem, merged.cpu) == ([400], [800], [0])


# --- what upstream leaves out of a score --------------------------------------------------------------------------
def test_balanced_allocation_gives_no_score_to_a_best_effort_pod():
    cluster = two_resource_node(cpu=3000, memory=1024, gpus=0)
    profile = Profile("p", "MostAllocated", ((GPU, 1),), fit_weight=1, balanced_weight=1)
    scorer = Scorer(profile, cluster)
    best_effort = trace.pod_from_spec(spec({}, {}))
    assert scorer.best_effort(best_effort) and scorer.score(0, best_effort) == 0
    # before kubernetes PR #130260 it scored the node's balance: cpu 0.75, memory 0.125 -> 68
    assert not scorer.best_effort(Pod(1, 0, 0))


def test_a_resource_whose_allocatable_is_zero_is_left_out():
    # a node reporting no memory: RequestedToCapacityRatio would give the missing resource the shape's score at
    # 100 % (10 -> 100 here) and lift the node; upstream skips it, so only cpu counts: 2000/4000 -> 50
    cluster = Cluster([Node("n", cpu=4000, memory=0, gpus=0)])
    profile = Profile("p", "RequestedToCapacityRatio", (("cpu", 1), ("memory", 1)), ((0, 0), (100, 10)),
                      balanced_weight=0)
    assert Scorer(profile, cluster).score(0, Pod(2000, 0, 0, nonzero_memory=0)) == 50
    assert scoring.fit_score("LeastAllocated", [(1000, 4000, 1), (5, 0, 3)]) == 75  # not (75 + 0) // 4
