"""The log file is private (0600) whatever existed at its path before: through the real command line."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from tests.tools import tool_env

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpu_bootstrap", *args], capture_output=True, text=True, cwd=ROOT,
                          env=tool_env(NO_COLOR="1"), timeout=120)


def test_an_existing_world_writable_log_file_is_made_private_and_kept(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("an earlier run\n")
    os.chmod(log, 0o666)
    process = run("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(ROOT / "examples" / "minimal.yaml"),
                  "--log-file", str(log))  # no node facts offline: an incomplete plan, accepted
    assert process.returncode == 0, process.stderr
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    text = log.read_text()
    assert text.startswith("an earlier run\n") and "node-prep" in text  # appended to, not replaced


def test_a_failing_run_also_leaves_its_log_private(tmp_path):
    log = tmp_path / "logs" / "run.log"
    log.parent.mkdir()
    log.write_text("")
    os.chmod(log, 0o644)
    process = run("up", "--dry-run", "--offline", "-c", str(tmp_path / "missing.yaml"), "--log-file", str(log))
    assert process.returncode == 2 and f"details: {log}" in process.stderr
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_a_device_given_as_log_file_keeps_its_mode(tmp_path):
    """`--log-file /dev/null` must not make /dev/null private: tried on a null device node of our own."""
    device = tmp_path / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs root")
    os.chmod(device, 0o666)  # whatever the umask
    process = run("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(ROOT / "examples" / "minimal.yaml"),
                  "--log-file", str(device))  # no node facts offline: an incomplete plan, accepted
    assert process.returncode == 0, process.stderr
    assert stat.S_ISCHR(device.stat().st_mode) and stat.S_IMODE(device.stat().st_mode) == 0o666


def test_a_symbolic_link_given_as_log_file_is_refused_and_its_target_untouched(tmp_path):
    """Another user's link in a shared folder (/tmp/run.log -> ~/.bashrc) must not make us append to, or chmod, the
    file it points at."""
    target = tmp_path / "bashrc"
    target.write_text("export PATH=/usr/bin\n")
    os.chmod(target, 0o644)
    link = tmp_path / "run.log"
    link.symlink_to(target)
    process = run("up", "--dry-run", "--offline", "-c", str(ROOT / "examples" / "minimal.yaml"), "--log-file",
                  str(link))
    assert process.returncode == 2, process.stderr
    assert f"--log-file {link}: is a symbolic link" in process.stderr
    assert target.read_text() == "export PATH=/usr/bin\n" and stat.S_IMODE(target.stat().st_mode) == 0o644
    assert link.is_symlink()
