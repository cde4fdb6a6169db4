"""helm never outlives gpu-bootstrap: the real helm, run by the Helm adapter in a child Python process, against the
emulator. kill -9 of that process, SIGTERM and SIGINT must each leave no helm behind; a signal ends the process
within 5 s with 128 + the signal number."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import chart
from tests.tools import ROOT, Stall, tool

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.usefixtures("helm_on_path")]

HOLD = 60  # seconds the emulator holds the request helm is waiting for: far longer than any bound asserted here

CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from gpu_bootstrap.core import interrupts
    from gpu_bootstrap.adapters.helm import Chart, Helm

    operation, kubeconfig, helm, chart = sys.argv[1:5]
    if sys.argv[5] == "handlers":
        interrupts.install()  # what the CLI does at start
    adapter = Helm(Path(kubeconfig), executable=helm)
    try:
        if operation == "status":
            adapter.status("held", "default")
        else:
            adapter.upgrade("gpu-operator", Chart(chart, None, None), {"driver": {"enabled": False}},
                            "gpu-operator", wait=True, timeout="120s")
    except KeyboardInterrupt:
        sys.exit(interrupts.exit_code())  # what cli/commands.py's main() does with a KeyboardInterrupt
""")


def start_child(cluster, tmp_path: Path, operation: str, handlers: bool = True) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(cluster.env, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, str(script), operation, str(cluster.kubeconfig), tool("helm"),
                             str(chart("gpu-operator-v26.7.0.tgz")), "handlers" if handlers else "none"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def hold(cluster, operation: str):
    """A fault that makes the emulator sit on the request helm needs to go on."""
    if operation == "status":  # helm status reads the release's Secrets
        return cluster.emu.faults.add("GET", r"/namespaces/default/secrets$", delay=HOLD, count=1)
    return cluster.emu.faults.add("PATCH", r"/namespaces/gpu-operator/deployments/gpu-operator$", delay=HOLD, count=1)


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def helm_children(pid: int) -> list[int]:
    """The helm processes among pid's children (ones that end while we look are skipped)."""
    found = []
    for child in children_of(pid):
        try:
            if Path(f"/proc/{child}/exe").resolve(strict=True).name == "helm":
                found.append(child)
        except OSError:
            continue
    return found


def start_time(pid: int) -> str | None:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def alive(pid: int, started: str) -> bool:
    """The process that had this pid and start time exists and is not a zombie (PID 1 may never reap it)."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return stat[19] == started and stat[0] != "Z"


def wait_for_helm(child: subprocess.Popen, fault, timeout: float = 60) -> tuple[int, str]:
    """The pid (and start time) of the helm the child started, once helm is waiting on the held request."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert child.poll() is None, child.communicate()
        helms = helm_children(child.pid)
        if helms and fault.fired:
            return helms[0], start_time(helms[0])
        time.sleep(0.05)
    raise AssertionError("helm never reached the held request")


def gone_within(pid: int, started: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid, started):
            return True
        time.sleep(0.05)
    return not alive(pid, started)


@pytest.mark.parametrize("operation", ["status", "upgrade"])
def test_kill_9_of_gpu_bootstrap_takes_helm_with_it(cluster, tmp_path, operation):
    fault = hold(cluster, operation)
    child = start_child(cluster, tmp_path, operation)
    helm_pid, started = wait_for_helm(child, fault)
    assert os.getpgid(helm_pid) == helm_pid != os.getpgid(child.pid)  # its own process group
    child.kill()
    child.communicate()
    assert gone_within(helm_pid, started, 3), f"helm {helm_pid} outlived gpu-bootstrap (re-parented orphan)"


def test_kill_9_takes_helm_with_it_even_without_the_signal_handlers(cluster, tmp_path):
    fault = hold(cluster, "status")
    child = start_child(cluster, tmp_path, "status", handlers=False)
    helm_pid, started = wait_for_helm(child, fault)
    child.kill()
    child.communicate()
    assert gone_within(helm_pid, started, 3)


@pytest.mark.parametrize("operation,signum,code", [("status", signal.SIGTERM, 143), ("upgrade", signal.SIGTERM, 143),
                                                   ("status", signal.SIGINT, 130)])
def test_a_signal_stops_helm_and_exits_within_5_s(cluster, tmp_path, operation, signum, code):
    fault = hold(cluster, operation)
    child = start_child(cluster, tmp_path, operation)
    helm_pid, started = wait_for_helm(child, fault)
    with Stall() as stall:  # the CPU a busy machine withheld meanwhile stretches the bound (tests/tools.py)
        sent = time.monotonic()
        child.send_signal(signum)
        try:
            _out, err = child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            raise AssertionError(f"still running 30 s after {signum.name}")
        took = time.monotonic() - sent
    assert child.returncode == code, err
    assert took < 5 + stall.late, f"exited {took:.1f} s after {signum.name} (the machine withheld {stall.late:.1f} s)"
    assert gone_within(helm_pid, started, 1), "helm outlived the interrupted run"
    assert "Traceback" not in err, err
