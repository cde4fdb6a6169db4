"""What a GPU pod is, who is exempt, and the verdict, written twice from one definition: as Rego (v1 syntax) for OPA
and as CEL for the API server (webhook matchConditions, ValidatingAdmissionPolicy, MutatingAdmissionPolicy).

Pure functions of the admission settings. tests/test_admission_policy.py runs both on one table of AdmissionReview
fixtures with a real Rego engine and a real CEL runtime and requires the same verdicts.

A GPU pod: any container or init container whose limits or requests name `nvidia.com/gpu`, a MIG resource
(`nvidia.com/mig-*`) or a renamed shared resource time-slicing creates (`nvidia.com/gpu.shared`). Pods that ask for
nvidia.com/gpu and get it from DRA (KEP-5004) keep the request, and are GPU pods either way.

Where the GPUs are served through DRA (gpu_operator.allocation: dra), also a pod that names a ResourceClaimTemplate
or a ResourceClaim whose requests ask for one of NVIDIA's GPU DeviceClasses (GPU_CLAIM_CLASSES), directly or among
its firstAvailable alternatives. The pod carries only the claim's name, so neither OPA nor a plain CEL condition can
tell: that half is CEL with parameters (claim_conditions), a ValidatingAdmissionPolicy and, to steer, a
MutatingAdmissionPolicy, whose bindings select every template (or claim) in the pod's own namespace; the API server
evaluates the policy once per template, and `params` is the template. A pod with a claim of another class is not a
GPU pod, and neither is one naming a template that does not exist yet: what a claim asks for when the pod is
admitted is what counts (docs/steps/admission.md says what that leaves uncovered).

Exempt whatever the mode, and only where the system itself sent the request (docs/security.md): the fields a
pod's creator writes (spec.nodeName, ownerReferences, annotations) never exempt a pod on their own.
- a pod bound to a node (spec.nodeName), a mirror pod (the annotation) or a Node-owned pod, when a kubelet
  (user `system:node:<name>` in group `system:nodes`) creates it;
- a DaemonSet-owned pod in kube-system or the gpu-operator's namespace, when the DaemonSet controller creates it (its
  service account, or the controller manager's own identity on clusters that run without per-controller
  credentials). Not elsewhere: whoever may create a DaemonSet in a tenant namespace would otherwise exempt its pods;
- the gpu-operator's validation pods (they set nodeName and request a GPU), when the validator's service account
  creates them in the operator's namespace;
- every pod in an exempt namespace: kube-system, the scheduler's and OPA's own, and `admission.exempt_namespaces`
  (matched by the `kubernetes.io/metadata.name` label, which the API server sets and nobody can change).
A GPU pod that names a node and is not exempt is rejected in both modes: the scheduler never sees a bound pod, so
setting schedulerName on it would change nothing (and it would skip the GPU taint, a scheduler matter too).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from gpu_bootstrap.core.dra import GPU_CLAIM_CLASSES, IMPLICIT_GPU_RESOURCES, IMPLICIT_PREFIX  # noqa: F401
from gpu_bootstrap.render import device_access

DEFAULT_SCHEDULER = "default-scheduler"
IGNORE_LABEL = "gpu-bootstrap.io/admission"
IGNORE_VALUE = "ignore"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
BUILTIN_EXEMPT = ("kube-system",)
NODE_PREFIX = "system:node:"  # a kubelet's user name (Node authorizer); the only creator of mirror pods
NODES_GROUP = "system:nodes"  # and its group: the Node authorizer requires both, so do we
DAEMONSET_CONTROLLERS = ("system:serviceaccount:kube-system:daemon-set-controller",
                         "system:kube-controller-manager")  # the latter: --use-service-account-credentials=false
VALIDATOR_SERVICE_ACCOUNT = "nvidia-operator-validator"  # gpu-operator's assets/state-operator-validation


@dataclass(frozen=True)
class Policy:
    """Everything the verdict depends on (derived from the config by `of`)."""

    scheduler: str
    mode: str  # mutate | enforce
    exempt_namespaces: tuple[str, ...]
    override_other_schedulers: bool
    operator_namespace: str = "gpu-operator"  # where the gpu-operator's validator creates its pods
    # steer GPU pods to the bin-packing scheduler only while it runs (the admission step decides: deployed and
    # holding its Lease, or deployed by this very run before admission); otherwise they keep their scheduler
    steer: bool = True
    # the GPU taint's toleration (mode mutate adds it to the GPU pods it routes that do not tolerate the taint yet);
    # None when node-prep does not taint the GPU nodes
    toleration: dict | None = None
    claims: bool = False  # gpu_operator.allocation: dra: a pod naming a GPU claim (template) is a GPU pod too
    device_access: bool = True  # admission.device_access: GPUs only for pods given them (render/device_access.py)
    dra_namespace: str = ""  # allocation dra: the DRA driver's namespace, whose DaemonSets' pods are the system's

    @property
    def message(self) -> str:
        return (f"GPU pods must use the bin-packing scheduler: set spec.schedulerName: {self.scheduler} "
                f"(gpu-bootstrap admission; a cluster admin can exempt a namespace with admission.exempt_namespaces)")

    @property
    def node_message(self) -> str:
        return ("GPU pods may not name a node: remove spec.nodeName and use a nodeSelector on kubernetes.io/hostname, "
                f"so that the bin-packing scheduler ({self.scheduler}) places the pod (gpu-bootstrap admission)")

    @property
    def daemonset_namespaces(self) -> tuple[str, ...]:
        """Where a DaemonSet controller's pod is exempt: the system's, the gpu-operator's and (DRA mode) the DRA
        driver's namespaces only (the driver's kubelet plugin sets NVIDIA_MIG_CONFIG_DEVICES=all)."""
        return tuple(sorted({*BUILTIN_EXEMPT, self.operator_namespace, *([self.dra_namespace] if self.dra_namespace
                                                                          else [])}))

    @property
    def validator(self) -> str:
        return f"system:serviceaccount:{self.operator_namespace}:{VALIDATOR_SERVICE_ACCOUNT}"


CONFIG_TAINT = object()  # of(): the toleration of the config's own taint (node-prep enabled)


def of(config, steer: bool = True, taint=CONFIG_TAINT) -> Policy:
    """The policy the config asks for: exempt = kube-system, the scheduler's and (engine opa) OPA's own namespaces,
    plus admission.exempt_namespaces. The gpu-operator's namespace is not exempt as a whole: its DaemonSets' pods and
    its validator's pods are, by who creates them. `steer`: the bin-packing scheduler runs (or this run deploys it
    first); `taint`: the taint the GPU nodes carry (None: none), by default the config's when node-prep is on."""
    settings = config.admission
    # OPA's namespace only where OPA runs: with engine vap nothing of ours is there, and whoever may create namespaces
    # would create it and run GPU pods in it unsteered (docs/security.md, namespace squatting)
    opa = [settings.opa.namespace] if settings.engine == "opa" else []
    exempt = [*BUILTIN_EXEMPT, config.scheduler.namespace, *opa, *settings.exempt_namespaces]
    if taint is CONFIG_TAINT:
        section = config.node_prep
        taint = section.taint.as_taint() if section.enabled and section.taint else None
    dra = config.gpu_operator.allocation == "dra"
    return Policy(config.scheduler.name, settings.mode, tuple(sorted(set(exempt))),
                  settings.override_other_schedulers, config.gpu_operator.namespace, steer, toleration(taint),
                  dra, settings.device_access, config.gpu_operator.dra_driver.namespace if dra else "")


def toleration(taint: dict | None) -> dict | None:
    """The toleration admission adds for the GPU taint: exactly that taint (key, value and effect), so it tolerates
    nothing else and can be told from the `Exists` one the API server's ExtendedResourceToleration plugin adds."""
    if taint is None:
        return None
    found = {"key": taint["key"], "operator": "Equal", "value": taint.get("value", ""), "effect": taint["effect"]}
    return found if found["value"] else {"key": taint["key"], "operator": "Exists", "effect": taint["effect"]}


def namespace_selector(policy: Policy) -> dict:
    """Keeps the exempt namespaces out, by the name label the API server sets on every namespace (1.21+) and lets
    nobody change. No other label opts a namespace out: whoever may label a namespace could exempt it."""
    return {"matchExpressions": [
        {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": list(policy.exempt_namespaces)}]}


# --- Rego -------------------------------------------------------------------------------------------------------------
def rego(policy: Policy) -> str:
    """The policy OPA serves at its root path: data.system.main answers an admission.k8s.io/v1 AdmissionReview with
    the AdmissionReview response (a base64 JSONPatch when it mutates, a 403 for a GPU pod that names a node)."""
    if policy.override_other_schedulers:
        routed = """routed if true"""
        wants = """wants_ours if object.get(input.request.object.spec, "schedulerName", "") != scheduler"""
    else:
        routed = (f"""routed if object.get(input.request.object.spec, "schedulerName", "") in """
                  f"""{{"", "{DEFAULT_SCHEDULER}", scheduler}}""")
        wants = f"""wants_ours if object.get(input.request.object.spec, "schedulerName", "") in {{"", "{DEFAULT_SCHEDULER}"}}"""
    if policy.mode == "mutate":
        verdict = """changed := {
	"uid": input.request.uid,
	"allowed": true,
	"patchType": "JSONPatch",
	"patch": base64.encode(json.marshal(patches)),
}

patches := array.concat(array.concat(steering, tolerating), voiding)

steering := [{"op": "add", "path": "/spec/schedulerName", "value": scheduler}] if steer else := []

tolerating := [toleration_patch] if needs_toleration else := []

toleration_patch := {"op": "add", "path": "/spec/tolerations/-", "value": toleration} if {
	"tolerations" in object.keys(input.request.object.spec)
} else := {"op": "add", "path": "/spec/tolerations", "value": [toleration]}

changes if count(patches) > 0"""
    else:
        verdict = """changed := {
	"uid": input.request.uid,
	"allowed": false,
	"status": {"code": 403, "reason": "Forbidden", "message": message},
}

changes if steer"""
    taint = policy.toleration
    tolerates = "toleration := {}\n\nneeds_toleration if false  # node-prep does not taint the GPU nodes"
    if taint is not None and policy.mode == "mutate":
        tolerates = f"""toleration := {json.dumps(taint)}

needs_toleration if {{
	applies
	routed
	not tolerated
}}

tolerated if {{
	some t in object.get(input.request.object.spec, "tolerations", [])
	tolerates(t)
}}

tolerates(t) if {{
	object.get(t, "operator", "Equal") == "Exists"
	object.get(t, "key", "") in {{"", toleration.key}}
	object.get(t, "effect", "") in {{"", toleration.effect}}
}}

tolerates(t) if {{
	object.get(t, "operator", "Equal") == "Equal"
	object.get(t, "key", "") == toleration.key
	object.get(t, "value", "") == object.get(toleration, "value", "")
	object.get(t, "effect", "") in {{"", toleration.effect}}
}}"""
    steering_on = "steering_on if true" if policy.steer else "steering_on if false  # the scheduler does not run"
    implicit_gpu_resources = "{" + ", ".join(json.dumps(n) for n in IMPLICIT_GPU_RESOURCES) + "}"
    device_first, device_rules = "", ""
    if policy.device_access:
        device_first = "device_denied if {\n\tcount(device_violations) > 0\n} else := "
        device_rules = device_access.rego_rules(policy.mode == "mutate") + (
            _can_land_rego(policy) if policy.mode == "mutate" else "")
    voiding = ("voiding := [p | some p in void_patches]" if policy.device_access and policy.mode == "mutate"
               else "voiding := []")
    return f"""# Rendered by gpu-bootstrap (admission step): keep GPU pods on the bin-packing scheduler (while it runs) and
# let them tolerate the GPU nodes' taint.
# OPA evaluates data.system.main for a webhook that calls its root path.
package system

scheduler := {json.dumps(policy.scheduler)}

message := {json.dumps(policy.message)}

node_message := {json.dumps(policy.node_message)}

exempt_namespaces := {{{", ".join(json.dumps(n) for n in policy.exempt_namespaces)}}}

daemonset_controllers := {{{", ".join(json.dumps(n) for n in DAEMONSET_CONTROLLERS)}}}

daemonset_namespaces := {{{", ".join(json.dumps(n) for n in policy.daemonset_namespaces)}}}

operator_namespace := {json.dumps(policy.operator_namespace)}

validator := {json.dumps(policy.validator)}

main := {{
	"apiVersion": "admission.k8s.io/v1",
	"kind": "AdmissionReview",
	"response": response,
}}

response := {device_first}bound if {{
	names_a_node
}} else := changed if {{
	changes
}} else := {{"uid": input.request.uid, "allowed": true}}

{verdict}

bound := {{
	"uid": input.request.uid,
	"allowed": false,
	"status": {{"code": 403, "reason": "Forbidden", "message": node_message}},
}}

applies if {{
	input.request.operation == "CREATE"
	input.request.kind.kind == "Pod"
	not exempt
	gpu_pod
}}

# A bound pod never meets a scheduler: only the system may create one (see exempt).
names_a_node if {{
	applies
	node_name != ""
}}

steer if {{
	applies
	steering_on
	wants_ours
}}

{steering_on}

{tolerates}

node_name := object.get(input.request.object.spec, "nodeName", "")

# Who sent the request, as the API server authenticated it (not a field the pod's creator writes).
requester := object.get(input.request, ["userInfo", "username"], "")

groups := object.get(input.request, ["userInfo", "groups"], [])

by_a_node if {{
	startswith(requester, {json.dumps(NODE_PREFIX)})
	{json.dumps(NODES_GROUP)} in groups
}}

owned_by(kind) if {{
	some owner in object.get(input.request.object.metadata, "ownerReferences", [])
	owner.kind == kind
}}

exempt if input.request.namespace in exempt_namespaces

exempt if {{
	by_a_node
	node_name != ""
}}

exempt if {{
	by_a_node
	object.get(input.request.object.metadata, ["annotations", {json.dumps(MIRROR_ANNOTATION)}], null) != null
}}

exempt if {{
	by_a_node
	owned_by("Node")
}}

exempt if {{
	input.request.namespace in daemonset_namespaces
	requester in daemonset_controllers
	owned_by("DaemonSet")
}}

exempt if {{
	input.request.namespace == operator_namespace
	requester == validator
}}

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

gpu_resource(name) if name in {implicit_gpu_resources}

{wants}

{routed}

{voiding}
{device_rules}"""


def _can_land_rego(policy: Policy) -> str:
    """The pod can land on a GPU node (render/device_access.py): the GPU nodes carry no taint, or it tolerates the
    taint, names a node or asks for a GPU (then admission gives it the toleration)."""
    if policy.toleration is None:
        return "\ncan_land if true  # the GPU nodes carry no taint\n"
    return """
can_land if tolerated

can_land if node_name != ""

can_land if gpu_pod
"""


# --- CEL --------------------------------------------------------------------------------------------------------------
def _gpu_name(var: str) -> str:
    return (f"{var} == 'nvidia.com/gpu' || {var}.startsWith('nvidia.com/gpu.') || {var}.startsWith('nvidia.com/mig-') "
            f"|| {var} in {_quoted(IMPLICIT_GPU_RESOURCES)}")


def _quoted(names) -> str:
    return "[" + ", ".join(json.dumps(n) for n in names) + "]"


REQUESTER = "(has(request.userInfo) && has(request.userInfo.username) ? request.userInfo.username : '')"
GROUPS = "(has(request.userInfo) && has(request.userInfo.groups) ? request.userInfo.groups : [])"
NAMES_A_NODE = "has(object.spec.nodeName) && object.spec.nodeName != ''"


def _owned_by(kind: str) -> str:
    return f"(has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, o.kind == '{kind}'))"


def gpu_pod_condition() -> dict:
    """A container or init container asks for a GPU resource."""
    per_section = " || ".join(
        f"(has(c.resources.{s}) && c.resources.{s}.exists(r, {_gpu_name('r')}))" for s in ("limits", "requests"))
    return {"name": "gpu-pod", "expression":
            "(object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : []))"
            f".exists(c, has(c.resources) && ({per_section}))"}


CLAIM_FIELDS = {"ResourceClaimTemplate": ("resourceClaimTemplateName", "params.spec.spec"),
                "ResourceClaim": ("resourceClaimName", "params.spec")}


def claim_condition(kind: str) -> dict:
    """For a policy whose param is a ResourceClaimTemplate (or ResourceClaim): the pod names this one, and one of
    its requests asks for a GPU class, exactly or among its firstAvailable alternatives."""
    field, spec = CLAIM_FIELDS[kind]
    classes = _quoted(GPU_CLAIM_CLASSES)
    return {"name": "names-a-gpu-claim", "expression":
            f"has(object.spec.resourceClaims) && object.spec.resourceClaims.exists(c, "
            f"has(c.{field}) && c.{field} == params.metadata.name) && "
            f"has({spec}.devices) && has({spec}.devices.requests) && {spec}.devices.requests.exists(r, "
            f"(has(r.exactly) && r.exactly.deviceClassName in {classes}) || "
            f"(has(r.firstAvailable) && r.firstAvailable.exists(s, s.deviceClassName in {classes})))"}


def exemption_conditions(policy: Policy, gpu_pod: dict | None = None) -> list[dict]:
    """matchConditions (name, expression) that hold for a pod the policy applies to: a GPU pod (`gpu_pod`: by its
    resources, or claim_condition's) that is not exempt. Each exemption names who must have sent the request
    (request.userInfo, set by the API server's authenticator). Every field is guarded with has(), so no pod can make
    them fail to evaluate."""
    mirror = f"(has(object.metadata.annotations) && '{MIRROR_ANNOTATION}' in object.metadata.annotations)"
    return [
        gpu_pod or gpu_pod_condition(),
        {"name": "not-a-kubelet-bound-or-mirror-pod", "expression":
            f"!({REQUESTER}.startsWith('{NODE_PREFIX}') && '{NODES_GROUP}' in {GROUPS} && "
            f"(({NAMES_A_NODE}) || {mirror} || {_owned_by('Node')}))"},
        {"name": "not-a-daemonset-controller-pod", "expression":
            f"!(request.namespace in {_quoted(policy.daemonset_namespaces)} && "
            f"{REQUESTER} in {_quoted(DAEMONSET_CONTROLLERS)} && {_owned_by('DaemonSet')})"},
        {"name": "not-a-gpu-operator-validator-pod", "expression":
            f"!(request.namespace == {json.dumps(policy.operator_namespace)} && "
            f"{REQUESTER} == {json.dumps(policy.validator)})"},
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


def routed_expression(policy: Policy) -> str:
    """The pods admission routes: those it steers and those already on our scheduler or the default one (a pod on
    another scheduler is not ours to change, unless override_other_schedulers)."""
    if policy.override_other_schedulers:
        return "true"
    return (f"!has(object.spec.schedulerName) || object.spec.schedulerName in "
            f"['', '{DEFAULT_SCHEDULER}', {json.dumps(policy.scheduler)}]")


def tolerated_expression(policy: Policy) -> str:
    """The pod already tolerates the GPU taint (an `Exists` toleration of its key or of every key, or an `Equal` one
    of its key and value; no effect or the taint's)."""
    taint = policy.toleration
    key, value, effect = json.dumps(taint["key"]), json.dumps(taint.get("value", "")), json.dumps(taint["effect"])
    return ("has(object.spec.tolerations) && object.spec.tolerations.exists(t, "
            f"((has(t.operator) && t.operator == 'Exists') ? (!has(t.key) || t.key == '' || t.key == {key}) : "
            f"(has(t.key) && t.key == {key} && (has(t.value) ? t.value : '') == {value})) && "
            f"(!has(t.effect) || t.effect == '' || t.effect == {effect}))")


def _changes_expression(policy: Policy) -> str:
    """The pod gets changed: steered (while the scheduler runs), or given the toleration (mode mutate)."""
    parts = [f"({wants_ours_expression(policy)})"] if policy.steer else []
    if policy.toleration is not None and policy.mode == "mutate":
        parts.append(f"(({routed_expression(policy)}) && !({tolerated_expression(policy)}))")
    return " || ".join(parts) or "false"


def claim_conditions(policy: Policy, kind: str) -> list[dict]:
    """matchConditions of the ValidatingAdmissionPolicy whose param is a claim template (or claim): the pod names
    that GPU claim and is not exempt."""
    return exemption_conditions(policy, claim_condition(kind))


def claim_mutation_conditions(policy: Policy, kind: str) -> list[dict]:
    """The same for the MutatingAdmissionPolicy that steers such pods."""
    return claim_conditions(policy, kind) + mutation_conditions(policy)[len(exemption_conditions(policy)):]


def match_conditions(policy: Policy) -> list[dict]:
    """The webhook's matchConditions: only the pods OPA changes or rejects reach it (GPU pods it steers or gives the
    toleration, and those that name a node; with device access, pods it refuses for choosing devices and, in mode
    mutate, pods with a container it gives NVIDIA_VISIBLE_DEVICES=void)."""
    if not policy.device_access:
        return exemption_conditions(policy) + [{"name": "changed-or-bound", "expression":
                                                f"({NAMES_A_NODE}) || {_changes_expression(policy)}"}]
    gpu = gpu_pod_condition()["expression"]
    parts = [f"(request.operation == 'CREATE' && ({gpu}) && (({NAMES_A_NODE}) || {_changes_expression(policy)}))",
             device_violation(policy)]
    if policy.mode == "mutate":
        parts.append(f"({device_can_land(policy)} && {device_access.void_needed_cel(_gpu_name)})")
    return device_conditions(policy) + [{"name": "changed-bound-or-refused", "expression": " || ".join(parts)}]


# --- GPUs only for pods given them (render/device_access.py) -----------------------------------------------------
def device_conditions(policy: Policy) -> list[dict]:
    """The exemptions (who sent the request, which namespace), for any pod: what device access applies to."""
    return exemption_conditions(policy)[1:]


def device_violation(policy: Policy) -> str:
    """The pod chooses devices itself: a device variable in any container list, or NVIDIA's RuntimeClass on a pod
    that asks for no GPU (on CREATE)."""
    envs = " || ".join(device_access.env_violation_cel(kind) for kind in device_access.CONTAINER_LISTS)
    return f"({envs} || (request.operation == 'CREATE' && {device_access.runtime_violation_cel(_gpu_name)}))"


def device_validations() -> list[dict]:
    return device_access.validations(_gpu_name)


def device_can_land(policy: Policy) -> str:
    return device_access.can_land_cel(tolerated_expression(policy) if policy.toleration is not None else None,
                                      _gpu_name)


def device_mutation_conditions(policy: Policy) -> list[dict]:
    """The void MutatingAdmissionPolicy's matchConditions: an exempt pod's containers are left as they are, and
    only a pod that can land on a GPU node with a container to set is changed."""
    return device_conditions(policy) + [{"name": "can-land-on-a-gpu-node", "expression": device_can_land(policy)},
                                        {"name": "a-container-gets-void",
                                         "expression": device_access.void_needed_cel(_gpu_name)}]


def void_apply_configuration() -> str:
    return device_access.void_apply_configuration(_gpu_name)


def mutation_conditions(policy: Policy) -> list[dict]:
    """The MutatingAdmissionPolicy's matchConditions: the pods it steers or gives the toleration (a bound pod is left
    to the backstop)."""
    return exemption_conditions(policy) + [{"name": "not-bound-to-a-node", "expression": f"!({NAMES_A_NODE})"},
                                           {"name": "changed", "expression": _changes_expression(policy)}]


def validations(policy: Policy) -> list[dict]:
    """The ValidatingAdmissionPolicy's validations: a matching pod may not name a node, and, while the scheduler
    runs, one that is still not on it (after any mutation) fails. A missing toleration is not a reason to reject."""
    found = [{"expression": f"!({NAMES_A_NODE})", "message": policy.node_message, "reason": "Forbidden"}]
    if policy.steer:
        found.append({"expression": f"!({wants_ours_expression(policy)})", "message": policy.message,
                      "reason": "Forbidden"})
    return found


def apply_configuration(policy: Policy) -> str:
    """The MutatingAdmissionPolicy's scheduler mutation (patchType ApplyConfiguration)."""
    return f"Object{{spec: Object.spec{{schedulerName: {json.dumps(policy.scheduler)}}}}}"


def toleration_patch(policy: Policy) -> str:
    """The MutatingAdmissionPolicy's toleration mutation (patchType JSONPatch): appended, as a list's items cannot
    be merged by an apply configuration without replacing the pod's own tolerations."""
    taint = json.dumps(policy.toleration)
    return (f"!({routed_expression(policy)}) || ({tolerated_expression(policy)}) ? [] : "
            f"has(object.spec.tolerations) ? [JSONPatch{{op: 'add', path: '/spec/tolerations/-', value: {taint}}}] : "
            f"[JSONPatch{{op: 'add', path: '/spec/tolerations', value: [{taint}]}}]")


# --- OPA's own API ------------------------------------------------------------------------------------------------------
def authz_rego() -> str:
    """OPA's authorization policy (`--authorization=basic` evaluates data.system.authz.allow for every HTTP request,
    input = {method, path (the URL path split at '/'), params, headers, identity when a bearer token was sent, body}).

    The kube-apiserver calls a webhook without credentials (it sends a bearer token or client certificate only when
    the admission configuration file holds a kubeconfig for the webhook, which managed clusters do not let anyone
    set), so the decision path must be open to anonymous callers. That is harmless: POST / evaluates
    data.system.main on the caller's own input and returns only the verdict. Everything else (the policy and data
    APIs, queries, config, status, metrics) is refused to everybody: no token is configured, so nobody can manage
    this OPA over HTTP; its policy comes from the ConfigMap only."""
    return """# Rendered by gpu-bootstrap (admission-opa step): who may use OPA's HTTP API.
package system.authz

default allow := false

# The admission webhook: the API server POSTs an AdmissionReview to the root path (data.system.main).
allow if {
	input.method == "POST"
	input.path == [""]
}

# The kubelet's readiness and liveness probes.
allow if {
	input.method == "GET"
	input.path == ["health"]
}
"""
