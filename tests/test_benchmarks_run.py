"""Every script in benchmarks/ runs whole, small: a benchmark that breaks (a changed API, a peer that no longer accepts
what we send it, as Ansible stopped accepting the probe script) fails the suite instead of its next user.

Each run is the script as a user starts it (a new process, its own argument parser, its printed table), with the
smallest arguments that still go through every part of it, and with the openb trace cut to a few dozen nodes and a
few hundred pods where it reads the trace (its `--traces` option). The figures are not judged here (a benchmark
prints ratios, and wall times are never asserted); that the run ends 0 and prints its table's rows is.
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools import ROOT, missing, shared_dir, tool, tool_env

BENCHMARKS = ROOT / "benchmarks"
TRACES = shared_dir() / "traces"
GPU_OPERATOR_CHART = shared_dir() / "charts" / "gpu-operator-v26.7.0.tgz"

# script -> (arguments, lines its output must hold, how long it may take, what it needs). "{traces}" is the cut trace,
# "{chart}" the gpu-operator chart. Kept small: the whole module is a few minutes of one worker.
RUNS = {
    "cli_startup.py": (["--runs", "1"], ["gpu-bootstrap --help", "python3 -c pass"], 120, ()),
    "doctor_fanout.py": (["--nodes", "2", "--runs", "1"],
                         ["doctor, 2 nodes", "bare paramiko fan-out, 2 nodes", "ansible -m raw, 2 nodes, forks 5",
                          "ansible -m raw, 2 nodes, forks 50", "doctor vs ansible forks 5:"], 300, ("root", "ansible")),
    "emulator_helm.py": (["--runs", "1", "--chart", "{chart}"], ["helm template"], 300, ("helm",)),
    "fgd_reproduction.py": (["--seeds", "1", "--policy", "FGD", "--policy", "BestFit", "--traces", "{traces}"],
                            ["FGD ", "BestFit "], 300, ("traces",)),
    "incluster_probe.py": (["--sizes", "5", "--runs", "1", "--ssh-nodes", "3", "--real", "20"],
                           ["5 nodes", "20 nodes"], 420, ("root", "local-cluster")),
    "packing_openb.py": (["--seeds", "1", "--traces", "{traces}"],
                         ["track A", "track B", "offline FFD reference", "same figures: True"], 300, ("traces",)),
    "packing_shapes.py": (["--nodes-sample", "8", "--loads", "25", "--shapes", "inference", "--profiles",
                           "kube-default,up", "--traces", "{traces}"], ["inference", "kube-default"], 420,
                          ("traces", "local-cluster")),
    "profile_search.py": (["--seeds", "1", "--only", "steeper gpu bal=cpu,mem,gpu w1/1", "--traces", "{traces}"],
                          ["steeper", "bar ("], 300, ("traces",)),
    "autoscale_real.py": (["--pods", "6", "--span", "5", "--runs-for", "5,10", "--consolidate-after", "5"],
                          ["default ", "binpack ", "ratio binpack / default"], 900, ("local-cluster", "karpenter")),
    "queue_admission.py": (["--nodes", "10", "--jobs", "20", "--teams", "2"],
                           ["no-queue ", "queue ", "queue / no-queue"], 420, ("local-cluster", "helm")),
    "real_faults.py": (["-k", "test_a_teardown_of_the_steps_an_only_run_made_leaves_no_state"],
                       ["teardown"], 600, ("local-cluster", "helm")),
    "scheduler_throughput.py": (["--nodes", "60", "--pods", "30", "--rounds", "1", "--modes", "lifted",
                                 "--profiles", "kube-default,up"], ["kube-default", "up"], 420, ("local-cluster",)),
    "status_scale.py": (["--nodes", "20", "--pods", "100", "--runs", "1"], ["ratio status / peer"], 180, ("kubectl",)),
    "up_faults.py": (["--runs", "1", "--playbook", "no-helm", "--rate", "0.05"], ["ratio faults/clean"], 420, ()),
}


# Benchmarks whose small run is a test of their own, which also checks their figures.
RUN_ELSEWHERE = {"packing_real.py": "tests/test_packing_real.py::"
                                    "test_a_small_run_on_the_real_scheduler_reports_every_profile_and_the_model_beside_it"}


def scripts() -> list[str]:
    return sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name != "__init__.py")


@pytest.mark.unit
def test_every_benchmark_has_a_run_here():
    assert sorted([*RUNS, *RUN_ELSEWHERE]) == scripts(), \
        "a benchmark without a small run here (or a run of a script that is gone)"
    for test in RUN_ELSEWHERE.values():
        path, name = test.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), f"{test} is gone"


@pytest.fixture(scope="module")
def cut_traces(tmp_path_factory) -> Path:
    """The openb trace, cut: every 20th GPU node (about 60, every GPU model kept in proportion) and the first 400 pods
    of each pod list; the FGD artifact's expected figures as they are (the reproduction compares against them)."""
    if not (TRACES / "openb_node_list_gpu_node.csv").exists():
        missing(f"the openb trace is not in {TRACES}")
    folder = tmp_path_factory.mktemp("traces")
    for source in TRACES.glob("*.csv"):
        with source.open(newline="") as handle:
            rows = list(csv.reader(handle))
        header, body = rows[0], rows[1:]
        if source.name.startswith("openb_node_list"):
            body = body[::20]
        elif source.name.startswith("openb_pod_list"):
            body = body[:400]
        with (folder / source.name).open("w", newline="") as handle:
            csv.writer(handle, lineterminator="\n").writerows([header, *body])
    return folder


def _needs(what: tuple[str, ...]) -> None:
    if "root" in what and os.geteuid() != 0:
        pytest.skip("needs root (sshd chroots the node trees)")
    if "ansible" in what and not shutil.which("ansible", path=tool_env()["PATH"]):
        missing("ansible is not installed (pip install -e '.[bench]')")
    for name in ("helm", "kubectl"):
        if name in what:
            tool(name)
    if "local-cluster" in what:
        from tests.localcluster.cluster import missing_binaries
        absent = missing_binaries(karpenter="karpenter" in what)
        if absent:
            missing("the local cluster's components are not built: " + ", ".join(absent))


@pytest.mark.tools
@pytest.mark.slow
@pytest.mark.xdist_group("benchmarks")  # one after another: several start a control plane of their own
@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_benchmark_runs_whole_when_small(name, request, tmp_path):
    arguments, expected, timeout, needs = RUNS[name]
    _needs(needs)
    traces = request.getfixturevalue("cut_traces") if "traces" in needs else None
    if "{chart}" in arguments and not GPU_OPERATOR_CHART.exists():
        missing(f"chart {GPU_OPERATOR_CHART} is not present")
    arguments = [a.format(traces=traces, chart=GPU_OPERATOR_CHART) for a in arguments]
    done = subprocess.run([sys.executable, str(BENCHMARKS / name), *arguments], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=tool_env(tmp_path / "home", NO_COLOR="1"))
    said = done.stdout + done.stderr
    assert done.returncode == 0, f"{name} ended {done.returncode}:\n{said[-4000:]}"
    absent = [line for line in expected if line not in done.stdout]
    assert not absent, f"{name} did not print {absent}:\n{said[-4000:]}"
