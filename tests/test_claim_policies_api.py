"""The claim policies on the API server (gpu_operator.allocation: dra): the ValidatingAdmissionPolicies whose params
are the ResourceClaimTemplates and ResourceClaims of the pod's own namespace (render.claim_policies), created as `up`
creates them, then pods sent as server-side dry runs, as users write them.

Run on the emulator and on the real kube-apiserver 1.37 of the local cluster (tests/test_kubeapi_api.py's `emu`
fixture): a pod naming a GPU claim template or claim is held to the bin-packing scheduler, one whose claim asks for
another class is not, and the emulator finds params as the real server does. The MutatingAdmissionPolicies that steer
such pods are proved on the real chain in tests/test_dra_live.py (the emulator does not evaluate them).
"""
from __future__ import annotations

import time

import pytest

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.render import admission as render
from gpu_bootstrap.render import admission_policy as policy_render
from tests.kubeapi import cel
from tests.localcluster.facade import RealEmu
from tests.test_kubeapi_api import api, client, emu  # noqa: F401 - the fixtures: emulator and real backends

SCHEDULER = "gpu-binpack-scheduler"
RESOURCE = "/apis/resource.k8s.io/v1/namespaces/default"
PODS = "/api/v1/namespaces/default/pods"
POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.37.0", "cpu_nodes": ["cpu-1"]}


@pytest.fixture(autouse=True)
def engine():
    from tests.tools import missing
    if not cel.available():
        missing("the CEL runtime (pip package cel-expr-python) is not installed")


def devices(device_class: str) -> dict:
    return {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": device_class, "count": 1}}]}}


def template(name: str, device_class: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": devices(device_class)}}


def claim(name: str, device_class: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": devices(device_class)}


def claim_pod(name: str, template_name: str = "", claim_name: str = "", scheduler: str = "",
              node_name: str = "") -> dict:
    """A pod as NVIDIA's DRA examples write one: its GPU from a claim, no resource request."""
    source = {"resourceClaimTemplateName": template_name} if template_name else {"resourceClaimName": claim_name}
    spec = {"containers": [{"name": "main", "image": "cuda:12", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", **source}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def verdict(api, pod: dict) -> str:  # noqa: F811 - api: the fixture's client
    answer = api.post(f"{PODS}?dryRun=All", pod)
    if answer.status == 201:
        return "admitted"
    message = answer.json.get("message", "")
    assert answer.status == 403, (answer.status, message)
    return "bound" if "spec.nodeName" in message else "denied" if f"spec.schedulerName: {SCHEDULER}" in message \
        else message


def test_the_claim_policies_hold_gpu_claim_pods_to_the_scheduler_and_leave_other_claims_alone(emu, api):  # noqa: F811
    config = cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}], "admission": {"mode": "enforce"},
                                        "gpu_operator": {"allocation": "dra"}})
    for obj in render.claim_policies(config, None, policy_render.of(config)):
        path = POLICIES if obj["kind"] == "ValidatingAdmissionPolicy" else BINDINGS
        assert api.post(path, obj).status == 201
    for obj, path in ((template("one-gpu", "gpu.nvidia.com"), "resourceclaimtemplates"),
                      (template("one-nic", "nic.example.com"), "resourceclaimtemplates"),
                      (claim("shared-gpu", "mig.nvidia.com"), "resourceclaims"),
                      (claim("shared-nic", "nic.example.com"), "resourceclaims")):
        assert api.post(f"{RESOURCE}/{path}", obj).status == 201
    deadline = time.monotonic() + 120  # the real server takes up each new policy (and its params) a moment later
    while (seen := (verdict(api, claim_pod("gpu", "one-gpu")),
                    verdict(api, claim_pod("claimed", claim_name="shared-gpu")))) != ("denied", "denied"):
        assert time.monotonic() < deadline, f"the claim policies did not take effect within 120 s: {seen}"
        time.sleep(0.5)
    assert {name: verdict(api, pod) for name, pod in {
        "gpu template": claim_pod("a", "one-gpu"),
        "gpu template, default scheduler named": claim_pod("b", "one-gpu", scheduler="default-scheduler"),
        "gpu template, our scheduler": claim_pod("c", "one-gpu", scheduler=SCHEDULER),
        "gpu template, bound by its creator": claim_pod("d", "one-gpu", scheduler=SCHEDULER, node_name="cpu-1"),
        "nic template": claim_pod("e", "one-nic"),
        "a template that does not exist": claim_pod("f", "no-such-template"),
        "gpu claim (MIG)": claim_pod("g", claim_name="shared-gpu"),
        "nic claim": claim_pod("h", claim_name="shared-nic"),
    }.items()} == {
        "gpu template": "denied", "gpu template, default scheduler named": "denied",
        "gpu template, our scheduler": "admitted", "gpu template, bound by its creator": "bound",
        "nic template": "admitted", "a template that does not exist": "admitted", "gpu claim (MIG)": "denied",
        "nic claim": "admitted"}


def dra_config() -> cfg.Config:
    return cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}], "gpu_operator": {"allocation": "dra"}})


def identity(emu, api) -> tuple[str, dict]:  # noqa: F811 - api: the fixture's client
    """A ServiceAccount's name and the headers that present its token: the emulator's add_token, or the real
    server's TokenRequest."""
    if not isinstance(emu, RealEmu):
        name = "system:serviceaccount:default:policy-writer"
        return name, {"Authorization": f"Bearer {emu.add_token(name)}"}
    assert api.post("/api/v1/namespaces/default/serviceaccounts", {"metadata": {"name": "policy-writer"}}).status == 201
    answer = api.post("/api/v1/namespaces/default/serviceaccounts/policy-writer/token",
                      {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}})
    assert answer.status == 201, answer
    return f"system:serviceaccount:{emu.namespace}:policy-writer", {
        "Authorization": f"Bearer {answer.json['status']['token']}"}


def up_rules(config, without: str = "") -> list[dict]:
    """The cluster-wide rules `rbac --for up` grants for admission's writes in DRA mode, as ClusterRole rules."""
    from gpu_bootstrap import steps as registry
    from gpu_bootstrap.security import rbac
    rules = []
    for need in rbac.needs("up", config, registry.declarations(["admission"])):
        if need.scope is rbac.CLUSTER and need.group in ("admissionregistration.k8s.io", "resource.k8s.io") and \
                need.group != without:
            rules.append({"apiGroups": [need.group], "resources": list(need.resources), "verbs": list(need.verbs),
                          **({"resourceNames": list(need.names)} if need.names else {})})
    return rules


def test_the_up_role_may_create_the_claim_policies_and_without_its_claim_reads_may_not(emu, api):  # noqa: F811
    """The API server lets only an identity that may read a policy's parameters in every namespace create the
    policy (paramKind: `get`) or its binding (paramRef with a selector: `list`). The rules `rbac --for up` grants
    admission in DRA mode let its identity create the claim policies; without its resource.k8s.io reads the
    server refuses the first one with a 422 naming spec.paramKind. On the real server and on the emulator."""
    config = dra_config()
    user, headers = identity(emu, api)
    writer = client(emu, auth="none")
    objects = render.claim_policies(config, "admissionregistration.k8s.io/v1", policy_render.of(config))
    objects = [o for o in objects if o["kind"].startswith("Validating")]  # the emulator stores, not runs, MAPs

    def grant(rules: list[dict], name: str) -> None:
        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
                "rules": rules}
        binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                            "kind": "ClusterRole", "name": name},
                   "subjects": [{"kind": "User", "name": user}]}
        assert api.post("/apis/rbac.authorization.k8s.io/v1/clusterroles", role).status == 201
        assert api.post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding).status == 201

    def write(obj: dict):
        path = POLICIES if obj["kind"] == "ValidatingAdmissionPolicy" else BINDINGS
        return writer.request("POST", path, obj, headers=headers)

    grant(up_rules(config, without="resource.k8s.io"), f"claim-writer-{id(objects)}")
    deadline = time.monotonic() + 60  # the real authorizer takes up a new binding a moment later
    while (refused := write(objects[0])).status == 403:
        assert time.monotonic() < deadline, refused
        time.sleep(0.3)
    assert refused.status == 422 and refused.json["details"]["causes"][0]["field"] == "spec.paramKind", refused
    assert 'must have "get" permission on all objects of the referenced paramKind (kind=ResourceClaimTemplate, ' \
           'apiVersion=resource.k8s.io/v1)' in refused.json["message"], refused
    grant([r for r in up_rules(config) if r["apiGroups"] == ["resource.k8s.io"]], f"claim-reader-{id(objects)}")
    while (answer := write(objects[0])).status == 422:
        assert time.monotonic() < deadline + 60, answer
        time.sleep(0.3)
    assert answer.status == 201, answer
    assert [write(o).status for o in objects[1:]] == [201, 201, 201]
