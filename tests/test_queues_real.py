"""Team queues on the real Kueue controller, the real API server, the real kube-scheduler and our bin-packing one.

Kueue is built from its module (scripts/gomod/kueue) and installed by `up` from the chart of the same module; the
local cluster's agent runs its controller manager for the chart's pod, with its webhooks and visibility API reached
through the API server as on a real cluster. The cluster has 3 GPU nodes of 4 GPUs (12 free GPUs).

What is faked, because nothing here runs containers: a held training pod ends when the test patches its status to
Succeeded, as a kubelet reports a container that exited 0 (KWOK completes other Job pods at once:
tests/localcluster/cluster.py HOLD_LABEL).

* gang: two 4-pod x 2-GPU Jobs of one team (quota 12): exactly one is admitted and its 4 pods are bound by
  gpu-binpack-scheduler; the other has no pod until the first ends, then runs whole (and `status` shows the team's
  use and why the other waits). Without queues the same 8 pods, created interleaved, end 3 + 3 bound with one of each
  pending: the deadlock the queue prevents.
* quota and borrowing: team-b at its quota waits while team-c's share is idle and borrowing is off; with borrowing
  on (a second `up`), it borrows; when team-c submits, what team-b borrowed is reclaimed by preemption.
* a second `up` writes nothing (the API server's audit log); teardown refuses while a user's workload is admitted,
  and with --evict-workloads leaves no object of ours (then `up` restores the module's cluster).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_bootstrap.steps.queues import bypassing
from tests.localcluster.cluster import HOLD_LABEL, require
from tests.localcluster.rest import ApiError
from tests.realfaults import UpRun, local_cluster, wait_for

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.xdist_group("queues-real")]
GPU_NODES = ["gpu-1", "gpu-2", "gpu-3"]
STEPS = "node-prep,binpack-scheduler,admission-opa,admission,queues"
RUN_TIMEOUT = 480
SCHEDULER = "gpu-binpack-scheduler"
TEAM_A, TEAM_B, TEAM_C, NO_QUEUE = "team-a", "team-b", "team-c", "no-queue"
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

    def up(self, steps: str = STEPS):
        return UpRun(["up", "-c", str(self.config), "--only", steps, "--preflight-report",
                      str(self.folder / "report.json")], self.folder).wait(RUN_TIMEOUT)

    def write_config(self, borrow: bool) -> None:
        """team-a: 12 GPUs, neither lends nor borrows (the gang tests' whole cluster); team-b: 4, borrowing as given; team-c: 8,
        lends what it leaves idle."""
        from tests.localcluster.cluster import binaries
        self.config.write_text(json.dumps({
            "cluster": {"kubeconfig": str(self.cluster.kubeconfig)}, "nodes": [{"name": n} for n in GPU_NODES],
            "admission": {"wait_timeout": 300}, "monitoring": {"enabled": False},
            "queues": {"kueue": {"chart": str(binaries()["kueue-chart"])},
                       "teams": [{"name": TEAM_A, "namespaces": [TEAM_A], "gpus": 12, "lend": False,
                                  "borrow": False},
                                 {"name": TEAM_B, "namespaces": [TEAM_B], "gpus": 4, "borrow": borrow},
                                 {"name": TEAM_C, "namespaces": [TEAM_C], "gpus": 8}]}}))

    def gpu_bootstrap(self, *args: str):
        return UpRun([*args, "-c", str(self.config)], self.folder).wait(RUN_TIMEOUT)


@pytest.fixture(scope="module")
def queues(tmp_path_factory):
    require("kueue", "kueue-chart")
    from tests.nodes.reports import write_report
    folder = tmp_path_factory.mktemp("queues-real")
    with local_cluster(folder, gpu_nodes=len(GPU_NODES), cpu_nodes=1) as cluster:
        write_report(folder / "report.json", GPU_NODES, gpus=4)
        config = folder / "gpu-bootstrap.yaml"
        found = Queues(cluster, folder, config)
        found.write_config(borrow=False)
        api = found.api
        for namespace in (TEAM_A, TEAM_B, TEAM_C, NO_QUEUE):  # the teams' namespaces are theirs, made before `up`
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
    for team in (TEAM_A, TEAM_B, TEAM_C):
        cluster_queue = api.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{team}")
        assert condition(cluster_queue, "Active"), cluster_queue.get("status")
        local = api.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{team}/localqueues/{QUEUE}")
        assert local["spec"]["clusterQueue"] == team
    doctor = queues.gpu_bootstrap("doctor", "--preflight-report", str(queues.folder / "report.json"))
    checks = [c for c in (doctor.document or {}).get("checks", []) if c["id"] == "queues"]
    assert checks and all(c["status"] == "pass" for c in checks), doctor.output[-3000:]
    assert any("3 team queue(s) active" in c["message"] for c in checks), checks


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
        assert len(bypassing(a + b)) == 8  # what doctor lists with require_queue: GPU pods no queue admitted
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
        assert bypassing(first) == []  # the pods of a Job Kueue admitted are known as such (doctor, require_queue)
        shown = queues.gpu_bootstrap("status")
        assert shown.code == 0, shown.output[-2000:]
        team = next(t for t in shown.document["queues"]["teams"] if t["team"] == TEAM_A)
        assert (team["quota_gpus"], team["used_gpus"], team["admitted_workloads"]) == (12, 8, 1), team
        waiting = shown.document["queues"]["waiting"]
        assert [(w["owner"], w["gpus"]) for w in waiting] == [("Job/second", 8)], waiting
        assert "insufficient" in waiting[0]["reason"].lower() or "quota" in waiting[0]["reason"].lower(), waiting
        assert all(p["spec"].get("nodeSelector", {}).get("nvidia.com/gpu.present") == "true" for p in first)

        end_pods(api, TEAM_A, first)
        wait_for(lambda: len(bound(pods_of(api, TEAM_A, "second"))) == 4, WITHIN,
                 "the second's 4 pods bound once the first ended", interval=0.5)
        assert condition(workload_of(api, TEAM_A, "second"), "Admitted")
        assert {p["spec"]["schedulerName"] for p in pods_of(api, TEAM_A, "second")} == {SCHEDULER}
    finally:
        remove(api, TEAM_A, "jobs", ["first", "second"])


def borrowed(api, team: str) -> str | None:
    usage = (api.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{team}").get("status") or {}).get("flavorsUsage")
    return {r["name"]: r.get("borrowed") for f in usage or [] for r in f["resources"]}.get("nvidia.com/gpu")


def admitted(api, namespace: str, job: str) -> bool:
    return condition(workload_of(api, namespace, job), "Admitted")


def test_a_team_borrows_idle_gpus_only_when_allowed_and_gives_them_back_when_the_lender_submits(queues):
    """team-b (quota 4) at its quota waits while team-c's 8 sit idle and borrowing is off; a second `up` with
    borrowing on lets it borrow them; when team-c submits, Kueue preempts what team-b borrowed (reclaim within the
    cohort) and team-c runs."""
    assert queues.first.code == 0, queues.first.output[-2000:]
    api = queues.api
    b_jobs, c_jobs = f"/apis/batch/v1/namespaces/{TEAM_B}/jobs", f"/apis/batch/v1/namespaces/{TEAM_C}/jobs"
    try:
        api.create(b_jobs, gpu_job("b1", 1, 4))
        wait_for(lambda: admitted(api, TEAM_B, "b1"), WITHIN, "b1 admitted (within team-b's quota)")
        api.create(b_jobs, gpu_job("b2", 1, 4))
        wait_for(lambda: workload_of(api, TEAM_B, "b2"), WITHIN, "b2's Workload")
        time.sleep(5)
        assert not admitted(api, TEAM_B, "b2"), workload_of(api, TEAM_B, "b2").get("status")

        queues.write_config(borrow=True)
        changed = queues.up("queues")
        assert changed.code == 0, changed.output[-3000:]
        wait_for(lambda: admitted(api, TEAM_B, "b2"), WITHIN, lambda: (
            f"b2 admitted by borrowing team-c's idle GPUs: {workload_of(api, TEAM_B, 'b2').get('status')}; "
            f"{api.get(f'/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{TEAM_B}')}"))
        wait_for(lambda: borrowed(api, TEAM_B) == "4", WITHIN, lambda: f"team-b's status to show 4 GPUs borrowed "
                                                                      f"(it shows {borrowed(api, TEAM_B)})")

        api.create(c_jobs, gpu_job("c1", 2, 4))  # team-c's whole quota, 4 of it lent to team-b
        wait_for(lambda: admitted(api, TEAM_C, "c1"), WITHIN, "c1 admitted once team-b's loan is reclaimed")
        b2 = workload_of(api, TEAM_B, "b2")
        assert not condition(b2, "Admitted") and condition(b2, "Evicted"), b2.get("status")
        assert "Preempted" in json.dumps(b2["status"]["conditions"]), b2["status"]["conditions"]
        assert admitted(api, TEAM_B, "b1")  # within its own quota: never preempted
        wait_for(lambda: len(bound(pods_of(api, TEAM_C, "c1"))) == 2, WITHIN, "c1's 2 pods bound", interval=0.5)
    finally:
        remove(api, TEAM_B, "jobs", ["b1", "b2"])
        remove(api, TEAM_C, "jobs", ["c1"])
        queues.write_config(borrow=False)
        restored = queues.up("queues")
        assert restored.code == 0, restored.output[-3000:]


def test_a_second_up_writes_nothing(queues):
    from tests.live.audit import audit_mark, audit_writes
    assert queues.first.code == 0, queues.first.output[-2000:]
    mark = audit_mark(queues.cluster)
    second = queues.up()
    assert second.code == 0, second.output[-3000:]
    assert {s["id"]: s["status"] for s in second.document["steps"]}["queues"] == "unchanged"
    assert audit_writes(queues.cluster, since=mark) == []


def test_teardown_refuses_while_a_user_s_workload_is_admitted_and_then_leaves_no_object_of_ours(queues):
    assert queues.first.code == 0, queues.first.output[-2000:]
    api = queues.api
    jobs = f"/apis/batch/v1/namespaces/{TEAM_A}/jobs"
    try:
        api.create(jobs, gpu_job("running", 1, 1))
        wait_for(lambda: admitted(api, TEAM_A, "running"), WITHIN, "the user's job admitted")
        refused = queues.gpu_bootstrap("teardown", "--only", "queues", "--yes")
        assert refused.code != 0 and "evict-workloads" in refused.output, refused.output[-3000:]
        assert api.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{TEAM_A}")  # nothing was removed

        done = queues.gpu_bootstrap("teardown", "--only", "queues", "--yes", "--evict-workloads")
        assert done.code == 0, done.output[-3000:]
        crds = [c["metadata"]["name"] for c in
                api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]]
        assert not [c for c in crds if c.endswith(".kueue.x-k8s.io")], crds
        left = [n["metadata"]["name"] for n in api.get("/api/v1/namespaces")["items"]
                if (n["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "gpu-bootstrap" and
                n["metadata"]["name"] == "kueue-system" and not n["metadata"].get("deletionTimestamp")]
        assert left == []
        hooks = [w["metadata"]["name"] for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
                 for w in api.get(f"/apis/admissionregistration.k8s.io/v1/{kind}")["items"]
                 if w["metadata"]["name"].startswith("kueue")]
        assert hooks == []
        for namespace in (TEAM_A, TEAM_B, TEAM_C):  # the teams' own namespaces are theirs: kept
            assert api.get(f"/api/v1/namespaces/{namespace}")["metadata"]["name"] == namespace
    finally:
        remove(api, TEAM_A, "jobs", ["running"])
        wait_for(lambda: "kueue-system" not in [n["metadata"]["name"] for n in api.get("/api/v1/namespaces")["items"]],
                 WITHIN, "Kueue's namespace to be gone", interval=0.5)
        restored = queues.up("queues")
        assert restored.code == 0, restored.output[-3000:]


@pytest.mark.parametrize("release", ["kueue", "queues"])
def test_the_up_role_names_every_role_the_pinned_chart_makes(release, tmp_path):
    """`rbac --for up` gives escalate and bind on Kueue's chart roles by name (steps/queues.py CHART_CLUSTER_ROLES):
    the list must be exactly what the chart renders, for a release named after the chart or not."""
    import yaml
    from gpu_bootstrap.steps.queues import CHART_CLUSTER_ROLES, CHART_ROLES, chart_fullname
    from tests.localcluster.cluster import binaries
    from tests.tools import run, tool, tool_env
    require("kueue-chart")
    rendered = run([tool("helm"), "template", release, str(binaries()["kueue-chart"]), "-n", "kueue-system"],
                   tool_env(tmp_path)).stdout
    made = [d for d in yaml.safe_load_all(rendered) if d]
    name = chart_fullname(release)
    assert {d["metadata"]["name"] for d in made if d["kind"] == "ClusterRole"} == \
        {f"{name}-{role}" for role in CHART_CLUSTER_ROLES}
    assert {d["metadata"]["name"] for d in made if d["kind"] == "Role"} == {f"{name}-{role}" for role in CHART_ROLES}
