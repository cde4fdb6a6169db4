"""GPUs only for pods that were given them (render/device_access.py): a table of pods as users (and attackers) write
them, judged by the rendered OPA policy on a real Rego engine (OPA's own too, where installed) and by the rendered
ValidatingAdmissionPolicy and MutatingAdmissionPolicy on a real CEL runtime; both must give the row's verdict, in
both modes.

Verdicts: "deny <field>" (refused, the message naming that field), "void <containers>" (NVIDIA_VISIBLE_DEVICES=void set
on exactly those containers, mode mutate), "allow" (nothing of it changed by device access). The API server's own
run of these objects is tests/live/test_attacks.py's device-access attacks.
"""
from __future__ import annotations

import base64
import copy
import json

import pytest

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.render import admission as render
from gpu_bootstrap.render import admission_policy as policy_render
from gpu_bootstrap.render import device_access
from tests.kubeapi import cel, rego
from tests.kubeapi.patches import json_patch
from tests.test_admission_policy import engines  # noqa: F401 - the real Rego and CEL engines, or a skip

pytestmark = pytest.mark.unit

MAP_API = "admissionregistration.k8s.io/v1"
TENANT = {"username": "alice", "groups": ["team-a", "system:authenticated"]}
KUBELET = {"username": "system:node:gpu-1", "groups": ["system:nodes", "system:authenticated"]}
DS_CONTROLLER = {"username": "system:serviceaccount:kube-system:daemon-set-controller", "groups": []}
GPU = {"limits": {"nvidia.com/gpu": 1}}
TOLERATE = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def container(name="main", env=None, resources=None, privileged=False, caps=None, image="nvcr.io/nvidia/cuda:12"):
    found = {"name": name, "image": image}
    if env is not None:
        found["env"] = env
    if resources:
        found["resources"] = resources
    if privileged or caps:
        found["securityContext"] = {"privileged": True} if privileged else {"capabilities": {"add": caps}}
    return found


def pod(*containers, init=(), ephemeral=(), tolerations=None, node_name=None, runtime=None, claims=None,
        namespace="team-a", owner=None) -> dict:
    spec = {"containers": list(containers) or [container()]}
    if init:
        spec["initContainers"] = list(init)
    if ephemeral:
        spec["ephemeralContainers"] = list(ephemeral)
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if node_name:
        spec["nodeName"] = node_name
    if runtime:
        spec["runtimeClassName"] = runtime
    if claims:
        spec["resourceClaims"] = claims
    if any(_asks(c) for c in spec["containers"]) or claims:
        spec["schedulerName"] = "gpu-binpack-scheduler"  # steering is not what this table is about
    meta = {"name": "p", "namespace": namespace}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": "o", "uid": "1"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _asks(c: dict) -> bool:
    resources = c.get("resources") or {}
    return bool(resources.get("claims")) or any(policy_render.IMPLICIT_PREFIX in r or r.startswith("nvidia.com/")
                                                for r in resources.get("limits", {}))


def env(value="all", name="NVIDIA_VISIBLE_DEVICES"):
    return [{"name": name, "value": value}]


def review(obj: dict, user=None, operation="CREATE", old: dict | None = None) -> dict:
    request = {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "resource": {"group": "", "version": "v1", "resource": "pods"}, "name": "p",
               "namespace": obj["metadata"]["namespace"], "operation": operation, "userInfo": user or TENANT,
               "object": obj, "dryRun": False}
    if operation == "UPDATE":
        request["subResource"] = "ephemeralcontainers"
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def debug(old: dict, *ephemeral) -> dict:
    """kubectl debug: the pod as it was, with ephemeral containers added (an UPDATE of pods/ephemeralcontainers)."""
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [*old["spec"].get("ephemeralContainers", []), *ephemeral]
    return review(new, operation="UPDATE", old=old)


RUNNING = pod(container(), tolerations=TOLERATE)
# (id, review, verdict in mode mutate, verdict in mode enforce)
TABLE = [
    ("NVIDIA_VISIBLE_DEVICES=all, no GPU asked", review(pod(container(env=env()), tolerations=TOLERATE)),
     "deny spec.containers[main].env[NVIDIA_VISIBLE_DEVICES]", "deny spec.containers[main].env[NVIDIA_VISIBLE_DEVICES]"),
    ("a GPU pod's sidecar sets it", review(pod(container(resources=GPU), container("side", env=env("0,1,2,3"))),),
     "deny spec.containers[side].env[NVIDIA_VISIBLE_DEVICES]", "deny spec.containers[side].env[NVIDIA_VISIBLE_DEVICES]"),
    ("the GPU container itself sets it", review(pod(container(resources=GPU, env=env()))),
     "deny spec.containers[main].env[NVIDIA_VISIBLE_DEVICES]", "deny spec.containers[main].env[NVIDIA_VISIBLE_DEVICES]"),
    ("an init container sets it", review(pod(container(), init=[container("init", env=env("GPU-1234"))])),
     "deny spec.initContainers[init].env[NVIDIA_VISIBLE_DEVICES]",
     "deny spec.initContainers[init].env[NVIDIA_VISIBLE_DEVICES]"),
    ("from valueFrom", review(pod(container(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {
        "configMapKeyRef": {"name": "c", "key": "k"}}}]))),
     "deny spec.containers[main].env[NVIDIA_VISIBLE_DEVICES]", "deny spec.containers[main].env[NVIDIA_VISIBLE_DEVICES]"),
    ("NVIDIA_MIG_CONFIG_DEVICES", review(pod(container(env=env("all", "NVIDIA_MIG_CONFIG_DEVICES")))),
     "deny spec.containers[main].env[NVIDIA_MIG_CONFIG_DEVICES]",
     "deny spec.containers[main].env[NVIDIA_MIG_CONFIG_DEVICES]"),
    ("NVIDIA_IMEX_CHANNELS", review(pod(container(env=env("0", "NVIDIA_IMEX_CHANNELS")))),
     "deny spec.containers[main].env[NVIDIA_IMEX_CHANNELS]", "deny spec.containers[main].env[NVIDIA_IMEX_CHANNELS]"),
    ("void is allowed", review(pod(container(env=env("void")), tolerations=TOLERATE)), "allow", "allow"),
    ("none is allowed", review(pod(container(env=env("none")), tolerations=TOLERATE)), "allow", "allow"),
    ("CUDA_VISIBLE_DEVICES is the application's", review(pod(container(env=env("0", "CUDA_VISIBLE_DEVICES")))),
     "allow", "allow"),
    ("a privileged container (reaches every device anyway)", review(pod(container(env=env(), privileged=True))),
     "allow", "allow"),
    ("CAP_SYS_ADMIN counts as privileged, as the toolkit counts it",
     review(pod(container(env=env(), caps=["SYS_ADMIN"]))), "allow", "allow"),
    ("NVIDIA's RuntimeClass without a GPU", review(pod(container(), runtime="nvidia-legacy")),
     "deny spec.runtimeClassName", "deny spec.runtimeClassName"),
    ("NVIDIA's RuntimeClass with a GPU", review(pod(container(resources=GPU), runtime="nvidia")), "allow", "allow"),
    ("NVIDIA's RuntimeClass with a claim", review(pod(container(resources={"claims": [{"name": "g"}]}), runtime="nvidia",
                                                       claims=[{"name": "g", "resourceClaimName": "c"}])),
     "allow", "allow"),
    ("another RuntimeClass", review(pod(container(), runtime="gvisor")), "allow", "allow"),
    # mode mutate: void on what can land on a GPU node and is given no GPU
    ("a CPU pod tolerating the GPU taint", review(RUNNING), "void main", "allow"),
    ("a CPU pod tolerating every taint", review(pod(container(), tolerations=[{"operator": "Exists"}])), "void main",
     "allow"),
    ("a CPU pod naming a node", review(pod(container(), node_name="gpu-1")), "void main", "allow"),
    ("a CPU pod that cannot land on a GPU node", review(pod(container())), "allow", "allow"),
    ("a GPU pod: its GPU container kept, its sidecar and init container voided",
     review(pod(container(resources=GPU), container("side", env=[{"name": "X", "value": "1"}]),
                init=[container("init")])), "void init side", "allow"),
    ("a GPU pod through the implicit DRA name",
     review(pod(container(resources={"limits": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": 1}}),
                container("side"))), "void side", "allow"),
    ("a claim pod's claim container kept", review(pod(container(resources={"claims": [{"name": "g"}]}),
                                                      container("side"),
                                                      claims=[{"name": "g", "resourceClaimTemplateName": "t"}],
                                                      tolerations=TOLERATE)), "void side", "allow"),
    ("a privileged container is not voided", review(pod(container(privileged=True), tolerations=TOLERATE)), "allow",
     "allow"),
    # kubectl debug
    ("an ephemeral container setting it", debug(RUNNING, container("dbg", env=env())),
     "deny spec.ephemeralContainers[dbg].env[NVIDIA_VISIBLE_DEVICES]",
     "deny spec.ephemeralContainers[dbg].env[NVIDIA_VISIBLE_DEVICES]"),
    ("a new ephemeral container is voided, an earlier one kept",
     debug(pod(container(), ephemeral=[container("old")], tolerations=TOLERATE), container("dbg")), "void dbg",
     "allow"),
    # who is exempt
    ("kube-system", review(pod(container(env=env()), namespace="kube-system")), "allow", "allow"),
    ("a DaemonSet's pod in the operator's namespace, by the DaemonSet controller",
     review(pod(container(env=env()), namespace="gpu-operator", owner="DaemonSet"), DS_CONTROLLER), "allow", "allow"),
    ("a tenant's pod claiming to be a DaemonSet's",
     review(pod(container(env=env()), namespace="gpu-operator", owner="DaemonSet")),
     "deny spec.containers[main].env[NVIDIA_VISIBLE_DEVICES]", "deny spec.containers[main].env[NVIDIA_VISIBLE_DEVICES]"),
]
IDS = [row[0] for row in TABLE]


def configured(mode: str, **admission) -> tuple[cfg.Config, policy_render.Policy]:
    config = cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}], "admission": {"mode": mode, **admission}})
    return config, policy_render.of(config)


def voided(before: dict, after: dict) -> str:
    names = []
    for kind in device_access.CONTAINER_LISTS:
        old = {c["name"]: c for c in before["spec"].get(kind, [])}
        for c in after["spec"].get(kind, []):
            was = old.get(c["name"], {})
            if (c.get("env") or []) != (was.get("env") or []):
                assert c["env"] == [*(was.get("env") or []), device_access.VOID], c  # appended, nothing else changed
                names.append(c["name"])
    return "void " + " ".join(sorted(names)) if names else "allow"


def rego_verdict(policy, doc: dict) -> str:
    modules = {"gpu-pods.rego": policy_render.rego(policy)}
    answer = rego.Policy(modules).decide("data.system.main", doc)["response"]
    if rego.opa_available():
        assert rego.OpaPolicy(modules).decide("data.system.main", doc)["response"] == answer
    if not answer["allowed"]:
        message = answer["status"]["message"]
        return "deny " + _field(message)
    if "patch" in answer:
        obj = doc["request"]["object"]
        after = json_patch(obj, json.loads(base64.b64decode(answer["patch"])))
        return voided(obj, {**after, "spec": {k: v for k, v in after["spec"].items()
                                              if k not in ("schedulerName", "tolerations")}})
    return "allow"


def _field(message: str) -> str:
    """The field a refusal names first: spec.<list>[<container>].env[<variable>], or spec.runtimeClassName. OPA and
    the API server's policy name them alike."""
    import re
    if message.startswith("spec.runtimeClassName"):
        return "spec.runtimeClassName"
    found = re.match(r"spec\.\w+\[[\w-]+\]\.env\[\w+\]", message)
    assert found, message
    return found[0]


def merged(obj: dict, applied: dict) -> dict:
    """An apply configuration merged into the pod as the API server merges it: containers and env are lists keyed by
    name."""
    out = copy.deepcopy(obj)
    for kind, items in (applied.get("spec") or {}).items():
        mine = {c["name"]: c for c in out["spec"].setdefault(kind, [])}
        for item in items:
            target = mine[item["name"]]
            names = {e["name"]: e for e in target.setdefault("env", [])}
            for entry in item.get("env", []):
                if entry["name"] in names:
                    names[entry["name"]].update(entry)
                else:
                    target["env"].append(dict(entry))
    return out


def cel_verdict(config, policy, doc: dict) -> str:
    """The API server's own objects: in mode mutate with engine vap the MutatingAdmissionPolicy first, then the
    ValidatingAdmissionPolicy on the object as mutated."""
    request = doc["request"]
    vap = next(o for o in render.device_access_policies(config, MAP_API, policy)
               if o["kind"] == "ValidatingAdmissionPolicy")["spec"]
    rules = vap["matchConstraints"]["resourceRules"]
    resource = "pods/ephemeralcontainers" if request.get("subResource") else "pods"
    assert any(request["operation"] in r["operations"] and resource in r["resources"] for r in rules)
    if request["namespace"] in policy.exempt_namespaces:
        return "allow"
    obj = request["object"]
    variables = {"request": request, "oldObject": request.get("oldObject")}
    mutating = [o for o in render.device_access_policies(config, MAP_API, policy)
                if o["kind"] == "MutatingAdmissionPolicy"]
    if mutating:
        spec = mutating[0]["spec"]
        if all(cel.truth(c["expression"], object=obj, **variables) for c in spec["matchConditions"]):
            obj = merged(obj, cel.evaluate(spec["mutations"][0]["applyConfiguration"]["expression"], object=obj,
                                           **variables))
    if all(cel.truth(c["expression"], object=obj, **variables) for c in vap["matchConditions"]):
        for validation in vap["validations"]:
            if not cel.truth(validation["expression"], object=obj, **variables):
                message = cel.evaluate(validation["messageExpression"], object=obj, **variables) \
                    if "messageExpression" in validation else validation["message"]
                return "deny " + _field(message)
    return voided(request["object"], obj)


@pytest.mark.parametrize("mode", ["mutate", "enforce"])
@pytest.mark.parametrize("name, doc, mutate, enforce", TABLE, ids=IDS)
def test_opa_and_the_api_servers_policies_give_the_same_verdict(mode, name, doc, mutate, enforce):
    expected = mutate if mode == "mutate" else enforce
    opa_config, opa_policy = configured(mode)
    assert rego_verdict(opa_policy, doc) == expected
    vap_config, vap_policy = configured(mode, engine="vap")
    assert cel_verdict(vap_config, vap_policy, doc) == expected


@pytest.mark.parametrize("mode", ["mutate", "enforce"])
def test_the_webhook_is_called_exactly_for_what_opa_refuses_or_changes(mode):
    """matchConditions (1.30+) send OPA exactly the requests it acts on, the ephemeral-container UPDATEs included."""
    config, policy = configured(mode)
    hook = render.webhook_configuration(config, "1.31.0", "", policy)["webhooks"][0]
    assert {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
            "resources": ["pods/ephemeralcontainers"], "scope": "Namespaced"} in hook["rules"]
    for name, doc, mutate, enforce in TABLE:
        request = doc["request"]
        if request["namespace"] in policy.exempt_namespaces:
            continue
        called = all(cel.truth(c["expression"], object=request["object"], oldObject=request.get("oldObject"),
                               request=request) for c in hook["matchConditions"])
        answer = rego.Policy({"p.rego": policy_render.rego(policy)}).decide("data.system.main", doc)["response"]
        assert called == (not answer["allowed"] or "patch" in answer), name
        if (mutate if mode == "mutate" else enforce) != "allow":
            assert called, name


def test_device_access_off_renders_nothing_and_changes_no_verdict():
    config, policy = configured("mutate", device_access=False)
    assert render.device_access_policies(config, MAP_API, policy) == []
    assert "device_violations" not in policy_render.rego(policy)
    doc = review(pod(container(env=env()), tolerations=TOLERATE))
    assert rego_verdict(policy, doc) == "allow"


def test_the_gpu_nodes_without_a_taint_void_every_pod():
    """node-prep off: any pod can land on a GPU node, so every container given no GPU is voided."""
    config = cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}], "node_prep": {"enabled": False}})
    policy = policy_render.of(config)
    assert rego_verdict(policy, review(pod(container()))) == "void main"
    vap_config = cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}], "node_prep": {"enabled": False},
                                            "admission": {"engine": "vap"}})
    assert cel_verdict(vap_config, policy_render.of(vap_config), review(pod(container()))) == "void main"


def test_the_implicit_dra_name_makes_a_gpu_pod_everywhere():
    """KEP-5004: deviceclass.resource.kubernetes.io/<class> asks for a GPU like nvidia.com/gpu; steered and counted."""
    config, policy = configured("enforce")
    asking = pod(container(resources={"limits": {"deviceclass.resource.kubernetes.io/mig.nvidia.com": 1}}))
    del asking["spec"]["schedulerName"]  # as users write it
    doc = review(asking)
    answer = rego.Policy({"p.rego": policy_render.rego(policy)}).decide("data.system.main", doc)["response"]
    assert not answer["allowed"] and "spec.schedulerName" in answer["status"]["message"]
    condition = policy_render.gpu_pod_condition()["expression"]
    assert cel.truth(condition, object=doc["request"]["object"])
