"""Team queues on the real Kueue controller, the real API server, the real kube-scheduler and our bin-packing one.

Kueue is built from its module (scripts/gomod/kueue) and installed by `up` from the chart of the same module; the
local cluster's agent runs its controller manager for the chart's pod, with its webhooks and visibility API reached
through the API server as on a real cluster. The cluster has 3 GPU nodes of 4 GPUs (12 free GPUs).

What is faked, because nothing here runs containers: a held training pod ends when the test patches its status to
Succeeded, as a kubelet reports a container that exited 0 (KWOK completes other Job pods at once:
tests/localcluster/cluster.py HOLD_LABEL).

* gang: two 4-pod x 2-GPU Jobs of one team (quota 12): exactly one is admitted and its 4 pods are bound by
  gpu-binpack-scheduler; the other has no pod until the first ends, then runs whole. Without queues the same 8 pods,
  created interleaved, end 3 + 3 bound with one of each pending: the deadlock the queue prevents.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.localcluster.cluster import HOLD_LABEL, require
from tests.localcluster.rest import ApiError
from tests.realfaults import UpRun, local_cluster, wait_for

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.xdist_group("queues-real")]
GPU_NODES = ["gpu-1", "gpu-2", "gpu-3"]
STEPS = "node-prep,binpack-scheduler,admission-opa,admission,queues"
RUN_TIMEOUT = 480
SCHEDULER = "gpu-binpack-scheduler"
TEAM_A, TEAM_B, NO_QUEUE = "team-a", "team-b", "no-queue"
QUEUE = "gpus"
PAUSE = "registry.k8s.io/pause:3.10"
WITHIN = 180.0  # seconds for Kueue and the schedulers to act on a loaded CI machine


@dataclass
class Queues:
    cluster: object
    folder: Path
    config: Path
    first: object = None

    @property
    def api(self):
        return self.cluster.admin()

    def up(self):
        return UpRun(["up", "-c", str(self.config), "--only", STEPS, "--preflight-report",
                      str(self.folder / "report.json")], self.folder).wait(RUN_TIMEOUT)


@pytest.fixture(scope="module")
def queues(tmp_path_factory):
    require("kueue", "kueue-chart")
    from tests.localcluster.cluster import binaries
    from tests.nodes.reports import write_report
    folder = tmp_path_factory.mktemp("queues-real")
    with local_cluster(folder, gpu_nodes=len(GPU_NODES), cpu_nodes=1) as cluster:
        write_report(folder / "report.json", GPU_NODES, gpus=4)
        config = folder / "gpu-bootstrap.yaml"
        config.write_text(json.dumps({
            "cluster": {"kubeconfig": str(cluster.kubeconfig)}, "nodes": [{"name": n} for n in GPU_NODES],
            "admission": {"wait_timeout": 300}, "monitoring": {"enabled": False},
            "queues": {"kueue": {"chart": str(binaries()["kueue-chart"])},
                       "teams": [{"name": TEAM_A, "namespaces": [TEAM_A], "gpus": 12},
                                 {"name": TEAM_B, "namespaces": [TEAM_B], "gpus": 0, "borrow": False}]}}))
        found = Queues(cluster, folder, config)
        api = found.api
        for namespace in (TEAM_A, TEAM_B, NO_QUEUE):  # the teams' namespaces are theirs, made before `up`
            api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        found.first = found.up()
        yield found


def gpu_job(name: str, pods: int, gpus: int, queue: str | None = QUEUE) -> dict:
    """A training Job as users write it: no scheduler name, no toleration, GPUs in its limits."""
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                     "template": {"metadata": {"labels": {HOLD_LABEL: "true", "job": name}},
                                  "spec": {"restartPolicy": "Never", "containers": [{
                                      "name": "train", "image": PAUSE,
                                      "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}}}


def gpu_pod(name: str, group: str, gpus: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {HOLD_LABEL: "true",
                                                                                      "job": group}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "train", "image": PAUSE, "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def pods_of(api, namespace: str, job: str) -> list[dict]:
    return [p for p in api.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector=job%3D{job}")["items"]
            if not p["metadata"].get("deletionTimestamp")]


def bound(pods: list[dict]) -> list[dict]:
    return [p for p in pods if p["spec"].get("nodeName")]


def end_pods(api, namespace: str, pods: list[dict]) -> None:
    """What a kubelet reports when each pod's container exited 0."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for pod in pods:
        statuses = [{"name": c["name"], "image": c["image"], "ready": False, "restartCount": 0,
                     "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now,
                                              "finishedAt": now}}} for c in pod["spec"]["containers"]]
        api.patch(f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/status",
                  {"status": {"phase": "Succeeded", "containerStatuses": statuses}}, kind="strategic")


def workload_of(api, namespace: str, job: str) -> dict | None:
    for workload in api.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace}/workloads")["items"]:
        if any(o.get("name") == job for o in workload["metadata"].get("ownerReferences") or []):
            return workload
    return None


def condition(obj: dict | None, kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in ((obj or {}).get("status") or {}).get("conditions") or [])


def remove(api, namespace: str, kind: str, names: list[str]) -> None:
    path = "/apis/batch/v1" if kind == "jobs" else "/api/v1"
    for name in names:
        try:
            api.delete(f"{path}/namespaces/{namespace}/{kind}/{name}?propagationPolicy=Background")
        except ApiError as error:
            if error.status != 404:
                raise
    wait_for(lambda: not [p for p in api.get("/api/v1/pods")["items"]
                          if p["metadata"]["namespace"] == namespace], WITHIN, f"the pods of {namespace} to go")


def test_up_installs_kueue_and_the_teams_queues_are_active(queues):
    assert queues.first.code == 0, queues.first.output[-4000:]
    statuses = {s["id"]: s["status"] for s in queues.first.document["steps"]}
    assert statuses["queues"] == "applied", statuses
    api = queues.api
    for team in (TEAM_A, TEAM_B):
        cluster_queue = api.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{team}")
        assert condition(cluster_queue, "Active"), cluster_queue.get("status")
        local = api.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{team}/localqueues/{QUEUE}")
        assert local["spec"]["clusterQueue"] == team


def test_without_queues_two_interleaved_gangs_deadlock_half_placed(queues):
    """The same 8 pods of two 4 x 2-GPU jobs on 12 free GPUs, created A1, B1, A2, B2, ... outside any queue: the
    scheduler places them one at a time, and both jobs end 3 + 3 bound, one pod of each pending for good."""
    assert queues.first.code == 0, queues.first.output[-2000:]
    api = queues.api
    names = [f"{group}{index}" for index in range(1, 5) for group in ("a", "b")]
    try:
        for name in names:
            api.create(f"/api/v1/namespaces/{NO_QUEUE}/pods", gpu_pod(name, name[0], 2))
        wait_for(lambda: len(bound(pods_of(api, NO_QUEUE, "a") + pods_of(api, NO_QUEUE, "b"))) == 6, WITHIN,
                 "6 of the 8 pods to be bound (12 GPUs)", interval=0.5)
        time.sleep(5)  # nothing more is placed: the GPUs are gone
        a, b = pods_of(api, NO_QUEUE, "a"), pods_of(api, NO_QUEUE, "b")
        assert (len(bound(a)), len(bound(b))) == (3, 3), [p["metadata"]["name"] for p in bound(a + b)]
        assert {p["spec"]["schedulerName"] for p in a + b} == {SCHEDULER}
        pending = [p["metadata"]["name"] for p in a + b if not p["spec"].get("nodeName")]
        assert sorted(pending) == ["a4", "b4"]
    finally:
        remove(api, NO_QUEUE, "pods", names)


def test_with_a_queue_one_gang_runs_whole_and_the_other_waits_without_pods(queues):
    """Two Jobs of 4 pods x 2 GPUs in team-a's queue (quota 12) on 12 free GPUs: Kueue admits one, whose 4 pods are
    bound by the bin-packing scheduler; the other stays suspended with no pod until the first ends, then runs whole."""
    assert queues.first.code == 0, queues.first.output[-2000:]
    api = queues.api
    jobs = f"/apis/batch/v1/namespaces/{TEAM_A}/jobs"
    try:
        api.create(jobs, gpu_job("first", 4, 2))
        wait_for(lambda: condition(workload_of(api, TEAM_A, "first"), "Admitted"), WITHIN, "the first admitted")
        api.create(jobs, gpu_job("second", 4, 2))
        wait_for(lambda: len(bound(pods_of(api, TEAM_A, "first"))) == 4, WITHIN, "the first's 4 pods bound",
                 interval=0.5)
        second = wait_for(lambda: workload_of(api, TEAM_A, "second"), WITHIN, "the second's Workload")
        time.sleep(5)
        second = workload_of(api, TEAM_A, "second")
        assert not condition(second, "Admitted") and not condition(second, "QuotaReserved"), second.get("status")
        assert api.get(f"{jobs}/second")["spec"]["suspend"] is True
        assert pods_of(api, TEAM_A, "second") == []
        first = pods_of(api, TEAM_A, "first")
        assert {p["spec"]["schedulerName"] for p in first} == {SCHEDULER}
        assert all(p["spec"].get("nodeSelector", {}).get("nvidia.com/gpu.present") == "true" for p in first)

        end_pods(api, TEAM_A, first)
        wait_for(lambda: len(bound(pods_of(api, TEAM_A, "second"))) == 4, WITHIN,
                 "the second's 4 pods bound once the first ended", interval=0.5)
        assert condition(workload_of(api, TEAM_A, "second"), "Admitted")
        assert {p["spec"]["schedulerName"] for p in pods_of(api, TEAM_A, "second")} == {SCHEDULER}
    finally:
        remove(api, TEAM_A, "jobs", ["first", "second"])
