"""A cluster whose every node is a GPU node: tainting them must not leave the platform's own pods nowhere to run.

The real gpu-operator chart through the real helm into the emulator, whose scheduler honours taints and whose
stand-in operator runs the operands; the bin-packing scheduler's pods are started by the emulator's stand-in.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from tests.conftest import chart
from tests.nodes.reports import write_report

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.usefixtures("helm_on_path")]
runner = CliRunner()
NODES = ["node5", "node6"]
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.33.2", "gpu_nodes": NODES, "cpu_nodes": [], "gpu_operator": True}


def test_up_on_an_all_gpu_cluster_completes_and_the_platform_tolerates_the_taint(cluster, tmp_path):
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}}}\nnodes:\n" +
                      "".join(f"  - name: {n}\n" for n in NODES) +
                      "monitoring: {enabled: false}\n"
                      f"gpu_operator:\n  chart: {chart('gpu-operator-v26.7.0.tgz')}\n  wait_timeout: 30\n"
                      f"scheduler:\n  wait_timeout: 30\nvalidate:\n  timeout: 30\n")
    assert {n["metadata"]["name"] for n in cluster.emu.list("nodes")} == set(NODES)
    report = write_report(tmp_path / "report.json", NODES)
    result = runner.invoke(app, ["up", "-c", str(config), "--preflight-report", str(report), "-o", "json",
                                 "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert {s["id"]: s["status"] for s in document["steps"]}["validate"] == "applied"
    node_prep = next(s for s in document["steps"] if s["id"] == "node-prep")
    assert "leaves no untainted, schedulable, Ready node" in node_prep["message"]
    pods = cluster.emu.list("pods", namespace="gpu-operator")
    platform = [p for p in pods if not any(r.get("kind") == "DaemonSet"
                                           for r in p["metadata"].get("ownerReferences") or [])]
    assert platform and all(GPU_TOLERATION in p["spec"].get("tolerations", []) for p in platform)
    assert all(p["spec"].get("nodeName") in NODES for p in platform)
    scheduler = cluster.emu.get("deployments", "gpu-binpack-scheduler", "kube-system")
    assert GPU_TOLERATION in scheduler["spec"]["template"]["spec"]["tolerations"]
    [opa] = [d for d in cluster.emu.list("deployments") if d["metadata"]["name"] == "opa"]
    assert GPU_TOLERATION in opa["spec"]["template"]["spec"]["tolerations"]
    assert opa["status"].get("availableReplicas") == opa["spec"]["replicas"]
    doctor = runner.invoke(app, ["doctor", "-c", str(config), "--no-nodes", "-o", "json",
                                 "--log-file", str(tmp_path / "log")])
    checks = {c["id"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["node-prep"]["status"] == "warn"
