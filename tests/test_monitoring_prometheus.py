"""Every dashboard query, evaluated by a real Prometheus server holding two hours of synthetic DCGM and
kube-state-metrics series (tests/monitoring/scenario.py, loaded with `promtool tsdb create-blocks-from openmetrics`).

A query that returns nothing fails, and so does one whose series lack a label its panel groups by. A few numbers
are checked against what the scenario holds, so a query that returns the wrong thing fails too.
"""
from __future__ import annotations

import pytest

from gpu_bootstrap.render import gpu_dashboards
from tests.monitoring import scenario
from tests.monitoring.live import LocalPrometheus
from tests.tools import run, tool

pytestmark = [pytest.mark.tools, pytest.mark.slow]
VARIABLES = {"$namespace": ".*", "$pod": ".*", "$node": ".*"}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prometheus")
    (folder / "series.om").write_text(scenario.openmetrics())
    run([tool("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(folder / "series.om"),
         str(folder / "data")], {}, timeout=300)
    server = LocalPrometheus(folder, "global: {scrape_interval: 1h}\n")
    try:
        yield server
    finally:
        server.stop()


def substitute(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


QUERIES = gpu_dashboards.queries()


@pytest.mark.parametrize("board, panel, query", QUERIES,
                         ids=[f"{b.removeprefix('gpu-bootstrap-')}:{p}:{q.by or q.legend or i}"
                              for i, (b, p, q) in enumerate(QUERIES)])
def test_every_dashboard_query_returns_data_with_its_grouping_labels(prometheus, board, panel, query):
    result = prometheus.query(substitute(query.expr), scenario.QUERY_AT)
    assert result, f"{board} / {panel}: no data for {query.expr}"
    for series in result:
        missing = [label for label in query.by if not series["metric"].get(label)]
        assert not missing, f"{board} / {panel}: series {series['metric']} lacks {missing}"


def value(prometheus, expr: str) -> dict:
    return {tuple(sorted(r["metric"].items())): float(r["value"][1])
            for r in prometheus.query(substitute(expr), scenario.QUERY_AT)}


def by_title(board: str, title: str, index: int = 0) -> str:
    return [q.expr for b, p, q in QUERIES if b == board and p == title][index]


def test_the_numbers_are_the_scenarios(prometheus):
    overview = "gpu-bootstrap-overview"
    assert value(prometheus, by_title(overview, "GPUs allocatable")) == {(): 16.0}
    assert value(prometheus, by_title(overview, "GPUs allocated")) == {(): 8.0}  # done-0 finished: not counted
    assert value(prometheus, by_title(overview, "GPUs busy")) == {(): 7.0}  # train-0 x4, infer-0, train-1 x2
    assert value(prometheus, by_title(overview, "GPU pods pending")) == {(): 2.0}
    assert value(prometheus, by_title(overview, "Free GPUs per node")) == {(("node", "gpu-1"),): 2.0,
                                                                         (("node", "gpu-2"),): 6.0}
    held = value(prometheus, by_title(overview, "GPUs by model", 1))
    assert held == {(("modelName", "NVIDIA H100 80GB HBM3"),): 6.0, (("modelName", "NVIDIA A100-SXM4-80GB"),): 2.0}
    allocation = "gpu-bootstrap-allocation"
    assert value(prometheus, by_title(allocation, "Largest pod that fits")) == {(): 6.0}
    assert value(prometheus, by_title(allocation, "Free GPUs on partly used nodes")) == {(): 8.0}
    assert value(prometheus, by_title(allocation, "Nodes by number of free GPUs")) == {
        (("free_gpus", "2"),): 1.0, (("free_gpus", "6"),): 1.0}
    assert set(value(prometheus, by_title(allocation, "GPU pods pending"))) == {
        (("namespace", "ml"), ("pod", "big-train")), (("namespace", "vision"), ("pod", "queued-0"))}
    namespaces = value(prometheus, by_title("gpu-bootstrap-namespaces", "GPUs requested"))
    assert namespaces == {(("namespace", "ml"),): 5.0, (("namespace", "vision"),): 3.0}
    pods = value(prometheus, by_title("gpu-bootstrap-pods", "GPUs held"))
    assert pods[(("namespace", "ml"), ("node", "gpu-1"), ("pod", "train-0"))] == 4.0
    xid = value(prometheus, by_title("gpu-bootstrap-nodes", "Last XID per GPU"))
    assert xid[(("gpu", "3"), ("node", "gpu-1"))] == 79.0 and xid[(("gpu", "0"), ("node", "gpu-1"))] == 0.0


def test_the_scenario_fires_the_alerts_it_was_built_for(prometheus, tmp_path):
    """The alert expressions (without `for`) over the same data: what an admin would be told about it."""
    from gpu_bootstrap.render.gpu_alerts import rules
    fired = {}
    for rule in rules():
        result = prometheus.query(rule["expr"], scenario.QUERY_AT)
        fired[rule["alert"]] = sorted(tuple(r["metric"].get(k, "") for k in ("node", "gpu", "pod")) for r in result)
    assert fired["GpuTooHot"] == [("gpu-1", "5", "infer-0")]
    assert fired["GpuRowRemapFailure"] == [("gpu-2", "6", "")]
    assert fired["GpuAllocatedButIdle"] == [("gpu-1", "4", "notebook-0")]
    assert fired["GpuDcgmExporterMissing"] == [("gpu-3", "", "")]
    assert fired["GpuNodeAdvertisesNoGpus"] == [("gpu-3", "", "")]
    assert fired["GpuPodsUnschedulable"] == [("", "", "big-train")]
    assert fired["GpuXidHardwareFault"] == [("gpu-1", "3", "train-0")]  # XID 79: the GPU fell off the bus
    assert fired["GpuXidErrorReported"] == []  # a hardware XID is not reported twice
