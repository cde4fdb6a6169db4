"""Whose probe namespace is it (adapters/cluster_probe.py): a run killed with -9 leaves its probe namespace, and the
next run removes it when the owner is known to be gone. A pid is only known inside its own PID namespace: a run in a
container beside us (same host name, another PID namespace) must never be taken for a dead one here."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_bootstrap.adapters import cluster_probe
from tests.tools import tool_env

OWNER_IN_ANOTHER_PID_NAMESPACE = r"""
import os, sys
with open("/proc/sys/kernel/ns_last_pid", "w") as f:  # the run gets this pid inside its own PID namespace
    f.write(str(int(sys.argv[1]) - 1))
child = os.fork()
if child == 0:
    from gpu_bootstrap.adapters.cluster_probe import owner_id
    print(owner_id(), flush=True)
    sys.stdin.read()
    os._exit(0)
os.waitpid(child, 0)
"""


def unused_pid() -> int:
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1000
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    return pid


@pytest.mark.unit
def test_an_owner_is_gone_only_in_our_own_pid_namespace():
    host, ours = socket.gethostname(), cluster_probe.pid_namespace()
    dead = unused_pid()
    assert ours and cluster_probe.owner_id() == f"{host}:{ours}:{os.getpid()}"
    assert cluster_probe._owner_gone(f"{host}:{ours}:{dead}") is True
    assert cluster_probe._owner_gone(f"{host}:{ours}:{os.getpid()}") is False
    assert cluster_probe._owner_gone(f"{host}:4026531999:{dead}") is False  # another namespace: not known
    assert cluster_probe._owner_gone(f"{host}:{dead}") is False  # the format before namespaces: not known
    assert cluster_probe._owner_gone(f"elsewhere:{ours}:{dead}") is False


@pytest.mark.tools
def test_a_live_run_in_another_pid_namespace_is_not_taken_for_gone():
    """A real second PID namespace (unshare --pid, root): the run there has a pid that is no process here."""
    if os.geteuid() != 0:
        pytest.skip("needs root for a PID namespace (unshare --pid)")
    pid = unused_pid()
    run = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                            OWNER_IN_ANOTHER_PID_NAMESPACE, str(pid)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, env=tool_env())
    try:
        owner = run.stdout.readline().strip()
        assert owner.endswith(f":{pid}") and not Path(f"/proc/{pid}").exists()
        assert cluster_probe._owner_gone(owner) is False
    finally:
        run.stdin.close()
        run.wait(timeout=30)
