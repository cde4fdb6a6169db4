"""`gpu-bootstrap up / doctor / teardown` against the Kubernetes API emulator, through the real CLI.

In-process runs use Typer's CliRunner; runs that need signals or concurrency are real subprocesses.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.pipeline.checkpoint import NAME as STATE, NAMESPACE
from gpu_bootstrap.pipeline.lock import LEASE
from tests.kubeapi import Emulator
from tests.nodes.reports import write_report
from tests.tools import tool_env

ROOT = Path(__file__).resolve().parent.parent
SPINE = ["--playbook", str(ROOT / "tests" / "playbooks" / "spine.yaml")]  # the engine's tests need no Helm
NODES = ["node5", "node6", "node7"]
runner = CliRunner()


@pytest.fixture
def emulator_options():
    return {"gpu_nodes": NODES, "cpu_nodes": ["cpu-1"], "kube_version": "1.31.0"}


def write_config(path: Path, kubeconfig: Path, labels: dict | None = None, nodes=NODES) -> Path:
    lines = [f"cluster:\n  kubeconfig: {kubeconfig}", "nodes:"] + [f"  - name: {n}" for n in nodes]
    if labels:
        lines.append("node_prep:\n  labels: {" + ", ".join(f"{k}: {v}" for k, v in labels.items()) + "}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def config(tmp_path, cluster):
    return write_config(tmp_path / "gpu-bootstrap.yaml", cluster.kubeconfig)


def cli(*args: str, tmp_path: Path):
    """The CLI in-process. These nodes have no SSH, so `up` reads their facts from a saved preflight report."""
    extra = ["--preflight-report", str(report(tmp_path))] if args[0] == "up" else []
    if args[0] == "doctor":
        extra = ["--no-nodes"]
    return runner.invoke(app, [*args, *extra, *SPINE, "--log-file", str(tmp_path / "run.log")])


def report(tmp_path: Path, nodes=NODES) -> Path:
    path = tmp_path / "preflight-report.json"
    return path if path.exists() else write_report(path, list(nodes))


def node_view(emu: Emulator, name: str) -> dict:
    node = emu.get("nodes", name)
    return {"labels": node["metadata"].get("labels") or {}, "taints": node["spec"].get("taints") or [],
            "annotations": node["metadata"].get("annotations") or {}}


def step(document: dict, step_id: str) -> dict:
    return next(s for s in document["steps"] if s["id"] == step_id)


def up_json(config: Path, tmp_path: Path, *extra: str) -> dict:
    result = cli("up", "-c", str(config), "-o", "json", *extra, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# --- the happy path ---------------------------------------------------------------------------------------------
def test_up_taints_and_labels_every_gpu_node(emu, config, tmp_path):
    document = up_json(config, tmp_path)
    assert document["ok"] is True and [s["id"] for s in document["steps"]] == ["preflight", "node-prep"]
    assert step(document, "node-prep") == {"id": "node-prep", "status": "applied", "changes": 3,
                                           "message": "3 GPU node(s) tainted and labelled"}
    assert step(document, "preflight")["status"] == "probed" and "3 GPU node(s) checked" in \
        step(document, "preflight")["message"]
    for name in NODES:
        view = node_view(emu, name)
        assert view["labels"]["nvidia.com/gpu.present"] == "true"
        assert view["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert "nvidia.com/gpu.present" not in node_view(emu, "cpu-1")["labels"]
    state = json.loads(emu.get("configmaps", STATE, NAMESPACE)["data"]["node-prep"])
    assert state["status"] == "applied" and state["changes"] == 3 and state["fingerprint"]
    assert not emu.get("leases", LEASE, NAMESPACE)["spec"].get("holderIdentity")


def test_second_up_is_unchanged_and_makes_no_write_request(emu, config, tmp_path):
    up_json(config, tmp_path)
    emu.requests.clear()
    document = up_json(config, tmp_path)
    assert [s["status"] for s in document["steps"]] == ["unchanged", "unchanged"]
    assert emu.requests.writes() == [], [str(r) for r in emu.requests.writes()]
    assert emu.requests.all(), "the second run must still read the real state"


def test_the_fingerprints_key_is_a_secret_of_ours_and_the_fingerprints_depend_on_it(emu, config, tmp_path):
    """The checkpoint's fingerprints are HMACs under a per-cluster key (tests/test_fingerprint_key.py says why): the
    first up makes the key's Secret; with a new key (its Secret deleted) the next up records new fingerprints."""
    import base64
    from gpu_bootstrap.pipeline.checkpoint import KEY_SECRET
    up_json(config, tmp_path)
    secret = emu.get("secrets", KEY_SECRET, NAMESPACE)
    assert secret["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpu-bootstrap"}
    assert len(base64.b64decode(secret["data"]["key"])) == 32
    before = {k: json.loads(v)["fingerprint"] for k, v in emu.get("configmaps", STATE, NAMESPACE)["data"].items()}
    emu.delete("secrets", KEY_SECRET, NAMESPACE)
    document = up_json(config, tmp_path)
    assert [s["status"] for s in document["steps"]] == ["probed", "unchanged"]  # re-recorded, nothing changed
    after = {k: json.loads(v)["fingerprint"] for k, v in emu.get("configmaps", STATE, NAMESPACE)["data"].items()}
    assert set(after) == set(before) and all(after[k] != before[k] for k in after)
    assert emu.get("secrets", KEY_SECRET, NAMESPACE)["data"]["key"] != secret["data"]["key"]


def test_a_changed_label_re_runs_only_node_prep_and_moves_the_label(emu, cluster, tmp_path):
    config = write_config(tmp_path / "c.yaml", cluster.kubeconfig, {"team": "ml"})
    up_json(config, tmp_path)
    before = json.loads(emu.get("configmaps", STATE, NAMESPACE)["data"]["node-prep"])
    write_config(config, cluster.kubeconfig, {"team": "ai"})
    emu.requests.clear()
    document = up_json(config, tmp_path)
    assert step(document, "preflight")["status"] == "unchanged"
    assert step(document, "node-prep") == {"id": "node-prep", "status": "applied", "changes": 3,
                                           "message": "3 GPU node(s) tainted and labelled"}
    after = json.loads(emu.get("configmaps", STATE, NAMESPACE)["data"]["node-prep"])
    assert after["fingerprint"] != before["fingerprint"]
    patched = {r.path.rsplit("/", 1)[-1] for r in emu.requests.writes() if "/nodes/" in r.path}
    assert patched == set(NODES)
    assert all(node_view(emu, n)["labels"]["team"] == "ai" for n in NODES)


def test_drift_is_repaired_even_with_an_unchanged_config(emu, config, cluster, tmp_path):
    up_json(config, tmp_path)
    cluster.kubectl("taint", "node", "node6", "nvidia.com/gpu=present:NoSchedule-")
    document = up_json(config, tmp_path)
    assert step(document, "node-prep")["status"] == "applied" and step(document, "node-prep")["changes"] == 1
    assert node_view(emu, "node6")["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]


def test_teardown_leaves_nodes_exactly_as_before(emu, cluster, tmp_path):
    cluster.kubectl("label", "node", "node5", "owner=alice")
    cluster.kubectl("taint", "node", "node6", "dedicated=ml:NoSchedule")
    cluster.kubectl("label", "node", "node7", "nvidia.com/gpu.present=false")
    before = {name: node_view(emu, name) for name in NODES}
    config = write_config(tmp_path / "c.yaml", cluster.kubeconfig, {"team": "ml"})
    up_json(config, tmp_path)
    assert node_view(emu, "node7")["labels"]["nvidia.com/gpu.present"] == "true"
    result = cli("teardown", "-c", str(config), "--yes", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    emu.settle()
    assert {name: node_view(emu, name) for name in NODES} == before
    assert emu.get("namespaces", NAMESPACE) is None


def test_teardown_dry_run_and_confirmation(emu, config, tmp_path):
    up_json(config, tmp_path)
    emu.requests.clear()
    dry = cli("teardown", "-c", str(config), "--dry-run", tmp_path=tmp_path)
    assert dry.exit_code == 0 and "would change Node node5" in dry.output
    assert emu.requests.writes() == []
    unconfirmed = cli("teardown", "-c", str(config), tmp_path=tmp_path)  # CliRunner's stdin is not a terminal
    assert unconfirmed.exit_code == 2 and "--yes" in unconfirmed.output
    assert node_view(emu, "node5")["taints"]


def waiting_pod(name: str, node: str | None = None) -> dict:
    """A GPU pod as a user writes it for our scheduler: one no node can take (64 GPUs), or one already bound."""
    spec = {"schedulerName": "gpu-binpack-scheduler",
            "containers": [{"name": "train", "image": "trainer:1",
                            "resources": {"limits": {"nvidia.com/gpu": "64" if node is None else "1"}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a"}, "spec": spec}


def test_teardown_names_the_pending_pods_it_leaves_waiting_and_says_so_in_its_exit_status(emu, config, tmp_path):
    """Issue 56: teardown removed the bin-packing scheduler while pods waited on it, without a word. Now its dry run
    and its summary name them (not the pods already bound, which keep running), and `teardown --yes` exits 3: done,
    but it left pods waiting. A second teardown has nothing to remove and exits 0."""
    playbook = tmp_path / "with-scheduler.yaml"
    playbook.write_text("name: with-scheduler\nsteps: [preflight, node-prep, binpack-scheduler]\n")

    def run(*args: str):
        extra = ["--preflight-report", str(report(tmp_path))] if args[0] == "up" else []
        return runner.invoke(app, [*args, "-c", str(config), "--playbook", str(playbook), *extra,
                                   "--log-file", str(tmp_path / "run.log")])
    assert run("up").exit_code == 0
    assert emu.get("deployments", "gpu-binpack-scheduler", "kube-system") is not None
    emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    for name, node in (("train-0", None), ("train-1", None), ("serving", "node5")):
        emu.seed(waiting_pod(name, node))
    dry = run("teardown", "--dry-run", "-o", "json")
    assert dry.exit_code == 0, dry.output
    [scheduler] = [s for s in json.loads(dry.stdout)["steps"] if s["id"] == "binpack-scheduler"]
    [line] = scheduler["left_waiting"]
    assert "2 pending pod(s) name gpu-binpack-scheduler (team-a/train-0, team-a/train-1)" in line, line
    assert "serving" not in line and "delete them" in line
    done = run("teardown", "--yes")
    assert done.exit_code == 3, done.output
    assert "left waiting: binpack-scheduler: 2 pending pod(s)" in done.output
    assert "teardown is done, but left 1 thing(s) waiting" in done.output
    assert emu.get("deployments", "gpu-binpack-scheduler", "kube-system") is None  # it did remove the scheduler
    assert emu.get("pods", "train-0", "team-a") is not None  # and nothing of the user's
    again = run("teardown", "--yes")
    assert again.exit_code == 0, again.output


@pytest.mark.parametrize("command", [("teardown", "--yes"), ("teardown", "--dry-run"), ("up", "--dry-run")])
def test_a_node_its_kubelet_updates_under_a_plan_is_read_again_and_planned_again(emu, config, tmp_path, command):
    """A Node's resourceVersion moves with every status update of its kubelet. Between our read and our pinned
    PATCH (real, or the server's dry run) node5's kubelet posts its status: the API answers 409, and teardown and dry
    runs, like `up`, read again and plan again. Each change is shown and counted once."""
    if command[0] == "teardown":
        up_json(config, tmp_path)
    before = node_view(emu, "node5")
    emu.requests.clear()
    emu.faults.add("PATCH", r"/api/v1/nodes/node5$", count=1, action=lambda: emu.post_node_status("node5"))
    render = ["--render-dir", str(tmp_path / "render")] if command[0] == "up" else []
    result = cli(*command, "-c", str(config), "-o", "json", *render, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    if render:  # the plan that passed, rendered once
        folder = tmp_path / "render" / "node-prep"
        assert len(list(folder.glob("*-patch-node-*.yaml"))) == 3, sorted(p.name for p in folder.iterdir())
        assert len((folder / "plan.txt").read_text().splitlines()) == 3
    conflicts = [r for r in emu.requests.all() if r.path.endswith("/nodes/node5") and r.status == 409]
    assert len(conflicts) == 1
    node_prep = step(json.loads(result.stdout), "node-prep")
    assert node_prep["changes"] == 3, node_prep
    if command[1] == "--dry-run":
        assert emu.requests.writes() == [] and node_view(emu, "node5") == before
    else:
        assert node_view(emu, "node5")["taints"] == [] and "nvidia.com/gpu.present" not in \
            node_view(emu, "node5")["labels"]


# --- dry runs ---------------------------------------------------------------------------------------------------------
def test_online_dry_run_uses_server_side_dry_run_and_renders(emu, config, tmp_path):
    emu.requests.clear()
    result = cli("up", "-c", str(config), "--dry-run", "--render-dir", str(tmp_path / "out"), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert "would change Node node5" in result.output
    assert emu.requests.writes() == []
    dry_writes = emu.requests.writes(include_dry_run=True)
    assert {r.path for r in dry_writes} == {f"/api/v1/nodes/{n}" for n in NODES}
    assert all(r.query.get("dryRun") == "All" for r in dry_writes)
    assert not node_view(emu, "node5")["taints"]
    rendered = sorted(p.name for p in (tmp_path / "out" / "node-prep").iterdir())
    assert rendered == ["01-patch-node-node5.yaml", "02-patch-node-node6.yaml", "03-patch-node-node7.yaml",
                        "plan.txt"]


def test_server_side_dry_run_surfaces_api_validation(emu, cluster, tmp_path):
    config = write_config(tmp_path / "c.yaml", cluster.kubeconfig)
    emu.faults.add("PATCH", r"/api/v1/nodes/node6$", status=422, query="dryRun=All",
                   message='Node "node6" is invalid: spec.taints: Invalid value')
    result = cli("up", "-c", str(config), "--dry-run", tmp_path=tmp_path)
    assert result.exit_code == 1 and "node6" in result.output and "Traceback" not in result.output


# --- failures ---------------------------------------------------------------------------------------------------------
def test_a_missing_node_fails_before_any_write(emu, cluster, tmp_path):
    config = write_config(tmp_path / "c.yaml", cluster.kubeconfig, nodes=["node5", "node9"])
    report(tmp_path, nodes=["node5", "node9"])  # node9 answers SSH but is not a Kubernetes node
    emu.requests.clear()
    result = cli("up", "-c", str(config), tmp_path=tmp_path)
    assert result.exit_code == 1
    assert "[node-prep] node(s) node9 not found in the cluster" in result.output
    assert "details:" in result.output and "Traceback" not in result.output
    assert emu.requests.writes() == []


def test_unreachable_cluster_is_one_line_and_exit_1(tmp_path):
    with Emulator() as emu:
        kubeconfig = emu.write_kubeconfig(tmp_path / "kc")
    config = write_config(tmp_path / "c.yaml", kubeconfig)
    result = cli("up", "-c", str(config), tmp_path=tmp_path)
    assert result.exit_code == 1
    assert "cannot reach the Kubernetes API" in result.output and "Traceback" not in result.output
    log = (tmp_path / "run.log").read_text()
    assert "cannot reach" in log


def test_transient_api_errors_are_retried(emu, config, tmp_path):
    emu.faults.add("GET", r"/api/v1/nodes/node5$", status=503, count=2)
    emu.faults.add("PATCH", r"/api/v1/nodes/node6$", reset=True, count=1)
    document = up_json(config, tmp_path)
    assert document["ok"] and step(document, "node-prep")["changes"] == 3


def test_a_node_changed_during_the_run_is_re_read_not_overwritten(emu, config, tmp_path):
    """Someone taints node5 between our read and our write: the API answers our stale PATCH with 409, and the
    runner must re-read and re-plan, keeping the other writer's taint."""
    def someone_else_taints_node5():
        node = emu.get("nodes", "node5")
        node["spec"]["taints"] = (node["spec"].get("taints") or []) + [{"key": "other", "value": "x",
                                                                         "effect": "NoSchedule"}]
        emu.seed(node, manager="kubectl-taint")

    emu.faults.add("PATCH", r"/api/v1/nodes/node5$", count=1, action=someone_else_taints_node5)
    up_json(config, tmp_path)
    conflicts = [r for r in emu.requests.all() if r.path.endswith("/nodes/node5") and r.status == 409]
    assert len(conflicts) == 1
    keys = sorted(t["key"] for t in node_view(emu, "node5")["taints"])
    assert keys == ["nvidia.com/gpu", "other"]


def test_doctor_reports_cluster_and_steps(emu, config, tmp_path):
    result = cli("doctor", "-c", str(config), "-o", "json", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    statuses = {c["id"]: c["status"] for c in document["checks"]}
    assert statuses == {"cluster": "pass", "node-prep": "warn"} and document["ok"] is True
    assert document["nodes"] == []  # --no-nodes
    emu.store.denied_access.append({"verb": "patch", "resource": "nodes"})
    denied = cli("doctor", "-c", str(config), "-o", "json", tmp_path=tmp_path)
    rbac = next(c for c in json.loads(denied.stdout)["checks"] if c["message"].startswith("missing permissions"))
    assert denied.exit_code == 0 and rbac["status"] == "warn"  # an identity made for doctor may lack them (#23)
    assert rbac["message"].startswith("missing permissions: patch nodes: this identity can check and plan but not "
                                      "run `up`")


# --- the lock ----------------------------------------------------------------------------------------------------------
def seed_lease(emu: Emulator, holder: str, age_seconds: float) -> None:
    import datetime as dt
    stamp = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=age_seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {  # ours, as the first run made it
        "name": NAMESPACE, "labels": {"app.kubernetes.io/managed-by": "gpu-bootstrap"}}})
    emu.seed({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
              "metadata": {"name": LEASE, "namespace": NAMESPACE},
              "spec": {"holderIdentity": holder, "leaseDurationSeconds": 60, "acquireTime": stamp,
                       "renewTime": stamp}})


def test_a_live_lock_refuses_and_force_unlock_takes_it(emu, config, tmp_path):
    seed_lease(emu, "bob@ci-runner-7 pid=4242 run=abcd", age_seconds=5)
    refused = cli("up", "-c", str(config), tmp_path=tmp_path)
    assert refused.exit_code == 1
    assert "bob@ci-runner-7 pid=4242" in refused.output and "since" in refused.output
    assert "--force-unlock" in refused.output
    assert not node_view(emu, "node5")["taints"]
    forced = cli("up", "-c", str(config), "--force-unlock", tmp_path=tmp_path)
    assert forced.exit_code == 0, forced.output


def test_a_stale_lock_is_taken_over(emu, config, tmp_path):
    seed_lease(emu, "bob@ci-runner-7 pid=4242 run=abcd", age_seconds=600)
    result = cli("up", "-c", str(config), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert "took over the lock from bob@ci-runner-7" in result.output
    assert emu.get("leases", LEASE, NAMESPACE)["spec"]["leaseTransitions"] == 1


# --- subprocesses: concurrency, signals, SIGKILL ---------------------------------------------------------------------
def start_up(config: Path, tmp_path: Path, name: str) -> subprocess.Popen:
    env = tool_env(HOME=str(tmp_path), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "gpu_bootstrap", "up", "-c", str(config), "-o", "json",
                             "--preflight-report", str(report(tmp_path)), *SPINE,
                             "--log-file", str(tmp_path / f"{name}.log")], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_request(emu: Emulator, method: str, path_end: str, done: bool = False, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for request in emu.requests.all():
            if request.method == method and request.path.endswith(path_end) and (request.status or not done):
                if not done or request.status:
                    return request
        time.sleep(0.02)
    raise AssertionError(f"no {method} {path_end} within {timeout}s: {[str(r) for r in emu.requests.all()]}")


@pytest.mark.slow
def test_two_runs_at_once_one_proceeds_the_other_names_the_holder(emu, config, tmp_path):
    """The first run is held mid-step (its PATCH of node5 waits on a gate) until the second has finished, so the
    second meets the lock however slowly it starts."""
    gate = threading.Event()
    emu.faults.add("PATCH", r"/api/v1/nodes/node5$", action=lambda: gate.wait(120))
    first = start_up(config, tmp_path, "first")
    try:
        wait_for_request(emu, "PATCH", "/nodes/node5")
        second = start_up(config, tmp_path, "second")
        out, err = second.communicate(timeout=120)
    finally:
        gate.set()
    assert second.returncode == 1, (out, err)
    assert f"pid={first.pid}" in err and "holds the lock" in err
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert json.loads(out)["ok"] is True


@pytest.mark.slow
def test_sigterm_records_interrupted_releases_the_lock_and_exits_143(emu, config, tmp_path):
    emu.faults.add("PATCH", r"/api/v1/nodes/node6$", delay=3.0, count=1)
    process = start_up(config, tmp_path, "term")
    wait_for_request(emu, "PATCH", "/nodes/node6")
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 143, err
    assert "interrupted" in err and "Traceback" not in err
    state = json.loads(emu.get("configmaps", STATE, NAMESPACE)["data"]["node-prep"])
    assert state["status"] == "interrupted"
    assert not emu.get("leases", LEASE, NAMESPACE)["spec"].get("holderIdentity")
    time.sleep(3.2)  # the abandoned PATCH of node6 still lands, as it would on a real API server
    assert up_json(config, tmp_path)["ok"]


def reference_nodes(tmp_path: Path) -> dict:
    with Emulator(gpu_nodes=NODES, cpu_nodes=["cpu-1"]) as reference:
        config = write_config(tmp_path / "reference.yaml", reference.write_kubeconfig(tmp_path / "reference-kc"))
        up_json(config, tmp_path)
        return {name: node_view(reference, name) for name in NODES + ["cpu-1"]}


KILL_POINTS = {
    # name: (fault that holds the run at that point, the request that shows the run got there)
    "between-preflight-and-node-prep": (("POST", r"/configmaps$"), ("POST", "/configmaps", False)),
    "inside-node-prep-before-its-first-change": (("PATCH", r"/nodes/node5$"), ("PATCH", "/nodes/node5", False)),
    "inside-node-prep-between-nodes": (("PATCH", r"/nodes/node6$"), ("PATCH", "/nodes/node5", True)),
    "after-node-prep-changes-before-its-record": (("PATCH", rf"/configmaps/{STATE}$"),
                                                  ("PATCH", f"/configmaps/{STATE}", False)),
    "after-the-last-record-before-unlock": (("PUT", rf"/leases/{LEASE}$"), ("PUT", f"/leases/{LEASE}", False)),
}


@pytest.mark.slow
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_sigkill_at_any_point_then_rerun_converges(emu, config, tmp_path, point):
    (method, pattern), (wait_method, wait_path, done) = KILL_POINTS[point]
    emu.faults.add(method, pattern, delay=2.0, count=1)
    process = start_up(config, tmp_path, "killed")
    wait_for_request(emu, wait_method, wait_path, done=done)
    process.kill()
    process.communicate(timeout=10)
    time.sleep(2.2)  # let any abandoned request finish on the server
    document = up_json(config, tmp_path)
    assert document["ok"] is True
    assert {name: node_view(emu, name) for name in NODES + ["cpu-1"]} == reference_nodes(tmp_path / "ref")
    state = json.loads(emu.get("configmaps", STATE, NAMESPACE)["data"]["node-prep"])
    assert state["status"] in ("applied", "unchanged")
    assert not emu.get("leases", LEASE, NAMESPACE)["spec"].get("holderIdentity")
