"""doctor on a hardened cluster: would admission let our pods in, and can the API server reach OPA?

* A server-side dry-run create of a representative privileged pod (what the gpu-operator's driver and toolkit pods
  need: privileged, host PID, a hostPath volume) in the operator's namespace, and of a restricted pod (what our own
  pods are) in each namespace of ours. Whatever rejects it — Pod Security Admission, Kyverno, Gatekeeper, any
  webhook — is quoted with the fix. Nothing is stored (dryRun=All).
* A NetworkPolicy that selects OPA's pods and admits no traffic to its port keeps the API server from calling the
  webhook: every GPU pod would then fail (or skip) admission.
"""
from __future__ import annotations

from gpu_bootstrap.core.errors import ClusterError
from gpu_bootstrap.security import pod_security
from gpu_bootstrap.core.outcomes import FAIL, PASS, WARN, Check

PROBE_NAME = "gpu-bootstrap-doctor-admission-probe"
PROBE_LABELS = {"app.kubernetes.io/name": PROBE_NAME, "app.kubernetes.io/managed-by": "gpu-bootstrap"}


def privileged_pod(namespace: str) -> dict:
    """Like the gpu-operator's driver pod: privileged, in the host's PID namespace, with a hostPath volume."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": PROBE_NAME, "namespace": namespace,
                                                            "labels": dict(PROBE_LABELS)},
            "spec": {"hostPID": True, "containers": [{
                "name": "probe", "image": "registry.k8s.io/pause:3.10",
                "securityContext": {"privileged": True},
                "volumeMounts": [{"name": "run-nvidia", "mountPath": "/run/nvidia"}]}],
                "volumes": [{"name": "run-nvidia", "hostPath": {"path": "/run/nvidia"}}]}}


def restricted_pod(namespace: str) -> dict:
    """Like our own pods (validation, OPA): passes the restricted profile."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": PROBE_NAME, "namespace": namespace,
                                                            "labels": dict(PROBE_LABELS)},
            "spec": {"automountServiceAccountToken": False, "securityContext": pod_security.restricted_pod(),
                     "containers": [{"name": "probe", "image": "registry.k8s.io/pause:3.10",
                                     "securityContext": pod_security.restricted_container()}]}}


def checks(ctx, playbook: set[str], opa_pods: tuple[dict, int]) -> list[tuple[str, Check]]:
    """(row id, Check) for the configured steps of `playbook`: pod admission in their namespaces, and the
    NetworkPolicies around OPA, whose pods carry the labels and serve the port of `opa_pods` (render/admission.py
    says them; the caller passes them, as this floor sits below render/)."""
    config = ctx.config
    rows = []
    if "gpu-operator" in playbook and config.gpu_operator.enabled:
        rows.append(("pod-security", _probe(ctx, config.gpu_operator.namespace, pod_security.PRIVILEGED)))
    ours = []
    if "admission-opa" in playbook and config.admission.enabled and config.admission.engine == "opa":
        ours.append(config.admission.opa.namespace)
    if "validate" in playbook and config.validation.enabled:
        ours.append(config.validation.namespace)
    for namespace in dict.fromkeys(ours):
        rows.append(("pod-security", _probe(ctx, namespace, pod_security.RESTRICTED)))
    if ours and config.admission.opa.namespace in ours:
        rows.append(("network-policy", network_policy_check(ctx, config.admission.opa.namespace, *opa_pods)))
    return rows


def _probe(ctx, namespace: str, level: str) -> Check:
    live = ctx.kube.get("v1", "Namespace", namespace)
    facts = {"namespace": namespace, "level": level}
    if live is None:
        return Check(PASS, f"namespace {namespace} does not exist yet: up creates it labelled "
                           f"{pod_security.ENFORCE}={level} (admission webhooks are checked once it exists)",
                     facts=facts)
    pod = privileged_pod(namespace) if level == pod_security.PRIVILEGED else restricted_pod(namespace)
    what = "a privileged pod (like the gpu-operator's driver)" if level == pod_security.PRIVILEGED else \
        "a pod that passes the restricted profile (like ours)"
    try:
        ctx.kube.create(pod, dry_run=True)
    except ClusterError as error:
        answer = error.message.split(" failed: ", 1)[-1]  # the server's own words, without our "POST path"
        if error.status not in (400, 403, 422) or "cannot create resource" in answer:
            # not an admission answer: an API problem, or RBAC (the dry run needs `create pods` there)
            return Check(WARN, f"could not check admission in {namespace}: {answer}", facts=facts)
        return Check(FAIL, f"admission rejects {what} in {namespace}: {answer} — "
                           f"{_fix(namespace, live, level, answer)}", facts=facts)
    enforced = pod_security.enforced(live) or "unlabelled"
    return Check(PASS, f"admission accepts {what} in {namespace} (server-side dry run; "
                       f"{pod_security.ENFORCE}: {enforced})", facts=facts)


def _fix(namespace: str, live: dict, level: str, message: str) -> str:
    if "PodSecurity" not in message:
        return (f"a policy engine or webhook (Kyverno, Gatekeeper, ...) rejects it: add an exception for namespace "
                f"{namespace}" + (" (the gpu-operator's pods need the host)" if level == pod_security.PRIVILEGED
                                  else ""))
    if level != pod_security.PRIVILEGED:
        return (f"namespace {namespace} enforces a level even our restricted pods fail: label it "
                f"{pod_security.ENFORCE}=restricted (kubectl label --overwrite namespace {namespace} "
                f"{pod_security.ENFORCE}=restricted)")
    if pod_security.ownership(live) == "ours":
        return f"run gpu-bootstrap up: it labels its namespace {namespace} {pod_security.ENFORCE}=privileged"
    return (f"namespace {namespace} is not gpu-bootstrap's, so up does not relabel it: kubectl label --overwrite "
            f"namespace {namespace} {pod_security.ENFORCE}=privileged")


# --- NetworkPolicies around OPA ----------------------------------------------------------------------------------------
def network_policy_check(ctx, namespace: str, pod_labels: dict, port: int) -> Check:
    try:
        policies = ctx.kube.list("networking.k8s.io/v1", "NetworkPolicy", namespace)
    except ClusterError as error:
        return Check(WARN, f"could not read the NetworkPolicies in {namespace}: {error.message}")
    blocking = blocking_policies(policies, pod_labels, port, "https")
    if blocking:
        return Check(WARN, f"NetworkPolicy {', '.join(blocking)} in {namespace} selects OPA's pods and admits no "
                           f"traffic to its port {port}: the API server's webhook calls would "
                           f"time out (every GPU pod rejected, or let through unchanged) — add an ingress rule "
                           f"for TCP {port} from the API server (e.g. ports: [{{port: "
                           f"{port}}}] with no `from`)")
    return Check(PASS, f"no NetworkPolicy in {namespace} keeps the API server from OPA's port "
                       f"{port}" + (f" ({len(policies)} checked)" if policies else ""))


def blocking_policies(policies: list[dict], pod_labels: dict, port: int, port_name: str) -> list[str]:
    """The names of the policies that select pods with `pod_labels` for ingress while no policy selecting them has
    a rule admitting `port` (NetworkPolicies add up: one that admits it is enough)."""
    selecting = [p for p in policies if _selects(p, pod_labels) and _ingress(p)]
    if not selecting:
        return []
    if any(_admits(rule, port, port_name) for p in selecting for rule in (p.get("spec") or {}).get("ingress") or []):
        return []
    return sorted(p["metadata"]["name"] for p in selecting)


def _ingress(policy: dict) -> bool:
    spec = policy.get("spec") or {}
    types = spec.get("policyTypes")
    return "Ingress" in types if types else True  # unset: Ingress always (plus Egress when egress rules exist)


def _selects(policy: dict, labels: dict) -> bool:
    selector = (policy.get("spec") or {}).get("podSelector") or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        if operator == "In" and labels.get(key) not in values or operator == "NotIn" and labels.get(key) in values \
                or operator == "Exists" and key not in labels or operator == "DoesNotExist" and key in labels:
            return False
    return True


def _admits(rule: dict, port: int, port_name: str) -> bool:
    ports = rule.get("ports")
    if not ports:
        return True  # no ports: every port
    for entry in ports:
        if entry.get("protocol", "TCP") != "TCP":
            continue
        wanted = entry.get("port")
        if wanted is None or wanted == port_name or str(wanted) == str(port) or (
                isinstance(wanted, int) and entry.get("endPort") and wanted <= port <= entry["endPort"]):
            return True
    return False
