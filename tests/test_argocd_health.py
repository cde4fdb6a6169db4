"""The Argo CD bundle's health check for Applications, run by Argo CD's own code.

An app-of-apps waits between sync waves only for resources whose health Argo CD assesses, and since Argo CD 1.8 it
assesses none for an Application. The bundle carries the documented `resource.customizations.health.argoproj.io_
Application` check as a patch to argocd-cm. Here that exact script from an export is evaluated by `argo-health`, a
wrapper around Argo CD's controller call (`health.GetResourceHealth` with `lua.ResourceHealthOverrides`, Argo CD
v3.2.12's util/lua and gitops-engine, built from their Go modules by scripts/install-test-tools from
scripts/gomod/argo-health): with it a child Application is Progressing until it reports its own health, Degraded or
Healthy as it reports; without it Argo CD gives an Application no health at all, which is why the waves did not wait.

The limit: the wave gate itself (gitops-engine's sync moving to the next wave once the previous wave's resources are
Healthy) is not run here; it is Argo CD's documented behaviour for resources with a health.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from tests.nodes.reports import write_report
from tests.tools import tool_env, missing, run

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def argo_health() -> str:
    version = next(line.split()[1] for line in (ROOT / "scripts" / "gomod" / "argo-health" / "go.mod").read_text()
                   .splitlines() if line.strip().startswith("github.com/argoproj/argo-cd/v3 "))
    path = ROOT / ".tools" / "argo-health" / version / "argo-health"
    if not path.exists():
        missing(f"Argo CD's health evaluation is not built ({path}): scripts/install-test-tools")
    return str(path)


def application(status: dict | None) -> dict:
    app_ = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "gpu-bootstrap-gpu-operator-gpu-operator", "namespace": "argocd"},
            "spec": {"project": "default", "destination": {"server": "https://kubernetes.default.svc"}}}
    if status is not None:
        app_["status"] = status
    return app_


@pytest.mark.tools
@pytest.mark.parametrize("status, expected", [
    (None, "Progressing"),  # created by the app-of-apps, not yet synced: the wave waits
    ({"sync": {"status": "OutOfSync"}, "health": {"status": "Missing"}}, "Missing"),
    ({"health": {"status": "Progressing"}}, "Progressing"),
    ({"health": {"status": "Degraded", "message": "Deployment gpu-operator exceeded its progress deadline"}},
     "Degraded"),
    ({"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}, "Healthy"),  # the next wave may start
])
def test_the_exported_health_check_gives_each_application_the_health_it_reports(tmp_path, status, expected):
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    out = tmp_path / "argocd"
    result = runner.invoke(app, ["export", "--format", "argocd", "-o", str(out), "-c",
                                 str(ROOT / "examples" / "fleet-gitops.yaml"), "--offline", "--kube-version", "1.33",
                                 "--preflight-report", str(report), "--repo-url", "https://git.example.com/fleet.git",
                                 "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 0, result.output
    patch = yaml.safe_load((out / "argocd" / "argocd-cm-application-health.yaml").read_text())
    script = tmp_path / "application-health.lua"
    script.write_text(patch["data"]["resource.customizations.health.argoproj.io_Application"])
    obj = json.dumps(application(status))
    assessed = run([argo_health(), str(script)], tool_env(tmp_path), 60, input=obj)
    assert json.loads(assessed.stdout)["status"] == expected
    if status and status["health"].get("message"):
        assert json.loads(assessed.stdout)["message"] == status["health"]["message"]
    unassessed = run([argo_health(), "--builtin"], tool_env(tmp_path), 60, input=obj)
    assert json.loads(unassessed.stdout)["status"] == ""  # Argo CD's default: no health for an Application
