"""The gpu-operator plan's branches the step tables left open: a missing namespace is created labelled as ours, and
each node-label patch says why (the operator's labels, or the record of the labels a node had before)."""
from __future__ import annotations

import dataclasses

import pytest

from gpu_bootstrap.core.refs import Ref, Verb
from gpu_bootstrap.security import pod_security
from gpu_bootstrap.steps.gpu_operator import GpuOperator
from tests.test_step_plans import check_of, config, context, operator_facts

pytestmark = pytest.mark.unit

UP_TO_DATE = {"up_to_date": True, "reason": "", "installed": "v26.7.0"}


def test_a_missing_namespace_is_created_labelled_as_ours():
    conf = config()
    facts = dataclasses.replace(operator_facts(conf, UP_TO_DATE), namespace="missing", namespace_plan=pod_security.decide(
        "gpu-operator", None, pod_security.PRIVILEGED, "the operator's pods use the host"))
    assert [(c.verb, c.target, c.summary, c.body) for c in GpuOperator().plan(context(conf), check_of(facts))] == [
        (Verb.APPLY, Ref("v1", "Namespace", "gpu-operator"), "create",
         {"apiVersion": "v1", "kind": "Namespace", "metadata": {
             "name": "gpu-operator", "labels": {"app.kubernetes.io/managed-by": "gpu-bootstrap",
                                                "pod-security.kubernetes.io/enforce": "privileged"}}})]
    assert GpuOperator().plan(context(conf), check_of(operator_facts(conf, UP_TO_DATE))) == []


def test_each_label_patch_says_why():
    conf = config()
    labels = {"node5": {"metadata": {"labels": {"nvidia.com/gpu.deploy.driver": "false"}}},
              "node6": {"metadata": {"annotations": {"gpu-bootstrap.io/labels-before-gpu-operator": "[]"}}}}
    facts = operator_facts(conf, UP_TO_DATE, labels)
    changes = GpuOperator().plan(context(conf), check_of(facts))
    assert [(c.target, c.reason) for c in changes] == [
        (Ref.node("node5"), "the operator reads these node labels"),
        (Ref.node("node6"), "remember which operator labels the node has before the first install (teardown keeps "
                            "those)")]
