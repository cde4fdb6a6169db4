"""The admission verdict on a table of AdmissionReview fixtures, in both modes: with a real Rego engine on the
rendered OPA policy (behind the rendered webhook's namespaceSelector), and with a real CEL runtime on the rendered
matchConditions and ValidatingAdmissionPolicy — which must agree on every row.

Verdicts: "patch" (mutated to our scheduler), "deny" (rejected with the message), "allow" (untouched).
"""
from __future__ import annotations

import base64
import json

import pytest

from gpu_bootstrap import config as cfg
from gpu_bootstrap.render import admission as render
from gpu_bootstrap.render import admission_policy as policy_render
from tests.kubeapi import cel, rego
from tests.kubeapi.selectors import selector_object_matches
from tests.tools import missing

pytestmark = pytest.mark.unit  # host-free: the fast loop (pytest -m unit)

SCHEDULER = "gpu-binpack-scheduler"


@pytest.fixture(autouse=True)
def engines():
    if not rego.available():
        missing("the Rego engine (pip package gordon-to-regorus) is not installed")
    if not cel.available():
        missing("the CEL runtime (pip package cel-expr-python) is not installed")


def conf(**admission) -> cfg.Config:
    return cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}],
                                      "admission": {"exclude_namespaces": ["research"], **admission}})


# --- known answer: the trap in regopy 1.5.2 ------------------------------------------------------------------------
def test_the_rego_engine_encodes_a_marshalled_object_as_opa_does():
    policy = rego.Policy({"k.rego": 'package k\n\nx := base64.encode(json.marshal({"k": "v"}))\n'
                                    'patch := base64.encode(json.marshal([{"op": "add", "path": "/a", "value": "b"}]))\n'})
    assert policy.decide("data.k.x", {}) == "eyJrIjoidiJ9"  # OPA's answer: base64 of {"k":"v"}
    assert json.loads(base64.b64decode(policy.decide("data.k.patch", {}))) == [{"op": "add", "path": "/a",
                                                                                  "value": "b"}]


# --- fixtures -------------------------------------------------------------------------------------------------------
def pod(resources=None, init_resources=None, scheduler="default-scheduler", node_name=None, owner=None,
        annotations=None) -> dict:
    meta = {"name": "p", "namespace": "team-a"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1" if owner != "Node" else "v1", "kind": owner, "name": "o",
                                    "uid": "1", "controller": True}]
    if annotations:
        meta["annotations"] = annotations
    spec = {"containers": [{"name": "main", "image": "cuda", **({"resources": resources} if resources else {})}]}
    if init_resources:
        spec["initContainers"] = [{"name": "init", "image": "cuda", "resources": init_resources}]
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


GPU = {"limits": {"nvidia.com/gpu": 1}}


def review(obj: dict, namespace: str = "team-a", operation: str = "CREATE") -> dict:
    obj = json.loads(json.dumps(obj))
    obj["metadata"]["namespace"] = namespace
    request = {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "resource": {"group": "", "version": "v1", "resource": "pods"}, "name": "p", "namespace": namespace,
               "operation": operation, "userInfo": {"username": "alice"}, "object": obj, "dryRun": False,
               "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}
    if operation == "UPDATE":
        request["oldObject"] = obj
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


# (id, review, namespace labels, verdict in mutate mode, verdict in enforce mode, admission settings)
TABLE = [
    ("gpu pod in a user namespace", review(pod(GPU)), {}, "patch", "deny", {}),
    ("gpu pod naming no scheduler", review(pod(GPU, scheduler=None)), {}, "patch", "deny", {}),
    ("gpu in an init container only", review(pod(init_resources={"limits": {"nvidia.com/gpu": 1}})), {},
     "patch", "deny", {}),
    ("MIG resource in requests", review(pod({"requests": {"nvidia.com/mig-1g.10gb": 1}})), {}, "patch", "deny", {}),
    ("time-sliced shared resource", review(pod({"limits": {"nvidia.com/gpu.shared": 1}})), {}, "patch", "deny", {}),
    ("cpu pod", review(pod({"limits": {"cpu": "1", "memory": "1Gi"}})), {}, "allow", "allow", {}),
    ("other vendor's extended resource", review(pod({"limits": {"example.com/fpga": 1}})), {}, "allow", "allow", {}),
    ("nodeName already set", review(pod(GPU, node_name="gpu-1")), {}, "allow", "allow", {}),
    ("DaemonSet-owned", review(pod(GPU, owner="DaemonSet")), {}, "allow", "allow", {}),
    ("mirror pod", review(pod(GPU, owner="Node", annotations={"kubernetes.io/config.mirror": "abc"})), {},
     "allow", "allow", {}),
    ("mirror annotation alone", review(pod(GPU, annotations={"kubernetes.io/config.mirror": "abc"})), {},
     "allow", "allow", {}),
    ("kube-system", review(pod(GPU), "kube-system"), {}, "allow", "allow", {}),
    ("the gpu-operator namespace", review(pod(GPU), "gpu-operator"), {}, "allow", "allow", {}),
    ("OPA's own namespace", review(pod(GPU), "gpu-bootstrap-admission"), {}, "allow", "allow", {}),
    ("the scheduler's namespace (moved)", review(pod(GPU), "sched"), {}, "allow", "allow", {"_scheduler_ns": "sched"}),
    ("exclude_namespaces", review(pod(GPU), "research"), {}, "allow", "allow", {}),
    ("namespace labelled to ignore", review(pod(GPU)), {"gpu-bootstrap.io/admission": "ignore"}, "allow", "allow",
     {}),
    ("already on our scheduler", review(pod(GPU, scheduler=SCHEDULER)), {}, "allow", "allow", {}),
    ("on another scheduler", review(pod(GPU, scheduler="volcano")), {}, "allow", "allow", {}),
    ("on another scheduler, overridden", review(pod(GPU, scheduler="volcano")), {}, "patch", "deny",
     {"override_other_schedulers": True}),
    ("ours, with override", review(pod(GPU, scheduler=SCHEDULER)), {}, "allow", "allow",
     {"override_other_schedulers": True}),
    ("UPDATE operation", review(pod(GPU), operation="UPDATE"), {}, "allow", "allow", {}),
]
IDS = [row[0] for row in TABLE]


def configured(mode: str, settings: dict) -> cfg.Config:
    settings = dict(settings)
    scheduler_ns = settings.pop("_scheduler_ns", None)
    config = conf(mode=mode, **settings)
    if scheduler_ns:
        config = cfg.Config.model_validate({**config.model_dump(by_alias=True),
                                            "scheduler": {"namespace": scheduler_ns}})
    return config


def namespace_labels(review_doc: dict, extra: dict) -> dict:
    return {"kubernetes.io/metadata.name": review_doc["request"]["namespace"], **extra}


def rego_verdict(config: cfg.Config, review_doc: dict, labels: dict) -> str:
    """What the API server gets back through the webhook: not called outside its namespaceSelector, else OPA's."""
    hook = render.webhook_configuration(config, "1.29.0", "")["webhooks"][0]  # no matchConditions: OPA decides alone
    if not selector_object_matches(hook["namespaceSelector"], namespace_labels(review_doc, labels)):
        return "allow"
    policy = rego.Policy({"gpu-pods.rego": policy_render.rego(policy_render.of(config))})
    answer = policy.decide("data.system.main", review_doc)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == review_doc["request"]["uid"]
    if not response["allowed"]:
        assert response["status"]["code"] == 403
        assert f"set spec.schedulerName: {SCHEDULER}" in response["status"]["message"]
        return "deny"
    if "patch" in response:
        assert response["patchType"] == "JSONPatch"
        assert json.loads(base64.b64decode(response["patch"])) == [
            {"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER}]
        return "patch"
    return "allow"


def cel_verdict(config: cfg.Config, review_doc: dict, labels: dict, kube: str = "1.31.0") -> str:
    """The same decision from the CEL the API server evaluates: for mutate, the webhook's (or the mutating
    policy's) rules, namespaceSelector and matchConditions; for enforce, the ValidatingAdmissionPolicy's."""
    request = review_doc["request"]
    variables = {"object": request["object"], "oldObject": request.get("oldObject"), "request": request}
    if config.admission.mode == "mutate":
        hook = render.webhook_configuration(config, kube, "")["webhooks"][0]
        rule = hook["rules"][0]
        if request["operation"] not in rule["operations"] or \
                not selector_object_matches(hook["namespaceSelector"], namespace_labels(review_doc, labels)):
            return "allow"
        return "patch" if all(cel.truth(c["expression"], **variables) for c in hook["matchConditions"]) else "allow"
    vap = render.validating_policy(config)[0]["spec"]
    constraints = vap["matchConstraints"]
    if request["operation"] not in constraints["resourceRules"][0]["operations"] or \
            not selector_object_matches(constraints["namespaceSelector"], namespace_labels(review_doc, labels)):
        return "allow"
    if not all(cel.truth(c["expression"], **variables) for c in vap["matchConditions"]):
        return "allow"
    return "allow" if all(cel.truth(v["expression"], **variables) for v in vap["validations"]) else "deny"


@pytest.mark.parametrize("mode", ["mutate", "enforce"])
@pytest.mark.parametrize("name, review_doc, labels, mutate, enforce, settings", TABLE, ids=IDS)
def test_rego_and_cel_give_the_expected_verdict(mode, name, review_doc, labels, mutate, enforce, settings):
    config = configured(mode, settings)
    expected = mutate if mode == "mutate" else enforce
    assert rego_verdict(config, review_doc, labels) == expected
    assert cel_verdict(config, review_doc, labels) == expected


def test_match_conditions_let_only_the_steered_pods_reach_opa():
    """With matchConditions (>= 1.30) OPA is called exactly for the rows it would change: non-GPU and exempt pods
    never reach it, so a broken OPA cannot even slow them down."""
    config = configured("mutate", {})
    hook = render.webhook_configuration(config, "1.31.0", "")["webhooks"][0]
    for name, review_doc, labels, mutate, _enforce, settings in TABLE:
        if settings:
            continue
        request = review_doc["request"]
        called = all(cel.truth(c["expression"], object=request["object"], request=request)
                     for c in hook["matchConditions"])
        assert called == (mutate == "patch" or (request["operation"] == "UPDATE") or bool(labels)), name


def test_the_mutating_admission_policy_sets_the_field_the_webhook_patches():
    config = configured("mutate", {})
    [policy, binding] = render.mutating_policy(config, "admissionregistration.k8s.io/v1")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    expression = policy["spec"]["mutations"][0]["applyConfiguration"]["expression"]
    assert cel.evaluate(expression) == {"spec": {"schedulerName": SCHEDULER}}
    assert policy["spec"]["matchConditions"] == render.webhook_configuration(config, "1.31.0", "")["webhooks"][0][
        "matchConditions"]
