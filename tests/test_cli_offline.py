"""The CLI without a cluster: the offline dry run (the CI mode), step selection, help, exit codes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from tests.tools import tool_env
from tests.toy_step import written_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
runner = CliRunner()


def invoke(*args: str, tmp_path: Path):
    return runner.invoke(app, [*args, "--log-file", str(tmp_path / "log")])


@pytest.mark.unit
@pytest.mark.parametrize("example, kube", [("minimal.yaml", []), ("three-gpu-nodes.yaml", ["--kube-version", "1.24"])])
def test_offline_dry_run_writes_the_node_prep_patches(example, kube, tmp_path):
    out = tmp_path / "out"
    result = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(EXAMPLES / example), "--render-dir", str(out), *kube,
                    tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    folder = out / "node-prep"
    patches = sorted(folder.glob("*-patch-node-*.yaml"))
    config = yaml.safe_load((EXAMPLES / example).read_text())
    assert [p.name.split("-patch-node-")[1][:-5] for p in patches] == [n["name"] for n in config["nodes"]]
    body = yaml.safe_load(patches[0].read_text())
    assert body["spec"]["taints"][0]["key"] == "nvidia.com/gpu"
    assert body["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert "why:" in patches[0].read_text() and (folder / "plan.txt").read_text().count("\n") == len(patches)


@pytest.mark.unit
def test_offline_json_document(tmp_path):
    """An offline plan with no node facts decides the gpu-operator's driver and toolkit values blind: it is
    incomplete (found: it said "ok": true and exited 0, so a CI gate passed on it). Without --allow-incomplete it
    exits 1 with "ok": false and names what is missing; with it, 0, naming the same."""
    refused = invoke("up", "--dry-run", "--offline", "-c", str(EXAMPLES / "minimal.yaml"), "-o", "json",
                     tmp_path=tmp_path)
    assert refused.exit_code == 1
    document = json.loads(refused.stdout)
    assert document["ok"] is False and document["exit_code"] == 1
    assert document["incomplete"] == ["gpu-operator: driver.enabled, toolkit.enabled decided without node facts (pass "
                                      "--preflight-report FILE, or plan against the cluster)"]
    assert document["error"].endswith("— pass --allow-incomplete to accept a partial plan")
    result = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(EXAMPLES / "minimal.yaml"), "-o",
                    "json", tmp_path=tmp_path)
    assert result.exit_code == 0
    document = json.loads(result.stdout)
    assert document["ok"] is True and document["incomplete"] == json.loads(refused.stdout)["incomplete"]
    assert [(s["id"], s["status"], s["changes"]) for s in document["steps"] if written_for([s["id"]])] == [
        ("preflight", "skipped", 0), ("node-prep", "planned", 2), ("gpu-pools", "skipped", 0),
        ("monitoring", "planned", 8), ("gpu-operator", "incomplete", 4), ("binpack-scheduler", "planned", 9),
        ("admission-opa", "planned", 8), ("admission", "planned", 5), ("validate", "planned", 3)]
    by_id = {s["id"]: s for s in document["steps"]}
    assert by_id["preflight"]["message"] == ("no node facts in an offline run; pass --preflight-report FILE (a "
                                               "saved 'gpu-bootstrap doctor -o json') to plan with them")
    assert by_id["node-prep"]["message"] == (
        "2 of 2 GPU node(s) need taint/labels: gpu-node-1, gpu-node-2; GPU pods that do not tolerate "
        "nvidia.com/gpu=present:NoSchedule get the toleration from admission (mode mutate)")


@pytest.mark.unit
def test_render_dir_is_refreshed_not_accumulated(tmp_path):
    out = tmp_path / "out"
    (out / "07-old-step").mkdir(parents=True)  # a numbered folder of an older version's render
    (out / "keep.txt").write_text("mine")
    for _ in range(2):
        invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(EXAMPLES / "minimal.yaml"), "--render-dir", str(out),
               tmp_path=tmp_path)
    assert sorted(p.name for p in out.iterdir() if p.suffix or written_for([p.name])) == [
        "admission", "admission-opa", "binpack-scheduler", "gpu-operator", "keep.txt", "monitoring", "node-prep",
        "steps.txt", "validate"]
    assert written_for((out / "steps.txt").read_text().split()) == ["preflight", "node-prep", "gpu-pools", "monitoring",
                                                                "gpu-operator", "binpack-scheduler", "admission-opa",
                                                                "admission", "validate"]
    assert (out / "node-prep" / "plan.txt").read_text().count("\n") == 2


@pytest.mark.unit
def test_render_dir_refuses_a_folder_of_the_users_where_a_step_goes(tmp_path):
    out = tmp_path / "out"
    (out / "validate").mkdir(parents=True)
    (out / "validate" / "mine.txt").write_text("mine")
    result = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(EXAMPLES / "minimal.yaml"),
                    "--render-dir", str(out), tmp_path=tmp_path)
    assert result.exit_code == 2 and "holds validate, which no render of gpu-bootstrap wrote" in result.output
    assert sorted(p.name for p in out.rglob("*")) == ["mine.txt", "validate"]


@pytest.mark.unit
def test_skip_leaves_a_step_out(tmp_path):
    result = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(EXAMPLES / "minimal.yaml"), "--skip", "node-prep",
                    "-o", "json", tmp_path=tmp_path)
    steps = {s["id"]: s for s in json.loads(result.stdout)["steps"]}
    assert steps["node-prep"] == {"id": "node-prep", "status": "skipped", "changes": 0, "message": "left out (--skip)"}


@pytest.mark.unit
@pytest.mark.parametrize("args, message", [
    (["--only", "nonsense"], "unknown step 'nonsense'"),
    (["--skip", "gpu-operatr"], "unknown step 'gpu-operatr'"),
    (["--only", "admission", "--playbook", str(ROOT / "tests" / "playbooks" / "spine.yaml")],
     "not in playbook 'spine'"),
    (["--playbook", "nope"], "no playbook named 'nope'"),
    (["--kube-version", "one.two"], "not a Kubernetes version"),
])
def test_bad_selection_exits_2(args, message, tmp_path):
    result = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(EXAMPLES / "minimal.yaml"), *args, tmp_path=tmp_path)
    assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.unit
def test_offline_needs_dry_run(tmp_path):
    result = invoke("up", "--offline", "-c", str(EXAMPLES / "minimal.yaml"), tmp_path=tmp_path)
    assert result.exit_code == 2 and "--offline only makes sense with --dry-run" in result.output


@pytest.mark.unit
def test_custom_playbook_file(tmp_path):
    playbook = tmp_path / "mine.yaml"
    playbook.write_text("name: mine\nsteps: [node-prep]\n")  # no preflight: a playbook may leave steps out
    result = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(EXAMPLES / "minimal.yaml"), "--playbook",
                    str(playbook), tmp_path=tmp_path)
    assert result.exit_code == 0 and "(mine)" in result.output
    playbook.write_text("steps: [node-prep, warp-drive]\n")
    bad = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(EXAMPLES / "minimal.yaml"), "--playbook",
                 str(playbook), tmp_path=tmp_path)
    assert bad.exit_code == 2 and "unknown step 'warp-drive'" in bad.output


@pytest.mark.unit
def test_unknown_flag_is_a_usage_error():
    result = runner.invoke(app, ["up", "--dryrun"])
    assert result.exit_code == 2 and "No such option" in result.output


@pytest.mark.unit
def test_help_teaches_with_examples():
    result = runner.invoke(app, ["up", "--help"])
    assert result.exit_code == 0
    for text in ("--dry-run", "--offline", "--allow-incomplete", "--render-dir", "--only", "--force-unlock", "Examples"):
        assert text in result.output


def test_version_and_module_entry_point(tmp_path):
    assert runner.invoke(app, ["version"]).output.startswith("gpu-bootstrap ")
    process = subprocess.run([sys.executable, "-m", "gpu_bootstrap", "--help"], capture_output=True, text=True,
                             cwd=ROOT, env=tool_env(NO_COLOR="1"))
    assert process.returncode == 0 and "\x1b[" not in process.stdout and "Commands" in process.stdout


def test_default_log_file_is_private_and_named_on_failure(tmp_path):
    env = tool_env(XDG_STATE_HOME=str(tmp_path / "state"))
    process = subprocess.run([sys.executable, "-m", "gpu_bootstrap", "up", "--dry-run", "--offline", "--allow-incomplete", "-c",
                              str(tmp_path / "missing.yaml")], capture_output=True, text=True, cwd=ROOT, env=env)
    assert process.returncode == 2
    [log] = list((tmp_path / "state" / "gpu-bootstrap" / "logs").glob("up-*.log"))
    assert f"details: {log}" in process.stderr
    assert oct(log.stat().st_mode & 0o777) == "0o600"


@pytest.mark.unit
def test_validation_pods_use_the_binpack_scheduler_when_the_playbook_deploys_it(tmp_path):
    out = tmp_path / "out"
    invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(EXAMPLES / "minimal.yaml"), "--render-dir", str(out),
           tmp_path=tmp_path)
    pod = yaml.safe_load((out / "validate" / "02-create-pod-gpu-bootstrap-validate-gpu-node-1.yaml").read_text())
    assert pod["spec"]["schedulerName"] == "gpu-binpack-scheduler"
    invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(EXAMPLES / "minimal.yaml"), "--render-dir", str(out),
           "--playbook", str(ROOT / "tests" / "playbooks" / "no-scheduler.yaml"), tmp_path=tmp_path)
    pod = yaml.safe_load((out / "validate" / "02-create-pod-gpu-bootstrap-validate-gpu-node-1.yaml").read_text())
    assert "schedulerName" not in pod["spec"]


@pytest.mark.unit
def test_a_cluster_too_old_for_the_scheduler_profile_fails_its_check(tmp_path):
    result = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "--kube-version", "1.22", "-c", str(EXAMPLES / "minimal.yaml"),
                    "--only", "binpack-scheduler", tmp_path=tmp_path)
    assert result.exit_code == 1
    assert "[binpack-scheduler] scheduler: Kubernetes 1.22 is too old for the bin-packing profile" in \
        " ".join(result.output.split())


@pytest.mark.unit
@pytest.mark.parametrize("kube, image", [(["--kube-version", "1.24"], "v1.24.17"), ([], "v1.33.7"),
                                         (["--kube-version", "1.24.3"], "v1.24.3")])
def test_an_offline_plan_picks_the_newest_known_scheduler_patch_not_x_y_0(kube, image, tmp_path):
    """--kube-version 1.24 (or none: the default minor) plans for that minor's newest known patch; an exact version is
    kept exactly."""
    result = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(EXAMPLES / "minimal.yaml"), "--only", "binpack-scheduler",
                    "-o", "json", *kube, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    message = json.loads(result.stdout)["steps"][0]["message"]
    assert f"registry.k8s.io/kube-scheduler:{image};" in message, message


def test_the_readmes_first_command_runs_without_helm_and_says_what_is_missing(tmp_path):
    """README's first command on a fresh machine (no helm on PATH, no chart repository): it plans, exits 0 and names
    the charts it could not render with how to get helm; the same plan without the README's --allow-incomplete exits
    1 with one line naming the flag."""
    import shlex
    readme = (EXAMPLES.parent / "README.md").read_text().splitlines()
    command = readme[readme.index("```bash") + 1].split(" && ", 1)[1]
    args = [a.replace("out/", str(tmp_path / "out") + "/") for a in shlex.split(command)[1:]]
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_BOOTSTRAP_HELM",)}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if not (Path(p) / "helm").exists() and ".tools" not in p)
    env["GPU_BOOTSTRAP_LOG_DIR"] = str(tmp_path)
    run = subprocess.run([sys.executable, "-m", "gpu_bootstrap", *args, "--log-file", str(tmp_path / "log")],
                         cwd=EXAMPLES.parent, env=env, capture_output=True, text=True, timeout=300)  # tool_env: none, a machine with no helm
    assert run.returncode == 0, run.stderr
    said = " ".join((run.stdout + run.stderr).split())
    assert "incomplete, accepted (--allow-incomplete): monitoring: kube-prometheus-stack manifests not rendered " \
           "(helm not found — install helm v3.14+ or v4 on PATH" in said, said
    strict = subprocess.run([sys.executable, "-m", "gpu_bootstrap", *[a for a in args if a != "--allow-incomplete"],
                             "--log-file", str(tmp_path / "log2")], cwd=EXAMPLES.parent, env=env,  # tool_env: none, no helm
                            capture_output=True, text=True, timeout=300)
    assert strict.returncode == 1
    errors = [line for line in strict.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].endswith("pass --allow-incomplete to accept a partial plan"), strict.stderr


@pytest.mark.unit
def test_teardown_can_be_previewed_offline_and_removes_everything_up_would_make(tmp_path):
    """Found: `teardown --dry-run --offline` was refused (No such option). Now it plans a fresh `up` offline and
    shows the teardown of what that leaves: each object `up` would apply is removed, each release uninstalled,
    each node patched back, then the tool's own namespace; with no helm here, the charts' contents are said to be
    unlisted rather than silently left out."""
    config = str(EXAMPLES / "fleet-gitops.yaml")
    up = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", config, "-o", "json", tmp_path=tmp_path)
    assert up.exit_code == 0, up.output
    made = {(c["verb"], c["target"]) for s in json.loads(up.stdout)["steps"] for c in s.get("planned", [])
            if s["id"] != "validate"}
    result = invoke("teardown", "--dry-run", "--offline", "-c", config, "-o", "json", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    removed = {(c["verb"], c["target"]) for s in json.loads(result.stdout)["steps"] for c in s.get("planned", [])}
    for verb, target in made:
        undo = {"apply": "delete", "create": "delete", "patch": "patch", "helm-upgrade": "helm-uninstall"}[verb]
        assert (undo, target) in removed, (verb, target)
    assert ("delete", "Lease kube-system/gpu-binpack-scheduler") in removed  # made by the scheduler as it runs
    shown = invoke("teardown", "--dry-run", "--offline", "-c", config, tmp_path=tmp_path)
    assert shown.exit_code == 0, shown.output
    assert "then the tool's own namespace gpu-bootstrap" in shown.output
    assert "gpu-operator: its chart was not rendered" in " ".join(shown.output.split()) or \
        "gpu-operator: its chart could not be rendered" in " ".join(shown.output.split())
