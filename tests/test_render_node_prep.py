"""Table tests of the pure node-prep renderer: prepare, re-prepare after a config change, and exact undo."""
from __future__ import annotations

import pytest

from gpu_bootstrap.render.node_prep import (ANNOTATION, describe, labels_before_patch, operator_labels_undo,
                                            prepare_patch, read_record, undo_patch)
from tests.kubeapi.patches import merge_patch

pytestmark = pytest.mark.unit  # host-free: the fast loop (pytest -m unit)

GPU = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
WANT = {"nvidia.com/gpu.present": "true"}


def node(labels=None, taints=None, annotations=None) -> dict:
    return {"metadata": {"name": "n", "labels": dict(labels or {}), "annotations": dict(annotations or {})},
            "spec": {"taints": list(taints)} if taints else {}}


def run(obj: dict, labels: dict, taint) -> dict:
    patch = prepare_patch(obj, labels, taint)
    return merge_patch(obj, patch) if patch else obj


def user_view(obj: dict) -> tuple:
    """What a user sees: labels, taints and annotations other than ours."""
    meta = obj["metadata"]
    return (meta.get("labels") or {}, (obj.get("spec") or {}).get("taints") or [],
            {k: v for k, v in (meta.get("annotations") or {}).items() if k != ANNOTATION})


CASES = [
    ("fresh node", node(), WANT, GPU),
    ("user label and taint kept", node({"team": "x"}, [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]),
     WANT, GPU),
    ("label already true (user's)", node(WANT), WANT, GPU),
    ("label with another value", node({"nvidia.com/gpu.present": "false"}), WANT, GPU),
    ("taint already present (user's)", node(taints=[GPU]), WANT, GPU),
    ("taint slot taken with another value", node(taints=[{**GPU, "value": "other"}]), WANT, GPU),
    ("no taint wanted", node(), WANT, None),
    ("taint without value", node(), {}, {"key": "gpu", "effect": "NoExecute"}),
]


@pytest.mark.parametrize("name, before, labels, taint", CASES, ids=[c[0] for c in CASES])
def test_prepare_reaches_the_wanted_state_and_is_idempotent(name, before, labels, taint):
    after = run(before, labels, taint)
    for key, value in labels.items():
        assert after["metadata"]["labels"][key] == value
    taints = (after.get("spec") or {}).get("taints") or []
    if taint:
        assert sum(1 for t in taints if t["key"] == taint["key"] and t["effect"] == taint["effect"]) == 1
        assert any(t.get("value", "") == taint.get("value", "") for t in taints if t["key"] == taint["key"])
    assert prepare_patch(after, labels, taint) is None


@pytest.mark.parametrize("name, before, labels, taint", CASES, ids=[c[0] for c in CASES])
def test_undo_restores_exactly_what_was_there(name, before, labels, taint):
    after = run(before, labels, taint)
    patch = undo_patch(after)
    restored = merge_patch(after, patch) if patch else after
    assert user_view(restored) == user_view(before)
    assert ANNOTATION not in (restored["metadata"].get("annotations") or {})


def test_changing_a_wanted_label_gives_back_the_old_one():
    first = run(node({"keep": "me"}), {"team": "ml"}, GPU)
    second = run(first, {"team": "ai"}, GPU)
    assert second["metadata"]["labels"]["team"] == "ai"
    assert read_record(second)["labels"]["team"] == {"set": "ai", "prev": None}
    dropped = run(second, {}, GPU)
    assert "team" not in dropped["metadata"]["labels"] and dropped["metadata"]["labels"]["keep"] == "me"


def test_changing_the_taint_replaces_ours_and_restores_what_it_displaced():
    before = node(taints=[{**GPU, "value": "user"}])
    first = run(before, {}, GPU)
    moved = run(first, {}, {"key": "gpu", "value": "yes", "effect": "NoExecute"})
    keys = sorted((t["key"], t.get("value")) for t in moved["spec"]["taints"])
    assert keys == [("gpu", "yes"), ("nvidia.com/gpu", "user")]


def test_undo_leaves_a_label_the_user_changed_after_us():
    after = run(node(), {"team": "ml"}, None)
    after["metadata"]["labels"]["team"] = "user-now"
    restored = merge_patch(after, undo_patch(after))
    assert restored["metadata"]["labels"]["team"] == "user-now"


def test_undo_of_an_untouched_node_is_nothing():
    assert undo_patch(node({"a": "b"})) is None


def test_describe_summarises_a_patch():
    patch = prepare_patch(node(), WANT, GPU)
    assert describe(patch) == "label nvidia.com/gpu.present=true, taints [nvidia.com/gpu=present:NoSchedule]"


# --- the labels the gpu-operator leaves behind ------------------------------------------------------------------------

BEFORE = "gpu-bootstrap.io/labels-before-gpu-operator"


def labelled(labels: dict, annotations: dict | None = None) -> dict:
    return {"metadata": {"name": "n", "labels": labels, "annotations": annotations or {}}}


def test_the_operator_labels_a_node_had_are_remembered_once():
    node = labelled({"nvidia.com/team": "ml", "kubernetes.io/hostname": "n", "feature.node.kubernetes.io/x": "1"})
    assert labels_before_patch(node, BEFORE) == {"metadata": {"annotations": {
        BEFORE: '["feature.node.kubernetes.io/x","nvidia.com/team"]'}}}
    assert labels_before_patch(labelled({}, {BEFORE: "[]"}), BEFORE) is None


@pytest.mark.parametrize("labels, record, keep, expected", [
    ({"nvidia.com/gpu.deploy.driver": "true", "nvidia.com/team": "ml", "zone": "a"}, '["nvidia.com/team"]', set(),
     {"metadata": {"annotations": {BEFORE: None}, "labels": {"nvidia.com/gpu.deploy.driver": None}}}),
    ({"nvidia.com/gpu.present": "true", "feature.node.kubernetes.io/pci-10de.present": "true"}, "[]",
     {"nvidia.com/gpu.present"},
     {"metadata": {"annotations": {BEFORE: None}, "labels": {"feature.node.kubernetes.io/pci-10de.present": None}}}),
    ({"nvidia.com/gpu.deploy.driver": "true"}, "not json", set(), {"metadata": {"annotations": {BEFORE: None}}}),
    ({"nvidia.com/gpu.deploy.driver": "true"}, None, set(), None),
])
def test_teardown_removes_only_the_operator_labels_that_came_with_it(labels, record, keep, expected):
    node = labelled(labels, {BEFORE: record} if record is not None else {})
    assert operator_labels_undo(node, BEFORE, keep) == expected


MARKS = "gpu-bootstrap.io/annotations-before-gpu-operator"
UPGRADE = "nvidia.com/gpu-driver-upgrade-enabled"  # NVIDIA's controller sets it on every GPU node (25.3, real)


def test_the_operator_annotations_a_node_had_are_remembered_with_its_labels():
    node = labelled({}, {"nvidia.com/mine": "x", "kwok.x-k8s.io/node": "fake"})
    assert labels_before_patch(node, BEFORE, MARKS) == {"metadata": {"annotations": {
        BEFORE: "[]", MARKS: '["nvidia.com/mine"]'}}}


@pytest.mark.parametrize("annotations, expected", [
    ({BEFORE: "[]", MARKS: '["nvidia.com/mine"]', UPGRADE: "true", "nvidia.com/mine": "x", "other": "y"},
     {"metadata": {"annotations": {BEFORE: None, MARKS: None, UPGRADE: None}}}),
    ({BEFORE: "[]", UPGRADE: "true"}, {"metadata": {"annotations": {BEFORE: None}}}),  # recorded before: kept
    ({MARKS: "not json", UPGRADE: "true"}, {"metadata": {"annotations": {MARKS: None}}}),
    ({UPGRADE: "true"}, None),
])
def test_teardown_removes_only_the_operator_annotations_that_came_with_it(annotations, expected):
    assert operator_labels_undo(labelled({}, annotations), BEFORE, set(), MARKS) == expected
    if expected and UPGRADE in expected["metadata"]["annotations"]:
        assert "remove annotation nvidia.com/gpu-driver-upgrade-enabled" in describe(expected)
