"""The offline plan of the gpu-operator step: exact merged values, the release, and manifests that validate against
the official schemas of the target Kubernetes version (custom resources against the chart's own CRDs)."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from tests.conftest import chart
from tests.nodes.reports import write_report
from tests.tools import tool_env, run, tool

pytestmark = [pytest.mark.tools, pytest.mark.usefixtures("helm_on_path")]
runner = CliRunner()
kubernetes_validate = pytest.importorskip("kubernetes_validate")


def plan(tmp_path: Path, kube: str, extra: str = "", report: bool = True):
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text("nodes:\n  - name: node5\n  - name: node6\n"
                      f"gpu_operator:\n  chart: {chart('gpu-operator-v26.7.0.tgz')}\n" + extra)
    # --allow-incomplete: monitoring's repository chart cannot be pulled offline (and without a report the operator's
    # values are decided without node facts); the operator's own render is what these tests read
    args = ["up", "--dry-run", "--offline", "--allow-incomplete", "--kube-version", kube, "-c", str(config),
            "--render-dir", str(tmp_path / "out"), "-o", "json", "--log-file", str(tmp_path / "log")]
    if report:
        args += ["--preflight-report", str(write_report(tmp_path / "report.json", ["node5", "node6"]))]
    result = runner.invoke(app, args)
    return result, tmp_path / "out" / "gpu-operator"


def crd_schemas(tmp_path: Path) -> dict[tuple[str, str], dict]:
    out = run([tool("helm"), "show", "crds", str(chart("gpu-operator-v26.7.0.tgz"))], tool_env(tmp_path)).stdout
    schemas = {}
    for crd in (d for d in yaml.safe_load_all(out) if d):
        for version in crd["spec"]["versions"]:
            api_version = f"{crd['spec']['group']}/{version['name']}"
            schemas[(api_version, crd["spec"]["names"]["kind"])] = version["schema"]["openAPIV3Schema"]
    return schemas


@pytest.mark.parametrize("kube", ["1.33.0", "1.35.0"])
def test_offline_plan_writes_values_release_and_valid_manifests(tmp_path, kube):
    result, folder = plan(tmp_path, kube)
    assert result.exit_code == 0, result.output
    values = yaml.safe_load((folder / "values.yaml").read_text())
    assert values["driver"]["enabled"] is False and values["toolkit"]["enabled"] is False
    release = yaml.safe_load((folder / "release.yaml").read_text())
    assert release["chart_version"] == "v26.7.0" and release["kube_version"] == kube
    assert any(line.startswith("driver.enabled=false") for line in release["derived_values"])
    # the manifests are exactly what helm renders with those values
    again = run([tool("helm"), "template", "gpu-operator", str(chart("gpu-operator-v26.7.0.tgz")), "-n",
                 "gpu-operator", "--kube-version", kube, "-f", str(folder / "values.yaml")], tool_env(tmp_path))
    assert list(yaml.safe_load_all((folder / "manifests.yaml").read_text())) == list(yaml.safe_load_all(again.stdout))
    schemas = crd_schemas(tmp_path)
    documents = [d for d in yaml.safe_load_all((folder / "manifests.yaml").read_text()) if d]
    assert len(documents) > 20
    for doc in documents:
        custom = schemas.get((doc["apiVersion"], doc["kind"]))
        if custom is not None:
            jsonschema.validate(doc, custom)
        else:
            kubernetes_validate.validate(doc, kube, strict=True)


def test_an_unsupported_version_is_refused_offline_too(tmp_path):
    result, _folder = plan(tmp_path, "1.31")
    assert result.exit_code == 2
    assert "validated for Kubernetes 1.33-1.37, but the cluster runs 1.31.14" in json.loads(result.stdout)["error"]


def test_offline_without_facts_keeps_chart_defaults(tmp_path):
    result, folder = plan(tmp_path, "1.33", report=False)
    assert result.exit_code == 0, result.output
    values = yaml.safe_load((folder / "values.yaml").read_text())
    assert values["driver"]["enabled"] is True
    assert any("offline" in line for line in yaml.safe_load((folder / "release.yaml").read_text())["derived_values"])


def test_a_repository_chart_without_network_still_plans_values(tmp_path):
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text("nodes:\n  - name: node5\n")
    result = runner.invoke(app, ["up", "--dry-run", "--offline", "--kube-version", "1.33", "-c", str(config),
                                 "--render-dir", str(tmp_path / "out"), "--log-file", str(tmp_path / "log")])
    # the plan says it is incomplete and exits 1 (a CI gate must not pass it), and still writes the values
    assert result.exit_code == 1 and "the plan is incomplete: " in result.output, result.output
    assert "gpu-operator manifests not rendered" in result.output and "--allow-incomplete" in result.output
    folder = tmp_path / "out" / "gpu-operator"
    assert (folder / "values.yaml").exists() and (folder / "release.yaml").exists()
    note = folder / "manifests-not-rendered.txt"  # unless this machine can reach NVIDIA's chart repository
    assert (folder / "manifests.yaml").exists() or "set gpu_operator.chart to a local .tgz" in note.read_text()
