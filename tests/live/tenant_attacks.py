"""What a tenant tries to get GPUs it was not given (the second security review, issue 54), on the real API server:
a user who may create pods in a namespace of their own, as any tenant of a shared GPU cluster may, and nothing else.

Each attack returns an attacks.Outcome: refused (by the admission webhook, a ValidatingAdmissionPolicy, or RBAC), or
for a pod the platform admits on purpose, what admission made of it (`voided`: NVIDIA_VISIBLE_DEVICES=void on every
container given no GPU, so an image's own value selects nothing; `steered`: a GPU pod by another name held to the
bin-packing scheduler). Anything else, or an admitted pod that still reaches a GPU, is ALLOWED.
"""
from __future__ import annotations

import json
from pathlib import Path

from tests.live import attacks
from tests.live.attacks import Outcome
from tests.live.identities import LIVE_LABEL, as_token, kubeconfig

NAMESPACE = "gpu-bootstrap-live-tenant"
TENANT = (NAMESPACE, "tenant")
PAUSE = "registry.k8s.io/pause:3.10"
TOLERATE = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
SCHEDULER = "gpu-binpack-scheduler"
RUNNING = "tenant-running"  # a pod of the tenant's, for kubectl debug


def _judge(results: list, field: str) -> Outcome:
    """Refused (attacks._judge: every request refused by admission or RBAC), and each refusal names `field`."""
    outcome = attacks._judge(results)
    unnamed = [r.stderr.strip()[:300] for r in results if field not in r.stderr]
    if outcome.refused and unnamed:
        return Outcome(False, f"refused without naming {field}: {unnamed[0][:160]}", outcome.said)
    return outcome


def pod(name: str, containers: list[dict], gpus: int = 0, **spec) -> dict:
    """A pod as a tenant writes one: no scheduler name; a node selector for a GPU node and the GPU taint's toleration,
    which are the author's to set."""
    for container in containers:
        container.setdefault("image", PAUSE)
    if gpus:
        containers[0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"tolerations": TOLERATE, "nodeSelector": {"nvidia.com/gpu.present": "true"},
                     "containers": containers, "terminationGracePeriodSeconds": 0, **spec}}


def env(value: str = "all", name: str = "NVIDIA_VISIBLE_DEVICES") -> list[dict]:
    return [{"name": name, "value": value}]


def _create(kc: Path, obj: dict):
    return as_token(kc, "create", "-f", "-", "-o", "json", input=json.dumps(obj))


# --- the attacks: fn(tenant kubeconfig, target) -> Outcome --------------------------------------------------------
def env_all(kc, target) -> Outcome:
    """A pod that asks for no GPU and sets NVIDIA_VISIBLE_DEVICES=all."""
    return _judge([_create(kc, pod("attack-env", [{"name": "c", "env": env()}]))],
                  "spec.containers[c].env[NVIDIA_VISIBLE_DEVICES]")


def sidecar(kc, target) -> Outcome:
    """A 1-GPU pod whose sidecar names every GPU of the node."""
    return _judge([_create(kc, pod("attack-sidecar", [{"name": "main"}, {"name": "side", "env": env("0,1,2,3")}],
                                   gpus=1))], "spec.containers[side].env[NVIDIA_VISIBLE_DEVICES]")


def init_container(kc, target) -> Outcome:
    """An init container names a GPU by UUID; another variable the runtime reads (NVIDIA_MIG_CONFIG_DEVICES)."""
    return _judge([_create(kc, pod("attack-init", [{"name": "main"}],
                                   initContainers=[{"name": "init", "image": PAUSE, "env": env("GPU-0")}])),
                   _create(kc, pod("attack-mig", [{"name": "c", "env": env("all", "NVIDIA_MIG_CONFIG_DEVICES")}]))],
                  "env[NVIDIA_")


def value_from(kc, target) -> Outcome:
    """The value from a ConfigMap of the tenant's, which admission cannot read."""
    variable = {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "all"}}}
    return _judge([_create(kc, pod("attack-value-from", [{"name": "c", "env": [variable]}]))],
                  "spec.containers[c].env[NVIDIA_VISIBLE_DEVICES]")


def debug(kc, target) -> Outcome:
    """kubectl debug: an ephemeral container that names every GPU, added to a running pod of the tenant's."""
    result = as_token(kc, "debug", RUNNING, "-n", NAMESPACE, "--image", PAUSE, "--container", "dbg",
                      "--env", "NVIDIA_VISIBLE_DEVICES=all", "--attach=false")
    return _judge([result], "spec.ephemeralContainers[dbg].env[NVIDIA_VISIBLE_DEVICES]")


def runtime_class(kc, target) -> Outcome:
    """NVIDIA's RuntimeClasses on a pod that asks for no GPU (legacy mode honours the image's variable)."""
    return _judge([_create(kc, pod(f"attack-rc-{name}", [{"name": "c"}], runtimeClassName=name))
                   for name in ("nvidia", "nvidia-legacy")], "spec.runtimeClassName")


def image_value(kc, target) -> Outcome:
    """A CPU pod that may land on a GPU node, from an image whose own environment says NVIDIA_VISIBLE_DEVICES=all
    (admission cannot see it): it is admitted with NVIDIA_VISIBLE_DEVICES=void on every container, which overrides
    the image's value."""
    result = as_token(kc, "create", "--dry-run=server", "-f", "-", "-o", "json",
                      input=json.dumps(pod("attack-image", [{"name": "a"}, {"name": "b", "env": [{"name": "X",
                                                                                                   "value": "1"}]}])))
    if result.returncode != 0:
        return Outcome(False, f"failed otherwise: {result.stderr.strip()[:200]}", [result.stderr])
    made = json.loads(result.stdout)
    values = [{e["name"]: e.get("value") for e in c.get("env") or []}.get("NVIDIA_VISIBLE_DEVICES")
              for c in made["spec"]["containers"]]
    if values != ["void", "void"]:
        return Outcome(False, f"admitted with NVIDIA_VISIBLE_DEVICES {values}", [result.stdout[:300]])
    return Outcome(True, "voided: NVIDIA_VISIBLE_DEVICES=void set by admission")


def implicit_name(kc, target) -> Outcome:
    """KEP-5004: a GPU by the DeviceClass's implicit extended resource name, deviceclass.resource.kubernetes.io/
    gpu.nvidia.com, as users write a pod (no scheduler name, no toleration): held to the bin-packing scheduler like
    an nvidia.com/gpu pod, never left to the default scheduler."""
    asked = pod("attack-implicit", [{"name": "c", "resources": {
        "limits": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"}}}])
    del asked["spec"]["tolerations"]
    result = as_token(kc, "create", "--dry-run=server", "-f", "-", "-o", "json", input=json.dumps(asked))
    if result.returncode != 0:
        refusal = attacks._refusal(result)
        if refusal in ("admission policy", "admission webhook") and "spec.schedulerName" in result.stderr:
            return Outcome(True, f"refused ({refusal}): not on {SCHEDULER}", [result.stderr])
        return Outcome(False, refusal or "failed", [result.stderr])
    made = json.loads(result.stdout)
    if made["spec"].get("schedulerName") != SCHEDULER:
        return Outcome(False, f"admitted on {made['spec'].get('schedulerName')}", [result.stdout[:300]])
    return Outcome(True, "steered: schedulerName and the GPU taint's toleration set by admission")


TENANT_ATTACKS = {  # name -> (what the docs call it, fn)
    "env-all": ("NVIDIA_VISIBLE_DEVICES=all on a pod that asks for no GPU", env_all),
    "sidecar": ("a 1-GPU pod's sidecar naming four GPUs", sidecar),
    "init-container": ("an init container naming a GPU by UUID; NVIDIA_MIG_CONFIG_DEVICES=all", init_container),
    "value-from": ("NVIDIA_VISIBLE_DEVICES from a ConfigMap (valueFrom)", value_from),
    "debug": ("kubectl debug: an ephemeral container with NVIDIA_VISIBLE_DEVICES=all", debug),
    "runtime-class": ("runtimeClassName nvidia / nvidia-legacy without a GPU", runtime_class),
    "image-value": ("an image's own NVIDIA_VISIBLE_DEVICES=all on a pod that tolerates the GPU taint", image_value),
    "implicit-name": ("a GPU as deviceclass.resource.kubernetes.io/gpu.nvidia.com, as users write it", implicit_name),
}


# --- the stage --------------------------------------------------------------------------------------------------
def set_stage(target, folder: Path) -> Path:
    """The tenant: a namespace, a ServiceAccount that may create, read and delete pods there and add ephemeral
    containers (what `kubectl debug` needs), a running pod of theirs; NVIDIA's RuntimeClasses as the gpu-operator
    makes them (the RuntimeClass admission plugin refuses a pod naming one that does not exist, for another reason).
    Returns the tenant's kubeconfig."""
    target.kubectl("create", "namespace", NAMESPACE, check=False)
    target.kubectl("create", "serviceaccount", TENANT[1], "-n", NAMESPACE, check=False)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "tenant", "namespace": NAMESPACE, "labels": dict([LIVE_LABEL])},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "delete"]},
                      {"apiGroups": [""], "resources": ["pods/ephemeralcontainers"], "verbs": ["update", "patch"]},
                      {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "tenant", "namespace": NAMESPACE, "labels": dict([LIVE_LABEL])},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
               "subjects": [{"kind": "ServiceAccount", "name": TENANT[1], "namespace": NAMESPACE}]}
    for name in ("nvidia", "nvidia-legacy"):
        runtime = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": name,
                   "metadata": {"name": name, "labels": {"gpu-bootstrap.io/live-test": "runtime-class"}}}
        target.kubectl("create", "-f", "-", input=json.dumps(runtime), check=False)
    target.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [role, binding]}))
    target.kubectl("create", "-f", "-", input=json.dumps(pod(RUNNING, [{"name": "c"}], nodeSelector={})), check=False)
    return kubeconfig(target, f"{NAMESPACE}/{TENANT[1]}", folder / "kubeconfig-tenant")


def clear_stage(target) -> None:
    target.kubectl("delete", "runtimeclass", "-l", "gpu-bootstrap.io/live-test=runtime-class", check=False)
    target.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s",
                   check=False)


def cell(outcome: Outcome) -> str:
    """A table cell: refused (by what), admitted as admission made it (voided, steered), or ALLOWED."""
    if outcome.refused and outcome.by.startswith(("voided", "steered")):
        return f"admitted, {outcome.by}"
    return outcome.cell


def run(kc: Path, target) -> dict[str, Outcome]:
    return {name: fn(kc, target) for name, (_what, fn) in TENANT_ATTACKS.items()}
