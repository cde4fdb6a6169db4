"""gpu_bootstrap.core.interrupts in child processes (never in the test process: its watchdog ends the process)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gpu_bootstrap.core import interrupts
from tests.tools import ROOT, tool_env

PRELUDE = textwrap.dedent("""
    import sys, time
    from gpu_bootstrap.core import interrupts
    from gpu_bootstrap.core.errors import Interrupted
    interrupts.install()
    print("ready", flush=True)
""")


def run_child(body: str, *signals: tuple[float, int], timeout: float = 30) -> tuple[int, str, str, float]:
    """Run PRELUDE + body; once it is ready send each (delay, signal). Returns code, stdout, stderr and the time
    from the first signal to the exit."""
    child = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], cwd=ROOT,
                             env=tool_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    first = None
    for delay, signum in signals:
        time.sleep(delay)
        first = first or time.monotonic()
        child.send_signal(signum)
    out, err = child.communicate(timeout=timeout)
    return child.returncode, out, err, time.monotonic() - (first or time.monotonic())


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_becomes_keyboardinterrupt_and_an_exit_code_of_128_plus_it(signum, code):
    status, out, err, _took = run_child("""
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            error = Interrupted("gpu-operator")
            print(error.exit_code, error.message, flush=True)
            sys.exit(interrupts.exit_code())
    """, (0.1, signum))
    assert status == code, err
    assert out.split(None, 1) == [str(code), f"interrupted by {signal.Signals(signum).name}\n"]


def test_a_cleanup_that_hangs_is_cut_off_within_5_s():
    status, _out, err, took = run_child("""
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            time.sleep(60)  # e.g. releasing the lock against an API server that stopped answering
    """, (0.1, signal.SIGTERM))
    assert status == 143 and took < 5
    assert "took longer than 4.5 s; exiting now" in err


def test_a_second_signal_ends_the_process_at_once():
    status, _out, _err, took = run_child("""
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            time.sleep(60)
    """, (0.1, signal.SIGINT), (0.3, signal.SIGINT))
    assert status == 130 and took < 2


def test_nothing_new_is_started_after_a_signal():
    status, out, err, _took = run_child("""
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            try:
                interrupts.start_child(["/bin/true"])
            except KeyboardInterrupt as refused:
                print(refused, flush=True)
    """, (0.1, signal.SIGTERM))
    assert status == 0, err
    assert out.strip() == "not starting true: shutting down after a signal"


def test_a_child_runs_in_its_own_process_group_and_session():
    child = interrupts.start_child(["/bin/sleep", "30"])
    try:
        assert os.getpgid(child.pid) == child.pid == os.getsid(child.pid)
        assert child in interrupts.running()
    finally:
        interrupts.stop(child, grace=1)
    assert child.returncode == -signal.SIGTERM and child not in interrupts.running()


@pytest.mark.unit
def test_no_signal_means_exit_code_130_and_no_cleanup_deadline():
    assert interrupts.received() is None
    assert interrupts.exit_code() == 130 and interrupts.cleanup_deadline() is None
