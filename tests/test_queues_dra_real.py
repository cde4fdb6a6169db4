"""Team queues in DRA mode (gpu_operator.allocation: dra) on the real Kueue controller, API server, kube-scheduler
v1.37 and our bin-packing scheduler, on the local cluster started as `scripts/local-cluster up --dra`: 2 KWOK GPU
nodes with no nvidia.com/gpu capacity, whose 4 GPUs each are ResourceSlices of NVIDIA's DRA driver.

What is written by hand, as the DRA driver's chart and kubelet plugin would (tests/localcluster/dra.py says why):
the slices, and the driver's gpu.nvidia.com DeviceClass that serves nvidia.com/gpu (KEP-5004). The DRA driver's
installation is tests/test_dra_live.py's; here `up` runs the steps up to queues in DRA mode. A held pod ends when
the test reports it Succeeded, as in tests/test_queues_real.py.

The team's quota is 4 GPUs on a cluster of 8 free ones, so only the quota can keep a workload out:
* a Job of 2 pods asking `nvidia.com/gpu: 2` (served by DRA) is admitted whole, counted as 4 GPUs, and its pods are
  bound by gpu-binpack-scheduler with their devices allocated;
* a Job of 2 pods claiming 2 GPUs each from a ResourceClaimTemplate of gpu.nvidia.com is counted as 4 nvidia.com/gpu
  too (Kueue's deviceClassMappings): it waits with no pod while the first runs, then runs whole. Without the gates
  and the mapping Kueue counts no GPU for it and admits it at once, beyond the quota;
* a Job asking for the class's implicit extended resource (deviceclass.resource.kubernetes.io/gpu.nvidia.com) is
  counted as nvidia.com/gpu as well (a resource transformation), and waits for the quota.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpu_bootstrap.core import dra as core_dra
from tests.localcluster import dra
from tests.localcluster.cluster import require
from tests.realfaults import UpRun, local_cluster, wait_for
from tests.test_queues_real import (SCHEDULER, WITHIN, bound, condition, end_pods, gpu_job, pods_of, remove,
                                    workload_of)

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.xdist_group("queues-dra-real")]
GPU_NODES = ["gpu-1", "gpu-2"]
STEPS = "node-prep,binpack-scheduler,admission-opa,admission,queues"
RUN_TIMEOUT = 480
TEAM = "team-d"
QUOTA = 4
IMPLICIT = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    require("kueue", "kueue-chart")
    from tests.localcluster.cluster import binaries
    from tests.nodes.reports import write_report
    folder = tmp_path_factory.mktemp("queues-dra-real")
    with local_cluster(folder, gpu_nodes=len(GPU_NODES), cpu_nodes=1, dra=True) as cluster:
        write_report(folder / "report.json", GPU_NODES, gpus=4)
        config = folder / "gpu-bootstrap.yaml"
        config.write_text(json.dumps({
            "cluster": {"kubeconfig": str(cluster.kubeconfig)}, "nodes": [{"name": n} for n in GPU_NODES],
            "gpu_operator": {"allocation": "dra"}, "admission": {"wait_timeout": 300},
            "monitoring": {"enabled": False},
            "queues": {"kueue": {"chart": str(binaries()["kueue-chart"])},
                       "teams": [{"name": TEAM, "namespaces": [TEAM], "gpus": QUOTA, "borrow": False}]}}))
        api = cluster.admin()
        api.create("/apis/resource.k8s.io/v1/deviceclasses", dra.device_class())  # the DRA driver's chart's
        api.create("/api/v1/namespaces", {"metadata": {"name": TEAM}})
        template = core_dra.gpu_claim_template("two-gpus", TEAM, {}, gpus=2)
        api.create(f"/apis/resource.k8s.io/v1/namespaces/{TEAM}/resourceclaimtemplates", template)
        first = UpRun(["up", "-c", str(config), "--only", STEPS, "--preflight-report", str(folder / "report.json")],
                      folder).wait(RUN_TIMEOUT)
        yield cluster, first, config, folder


def claiming_job(name: str, pods: int) -> dict:
    """A training Job whose pods claim their GPUs from the team's ResourceClaimTemplate, as DRA users write it."""
    job = gpu_job(name, pods, 0)
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"claims": [{"name": "gpu"}]}
    job["spec"]["template"]["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "two-gpus"}]
    return job


def status_text(config) -> str:
    """`gpu-bootstrap status` as a user runs it in a terminal: the text view, not JSON."""
    import subprocess
    import sys
    from tests.tools import ROOT, tool_env
    done = subprocess.run([sys.executable, "-m", "gpu_bootstrap", "status", "-c", str(config)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=tool_env(NO_COLOR="1", COLUMNS="200"))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def gpus_counted(workload: dict) -> str | None:
    usage = [a.get("resourceUsage") or {} for a in ((workload.get("status") or {}).get("admission") or {})
             .get("podSetAssignments") or []]
    return next((u["nvidia.com/gpu"] for u in usage if "nvidia.com/gpu" in u), None)


def allocated_devices(api, pod: dict) -> list[str]:
    """The devices of the claim that holds the pod's GPUs (the scheduler's for an extended resource, or the one the
    ResourceClaim controller made from the template)."""
    status = pod.get("status") or {}
    name = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName") or next(
        (c["resourceClaimName"] for c in status.get("resourceClaimStatuses") or [] if c.get("resourceClaimName")), "")
    if not name:
        return []
    claim = api.get(f"/apis/resource.k8s.io/v1/namespaces/{TEAM}/resourceclaims/{name}")
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return [f"{r['pool']}/{r['device']}" for r in results if r.get("driver") == dra.DRIVER]


def test_in_dra_mode_extended_and_claimed_gpus_count_against_one_quota_and_gangs_run_whole(platform):
    cluster, first, config, folder = platform
    assert first.code == 0, first.output[-4000:]
    api = cluster.admin()
    assert condition(api.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{TEAM}"), "Active")
    jobs = f"/apis/batch/v1/namespaces/{TEAM}/jobs"
    try:
        api.create(jobs, gpu_job("extended", 2, 2))  # nvidia.com/gpu: 2 per pod, served by DRA (no node has it)
        wait_for(lambda: condition(workload_of(api, TEAM, "extended"), "Admitted"), WITHIN, "the Job admitted")
        assert gpus_counted(workload_of(api, TEAM, "extended")) == str(QUOTA)
        wait_for(lambda: len(bound(pods_of(api, TEAM, "extended"))) == 2, WITHIN, "its 2 pods bound", interval=0.5)
        pods = pods_of(api, TEAM, "extended")
        assert {p["spec"]["schedulerName"] for p in pods} == {SCHEDULER}
        devices = wait_for(lambda: (lambda found: found if len(found) == 4 else None)(
            [d for p in pods_of(api, TEAM, "extended") for d in allocated_devices(api, p)]), WITHIN,
            "4 DRA devices allocated to its pods")
        assert len(set(devices)) == 4, devices

        api.create(jobs, claiming_job("claims", 2))  # 2 GPUs each through the template: 4 more, beyond the quota
        waiting = wait_for(lambda: (workload_of(api, TEAM, "claims") or {}).get("status", {}).get("resourceRequests")
                           and workload_of(api, TEAM, "claims"), WITHIN, "Kueue to consider the claiming Job")
        time.sleep(3)
        waiting = workload_of(api, TEAM, "claims")
        assert not condition(waiting, "QuotaReserved"), waiting.get("status")
        assert pods_of(api, TEAM, "claims") == []  # suspended: 4 GPUs are free, only the quota keeps it out
        assert waiting["status"]["resourceRequests"][0]["resources"].get("nvidia.com/gpu") == str(QUOTA)
        shown = UpRun(["status", "-c", str(config)], folder).wait(RUN_TIMEOUT)
        assert shown.code == 0, shown.output[-2000:]
        team = next(t for t in shown.document["queues"]["teams"] if t["team"] == TEAM)
        assert (team["quota_gpus"], team["used_gpus"]) == (QUOTA, QUOTA), team
        assert [(w["owner"], w["gpus"]) for w in shown.document["queues"]["waiting"]] == [("Job/claims", QUOTA)]
        text = status_text(config)  # what a user reads: the table and why the Job waits
        assert "GPU queues by team (Kueue)" in text and TEAM in text, text
        assert f"{TEAM}/Job/claims ({QUOTA} GPU) waits:" in text and "quota" in text.lower(), text

        end_pods(api, TEAM, pods_of(api, TEAM, "extended"))
        wait_for(lambda: len(bound(pods_of(api, TEAM, "claims"))) == 2, WITHIN,
                 "the claiming Job's 2 pods bound once the first ended", interval=0.5)
        assert gpus_counted(workload_of(api, TEAM, "claims")) == str(QUOTA)
        claimed = wait_for(lambda: (lambda found: found if len(found) == 4 else None)(
            [d for p in pods_of(api, TEAM, "claims") for d in allocated_devices(api, p)]), WITHIN,
            "4 DRA devices allocated through the template's claims")
        assert len(set(claimed)) == 4, claimed

        implicit = gpu_job("implicit", 1, 0)
        implicit["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {IMPLICIT: "2"}}
        api.create(jobs, implicit)
        considered = wait_for(lambda: ((workload_of(api, TEAM, "implicit") or {}).get("status") or {}).get(
            "resourceRequests"), WITHIN, "Kueue to consider the Job asking for the implicit resource")
        assert considered[0]["resources"].get("nvidia.com/gpu") == "2" and IMPLICIT not in considered[0]["resources"]
        assert not condition(workload_of(api, TEAM, "implicit"), "QuotaReserved")
    finally:
        remove(api, TEAM, "jobs", ["extended", "claims", "implicit"])


def test_the_kueue_controller_runs_with_the_dra_gates_in_dra_mode(platform):
    """The gates reach Kueue's controller (its Deployment's args), and its Configuration maps the GPU class."""
    cluster, first, _config, _folder = platform
    assert first.code == 0, first.output[-4000:]
    api = cluster.admin()
    deployment = next(d for d in api.get("/apis/apps/v1/namespaces/kueue-system/deployments")["items"]
                      if "controller-manager" in d["metadata"]["name"])
    args = " ".join(a for c in deployment["spec"]["template"]["spec"]["containers"] for a in c.get("args") or [])
    assert "DynamicResourceAllocation=true" in args and "DRAExtendedResources=true" in args, args
    config_maps = api.get("/api/v1/namespaces/kueue-system/configmaps")["items"]
    manager = next(m for m in config_maps if "manager-config" in m["metadata"]["name"])
    assert "deviceClassMappings" in json.dumps(manager["data"])


def grant_up(cluster, folder, config) -> Path:
    """`rbac --for up` applied as its header says, bound to a ServiceAccount, and a kubeconfig with its TokenRequest
    token: `up` as a deploy job runs it (tests/test_faults_real.py's grant)."""
    from types import SimpleNamespace
    from tests.test_faults_real import CI_ACCOUNT, grant_up as grant, token_kubeconfig
    here = SimpleNamespace(cluster=cluster, folder=folder, config=config)
    grant(here, others=())
    return token_kubeconfig(here, CI_ACCOUNT)[0]


def test_kueue_is_installed_in_dra_mode_by_up_under_the_role_rbac_generates(platform):
    """teardown (as the admin), then `up` as a deploy job runs it: `rbac --for up` bound to a ServiceAccount. The role
    suffices to install Kueue's chart (its roles by name, which RBAC lets one create only holding their permissions)
    and the queues; a second `up` under it changes nothing."""
    cluster, first, config, folder = platform
    assert first.code == 0, first.output[-4000:]
    api = cluster.admin()
    down = UpRun(["teardown", "-c", str(config), "--only", "queues", "--yes", "--evict-workloads"], folder)
    assert down.wait(RUN_TIMEOUT).code == 0
    wait_for(lambda: "kueue-system" not in [n["metadata"]["name"] for n in api.get("/api/v1/namespaces")["items"]],
             WITHIN, "Kueue's namespace to be gone", interval=0.5)
    runner = grant_up(cluster, folder, config)
    as_ci = folder / "as-ci.yaml"
    as_ci.write_text(json.dumps({**json.loads(config.read_text()), "cluster": {"kubeconfig": str(runner)}}))
    report = str(folder / "report.json")
    again = UpRun(["up", "-c", str(as_ci), "--only", STEPS, "--preflight-report", report], folder).wait(RUN_TIMEOUT)
    assert again.code == 0, again.output[-4000:]
    assert {s["id"]: s["status"] for s in again.document["steps"]}["queues"] == "applied"
    assert condition(api.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{TEAM}"), "Active")
    second = UpRun(["up", "-c", str(as_ci), "--only", STEPS, "--preflight-report", report], folder).wait(RUN_TIMEOUT)
    assert second.code == 0 and {s["id"]: s["status"] for s in second.document["steps"]}["queues"] == "unchanged"
