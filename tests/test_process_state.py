"""No test leaves process-wide state to the next one in its worker: the gpu_bootstrap logger and the SIGINT/SIGTERM
handlers that an in-process CLI run sets are put back after every test (tests/conftest.py). The probes below hold at
any point of a run; the last test runs them in a fresh pytest right after a test that ran the CLI (itself or in a
module-scoped fixture), the order that used to fail."""
from __future__ import annotations

import logging
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.tools import tool_env

START_TERM = signal.getsignal(signal.SIGTERM)
START_INT = signal.getsignal(signal.SIGINT)
ROOT = Path(__file__).resolve().parent.parent


def test_signal_handlers_are_the_ones_the_worker_started_with():
    assert signal.getsignal(signal.SIGTERM) is START_TERM
    assert signal.getsignal(signal.SIGINT) is START_INT


def test_caplog_sees_gpu_bootstrap_records(caplog):
    logging.getLogger("gpu_bootstrap.helm").warning("probe-record")
    assert "probe-record" in caplog.text


def test_the_gpu_bootstrap_logger_is_untouched():
    logger = logging.getLogger("gpu_bootstrap")
    assert (logger.handlers, logger.propagate, logger.level) == ([], True, logging.NOTSET), \
        [getattr(h, "baseFilename", h) for h in logger.handlers]


@pytest.mark.parametrize("first", [
    "tests/test_cli_ux.py::test_only_lists_only_the_selected_steps",  # a test that runs the CLI
    "tests/test_preflight_ssh.py::test_scenario_checks_and_json_contract",  # its module-scoped fixture runs it
])
def test_a_cli_run_leaves_nothing_behind_for_the_next_test(first):
    """A test that ran the CLI in-process, then the probes above, in that order, in one process."""
    probes = [f"tests/test_process_state.py::{name}" for name in (
        "test_signal_handlers_are_the_ones_the_worker_started_with", "test_caplog_sees_gpu_bootstrap_records",
        "test_the_gpu_bootstrap_logger_is_untouched")]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:randomly", "-p", "no:xdist",
                           "-p", "no:cacheprovider", first, *probes], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=tool_env())
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-3000:]
