"""What a new user meets first, through the real CLI in-process: help, version, and bad input answered with the
field or file it is about, as text or as JSON. The cluster runs are against the API emulator."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap import __version__
from gpu_bootstrap.cli import commands as cli
from gpu_bootstrap.cli.commands import app
from tests.nodes.reports import write_report

ROOT = Path(__file__).resolve().parent.parent
SPINE = ["--playbook", str(ROOT / "tests" / "playbooks" / "spine.yaml")]
runner = CliRunner()


def invoke(*args: str, tmp_path: Path, **kwargs):
    return runner.invoke(app, [*args, "--log-file", str(tmp_path / "run.log")], **kwargs)


@pytest.mark.unit
def test_version_flag_and_command_agree():
    assert runner.invoke(app, ["--version"]).stdout == runner.invoke(app, ["version"]).stdout == \
        f"gpu-bootstrap {__version__}\n"


@pytest.mark.unit
@pytest.mark.parametrize("command", ["up", "doctor", "teardown", "simulate", "init", "rbac"])
def test_help_shows_no_placeholder_after_a_flag_and_examples_stay_on_one_line(command):
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "80", "NO_COLOR": "1"})
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout and "<int>" not in result.stdout
    assert "[default: (" not in result.stdout  # defaults are values, not descriptions
    lines = result.stdout.splitlines()
    for index, line in enumerate(lines):  # an example line never continues on the next line
        if line.strip().startswith("gpu-bootstrap ") and index + 1 < len(lines):
            assert not re.match(r"^\s+[a-z-]+\S*\s*$", lines[index + 1]) or "gpu-bootstrap" in lines[index + 1]


@pytest.mark.unit
def test_a_config_error_under_json_is_a_json_document_on_stdout(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - name: 'node 6'\n")
    result = invoke("up", "--dry-run", "--offline", "-c", str(bad), "-o", "json", tmp_path=tmp_path)
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert document["ok"] is False and document["exit_code"] == 2 and document["steps"] == []
    assert document["error"].startswith(f"{bad}:2: nodes[0].name: 'node 6' is not a valid Kubernetes node name")


@pytest.mark.unit
def test_a_missing_kubeconfig_is_bad_input_naming_the_path(tmp_path):
    missing = tmp_path / "nope" / "kubeconfig"
    result = invoke("up", "-c", str(ROOT / "examples" / "minimal.yaml"), "--kubeconfig", str(missing),
                    tmp_path=tmp_path)
    assert result.exit_code == 2
    assert f"kubeconfig {missing} not found" in " ".join(result.output.split())


@pytest.mark.unit
def test_doctor_without_a_kubeconfig_suggests_checking_the_nodes_only(tmp_path):
    missing = tmp_path / "nope" / "kubeconfig"
    result = invoke("doctor", "-c", str(ROOT / "examples" / "minimal.yaml"), "--kubeconfig", str(missing),
                    tmp_path=tmp_path)
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "doctor --no-cluster" in text and "up --dry-run --offline" in text


def test_an_unknown_context_lists_the_ones_there_are(cluster, tmp_path):
    result = invoke("doctor", "-c", str(ROOT / "examples" / "minimal.yaml"), "--kubeconfig", str(cluster.kubeconfig),
                    "--context", "staging", "--no-nodes", tmp_path=tmp_path)
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    contexts = [c["name"] for c in yaml.safe_load(cluster.kubeconfig.read_text())["contexts"]]
    assert f"has no context 'staging' — its contexts: {', '.join(contexts)}" in text and contexts


@pytest.mark.unit
def test_only_lists_only_the_selected_steps(tmp_path):
    result = invoke("up", "--dry-run", "--offline", "-c", str(ROOT / "examples" / "minimal.yaml"), "--only",
                    "node-prep", "-o", "json", tmp_path=tmp_path)
    assert [s["id"] for s in json.loads(result.stdout)["steps"]] == ["node-prep"]


@pytest.fixture
def emulator_options():
    return {"gpu_nodes": ["node5", "node6"], "cpu_nodes": ["cpu-1"], "kube_version": "1.33.0"}


def config_for(cluster, tmp_path: Path) -> Path:
    path = tmp_path / "gpu-bootstrap.yaml"
    path.write_text(f"cluster:\n  kubeconfig: {cluster.kubeconfig}\nnodes:\n  - name: node5\n  - name: node6\n")
    return path


def test_doctor_before_up_says_what_is_not_there_yet(cluster, tmp_path, helm_on_path):
    result = invoke("doctor", "-c", str(config_for(cluster, tmp_path)), "--no-nodes", "-o", "json", tmp_path=tmp_path)
    checks = {c["id"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["validate"]["status"] == "skip" and checks["validate"]["message"].startswith("not run yet")
    assert checks["node-prep"]["status"] == "warn"
    assert checks["gpu-operator"]["status"] == "warn" and checks["gpu-operator"]["message"].endswith("not installed")


def test_answering_no_at_teardown_aborts_and_changes_nothing(cluster, tmp_path, monkeypatch):
    """The terminal check is the one thing replaced here (CliRunner's stdin is no tty); the answer is typed."""
    config = config_for(cluster, tmp_path)
    report = write_report(tmp_path / "report.json", ["node5", "node6"])
    done = invoke("up", "-c", str(config), "--preflight-report", str(report), *SPINE, tmp_path=tmp_path)
    assert done.exit_code == 0, done.output
    before = cluster.emu.get("nodes", "node5")["spec"].get("taints")
    monkeypatch.setattr(cli, "interactive", lambda: True)
    result = invoke("teardown", "-c", str(config), *SPINE, tmp_path=tmp_path, input="n\n")
    assert result.exit_code == 1
    assert "teardown will make" in result.stdout and "error: aborted — nothing was changed" in result.output
    assert cluster.emu.get("nodes", "node5")["spec"].get("taints") == before and before


def test_teardown_rows_say_what_was_removed(cluster, tmp_path):
    config = config_for(cluster, tmp_path)
    report = write_report(tmp_path / "report.json", ["node5", "node6"])
    assert invoke("up", "-c", str(config), "--preflight-report", str(report), *SPINE, tmp_path=tmp_path).exit_code == 0
    result = invoke("teardown", "-c", str(config), "--yes", "-o", "json", *SPINE, tmp_path=tmp_path)
    steps = {s["id"]: s for s in json.loads(result.stdout)["steps"]}
    assert steps["node-prep"]["message"].startswith("remove label nvidia.com/gpu.present")
    assert steps["preflight"]["message"] == "nothing to undo"


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """`gpu-bootstrap images --offline | head -0`: the real CLI in a subprocess writes into a pipe whose reader has
    already closed. It stops as a command SIGPIPE ends (exit 141), with no "internal error" and no trace."""
    import os
    import subprocess
    import sys
    read, write = os.pipe()
    os.close(read)  # before the command writes anything: its first write fails, whatever the pipe's buffer holds
    process = subprocess.run([sys.executable, "-m", "gpu_bootstrap", "images", "--offline", "-c",
                              str(ROOT / "examples" / "minimal.yaml"), "--log-file", str(tmp_path / "run.log")],
                             stdout=write, stderr=subprocess.PIPE, cwd=ROOT, timeout=60)
    os.close(write)
    assert process.returncode == 141, process.stderr.decode()
    assert process.stderr == b""
