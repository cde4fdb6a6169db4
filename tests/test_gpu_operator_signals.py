"""`gpu-bootstrap up` stopped during the gpu-operator step (the real helm installing the real chart into the
emulator): kill -9 of gpu-bootstrap alone takes helm with it, so the rerun converges instead of colliding with a
helm still installing; SIGTERM stops helm (which records the release as failed) and the run exits within 5 s."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_bootstrap.pipeline.checkpoint import NAME as STATE, NAMESPACE
from gpu_bootstrap.pipeline.lock import LEASE
from tests.nodes.reports import write_report
from tests.test_gpu_operator_emulator import NODES, OPERATOR_NS, releases, statuses, up, write_config
from tests.test_helm_processes import gone_within, helm_children, start_time
from tests.tools import ROOT, Stall

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.usefixtures("helm_on_path")]


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.33.2", "gpu_nodes": NODES, "cpu_nodes": ["cpu-1"], "gpu_operator": True}


def start_up(cluster, tmp_path: Path) -> tuple[subprocess.Popen, int, str]:
    """`gpu-bootstrap up` in a child process, held inside `helm upgrade --install`; returns it and helm's pid."""
    config = write_config(tmp_path, cluster)
    report = write_report(tmp_path / "report.json", NODES)
    cluster.emu.faults.add("PATCH", r"/deployments/gpu-operator$", delay=60, count=1)
    process = subprocess.Popen([sys.executable, "-m", "gpu_bootstrap", "up", "-c", str(config), "--preflight-report",
                                str(report), "--log-file", str(tmp_path / "first.log")],
                               cwd=ROOT, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while True:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the install never reached the operator Deployment"
        reached = any(r.path.endswith("/deployments/gpu-operator") and r.method == "PATCH"
                      for r in cluster.emu.requests.all())
        helms = helm_children(process.pid)
        if reached and helms:
            return process, helms[0], start_time(helms[0])
        time.sleep(0.05)


def release_status(cluster) -> str:
    return json.loads(cluster.helm("status", "gpu-operator", "-n", OPERATOR_NS, "-o", "json").stdout)["info"]["status"]


def test_kill_9_of_gpu_bootstrap_alone_takes_helm_with_it_and_the_rerun_converges(cluster, tmp_path):
    process, helm_pid, started = start_up(cluster, tmp_path)
    process.kill()  # gpu-bootstrap only, not its process group: helm is not told anything
    process.communicate()
    assert gone_within(helm_pid, started, 3), "helm outlived gpu-bootstrap"
    assert release_status(cluster) == "pending-install"  # SIGKILLed: helm could not record anything
    result, document = up(tmp_path / "gpu-bootstrap.yaml", tmp_path)
    assert result.exit_code == 0, result.output
    assert statuses(document)["gpu-operator"] == "applied"
    assert [r["status"] for r in releases(cluster)] == ["deployed"]


def test_sigterm_stops_helm_records_interrupted_and_exits_within_5_s(cluster, tmp_path):
    process, helm_pid, started = start_up(cluster, tmp_path)
    with Stall() as stall:  # the CPU a busy machine withheld meanwhile stretches the bound (tests/tools.py)
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=60)
        took = time.monotonic() - sent
    assert took < 5 + stall.late, f"exited {took:.1f} s after SIGTERM (the machine withheld {stall.late:.1f} s)"
    assert process.returncode == 143, err
    assert "interrupted" in err and "Traceback" not in err
    assert gone_within(helm_pid, started, 1)
    assert release_status(cluster) == "failed"  # helm got SIGTERM and recorded the cancelled install
    record = json.loads(cluster.emu.get("configmaps", STATE, NAMESPACE)["data"]["gpu-operator"])
    assert record["status"] == "interrupted"
    assert not cluster.emu.get("leases", LEASE, NAMESPACE)["spec"].get("holderIdentity")
    result, document = up(tmp_path / "gpu-bootstrap.yaml", tmp_path)
    assert result.exit_code == 0, result.output
    assert [r["status"] for r in releases(cluster)] == ["deployed"]
