"""The binpack-scheduler step against the emulator, through the real CLI.

No kube-scheduler binary can run here, so the emulator's stand-in (tests/kubeapi/scheduler_sim.py) plays the
scheduler container: once the Deployment's pods are ready it reads the KubeSchedulerConfiguration from the mounted
ConfigMap, takes the lease named there and serves the profile's schedulerName.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app

runner = CliRunner()
NAME = "gpu-binpack-scheduler"
OWNED = "app.kubernetes.io/managed-by=gpu-bootstrap,app.kubernetes.io/component=scheduler"
KINDS = ("serviceaccounts", "clusterrolebindings", "rolebindings", "roles", "configmaps", "deployments",
         "poddisruptionbudgets")


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.31.4", "gpu_nodes": ["gpu-1", "gpu-2"], "cpu_nodes": ["cpu-1"]}


def write_config(tmp_path: Path, cluster, scheduler: str = "") -> Path:
    path = tmp_path / "gpu-bootstrap.yaml"
    path.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}}}\nnodes: [{{name: gpu-1}}, {{name: gpu-2}}]\n"
                    f"scheduler:\n  wait_timeout: 15\n{scheduler}")
    return path


def cli(command: str, config: Path, tmp_path: Path, *extra: str):
    result = runner.invoke(app, [command, "-c", str(config), "--only", "binpack-scheduler", "-o", "json", *extra,
                                 "--log-file", str(tmp_path / "log")])
    document = json.loads(result.stdout) if result.stdout.startswith("{") else None
    return result, document


def ours(document: dict) -> dict:
    return next(s for s in document["steps"] if s["id"] == "binpack-scheduler")


def owned(emu) -> dict[str, list[str]]:
    found = {}
    for kind in KINDS:
        names = sorted(o["metadata"]["name"] for o in emu.list(kind, label_selector=OWNED))
        if names:
            found[kind] = names
    return found


def gpu_pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulerName": NAME, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "containers": [{"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}


def bound_node(emu, name: str) -> str | None:
    return emu.get("pods", name, "default")["spec"].get("nodeName")


def test_up_deploys_a_leader_elected_scheduler_that_binds_waiting_gpu_pods(cluster, tmp_path):
    emu = cluster.emu
    emu.seed(gpu_pod("trainer"))
    emu.settle()
    assert bound_node(emu, "trainer") is None  # nobody serves gpu-binpack-scheduler yet

    result, document = cli("up", write_config(tmp_path, cluster), tmp_path)
    assert result.exit_code == 0, result.output
    step = ours(document)
    assert (step["id"], step["status"], step["changes"]) == ("binpack-scheduler", "applied", 9)
    assert f"{NAME} runs (2 replica(s), leader {NAME}-" in step["message"]
    assert owned(emu) == {
        "serviceaccounts": [NAME],
        "clusterrolebindings": [f"{NAME}-as-kube-scheduler", f"{NAME}-as-volume-scheduler"],
        "rolebindings": [f"{NAME}-authentication-reader", f"{NAME}-leader-election"],
        "roles": [f"{NAME}-leader-election"], "configmaps": [f"{NAME}-config"], "deployments": [NAME],
        "poddisruptionbudgets": [NAME]}
    deploy = emu.get("deployments", NAME, "kube-system")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.k8s.io/kube-scheduler:v1.31.4"
    assert not any("hostPath" in v for v in deploy["spec"]["template"]["spec"]["volumes"])
    config = yaml.safe_load(emu.get("configmaps", f"{NAME}-config", "kube-system")["data"]["config.yaml"])
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    lease = emu.get("leases", NAME, "kube-system")
    pods = {p["metadata"]["name"] for p in emu.list("pods", "kube-system", label_selector=f"app.kubernetes.io/name={NAME}")}
    assert lease["spec"]["holderIdentity"].split("_")[0] in pods and len(pods) == 2
    emu.settle()
    assert bound_node(emu, "trainer") in ("gpu-1", "gpu-2")


def test_a_second_up_writes_nothing(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    assert cli("up", config, tmp_path)[0].exit_code == 0
    cluster.emu.requests.clear()
    result, document = cli("up", config, tmp_path)
    assert result.exit_code == 0, result.output
    assert ours(document)["status"] == "unchanged"
    assert cluster.emu.requests.writes() == []


def test_teardown_removes_it_all_and_gpu_pods_wait_again(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    assert cli("up", config, tmp_path)[0].exit_code == 0
    result, document = cli("teardown", config, tmp_path, "--yes")
    assert result.exit_code == 0, result.output
    cluster.emu.settle()
    assert owned(cluster.emu) == {}
    assert cluster.emu.get("leases", NAME, "kube-system") is None
    assert cluster.emu.list("pods", "kube-system", label_selector=f"app.kubernetes.io/name={NAME}") == []
    cluster.emu.seed(gpu_pod("late"))
    cluster.emu.settle()
    assert bound_node(cluster.emu, "late") is None
    assert cluster.emu.get("leases", "kube-scheduler", "kube-system") is not None  # the real scheduler's: untouched


def test_a_changed_config_updates_in_place_and_removes_what_is_no_longer_wanted(cluster, tmp_path):
    assert cli("up", write_config(tmp_path, cluster), tmp_path)[0].exit_code == 0
    old_hash = cluster.emu.get("deployments", NAME, "kube-system")["spec"]["template"]["metadata"]["annotations"]
    config = write_config(tmp_path, cluster, "  replicas: 1\n  strategy: MostAllocated\n")
    result, document = cli("up", config, tmp_path)
    assert result.exit_code == 0, result.output
    assert ours(document)["changes"] == 3  # ConfigMap, Deployment, and the PDB removed
    assert "poddisruptionbudgets" not in owned(cluster.emu)
    deploy = cluster.emu.get("deployments", NAME, "kube-system")
    assert deploy["spec"]["replicas"] == 1
    assert deploy["spec"]["template"]["metadata"]["annotations"] != old_hash  # pods restart with the new config
    text = cluster.emu.get("configmaps", f"{NAME}-config", "kube-system")["data"]["config.yaml"]
    assert "MostAllocated" in text and "RequestedToCapacityRatio" not in text


def test_a_renamed_scheduler_leaves_nothing_of_the_old_one(cluster, tmp_path):
    assert cli("up", write_config(tmp_path, cluster), tmp_path)[0].exit_code == 0
    result, _ = cli("up", write_config(tmp_path, cluster, "  name: packer\n"), tmp_path)
    assert result.exit_code == 0, result.output
    assert owned(cluster.emu)["deployments"] == ["packer"]
    assert all(name.startswith("packer") for names in owned(cluster.emu).values() for name in names)


def test_an_image_the_nodes_cannot_pull_fails_verify_with_the_fix(cluster, tmp_path):
    def cannot_pull(pod):
        if pod["metadata"]["name"].startswith(NAME):
            return {"phase": "Pending", "ready": False, "reason": "ImagePullBackOff"}
        return {}

    cluster.emu.controllers.pod_behaviour = cannot_pull
    result, document = cli("up", write_config(tmp_path, cluster).parent / "gpu-bootstrap.yaml", tmp_path)
    assert result.exit_code == 1
    assert "[binpack-scheduler] verification failed: 0 of 2 scheduler replica(s) available" in document["error"]
    assert "ImagePullBackOff" in document["error"] and "scheduler.image" in document["error"]


def test_dry_run_against_the_cluster_changes_nothing(cluster, tmp_path):
    cluster.emu.requests.clear()
    result, document = cli("up", write_config(tmp_path, cluster), tmp_path, "--dry-run")
    assert result.exit_code == 0, result.output
    assert ours(document)["status"] == "planned" and ours(document)["changes"] == 9
    assert owned(cluster.emu) == {}
    assert all(r.query.get("dryRun") == ["All"] for r in cluster.emu.requests.writes())


# --- day 2: doctor ----------------------------------------------------------------------------------------------------
def doctor_rows(config: Path, tmp_path: Path) -> list[dict]:
    result = runner.invoke(app, ["doctor", "-c", str(config), "--no-nodes", "-o", "json",
                                 "--log-file", str(tmp_path / "doctor-log")])
    document = json.loads(result.stdout)
    return [row for row in document["checks"] if row["id"] == "binpack-scheduler"]


def test_doctor_reports_gpu_pods_the_running_scheduler_finds_no_room_for(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    assert cli("up", config, tmp_path)[0].exit_code == 0
    assert [r["status"] for r in doctor_rows(config, tmp_path)] == ["pass", "pass"]  # nothing waits
    huge = gpu_pod("huge")
    huge["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 64
    cluster.emu.seed(huge)
    assert cluster.emu.settle()
    running, waiting = doctor_rows(config, tmp_path)
    assert running["status"] == "pass" and "leader" in running["message"]
    assert waiting["status"] == "warn" and "default/huge" in waiting["message"]
    assert "Insufficient nvidia.com/gpu" in waiting["message"]  # the scheduler's own reason


def test_doctor_fails_when_gpu_pods_wait_for_a_scheduler_that_is_gone(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    assert cli("up", config, tmp_path)[0].exit_code == 0
    deploy = cluster.emu.get("deployments", NAME, "kube-system")
    deploy["spec"]["replicas"] = 0  # someone scaled it down: the lease goes unrenewed, nobody binds
    cluster.emu.seed(deploy)
    assert cluster.emu.settle()
    cluster.emu.seed(gpu_pod("orphan"))
    assert cluster.emu.settle()
    rows = doctor_rows(config, tmp_path)
    assert rows[0]["status"] == "warn"
    assert rows[1]["status"] == "fail" and "default/orphan" in rows[1]["message"]
    assert "not running" in rows[1]["message"]


def test_doctor_fails_when_the_leader_renews_its_lease_but_binds_nothing(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    assert cli("up", config, tmp_path)[0].exit_code == 0
    cluster.emu.controllers.unregister_scheduler(NAME)  # the stand-in keeps its lease fresh, but stops scheduling
    cluster.emu.seed(gpu_pod("ignored"))
    assert cluster.emu.settle()
    assert bound_node(cluster.emu, "ignored") is None
    running, waiting = doctor_rows(config, tmp_path)
    assert waiting["status"] == "warn"  # a pod just created may simply not have been looked at yet
    with cluster.emu.store.lock:  # the emulator's clock cannot be moved: age the pod instead
        stored = cluster.emu.store.objects[("", "pods")][("default", "ignored")]
        stored["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
    running, waiting = doctor_rows(config, tmp_path)
    assert running["status"] == "pass" and "leader" in running["message"]
    assert waiting["status"] == "fail" and "has not looked at 1 pod(s)" in waiting["message"]


# --- day 2: the cluster's Kubernetes is upgraded -------------------------------------------------------------------
def stored_scheduler(emu) -> tuple[str, str]:
    """(the Deployment's image, the apiVersion of the KubeSchedulerConfiguration in its ConfigMap)."""
    deploy = emu.get("deployments", NAME, "kube-system")
    config = yaml.safe_load(emu.get("configmaps", f"{NAME}-config", "kube-system")["data"]["config.yaml"])
    return deploy["spec"]["template"]["spec"]["containers"][0]["image"], config["apiVersion"]


@pytest.mark.parametrize("emulator_options", [{"kube_version": "1.24.17", "gpu_nodes": ["gpu-1", "gpu-2"],
                                               "cpu_nodes": ["cpu-1"]}])
def test_a_kubernetes_minor_upgrade_moves_the_scheduler_image_and_config_and_doctor_fails_a_forbidden_skew(
        cluster, tmp_path):
    """1.24 -> 1.25: `up` rolls the scheduler to the new server's exact version and to the config API the new minor
    serves (v1beta3 -> v1). Two minors behind (the cluster upgraded again without `up`), doctor fails naming both
    versions and the fix; one minor behind only warns."""
    emu, config = cluster.emu, write_config(tmp_path, cluster)
    assert cli("up", config, tmp_path)[0].exit_code == 0
    assert stored_scheduler(emu) == ("registry.k8s.io/kube-scheduler:v1.24.17", "kubescheduler.config.k8s.io/v1beta3")

    emu.upgrade_control_plane("1.25.16")
    lagging = [r for r in doctor_rows(config, tmp_path) if "minor older" in r["message"]]
    assert [r["status"] for r in lagging] == ["warn"] and "v1.25.16" in lagging[0]["message"]
    result, document = cli("up", config, tmp_path)
    assert result.exit_code == 0, result.output
    assert ours(document)["status"] == "applied"
    assert stored_scheduler(emu) == ("registry.k8s.io/kube-scheduler:v1.25.16", "kubescheduler.config.k8s.io/v1")
    assert not [r for r in doctor_rows(config, tmp_path) if "skew" in r["message"]]

    emu.upgrade_control_plane("1.27.16")
    skew = [r for r in doctor_rows(config, tmp_path) if "skew policy" in r["message"]]
    assert [r["status"] for r in skew] == ["fail"], skew
    assert "kube-scheduler 1.25.16 is more than one minor older than the API server (1.27.16)" in skew[0]["message"]
    assert "gpu-bootstrap up, which rolls it to registry.k8s.io/kube-scheduler:v1.27.16" in skew[0]["message"]


@pytest.mark.parametrize("mark", [
    ("annotate", "argocd.argoproj.io/tracking-id=gpu-bootstrap-binpack-scheduler:/ConfigMap:kube-system/x"),
    ("label", "kustomize.toolkit.fluxcd.io/name=gpu-bootstrap-binpack-scheduler"),
    ("annotate", "gpu-bootstrap.io/exported-to=helmfile")])
def test_teardown_refuses_what_a_gitops_engine_owns_and_removes_nothing(cluster, tmp_path, mark):
    """Objects of ours that an engine applies (from `gpu-bootstrap export`): Argo CD's tracking annotation, Flux's
    kustomize-controller label, or the export's own annotation. Removing them is the engine's job (it would put them
    back at its next sync): teardown names them and changes nothing."""
    config = write_config(tmp_path, cluster)
    assert cli("up", config, tmp_path)[0].exit_code == 0
    cluster.kubectl(mark[0], "configmap", f"{NAME}-config", "-n", "kube-system", mark[1])
    before = owned(cluster.emu)
    cluster.emu.requests.clear()
    for extra in (["--dry-run"], ["--yes"]):
        result, _document = cli("teardown", config, tmp_path, *extra)
        assert result.exit_code == 1, result.output
        said = " ".join(result.output.split())
        assert f"ConfigMap kube-system/{NAME}-config" in said and "remove them from Git" in said, said
    assert cluster.emu.requests.writes() == []
    assert owned(cluster.emu) == before


DRA_OPTIONS = {"kube_version": "1.37.2", "gpu_nodes": ["gpu-1", "gpu-2"], "cpu_nodes": ["cpu-1"]}


def gpu_device_class(name: str = "gpu.nvidia.com") -> dict:
    from tests.localcluster import dra
    return dra.device_class() | {"metadata": {"name": name}}


@pytest.mark.parametrize("emulator_options", [DRA_OPTIONS])
def test_a_cluster_serving_gpus_through_dra_gets_a_profile_that_balances_cpu_and_memory_only(cluster, tmp_path):
    """NVIDIA's DRA driver serves nvidia.com/gpu through its DeviceClass (extendedResourceName). kube-scheduler
    v1.37.2 crashes scoring such a resource in BalancedAllocation (tests/test_dra_scheduling.py), so `up` leaves the
    GPU out there and says so; without such a class the 1.37 default balances the GPU too."""
    config = write_config(tmp_path, cluster)
    result, document = cli("up", config, tmp_path, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "over cpu, memory, nvidia.com/gpu x2" in ours(document)["message"]

    cluster.emu.seed(gpu_device_class())
    result, document = cli("up", config, tmp_path, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "over cpu, memory x2 (nvidia.com/gpu left out: served through DRA, DeviceClass gpu.nvidia.com)" in \
        " ".join(ours(document)["message"].split())
    result, document = cli("up", config, tmp_path)
    assert result.exit_code == 0, result.output
    stored = yaml.safe_load(cluster.emu.get("configmaps", f"{NAME}-config", "kube-system")["data"]["config.yaml"])
    balanced = next(c for c in stored["profiles"][0]["pluginConfig"] if c["name"] == "NodeResourcesBalancedAllocation"
                    ) if any(c["name"] == "NodeResourcesBalancedAllocation"
                             for c in stored["profiles"][0]["pluginConfig"]) else None
    assert balanced is None  # cpu and memory: upstream's default, left implicit
    fit = stored["profiles"][0]["pluginConfig"][0]["args"]["scoringStrategy"]
    assert fit["resources"] == [{"name": "nvidia.com/gpu", "weight": 100}]  # the GPU is still packed


@pytest.mark.parametrize("emulator_options", [DRA_OPTIONS])
def test_a_config_that_balances_a_dra_gpu_is_refused_naming_the_field(cluster, tmp_path):
    cluster.emu.seed(gpu_device_class())
    config = write_config(tmp_path, cluster, "  balanced_allocation_resources: [cpu, memory, nvidia.com/gpu]\n")
    result, document = cli("up", config, tmp_path)
    assert result.exit_code == 1, result.output
    message = " ".join(document["error"].split())
    assert message.startswith("[binpack-scheduler] scheduler.balanced_allocation_resources: nvidia.com/gpu is served "
                              "through DRA here (DeviceClass gpu.nvidia.com)"), message
    assert owned(cluster.emu) == {}  # nothing deployed
