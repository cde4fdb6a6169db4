"""The team queues in `status`: each team's GPU quota, use, borrowed GPUs and waiting workloads, with why they wait
(Kueue's own conditions), read from the ClusterQueues gpu-bootstrap made and the Workloads admitted into or waiting
for them. No Kueue, or no queue of ours: the section is absent. Read-only."""
from __future__ import annotations

from gpu_bootstrap.core.errors import ClusterError
from gpu_bootstrap.core.objects import condition_true
from gpu_bootstrap.render import queues as render

WAITING_SHOWN = 20  # waiting workloads listed per document (the counts are whole)


def _count(value) -> int:
    """A quantity of GPUs ('8', '8k' never happens for GPUs, but '0' and missing do)."""
    try:
        return int(float(str(value or "0")))
    except ValueError:
        return 0


def _gpu(flavors: list[dict], key: str) -> int:
    return sum(_count(r.get(key)) for f in flavors or [] for r in f.get("resources") or []
               if r.get("name") == render.GPU)


def _quota(queue: dict) -> int:
    return sum(_count(r.get("nominalQuota")) for group in queue["spec"].get("resourceGroups") or []
               for f in group.get("flavors") or [] for r in f.get("resources") or [] if r.get("name") == render.GPU)


def _condition(obj: dict, kind: str) -> dict | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def _waiting_reason(workload: dict) -> str:
    """Why a workload is not admitted, in Kueue's words (QuotaReserved's message), or what it waits for."""
    for kind in ("QuotaReserved", "Evicted", "PodsReady"):
        found = _condition(workload, kind)
        if found and found.get("message") and (kind != "QuotaReserved" or found.get("status") != "True"):
            return found["message"]
    return "waiting for Kueue to consider it"


def _gpus_asked(workload: dict) -> int:
    """Kueue's own totals once it has considered the workload (they include GPUs claimed through DRA, which a pod
    template's resources do not show), else the pod templates' GPU requests."""
    considered = (workload.get("status") or {}).get("resourceRequests")
    if considered:
        return sum(_count((r.get("resources") or {}).get(render.GPU)) for r in considered)
    total = 0
    for pod_set in (workload.get("spec") or {}).get("podSets") or []:
        spec = (pod_set.get("template") or {}).get("spec") or {}
        per_pod = sum(_count(((c.get("resources") or {}).get("limits") or {}).get(render.GPU) or
                             ((c.get("resources") or {}).get("requests") or {}).get(render.GPU))
                      for c in spec.get("containers") or [])
        total += per_pod * int(pod_set.get("count") or 1)
    return total


def queues(kube) -> dict | None:
    """{"teams": [...], "waiting": [...]}, or None where Kueue's API is not served or holds no queue of ours."""
    try:
        cluster_queues = kube.list(render.API, "ClusterQueue", label_selector=render.OWNED_SELECTOR)
    except ClusterError as error:
        if not error.status or error.status in (404, 403):  # not served (no Kueue), or not ours to read: none
            return None
        raise
    if not cluster_queues:
        return None
    ours = {q["metadata"]["name"] for q in cluster_queues}
    local = {(q["metadata"].get("namespace"), q["metadata"]["name"]): (q.get("spec") or {}).get("clusterQueue")
             for q in kube.list(render.API, "LocalQueue", label_selector=render.OWNED_SELECTOR)}
    waiting = []
    for workload in kube.list(render.API, "Workload"):
        queue = _workload_queue(workload, local)
        if queue not in ours or condition_true(workload, "Admitted") or condition_true(workload, "Finished"):
            continue
        meta = workload["metadata"]
        waiting.append({"team": queue, "namespace": meta.get("namespace"), "workload": meta["name"],
                        "owner": _owner(meta), "gpus": _gpus_asked(workload), "reason": _waiting_reason(workload)})
    teams = []
    for queue in sorted(cluster_queues, key=lambda q: q["metadata"]["name"]):
        status = queue.get("status") or {}
        name = queue["metadata"]["name"]
        active = _condition(queue, "Active") or {}
        teams.append({"team": name, "cohort": queue["spec"].get("cohortName"), "quota_gpus": _quota(queue),
                      "used_gpus": _gpu(status.get("flavorsUsage"), "total"),
                      "borrowed_gpus": _gpu(status.get("flavorsUsage"), "borrowed"),
                      "admitted_workloads": int(status.get("admittedWorkloads") or 0),
                      "pending_workloads": int(status.get("pendingWorkloads") or 0),
                      "active": active.get("status") == "True",
                      "inactive_reason": None if active.get("status") == "True" else
                      (active.get("message") or "Kueue has not reported on it")})
    return {"teams": teams, "waiting": sorted(waiting, key=lambda w: (w["team"], w["namespace"], w["workload"]))
            [:WAITING_SHOWN], "waiting_total": len(waiting)}


def _workload_queue(workload: dict, local: dict) -> str | None:
    """The ClusterQueue a workload was admitted into, or (waiting) the one its LocalQueue feeds."""
    admission = (workload.get("status") or {}).get("admission") or {}
    queue_name = (workload.get("spec") or {}).get("queueName")
    return admission.get("clusterQueue") or local.get((workload["metadata"].get("namespace"), queue_name))


def _owner(meta: dict) -> str | None:
    owner = next(iter(meta.get("ownerReferences") or []), None)
    return f"{owner['kind']}/{owner['name']}" if owner else None
