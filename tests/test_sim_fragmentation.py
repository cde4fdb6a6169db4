"""The simulator's fragmentation measures and defragmentation planner (sim/fragmentation.py), on hand-made nodes:
pure functions, so called directly. The emulator tests (test_status_emulator.py) cover them through `status`."""
from __future__ import annotations

import pytest

from gpu_bootstrap.sim import fragmentation as frag
from gpu_bootstrap.sim import scoring
from gpu_bootstrap.sim.engine import Node, Pod

PACKING = scoring.Profile("packing", strategy="MostAllocated", resources=((scoring.GPU, 1),))


def nodes(*gpus: int) -> list[Node]:
    return [Node(f"n{i}", 96000, 1_000_000, count) for i, count in enumerate(gpus)]


@pytest.mark.unit
def test_measures_count_by_hand():
    used = {"n0": Pod(1000, 1000, 6), "n1": Pod(96000, 1000, 1)}  # n1: cpu used up, its 3 free GPUs stranded
    figures = frag.measures(nodes(8, 4, 8), used, (1000, 1000))
    assert figures["free_gpus"] == 2 + 3 + 8
    assert figures["largest_fit"] == 8
    assert figures["fits"] == {"1": 10, "2": 5, "4": 2, "8": 1}
    assert (figures["stranded_gpus"], figures["partial_free_gpus"], figures["free_8gpu_nodes"]) == (3, 5, 1)


@pytest.mark.unit
def test_a_request_that_fits_already_needs_no_drain():
    plan = frag.defrag(nodes(8, 8), {"n0": Pod(0, 0, 4)}, {"n0": [("ml/a", Pod(0, 0, 4))]}, [8], PACKING)
    assert plan.drains == [] and plan.unmet == []


@pytest.mark.unit
def test_a_node_with_a_pod_nobody_recreates_is_never_drained():
    used = {"n0": Pod(0, 0, 6), "n1": Pod(0, 0, 3)}  # n0's 6 GPUs have no room on n1; n1 may not be drained
    plan = frag.defrag(nodes(8, 8), used, {"n0": [("ml/a", Pod(0, 0, 6))]}, [8], PACKING,
                       pinned={"n1": "ml/bare has no controller"})
    assert plan.drains == [] and plan.unmet == [8] and plan.skipped == {"n1": "ml/bare has no controller"}


@pytest.mark.unit
def test_two_requests_drain_two_nodes_and_moves_go_where_there_is_room():
    used = {"n0": Pod(0, 0, 4), "n1": Pod(0, 0, 1), "n2": Pod(0, 0, 2)}
    movable = {"n0": [("a/x", Pod(0, 0, 4))], "n1": [("a/y", Pod(0, 0, 1))], "n2": [("a/z", Pod(0, 0, 2))]}
    plan = frag.defrag(nodes(8, 8, 8), used, movable, [8, 8], PACKING)
    assert [d.node for d in plan.drains] == ["n1", "n2"]  # the least used first
    # the packing puts each moved pod on the most allocated node with room (n0), never on a node being freed
    assert [(m.pod, m.to) for d in plan.drains for m in d.moves] == [("a/y", "n0"), ("a/z", "n0")]
    assert plan.unmet == []
