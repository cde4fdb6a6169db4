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
from tests.tools import tool_env

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
    assert f"has no context 'staging' (from flag --context) — its contexts: {', '.join(contexts)}" in text
    assert contexts


@pytest.mark.parametrize("given, said", [
    ({"env": {"GPU_BOOTSTRAP_CONTEXT": "staging"}}, "(from environment variable GPU_BOOTSTRAP_CONTEXT)"),
    ({"file": "  context: staging\n"}, "gpu-bootstrap.yaml:3)"),
])
def test_a_bad_context_says_where_it_was_given(cluster, tmp_path, monkeypatch, given, said):
    """Issue 56: a bad context from GPU_BOOTSTRAP_CONTEXT did not say it came from the environment."""
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text(f"cluster:\n  kubeconfig: {cluster.kubeconfig}\n{given.get('file', '')}nodes:\n  - name: node5\n")
    for name, value in given.get("env", {}).items():
        monkeypatch.setenv(name, value)
    result = invoke("doctor", "-c", str(config), "--no-nodes", tmp_path=tmp_path)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "has no context 'staging'" in text and said in text, text


@pytest.mark.unit
def test_a_missing_kubeconfig_from_the_environment_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_BOOTSTRAP_KUBECONFIG", str(tmp_path / "nope"))
    result = invoke("doctor", "-c", str(ROOT / "examples" / "minimal.yaml"), "--no-nodes", tmp_path=tmp_path)
    assert result.exit_code == 2
    assert "(from environment variable GPU_BOOTSTRAP_KUBECONFIG)" in " ".join(result.output.split())


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
                             stdout=write, stderr=subprocess.PIPE, cwd=ROOT, timeout=60, env=tool_env())
    os.close(write)
    assert process.returncode == 141, process.stderr.decode()
    assert process.stderr == b""


@pytest.mark.usefixtures("helm_on_path")
def test_a_plan_says_its_kubernetes_first_repeats_nothing_warns_of_nothing_expected_and_sums_up(tmp_path):
    """README's kind of plan, as a new user reads it at 80 columns: found, it planned for 1.33 without saying so,
    warned on every fresh plan that the webhook's caBundle Secret did not exist yet, printed monitoring's note and the
    DCGM exporter's values twice, ran lines to 600 characters, ended with no "N to create" line, and wrote
    release.yaml with \\u2190 escapes."""
    import subprocess
    import sys
    from tests.conftest import chart
    report = write_report(tmp_path / "report.json", ["gpu-node-1", "gpu-node-2"])
    config = tmp_path / "gpu-bootstrap.yaml"  # minimal.yaml, with the charts' archives (no repository here)
    config.write_text(yaml.safe_dump({"nodes": [{"name": "gpu-node-1"}, {"name": "gpu-node-2"}],
                                      "gpu_operator": {"chart": str(chart("gpu-operator-v26.7.0.tgz"))},
                                      "monitoring": {"chart": str(chart("kube-prometheus-stack-88.5.3.tgz"))}}))
    run = subprocess.run([sys.executable, "-m", "gpu_bootstrap", "up", "--dry-run", "--offline", "-c",
                          str(config), "--preflight-report", str(report), "--render-dir",
                          str(tmp_path / "out"), "--log-file", str(tmp_path / "log")], capture_output=True,
                         text=True, env=tool_env(COLUMNS="80", NO_COLOR="1"), timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "Kubernetes 1.33.7 (offline default; --kube-version X.Y plans for yours)"
    assert run.stderr == "", run.stderr  # nothing expected is a warning
    plan_lines = [line for line in lines if line.startswith(" ")]
    # wrapped at 80 columns; only a single word longer than a line (a path: this run's tmp folder) may overflow
    overflowing = [line for line in lines if len(line) > 80 and len(line.split()) > 1]
    assert plan_lines and not overflowing, overflowing
    detail = [line.strip() for line in plan_lines if line.startswith("        ") and not line.startswith("            ")]
    assert len(detail) == len(set(detail)), [d for d in detail if detail.count(d) > 1]
    assert sum("dcgmExporter.serviceMonitor=" in line for line in lines) == 1
    verdict = next(line for line in lines if line.startswith("plan: "))
    assert re.match(r"plan: \d+ to create, \d+ to change, 0 to remove \(\d+ change\(s\) planned in node-prep,", verdict)
    release = (tmp_path / "out" / "gpu-operator" / "release.yaml").read_text()
    assert "\\u2190" not in release and "←" in release


COMMANDS = ["up", "doctor", "teardown", "status", "simulate", "images", "export", "rbac", "init"]


@pytest.mark.unit
@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_readable_at_80_columns_and_wraps_where_the_terminal_does(command):
    """Found: option help cut short at 80 columns (`GPU_BOOTSTRAP_KUBECONF…`, `(name,cpu_milli,memo…`), an enum
    folded mid-word (`<plan|dry-run|up|stat us|doctor>`), and the docstrings' own line breaks landing mid-sentence.
    Now nothing is cut off, and a paragraph is one line when the terminal is wide enough to hold it."""
    narrow = runner.invoke(app, [command, "--help"], env={"COLUMNS": "80", "NO_COLOR": "1"})
    assert narrow.exit_code == 0
    assert "…" not in narrow.stdout, [line for line in narrow.stdout.splitlines() if "…" in line]
    assert "stat us" not in narrow.stdout
    wide = runner.invoke(app, [command, "--help"], env={"COLUMNS": "3000", "NO_COLOR": "1"})
    description = wide.stdout.split("Usage:", 1)[1].split("╭")[0].split("Examples")[0]
    lines = [line.strip() for line in description.splitlines()[1:] if line.strip()]
    assert lines and all(line.endswith((".", ":", ")", "`")) for line in lines), lines


@pytest.mark.unit
@pytest.mark.parametrize("args, said", [
    (["up", "--bogus"], "error: No such option: --bogus"),
    (["rbac", "--for", "nope"], "error: Invalid value for '--for'"),
    (["up", "--kube-version"], "error: Option '--kube-version' requires an argument."),
])
def test_bad_usage_is_one_error_line_like_every_other_error(args, said):
    """Found: a rich box for some bad values, a plain `error:` line for others. Now one style, exit 2."""
    result = runner.invoke(app, args, env={"COLUMNS": "80", "NO_COLOR": "1"})
    assert result.exit_code == 2
    assert result.output.startswith(said) and "╭" not in result.output and len(result.output.splitlines()) == 1, \
        result.output
