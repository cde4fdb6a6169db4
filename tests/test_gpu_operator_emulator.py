"""The gpu-operator and validate steps against the emulator, with the real chart and the real helm.

The emulator runs a stand-in for the operator's own controllers (tests/kubeapi/gpu_operator_sim.py), since the
real operator cannot run without GPUs: it creates the operands from the ClusterPolicy the chart installs, and a
node advertises nvidia.com/gpu once its device-plugin pod is ready.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from tests.conftest import chart
from tests.nodes.reports import write_report
from tests.test_rbac import uncovered
from tests.tools import tool_env, tool

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.usefixtures("helm_on_path")]
runner = CliRunner()
NODES = ["node5", "node6", "node7"]
OPERATOR_NS = "gpu-operator"


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.33.2", "gpu_nodes": NODES, "cpu_nodes": ["cpu-1"], "gpu_operator": True}


def write_config(tmp_path: Path, cluster, chart_path: Path | None = None, extra: str = "") -> Path:
    path = tmp_path / "gpu-bootstrap.yaml"
    chart_path = chart_path or chart("gpu-operator-v26.7.0.tgz")
    path.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}}}\nnodes:\n" +
                    "".join(f"  - name: {n}\n" for n in NODES) +
                    "monitoring: {enabled: false}\n"  # tests/test_monitoring_emulator.py has the two together
                    f"gpu_operator:\n  chart: {chart_path}\n  wait_timeout: 20\n" + extra)
    return path


def up(config: Path, tmp_path: Path, *extra: str, report: Path | None = None):
    report = report or (tmp_path / "report.json" if (tmp_path / "report.json").exists()
                        else write_report(tmp_path / "report.json", NODES))
    result = runner.invoke(app, ["up", "-c", str(config), "--preflight-report", str(report), "-o", "json", *extra,
                                 "--log-file", str(tmp_path / "log")])
    document = json.loads(result.stdout) if result.stdout.startswith("{") else None
    return result, document


def statuses(document) -> dict:
    return {s["id"]: s["status"] for s in document["steps"]}


def releases(cluster) -> list[dict]:
    return json.loads(cluster.helm("list", "-A", "-o", "json").stdout)


def test_up_installs_waits_for_the_operands_and_validates(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    result, document = up(config, tmp_path)
    assert result.exit_code == 0, result.output
    # every request (helm's, admission's probes and validation's pods included) is one `rbac --for up` grants (#23)
    assert uncovered(cluster.emu.requests.all(), "up", config) == []
    assert statuses(document) == {"preflight": "probed", "node-prep": "applied", "gpu-pools": "skipped", "monitoring": "skipped",
                                  "gpu-operator": "applied", "binpack-scheduler": "applied", "admission-opa": "applied",
                                  "admission": "applied", "queues": "skipped", "validate": "applied"}
    operator = next(s for s in document["steps"] if s["id"] == "gpu-operator")
    assert operator["message"] == "operands ready on 3 GPU node(s), 24 GPU(s) advertised"
    validate = next(s for s in document["steps"] if s["id"] == "validate")
    assert "CUDA vector-add passed on node5, node6, node7" in validate["message"]  # through admission, like any pod
    [release] = releases(cluster)
    assert (release["name"], release["chart"], release["status"]) == ("gpu-operator", "gpu-operator-v26.7.0",
                                                                      "deployed")
    values = json.loads(cluster.helm("get", "values", "gpu-operator", "-n", OPERATOR_NS, "-o", "json").stdout)
    assert values["driver"]["enabled"] is False and values["toolkit"]["enabled"] is False
    daemonsets = {d["metadata"]["name"] for d in cluster.emu.list("daemonsets", OPERATOR_NS)}
    assert "nvidia-driver-daemonset" not in daemonsets and "nvidia-device-plugin-daemonset" in daemonsets
    assert all(cluster.emu.get("nodes", n)["status"]["allocatable"]["nvidia.com/gpu"] == "8" for n in NODES)
    assert cluster.emu.list("pods", "gpu-bootstrap") == []  # validation pods cleaned up


def test_a_second_up_runs_no_helm_upgrade_and_writes_nothing(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    up(config, tmp_path)
    cluster.emu.requests.clear()
    result, document = up(config, tmp_path)
    assert result.exit_code == 0 and set(statuses(document).values()) == {"unchanged", "skipped"}, result.output
    assert cluster.emu.requests.writes() == []
    assert [r["revision"] for r in releases(cluster)] == ["1"]


def test_a_changed_value_upgrades_the_release(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    up(config, tmp_path)
    config = write_config(tmp_path, cluster, extra="  values:\n    dcgmExporter: {enabled: false}\n")
    result, document = up(config, tmp_path)
    assert result.exit_code == 0, result.output
    assert statuses(document)["gpu-operator"] == "applied"
    assert [r["revision"] for r in releases(cluster)] == ["2"]
    cluster.emu.settle()
    assert "nvidia-dcgm-exporter" not in {d["metadata"]["name"] for d in cluster.emu.list("daemonsets", OPERATOR_NS)}


def newer_chart(tmp_path: Path, version: str = "v26.7.1") -> Path:
    folder = tmp_path / "chart"
    with tarfile.open(chart("gpu-operator-v26.7.0.tgz")) as archive:
        archive.extractall(folder, filter="data")
    subprocess.run([tool("helm"), "package", str(folder / "gpu-operator"), "--version", version, "--app-version",
                    version, "-d", str(tmp_path)], check=True, capture_output=True, env=tool_env(tmp_path))
    return tmp_path / f"gpu-operator-{version}.tgz"


def test_a_newer_chart_upgrades_in_place_without_the_crd_hook(cluster, tmp_path):
    """gpu-bootstrap applies the chart's CRDs itself before the upgrade (#26), so the chart's pre-upgrade CRD job
    (operator.upgradeCRD) is off; the same CRDs in the newer chart mean no CRD write at all."""
    config = write_config(tmp_path, cluster)
    up(config, tmp_path)
    cluster.emu.requests.clear()
    config = write_config(tmp_path, cluster, newer_chart(tmp_path))
    result, document = up(config, tmp_path)
    assert result.exit_code == 0, result.output
    operator = next(s for s in document["steps"] if s["id"] == "gpu-operator")
    assert operator["status"] == "applied"
    [release] = releases(cluster)
    assert release["chart"] == "gpu-operator-v26.7.1" and release["revision"] == "2"
    assert not [r for r in cluster.emu.requests.writes() if "/jobs" in r.path and "upgrade-crd" in r.path]
    assert not [r for r in cluster.emu.requests.writes() if "customresourcedefinitions" in r.path]
    assert statuses(document)["validate"] == "applied"  # new operator inputs: validated again


def test_teardown_uninstalls_and_keeps_crds_unless_purged(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    up(config, tmp_path)
    result = runner.invoke(app, ["teardown", "-c", str(config), "--yes", "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 0, result.output
    assert releases(cluster) == []
    cluster.emu.settle()
    crds = {c["metadata"]["name"] for c in cluster.emu.list("customresourcedefinitions")}
    assert "clusterpolicies.nvidia.com" in crds
    assert not cluster.emu.get("nodes", "node5")["spec"].get("taints")
    up(config, tmp_path)
    purged = runner.invoke(app, ["teardown", "-c", str(config), "--yes", "--purge-crds", "--log-file",
                                 str(tmp_path / "log")])
    assert purged.exit_code == 0, purged.output
    cluster.emu.settle()
    crds = {c["metadata"]["name"] for c in cluster.emu.list("customresourcedefinitions")}
    assert "clusterpolicies.nvidia.com" not in crds and "nvidiadrivers.nvidia.com" not in crds


@pytest.mark.parametrize("emulator_options", [{"kube_version": "1.31.4", "gpu_nodes": NODES, "gpu_operator": True}])
def test_an_unsupported_kubernetes_version_is_refused_before_any_write(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    cluster.emu.requests.clear()
    result, document = up(config, tmp_path)
    assert result.exit_code == 2
    assert "validated for Kubernetes 1.33-1.37, but the cluster runs 1.31.4" in document["error"]
    assert "v24.6.2" not in document["error"] or "none in gpu-bootstrap's table" in document["error"]
    assert cluster.emu.requests.writes() == []
    assert releases(cluster) == []


def test_a_stuck_operand_is_named_with_its_node_and_fix(cluster, tmp_path):
    def device_plugin_crashes_on_node6(pod):
        if pod["metadata"]["name"].startswith("nvidia-device-plugin") and pod["spec"].get("nodeName") == "node6":
            return {"phase": "Pending", "ready": False, "reason": "CrashLoopBackOff"}
        return {}

    cluster.emu.controllers.pod_behaviour = device_plugin_crashes_on_node6
    config = write_config(tmp_path, cluster).read_text().replace("wait_timeout: 20", "wait_timeout: 10")
    (tmp_path / "gpu-bootstrap.yaml").write_text(config)
    result, document = up(tmp_path / "gpu-bootstrap.yaml", tmp_path)
    assert result.exit_code == 1
    error = document["error"]
    assert "[gpu-operator] verification failed: not ready after 10s" in error
    assert "nvidia-device-plugin-daemonset on node6 is CrashLoopBackOff" in error
    assert "no runtime for" in error and "node6 advertises no nvidia.com/gpu" in error


def test_time_slicing_multiplies_the_advertised_gpus(cluster, tmp_path):
    config = write_config(tmp_path, cluster, extra="  sharing:\n    mode: time-slicing\n    replicas: 4\n"
                                                     "    profiles: {pair: 2}\n    node_profiles: {node7: pair}\n")
    result, document = up(config, tmp_path)
    assert result.exit_code == 0, result.output
    assert cluster.emu.get("nodes", "node5")["status"]["allocatable"]["nvidia.com/gpu"] == "32"
    assert cluster.emu.get("nodes", "node7")["metadata"]["labels"]["nvidia.com/device-plugin.config"] == "pair"
    names = [c["metadata"]["name"] for c in cluster.emu.list("configmaps", OPERATOR_NS)]
    assert any(n.startswith("time-slicing-") for n in names)


def test_a_mixed_fleet_is_refused_before_any_write(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    report = write_report(tmp_path / "mixed.json", NODES)
    data = json.loads(report.read_text())
    data["nodes"][1]["checks"][1]["data"]["driver_version"] = None
    report.write_text(json.dumps(data))
    cluster.emu.requests.clear()
    result, document = up(config, tmp_path, report=report)
    assert result.exit_code == 1 and "driver_management: per-node" in document["error"]
    assert cluster.emu.requests.writes() == []


def test_a_failing_cuda_workload_fails_validate_and_is_cleaned_up(cluster, tmp_path):
    def cuda_error(pod):
        if "vectoradd" in pod["spec"]["containers"][0]["image"] and pod["spec"].get("nodeName") == "node7":
            return {"phase": "Failed", "ready": False, "exit_code": 1,
                    "log": "[Vector addition of 50000 elements]\nFailed to allocate device vector A (error code "
                           "CUDA driver version is insufficient for CUDA runtime version)!\n"}
        return {}

    cluster.emu.controllers.pod_behaviour = cuda_error
    result, document = up(write_config(tmp_path, cluster), tmp_path)
    assert result.exit_code == 1
    assert "CUDA vector-add failed on node7: Failed" in document["error"]
    assert "CUDA driver version is insufficient" in document["error"]
    assert cluster.emu.list("pods", "gpu-bootstrap") == []
    cluster.emu.controllers.pod_behaviour = lambda pod: {}
    rerun, document = up(write_config(tmp_path, cluster), tmp_path)
    assert rerun.exit_code == 0 and statuses(document)["validate"] == "applied"


def test_doctor_shows_the_operator_state(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    up(config, tmp_path)
    result = runner.invoke(app, ["doctor", "-c", str(config), "--no-nodes", "-o", "json", "--log-file",
                                 str(tmp_path / "log")])
    checks = [c for c in json.loads(result.stdout)["checks"] if c["id"] == "gpu-operator"]
    assert [c["status"] for c in checks] == ["pass", "pass"]
    assert checks[1]["message"] == "operands ready on every GPU node"
    # the operator's driver upgrade controller marks a node failed: doctor warns, naming it and what to read
    node = cluster.emu.get("nodes", NODES[0])
    node["metadata"]["labels"]["nvidia.com/gpu-driver-upgrade-state"] = "upgrade-failed"
    cluster.emu.seed(node)
    result = runner.invoke(app, ["doctor", "-c", str(config), "--no-nodes", "-o", "json", "--log-file",
                                 str(tmp_path / "log")])
    checks = [c for c in json.loads(result.stdout)["checks"] if c["id"] == "gpu-operator"]
    assert [c["status"] for c in checks] == ["pass", "pass", "warn"]
    assert checks[2]["message"].startswith(f"the driver upgrade failed on {NODES[0]}")
    shutil.rmtree(tmp_path / "chart", ignore_errors=True)


def test_a_release_left_uninstalling_is_still_ours_and_up_installs_it_again(cluster, tmp_path):
    """An uninstall that removed the objects but could not delete the release record leaves the release
    `uninstalling` (issue 11's fault runs found this after a recovery): up must not refuse it as someone else's
    release, but finish the uninstall and install again."""
    config = write_config(tmp_path, cluster)
    up(config, tmp_path)
    cluster.emu.faults.add("DELETE", r"/secrets/sh\.helm\.release\.v1\.gpu-operator\.v1$", reset=True, count=1)
    failed = cluster.helm("uninstall", "gpu-operator", "-n", OPERATOR_NS, check=False)
    assert failed.returncode != 0 and "Failed to purge the release" in failed.stderr
    status = json.loads(cluster.helm("status", "gpu-operator", "-n", OPERATOR_NS, "-o", "json").stdout)
    assert status["info"]["status"] == "uninstalling"
    result, document = up(config, tmp_path)
    assert result.exit_code == 0, result.output
    assert statuses(document)["gpu-operator"] == "applied"
    assert [r["status"] for r in releases(cluster)] == ["deployed"]


def test_a_run_killed_together_with_helm_converges_on_rerun(cluster, tmp_path):
    """SIGKILL to gpu-bootstrap's whole process group (helm too, as when the machine dies) mid-install leaves the
    release pending-install; the next `up` clears that and converges."""
    import os
    import signal
    import sys
    import time
    config = write_config(tmp_path, cluster)
    report = write_report(tmp_path / "report.json", NODES)
    cluster.emu.faults.add("PATCH", r"/deployments/gpu-operator$", delay=3, count=1)
    process = subprocess.Popen([sys.executable, "-m", "gpu_bootstrap", "up", "-c", str(config), "--preflight-report",
                                str(report), "--log-file", str(tmp_path / "killed.log")],
                               cwd=Path(__file__).resolve().parent.parent, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=tool_env())
    deadline = time.monotonic() + 60
    while not any(r.path.endswith("/deployments/gpu-operator") and r.method == "PATCH"
                  for r in cluster.emu.requests.all()):
        assert time.monotonic() < deadline, "the install never reached the operator Deployment"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    time.sleep(3.2)
    assert json.loads(cluster.helm("status", "gpu-operator", "-n", OPERATOR_NS, "-o", "json").stdout)[
        "info"]["status"] == "pending-install"
    result, document = up(config, tmp_path)  # the dead holder's lock is taken over without --force-unlock
    assert result.exit_code == 0, result.output
    assert statuses(document)["gpu-operator"] == "applied"
    assert [(r["status"]) for r in releases(cluster)] == ["deployed"]


# --- day 2: upgrading the operator (#26) -----------------------------------------------------------------------------
CLUSTERPOLICY_CRD = "clusterpolicies.nvidia.com"
ONLY = ("--only", "preflight,node-prep,gpu-operator")  # what the operator needs; no validate (keeps it short)


def crd_fields(cluster, name: str) -> set[str]:
    from gpu_bootstrap.render.crds import fields
    return fields(cluster.emu.get("customresourcedefinitions", name))


def test_an_operator_upgrade_applies_the_new_crds_first_and_keeps_a_value_using_a_new_field(cluster, tmp_path):
    """v25.10.1 -> v26.7.0: the plan lists each CRD change before the release change; the ClusterPolicy CRD gains
    v26.7.0's fields (server-side applied by gpu-bootstrap) before helm upgrades the release, so a value only the new
    CRD knows (validator.hostNetwork) survives into the stored ClusterPolicy; a second run writes no CRD; going back
    to v25.10.1 is refused."""
    old = write_config(tmp_path, cluster, chart("gpu-operator-v25.10.1.tgz"))
    result, document = up(old, tmp_path, *ONLY)
    assert result.exit_code == 0, result.output
    assert "spec.validator.hostNetwork" not in crd_fields(cluster, CLUSTERPOLICY_CRD)

    new = write_config(tmp_path, cluster, extra="  values: {validator: {hostNetwork: true}}\n")
    dry, document = up(new, tmp_path, *ONLY, "--dry-run", "--render-dir", str(tmp_path / "plan"))
    assert dry.exit_code == 0, dry.output
    lines = (tmp_path / "plan" / "gpu-operator" / "plan.txt").read_text().splitlines()
    crd_lines = [i for i, line in enumerate(lines) if "CustomResourceDefinition" in line]
    helm_line = next(i for i, line in enumerate(lines) if line.startswith("helm-upgrade"))
    assert len(crd_lines) == 5 and max(crd_lines) < helm_line, lines  # 2 upgraded, 3 new; NFD's are unchanged
    assert "upgrade v25.10.1 → v26.7.0: gpu-operator" in lines[helm_line]
    policy = next(line for line in lines if CLUSTERPOLICY_CRD + ":" in line)
    assert "ClusterPolicy CRD (clusterpolicies.nvidia.com): adds " in policy, policy
    assert "spec.validator.hostNetwork" not in crd_fields(cluster, CLUSTERPOLICY_CRD)  # a dry run writes nothing

    writes = len(cluster.emu.requests.writes())
    result, document = up(new, tmp_path, *ONLY)
    assert result.exit_code == 0, result.output
    assert "spec.validator.hostNetwork" in crd_fields(cluster, CLUSTERPOLICY_CRD)
    crd = cluster.emu.get("customresourcedefinitions", CLUSTERPOLICY_CRD)
    managers = {m["manager"] for m in crd["metadata"]["managedFields"]}
    assert "gpu-bootstrap" in managers
    assert crd["metadata"]["annotations"]["gpu-bootstrap.io/chart-version"] == "v26.7.0"
    policy = cluster.emu.list("clusterpolicies")[0]
    assert policy["spec"]["validator"].get("hostNetwork") is True  # not pruned: the CRD knew it in time
    crd_writes = [r for r in cluster.emu.requests.writes()[writes:] if "customresourcedefinitions" in r.path]
    assert crd_writes and {r.query.get("fieldManager") for r in crd_writes} == {"gpu-bootstrap"}
    assert cluster.emu.get("customresourcedefinitions", "computedomains.resource.nvidia.com") is not None  # new CRD

    writes = len(cluster.emu.requests.writes())
    again, document = up(new, tmp_path, *ONLY)
    assert again.exit_code == 0 and statuses(document)["gpu-operator"] == "unchanged", document
    assert not [r for r in cluster.emu.requests.writes()[writes:] if "customresourcedefinitions" in r.path]

    old = write_config(tmp_path, cluster, chart("gpu-operator-v25.10.1.tgz"))  # the same file, the old chart again
    back, document = up(old, tmp_path, *ONLY)
    assert back.exit_code != 0
    message = json.dumps(document)
    assert "v26.7.0 is installed, newer than the v25.10.1 the config asks for" in message
    assert "allow_downgrade" in message
    assert releases(cluster)[0]["chart"] == "gpu-operator-v26.7.0"


def test_without_the_monitoring_step_the_service_monitor_is_on_only_where_its_crd_is_served(cluster, tmp_path):
    """`up --only node-prep,gpu-operator` with monitoring on in the config: on a cluster that serves no
    ServiceMonitor CRD the exporter's ServiceMonitor is off (NVIDIA's controller would keep the ClusterPolicy
    notReady: tests/test_gpu_operator_real.py), and the ClusterPolicy gets ready; once the CRD is served, the next
    run turns it on and the operator makes it."""
    config = write_config(tmp_path, cluster)
    config.write_text(config.read_text().replace("monitoring: {enabled: false}\n", ""))
    planned = runner.invoke(app, ["up", "-c", str(config), "--preflight-report", str(write_report(
        tmp_path / "report.json", NODES)), "--only", "node-prep,gpu-operator", "--dry-run"], env={"COLUMNS": "400"})
    assert "serves no ServiceMonitor CRD" in planned.output, planned.output  # the value says why
    result, document = up(config, tmp_path, "--only", "node-prep,gpu-operator")
    assert result.exit_code == 0, result.output
    values = json.loads(cluster.helm("get", "values", "gpu-operator", "-n", OPERATOR_NS, "-o", "json").stdout)
    assert values["dcgmExporter"]["serviceMonitor"] == {"enabled": False}
    cluster.emu.settle()
    assert cluster.emu.get("clusterpolicies", "cluster-policy")["status"]["state"] == "ready"
    with tarfile.open(chart("prometheus-operator-crds-v0.80.0.tgz")) as archive:
        import yaml
        member = next(m for m in archive.getmembers() if m.name.endswith("_servicemonitors.yaml"))
        cluster.emu.seed(yaml.safe_load(archive.extractfile(member).read()))
    result, document = up(config, tmp_path, "--only", "node-prep,gpu-operator")
    assert result.exit_code == 0, result.output
    assert statuses(document)["gpu-operator"] == "applied"
    values = json.loads(cluster.helm("get", "values", "gpu-operator", "-n", OPERATOR_NS, "-o", "json").stdout)
    assert values["dcgmExporter"]["serviceMonitor"]["enabled"] is True
    cluster.emu.settle()
    assert cluster.emu.get("servicemonitors", "nvidia-dcgm-exporter", OPERATOR_NS) is not None
