"""The CI workflows in examples/ci pass actionlint (the real checker, from the test extra), and the live workflow
keeps what docs/testing.md "Testing on a real cluster" promises: two Kubernetes versions on kind, images pinned by
digest, scripts/test-live, gpu-bootstrap's log uploaded on failure."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.tools import tool

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / "examples" / "ci").glob("*.yaml"))
LIVE = ROOT / "examples" / "ci" / "live-kind.yaml"


def actionlint(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([tool("actionlint"), "-no-color", *map(str, paths)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


@pytest.mark.tools
@pytest.mark.parametrize("workflow", WORKFLOWS, ids=[w.name for w in WORKFLOWS])
def test_workflow_passes_actionlint(workflow):
    result = actionlint(workflow)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.tools
def test_actionlint_would_see_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text(LIVE.read_text().replace("${{ matrix.image }}", "${{ matrix.imag }}"))
    result = actionlint(broken)
    assert result.returncode != 0 and "imag" in result.stdout, result.stdout + result.stderr


@pytest.mark.unit
def test_the_live_workflow_runs_two_pinned_kubernetes_versions_on_kind():
    job = yaml.safe_load(LIVE.read_text())["jobs"]["live"]
    matrix = job["strategy"]["matrix"]["include"]
    assert len(matrix) == 2 and matrix[0]["kubernetes"] == "1.30"  # the backstop's first version
    for row in matrix:
        tag = re.fullmatch(r"kindest/node:v(\d+\.\d+)\.\d+@sha256:[0-9a-f]{64}", row["image"])
        assert tag and tag.group(1) == row["kubernetes"], row
    runs = " ".join(step.get("run", "") for step in job["steps"])
    assert "scripts/test-live" in runs and "kind create cluster" in runs and "examples/kind/live-cluster.yaml" in runs
    upload = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["if"] == "failure()" and upload["with"]["path"].rstrip("/") == "live-artifacts"
    recipe = (ROOT / "docs" / "testing.md").read_text()
    assert all(row["image"] in recipe for row in matrix), "docs/testing.md's kind recipe names other images"


@pytest.mark.unit
def test_pull_requests_plan_with_the_read_only_role_and_only_main_gets_the_dry_run_role():
    """A pull request's code must not reach a write-equivalent token: its cluster job runs `up --dry-run=client`
    with the plan role's kubeconfig; the server-side dry run (the dry-run role) runs on pushes to main only."""
    workflow = yaml.safe_load((ROOT / "examples" / "ci" / "github-actions.yaml").read_text())
    jobs = workflow["jobs"]

    def runs(job):
        return " ".join(step.get("run", "") for step in job["steps"])
    pr_jobs = {name: job for name, job in jobs.items() if "if" not in job or "pull_request" in str(job["if"])}
    for name, job in pr_jobs.items():
        assert "DRY_RUN_KUBECONFIG" not in str(job), name  # no write-equivalent token where a PR's code runs
        assert "up --dry-run " not in runs(job).replace("--dry-run=client", "") or "--offline" in runs(job), name
    assert "--dry-run=client" in runs(jobs["plan-against-the-cluster"])
    assert "GPU_BOOTSTRAP_PLAN_KUBECONFIG" in str(jobs["plan-against-the-cluster"]["env"])
    main = jobs["dry-run-on-main"]
    assert main["if"] == "github.event_name == 'push' && github.ref == 'refs/heads/main'"
    assert "GPU_BOOTSTRAP_DRY_RUN_KUBECONFIG" in str(main["env"]) and "up --dry-run -c" in runs(main)
    assert "rbac --for plan" in (ROOT / "examples" / "ci" / "github-actions.yaml").read_text()
