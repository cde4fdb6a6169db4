"""The kill matrix (issue 11): `gpu-bootstrap up` (a real subprocess, the real gpu-operator chart and the real helm,
against the emulator) is stopped with `kill -9` or SIGTERM at every step boundary, while helm installs, and at seeded
random points inside the steps; then `up` is run again, and the cluster must converge to exactly the objects of an
uninterrupted run (tests/reliability.py says what is normalised away and why), helm's history must end in a
deployed revision with nothing pending, and no helm process may be left. SIGTERM must end the run within 5 s with
exit code 143.

How a point is reached: the emulator holds every request from a trigger on (tests/reliability.Hold), so the run is
frozen exactly there while the signal is sent: "after-<step>" holds the first request after the checkpoint ConfigMap
gained the step's record (the next step has started, nothing of it is done), "lock-taken" the first request after
the run took its Lease, "helm-install-first-write" helm's first write of the install, and "random-<step>-<f>" the
request at fraction f of the requests that step made in the uninterrupted reference run. After kill -9 the held
requests are let through: an abandoned request still lands on a real API server.

The default matrix (the lock, 8 step boundaries and helm's first writes, each once, kill -9 and SIGTERM
alternating, plus 1 random point drawn from the seed; 3, then 2, until the suite outgrew its CI budget) runs in one
worker, about 15 minutes of a whole-suite run on two cores;
GPU_BOOTSTRAP_KILL_MATRIX_FULL=1 sends both signals at every boundary. GPU_BOOTSTRAP_KILL_MATRIX=N (which implies the
full boundaries) draws N random points in every step instead of 2 in all (N=5: 35 more runs, about 6 minutes more); GPU_BOOTSTRAP_KILL_SEED changes the seed (default
11, the issue).
"""
from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.app.playbook import load_playbook
from tests import reliability as rel
from tests.kubeapi import Emulator
from tests.monitoring.live import LocalPrometheus
from tests.nodes.reports import write_report
from tests.tools import ROOT, Stall, tool_env, tool

# One xdist group: the uninterrupted reference run (a minute of helm) is made once, not once in every worker that
# draws a case (four in a whole-suite run: about two minutes of CPU spent three times for nothing)
pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.usefixtures("helm_on_path"),
              pytest.mark.xdist_group("kill-matrix")]

NODES = ["node5", "node6", "node7"]
OPTIONS = {"kube_version": "1.33.2", "gpu_nodes": NODES, "cpu_nodes": ["cpu-1"], "gpu_operator": True}
# the boundaries follow the default playbook; gpu-pools, skipped without pools, writes no record (so it has no
# boundary of its own: it is the point after node-prep)
STEPS = [step for step in load_playbook("default").steps if step not in ("gpu-pools", "queues")]
SEED = int(os.environ.get("GPU_BOOTSTRAP_KILL_SEED", "11"))
PER_STEP = int(os.environ.get("GPU_BOOTSTRAP_KILL_MATRIX", "0"))
# Both signals at every boundary only when asked (or with random points per step): the default run alternates them,
# which halves the matrix's share of CI (issue 23) while every boundary and both signals stay covered.
FULL = PER_STEP > 0 or os.environ.get("GPU_BOOTSTRAP_KILL_MATRIX_FULL") == "1"
SIGTERM_EXIT_WITHIN = 5.0
RANDOM_POINTS = 1  # in the default matrix (2 until the suite outgrew its CI budget again); GPU_BOOTSTRAP_KILL_MATRIX=N
# draws N per step instead
runner = CliRunner()


@dataclass(frozen=True)
class Point:
    name: str
    how: str  # "kill-9" or "sigterm"
    after: str | None = None  # trigger: the checkpoint holds this step's record; None: the lock is taken
    helm: str | None = None  # trigger: helm's first write to a path containing this instead
    step: str | None = None  # random point: inside this step ...
    fraction: float = 0.0  # ... at this fraction of its requests

    @property
    def id(self) -> str:
        return f"{self.name}-{self.how}"


def matrix() -> list[Point]:
    boundaries = [Point("lock-taken", ""), *[Point(f"after-{step}", "", after=step) for step in STEPS],
                  Point("helm-install-first-write", "", helm="/"),
                  Point("helm-install-first-deployment", "", helm="/deployments/")]
    if FULL:  # every boundary with both signals
        points = [replace(b, how=how) for how in ("kill-9", "sigterm") for b in boundaries]
    else:  # every boundary once, the two signals alternating (each signal still meets every kind of boundary)
        points = [replace(b, how=("kill-9", "sigterm")[index % 2]) for index, b in enumerate(boundaries)]
    draw = random.Random(SEED)
    chosen = [(step, draw.random()) for step in STEPS for _ in range(PER_STEP)] if PER_STEP else \
        [(draw.choice(STEPS), draw.random()) for _ in range(RANDOM_POINTS)]
    for step, fraction in chosen:
        points.append(Point(f"random-{step}-{fraction:.3f}", draw.choice(["kill-9", "sigterm"]), step=step,
                            fraction=fraction))
    return points


def up_in_process(config: Path, report: Path, log: Path):
    result = runner.invoke(app, ["up", "-c", str(config), "--preflight-report", str(report), "-o", "json",
                                 "--log-file", str(log)])
    document = json.loads(result.stdout) if result.stdout.startswith("{") else None
    return result, document


@dataclass
class Reference:
    view: dict
    requests: dict  # step -> requests made while it ran (lock taken, its record not yet written)
    report: Path


@pytest.fixture(scope="module")
def reference(tmp_path_factory, prometheus) -> Reference:
    """One uninterrupted run on its own emulator: the end state to converge to, and each step's request count.
    The preflight report is shared by every run of this module (its path is part of preflight's record)."""
    folder = tmp_path_factory.mktemp("reference")
    report = write_report(folder / "report.json", NODES)
    counts: dict[str, int] = {}
    with pytest.MonkeyPatch.context() as patch, Emulator(**OPTIONS) as emu:
        for key, value in tool_env(folder / "home").items():
            if key.startswith("HELM_") or key == "PATH":
                patch.setenv(key, value)
        rel.serve_prometheus(emu, prometheus.url)
        taken, state = rel.lock_taken(emu), {"taken": False}

        def count(request) -> None:
            state["taken"] = state["taken"] or taken(request)
            if state["taken"]:
                with emu.store.lock:
                    done = len((emu.get("configmaps", rel.STATE_NAME, rel.STATE_NAMESPACE) or {}).get("data") or {})
                step = STEPS[done] if done < len(STEPS) else "release"
                counts[step] = counts.get(step, 0) + 1
        emu.faults.add("*", ".*", count=None, observe=count)
        config = rel.write_config(folder, emu.write_kubeconfig(folder / "kubeconfig"), NODES, 60)
        result, document = up_in_process(config, report, folder / "up.log")
        assert result.exit_code == 0, result.output
        statuses = {s["id"]: s["status"] for s in document["steps"]}
        assert statuses.pop("gpu-pools") == "skipped", document  # no pools configured
        assert statuses.pop("queues") == "skipped", document  # no teams configured
        assert set(statuses.values()) <= {"applied", "probed"}, document
        emu.settle()
        return Reference(rel.view(emu), counts, report)


@pytest.fixture
def emulator_options():
    return dict(OPTIONS)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus behind the chart's Service (the monitoring step's verify queries it), one per module."""
    folder = tmp_path_factory.mktemp("prometheus")
    server = LocalPrometheus(folder, "global: {scrape_interval: 15s}\n")
    yield server
    server.stop()


@pytest.fixture
def cluster(cluster, prometheus):
    rel.serve_prometheus(cluster.emu, prometheus.url)
    return cluster


def start_up(cluster, config: Path, report: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpu_bootstrap", "up", "-c", str(config), "--preflight-report",
                             str(report), "-o", "json", "--log-file", str(log)],
                            cwd=ROOT, env=dict(cluster.env, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def hold_for(point: Point, emu, reference: Reference) -> rel.Hold:
    if point.helm:
        return rel.Hold(emu, rel.helm_write(point.helm))
    if point.step is not None:
        index = STEPS.index(point.step)
        trigger = rel.checkpoint_has(emu, STEPS[index - 1]) if index else rel.lock_taken(emu)
        made = reference.requests.get(point.step, 1)
        return rel.Hold(emu, trigger, nth=1 + int(point.fraction * made))
    return rel.Hold(emu, rel.checkpoint_has(emu, point.after) if point.after else rel.lock_taken(emu))


@pytest.mark.parametrize("point", matrix(), ids=lambda p: p.id)
def test_a_run_stopped_at_any_point_converges_on_rerun(cluster, tmp_path, reference, point):
    emu, marker = cluster.emu, str(cluster.home)  # helm inherits HOME (its kubeconfig is the relay's)
    config = rel.write_config(tmp_path, cluster.kubeconfig, NODES, 60)
    hold = hold_for(point, emu, reference)
    process = start_up(cluster, config, reference.report, tmp_path / "stopped.log")
    try:
        hold.wait(process)
        if point.helm:
            assert rel.helm_processes(marker), "the point is inside helm, but no helm runs"
        if point.how == "kill-9":
            process.kill()
            process.communicate(timeout=30)
            assert process.returncode == -signal.SIGKILL
            assert rel.no_helm_within(marker, 5) == [], "helm outlived gpu-bootstrap after kill -9"
            hold.release()  # what the dead run had sent still lands
        else:
            with Stall() as stall:  # the CPU a busy machine withheld meanwhile stretches the bound (tests/tools.py)
                sent = time.monotonic()
                process.send_signal(signal.SIGTERM)
                hold.release()  # the API answers again: the run can record the interruption and release the lock
                _out, err = process.communicate(timeout=30)
                took = time.monotonic() - sent
            assert process.returncode == 143, err[-3000:]
            assert took < SIGTERM_EXIT_WITHIN + stall.late, \
                f"exited {took:.1f} s after SIGTERM (the machine withheld {stall.late:.1f} s)"
            assert "interrupted" in err and "Traceback" not in err, err[-3000:]
            assert rel.no_helm_within(marker, 1) == [], "helm outlived the interrupted run"
            lease = emu.get("leases", rel.LOCK_NAME, rel.STATE_NAMESPACE)
            assert not lease["spec"].get("holderIdentity"), "SIGTERM must release the lock"
    finally:
        hold.release()
        if process.poll() is None:
            process.kill()
        process.communicate()
    assert hold.held, "nothing was held"
    rel.wait_idle(emu)
    emu.faults.remove(hold.rule)

    result, document = up_in_process(config, reference.report, tmp_path / "rerun.log")
    assert result.exit_code == 0, result.output
    assert document["ok"] is True
    found = rel.converged(emu, reference.view)
    assert found == [], "\n".join(found)
    assert rel.all_history_problems(cluster) == []
    assert rel.helm_releases(cluster) == sorted((name, namespace, "deployed") for name, namespace in rel.RELEASES)
    assert rel.helm_processes(marker) == []


# --- the checks themselves can fail -----------------------------------------------------------------------------------
def test_the_comparison_catches_a_missing_an_extra_and_a_changed_object(cluster, tmp_path, reference):
    """A clean run on another emulator equals the reference (so the normalisation hides no real difference), and
    each of these breakages is named: a missing object, a second validation pod, a webhook that no longer trusts
    the CA of the serving certificate, a step whose record says it failed."""
    emu = cluster.emu
    config = rel.write_config(tmp_path, cluster.kubeconfig, NODES, 60)
    result, _document = up_in_process(config, reference.report, tmp_path / "log")
    assert result.exit_code == 0, result.output
    assert rel.converged(emu, reference.view) == []
    emu.delete("poddisruptionbudgets", "gpu-binpack-scheduler", "kube-system")
    emu.seed({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-bootstrap-validate-node5-again",
                                                              "namespace": "gpu-bootstrap"},
              "spec": {"containers": [{"name": "vectoradd", "image": "cuda-sample"}]}})
    webhook = emu.get("mutatingwebhookconfigurations", "gpu-bootstrap-gpu-pods")
    webhook["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(emu.pki.ca_pem.encode()).decode()
    emu.seed(webhook)
    state = emu.get("configmaps", rel.STATE_NAME, rel.STATE_NAMESPACE)
    state["data"]["validate"] = state["data"]["validate"].replace('"applied"', '"failed"')
    emu.seed(state)
    found = rel.converged(emu, reference.view, timeout=2)
    assert "missing: policy/PodDisruptionBudget/kube-system/gpu-binpack-scheduler" in found
    assert "unexpected: /Pod/gpu-bootstrap/gpu-bootstrap-validate-node5-again" in found
    assert any("gpu-bootstrap-gpu-pods.webhooks[0].clientConfig.caBundle" in f and "NOT the Secret's CA" in f
               for f in found), found
    assert any("gpu-bootstrap-state.data.validate.status" in f and '"failed"' in f for f in found), found
    assert len(found) == 4, found


def test_history_problems_name_what_is_not_clean():
    assert rel.history_problems([{"revision": 1, "status": "superseded", "description": "failed: context canceled"},
                                 {"revision": 2, "status": "deployed"}]) == []
    assert rel.history_problems([{"revision": 1, "status": "failed"}, {"revision": 2, "status": "superseded"},
                                 {"revision": 3, "status": "deployed"}]) == []
    assert rel.history_problems([{"revision": 1, "status": "failed"}]) == [
        "the latest revision 1 is failed, not deployed"]
    assert rel.history_problems([{"revision": 1, "status": "deployed"}, {"revision": 2, "status": "pending-upgrade"}]) \
        == ["revision 2 is pending-upgrade", "the latest revision 2 is pending-upgrade, not deployed"]
    assert rel.history_problems([]) == ["no release"]


def test_a_helm_left_running_is_found(cluster, tmp_path):
    """The orphan check sees a live helm of this test (held by the emulator), and not once it is gone."""
    fault = cluster.emu.faults.add("GET", r"/secrets$", delay=30, count=1)
    helm = subprocess.Popen([tool("helm"), "status", "anything", "--kubeconfig",
                             str(cluster.kubeconfig)], env=cluster.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not fault.fired:
            assert time.monotonic() < deadline and helm.poll() is None, "helm never asked for its release"
            time.sleep(0.05)
        assert len(rel.helm_processes(str(cluster.kubeconfig))) == 1
        assert rel.helm_processes(str(tmp_path / "another-kubeconfig")) == []
    finally:
        helm.kill()
        helm.wait()
    assert rel.no_helm_within(str(cluster.kubeconfig), 5) == []
