"""A values key with a dot in it (Grafana's `grafana.ini`, a label key `nvidia.com/...`) through the CLI: the plan
names it as helm's --set does (`grafana.grafana\\.ini.server.domain`), the render dir's values and helm's render keep
it as one key, and an export carries it. Found: planning failed with an internal KeyError('grafana')."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from tests.conftest import chart
from tests.nodes.reports import write_report

pytestmark = [pytest.mark.tools]
runner = CliRunner()


def config(tmp_path: Path) -> Path:
    path = tmp_path / "gpu-bootstrap.yaml"
    path.write_text(yaml.safe_dump({
        "nodes": [{"name": "gpu-a1"}, {"name": "gpu-a2"}],
        "gpu_operator": {"chart": str(chart("gpu-operator-v26.7.0.tgz")),
                         "values": {"daemonsets": {"labels": {"nvidia.com/team": "ml"}}}},
        "monitoring": {"mode": "install", "chart": str(chart("kube-prometheus-stack-88.5.3.tgz")),
                       "values": {"grafana": {"grafana.ini": {"server": {"domain": "grafana.example.com"}}}}},
        "admission": {"engine": "vap", "mode": "enforce"}}))
    return path


@pytest.mark.usefixtures("helm_on_path")
def test_a_dotted_key_plans_renders_and_exports(tmp_path):
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    render = tmp_path / "render"
    planned = runner.invoke(app, ["up", "--dry-run", "--offline", "--kube-version", "1.33", "-c", str(config(tmp_path)),
                                  "--preflight-report", str(report), "--render-dir", str(render), "--log-file",
                                  str(tmp_path / "log")])
    assert planned.exit_code == 0, planned.output
    text = " ".join(planned.output.split())
    assert "grafana.grafana\\.ini.server.domain ← your monitoring.values (value not shown)" in text
    assert "daemonsets.labels.nvidia\\.com/team ← your gpu_operator.values (value not shown)" in text
    values = yaml.safe_load((render / "monitoring" / "values.yaml").read_text())
    assert values["grafana"]["grafana.ini"]["server"]["domain"] == "grafana.example.com"
    assert "domain = grafana.example.com" in (render / "monitoring" / "manifests.yaml").read_text()
    operator = yaml.safe_load((render / "gpu-operator" / "values.yaml").read_text())
    assert operator["daemonsets"]["labels"] == {"nvidia.com/team": "ml"}
    exported = runner.invoke(app, ["export", "--format", "helmfile", "-o", str(tmp_path / "helmfile"), "-c",
                                   str(config(tmp_path)), "--offline", "--kube-version", "1.33", "--preflight-report",
                                   str(report), "--log-file", str(tmp_path / "log")])
    assert exported.exit_code == 0, exported.output
    stack = yaml.safe_load((tmp_path / "helmfile" / "values" / "kube-prometheus-stack.yaml").read_text())
    assert stack["grafana"]["grafana.ini"] == {"server": {"domain": "grafana.example.com"}}
