"""GPUs only for pods that were given them: what admission refuses and sets so that no container reaches a GPU by
naming it itself, written as CEL (ValidatingAdmissionPolicy, MutatingAdmissionPolicy, webhook matchConditions) and as
Rego (OPA) from one definition. Pure.

NVIDIA's container runtime picks the GPUs a container sees from variables in its environment (nvidia-container-toolkit
`internal/config/image/cuda_image.go`): NVIDIA_VISIBLE_DEVICES (`all`, indexes or UUIDs), NVIDIA_MIG_CONFIG_DEVICES,
NVIDIA_MIG_MONITOR_DEVICES and NVIDIA_IMEX_CHANNELS. In legacy mode (the default runtime before gpu-operator 25.10, and
whenever a pod names the `nvidia` or `nvidia-legacy` RuntimeClass) a container that sets NVIDIA_VISIBLE_DEVICES=all gets
every GPU of its node while the scheduler, quotas and `status` count none. The runtime side (render/gpu_operator_values.py,
`accept-nvidia-visible-devices-envvar-when-unprivileged = false`) closes that where we install the toolkit; admission
closes it for what a pod's spec says, on every node:

* refused: a container, init container or ephemeral container that sets one of DEVICE_VARIABLES to anything but
  `void`, `none` or empty (none of which selects a GPU), or takes it from `valueFrom` (a value admission cannot see).
  GPU containers included: the device plugin or CDI sets their value, never the pod's author. A privileged container,
  or one that adds CAP_SYS_ADMIN, is left alone: the toolkit itself counts such a container as privileged
  (`image/privileged.go`), it reaches every device of its node anyway, and Pod Security decides who may run it.
* refused: a pod that asks for no GPU and names one of NVIDIA's RuntimeClasses (RUNTIME_CLASSES).
* set (mode mutate): NVIDIA_VISIBLE_DEVICES=void on every container that is given no GPU, in a pod that can land on a
  GPU node (it tolerates the GPU taint, names a node, asks for a GPU, or the GPU nodes carry no taint), so that an
  image's own value (CUDA images set NVIDIA_VISIBLE_DEVICES=all) selects nothing. A container that asks for a GPU
  (or names a claim), sets the variable itself (then the rule above judges it) or is privileged is left as it is.

What the spec does not show stays with the runtime side: `envFrom` (a ConfigMap's or Secret's keys are not known
at admission) and an image's own environment in mode enforce (docs/security.md).
"""
from __future__ import annotations

import json

DEVICE_VARIABLES = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES",
                    "NVIDIA_IMEX_CHANNELS")
NO_DEVICE_VALUES = ("void", "none", "")  # the toolkit: void and empty select nothing, none the driver but no device
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
# The RuntimeClasses the gpu-operator creates (assets/pre-requisites: `nvidia` always, `nvidia-legacy` and
# `nvidia-cdi` with CDI on, the default from 25.10): all three run NVIDIA's runtime, which reads the variables.
RUNTIME_CLASSES = ("nvidia", "nvidia-legacy", "nvidia-cdi")
SYS_ADMIN = ("SYS_ADMIN", "CAP_SYS_ADMIN")
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
EPHEMERAL = "ephemeralcontainers"  # the subresource `kubectl debug` adds ephemeral containers through

ENV_MESSAGE = ("a pod may not choose GPUs through its environment (only void or none): ask for nvidia.com/gpu in "
               "resources.limits, and the device plugin or DRA hands the container its GPUs (gpu-bootstrap admission)")
RUNTIME_MESSAGE = ("NVIDIA's runtime classes are for pods that are given a GPU; this pod asks for none (remove "
                   "runtimeClassName, or ask for nvidia.com/gpu) (gpu-bootstrap admission)")


def _quoted(names) -> str:
    return "[" + ", ".join(json.dumps(n) for n in names) + "]"


# --- CEL ------------------------------------------------------------------------------------------------------------
def privileged_cel(c: str) -> str:
    """The container is privileged, or adds CAP_SYS_ADMIN (the toolkit's own test)."""
    return (f"(has({c}.securityContext) && ((has({c}.securityContext.privileged) && {c}.securityContext.privileged) || "
            f"(has({c}.securityContext.capabilities) && has({c}.securityContext.capabilities.add) && "
            f"{c}.securityContext.capabilities.add.exists(a, a in {_quoted(SYS_ADMIN)}))))")


def bad_variable_cel(e: str) -> str:
    """An env entry that selects devices: one of DEVICE_VARIABLES with a value other than void/none/empty, or one
    from valueFrom."""
    return (f"({e}.name in {_quoted(DEVICE_VARIABLES)} && (has({e}.valueFrom) || "
            f"!((has({e}.value) ? {e}.value : '') in {_quoted(NO_DEVICE_VALUES)})))")


def bad_container_cel(c: str) -> str:
    return f"(!{privileged_cel(c)} && has({c}.env) && {c}.env.exists(e, {bad_variable_cel('e')}))"


def env_violation_cel(kind: str) -> str:
    """Some container of this list (containers, initContainers, ephemeralContainers) chooses devices itself."""
    return f"(has(object.spec.{kind}) && object.spec.{kind}.exists(c, {bad_container_cel('c')}))"


def env_message_cel(kind: str) -> str:
    """The denial, naming the field: spec.<kind>[<container>].env[<variable>]."""
    first = f"object.spec.{kind}.filter(c, {bad_container_cel('c')})[0]"
    return (f"'spec.{kind}[' + {first}.name + '].env[' + {first}.env.filter(e, {bad_variable_cel('e')})[0].name + "
            f"']: ' + {json.dumps(ENV_MESSAGE)}")


def asks_for_gpu_cel(gpu_name) -> str:
    """The pod asks for a GPU by a resource (`gpu_name`: the GPU resource test of a variable) or names a claim."""
    per = " || ".join(f"(has(c.resources.{s}) && c.resources.{s}.exists(r, {gpu_name('r')}))"
                      for s in ("limits", "requests"))
    return ("((object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : []))"
            f".exists(c, has(c.resources) && ({per})) || (has(object.spec.resourceClaims) && "
            "size(object.spec.resourceClaims) > 0))")


def runtime_violation_cel(gpu_name) -> str:
    return (f"(has(object.spec.runtimeClassName) && object.spec.runtimeClassName in {_quoted(RUNTIME_CLASSES)} && "
            f"!{asks_for_gpu_cel(gpu_name)})")


def validations(gpu_name) -> list[dict]:
    """The ValidatingAdmissionPolicy's validations, each naming the field it refuses."""
    found = [{"expression": f"!{env_violation_cel(kind)}", "messageExpression": env_message_cel(kind),
              "message": f"spec.{kind}[*].env: {ENV_MESSAGE}", "reason": "Forbidden"} for kind in CONTAINER_LISTS]
    found.append({"expression": f"request.operation != 'CREATE' || !{runtime_violation_cel(gpu_name)}",
                  "message": f"spec.runtimeClassName: {RUNTIME_MESSAGE}", "reason": "Forbidden"})
    return found


def container_gets_void_cel(c: str, gpu_name) -> str:
    """A container that is given no GPU, sets no NVIDIA_VISIBLE_DEVICES and is not privileged: it gets
    NVIDIA_VISIBLE_DEVICES=void."""
    per = " || ".join(f"(has({c}.resources.{s}) && {c}.resources.{s}.exists(r, {gpu_name('r')}))"
                      for s in ("limits", "requests"))
    return (f"(!{privileged_cel(c)} && !(has({c}.resources) && ({per} || (has({c}.resources.claims) && "
            f"size({c}.resources.claims) > 0))) && !(has({c}.env) && {c}.env.exists(e, e.name == "
            f"'NVIDIA_VISIBLE_DEVICES')))")


NEW_EPHEMERAL = ("!(has(oldObject.spec.ephemeralContainers) && "
                 "oldObject.spec.ephemeralContainers.exists(o, o.name == c.name))")  # existing ones are immutable


def can_land_cel(tolerated: str | None, gpu_name) -> str:
    """The pod can land on a GPU node: the GPU nodes carry no taint (`tolerated` None), or it tolerates the taint
    (`tolerated`: the toleration test), names a node, or asks for a GPU (admission gives it the toleration)."""
    if tolerated is None:
        return "true"
    return (f"(({tolerated}) || (has(object.spec.nodeName) && object.spec.nodeName != '') || "
            f"{asks_for_gpu_cel(gpu_name)})")


def _needs(kind: str, gpu_name) -> str:
    extra = f" && {NEW_EPHEMERAL}" if kind == "ephemeralContainers" else ""
    return f"{container_gets_void_cel('c', gpu_name)}{extra}"


def void_needed_cel(gpu_name) -> str:
    """Some container gets void: on CREATE a container or init container, on an ephemeral-container UPDATE a new
    ephemeral container."""
    create = " || ".join(f"(has(object.spec.{k}) && object.spec.{k}.exists(c, {_needs(k, gpu_name)}))"
                         for k in ("containers", "initContainers"))
    update = f"(has(object.spec.ephemeralContainers) && object.spec.ephemeralContainers.exists(c, " \
             f"{_needs('ephemeralContainers', gpu_name)}))"
    return f"(request.operation == 'CREATE' ? ({create}) : {update})"


def _apply(kinds: tuple[str, ...], gpu_name) -> str:
    items = []
    for kind in kinds:
        item = (f"Object.spec.{kind}{{name: c.name, env: [Object.spec.{kind}.env{{name: 'NVIDIA_VISIBLE_DEVICES', "
                f"value: 'void'}}]}}")
        items.append(f"{kind}: object.spec.{kind}.filter(c, {_needs(kind, gpu_name)}).map(c, {item})")
    return f"Object{{spec: Object.spec{{{', '.join(items)}}}}}"


def void_apply_configuration(gpu_name) -> str:
    """The MutatingAdmissionPolicy's mutation (ApplyConfiguration): containers and env are lists keyed by name, so
    the entries merge into the pod's own and nothing else of it changes."""
    create = (f"has(object.spec.initContainers) ? {_apply(('containers', 'initContainers'), gpu_name)} : "
              f"{_apply(('containers',), gpu_name)}")
    return f"request.operation == 'CREATE' ? ({create}) : {_apply(('ephemeralContainers',), gpu_name)}"


# --- Rego -----------------------------------------------------------------------------------------------------------
def rego_rules(mutate: bool) -> str:
    """Rules appended to the admission policy's package (render/admission_policy.rego): device_denied (with its
    message) and, in mode mutate, void_patches."""
    rules = f"""
# --- GPUs only for pods that were given them (render/device_access.py) ---
device_variables := {{{", ".join(json.dumps(v) for v in DEVICE_VARIABLES)}}}

no_device_values := {{{", ".join(json.dumps(v) for v in NO_DEVICE_VALUES)}}}

nvidia_runtime_classes := {{{", ".join(json.dumps(v) for v in RUNTIME_CLASSES)}}}

env_message := {json.dumps(ENV_MESSAGE)}

runtime_message := {json.dumps(RUNTIME_MESSAGE)}

device_scope if {{
	input.request.operation == "CREATE"
	input.request.kind.kind == "Pod"
	object.get(input.request, "subResource", "") == ""
	not exempt
}}

device_scope if {{
	input.request.operation == "UPDATE"
	input.request.subResource == "{EPHEMERAL}"
	not exempt
}}

container_privileged(c) if object.get(c, ["securityContext", "privileged"], false) == true

container_privileged(c) if {{
	some cap in object.get(c, ["securityContext", "capabilities", "add"], [])
	cap in {{{", ".join(json.dumps(v) for v in SYS_ADMIN)}}}
}}

bad_variable(e) if {{
	e.name in device_variables
	"valueFrom" in object.keys(e)
}}

bad_variable(e) if {{
	e.name in device_variables
	not object.get(e, "value", "") in no_device_values
}}

device_violations contains sprintf("spec.%s[%s].env[%s]", [kind, c.name, e.name]) if {{
	device_scope
	some kind in ["containers", "initContainers", "ephemeralContainers"]
	some c in object.get(input.request.object.spec, kind, [])
	not container_privileged(c)
	some e in object.get(c, "env", [])
	bad_variable(e)
}}

device_violations contains "spec.runtimeClassName" if {{
	device_scope
	input.request.operation == "CREATE"
	object.get(input.request.object.spec, "runtimeClassName", "") in nvidia_runtime_classes
	not asks_for_gpu
}}

asks_for_gpu if gpu_pod

asks_for_gpu if count(object.get(input.request.object.spec, "resourceClaims", [])) > 0

device_message := concat("; ", [sprintf("%s: %s", [v, msg]) |
	some v in sort(device_violations)
	msg := violation_message(v)
])

violation_message(v) := runtime_message if v == "spec.runtimeClassName"

violation_message(v) := env_message if v != "spec.runtimeClassName"

device_denied := {{
	"uid": input.request.uid,
	"allowed": false,
	"status": {{"code": 403, "reason": "Forbidden", "message": device_message}},
}}
"""
    if mutate:
        rules += f"""
gpu_container(c) if {{
	some section in ["limits", "requests"]
	some name, _ in object.get(c, ["resources", section], {{}})
	gpu_resource(name)
}}

gpu_container(c) if count(object.get(c, ["resources", "claims"], [])) > 0

gets_void(c) if {{
	not container_privileged(c)
	not gpu_container(c)
	not sets_visible_devices(c)
}}

sets_visible_devices(c) if {{
	some e in object.get(c, "env", [])
	e.name == "NVIDIA_VISIBLE_DEVICES"
}}

old_ephemeral contains c.name if some c in object.get(input.request, ["oldObject", "spec", "ephemeralContainers"], [])

void_kinds := ["containers", "initContainers"] if input.request.operation == "CREATE" else := ["ephemeralContainers"]

void_patches contains patch if {{
	device_scope
	can_land
	some kind in void_kinds
	some i, c in object.get(input.request.object.spec, kind, [])
	not c.name in old_ephemeral
	gets_void(c)
	patch := void_patch(kind, i, c)
}}

void_patch(kind, i, c) := {{"op": "add", "path": sprintf("/spec/%s/%d/env/-", [kind, i]), "value": {json.dumps(VOID)}}} if {{
	"env" in object.keys(c)
}} else := {{"op": "add", "path": sprintf("/spec/%s/%d/env", [kind, i]), "value": [{json.dumps(VOID)}]}}
"""
    return rules
