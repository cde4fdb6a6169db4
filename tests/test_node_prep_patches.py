"""Exact node-prep patches where the table tests only checked the end state: the user's taints and labels survive a
prepare, turning the taint off after a run, what the record says after each change, and an unreadable record."""
from __future__ import annotations

import json

import pytest

from gpu_bootstrap.render.node_prep import (ANNOTATION, deep_merge_patch, describe, prepare_patch, read_record,
                                            undo_patch)
from tests.kubeapi.patches import merge_patch

pytestmark = pytest.mark.unit

GPU = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
DEDICATED = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}  # a user's taint with the same effect as ours


def node(labels=None, taints=None, annotations=None) -> dict:
    return {"metadata": {"name": "n", "labels": dict(labels or {}), "annotations": dict(annotations or {})},
            "spec": {"taints": [dict(t) for t in taints]} if taints else {}}


def run(obj: dict, labels: dict, taint) -> dict:
    patch = prepare_patch(obj, labels, taint)
    return merge_patch(obj, patch) if patch else obj


def record(obj: dict) -> dict:
    return json.loads(obj["metadata"]["annotations"][ANNOTATION])


@pytest.mark.parametrize("user_taint", [
    DEDICATED,  # same effect, another key
    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoExecute"},  # same key, another effect
    {"key": "dedicated", "effect": "NoExecute"},
], ids=["same-effect", "same-key", "unrelated"])
def test_prepare_adds_our_taint_beside_a_users_taint_in_another_slot(user_taint):
    patch = prepare_patch(node(taints=[user_taint]), {}, GPU)
    assert patch["spec"] == {"taints": [user_taint, GPU]}
    assert json.loads(patch["metadata"]["annotations"][ANNOTATION]) == {"labels": {}, "taint": GPU, "replaced": None}


def test_a_users_taint_in_our_slot_is_replaced_and_recorded():
    theirs = {**GPU, "value": "theirs"}
    patch = prepare_patch(node(taints=[DEDICATED, theirs]), {}, GPU)
    assert patch["spec"] == {"taints": [DEDICATED, GPU]}
    assert json.loads(patch["metadata"]["annotations"][ANNOTATION]) == {"labels": {}, "taint": GPU,
                                                                       "replaced": theirs}


def test_turning_the_taint_off_after_a_run_removes_ours_and_keeps_the_users():
    prepared = run(node({"team": "x"}, [DEDICATED]), {"gpu": "yes"}, GPU)
    patch = prepare_patch(prepared, {"gpu": "yes"}, None)
    assert patch == {"spec": {"taints": [DEDICATED]}, "metadata": {"annotations": {ANNOTATION: json.dumps(
        {"labels": {"gpu": {"prev": None, "set": "yes"}}, "replaced": None, "taint": None}, sort_keys=True,
        separators=(",", ":"))}}}
    assert prepare_patch(merge_patch(prepared, patch), {"gpu": "yes"}, None) is None


def test_turning_the_taint_off_gives_back_the_taint_ours_replaced():
    theirs = {**GPU, "value": "theirs"}
    prepared = run(node(taints=[theirs]), {}, GPU)
    patch = prepare_patch(prepared, {}, None)
    assert patch == {"spec": {"taints": [theirs]}, "metadata": {"annotations": {ANNOTATION: None}}}


def test_turning_everything_off_on_an_untouched_node_is_nothing():
    assert prepare_patch(node({"team": "x"}, [DEDICATED]), {}, None) is None


def test_a_label_the_config_no_longer_wants_leaves_the_record():
    prepared = run(node({"keep": "me"}), {"a": "1", "b": "2"}, None)
    assert set(record(prepared)["labels"]) == {"a", "b"}
    patch = prepare_patch(prepared, {"b": "2"}, None)
    assert patch["metadata"]["labels"] == {"a": None}
    assert json.loads(patch["metadata"]["annotations"][ANNOTATION]) == {
        "labels": {"b": {"set": "2", "prev": None}}, "taint": None, "replaced": None}


def test_a_label_a_user_changed_since_is_not_given_back_when_dropped():
    prepared = run(node(), {"a": "1"}, None)
    prepared["metadata"]["labels"]["a"] = "user"
    patch = prepare_patch(prepared, {}, None)
    assert patch == {"metadata": {"annotations": {ANNOTATION: None}}}


def test_a_label_already_at_the_new_value_updates_what_the_record_says_we_set():
    prepared = run(node({"team": "old"}), {"team": "ml"}, None)
    prepared["metadata"]["labels"]["team"] = "ai"  # the user moved it to what the config now wants
    patch = prepare_patch(prepared, {"team": "ai"}, None)
    assert "labels" not in patch["metadata"]
    assert json.loads(patch["metadata"]["annotations"][ANNOTATION])["labels"] == {"team": {"set": "ai", "prev": "old"}}
    restored = merge_patch(merge_patch(prepared, patch), undo_patch(merge_patch(prepared, patch)))
    assert restored["metadata"]["labels"] == {"team": "old"}


def test_a_changed_label_value_keeps_the_first_previous_value():
    first = run(node({"team": "old"}), {"team": "ml"}, None)
    second = run(first, {"team": "ai"}, None)
    assert record(second)["labels"] == {"team": {"set": "ai", "prev": "old"}}
    assert second["metadata"]["labels"] == {"team": "ai"}


@pytest.mark.parametrize("text", ["not json", "", "{}", "null", "[1]", '"a string"'])
def test_an_unreadable_or_empty_record_reads_as_nothing_recorded(text):
    assert read_record(node(annotations={ANNOTATION: text})) == {"labels": {}, "taint": None, "replaced": None}


def test_a_record_is_read_under_its_own_annotation():
    mine = json.dumps({"labels": {"a": {"set": "1", "prev": None}}, "taint": GPU, "replaced": DEDICATED})
    assert read_record(node(annotations={"other": mine}), "other") == {
        "labels": {"a": {"set": "1", "prev": None}}, "taint": GPU, "replaced": DEDICATED}
    assert read_record(node(annotations={"other": mine})) == {"labels": {}, "taint": None, "replaced": None}


def test_undo_takes_our_taint_out_and_puts_back_what_it_replaced():
    theirs = {**GPU, "value": "theirs"}
    prepared = run(node({"team": "x"}, [DEDICATED, theirs]), {"gpu": "yes"}, GPU)
    assert undo_patch(prepared) == {"metadata": {"annotations": {ANNOTATION: None}, "labels": {"gpu": None}},
                                    "spec": {"taints": [DEDICATED, theirs]}}


def test_undo_does_not_put_back_a_replaced_taint_when_its_slot_is_taken_again():
    theirs = {**GPU, "value": "theirs"}
    prepared = run(node(taints=[theirs]), {}, GPU)
    prepared["spec"]["taints"].append({**GPU, "effect": "NoSchedule", "value": "newer", "key": "nvidia.com/gpu"})
    patch = undo_patch(prepared)
    assert patch["spec"]["taints"] == [{**GPU, "value": "newer"}]


def test_undo_of_a_node_with_only_labels_leaves_the_taints_alone():
    prepared = run(node(taints=[DEDICATED]), {"gpu": "yes"}, None)
    assert undo_patch(prepared) == {"metadata": {"annotations": {ANNOTATION: None}, "labels": {"gpu": None}}}


@pytest.mark.parametrize("patch, text", [
    ({"metadata": {"labels": {"a": None}}}, "remove label a"),
    ({"spec": {"taints": None}}, "taints []"),
    ({"spec": {"taints": [{"key": "k", "effect": "NoExecute"}]}}, "taints [k:NoExecute]"),
    ({"metadata": {"annotations": {ANNOTATION: "{}"}}}, "update the gpu-bootstrap record"),
])
def test_describe_each_kind_of_change(patch, text):
    assert describe(patch) == text


@pytest.mark.parametrize("first, second, merged", [
    (None, {"metadata": {"labels": {"a": "1"}}}, {"metadata": {"labels": {"a": "1"}}}),
    ({}, {"spec": {"taints": None}}, {"spec": {"taints": None}}),
    ({"metadata": {"labels": {"a": "1"}, "annotations": {"x": "1"}}}, {"metadata": {"labels": {"a": "2", "b": "3"}}},
     {"metadata": {"labels": {"a": "2", "b": "3"}, "annotations": {"x": "1"}}}),
])
def test_two_node_patches_merge_into_one_where_the_second_wins(first, second, merged):
    assert deep_merge_patch(first, second) == merged
