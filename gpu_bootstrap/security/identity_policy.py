"""What RBAC cannot say, said by admission: the ValidatingAdmissionPolicy (and its binding) that `rbac` emits with the
roles of an identity that must not write for real.

RBAC has no dry-run verb: the API server authorizes a server-side dry run of a write exactly like the write, so a
role that lets `up --dry-run` dry-run a privileged DaemonSet lets its holder create one. Admission sees whether a
request is a dry run (`request.dryRun`), and a policy matched on the identity's user name holds it there:
  dry      (`--for dry-run`, `--for doctor`): every create, update, delete and connect of the identity must be a dry
           run; a real one is denied (failurePolicy Fail: an error denies too).
  probe    (`--for probe`): as dry, but for the in-cluster node probe's own objects: a Namespace named
           gpu-bootstrap-probe-* that carries the probe's labels (create, delete), and a ConfigMap or pod created
           inside one.
Admission does not run for the admission configuration kinds themselves (webhook configurations, admission policies
and their bindings), so the roles of these identities hold no write on those kinds (security/rbac.py), and nothing
of theirs may change this policy. Needs admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes 1.30).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from gpu_bootstrap.core.objects import PROBE_COMPONENT, PROBE_NAMESPACE_PREFIX

POLICY_API = "admissionregistration.k8s.io/v1"
SINCE = (1, 30)  # ValidatingAdmissionPolicy v1 is served from 1.30
LABELS = {"app.kubernetes.io/managed-by": "gpu-bootstrap", "app.kubernetes.io/component": "rbac"}
DRY = "has(request.dryRun) && request.dryRun == true"


def username(service_account: str) -> str:
    """The user name the API server authenticates a ServiceAccount's tokens as."""
    namespace, _, name = service_account.partition("/")
    return f"system:serviceaccount:{namespace}:{name}"


def policy_name(command: str, service_account: str) -> str:
    namespace, _, name = service_account.partition("/")
    return f"gpu-bootstrap-{command}-only.{namespace}.{name}"[:253]


@dataclass(frozen=True)
class ProbePins:
    """What the node probe makes, exactly (app/rbac.py derives it from probes/incluster.py and the config), so the
    probe identity's policy admits those objects and nothing else: its namespace's labels, its ConfigMap's name and
    script, its pods' nodes, image, commands, host access."""

    namespace_labels: dict[str, str]  # every label the namespace carries but the run label (and the server's name label)
    run_label: str
    configmap: str  # the ConfigMap's name
    script_key: str
    script_head: str  # the script before its per-run marker ("GB_MARK='")
    marker_pattern: str  # RE2 of the marker
    marker_length: int
    script_tail: str  # everything after the marker
    nodes: tuple[str, ...] | None  # the configured GPU nodes by name; None: a label selector (any node)
    image: str
    init_commands: tuple[tuple[str, ...], ...]
    main_commands: tuple[tuple[str, ...], ...]
    host_volume: str  # the one hostPath volume's name (mounted read-only)
    host_path: str


def _labels_exactly(obj: str, pins: ProbePins) -> str:
    """The namespace carries exactly the probe's labels (and the API server's kubernetes.io/metadata.name): no
    label of the creator's choosing beside them, the run label naming this namespace's own run."""
    allowed = _quoted(sorted([*pins.namespace_labels, pins.run_label, "kubernetes.io/metadata.name"]))
    values = " && ".join(f"{obj}.metadata.labels[{json.dumps(k)}] == {json.dumps(v)}"
                         for k, v in sorted(pins.namespace_labels.items()))
    return (f"has({obj}.metadata.labels) && {obj}.metadata.labels.all(k, k in {allowed}) && "
            f"{_quoted(sorted(pins.namespace_labels))}.all(k, k in {obj}.metadata.labels) && {values} && "
            f"{json.dumps(pins.run_label)} in {obj}.metadata.labels && "
            f"{json.dumps(PROBE_NAMESPACE_PREFIX)} + {obj}.metadata.labels[{json.dumps(pins.run_label)}] == "
            f"{obj}.metadata.name")


def _probe_pod(pins: ProbePins) -> str:
    """The probe's pod and nothing like it: on a configured GPU node (bound by name), every container the probe's
    image and command, no ephemeral container, no host namespace, one hostPath (the host's /, read-only)."""
    containers = "(object.spec.initContainers + object.spec.containers)"
    nodes = (f"object.spec.nodeName in {_quoted(pins.nodes)}" if pins.nodes is not None
             else "object.spec.nodeName != ''")
    host = json.dumps(pins.host_volume)
    return (f"has(object.spec.nodeName) && {nodes} && has(object.spec.initContainers) && "
            f"{containers}.all(c, c.image == {json.dumps(pins.image)}) && "
            f"object.spec.initContainers.map(c, has(c.command) ? c.command : []) == "
            f"{json.dumps([list(c) for c in pins.init_commands])} && "
            f"object.spec.containers.map(c, has(c.command) ? c.command : []) == "
            f"{json.dumps([list(c) for c in pins.main_commands])} && "
            f"{containers}.all(c, !has(c.args)) && !has(object.spec.ephemeralContainers) && "
            f"!(has(object.spec.hostPID) && object.spec.hostPID) && "
            f"!(has(object.spec.hostNetwork) && object.spec.hostNetwork) && "
            f"!(has(object.spec.hostIPC) && object.spec.hostIPC) && "
            f"(!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath) || (v.name == {host} && "
            f"v.hostPath.path == {json.dumps(pins.host_path)}))) && "
            f"{containers}.all(c, !has(c.volumeMounts) || c.volumeMounts.all(m, m.name != {host} || "
            f"(has(m.readOnly) && m.readOnly)))")


def _probe_script(pins: ProbePins) -> str:
    """The probe's ConfigMap: its name, one key, the probe script of this gpu-bootstrap as it is (its per-run
    marker aside): what the probe pod's shell runs as root on the node."""
    key = json.dumps(pins.script_key)
    script = f"object.data[{key}]"
    size = len(pins.script_head) + pins.marker_length + len(pins.script_tail)
    return (f"object.metadata.name == {json.dumps(pins.configmap)} && has(object.data) && size(object.data) == 1 && "
            f"{key} in object.data && size({script}) == {size} && "
            f"{script}.matches({json.dumps('^' + re.escape(pins.script_head) + pins.marker_pattern)}) && "
            f"{script}.endsWith({json.dumps(pins.script_tail)}) && !has(object.binaryData)")


def _quoted(names) -> str:
    return "[" + ", ".join(json.dumps(n) for n in names) + "]"


def _probe_objects(pins: ProbePins | None = None) -> str:
    """The node probe's own objects, by their names and labels (probes/incluster.py makes them so); with `pins`,
    exactly as it makes them."""
    prefix = json.dumps(PROBE_NAMESPACE_PREFIX)
    component = json.dumps(next(iter(PROBE_COMPONENT)))
    value = json.dumps(next(iter(PROBE_COMPONENT.values())))

    def labelled(obj: str) -> str:
        return f"has({obj}.metadata.labels) && {component} in {obj}.metadata.labels && " \
               f"{obj}.metadata.labels[{component}] == {value}"
    whole = '(!has(request.subResource) || request.subResource == "")'
    created = labelled("object") if pins is None else _labels_exactly("object", pins)
    namespace = (f'(request.resource.group == "" && request.resource.resource == "namespaces" && {whole} && '
                 f'has(request.name) && request.name.startsWith({prefix}) && '
                 f'((request.operation == "CREATE" && {created}) || '
                 f'(request.operation == "DELETE" && {labelled("oldObject")})))')
    if pins is None:
        kinds = ('((request.resource.group == "" && request.resource.resource == "configmaps") || '
                 '(request.resource.group == "" && request.resource.resource == "pods"))')
    else:
        kinds = (f'((request.resource.group == "" && request.resource.resource == "configmaps" && '
                 f'{_probe_script(pins)}) || (request.resource.group == "" && request.resource.resource == "pods" && '
                 f'{_probe_pod(pins)}))')
    inside = (f'(request.operation == "CREATE" && {whole} && {kinds} && '
              f'has(request.namespace) && request.namespace.startsWith({prefix}))')
    return f"{namespace} || {inside}"


def manifests(command: str, service_account: str, pins: ProbePins | None = None) -> list[dict]:
    """The policy and its binding for the identity of `service_account` (namespace/name), for `command`: dry-run or
    doctor (kept dry), probe (kept to the probe's objects, exactly as `pins` says it makes them)."""
    name = policy_name(command, service_account)
    user = username(service_account)
    if command == "probe":
        expression = f"({DRY}) || {_probe_objects(pins)}"
        nodes = ", ".join(pins.nodes) if pins is not None and pins.nodes is not None else "the GPU nodes"
        message = (f"{user} is the in-cluster node probe's identity (gpu-bootstrap rbac --for probe): it may write "
                   f"for real only the probe's own namespaces ({PROBE_NAMESPACE_PREFIX}*, with exactly the probe's "
                   f"labels), their ConfigMap holding this gpu-bootstrap's probe script, and the probe's pods on "
                   f"{nodes} (its image, its commands, the host's / read-only); anything else only as a server-side "
                   f"dry run; regenerate this policy with the gpu-bootstrap version that runs the probe")
    else:
        expression = DRY
        message = (f"{user} is a dry-run identity (gpu-bootstrap rbac --for {command}): its requests must be "
                   f"server-side dry runs (dryRun=All); nothing it sends is stored")
    policy = {"apiVersion": POLICY_API, "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": name, "labels": dict(LABELS)},
              "spec": {"failurePolicy": "Fail",
                       "matchConstraints": {"resourceRules": [{
                           "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"],  # every resource and subresource
                           "operations": ["CREATE", "UPDATE", "DELETE", "CONNECT"]}]},
                       "matchConditions": [{"name": "this-identity",
                                            "expression": f"request.userInfo.username == {json.dumps(user)}"}],
                       "validations": [{"expression": expression, "message": message, "reason": "Forbidden"}]}}
    binding = {"apiVersion": POLICY_API, "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": name, "labels": dict(LABELS)},
               "spec": {"policyName": name, "validationActions": ["Deny"]}}
    return [policy, binding]


def served(kube_version: str) -> bool:
    """Does a cluster of this version serve ValidatingAdmissionPolicy v1?"""
    parts = [int(p) for p in kube_version.lstrip("v").split(".")[:2]]
    return tuple(parts) >= SINCE
