"""Pods whose GPUs come through ResourceClaims (gpu_operator.allocation: dra): the claim policies' CEL, on a real CEL
runtime, evaluated as the API server evaluates a policy whose binding selects parameters (once per claim template or
claim in the pod's namespace, `params` being that object; not at all when there is none), with the MutatingAdmission
Policies first and the ValidatingAdmissionPolicies on the object as mutated.

A pod names its claims; only the template (or claim) says what they ask for. A pod naming a template for one of
NVIDIA's GPU DeviceClasses is steered (mode mutate) or rejected (mode enforce) like an `nvidia.com/gpu` pod, with the
same exemptions; a pod whose claims ask for another class is untouched. The real chain proves it on kube-apiserver
1.37 in tests/test_dra_live.py.
"""
from __future__ import annotations

import json

import pytest

from gpu_bootstrap.render import admission as render
from gpu_bootstrap.render import admission_policy as policy_render
from tests.kubeapi import cel
from tests.kubeapi.selectors import selector_object_matches
from tests.test_admission_policy import (KUBELET, SCHEDULER, changed, claim_pod, configured, mutated, namespace_labels,
                                         pod, review)

pytestmark = pytest.mark.unit
MAP_VERSION = "admissionregistration.k8s.io/v1"


@pytest.fixture(autouse=True)
def engine():
    from tests.tools import missing
    if not cel.available():
        missing("the CEL runtime (pip package cel-expr-python) is not installed")


def requests_of(*classes: str, first_available: bool = False) -> dict:
    if first_available:
        return {"requests": [{"name": "gpu", "firstAvailable": [
            {"name": f"option-{i}", "deviceClassName": c, "count": 1} for i, c in enumerate(classes)]}]}
    return {"requests": [{"name": f"r{i}", "exactly": {"deviceClassName": c, "count": 1}}
                         for i, c in enumerate(classes)]}


def template(name: str, *classes: str, namespace: str = "team-a", first_available: bool = False) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": requests_of(*classes, first_available=first_available)}}}


def claim(name: str, *classes: str, namespace: str = "team-a") -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name,
                                                                                      "namespace": namespace},
            "spec": {"devices": requests_of(*classes)}}


def names(*templates: str) -> list[dict]:
    return [{"name": f"c{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]


GPU, NIC = "gpu.nvidia.com", "nic.example.com"
# (id, review, the claim templates and claims in the cluster, verdict in mode mutate, in mode enforce)
TABLE = [
    ("a pod naming a GPU claim template", review(claim_pod()), [template("one-gpu", GPU)], "patch", "deny"),
    ("a pod naming a template of another class", review(claim_pod()), [template("one-gpu", NIC)], "allow", "allow"),
    ("a pod naming a template for a MIG slice", review(claim_pod()), [template("one-gpu", "mig.nvidia.com")],
     "patch", "deny"),
    ("a GPU among a template's firstAvailable alternatives", review(claim_pod()),
     [template("one-gpu", NIC, GPU, first_available=True)], "patch", "deny"),
    ("a template asking a NIC and a GPU", review(claim_pod()), [template("one-gpu", NIC, GPU)], "patch", "deny"),
    ("a GPU template the pod does not name", review(claim_pod(claims=names("nic"))),
     [template("one-gpu", GPU), template("nic", NIC)], "allow", "allow"),
    ("a pod naming a NIC and a GPU template", review(claim_pod(claims=names("nic", "one-gpu"))),
     [template("nic", NIC), template("one-gpu", GPU)], "patch", "deny"),
    ("a pod naming a template that does not exist", review(claim_pod()), [], "allow", "allow"),
    ("a GPU template of the same name in another namespace", review(claim_pod()),
     [template("one-gpu", GPU, namespace="team-b")], "allow", "allow"),
    ("a pod naming a GPU claim", review(claim_pod(template=False)), [claim("shared-gpu", GPU)], "patch", "deny"),
    ("a pod naming a claim of another class", review(claim_pod(template=False)), [claim("shared-gpu", NIC)],
     "allow", "allow"),
    ("a claim and a template of one name", review(claim_pod(template=False)),
     [template("shared-gpu", GPU), claim("shared-gpu", NIC)], "allow", "allow"),
    ("a GPU claim pod on our scheduler", review(claim_pod(scheduler=SCHEDULER)), [template("one-gpu", GPU)],
     "tolerate", "allow"),
    ("a GPU claim pod in an exempt namespace", review(claim_pod(), namespace="research"),
     [template("one-gpu", GPU, namespace="research")], "allow", "allow"),
    ("a GPU claim pod a kubelet creates for its node", review(claim_pod(node_name="gpu-1"), user=KUBELET),
     [template("one-gpu", GPU)], "allow", "allow"),
    ("a GPU claim pod a tenant binds to a node", review(claim_pod(node_name="gpu-1")), [template("one-gpu", GPU)],
     "bound", "bound"),
    ("a CPU pod beside a GPU template", review(pod({"limits": {"cpu": "1"}})), [template("one-gpu", GPU)],
     "allow", "allow"),
]


def evaluated(policies: list[dict], kind: str, namespace: str, cluster: list[dict]) -> list[tuple[dict, dict]]:
    """(policy, params) for each evaluation the API server makes: the binding selects every object of the policy's
    paramKind in the request's namespace (paramRef has no namespace of its own)."""
    found = []
    for policy in (p for p in policies if p["kind"] == kind):
        binding = next(b for b in policies if b["kind"] == kind + "Binding"
                       and b["spec"]["policyName"] == policy["metadata"]["name"])
        assert binding["spec"]["paramRef"] == {"selector": {}, "parameterNotFoundAction": "Allow"}
        param_kind = policy["spec"]["paramKind"]
        found += [(policy, params) for params in cluster if params["kind"] == param_kind["kind"]
                  and params["metadata"]["namespace"] == namespace]
    return found


def claim_verdict(mode: str, review_doc: dict, cluster: list[dict]) -> str:
    config, policy = configured(mode, {"_dra": True})
    policies = render.claim_policies(config, MAP_VERSION, policy)
    request = review_doc["request"]
    obj = before = request["object"]
    if not selector_object_matches(render._constraints(policy)["namespaceSelector"], namespace_labels(review_doc, {})):
        return "allow"
    for mutating, params in evaluated(policies, "MutatingAdmissionPolicy", request["namespace"], cluster):
        obj = mutated(mutating["spec"], obj, request=request, params=params)
    for validating, params in evaluated(policies, "ValidatingAdmissionPolicy", request["namespace"], cluster):
        variables = {"object": obj, "request": request, "params": params}
        if all(cel.truth(c["expression"], **variables) for c in validating["spec"]["matchConditions"]):
            for validation in validating["spec"]["validations"]:
                if not cel.truth(validation["expression"], **variables):
                    return "bound" if "spec.nodeName" in validation["message"] else "deny"
    return changed(before["spec"], obj["spec"])


@pytest.mark.parametrize("mode", ["mutate", "enforce"])
@pytest.mark.parametrize("name, review_doc, cluster, mutate, enforce", TABLE, ids=[row[0] for row in TABLE])
def test_the_claim_policies_steer_exactly_the_pods_whose_claims_ask_for_gpus(mode, name, review_doc, cluster,
                                                                              mutate, enforce):
    assert claim_verdict(mode, json.loads(json.dumps(review_doc)), cluster) == (mutate if mode == "mutate"
                                                                                  else enforce)


def test_the_claim_policies_are_one_pair_per_param_kind_with_the_exemptions_of_the_others():
    config, policy = configured("mutate", {"_dra": True})
    objects = render.claim_policies(config, MAP_VERSION, policy)
    kinds = [(o["kind"], o["metadata"]["name"], (o["spec"].get("paramKind") or {}).get("kind")) for o in objects]
    assert kinds == [
        ("MutatingAdmissionPolicy", "gpu-bootstrap-gpu-pods-claim-templates", "ResourceClaimTemplate"),
        ("MutatingAdmissionPolicyBinding", "gpu-bootstrap-gpu-pods-claim-templates", None),
        ("ValidatingAdmissionPolicy", "gpu-bootstrap-gpu-pods-claim-templates", "ResourceClaimTemplate"),
        ("ValidatingAdmissionPolicyBinding", "gpu-bootstrap-gpu-pods-claim-templates", None),
        ("MutatingAdmissionPolicy", "gpu-bootstrap-gpu-pods-claims", "ResourceClaim"),
        ("MutatingAdmissionPolicyBinding", "gpu-bootstrap-gpu-pods-claims", None),
        ("ValidatingAdmissionPolicy", "gpu-bootstrap-gpu-pods-claims", "ResourceClaim"),
        ("ValidatingAdmissionPolicyBinding", "gpu-bootstrap-gpu-pods-claims", None)]
    main = render.validating_policy(config, policy)[0]["spec"]["matchConditions"]
    for validating in (o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"):
        conditions = validating["spec"]["matchConditions"]
        assert conditions[0]["name"] == "names-a-gpu-claim" and conditions[1:] == main[1:]  # the same exemptions
    enforcing, enforce_policy = configured("enforce", {"_dra": True})
    enforce = render.claim_policies(enforcing, MAP_VERSION, enforce_policy)
    assert {o["kind"] for o in enforce} == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    assert {o["kind"] for o in render.claim_policies(config, None, policy)} == {
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}  # no MutatingAdmissionPolicy served
    assert all(o["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-bootstrap" for o in objects)


def test_a_policy_served_in_two_versions_is_one_object_of_ours_not_a_leftover():
    """On a cluster serving MutatingAdmissionPolicy as v1 and v1beta1 (1.36+ with the beta switched on), listing our
    policies at both versions finds the policy `up` applied as v1 twice; it is one object, kept, not a v1beta1
    leftover to delete. The lists are faked: no cluster here serves both versions."""
    from gpu_bootstrap.steps.admission_state import MAP_VERSIONS, owned_refs
    from gpu_bootstrap.core.refs import Ref

    class BothVersions:
        def list(self, api_version, kind, namespace=None, label_selector=""):
            return [{"metadata": {"name": "gpu-bootstrap-gpu-pods-claims"}}] if kind == "MutatingAdmissionPolicy" \
                else []

    kinds = [(v, "MutatingAdmissionPolicy") for v in MAP_VERSIONS]
    applied = Ref("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy", "gpu-bootstrap-gpu-pods-claims")
    assert owned_refs(BothVersions(), kinds, None, {applied}) == []
    assert len(owned_refs(BothVersions(), kinds, None, set())) == 1  # no longer wanted: removed once
