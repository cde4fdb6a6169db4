"""The packing benchmark's replay, measured by hand on small clusters: the whole outcome of a run with
fragmentation failures before and after 100 %, a CPU-only pod with nowhere to go and a failure on a full cluster;
the curve's points every 1 % of capacity; departures freeing their GPUs; the tracks' populations; sampling up to
exactly tune x capacity; the snapshot's counts at their boundaries (through fragmentation.measures, which uses it)."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from gpu_bootstrap.sim import fragmentation, replay, scoring
from gpu_bootstrap.sim.engine import Node, Pod

pytestmark = pytest.mark.unit

SPREAD = scoring.Profile("spread", strategy="LeastAllocated", resources=((scoring.GPU, 1),), balanced_weight=0,
                         percentage_of_nodes_to_score=100)
PACK = scoring.Profile("pack", strategy="MostAllocated", resources=((scoring.GPU, 1),), balanced_weight=0)


def gpus(count: int) -> Pod:
    return Pod(1000, 1000, count)


def test_an_empty_outcome_counts_nothing_for_every_size():
    assert asdict(replay.Outcome()) == {
        "alloc_pct_at_100": 0.0, "alloc_pct_at_130": 0.0, "frag_failures": {"1": 0, "2": 0, "4": 0, "8": 0},
        "frag_failures_to_end": {"1": 0, "2": 0, "4": 0, "8": 0}, "frag_failed_gpus": 0,
        "first_frag_failure_pct": None, "first_failure_pct": None, "stranded_gpus": 0, "partial_free_gpus": 0,
        "free_8gpu_nodes": 0, "free_4gpu_nodes": 0, "unplaced_cpu_pods": 0, "curve": [], "placed": 0}


def test_a_replay_counted_by_hand():
    """15 GPUs on nodes of 8, 4, 2 and 1 (the 1-GPU node's 500m cpu takes no GPU pod: stranded). Spreading puts
    2 -> a, 1 -> b, 1 -> a, 4 -> a, 2 -> b, 2 -> c; then a 2-GPU pod finds 1 free GPU on a, b and d each
    (fragmentation, at 14/15 = 93.33 % arrived), a CPU pod finds no CPU node, another 2-GPU pod fails the same way
    (at 16/15 arrived: 100 % is reached with it, so it counts before 100 %), and a 4-GPU pod finds 3 free GPUs in
    all (not fragmentation)."""
    nodes = [Node("a", 96000, 393216, 8), Node("b", 96000, 393216, 4), Node("c", 96000, 393216, 2),
             Node("d", 500, 393216, 1)]
    pods = [gpus(2), gpus(1), gpus(1), gpus(4), gpus(2), gpus(2), gpus(2), Pod(500, 500, 0), gpus(2), gpus(4)]
    outcome = replay.replay(nodes, replay.Sample(pods, 9), SPREAD, seed=3)
    assert asdict(outcome) == {
        "alloc_pct_at_100": 80.0, "alloc_pct_at_130": 80.0,
        "frag_failures": {"1": 0, "2": 2, "4": 0, "8": 0}, "frag_failures_to_end": {"1": 0, "2": 2, "4": 0, "8": 0},
        "frag_failed_gpus": 4, "first_frag_failure_pct": 93.33, "first_failure_pct": 93.33,
        "stranded_gpus": 1, "partial_free_gpus": 2, "free_8gpu_nodes": 0, "free_4gpu_nodes": 0,
        "unplaced_cpu_pods": 1,
        "curve": [(13.33, 13.33), (20.0, 20.0), (26.67, 26.67), (53.33, 53.33), (66.67, 66.67), (80.0, 80.0),
                  (93.33, 80.0), (93.33, 80.0), (106.67, 80.0), (133.33, 80.0)],
        "placed": 6}


def test_failures_after_100_percent_count_to_the_end_only():
    nodes = [Node("a", 96000, 393216, 4), Node("b", 96000, 393216, 4)]
    pods = [gpus(2), gpus(2), gpus(1), gpus(2), gpus(2)]  # spread: 2 -> a, 2 -> b, 1 -> a, 2 -> b; then 1 + 0 free
    outcome = replay.replay(nodes, replay.Sample(pods, 4), SPREAD, seed=1)
    assert (outcome.frag_failures, outcome.frag_failures_to_end, outcome.frag_failed_gpus) == (
        {"1": 0, "2": 0, "4": 0, "8": 0}, {"1": 0, "2": 0, "4": 0, "8": 0}, 0)
    assert (outcome.first_failure_pct, outcome.first_frag_failure_pct, outcome.alloc_pct_at_130) == (112.5, None, 87.5)
    late = replay.replay([Node("a", 96000, 393216, 4), Node("b", 96000, 393216, 4)],
                         replay.Sample([gpus(3), gpus(3), gpus(2), gpus(2)], 3), SPREAD, seed=1)
    assert (late.frag_failures["2"], late.frag_failures_to_end["2"], late.frag_failed_gpus) == (1, 2, 2)
    assert (late.first_frag_failure_pct, late.first_failure_pct) == (100.0, 100.0)


def test_the_curve_has_a_point_every_percent_of_capacity():
    nodes = [Node(f"n{i}", 96000, 393216, 4) for i in range(75)]  # 300 GPUs: a 1-GPU pod is a third of a percent
    outcome = replay.replay(nodes, replay.Sample([gpus(1)] * 10, 10), PACK, seed=1)
    assert outcome.curve == [(0.33, 0.33), (1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]
    assert outcome.placed == 10 and outcome.alloc_pct_at_130 == 100.0 * 10 / 300


def test_departures_free_their_gpus_for_the_next_pods():
    outcome = replay.replay([Node("n", 96000, 393216, 1)], replay.Sample([gpus(1)] * 3, 1), scoring.DEFAULT_PROFILE,
                            seed=1, departures=1.0)
    assert (outcome.placed, outcome.first_failure_pct, outcome.alloc_pct_at_130) == (3, None, 0.0)
    assert outcome.curve == [(100.0, 0.0), (200.0, 0.0), (300.0, 0.0)]


def test_random_placement_follows_the_runs_seed():
    """Pinned: with seed 4 the random policy splits the 4-GPU pods so that the last finds no node."""
    nodes = [Node(f"n{i}", 96000, 393216, 8) for i in range(2)]
    arrivals = replay.Sample([gpus(g) for g in (4, 4, 2, 2, 4)], 5)
    outcomes = [replay.replay(nodes, arrivals, scoring.RANDOM_PROFILE, seed=seed) for seed in (4, 4, 1)]
    assert [(o.frag_failures["4"], o.placed) for o in outcomes] == [(1, 4), (1, 4), (0, 5)]


@pytest.mark.parametrize("track, kept", [("A", ["whole", "two", "zero milli"]),
                                         ("B", ["whole", "two", "zero milli", "half", "cpu"])])
def test_track_a_keeps_whole_gpu_pods_and_track_b_every_pod(track, kept):
    pods = {"whole": (1, 1000), "two": (2, 1000), "zero milli": (1, 0), "half": (1, 500), "cpu": (0, 0)}
    rows = [{"cpu_milli": 100 * i, "memory_mib": 10 * i, "num_gpu": n, "gpu_milli": milli, "models": None}
            for i, (n, milli) in enumerate(pods.values(), start=1)]
    names = list(pods)
    expected = [Pod(100 * (names.index(k) + 1), 10 * (names.index(k) + 1), pods[k][0]) for k in kept]
    assert replay.population(rows, track) == expected


@pytest.mark.parametrize("tune, drawn, at_100", [(1.25, 5, 4), (1.3, 6, 4), (1.0, 4, 4), (0.5, 2, 2)])
def test_sampling_stops_once_demand_reaches_tune_times_capacity(tune, drawn, at_100):
    found = replay.sample([gpus(2)], 8, seed=1, tune=tune)
    assert (len(found.pods), found.at_100) == (drawn, at_100)


def test_sampling_needs_gpu_pods():
    with pytest.raises(ValueError, match="the pod list has no GPU pods for this track"):
        replay.sample([Pod(100, 100, 0)], 8, seed=1, tune=1.3)


def node(name: str, gpus_: int, cpu: int = 96000, memory: int = 393216) -> Node:
    return Node(name, cpu, memory, gpus_)


@pytest.mark.parametrize("nodes, used, figures", [
    ([node("e8", 8), node("e4", 4), node("e5", 5), node("e2", 2)], None, (0, 0, 1, 1)),
    ([node("e8", 8)], None, (0, 0, 1, 0)),
    ([node("e4", 4)], None, (0, 0, 0, 1)),
    ([node("e5", 5), node("e2", 2)], None, (0, 0, 0, 0)),
    ([node("p", 8)], {"p": Pod(0, 0, 3)}, (0, 5, 0, 0)),
    ([node("full", 8, cpu=1000)], {"full": Pod(1000, 0, 8)}, (0, 0, 0, 0)),
    ([node("cpu", 8, cpu=2000)], {"cpu": Pod(1000, 0, 2)}, (0, 6, 0, 0)),  # exactly 1000m left: not stranded
    ([node("cpu", 8, cpu=2000)], {"cpu": Pod(1001, 0, 2)}, (6, 6, 0, 0)),
    ([node("mem", 8, memory=2000)], {"mem": Pod(0, 1000, 2)}, (0, 6, 0, 0)),
    ([node("mem", 8, memory=2000)], {"mem": Pod(0, 1001, 2)}, (6, 6, 0, 0)),
])
def test_the_snapshot_counts_stranded_partly_used_and_wholly_free_nodes(nodes, used, figures):
    found = fragmentation.measures(nodes, used, (1000, 1000))
    assert (found["stranded_gpus"], found["partial_free_gpus"], found["free_8gpu_nodes"],
            found["free_4gpu_nodes"]) == figures


def test_the_offline_reference_packs_what_arrived_by_100_percent_and_by_the_end():
    nodes = [Node(f"n{i}", 96000, 393216, 8) for i in range(2)]
    arrivals = replay.Sample([gpus(g) for g in (4, 8, 4, 2)], 3)  # by 100 %: 16 of 16 fit; by the end 16 still
    reference = replay.offline_reference(nodes, arrivals)
    assert (reference["alloc_pct_at_100"], reference["alloc_pct_at_130"]) == (100.0, 100.0)
    short = replay.offline_reference(nodes, replay.Sample([gpus(g) for g in (8, 2, 8)], 2))
    assert (short["alloc_pct_at_100"], short["alloc_pct_at_130"]) == (62.5, 100.0)


def test_no_point_before_arrivals_reach_the_next_percent():
    nodes = [Node(f"n{i}", 96000, 393216, 4) for i in range(26)]  # 104 GPUs: pod 27 arrives at 25.96 %, short of 26
    outcome = replay.replay(nodes, replay.Sample([gpus(1)] * 27, 27), PACK, seed=1)
    assert len(outcome.curve) == 26 and outcome.curve[-1] == (25.0, 25.0)


def test_a_failure_of_a_size_outside_the_usual_ones_gets_its_own_count():
    nodes = [Node("a", 96000, 393216, 4), Node("b", 96000, 393216, 4)]
    outcome = replay.replay(nodes, replay.Sample([gpus(2), gpus(2), gpus(3)], 3), SPREAD, seed=1)
    assert outcome.frag_failures == {"1": 0, "2": 0, "4": 0, "8": 0, "3": 1}
    assert outcome.frag_failures_to_end == {"1": 0, "2": 0, "4": 0, "8": 0, "3": 1}


def test_a_pod_departs_only_when_the_draw_is_below_the_departure_rate():
    """One node, no ties: the run's only draws are the departure checks, from Random(seed * 7919 + 1). A rate equal
    to the first draw keeps the first pod (departure needs a draw strictly below the rate); the second draw is
    below it, so one of the two pods leaves: 1 of 2 GPUs allocated at the end (none if the first had left too)."""
    import random
    rate = random.Random(1 * 7919 + 1).random()
    outcome = replay.replay([Node("n", 96000, 393216, 2)], replay.Sample([gpus(1), gpus(1)], 2), PACK, seed=1,
                            departures=rate)
    assert (outcome.placed, outcome.alloc_pct_at_130) == (2, 50.0)
