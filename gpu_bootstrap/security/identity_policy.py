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


def _probe_objects() -> str:
    """The node probe's own objects, by their names and labels (probes/incluster.py makes them so)."""
    prefix = json.dumps(PROBE_NAMESPACE_PREFIX)
    component = json.dumps(next(iter(PROBE_COMPONENT)))
    value = json.dumps(next(iter(PROBE_COMPONENT.values())))

    def labelled(obj: str) -> str:
        return f"has({obj}.metadata.labels) && {component} in {obj}.metadata.labels && " \
               f"{obj}.metadata.labels[{component}] == {value}"
    whole = '(!has(request.subResource) || request.subResource == "")'
    namespace = (f'(request.resource.group == "" && request.resource.resource == "namespaces" && {whole} && '
                 f'has(request.name) && request.name.startsWith({prefix}) && '
                 f'((request.operation == "CREATE" && {labelled("object")}) || '
                 f'(request.operation == "DELETE" && {labelled("oldObject")})))')
    inside = (f'(request.operation == "CREATE" && {whole} && '
              f'((request.resource.group == "" && request.resource.resource == "configmaps") || '
              f'(request.resource.group == "" && request.resource.resource == "pods")) && '
              f'has(request.namespace) && request.namespace.startsWith({prefix}))')
    return f"{namespace} || {inside}"


def manifests(command: str, service_account: str) -> list[dict]:
    """The policy and its binding for the identity of `service_account` (namespace/name), for `command`: dry-run or
    doctor (kept dry), probe (kept to the probe's objects)."""
    name = policy_name(command, service_account)
    user = username(service_account)
    if command == "probe":
        expression = f"({DRY}) || {_probe_objects()}"
        message = (f"{user} is the in-cluster node probe's identity (gpu-bootstrap rbac --for probe): it may write "
                   f"for real only the probe's own namespaces ({PROBE_NAMESPACE_PREFIX}*), their ConfigMap and "
                   f"pods; anything else only as a server-side dry run")
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
