"""Pure helpers over Kubernetes objects and value trees, shared by the steps and the engine: drift between what we
want and what the cluster has, value paths in helm's --set syntax, Helm's merge rule, optimistic concurrency, pod
diagnosis and lease freshness."""
from __future__ import annotations

import datetime as _dt
import re


# --- value trees -----------------------------------------------------------------------------------------------------
def differences(desired, live, path: str = "") -> list[str]:
    """Paths where `live` does not hold what `desired` says. Fields only in `live` (defaults, status) are fine."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return [path or "."]
        found = []
        for key, value in desired.items():
            found += differences(value, live.get(key), f"{path}.{key}" if path else key)
        return found
    if isinstance(desired, list):
        if not isinstance(live, list) or len(live) != len(desired):
            return [path]
        found = []
        for index, (want, have) in enumerate(zip(desired, live)):
            found += differences(want, have, f"{path}[{index}]")
        return found
    return [] if desired == live or str(desired) == str(live) and live is not None else [path]


# A path names a value the way helm's --set does: keys joined by `.`, a `.` inside a key escaped as `\.`
# (grafana's `grafana.ini`, a label key `nvidia.com/gpu.present`).
def escape_key(key) -> str:
    return str(key).replace("\\", "\\\\").replace(".", "\\.")


def join_path(prefix: str, key) -> str:
    return f"{prefix}.{escape_key(key)}" if prefix else escape_key(key)


def path_keys(path: str) -> list[str]:
    """The keys of a path: split at every `.` that is not escaped, escapes undone."""
    keys = [""]
    for escaped, plain, dot in re.findall(r"\\(.)|([^.\\]+)|(\.)", path):
        if dot:
            keys.append("")
        else:
            keys[-1] += escaped or plain
    return keys


def deep_merge(base: dict, overlay: dict) -> dict:
    """Helm's rule: maps merge key by key, everything else (lists included) is replaced. Returns a new tree."""
    out = dict(base)
    for key, value in (overlay or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def pin_resource_version(body: dict, live: dict | None) -> dict:
    """Optimistic concurrency: carry the resourceVersion we read, so that if the object changed since, the API
    answers 409 and the runner re-reads and re-plans instead of overwriting someone else's change."""
    version = ((live or {}).get("metadata") or {}).get("resourceVersion")
    if version:
        body.setdefault("metadata", {})["resourceVersion"] = version
    return body


# --- nodes ------------------------------------------------------------------------------------------------------------
def condition_true(obj: dict | None, kind: str) -> bool:
    """Whether the object's status has a condition of this type that is True (a missing object: no)."""
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in ((obj or {}).get("status") or {}).get("conditions") or [])


def node_ready(node: dict) -> bool:
    return condition_true(node, "Ready")


def room_for_platform(nodes: list[dict], gpu_nodes: set[str], taint: dict | None) -> list[str] | None:
    """The nodes where platform pods (the operator, NFD's master, the scheduler) can still run once the GPU nodes
    carry `taint`: Ready, schedulable, and with no NoSchedule/NoExecute taint. Empty: tainting leaves no room.
    None: unknown (no node at all, or one reports no conditions, as in an offline plan), which is not "no room"."""
    room = []
    if not nodes or any(not (node.get("status") or {}).get("conditions") for node in nodes):
        return None
    for node in nodes:
        name = node["metadata"]["name"]
        taints = list((node.get("spec") or {}).get("taints") or [])
        if name in gpu_nodes and taint is not None:
            taints.append(taint)
        blocking = [t for t in taints if t.get("effect") in ("NoSchedule", "NoExecute")]
        if node_ready(node) and not (node.get("spec") or {}).get("unschedulable") and not blocking:
            room.append(name)
    return room


def toleration_for(taint: dict) -> dict:
    return {"key": taint["key"], "operator": "Exists", "effect": taint["effect"]}


# --- pods -------------------------------------------------------------------------------------------------------------
def pod_ready(pod: dict) -> bool:
    return condition_true(pod, "Ready")


def waiting(pod: dict) -> tuple[str, str, str] | None:
    """(container, reason, message) of the first container (init containers first) that waits with a reason."""
    status = pod.get("status") or {}
    for group in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(group) or []:
            state = (container.get("state") or {}).get("waiting") or {}
            if state.get("reason"):
                return container.get("name", ""), state["reason"], state.get("message", "")
    return None


def unschedulable(pod: dict) -> str | None:
    """The scheduler's message when the pod could not be placed, else None."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return condition.get("message", "")
    return None


def pod_state(pod: dict) -> str:
    """One phrase for why a pod is not running: 'ImagePullBackOff (ctr)', 'unschedulable: …', or its phase."""
    if found := waiting(pod):
        return f"{found[1]} ({found[0]})"
    if (message := unschedulable(pod)) is not None:
        return f"unschedulable: {message}"
    return (pod.get("status") or {}).get("phase", "Pending")


# --- leases -----------------------------------------------------------------------------------------------------------
def micro_time(moment: _dt.datetime | None = None) -> str:
    moment = moment or _dt.datetime.now(_dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> _dt.datetime | None:
    if not text:
        return None
    try:
        stamp = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=_dt.timezone.utc)


def lease_fresh(spec: dict, default_duration: int, slack: float = 1.0, floor: int = 0,
                now: _dt.datetime | None = None) -> bool:
    """A lease whose holder renewed it (or took it) within `slack` times its duration: a dead holder's lease goes
    stale. `default_duration` stands in for a lease that names none; `floor` is the least duration counted."""
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    if renewed is None:
        return False
    duration = max(spec.get("leaseDurationSeconds") or default_duration, floor)
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return (now - renewed).total_seconds() <= duration * slack


# --- where our own state lives ---------------------------------------------------------------------------------------
STATE_NAMESPACE = "gpu-bootstrap"  # the checkpoint, its key and the run lock (pipeline/checkpoint.py, lock.py)
STATE_KEY_SECRET = "gpu-bootstrap-state-key"  # the fingerprints' HMAC key, beside the checkpoint
# The kinds admission does not run for (the API server exempts them from webhooks and admission policies): no
# admission policy can keep a write of them dry, so dry runs judge them client-side and dry identities never write
# them (security/rbac.py, pipeline/gate.py)
ADMISSION_CONFIGURATION_KINDS = frozenset({
    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"})


def admission_configuration(api_version: str, kind: str) -> bool:
    return api_version.startswith("admissionregistration.k8s.io/") and kind in ADMISSION_CONFIGURATION_KINDS


# the in-cluster node probe's own namespaces (probes/incluster.py), which the probe identity's policy names
PROBE_NAMESPACE_PREFIX = "gpu-bootstrap-probe-"
PROBE_COMPONENT = {"gpu-bootstrap.io/component": "node-probe"}


# --- GitOps ownership ------------------------------------------------------------------------------------------------
GITOPS_ANNOTATION = "gpu-bootstrap.io/exported-to"  # written by `export` on each object of ours: argocd, flux, ...


def gitops_owner(obj: dict) -> str | None:
    """Which GitOps engine owns this object, if any: ours written by `export`, or the marks Argo CD (tracking
    annotation) and Flux (kustomize-controller's and helm-controller's labels) put on what they apply."""
    meta = obj.get("metadata") or {}
    annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
    if "argocd.argoproj.io/tracking-id" in annotations:
        return f"Argo CD (Application {annotations['argocd.argoproj.io/tracking-id'].split(':')[0]})"
    for prefix, what in (("kustomize.toolkit.fluxcd.io", "Kustomization"), ("helm.toolkit.fluxcd.io", "HelmRelease")):
        if f"{prefix}/name" in labels:
            return f"Flux ({what} {labels.get(f'{prefix}/namespace', '')}/{labels[f'{prefix}/name']})"
    if annotations.get(GITOPS_ANNOTATION):
        return f"{annotations[GITOPS_ANNOTATION]} (gpu-bootstrap export)"
    return None


def served(kube, api_version: str, kind: str) -> bool:
    """Whether API discovery shows the kind (the one helper here that asks the cluster, through `kube`). A failure to
    ask is not an answer: it propagates (unknown ≠ absent)."""
    from gpu_bootstrap.core.errors import ClusterError, Unreachable
    try:
        kube.resource(api_version, kind)
        return True
    except Unreachable:
        raise
    except ClusterError as error:
        if error.status:  # 403, 500, ...: we could not read discovery
            raise
        return False  # "the cluster does not serve …" / "serves no …"
