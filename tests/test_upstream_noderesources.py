"""kube-scheduler's own noderesources score tables (tests/data/upstream_noderesources/*.yaml, translated case by
case from pkg/scheduler/framework/plugins/noderesources/*_test.go at the commit each file names) run against the
simulator's scorer: the pods go through the same container-by-container accounting as `--from-cluster`
(trace.pod_from_spec), the nodes through trace.node_from_object, the scores through engine.Scorer.

Memory is counted in bytes here (memory_unit=1) because upstream's tables use byte quantities like "10000"; the
engine's arithmetic does not depend on the unit. A case that cannot be run says why in its `skip`."""
from __future__ import annotations

import dataclasses

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gpu_bootstrap.core.config import SchedulerConfig
from gpu_bootstrap.sim import scoring, trace
from gpu_bootstrap.sim.engine import Cluster, Scorer
from gpu_bootstrap.sim.scoring import GPU, Profile

DATA = Path(__file__).resolve().parent / "data" / "upstream_noderesources"
FILES = sorted(DATA.glob("*.yaml"))
BASE_RESOURCES = {"cpu", "memory", "pods"}


def documents() -> list[tuple[Path, dict]]:
    return [(path, yaml.safe_load(path.read_text())) for path in FILES]


def cases(kind: str | None = None):
    for path, document in documents():
        for index, case in enumerate(document["cases"]):
            marks = [pytest.mark.skip(reason=case["skip"])] if case.get("skip") else []
            if kind and kind not in case:
                continue
            yield pytest.param(document, case, id=f"{path.stem}[{index}] {case['name'].strip()}", marks=marks)


def extended_resource(case: dict) -> str:
    """The one extended resource a case uses (any name), which the simulator models as its GPUs."""
    names = set(case.get("resources") or {})
    for allocatable in case["nodes"].values():
        names |= set(allocatable)
    for containers in [case["pod"], *(p["containers"] for p in case.get("existing") or [])]:
        for container in containers:
            names |= set(container)
    extended = names - BASE_RESOURCES
    assert len(extended) <= 1, f"more than one extended resource {sorted(extended)}: the case needs a skip"
    return next(iter(extended), GPU)


def pod(containers: list[dict], extended: str):
    spec = {"containers": [{"name": f"c{i}", "resources": {"requests": requests}}
                           for i, requests in enumerate(containers)]}
    return trace.pod_from_spec(spec, memory_unit=1, extended=extended)


def profile(document: dict, case: dict, extended: str) -> Profile:
    names = tuple(GPU if name == extended else name for name in case["resources"])
    if document["plugin"] == scoring.BALANCED:
        return Profile("upstream", fit_weight=0, balanced_weight=1, balanced_resources=names,
                       percentage_of_nodes_to_score=100)
    weights = tuple(zip(names, case["resources"].values()))
    shape = tuple(tuple(point) for point in case.get("shape") or Profile.shape)
    return Profile("upstream", document["strategy"], weights, shape, fit_weight=1, balanced_weight=0,
                   percentage_of_nodes_to_score=100)


def scored(document: dict, case: dict, by_change: bool = False) -> tuple[dict[str, int], Scorer, object]:
    """Every node's score for the case's pod, with the case's pods already bound (by_change: as kube-scheduler 1.36+
    scores BalancedAllocation)."""
    extended = extended_resource(case)
    nodes = [trace.node_from_object({"metadata": {"name": name}, "status": {"allocatable": allocatable}},
                                    memory_unit=1, extended=extended)
             for name, allocatable in case["nodes"].items()]
    running: dict[str, list] = {}
    for bound in case.get("existing") or []:
        running.setdefault(bound["node"], []).append(pod(bound["containers"], extended))
    cluster = Cluster(nodes, running)
    scorer = Scorer(dataclasses.replace(profile(document, case, extended), balanced_by_change=by_change), cluster)
    incoming = pod(case["pod"], extended)
    return {node.name: scorer.score(index, incoming) for index, node in enumerate(nodes)}, scorer, incoming


@pytest.mark.unit
@pytest.mark.parametrize("document, case", cases("expected"))
def test_node_scores_match_upstream(document, case):
    scores, _, _ = scored(document, case)
    assert scores == case["expected"]


@pytest.mark.unit
@pytest.mark.parametrize("document, case", cases("expected_from_1_36"))
def test_balanced_allocation_from_1_36_scores_the_change_as_upstream_does(document, case):
    """kube-scheduler 1.36 scores BalancedAllocation by the change a pod makes to a node's balance (kubernetes PR
    #135573); the expected scores are upstream's own for the same cases at v1.37.2 (balanced_allocation_test.go).
    Found when the real 1.37 scheduler packed the openb trace 0.3 points worse than the model said."""
    scores, _, _ = scored(document, case, by_change=True)
    assert scores == case["expected_from_1_36"]


@pytest.mark.unit
@pytest.mark.parametrize("document, case", cases("expected_prescore"))
def test_best_effort_pods_are_skipped_by_balanced_allocation(document, case):
    scores, scorer, incoming = scored(document, case)
    assert case["expected_prescore"] == "Skip"
    assert scorer.best_effort(incoming)
    assert set(scores.values()) == {0}  # the plugin adds nothing to any node


@pytest.mark.unit
@pytest.mark.parametrize("document, case", cases("expected_error"))
def test_arguments_upstream_rejects_are_refused_by_the_config(document, case):
    resources = case["resources"] or {}
    with pytest.raises(ValidationError) as error:
        SchedulerConfig(resource_weights=resources)
    message = str(error.value)
    if case["expected_error"].endswith(".weight"):  # scoringStrategy.resources[i].weight: the message names it
        position = int(case["expected_error"].split("[")[1].split("]")[0])
        name, weight = list(resources.items())[position]
        assert f"{name}: weight {weight} must be between 1 and 100" in message
    else:
        assert "list at least one resource" in message


def extended_only_cases():
    for path, document in documents():
        for index, case in enumerate(document["cases"]):
            if "two extended resources" in (case.get("skip") or ""):
                yield pytest.param(document, case, id=f"{path.stem}[{index}] {case['name'].strip()}")


@pytest.mark.unit
@pytest.mark.parametrize("document, case", extended_only_cases())
def test_two_extended_resources_give_upstreams_scores_through_the_same_formula(document, case):
    """The engine holds one extended resource per node, so these cases are skipped above; the formula it scores
    with (scoring.fit_score) still gives upstream's numbers when fed each resource's requested and allocatable."""
    def total(containers, name):
        return sum(trace.amount(container.get(name, 0)) for container in containers)

    shape = scoring.scaled_shape(tuple(tuple(point) for point in case["shape"]))
    scores = {}
    for node, allocatable in case["nodes"].items():
        weighted = []
        for name, weight in case["resources"].items():
            wanted = total(case["pod"], name)
            if not wanted:
                continue  # an extended resource the pod does not request is left out
            used = sum(total(bound["containers"], name) for bound in case.get("existing") or []
                       if bound["node"] == node)
            weighted.append((used + wanted, trace.amount(allocatable.get(name, 0)), weight))
        scores[node] = scoring.fit_score(document["strategy"], weighted, shape)
    assert scores == case["expected"]


@pytest.mark.parametrize("function", [pytest.param(f, id=f"points {f['points']}") for _, document in documents()
                                      for f in document.get("shape_functions") or []])
@pytest.mark.unit
def test_the_broken_linear_shape_matches_upstream(function):
    points = tuple(tuple(point) for point in function["points"])
    assert [[u, scoring.broken_linear(points, u)] for u, _ in function["assertions"]] == function["assertions"]


@pytest.mark.unit
def test_every_upstream_case_is_translated_or_skipped_with_a_reason():
    """Each file holds every case of its upstream test (upstream_cases), each with an expectation, and a skip only
    with its reason; the source commit is pinned. Cases count: 51 from four upstream files."""
    total = 0
    for path, document in documents():
        assert len(document["source"]["commit"]) == 40, path
        assert len(document["cases"]) == document["upstream_cases"], path
        for case in document["cases"]:
            assert {"expected", "expected_error", "expected_prescore"} & set(case), (path, case["name"])
            assert "skip" not in case or len(case["skip"]) > 40, (path, case["name"])
        total += len(document["cases"])
    assert {path.stem for path in FILES} == {"most_allocated", "least_allocated", "requested_to_capacity_ratio",
                                             "balanced_allocation"}
    assert total == 51
