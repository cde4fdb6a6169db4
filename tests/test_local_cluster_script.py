"""scripts/local-cluster as a user runs it: `up` ends with `ready <kubeconfig>`, the real kubectl sees the real
server's version and the KWOK GPU nodes with their nvidia.com/gpu capacity, `env` prints the exports, and `down`
leaves no process it started, no folder and no route."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.localcluster.cluster import LocalCluster, kubernetes_version, missing_binaries, start_time
from tests.tools import ROOT, missing, tool, tool_env

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.xdist_group("live")]


def script(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "local-cluster"), *args], capture_output=True,
                          text=True, timeout=timeout, env=tool_env())


def local_routes() -> str:
    return subprocess.run(["ip", "-4", "route", "show", "table", "local"], capture_output=True, text=True).stdout


def test_up_env_and_down_leave_nothing_behind(tmp_path):
    if missing_binaries():
        missing("the local cluster's components are not built: " + ", ".join(missing_binaries()))
    folder = tmp_path / "cluster"
    started = script("up", "--dir", str(folder), "--gpu-nodes", "2", "--gpus-per-node", "8", "--cpu-nodes", "1")
    try:
        assert started.returncode == 0, started.stderr
        assert started.stdout.strip() == f"ready {folder / 'admin.kubeconfig'}"
        cluster = LocalCluster.load(folder)
        kubectl = [tool("kubectl"), "--kubeconfig", str(cluster.kubeconfig)]
        version = json.loads(subprocess.run([*kubectl, "version", "-o", "json"], capture_output=True, text=True,
                                            check=True, env=tool_env(tmp_path / "home")).stdout)
        assert version["serverVersion"]["gitVersion"] == kubernetes_version()
        nodes = json.loads(subprocess.run([*kubectl, "get", "nodes", "-o", "json"], capture_output=True, text=True,
                                          check=True, env=tool_env(tmp_path / "home")).stdout)["items"]
        gpus = {n["metadata"]["name"]: n["status"]["capacity"].get("nvidia.com/gpu") for n in nodes}
        assert gpus == {"gpu-1": "8", "gpu-2": "8", "cpu-1": None}
        assert all(c["status"] == "True" for n in nodes for c in n["status"]["conditions"] if c["type"] == "Ready")
        assert cluster.network in local_routes()
        env = script("env", "--dir", str(folder))
        assert env.stdout.splitlines() == [f"export KUBECONFIG={cluster.kubeconfig}",
                                           f"export GPU_BOOTSTRAP_LIVE_KUBECONFIG={cluster.kubeconfig}"]
        again = script("up", "--dir", str(folder))
        assert again.returncode == 1 and "already runs" in again.stderr  # a second up refuses, touching nothing
        assert LocalCluster.load(folder).running() == cluster.running()
    finally:
        cluster = LocalCluster.load(folder) if (folder / "cluster.json").exists() else None
        stopped = script("down", "--dir", str(folder))
    assert stopped.returncode == 0, stopped.stderr
    assert cluster is not None and len(cluster.pids) == 6
    assert [name for name, (pid, started_at) in cluster.pids.items() if start_time(pid) == started_at] == []
    assert not folder.exists()
    assert cluster.network not in local_routes()
    assert script("env", "--dir", str(folder)).returncode == 1
