"""`up --dry-run` on a fresh cluster: the Quick start's second command must plan every step, even though the
gpu-operator's CRDs (and so its ClusterPolicy) do not exist yet. Real helm, the real chart, the emulator (with no
gpu-operator stand-in and no CRDs)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from tests.conftest import chart
from tests.nodes.reports import write_report

pytestmark = [pytest.mark.tools, pytest.mark.usefixtures("helm_on_path")]
runner = CliRunner()
NODES = ["node5", "node6"]


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.33.2", "gpu_nodes": NODES, "cpu_nodes": ["cpu-1"]}


def test_a_dry_run_on_a_fresh_cluster_plans_every_step(cluster, tmp_path):
    assert not [c for c in cluster.emu.list("customresourcedefinitions") if "nvidia" in c["metadata"]["name"]]
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}}}\nnodes:\n" +
                      "".join(f"  - name: {n}\n" for n in NODES) +
                      f"gpu_operator:\n  chart: {chart('gpu-operator-v26.7.0.tgz')}\n"
                      f"monitoring:\n  chart: {chart('kube-prometheus-stack-88.5.3.tgz')}\n")
    report = write_report(tmp_path / "report.json", NODES)
    before = cluster.emu.snapshot()
    result = runner.invoke(app, ["up", "--dry-run", "-c", str(config), "--preflight-report", str(report), "-o", "json",
                                 "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 0, result.output
    steps = {s["id"]: s for s in json.loads(result.stdout)["steps"]}
    assert steps.pop("gpu-pools")["status"] == "skipped"  # no pools configured
    assert steps.pop("queues")["status"] == "skipped"  # no teams configured
    assert [s for s in steps if steps[s]["status"] not in ("planned", "probed", "unchanged")] == []
    assert steps["gpu-operator"]["status"] == "planned"
    assert "validated client-side" in steps["gpu-operator"]["message"]
    assert "ClusterPolicy" in steps["gpu-operator"]["message"]
    assert "validated client-side" in steps["monitoring"]["message"]  # kube-prometheus-stack's Prometheus etc.
    assert cluster.emu.snapshot() == before  # a dry run stores nothing


def test_a_dry_run_rejects_a_custom_resource_its_crd_schema_refuses(cluster, tmp_path):
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}}}\nnodes:\n" +
                      "".join(f"  - name: {n}\n" for n in NODES) +
                      f"gpu_operator:\n  chart: {chart('gpu-operator-v26.7.0.tgz')}\n"
                      f"  values: {{driver: {{enabled: 'yes please'}}}}\nmonitoring:\n  enabled: false\n")
    report = write_report(tmp_path / "report.json", NODES)
    result = runner.invoke(app, ["up", "--dry-run", "-c", str(config), "--preflight-report", str(report), "-o", "json",
                                 "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert "ClusterPolicy" in document["error"] and "driver.enabled" in document["error"]
