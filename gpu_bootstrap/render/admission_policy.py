"""What a GPU pod is, who is exempt, and the verdict, written twice from one definition: as Rego (v1 syntax) for OPA
and as CEL for the API server (webhook matchConditions, ValidatingAdmissionPolicy, MutatingAdmissionPolicy).

Pure functions of the admission settings. tests/test_admission_policy.py runs both on one table of AdmissionReview
fixtures with a real Rego engine and a real CEL runtime and requires the same verdicts.

A GPU pod: any container or init container whose limits or requests name `nvidia.com/gpu`, a MIG resource
(`nvidia.com/mig-*`) or a renamed shared resource time-slicing creates (`nvidia.com/gpu.shared`). Exempt whatever the
mode: pods with spec.nodeName already set (the gpu-operator's validator and plugin pods), DaemonSet- or Node-owned
pods, mirror pods, and pods in the exempt namespaces (checked here, and by the namespaceSelector, which also honours
the namespace label gpu-bootstrap.io/admission=ignore).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

DEFAULT_SCHEDULER = "default-scheduler"
IGNORE_LABEL = "gpu-bootstrap.io/admission"
IGNORE_VALUE = "ignore"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
BUILTIN_EXEMPT = ("kube-system",)


@dataclass(frozen=True)
class Policy:
    """Everything the verdict depends on (derived from the config by `of`)."""

    scheduler: str
    mode: str  # mutate | enforce
    exempt_namespaces: tuple[str, ...]
    override_other_schedulers: bool

    @property
    def message(self) -> str:
        return (f"GPU pods must use the bin-packing scheduler: set spec.schedulerName: {self.scheduler} "
                f"(gpu-bootstrap admission; to opt a namespace out, label it {IGNORE_LABEL}={IGNORE_VALUE})")


def of(config) -> Policy:
    """The policy the config asks for: exempt = kube-system, the gpu-operator's, the scheduler's and OPA's own
    namespaces, plus admission.exclude_namespaces."""
    settings = config.admission
    exempt = [*BUILTIN_EXEMPT, config.gpu_operator.namespace, config.scheduler.namespace, settings.opa.namespace,
              *settings.exclude_namespaces]
    return Policy(config.scheduler.name, settings.mode, tuple(sorted(set(exempt))),
                  settings.override_other_schedulers)


def namespace_selector(policy: Policy) -> dict:
    """Keeps the exempt namespaces (by name, and any labelled gpu-bootstrap.io/admission=ignore) out."""
    return {"matchExpressions": [
        {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": list(policy.exempt_namespaces)},
        {"key": IGNORE_LABEL, "operator": "NotIn", "values": [IGNORE_VALUE]}]}


# --- Rego -------------------------------------------------------------------------------------------------------------
def rego(policy: Policy) -> str:
    """The policy OPA serves at its root path: data.system.main answers an admission.k8s.io/v1 AdmissionReview with
    the AdmissionReview response (a base64 JSONPatch when it mutates)."""
    if policy.override_other_schedulers:
        wants = """wants_ours if object.get(input.request.object.spec, "schedulerName", "") != scheduler"""
    else:
        wants = f"""wants_ours if object.get(input.request.object.spec, "schedulerName", "") in {{"", "{DEFAULT_SCHEDULER}"}}"""
    if policy.mode == "mutate":
        verdict = """steered := {
	"uid": input.request.uid,
	"allowed": true,
	"patchType": "JSONPatch",
	"patch": base64.encode(json.marshal([{"op": "add", "path": "/spec/schedulerName", "value": scheduler}])),
}"""
    else:
        verdict = """steered := {
	"uid": input.request.uid,
	"allowed": false,
	"status": {"code": 403, "reason": "Forbidden", "message": message},
}"""
    return f"""# Rendered by gpu-bootstrap (admission step): keep GPU pods on the bin-packing scheduler.
# OPA evaluates data.system.main for a webhook that calls its root path.
package system

scheduler := {json.dumps(policy.scheduler)}

message := {json.dumps(policy.message)}

exempt_namespaces := {{{", ".join(json.dumps(n) for n in policy.exempt_namespaces)}}}

main := {{
	"apiVersion": "admission.k8s.io/v1",
	"kind": "AdmissionReview",
	"response": response,
}}

response := steered if {{
	steer
}} else := {{"uid": input.request.uid, "allowed": true}}

{verdict}

steer if {{
	input.request.operation == "CREATE"
	input.request.kind.kind == "Pod"
	not exempt
	gpu_pod
	wants_ours
}}

exempt if input.request.namespace in exempt_namespaces

exempt if object.get(input.request.object.spec, "nodeName", "") != ""

exempt if {{
	some owner in object.get(input.request.object.metadata, "ownerReferences", [])
	owner.kind in {{"DaemonSet", "Node"}}
}}

exempt if object.get(input.request.object.metadata, ["annotations", {json.dumps(MIRROR_ANNOTATION)}], null) != null

containers contains container if some container in object.get(input.request.object.spec, "containers", [])

containers contains container if some container in object.get(input.request.object.spec, "initContainers", [])

gpu_pod if {{
	some container in containers
	some section in ["limits", "requests"]
	some name, _ in object.get(container, ["resources", section], {{}})
	gpu_resource(name)
}}

gpu_resource(name) if name == "nvidia.com/gpu"

gpu_resource(name) if startswith(name, "nvidia.com/gpu.")

gpu_resource(name) if startswith(name, "nvidia.com/mig-")

{wants}
"""


# --- CEL --------------------------------------------------------------------------------------------------------------
def _gpu_name(var: str) -> str:
    return f"{var} == 'nvidia.com/gpu' || {var}.startsWith('nvidia.com/gpu.') || {var}.startsWith('nvidia.com/mig-')"


def _quoted(names) -> str:
    return "[" + ", ".join(json.dumps(n) for n in names) + "]"


def exemption_conditions(policy: Policy) -> list[dict]:
    """matchConditions (name, expression) that hold for a pod the policy applies to: a GPU pod that is not exempt.
    Every field is guarded with has(), so no pod can make them fail to evaluate."""
    per_section = " || ".join(
        f"(has(c.resources.{s}) && c.resources.{s}.exists(r, {_gpu_name('r')}))" for s in ("limits", "requests"))
    return [
        {"name": "gpu-pod", "expression":
            "(object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : []))"
            f".exists(c, has(c.resources) && ({per_section}))"},
        {"name": "not-bound-to-a-node", "expression": "!has(object.spec.nodeName) || object.spec.nodeName == ''"},
        {"name": "not-daemonset-or-node-owned", "expression":
            "!has(object.metadata.ownerReferences) || "
            "!object.metadata.ownerReferences.exists(o, o.kind == 'DaemonSet' || o.kind == 'Node')"},
        {"name": "not-a-mirror-pod", "expression":
            f"!has(object.metadata.annotations) || !('{MIRROR_ANNOTATION}' in object.metadata.annotations)"},
        {"name": "not-an-exempt-namespace", "expression":
            f"!(request.namespace in {_quoted(policy.exempt_namespaces)})"},
    ]


def wants_ours_expression(policy: Policy) -> str:
    """True for a pod the policy steers: it names no scheduler or the default one (or, with
    override_other_schedulers, any scheduler but ours)."""
    if policy.override_other_schedulers:
        return f"!has(object.spec.schedulerName) || object.spec.schedulerName != {json.dumps(policy.scheduler)}"
    return (f"!has(object.spec.schedulerName) || object.spec.schedulerName == '' || "
            f"object.spec.schedulerName == '{DEFAULT_SCHEDULER}'")


def match_conditions(policy: Policy) -> list[dict]:
    """The webhook's (and the mutating policy's) matchConditions: only pods the policy steers reach it."""
    return exemption_conditions(policy) + [{"name": "not-on-the-wanted-scheduler",
                                            "expression": wants_ours_expression(policy)}]


def validation(policy: Policy) -> dict:
    """The ValidatingAdmissionPolicy's one validation: a matching pod that is still not on our scheduler fails."""
    return {"expression": f"!({wants_ours_expression(policy)})", "message": policy.message, "reason": "Forbidden"}


def apply_configuration(policy: Policy) -> str:
    """The MutatingAdmissionPolicy's mutation (patchType ApplyConfiguration)."""
    return f"Object{{spec: Object.spec{{schedulerName: {json.dumps(policy.scheduler)}}}}}"
