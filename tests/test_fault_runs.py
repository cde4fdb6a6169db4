"""Fault runs (issue 11): `gpu-bootstrap up` (a real subprocess) against an API server that misbehaves the way real ones
do, seeded:

* random faults: 10 % of all requests, on every path (helm's too), fail — 503 and 429 answered with
  `Retry-After: 1`, as a kube-apiserver under load answers with API priority and fairness (clients are expected to
  wait and repeat), and TCP resets before the server handled the request (tests/reliability.random_faults). The
  draws are keyed by seed and request, so a seed meets the same faults whatever the thread interleaving;
* an outage: from request N on (N drawn per seed from the middle 60 % of a clean run's requests), every request is
  answered 503 for 20 s, as a load balancer answers for an API server that restarts (tests/reliability.Outage).

`up` must complete in at least 19 of 20 runs (for n runs: all but 5 %, at least n - 1), a run that fails must name
its cause (the request and what went wrong, or helm's own error line), and no run may create a duplicate: each
validation pod is created once, the end state is exactly the objects of a clean run (tests/reliability.py says
what is normalised), helm's history ends deployed with nothing pending, no helm is left running, and a run that
failed converges when `up` is run again without faults.

Twenty full runs with helm installing the real charts take too long for CI under these faults, so the 20-run
statistics use every step but the two helm steps, gpu-operator and monitoring (preflight, node-prep,
binpack-scheduler, admission-opa, admission, validate: all of gpu-bootstrap's own requests, creates and dry runs
included), and 3 seeds of each kind run the full default playbook with helm (GPU_BOOTSTRAP_FULL_FAULT_RUNS=20 runs
20), with a slimmed kube-prometheus-stack (tests/reliability.SLIM_STACK: the same chart, half the objects). Runs go
ten at a time (they mostly wait out Retry-After, backoff and the outage).

Measured (20 seeds each) before monitoring joined the default playbook: every step but gpu-operator 20/20 under
10 % faults (10/20 before the Kubernetes adapter repeated dry runs, creates answered with Retry-After and named
creates) and 20/20 with the outage; the full playbook 19/20 under 10 % faults (the miss: helm could not record a
successful install, and the uninstall that recovers it failed on its last write; the rerun converged) and 20/20
with the outage. Before the helm adapter's fixes: 16/20 with 5 upgrade attempts, 1/3 before it recovered a release
its own attempt left pending, 1/3 with the outage before attempts that never reached the cluster stopped counting.
With monitoring (the full chart): 0/3 full runs under 10 % faults while helm talked to the API server itself (it
repeats no write after a reset, and the chart makes some 130), 3/3 once its requests went through gpu-bootstrap's
relay (adapters/relay.py); 3/3 with the outage.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import reliability as rel
from tests.kubeapi import Emulator
from tests.monitoring.live import LocalPrometheus
from tests.nodes.reports import write_report
from tests.tools import ROOT, tool_env, tool

# One xdist group: each kind of setup (the clean reference runs) is made once, not in every worker that draws a case
pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.xdist_group("fault-runs")]

NODES = ["node5", "node6", "node7"]
RUNS = 20
MUST_COMPLETE = 19
FULL_RUNS = int(os.environ.get("GPU_BOOTSTRAP_FULL_FAULT_RUNS", "3"))
RATE = 0.10
OUTAGE_SECONDS = 20.0
PARALLEL = 10
NO_HELM_STEPS = ["preflight", "node-prep", "binpack-scheduler", "admission-opa", "admission", "validate"]
# what a failure must say: which request, and a transport or HTTP cause
NAMED_CAUSE = re.compile(r"(GET|POST|PUT|PATCH|DELETE) \S+.*(HTTP \d{3}|the server|connection|timed out|reset)|"
                         r"(GET|POST|PUT|PATCH|DELETE) \S+ failed: .+|helm \S+ .*failed: Error: .+", re.IGNORECASE)


@dataclass
class Run:
    seed: int
    code: int = -1
    error: str = ""
    seconds: float = 0.0
    requests: int = 0
    faults: int = 0
    problems: list = field(default_factory=list)  # duplicates, non-convergence: never allowed, even in a failed run

    @property
    def completed(self) -> bool:
        return self.code == 0

    def line(self) -> str:
        state = "ok" if self.completed else f"exit {self.code}: {self.error}"
        problems = "".join(f"\n    PROBLEM: {p}" for p in self.problems)
        return f"seed {self.seed}: {state} ({self.seconds:.0f} s, {self.requests} requests, {self.faults} faults)" \
            + problems


@dataclass
class Setup:
    helm: bool
    folder: Path
    report: Path
    playbook: Path | None
    prometheus: str = ""  # the URL of the real Prometheus the chart's Service points at
    reference: dict | None = None
    requests: int = 0  # in the clean reference run


def options(helm: bool) -> dict:
    """With helm, the emulator runs the operator's stand-in (nodes advertise GPUs once its device plugin runs);
    without, the nodes advertise their GPUs from the start."""
    return {"kube_version": "1.33.2", "gpu_nodes": NODES, "cpu_nodes": ["cpu-1"], "gpu_operator": helm}


def up(emu: Emulator, folder: Path, setup: Setup, timeout: float = 600) -> subprocess.CompletedProcess:
    """`gpu-bootstrap up` as a subprocess; killed and reaped whatever happens."""
    folder.mkdir(parents=True, exist_ok=True)
    config = rel.write_config(folder, emu.write_kubeconfig(folder / "kubeconfig"), NODES, 300)
    args = [sys.executable, "-m", "gpu_bootstrap", "up", "-c", str(config), "--preflight-report", str(setup.report),
            "-o", "json", "--log-file", str(folder / "up.log")]
    if setup.playbook is not None:
        args += ["--playbook", str(setup.playbook)]
    process = subprocess.Popen(args, cwd=ROOT, env=tool_env(folder / "home"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def error_of(result: subprocess.CompletedProcess) -> str:
    try:
        return json.loads(result.stdout).get("error") or ""
    except ValueError:
        return (result.stderr.strip().splitlines() or [""])[-1]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus behind the chart's Service (the monitoring step's verify queries it), one per module."""
    server = LocalPrometheus(tmp_path_factory.mktemp("prometheus"), "global: {scrape_interval: 15s}\n")
    yield server
    server.stop()


@pytest.fixture(scope="module", params=[False, True], ids=["no-helm", "full"])
def setup(request, tmp_path_factory, prometheus) -> Setup:
    """A clean run per kind: the end state every fault run must reach, and how many requests a run makes."""
    helm = request.param
    if helm:
        tool("helm")
    folder = tmp_path_factory.mktemp("full" if helm else "no-helm")
    playbook = None
    if not helm:
        playbook = folder / "no-helm.yaml"
        playbook.write_text("name: no-helm\nsteps: [" + ", ".join(NO_HELM_STEPS) + "]\n")
    setup = Setup(helm, folder, write_report(folder / "report.json", NODES), playbook, prometheus.url)
    with Emulator(**options(helm)) as emu:
        rel.serve_prometheus(emu, prometheus.url)
        result = up(emu, folder / "reference", setup)
        assert result.returncode == 0, result.stderr[-3000:]
        emu.settle()
        setup.reference = rel.view(emu)
        setup.requests = len(emu.requests.all())
    return setup


def fault_run(setup: Setup, seed: int, inject) -> Run:
    """One seeded run under `inject(emu, seed)`'s faults, with every check that holds whether or not it completed."""
    run = Run(seed)
    folder = setup.folder / f"seed-{seed}-{inject.__name__}"
    with Emulator(**options(setup.helm)) as emu:
        rel.serve_prometheus(emu, setup.prometheus)
        rules = inject(emu, seed, setup)
        started = time.monotonic()
        result = up(emu, folder, setup)
        run.seconds = time.monotonic() - started
        run.code, run.error = result.returncode, error_of(result)
        run.requests = len(emu.requests.all())
        run.faults = sum(r.fired for r in rules)
        if not run.faults:
            run.problems.append("no fault was injected (the run ended before the outage began?)")
        for rule in rules:
            emu.faults.remove(rule)
        rel.wait_idle(emu)
        created = [r.path for r in emu.requests.all() if r.method == "POST" and r.status == 201 and not r.dry_run
                   and r.path.endswith("/namespaces/gpu-bootstrap/pods")]
        if len(created) > len(NODES):
            run.problems.append(f"{len(created)} validation pods created for {len(NODES)} nodes")
        if not run.completed:  # what it left must be repairable: a clean rerun converges
            rerun = up(emu, folder / "rerun", setup)
            if rerun.returncode != 0:
                run.problems.append(f"the clean rerun failed too: {error_of(rerun)}")
        found = rel.converged(emu, setup.reference)
        if found:
            run.problems.append("not the objects of a clean run: " + "; ".join(found))
        if setup.helm:
            history = rel.all_history_problems(_Helm(folder))
            run.problems += [f"helm history: {p}" for p in history]
        if left := rel.no_helm_within(str(folder), 5):  # the run's and the rerun's kubeconfig are in there
            run.problems.append(f"helm left running: {left}")
    return run


class _Helm:
    """The little of conftest.Cluster that rel.helm_history needs."""

    def __init__(self, folder: Path):
        self.kubeconfig = folder / "kubeconfig"
        self.env = tool_env(folder / "home")

    def helm(self, *args: str, check: bool = True):
        return subprocess.run([tool("helm"), "--kubeconfig", str(self.kubeconfig), *args], env=self.env,
                              capture_output=True, text=True, timeout=120, check=check)


def random_faults(emu: Emulator, seed: int, setup: Setup) -> list:
    return rel.random_faults(emu, seed, RATE)


def outage(emu: Emulator, seed: int, setup: Setup) -> list:
    after = random.Random(seed).randint(setup.requests // 5, setup.requests * 4 // 5)
    cut = rel.Outage(emu, after, OUTAGE_SECONDS)
    return [cut.rule]


def runs(setup: Setup, inject, seeds) -> list[Run]:
    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(lambda seed: fault_run(setup, seed, inject), seeds))


def report(kind: str, results: list[Run]) -> str:
    done = sum(r.completed for r in results)
    return f"{kind}: up completed in {done} of {len(results)} runs\n" + "\n".join(r.line() for r in results)


@pytest.mark.parametrize("inject", [random_faults, outage], ids=["10-percent-faults", "20-s-outage"])
def test_up_completes_under_faults_and_never_duplicates(setup, inject, capsys):
    seeds = range(1, (FULL_RUNS if setup.helm else RUNS) + 1)
    results = runs(setup, inject, seeds)
    summary = report(f"{'full' if setup.helm else 'no-helm'} {inject.__name__}", results)
    with capsys.disabled():
        print("\n" + summary)
    assert [(r.seed, r.problems) for r in results if r.problems] == [], summary
    for failed in (r for r in results if not r.completed):
        assert NAMED_CAUSE.search(failed.error), f"seed {failed.seed}: the failure does not name its cause: " \
                                                 f"{failed.error}"
    assert sum(r.completed for r in results) >= needed(len(results)), summary


def needed(runs: int) -> int:
    """19 of 20; of fewer runs, as many but one."""
    return min(runs - 1, math.ceil(runs * MUST_COMPLETE / RUNS)) if runs > 1 else runs


@pytest.mark.unit
def test_the_bar():
    assert [needed(n) for n in (1, 3, 10, 20, 40)] == [1, 2, 9, 19, 38]
