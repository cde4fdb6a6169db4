"""`status`'s queues section (app/status_queues.py) from Kueue objects as the real controller writes them (the shapes
tests/test_queues_real.py reads on the real Kueue), table-tested without a cluster: an in-memory listing stands for
the API server's list answers, and only the document is asserted."""
from __future__ import annotations

import pytest

from gpu_bootstrap.app.status_queues import queues
from gpu_bootstrap.core.errors import ClusterError
from gpu_bootstrap.render import queues as render

pytestmark = pytest.mark.unit
OURS = dict(render.MANAGED)


class Listing:
    """The objects the API server would list, by kind; a kind it does not serve raises as Kube.list does."""

    def __init__(self, objects: dict[str, list[dict]], served: bool = True, status: int = 0):
        self.objects, self.served, self.status = objects, served, status

    def list(self, api_version: str, kind: str, namespace: str | None = None, label_selector: str = "") -> list:
        if not self.served:
            raise ClusterError(f"the cluster does not serve {kind}", status=self.status)
        wanted = dict(part.split("=", 1) for part in label_selector.split(",") if part)
        return [o for o in self.objects.get(kind, [])
                if all((o["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())]


def cluster_queue(name: str, quota: int, used: int, borrowed: int, admitted: int, pending: int, labels=OURS) -> dict:
    return {"metadata": {"name": name, "labels": labels}, "spec": {"cohortName": "gpu-teams", "resourceGroups": [
        {"coveredResources": ["cpu", "memory"], "flavors": [{"name": "cpu", "resources": [
            {"name": "cpu", "nominalQuota": "100k"}]}]},
        {"coveredResources": [render.GPU], "flavors": [{"name": "gpu", "resources": [
            {"name": render.GPU, "nominalQuota": str(quota)}]}]}]},
        "status": {"admittedWorkloads": admitted, "pendingWorkloads": pending,
                   "conditions": [{"type": "Active", "status": "True"}],
                   "flavorsUsage": [{"name": "gpu", "resources": [
                       {"name": render.GPU, "total": str(used), "borrowed": str(borrowed)}]}]}}


def workload(name: str, namespace: str, queue: str, pods: int, gpus: int, admitted_into: str | None = None,
             message: str = "") -> dict:
    conditions = [{"type": "Admitted", "status": "True"}] if admitted_into else \
        [{"type": "QuotaReserved", "status": "False", "message": message}]
    return {"metadata": {"name": name, "namespace": namespace, "ownerReferences": [{"kind": "Job", "name": name}]},
            "spec": {"queueName": queue, "podSets": [{"name": "main", "count": pods, "template": {"spec": {
                "containers": [{"resources": {"limits": {render.GPU: str(gpus)}}}]}}}]},
            "status": {"conditions": conditions, **({"admission": {"clusterQueue": admitted_into}}
                                                     if admitted_into else {})}}


def test_each_team_s_quota_use_borrowing_and_why_its_workloads_wait():
    listing = Listing({
        "ClusterQueue": [cluster_queue("team-b", 4, 8, 4, 2, 1), cluster_queue("team-a", 12, 8, 0, 1, 1),
                         cluster_queue("someone-elses", 99, 0, 0, 0, 0, labels={})],
        "LocalQueue": [{"metadata": {"name": "gpus", "namespace": "a", "labels": OURS},
                        "spec": {"clusterQueue": "team-a"}}],
        "Workload": [workload("first", "a", "gpus", 4, 2, admitted_into="team-a"),
                     workload("second", "a", "gpus", 4, 2, message="insufficient unused quota for nvidia.com/gpu"),
                     workload("theirs", "x", "other", 1, 1, message="not ours")]})
    found = queues(listing)
    assert [(t["team"], t["quota_gpus"], t["used_gpus"], t["borrowed_gpus"], t["admitted_workloads"],
             t["pending_workloads"], t["active"]) for t in found["teams"]] == [
        ("team-a", 12, 8, 0, 1, 1, True), ("team-b", 4, 8, 4, 2, 1, True)]
    assert found["waiting"] == [{"team": "team-a", "namespace": "a", "workload": "second", "owner": "Job/second",
                                 "gpus": 8, "reason": "insufficient unused quota for nvidia.com/gpu"}]
    assert found["waiting_total"] == 1


@pytest.mark.parametrize("listing", [
    Listing({}, served=False),  # no Kueue
    Listing({}, served=False, status=403),  # not ours to read
    Listing({"ClusterQueue": [cluster_queue("theirs", 1, 0, 0, 0, 0, labels={})]}),  # Kueue, no queue of ours
])
def test_no_section_without_a_queue_of_ours_to_read(listing):
    assert queues(listing) is None


def test_an_api_error_is_not_taken_for_no_queues():
    with pytest.raises(ClusterError):
        queues(Listing({}, served=False, status=500))


def test_a_waiting_workload_s_gpus_include_what_it_claims_through_dra():
    """A Job whose pods claim GPUs from a ResourceClaimTemplate asks for no nvidia.com/gpu in its pod template: the
    count comes from what Kueue recorded when it considered the workload (status.resourceRequests, all pods)."""
    claiming = workload("claims", "a", "gpus", 2, 0, message="insufficient unused quota for nvidia.com/gpu")
    claiming["status"]["resourceRequests"] = [{"name": "main", "resources": {"cpu": "2", render.GPU: "4"}}]
    found = queues(Listing({"ClusterQueue": [cluster_queue("team-a", 4, 4, 0, 1, 1)],
                            "LocalQueue": [{"metadata": {"name": "gpus", "namespace": "a", "labels": OURS},
                                            "spec": {"clusterQueue": "team-a"}}],
                            "Workload": [claiming]}))
    assert [(w["workload"], w["gpus"]) for w in found["waiting"]] == [("claims", 4)]
