"""The admission verdict on a table of AdmissionReview fixtures, in both modes: with a real Rego engine on the
rendered OPA policy (behind the rendered webhook's namespaceSelector), and with a real CEL runtime on the rendered
matchConditions and ValidatingAdmissionPolicy — which must agree on every row.

Verdicts: "patch" (steered to our scheduler and given the GPU taint's toleration), "steer" (steered; it tolerates the
taint already), "tolerate" (given the toleration only: already on our scheduler, or steering is off because the
scheduler does not run), "deny" (rejected with the message), "bound" (rejected for naming a node), "allow".
"""
from __future__ import annotations

import base64
import json

import pytest

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.render import admission as render
from gpu_bootstrap.render import admission_policy as policy_render
from tests.kubeapi import cel, rego
from tests.kubeapi.patches import json_patch
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
                                      "admission": {"exempt_namespaces": ["research"], **admission}})


# --- known answer: the trap in regopy 1.5.2 ------------------------------------------------------------------------
def test_the_rego_engine_encodes_a_marshalled_object_as_opa_does():
    policy = rego.Policy({"k.rego": 'package k\n\nx := base64.encode(json.marshal({"k": "v"}))\n'
                                    'patch := base64.encode(json.marshal([{"op": "add", "path": "/a", "value": "b"}]))\n'})
    assert policy.decide("data.k.x", {}) == "eyJrIjoidiJ9"  # OPA's answer: base64 of {"k":"v"}
    assert json.loads(base64.b64decode(policy.decide("data.k.patch", {}))) == [{"op": "add", "path": "/a",
                                                                                  "value": "b"}]


# --- fixtures -------------------------------------------------------------------------------------------------------
def pod(resources=None, init_resources=None, scheduler="default-scheduler", node_name=None, owner=None,
        annotations=None, tolerations=None) -> dict:
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
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


GPU = {"limits": {"nvidia.com/gpu": 1}}


def claim_pod(template: bool = True, claims=None, **fields) -> dict:
    """A pod that gets its GPU through a ResourceClaim, as NVIDIA's DRA docs write one (no GPU resource request)."""
    obj = pod(**fields)
    source = {"resourceClaimTemplateName": "one-gpu"} if template else {"resourceClaimName": "shared-gpu"}
    obj["spec"]["resourceClaims"] = [{"name": "gpu", **source}] if claims is None else claims
    obj["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]} if claims is None else {}
    return obj


TENANT = {"username": "alice", "groups": ["team-a", "system:authenticated"]}
KUBELET = {"username": "system:node:gpu-1", "groups": ["system:nodes", "system:authenticated"]}
DS_CONTROLLER = {"username": "system:serviceaccount:kube-system:daemon-set-controller",
                 "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]}
CONTROLLER_MANAGER = {"username": "system:kube-controller-manager", "groups": ["system:authenticated"]}
VALIDATOR = {"username": "system:serviceaccount:gpu-operator:nvidia-operator-validator",
             "groups": ["system:serviceaccounts", "system:serviceaccounts:gpu-operator", "system:authenticated"]}


def review(obj: dict, namespace: str = "team-a", operation: str = "CREATE", user: dict | None = None) -> dict:
    obj = json.loads(json.dumps(obj))
    obj["metadata"]["namespace"] = namespace
    request = {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "resource": {"group": "", "version": "v1", "resource": "pods"}, "name": "p", "namespace": namespace,
               "operation": operation, "userInfo": user or TENANT, "object": obj, "dryRun": False,
               "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}
    if operation == "UPDATE":
        request["oldObject"] = obj
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


MIRROR = {"kubernetes.io/config.mirror": "abc"}
# (id, review, namespace labels, verdict in mutate mode, verdict in enforce mode, admission settings)
# "bound": rejected for naming a node, in both modes (a bound pod never meets the scheduler).
TABLE = [
    ("gpu pod in a user namespace", review(pod(GPU)), {}, "patch", "deny", {}),
    ("gpu pod naming no scheduler", review(pod(GPU, scheduler=None)), {}, "patch", "deny", {}),
    ("gpu in an init container only", review(pod(init_resources={"limits": {"nvidia.com/gpu": 1}})), {},
     "patch", "deny", {}),
    ("MIG resource in requests", review(pod({"requests": {"nvidia.com/mig-1g.10gb": 1}})), {}, "patch", "deny", {}),
    ("time-sliced shared resource", review(pod({"limits": {"nvidia.com/gpu.shared": 1}})), {}, "patch", "deny", {}),
    ("cpu pod", review(pod({"limits": {"cpu": "1", "memory": "1Gi"}})), {}, "allow", "allow", {}),
    ("cpu pod naming a node", review(pod({"limits": {"cpu": "1"}}, node_name="gpu-1")), {}, "allow", "allow", {}),
    ("other vendor's extended resource", review(pod({"limits": {"example.com/fpga": 1}})), {}, "allow", "allow", {}),
    # who may claim an exemption: the system, by the requester the API server authenticated
    ("nodeName set by a tenant", review(pod(GPU, node_name="gpu-1")), {}, "bound", "bound", {}),
    ("nodeName set by a tenant, on our scheduler", review(pod(GPU, node_name="gpu-1", scheduler=SCHEDULER)), {},
     "bound", "bound", {}),
    ("nodeName set by a tenant in group system:nodes", review(pod(GPU, node_name="gpu-1"), user={
        "username": "alice", "groups": ["system:nodes"]}), {}, "bound", "bound", {}),
    ("nodeName set by its kubelet", review(pod(GPU, node_name="gpu-1"), user=KUBELET), {}, "allow", "allow", {}),
    # a kubelet is a user named system:node:<name> in group system:nodes (the Node authorizer requires both)
    ("nodeName set by a system:node: user without the group", review(pod(GPU, node_name="gpu-1"), user={
        "username": "system:node:x", "groups": ["system:authenticated"]}), {}, "bound", "bound", {}),
    ("nodeName set by a system:node: user with no groups", review(pod(GPU, node_name="gpu-1"), user={
        "username": "system:node:x"}), {}, "bound", "bound", {}),
    ("mirror annotation, by a system:node: user without the group", review(pod(GPU, annotations=MIRROR), user={
        "username": "system:node:x", "groups": ["team-a"]}), {}, "patch", "deny", {}),
    # a DaemonSet's pods are exempt only in the system's and the gpu-operator's namespaces: whoever may create a
    # DaemonSet in a tenant namespace would otherwise exempt any GPU pod
    ("DaemonSet-owned, by the DaemonSet controller", review(pod(GPU, owner="DaemonSet"), user=DS_CONTROLLER), {},
     "patch", "deny", {}),
    ("DaemonSet-owned naming a node, by the DaemonSet controller",
     review(pod(GPU, owner="DaemonSet", node_name="gpu-1"), user=DS_CONTROLLER), {}, "bound", "bound", {}),
    ("DaemonSet-owned, by the controller manager", review(pod(GPU, owner="DaemonSet"), user=CONTROLLER_MANAGER), {},
     "patch", "deny", {}),
    ("operator DaemonSet, by the DaemonSet controller",
     review(pod(GPU, owner="DaemonSet", node_name="gpu-1"), "gpu-operator", user=DS_CONTROLLER), {},
     "allow", "allow", {}),
    ("operator DaemonSet, by the controller manager",
     review(pod(GPU, owner="DaemonSet"), "gpu-operator", user=CONTROLLER_MANAGER), {}, "allow", "allow", {}),
    ("operator DaemonSet, by a tenant", review(pod(GPU, owner="DaemonSet"), "gpu-operator"), {}, "patch", "deny", {}),
    ("DaemonSet-owned, by a tenant", review(pod(GPU, owner="DaemonSet")), {}, "patch", "deny", {}),
    ("DaemonSet-owned, by a kubelet", review(pod(GPU, owner="DaemonSet"), user=KUBELET), {}, "patch", "deny", {}),
    ("mirror pod, by its kubelet", review(pod(GPU, owner="Node", annotations=MIRROR), user=KUBELET), {},
     "allow", "allow", {}),
    ("mirror annotation, by a kubelet", review(pod(GPU, annotations=MIRROR), user=KUBELET), {}, "allow", "allow", {}),
    ("mirror annotation, by a tenant", review(pod(GPU, annotations=MIRROR)), {}, "patch", "deny", {}),
    ("Node-owned, by a tenant", review(pod(GPU, owner="Node")), {}, "patch", "deny", {}),
    ("validator pod, by the validator", review(pod(GPU, node_name="gpu-1"), "gpu-operator", user=VALIDATOR), {},
     "allow", "allow", {}),
    ("validator's account, in a tenant namespace", review(pod(GPU), user=VALIDATOR), {}, "patch", "deny", {}),
    ("a look-alike account in the operator namespace", review(pod(GPU, node_name="gpu-1"), "gpu-operator", user={
        "username": "system:serviceaccount:team-a:nvidia-operator-validator"}), {}, "bound", "bound", {}),
    ("tenant gpu pod in the gpu-operator namespace", review(pod(GPU), "gpu-operator"), {}, "patch", "deny", {}),
    # namespaces: by name only
    ("kube-system", review(pod(GPU, node_name="gpu-1"), "kube-system"), {}, "allow", "allow", {}),
    ("OPA's own namespace", review(pod(GPU), "gpu-bootstrap-admission"), {}, "allow", "allow", {}),
    ("the scheduler's namespace (moved)", review(pod(GPU), "sched"), {}, "allow", "allow", {"_scheduler_ns": "sched"}),
    ("exempt_namespaces", review(pod(GPU), "research"), {}, "allow", "allow", {}),
    ("exclude_namespaces (the old name)", review(pod(GPU), "lab"), {}, "allow", "allow",
     {"exclude_namespaces": ["lab"], "_drop_exempt": True}),
    ("namespace labelled to ignore (no longer an opt-out)", review(pod(GPU)), {"gpu-bootstrap.io/admission": "ignore"},
     "patch", "deny", {}),
    ("already on our scheduler", review(pod(GPU, scheduler=SCHEDULER)), {}, "tolerate", "allow", {}),
    ("on another scheduler", review(pod(GPU, scheduler="volcano")), {}, "allow", "allow", {}),
    ("on another scheduler, overridden", review(pod(GPU, scheduler="volcano")), {}, "patch", "deny",
     {"override_other_schedulers": True}),
    ("ours, with override", review(pod(GPU, scheduler=SCHEDULER)), {}, "tolerate", "allow",
     {"override_other_schedulers": True}),
    ("UPDATE operation", review(pod(GPU), operation="UPDATE"), {}, "allow", "allow", {}),
    # the GPU taint's toleration: added (mode mutate) unless the pod tolerates the taint already; never a reason to
    # reject
    ("tolerates the taint's key (Exists)", review(pod(GPU, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])),
     {}, "steer", "deny", {}),
    ("tolerates every taint", review(pod(GPU, tolerations=[{"operator": "Exists"}])), {}, "steer", "deny", {}),
    ("tolerates the taint's key, value and effect", review(pod(GPU, tolerations=[
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}])), {},
     "steer", "deny", {}),
    ("tolerates another value", review(pod(GPU, tolerations=[{"key": "nvidia.com/gpu", "value": "other"}])), {},
     "patch", "deny", {}),
    ("tolerates another effect", review(pod(GPU, tolerations=[
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}])), {}, "patch", "deny", {}),
    ("tolerates another key", review(pod(GPU, tolerations=[{"key": "dedicated", "operator": "Exists"}])), {},
     "patch", "deny", {}),
    ("cpu pod without the toleration", review(pod({"limits": {"cpu": "1"}})), {}, "allow", "allow", {}),
    # the scheduler does not run (not deployed, not ready, gone): GPU pods keep their scheduler
    ("steering off: a gpu pod", review(pod(GPU)), {}, "tolerate", "allow", {"_steer": False}),
    ("steering off: a gpu pod that tolerates", review(pod(GPU, tolerations=[{"operator": "Exists"}])), {},
     "allow", "allow", {"_steer": False}),
    ("steering off: a gpu pod naming a node", review(pod(GPU, node_name="gpu-1")), {}, "bound", "bound",
     {"_steer": False}),
    # node-prep off: no taint, no toleration
    ("no taint: a gpu pod", review(pod(GPU)), {}, "steer", "deny", {"_no_taint": True}),
    ("no taint: on our scheduler", review(pod(GPU, scheduler=SCHEDULER)), {}, "allow", "allow", {"_no_taint": True}),
    # GPUs through DRA (gpu_operator.allocation: dra): whether a claim is a GPU one is in its template, which neither
    # OPA nor these policies see; the claim policies decide (tests/test_admission_claims.py)
    ("dra: a pod with a claim template is left to the claim policies", review(claim_pod()), {}, "allow", "allow",
     {"_dra": True}),
    ("dra: a pod with a named claim is left to the claim policies", review(claim_pod(template=False)), {}, "allow",
     "allow", {"_dra": True}),
    ("dra: nvidia.com/gpu served by DRA is still a request", review(pod(GPU)), {}, "patch", "deny", {"_dra": True}),
    ("device plugin: a claim pod is not a gpu pod", review(claim_pod()), {}, "allow", "allow", {}),
]
IDS = [row[0] for row in TABLE]


def configured(mode: str, settings: dict) -> tuple[cfg.Config, policy_render.Policy]:
    settings = dict(settings)
    scheduler_ns = settings.pop("_scheduler_ns", None)
    steer = settings.pop("_steer", True)
    dra = settings.pop("_dra", False)
    taint = None if settings.pop("_no_taint", False) else policy_render.CONFIG_TAINT
    if settings.pop("_drop_exempt", False):
        config = cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}], "admission": {"mode": mode, **settings}})
    else:
        config = conf(mode=mode, **settings)
    if scheduler_ns:
        config = cfg.Config.model_validate({**config.model_dump(by_alias=True),
                                            "scheduler": {"namespace": scheduler_ns}})
    if dra:
        dumped = config.model_dump(by_alias=True)
        config = cfg.Config.model_validate({**dumped, "gpu_operator": {**dumped["gpu_operator"], "allocation": "dra"}})
    return config, policy_render.of(config, steer, taint)


def namespace_labels(review_doc: dict, extra: dict) -> dict:
    return {"kubernetes.io/metadata.name": review_doc["request"]["namespace"], **extra}


TOLERATION = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}


def changed(before: dict, after: dict) -> str:
    """The verdict of a mutation: what it changed of the pod."""
    steered = after.get("schedulerName") == SCHEDULER != before.get("schedulerName")
    tolerations = after.get("tolerations") or []
    tolerated = tolerations != (before.get("tolerations") or [])
    if tolerated:  # appended, the pod's own tolerations kept
        assert tolerations == [*(before.get("tolerations") or []), TOLERATION], tolerations
    return {(True, True): "patch", (True, False): "steer", (False, True): "tolerate"}.get((steered, tolerated),
                                                                                         "allow")


def rego_verdict(config: cfg.Config, policy, review_doc: dict, labels: dict) -> str:
    """What the API server gets back through the webhook: not called outside its namespaceSelector, else OPA's."""
    hook = render.webhook_configuration(config, "1.29.0", "", policy)["webhooks"][0]  # no matchConditions
    if not selector_object_matches(hook["namespaceSelector"], namespace_labels(review_doc, labels)):
        return "allow"
    modules = {"gpu-pods.rego": policy_render.rego(policy)}
    answer = rego.Policy(modules).decide("data.system.main", review_doc)
    if rego.opa_available():  # OPA's own engine must agree, field for field
        assert rego.OpaPolicy(modules).decide("data.system.main", review_doc) == answer
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == review_doc["request"]["uid"]
    if not response["allowed"]:
        assert response["status"]["code"] == 403
        if "spec.nodeName" in response["status"]["message"]:
            return "bound"
        assert f"set spec.schedulerName: {SCHEDULER}" in response["status"]["message"]
        return "deny"
    if "patch" in response:
        assert response["patchType"] == "JSONPatch"
        obj = review_doc["request"]["object"]
        after = json_patch(obj, json.loads(base64.b64decode(response["patch"])))
        return changed(obj["spec"], after["spec"])
    return "allow"


def mutated(spec: dict, obj: dict, **variables) -> dict:
    """The object after a MutatingAdmissionPolicy (its spec): its mutations, in order, when every matchCondition
    holds; an apply configuration merged into the pod's spec, a JSONPatch applied."""
    if not all(cel.truth(c["expression"], object=obj, **variables) for c in spec["matchConditions"]):
        return obj
    for mutation in spec["mutations"]:
        if mutation["patchType"] == "ApplyConfiguration":
            applied = cel.evaluate(mutation["applyConfiguration"]["expression"], object=obj, **variables)
            obj = {**obj, "spec": {**obj["spec"], **applied["spec"]}}
        else:
            patch = cel.evaluate(mutation["jsonPatch"]["expression"], object=obj, **variables)
            obj = json_patch(obj, [dict(op) for op in patch])
    return obj


def cel_verdict(config: cfg.Config, policy, review_doc: dict, labels: dict) -> str:
    """The same decision from the CEL the API server evaluates (>= 1.30): in mode mutate the mutating policy's
    matchConditions and mutations (what engine vap runs; the webhook's own conditions are checked against OPA in
    test_match_conditions_send_opa_exactly_what_it_acts_on), then the ValidatingAdmissionPolicy backstop on the
    object as mutated, in both modes."""
    request = review_doc["request"]
    obj = before = request["object"]
    vap = render.validating_policy(config, policy)[0]["spec"]
    constraints = vap["matchConstraints"]
    if request["operation"] not in constraints["resourceRules"][0]["operations"] or \
            not selector_object_matches(constraints["namespaceSelector"], namespace_labels(review_doc, labels)):
        return "allow"
    if config.admission.mode == "mutate":
        obj = mutated(render.mutating_policy(config, "admissionregistration.k8s.io/v1", policy)[0]["spec"], obj,
                      request=request)
    variables = {"object": obj, "oldObject": request.get("oldObject"), "request": request}
    if all(cel.truth(c["expression"], **variables) for c in vap["matchConditions"]):
        for validation in vap["validations"]:
            if not cel.truth(validation["expression"], **variables):
                return "bound" if "spec.nodeName" in validation["message"] else "deny"
    return changed(before["spec"], obj["spec"])


@pytest.mark.parametrize("mode", ["mutate", "enforce"])
@pytest.mark.parametrize("name, review_doc, labels, mutate, enforce, settings", TABLE, ids=IDS)
def test_rego_and_cel_give_the_expected_verdict(mode, name, review_doc, labels, mutate, enforce, settings):
    config, policy = configured(mode, settings)
    expected = mutate if mode == "mutate" else enforce
    assert rego_verdict(config, policy, review_doc, labels) == expected
    assert cel_verdict(config, policy, review_doc, labels) == expected


@pytest.mark.parametrize("mode", ["mutate", "enforce"])
def test_match_conditions_send_opa_exactly_what_it_acts_on(mode):
    """With matchConditions (>= 1.30) OPA is called exactly for the CREATEs it changes or rejects: CPU and exempt
    pods never reach it, so a broken OPA cannot even slow them down."""
    for name, review_doc, labels, mutate, enforce, settings in TABLE:
        config, policy = configured(mode, settings)
        hook = render.webhook_configuration(config, "1.31.0", "", policy)["webhooks"][0]
        request = review_doc["request"]
        if request["operation"] != "CREATE" or \
                not selector_object_matches(hook["namespaceSelector"], namespace_labels(review_doc, labels)):
            continue
        called = all(cel.truth(c["expression"], object=request["object"], request=request)
                     for c in hook["matchConditions"])
        assert called == opa_acts(policy, review_doc), name
        if not config.admission.device_access or mode == "enforce":
            assert called == ((mutate if mode == "mutate" else enforce) != "allow"), name


def opa_acts(policy, review_doc: dict) -> bool:
    """OPA changes the pod (a patch: steering, the toleration, or NVIDIA_VISIBLE_DEVICES=void on a container given no
    GPU, render/device_access.py) or rejects it."""
    response = rego.Policy({"gpu-pods.rego": policy_render.rego(policy)}).decide("data.system.main",
                                                                              review_doc)["response"]
    return not response["allowed"] or "patch" in response


def test_exemptions_need_the_requester_the_api_server_authenticated():
    """A request with no userInfo (or an empty one) claims nothing: the CEL guards evaluate, and deny the claim."""
    config, policy = configured("enforce", {})
    doc = review(pod(GPU, node_name="gpu-1"))
    del doc["request"]["userInfo"]
    assert rego_verdict(config, policy, doc, {}) == "bound"
    assert cel_verdict(config, policy, doc, {}) == "bound"


def test_the_mutating_admission_policy_sets_the_field_the_webhook_patches():
    config, policy = configured("mutate", {})
    [mutating, binding] = render.mutating_policy(config, "admissionregistration.k8s.io/v1", policy)
    assert binding["spec"]["policyName"] == mutating["metadata"]["name"]
    expression = mutating["spec"]["mutations"][0]["applyConfiguration"]["expression"]
    assert cel.evaluate(expression) == {"spec": {"schedulerName": SCHEDULER}}
    assert [m["patchType"] for m in mutating["spec"]["mutations"]] == ["ApplyConfiguration", "JSONPatch"]
    hook_conditions = render.webhook_configuration(config, "1.31.0", "", policy)["webhooks"][0]["matchConditions"]
    assert mutating["spec"]["matchConditions"][1:-2] == hook_conditions[:-1]  # the same exemptions
    off = render.mutating_policy(config, "admissionregistration.k8s.io/v1", configured("mutate", {"_steer": False})[1])
    assert [m["patchType"] for m in off[0]["spec"]["mutations"]] == ["JSONPatch"]  # no steering while it is down


# --- OPA's own API: data.system.authz ------------------------------------------------------------------------------
def authz_input(method: str, url_path: str, identity: str | None = None, body=None) -> dict:
    """The input OPA's authorizer builds (v1/server/authorizer/authorizer.go makeInput): the path split at '/'
    after the leading one, params from the query, headers, identity when --authentication=token found a bearer
    token, body for POSTs of / and /v*/data."""
    path_part, _, query = url_path.partition("?")
    document = {"method": method, "path": path_part[1:].split("/") if path_part else [],
                "params": {k: [v] for k, v in (q.split("=", 1) if "=" in q else (q, "") for q in query.split("&") if q)},
                "headers": {"Content-Type": ["application/json"]}}
    if identity is not None:
        document["identity"] = identity
        document["headers"]["Authorization"] = [f"Bearer {identity}"]
    if body is not None:
        document["body"] = body
    return document


AUTHZ = [  # (method, URL path, identity, allowed)
    ("POST", "/", None, True),  # the webhook, as the API server calls it: no credentials
    ("POST", "/?timeout=3s", None, True),
    ("GET", "/health", None, True),  # the kubelet's probes
    ("GET", "/health?plugins", None, True),
    ("PUT", "/v1/policies/system", None, False),  # replacing the policy
    ("PUT", "/v1/policies/system", "a-guessed-token", False),  # no token is trusted: none exists
    ("DELETE", "/v1/policies/policy/gpu-pods.rego", None, False),
    ("GET", "/v1/policies", None, False),
    ("GET", "/v1/data", None, False),
    ("GET", "/v1/data/system/main", None, False),
    ("POST", "/v1/data/system/main", None, False),
    ("PUT", "/v1/data/system", None, False),
    ("PATCH", "/v1/data", None, False),
    ("POST", "/v0/data/system/main", None, False),
    ("POST", "/v1/query", None, False),
    ("POST", "/v1/compile", None, False),
    ("GET", "/v1/config", None, False),
    ("GET", "/v1/status", None, False),
    ("GET", "/metrics", None, False),
    ("GET", "/", None, False),  # the query page
    ("POST", "//", None, False),
    ("POST", "/health", None, False),
    ("GET", "/health/x", None, False),
]


@pytest.mark.parametrize("method, url_path, identity, allowed", AUTHZ, ids=[f"{m} {p} {i or ''}".strip()
                                                                             for m, p, i, _a in AUTHZ])
def test_opa_lets_anyone_ask_for_a_verdict_and_nobody_manage_it(method, url_path, identity, allowed):
    """data.system.authz.allow, which `--authorization=basic` asks before serving any request, on OPA's own engine
    (and on the suite's Rego engine, which the emulator's OPA stand-in uses)."""
    if not rego.opa_available():
        missing("OPA's engine (pip package opa-golib-python-bindings) is not installed")
    modules = render.policy_files(conf())
    document = authz_input(method, url_path, identity, body={} if method == "POST" else None)
    assert rego.OpaPolicy(modules).decide("data.system.authz.allow", document) is allowed
    assert rego.Policy(modules).decide("data.system.authz.allow", document) is allowed


def test_opa_runs_with_its_api_locked():
    container = render.deployment(conf(), "")["spec"]["template"]["spec"]["containers"][0]
    assert {"--authentication=token", "--authorization=basic"} <= set(container["args"])
    assert f"/policy/{render.AUTHZ_FILE}" in container["args"]
