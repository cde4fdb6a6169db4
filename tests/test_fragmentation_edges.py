"""Fragmentation measures and the defragmentation planner at their edges: the smallest GPU pod (or the scheduler's
defaults), the largest request that still fits (1, odd sizes, none), the order requests are served in (largest
first), a node taken for one request is not given to the next, usage follows the planned moves, a node that
receives moved pods is never drained later (they would stay on it), the caller's data is left alone, and ties are
broken by the fixed seed so the same snapshot always gets the same plan."""
from __future__ import annotations

import pytest

from gpu_bootstrap.sim import fragmentation as frag
from gpu_bootstrap.sim import scoring
from gpu_bootstrap.sim.engine import Node, Pod

pytestmark = pytest.mark.unit

PACKING = scoring.Profile("packing", strategy="MostAllocated", resources=((scoring.GPU, 1),))


def nodes(*gpus: int) -> list[Node]:
    return [Node(f"n{i}", 96000, 1_000_000, count) for i, count in enumerate(gpus)]


@pytest.mark.parametrize("pods, smallest", [
    ([], (100, 200)),
    ([Pod(50, 10, 0)], (100, 200)),  # CPU-only pods do not count
    ([Pod(4000, 100, 1), Pod(1000, 900, 2), Pod(10, 10, 0)], (1000, 100)),  # cpu and memory each at their minimum
])
def test_the_smallest_gpu_pod_or_the_schedulers_defaults(pods, smallest):
    assert frag.smallest_request(pods) == smallest


@pytest.mark.parametrize("gpus, used, largest", [
    ((8,), {"n0": Pod(0, 0, 7)}, 1),
    ((8,), {"n0": Pod(0, 0, 5)}, 3),
    ((8, 4), {"n0": Pod(0, 0, 1), "n1": Pod(0, 0, 4)}, 7),
    ((8,), {"n0": Pod(0, 0, 8)}, 0),
    ((), None, 0),
])
def test_the_largest_request_that_still_fits(gpus, used, largest):
    assert frag.measures(nodes(*gpus), used, (100, 200))["largest_fit"] == largest


def test_the_plan_as_json():
    plan = frag.defrag(nodes(8, 8), {"n0": Pod(0, 0, 2), "n1": Pod(0, 0, 1)}, {"n1": [("a/x", Pod(0, 0, 1))]}, [8],
                       PACKING, pinned={"n0": "a/bare has no controller"})
    assert plan.to_json() == {"drains": [{"node": "n1", "gpus": 8, "moves": [{"pod": "a/x", "gpus": 1, "to": "n0"}]}],
                              "wanted": [8], "unmet": [], "skipped": {"n0": "a/bare has no controller"}}


def test_the_largest_request_is_served_first():
    used = {"n0": Pod(0, 0, 7), "n1": Pod(0, 0, 1)}
    movable = {"n0": [("a/seven", Pod(0, 0, 7))], "n1": [("a/one", Pod(0, 0, 1))]}
    plan = frag.defrag(nodes(8, 8), used, movable, [1, 8], PACKING)
    # 8 first: n1's pod goes to n0's last free GPU; the 1-GPU request then finds no room (served first, it would
    # have taken that GPU and left the 8-GPU request unmet)
    assert [(d.node, [(m.pod, m.to) for m in d.moves]) for d in plan.drains] == [("n1", [("a/one", "n0")])]
    assert (plan.wanted, plan.unmet) == ([8, 1], [1])


def test_a_free_node_taken_by_one_request_is_not_given_to_the_next():
    used = {"n1": Pod(0, 0, 2), "n2": Pod(0, 0, 6)}
    movable = {"n1": [("a/two", Pod(0, 0, 2))], "n2": [("a/six", Pod(0, 0, 6))]}
    plan = frag.defrag(nodes(8, 8, 8), used, movable, [8, 8], PACKING)
    assert [(d.node, [(m.pod, m.to) for m in d.moves]) for d in plan.drains] == [("n1", [("a/two", "n2")])]
    assert plan.unmet == []


def test_usage_follows_the_planned_moves_and_the_callers_data_is_left_alone():
    used = {"n0": Pod(0, 0, 5), "n1": Pod(0, 0, 1), "n2": Pod(0, 0, 2)}
    before = dict(used)
    movable = {"n1": [("a/one", Pod(0, 0, 1))], "n2": [("a/two", Pod(0, 0, 2))]}
    plan = frag.defrag(nodes(8, 8, 8), used, movable, [8, 8], PACKING)
    # a/one fills n0 to 6; a/two then fits in n0's 2 free GPUs only because the plan counted a/one there
    assert [(d.node, [(m.pod, m.to) for m in d.moves]) for d in plan.drains] == [
        ("n1", [("a/one", "n0")]), ("n2", [("a/two", "n0")])]
    assert plan.unmet == [] and used == before
    crowded = {"n0": Pod(0, 0, 6), "n1": Pod(0, 0, 1), "n2": Pod(0, 0, 2)}
    second = frag.defrag(nodes(8, 8, 8), crowded, movable, [8, 8], PACKING)
    assert [d.node for d in second.drains] == ["n1"] and second.unmet == [8]  # n0 has 1 GPU left after a/one


def test_a_node_that_receives_moved_pods_is_never_drained_later():
    """Draining it would move only its own pods: the ones the plan put there would stay, and the node the plan
    reports as free would not be."""
    used = {"n0": Pod(0, 0, 6), "n1": Pod(0, 0, 2), "n2": Pod(0, 0, 1)}
    movable = {"n0": [("a/six", Pod(0, 0, 6))], "n1": [("a/two", Pod(0, 0, 2))], "n2": [("a/one", Pod(0, 0, 1))]}
    plan = frag.defrag(nodes(8, 8, 8), used, movable, [8, 8], PACKING)
    assert [(d.node, [(m.pod, m.to) for m in d.moves]) for d in plan.drains] == [("n2", [("a/one", "n0")])]
    assert plan.unmet == [8]  # 9 GPUs in use on three 8-GPU nodes: two wholly free nodes cannot be had


def test_moved_pods_go_largest_first():
    movable = {"n0": [("a/small", Pod(100, 0, 1)), ("a/big", Pod(100, 0, 2)), ("a/cpu", Pod(900, 0, 1))]}
    plan = frag.defrag(nodes(8, 8), {"n0": Pod(1100, 0, 4), "n1": Pod(0, 0, 4)}, movable, [8], PACKING,
                       pinned={"n1": "a/bare has no controller"})
    assert [m.pod for m in plan.drains[0].moves] == ["a/big", "a/cpu", "a/small"]


def test_ties_are_broken_by_the_fixed_seed_so_a_snapshot_always_gets_the_same_plan():
    """Three nodes score alike for the moved pod; seed 42 picks n3 (pinned: the plan for a cluster must not change
    between releases or runs)."""
    used = {"n0": Pod(0, 0, 1), "n1": Pod(0, 0, 4), "n2": Pod(0, 0, 4), "n3": Pod(0, 0, 4)}
    plans = [frag.defrag(nodes(8, 8, 8, 8), used, {"n0": [("a/x", Pod(0, 0, 1))]}, [8], PACKING) for _ in range(2)]
    assert [[(m.pod, m.to) for d in p.drains for m in d.moves] for p in plans] == [[("a/x", "n3")]] * 2


def test_a_node_that_received_pods_counts_them_when_later_pods_are_placed():
    """The spreading profile sends a/one to the empty 3-GPU node n0 (absent from `used`); a/two then fits there
    exactly (GPUs, cpu and memory) only because a/one is counted once, with nothing else."""
    spread = scoring.Profile("spread", strategy="LeastAllocated", resources=((scoring.GPU, 1),), balanced_weight=0)
    cluster = [Node("n0", 2000, 2000, 3), *nodes(8, 8, 8)[1:]]
    used = {"n1": Pod(1000, 1000, 1), "n2": Pod(1000, 1000, 2), "n3": Pod(0, 0, 8)}
    movable = {"n1": [("a/one", Pod(1000, 1000, 1))], "n2": [("a/two", Pod(1000, 1000, 2))]}
    plan = frag.defrag(cluster, used, movable, [8, 8], spread, pinned={"n3": "full of pods nobody re-creates"})
    assert [(d.node, [(m.pod, m.to) for m in d.moves]) for d in plan.drains] == [
        ("n1", [("a/one", "n0")]), ("n2", [("a/two", "n0")])]
    assert plan.unmet == []


def test_a_request_a_free_node_serves_drains_nothing_even_when_a_node_could_be_drained():
    plan = frag.defrag(nodes(8, 8, 8), {"n1": Pod(0, 0, 1)}, {"n1": [("a/x", Pod(0, 0, 1))]}, [8], PACKING)
    assert (plan.drains, plan.unmet) == ([], [])


def test_moved_pods_alike_but_for_memory_go_in_the_order_of_their_keys():
    movable = {"n0": [("a/b", Pod(100, 20, 1)), ("a/a", Pod(100, 10, 1))]}
    plan = frag.defrag(nodes(8, 8), {"n0": Pod(200, 30, 2), "n1": Pod(0, 0, 4)}, movable, [8], PACKING,
                       pinned={"n1": "a/bare has no controller"})
    assert [m.pod for m in plan.drains[0].moves] == ["a/a", "a/b"]
