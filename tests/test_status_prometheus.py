"""Allocated but idle GPUs in `gpu-bootstrap status`, from a real Prometheus reached through the emulator's service
proxy. The Prometheus holds the monitoring tests' synthetic DCGM series (tests/monitoring/scenario.py), moved to end
now so that a window ending now covers them: ml/notebook-0 holds a GPU at 0 %, the other pods' GPUs are busy.
"""
from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from tests.monitoring import scenario
from tests.monitoring.live import LocalPrometheus
from tests.tools import run, tool

pytestmark = [pytest.mark.tools, pytest.mark.slow]
runner = CliRunner()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prometheus")
    original = scenario.T0
    scenario.T0 = (int(time.time()) - scenario.SPAN) // scenario.STEP * scenario.STEP  # the series end now
    try:
        (folder / "series.om").write_text(scenario.openmetrics())
    finally:
        scenario.T0 = original
    run([tool("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(folder / "series.om"),
         str(folder / "data")], {}, timeout=300)
    server = LocalPrometheus(folder, "global: {scrape_interval: 1h}\n")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def emulator_options():
    return {"gpu_nodes": ["gpu-1", "gpu-2"], "cpu_nodes": ["cpu-1"]}


def serve(cluster, prometheus, name: str = "prometheus-operated") -> None:
    """The Service the Prometheus Operator puts in front of a Prometheus, its endpoint the real server."""
    cluster.emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}})
    cluster.emu.seed({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "monitoring"},
                      "spec": {"selector": {"operator.prometheus.io/name": "kps-prometheus"},
                               "ports": [{"name": "web", "port": 9090, "targetPort": 9090}]}})
    cluster.emu.proxy_service("monitoring", name, prometheus.url)


def status(cluster, tmp_path, monkeypatch, *extra: str) -> dict:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["status", "--kubeconfig", str(cluster.kubeconfig), "-o", "json", *extra,
                                 "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_idle_gpus_are_found_with_namespace_and_pod(cluster, prometheus, tmp_path, monkeypatch):
    serve(cluster, prometheus)
    use = status(cluster, tmp_path, monkeypatch, "--window", "30m")["utilisation"]
    assert use["prometheus"] == "monitoring/prometheus-operated:web" and use["note"] == ""
    held = {(r["namespace"], r["pod"]) for r in use["gpus"]}
    assert held == {("ml", "train-0"), ("ml", "notebook-0"), ("vision", "infer-0"), ("vision", "train-1")}
    assert len(use["gpus"]) == 8  # train-0 x4, notebook-0, infer-0, train-1 x2
    assert [(r["namespace"], r["pod"], r["node"]) for r in use["idle"]] == [("ml", "notebook-0", "gpu-1")]
    pods = {r["pod"]: r for r in use["pods"]}
    assert (pods["notebook-0"]["gpus"], pods["notebook-0"]["idle_gpus"]) == (1, 1)
    assert (pods["train-0"]["gpus"], pods["train-0"]["idle_gpus"]) == (4, 0)
    busy = {r["pod"]: r["mean_pct"] for r in use["gpus"] if not r["idle"]}
    assert 80 <= busy["train-0"] <= 90 and 35 <= busy["infer-0"] <= 45  # the scenario's 85 % and 40 % (+/- 5)


def test_the_threshold_decides_what_is_idle(cluster, prometheus, tmp_path, monkeypatch):
    serve(cluster, prometheus)
    use = status(cluster, tmp_path, monkeypatch, "--window", "30m", "--idle-below", "50",
                 "--prometheus", "monitoring/prometheus-operated:web")["utilisation"]
    assert {r["pod"] for r in use["idle"]} == {"notebook-0", "infer-0"}


def test_an_unreachable_prometheus_is_a_note_not_a_failure(cluster, tmp_path, monkeypatch):
    cluster.emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}})
    cluster.emu.seed({"apiVersion": "v1", "kind": "Service",
                      "metadata": {"name": "prometheus-operated", "namespace": "monitoring"},
                      "spec": {"ports": [{"name": "web", "port": 9090}]}})  # no endpoint: the proxy answers 503
    use = status(cluster, tmp_path, monkeypatch)["utilisation"]
    assert use["gpus"] == [] and "service proxy" in use["note"]
