"""Several gpu-bootstrap runs on one machine at once: CI runners and people run `status` beside `up`, or drive two
clusters from one workstation, all sharing $TMPDIR. Every run makes a private temp folder there and sweeps the
folders of runs that are gone; none may take a live run's folder (the helm relay's kubeconfig is in it) for a dead
one's.

The real helm installs the real gpu-operator chart through the relay into the emulator while, beside it, separate
gpu-bootstrap processes start, sweep and end (some of them killed with SIGKILL, leaving their folders), and threads of
this process make and sweep folders as a second command in the same process would.
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
from gpu_bootstrap.security import tempfiles
from tests.conftest import chart
from tests.nodes.reports import write_report
from tests.tools import tool_env

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.usefixtures("helm_on_path")]
runner = CliRunner()
NODES = ["node5", "node6"]

KILLED_RUN = r"""
import os, signal
from gpu_bootstrap.security import tempfiles
print(tempfiles.run_folder(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # a run killed -9: its folder stays for the next run's sweep
"""


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.33.2", "gpu_nodes": NODES, "cpu_nodes": [], "gpu_operator": True}


class Storm:
    """Separate gpu-bootstrap processes and in-process threads, all starting, sweeping and ending, until stopped."""

    def __init__(self, config: Path, log: Path):
        self.config, self.log = config, log
        self.env = tool_env()
        self.stopping = threading.Event()
        self.errors: list[str] = []
        self.killed_folders: list[Path] = []
        self.ended_pids: list[int] = []
        self.commands = 0
        self.threads = [threading.Thread(target=self._separate_commands, daemon=True),
                        threading.Thread(target=self._killed_runs, daemon=True),
                        threading.Thread(target=self._in_process, daemon=True)]

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_):
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=120)

    def _separate_commands(self):
        while not self.stopping.is_set():  # `status` beside `up`: each one sweeps on its way in
            done = subprocess.run([sys.executable, "-m", "gpu_bootstrap", "status", "-c", str(self.config),
                                   "--log-file", str(self.log)], env=self.env, capture_output=True, text=True,
                                  timeout=120)
            self.commands += 1
            if done.returncode not in (0, 1):
                self.errors.append(f"status exited {done.returncode}: {done.stderr[-2000:]}")

    def _killed_runs(self):
        while not self.stopping.is_set():
            killed = subprocess.run([sys.executable, "-c", KILLED_RUN], env=self.env, capture_output=True,
                                    text=True, timeout=60)
            if killed.returncode != -signal.SIGKILL or not killed.stdout.strip():
                self.errors.append(f"the killed run ended {killed.returncode}: {killed.stderr[-2000:]}")
                return
            self.killed_folders.append(Path(killed.stdout.strip()))
            time.sleep(0.2)

    def _in_process(self):
        while not self.stopping.is_set():  # a second command in this process: its folder and its sweep
            tempfiles.run_folder()
            tempfiles.sweep()
            time.sleep(0.05)


def test_runs_starting_sweeping_and_ending_together_leave_a_live_installs_relay_alone(cluster, tmp_path):
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}}}\nnodes:\n" +
                      "".join(f"  - name: {n}\n" for n in NODES) +
                      "monitoring: {enabled: false}\n"
                      f"gpu_operator:\n  chart: {chart('gpu-operator-v26.7.0.tgz')}\n  wait_timeout: 60\n"
                      f"scheduler:\n  wait_timeout: 60\nvalidate:\n  timeout: 60\n")
    report = write_report(tmp_path / "report.json", NODES)
    with Storm(config, tmp_path / "storm.log") as storm:
        result = runner.invoke(app, ["up", "-c", str(config), "--preflight-report", str(report), "-o", "json",
                                     "--only", "node-prep,gpu-operator", "--log-file", str(tmp_path / "log")])
        deadline = time.monotonic() + 60
        while (storm.commands < 2 or len(storm.killed_folders) < 3) and time.monotonic() < deadline:
            time.sleep(0.2)  # the storm overlaps the install, and has swept a few times
    assert not storm.errors, storm.errors
    assert result.exit_code == 0, result.output
    steps = {s["id"]: s["status"] for s in json.loads(result.stdout)["steps"]}
    assert steps["gpu-operator"] == "applied", steps
    assert storm.commands >= 2 and len(storm.killed_folders) >= 3
    live = tempfiles.run_folder()
    assert live.is_dir() and tempfiles._lock_held(live / tempfiles.LOCK_FILE) is True
    tempfiles.sweep()
    assert not [p for p in storm.killed_folders if p.exists()]  # the sweeps took every dead run's folder
