"""gpu_operator.allocation: dra against the emulator, with the real gpu-operator chart, NVIDIA's real DRA driver chart
(v0.5.0, from its source module: scripts/install-test-tools) and the real helm.

Fake by necessity: no GPU, kubelet or DRA kubelet plugin can run here, so the emulator's gpu-operator stand-in
(tests/kubeapi/gpu_operator_sim.py) publishes a node's GPUs as a ResourceSlice once the DRA driver's kubelet-plugin
pod is ready there, as the driver does. The scheduler side of DRA is proved on the real kube-scheduler in
tests/test_dra_scheduling.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from tests.conftest import chart
from tests.nodes.reports import write_report
from tests.test_rbac import uncovered
from tests.tools import tool_env

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.usefixtures("helm_on_path")]
runner = CliRunner()
NODES = ["node5", "node6", "node7"]
DRA_NS = "dra-driver-nvidia-gpu"
ONLY = "preflight,node-prep,gpu-operator"  # the CUDA validation is the scheduler's part (see the docstring)


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.37.2", "gpu_nodes": NODES, "cpu_nodes": ["cpu-1"], "gpu_operator": True}


def write_config(tmp_path: Path, cluster, allocation: str = "dra") -> Path:
    path = tmp_path / "gpu-bootstrap.yaml"
    path.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}}}\nnodes:\n" +
                    "".join(f"  - name: {n}\n" for n in NODES) + "monitoring: {enabled: false}\n"
                    # the validation pods go to the default scheduler: no bin-packing scheduler runs here
                    "validate: {nodes: all, timeout: 60}\nscheduler: {enabled: false}\n"
                    f"gpu_operator:\n  chart: {chart('gpu-operator-v26.7.0.tgz')}\n  wait_timeout: 30\n"
                    f"  allocation: {allocation}\n"
                    f"  dra_driver: {{chart: {chart('dra-driver-nvidia-gpu-0.5.0')}}}\n")
    return path


def up(config: Path, tmp_path: Path, *extra: str, only: str = ONLY):
    report = tmp_path / "report.json"
    if not report.exists():
        write_report(report, NODES)
    result = runner.invoke(app, ["up", "-c", str(config), "--preflight-report", str(report), "--only", only,
                                 "-o", "json", *extra, "--log-file", str(tmp_path / "log")])
    document = json.loads(result.stdout) if result.stdout.startswith("{") else None
    return result, document


def step(document, step_id: str = "gpu-operator") -> dict:
    return next(s for s in document["steps"] if s["id"] == step_id)


def releases(cluster) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads(cluster.helm("list", "-A", "-o", "json").stdout)}


def values(cluster, release: str, namespace: str) -> dict:
    return json.loads(cluster.helm("get", "values", release, "-n", namespace, "-o", "json").stdout)


def advertised(cluster) -> dict[str, str]:
    return {n: (cluster.emu.get("nodes", n)["status"].get("allocatable") or {}).get("nvidia.com/gpu", "0")
            for n in NODES}


def test_dra_mode_installs_the_driver_beside_the_operator_and_verifies_the_published_gpus(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    result, document = up(config, tmp_path, only=ONLY + ",validate")
    assert result.exit_code == 0, result.output
    assert step(document)["message"] == ("operands and the DRA driver ready on 3 GPU node(s), 24 GPU(s) published "
                                         "as ResourceSlices")
    # the CUDA sample ran with a GPU through the extended resource on every node, and once through a claim template
    assert step(document, "validate")["message"] == (
        "CUDA vector-add passed on node5, node5 (GPU from a ResourceClaim), node6, node7")
    assert cluster.emu.list("pods", "gpu-bootstrap") == []
    assert cluster.emu.list("resourceclaimtemplates", "gpu-bootstrap") == []
    # every request of the run (helm's for both charts included) is one `rbac --for up` grants
    missing = uncovered(cluster.emu.requests.all(), "up", config)
    assert missing == [], "\n".join(missing)
    deployed = releases(cluster)
    assert {name: r["status"] for name, r in deployed.items()} == {"gpu-operator": "deployed",
                                                                  "dra-driver-nvidia-gpu": "deployed"}
    operator_values = values(cluster, "gpu-operator", "gpu-operator")
    assert operator_values["devicePlugin"] == {"enabled": False}
    assert {"name": "KUBERNETES_ENABLE_DRA", "value": "true"} in operator_values["dcgmExporter"]["env"]
    reader = cluster.emu.get("clusterrolebindings", "gpu-bootstrap-dcgm-exporter-dra")
    assert reader["subjects"] == [{"kind": "ServiceAccount", "name": "nvidia-dcgm-exporter",
                                   "namespace": "gpu-operator"}]
    assert cluster.emu.get("clusterroles", "gpu-bootstrap-dcgm-exporter-dra")["rules"][0]["resources"] == \
        ["resourceslices"]
    policy = cluster.emu.get("validatingadmissionpolicies", "gpu-bootstrap-dra-resourceslices")
    assert "dra-driver-nvidia-gpu-service-account-kubeletplugin" in policy["spec"]["matchConditions"][0]["expression"]
    dra = values(cluster, "dra-driver-nvidia-gpu", DRA_NS)
    assert dra["nvidiaDriverRoot"] == "/"  # the report's nodes have their driver pre-installed
    assert dra["resources"] == {"gpus": {"enabled": True}, "computeDomains": {"enabled": False}}
    cluster.emu.settle()
    # no node serves nvidia.com/gpu from a device plugin; the class maps that name to DRA for pods as users write them
    assert advertised(cluster) == {n: "0" for n in NODES}
    assert not [d for d in cluster.emu.list("daemonsets", "gpu-operator")
                if d["metadata"]["name"].startswith("nvidia-device-plugin")]
    assert cluster.emu.get("deviceclasses", "gpu.nvidia.com")["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert {n: cluster.emu.get("nodes", n)["metadata"]["labels"].get("nvidia.com/dra-kubelet-plugin")
            for n in NODES} == {n: "true" for n in NODES}
    namespace = cluster.emu.get("namespaces", DRA_NS)["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "privileged"
    # a second run finds both releases up to date and writes nothing
    cluster.emu.requests.clear()
    result, document = up(config, tmp_path)
    assert result.exit_code == 0 and step(document)["status"] == "unchanged", result.output
    assert cluster.emu.requests.writes() == []
    # teardown removes the DRA driver, its namespace and our node label, then the operator
    result = runner.invoke(app, ["teardown", "-c", str(config), "--yes", "--log-file", str(tmp_path / "t.log")])
    assert result.exit_code == 0, result.output
    assert releases(cluster) == {}
    cluster.emu.settle()
    assert cluster.emu.get("namespaces", DRA_NS) is None or \
        cluster.emu.get("namespaces", DRA_NS)["metadata"].get("deletionTimestamp")
    assert not any("nvidia.com/dra-kubelet-plugin" in (cluster.emu.get("nodes", n)["metadata"].get("labels") or {})
                   for n in NODES)
    assert cluster.emu.list("resourceslices") == []
    assert cluster.emu.get("clusterroles", "gpu-bootstrap-dcgm-exporter-dra") is None
    assert cluster.emu.get("validatingadmissionpolicies", "gpu-bootstrap-dra-resourceslices") is None


def test_moving_a_running_cluster_between_modes_needs_the_flag_and_never_serves_a_node_both_ways(cluster, tmp_path):
    result, _document = up(write_config(tmp_path, cluster, "device-plugin"), tmp_path)
    assert result.exit_code == 0, result.output
    cluster.emu.settle()
    assert advertised(cluster) == {n: "8" for n in NODES}
    # to DRA: refused without the flag, nothing written
    config = write_config(tmp_path, cluster, "dra")
    cluster.emu.requests.clear()
    result, document = up(config, tmp_path)
    assert result.exit_code == 1, result.output
    assert "--allow-allocation-change" in document["error"]
    assert cluster.emu.requests.writes() == []
    result, document = up(config, tmp_path, "--allow-allocation-change")
    assert result.exit_code == 0, result.output
    cluster.emu.settle()
    assert advertised(cluster) == {n: "0" for n in NODES}
    assert len(cluster.emu.list("resourceslices")) == 3
    # and back: the DRA driver goes before the device plugin returns
    config = write_config(tmp_path, cluster, "device-plugin")
    result, document = up(config, tmp_path)
    assert result.exit_code == 1 and "--allow-allocation-change" in document["error"]
    cluster.emu.requests.clear()
    result, document = up(config, tmp_path, "--allow-allocation-change")
    assert result.exit_code == 0, result.output
    writes = [r.path for r in cluster.emu.requests.writes()]
    removed = next(i for i, path in enumerate(writes) if f"/namespaces/{DRA_NS}/daemonsets/" in path)
    upgraded = next(i for i, path in enumerate(writes) if "/clusterpolicies/" in path)
    assert removed < upgraded, writes
    # the role for the move back is `rbac --for up --allow-allocation-change`: the config's own mode no longer
    # grants removing the DRA driver's release, the flag's role grants every request of it
    assert uncovered(cluster.emu.requests.all(), "up", config, both_allocations=True) == []
    assert any(f"in {DRA_NS}" in line for line in uncovered(cluster.emu.requests.all(), "up", config))
    assert set(releases(cluster)) == {"gpu-operator"}
    assert cluster.emu.get("clusterroles", "gpu-bootstrap-dcgm-exporter-dra") is None
    cluster.emu.settle()
    assert advertised(cluster) == {n: "8" for n in NODES}
    assert cluster.emu.list("resourceslices") == []


def test_an_offline_plan_renders_the_drivers_chart_with_each_derived_value_and_its_reason(tmp_path, monkeypatch):
    """No cluster: `up --dry-run --offline` renders both charts with helm for Kubernetes 1.37."""
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text("nodes: [{name: node5}, {name: node6}]\nmonitoring: {enabled: false}\n"
                      f"gpu_operator:\n  chart: {chart('gpu-operator-v26.7.0.tgz')}\n  allocation: dra\n"
                      f"  dra_driver: {{chart: {chart('dra-driver-nvidia-gpu-0.5.0')}}}\n")
    report = write_report(tmp_path / "report.json", ["node5", "node6"], driver=None)
    out = tmp_path / "out"
    result = runner.invoke(app, ["up", "--dry-run", "--offline", "--kube-version", "1.37", "-c", str(config),
                                 "--only", "gpu-operator", "--preflight-report", str(report), "--render-dir", str(out),
                                 "-o", "json", "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 0, result.output
    assert step(json.loads(result.stdout))["status"] == "planned"
    folder = out / "gpu-operator"
    release = yaml.safe_load((folder / "dra-driver-nvidia-gpu-release.yaml").read_text())
    assert (release["release"], release["chart_version"], release["kube_version"]) == \
        ("dra-driver-nvidia-gpu", "0.5.0", "1.37.1")  # --kube-version 1.37: its newest patch gpu-bootstrap knows
    derived = {line.split("=", 1)[0]: line for line in release["derived_values"]}
    assert set(derived) == {"resources.gpus.enabled", "gpuResourcesEnabledOverride",
                            "resources.computeDomains.enabled", "nvidiaDriverRoot", "kubeletPlugin.nodeSelector"}
    assert all("  ← " in line and line.split("  ← ")[1] for line in derived.values())
    assert derived["nvidiaDriverRoot"].startswith('nvidiaDriverRoot="/run/nvidia/driver"  ← the operator installs')
    manifests = [d for d in yaml.safe_load_all((folder / "dra-driver-nvidia-gpu-manifests.yaml").read_text()) if d]
    classes = {d["metadata"]["name"]: d["spec"] for d in manifests if d["kind"] == "DeviceClass"}
    assert classes["gpu.nvidia.com"]["extendedResourceName"] == "nvidia.com/gpu"
    [plugin] = [d for d in manifests if d["kind"] == "DaemonSet"]
    assert plugin["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/dra-kubelet-plugin": "true"}
    roots = {v["name"]: v["hostPath"]["path"] for v in plugin["spec"]["template"]["spec"]["volumes"]
             if "hostPath" in v}
    assert roots["driver-root"] == "/run/nvidia/driver"
    operator = yaml.safe_load((folder / "values.yaml").read_text())
    assert operator["devicePlugin"]["enabled"] is False and operator["driver"]["enabled"] is True
    # the GitOps export carries the driver as its own unit after the operator's, without the CRDs the operator owns
    exported = tmp_path / "export"
    result = runner.invoke(app, ["export", "--format", "manifests", "-o", str(exported), "--offline", "--kube-version",
                                 "1.37", "-c", str(config), "--only", "gpu-operator", "--preflight-report", str(report),
                                 "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 0, result.output
    units = sorted(p.name for p in exported.iterdir() if p.is_dir())
    kinds = {unit: {d["kind"] for f in sorted((exported / unit).glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
                    if d} for unit in units}
    driver = next(unit for unit in units if "DeviceClass" in kinds[unit])
    readme = (exported / "README.md").read_text()  # the manifests format's order: the README's list of units
    assert readme.index(f"| {driver} |") > readme.index("| gpu-operator-gpu-operator |") and "DaemonSet" in kinds[driver]
    assert "CustomResourceDefinition" not in kinds[driver]
    # the same plan for a 1.33 cluster: bad input naming the field, exit 2
    result = runner.invoke(app, ["up", "--dry-run", "--offline", "--kube-version", "1.33", "-c", str(config),
                                 "--only", "gpu-operator", "--preflight-report", str(report),
                                 "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 2 and "gpu_operator.allocation: dra needs Kubernetes 1.34" in result.output


def test_a_run_killed_while_helm_installs_the_dra_driver_converges_on_rerun(cluster, tmp_path):
    """SIGKILL to gpu-bootstrap's process group (helm too) while helm installs the DRA driver leaves that release
    pending-install; the next `up` clears it and reaches the state of an uninterrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time
    config = write_config(tmp_path, cluster)
    report = write_report(tmp_path / "report.json", NODES)
    plugin = r"/daemonsets/dra-driver-nvidia-gpu-kubelet-plugin$"
    cluster.emu.faults.add("PATCH", plugin, delay=3, count=1)
    cluster.emu.faults.add("POST", r"/namespaces/dra-driver-nvidia-gpu/daemonsets$", delay=3, count=1)
    process = subprocess.Popen([sys.executable, "-m", "gpu_bootstrap", "up", "-c", str(config), "--only", ONLY,
                                "--preflight-report", str(report), "--log-file", str(tmp_path / "killed.log")],
                               cwd=Path(__file__).resolve().parent.parent, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=tool_env())
    deadline = time.monotonic() + 60
    while not any("/namespaces/dra-driver-nvidia-gpu/daemonsets" in r.path and r.method in ("POST", "PATCH")
                  for r in cluster.emu.requests.all()):
        assert time.monotonic() < deadline and process.poll() is None, "the run never reached the DRA driver"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    time.sleep(3.2)
    assert json.loads(cluster.helm("status", "dra-driver-nvidia-gpu", "-n", DRA_NS, "-o", "json").stdout)[
        "info"]["status"] == "pending-install"
    result, document = up(config, tmp_path)  # the dead holder's lock is taken over
    assert result.exit_code == 0, result.output
    assert step(document)["message"].startswith("operands and the DRA driver ready on 3 GPU node(s)")
    assert {name: r["status"] for name, r in releases(cluster).items()} == {"gpu-operator": "deployed",
                                                                           "dra-driver-nvidia-gpu": "deployed"}
    cluster.emu.requests.clear()
    result, document = up(config, tmp_path)
    assert result.exit_code == 0 and step(document)["status"] == "unchanged", result.output
    assert cluster.emu.requests.writes() == []


@pytest.mark.parametrize("release, values", [
    ("dra-driver-nvidia-gpu", {}), ("gpu", {}), ("a-long-release-name-for-the-dra-driver-of-our-gpus", {}),
    ("gpu", {"nameOverride": "dra"}), ("gpu", {"fullnameOverride": "nvidia-dra"}),
    ("gpu", {"serviceAccount": {"name": "plugin"}})])
def test_our_resourceslice_policy_names_the_account_the_charts_kubelet_plugin_runs_as(release, values, tmp_path):
    """The policy is only as good as the ServiceAccount it names: the chart rendered with that release name and those
    values runs its kubelet plugin as exactly that account (the chart's own policy names another)."""
    import subprocess
    from gpu_bootstrap.steps import gpu_operator_dra
    from tests.tools import tool
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump({"gpuResourcesEnabledOverride": True, **values}))
    rendered = subprocess.run([tool("helm"), "template", release, str(chart("dra-driver-nvidia-gpu-0.5.0")),
                               "--namespace", DRA_NS, "--kube-version", "1.37.0", "--values", str(values_file)],
                              capture_output=True, text=True, check=True, env=tool_env(tmp_path / "helm-home")).stdout
    documents = [d for d in yaml.safe_load_all(rendered) if d]
    [plugin] = [d for d in documents if d["kind"] == "DaemonSet"]
    account = plugin["spec"]["template"]["spec"]["serviceAccountName"]
    assert gpu_operator_dra.plugin_account(release, values) == account
    [theirs] = [d for d in documents if d["kind"] == "ValidatingAdmissionPolicy"]
    assert account not in theirs["spec"]["matchConditions"][0]["expression"]  # upstream's miss, still there
    ours = gpu_operator_dra.slice_policy_objects(DRA_NS, release, values, {})[0]
    assert f"'system:serviceaccount:{DRA_NS}:{account}'" in ours["spec"]["matchConditions"][0]["expression"]


def test_a_dra_driver_installed_another_way_is_named_and_left_alone(cluster, tmp_path):
    """NVIDIA's DRA driver installed by hand (or by another release): its DeviceClass is there and no release of ours
    holds it. `up` in dra mode names it and installs nothing (a second driver would fail in helm on the class, found
    on the real API server, or publish every GPU twice); the class stays as it was."""
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                    "metadata": {"name": "gpu.nvidia.com", "labels": {"team": "platform"}},
                    "spec": {"extendedResourceName": "nvidia.com/gpu",
                             "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}
    cluster.emu.seed(device_class)
    before = cluster.emu.get("deviceclasses", "gpu.nvidia.com")
    config = write_config(tmp_path, cluster)
    result, document = up(config, tmp_path, only="gpu-operator")
    assert result.exit_code == 1, result.output
    assert document["error"].startswith(
        "[gpu-operator] NVIDIA's DRA driver is installed already, not by gpu-bootstrap: DeviceClass gpu.nvidia.com "
        "(not from a helm release)"), document
    assert releases(cluster) == {}
    assert cluster.emu.get("deviceclasses", "gpu.nvidia.com") == before
