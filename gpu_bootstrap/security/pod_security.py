"""Pod Security: the `pod-security.kubernetes.io/enforce` label each namespace we create or adopt carries, and the
security contexts that let our own pods pass the `restricted` profile.

* The gpu-operator's namespace, and the monitoring namespace in install mode, run privileged pods that are not ours
  (the operator's driver, toolkit and DCGM DaemonSets; kube-prometheus-stack's node-exporter uses the host's network,
  PID namespace and filesystem), so they are labelled `privileged` (NVIDIA's own advice for the operator).
* Our own namespaces (gpu-bootstrap's state and validation pods, OPA's) are labelled `restricted`: every pod we render
  there passes it.
* A namespace that exists and is not ours is never relabelled: the plan says which label it needs instead.
"""
from __future__ import annotations

from dataclasses import dataclass

ENFORCE = "pod-security.kubernetes.io/enforce"
PRIVILEGED, BASELINE, RESTRICTED = "privileged", "baseline", "restricted"
MANAGED_BY = "app.kubernetes.io/managed-by"
OURS = "gpu-bootstrap"

# Container and pod security contexts for the restricted profile (the image's own user may be root, so the pod
# names a non-root UID: runAsNonRoot alone would make the kubelet refuse to start a root image).
def restricted_container() -> dict:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def restricted_pod(uid: int = 1000) -> dict:
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "seccompProfile": {"type": "RuntimeDefault"}}


def labels(level: str) -> dict:
    return {MANAGED_BY: OURS, ENFORCE: level}


def namespace(name: str, level: str, extra_labels: dict | None = None) -> dict:
    """A namespace gpu-bootstrap creates: marked as ours (teardown removes it) and labelled for Pod Security."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {**labels(level), **(extra_labels or {})}}}


def ownership(live: dict | None) -> str:
    """missing / ours / theirs."""
    if live is None:
        return "missing"
    return "ours" if ((live.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY) == OURS else "theirs"


def enforced(live: dict | None) -> str | None:
    return (((live or {}).get("metadata") or {}).get("labels") or {}).get(ENFORCE)


@dataclass(frozen=True)
class NamespaceDecision:
    """What to do about one namespace: `action` create / label / none; `advice` for one that is not ours."""
    name: str
    level: str
    why: str
    state: str  # missing / ours / theirs
    action: str
    advice: str = ""
    purpose: str = "the namespace"

    def change(self, extra_labels: dict | None = None) -> tuple[str, str, dict] | None:
        """(what, why, manifest) of the namespace change to apply, or None."""
        if self.action == "none":
            return None
        label = f"{ENFORCE}={self.level}"
        if self.action == "create":
            return "create", f"{self.purpose}, labelled as ours so that teardown removes it, and {label}: {self.why}", \
                namespace(self.name, self.level, extra_labels)
        return f"label {label}", self.why, namespace(self.name, self.level, extra_labels)


def decide(name: str, live: dict | None, level: str, why: str, purpose: str = "the namespace") -> NamespaceDecision:
    """Create a missing namespace labelled `level`, label ours when its label differs, and never touch theirs: for a
    namespace that is not ours and not labelled `level`, `advice` says which label it needs (only a `privileged`
    need is worth saying: our restricted pods pass any level)."""
    state = ownership(live)
    if state == "missing":
        return NamespaceDecision(name, level, why, state, "create", purpose=purpose)
    current = enforced(live)
    if state == "ours":
        return NamespaceDecision(name, level, why, state, "label" if current != level else "none", purpose=purpose)
    advice = ""
    if level == PRIVILEGED and current != PRIVILEGED:
        advice = (f"namespace {name} is not gpu-bootstrap's, so it is not relabelled; it needs {ENFORCE}={level} "
                  f"({why}; now {current or 'unlabelled: the cluster default applies'}): "
                  f"kubectl label namespace {name} {ENFORCE}={level}")
    return NamespaceDecision(name, level, why, state, "none", advice, purpose)
