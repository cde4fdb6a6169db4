"""Autoscaled capacity in `status`: for each pending GPU pod, which Karpenter NodePool can launch a node for it, and
why each other cannot, from what the NodePools themselves say (any NodePool, ours or not: Karpenter considers them
all). Read-only; no NodePool API served, or no NodePool: nothing is added.

A pool cannot serve a pod when (first reason found):
* its GPU limit is reached: `spec.limits` against what its nodes hold (`status.resources`, Karpenter's own count);
* the pod does not tolerate a taint of its node template;
* the pod's nodeSelector (or every required node-affinity term) asks for a label value the template's labels or
  requirements rule out.
Otherwise it "can serve" as far as those tell: whether an instance type fits the pod is Karpenter's decision (its
instance types are the cloud's), so a pod no instance type fits shows here as servable and stays pending with
Karpenter's own event."""
from __future__ import annotations

from gpu_bootstrap.app.status_queues import _count  # a GPU quantity as a whole count, as the queues section reads it
from gpu_bootstrap.core.errors import ClusterError, Unreachable
from gpu_bootstrap.render.admission import tolerates

GPU = "nvidia.com/gpu"
NODEPOOL = ("karpenter.sh/v1", "NodePool")
CAN = "can serve"


def read(kube) -> list[dict]:
    """Every NodePool; [] when Karpenter's v1 API is not served (or cannot be listed: status shows what it can)."""
    try:
        return kube.list(*NODEPOOL)
    except Unreachable:
        raise
    except ClusterError:
        return []


def _allows(requirement: dict, value: str | None) -> bool:
    """Whether a node of the pool can carry `value` (None: no such label) under one of its requirements."""
    operator, values = requirement.get("operator"), requirement.get("values") or []
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            return int(value) > int(values[0]) if operator == "Gt" else int(value) < int(values[0])
        except ValueError:
            return False
    return True


def _selector_conflict(wanted: dict[str, str], template: dict) -> str | None:
    labels = (template.get("metadata") or {}).get("labels") or {}
    requirements = (template.get("spec") or {}).get("requirements") or []
    for key, value in sorted(wanted.items()):
        if key in labels and labels[key] != value:
            return f"its nodes are labelled {key}={labels[key]}, the pod asks for {value}"
        for requirement in requirements:
            if requirement.get("key") == key and not _allows(requirement, value):
                return f"its requirement on {key} rules out {value}"
    return None


def _affinity_selectors(pod: dict) -> list[dict[str, str]]:
    """The label equalities of each required node-affinity term (In with one value); [{}] when there is none."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    terms = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    found = []
    for term in terms:
        found.append({e["key"]: e["values"][0] for e in term.get("matchExpressions") or []
                      if e.get("operator") == "In" and len(e.get("values") or []) == 1})
    return found or [{}]


def verdict(pod: dict, gpus: int, pool: dict) -> str:
    """CAN, or why `pool` cannot launch a node for `pod` (which asks for `gpus` GPUs)."""
    spec, status = pool.get("spec") or {}, pool.get("status") or {}
    limit = (spec.get("limits") or {}).get(GPU)
    if limit is not None:
        used = _count((status.get("resources") or {}).get(GPU))
        if used + gpus > _count(limit):
            return f"at its GPU limit ({used} of {_count(limit)} in use, the pod asks for {gpus})"
    template = spec.get("template") or {}
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in (template.get("spec") or {}).get("taints") or []:
        if not any(tolerates(toleration, taint) for toleration in tolerations):
            return f"the pod does not tolerate its taint {taint.get('key')}:{taint.get('effect')}"
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    reasons = [_selector_conflict({**selector, **term}, template) for term in _affinity_selectors(pod)]
    if all(reasons):  # no term the pool can satisfy
        return reasons[0]
    return CAN


def annotate(pending: list[dict], pods: dict[tuple[str, str], dict], pools: list[dict]) -> None:
    """Add `pools` (NodePool name -> CAN or why not) to each pending GPU pod's row."""
    if not pools:
        return
    for row in pending:
        pod = pods.get((row["namespace"], row["name"]))
        if pod is None:
            continue
        row["pools"] = {p["metadata"]["name"]: verdict(pod, row["gpus"], p)
                        for p in sorted(pools, key=lambda p: p["metadata"]["name"])}
