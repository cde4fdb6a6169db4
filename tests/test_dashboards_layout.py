"""The dashboards' JSON as Grafana reads it: the layout of every board (width and height of each panel), queries
that are instant exactly where the panel shows the current value (stat, table, bar gauge) and tables asking for table
format, each panel carrying its declared title, description, unit, legends and queries in order, the variables'
queries and multi-select, the busy threshold, and JSON keys in a stable order."""
from __future__ import annotations

import dataclasses

import pytest

from gpu_bootstrap.render import gpu_dashboards as dashboards

pytestmark = pytest.mark.unit



def boards() -> dict[str, dict]:
    return dict(dashboards.dashboards())


STAT, WIDE, HALF = (6, 5), (24, 8), (12, 8)
LAYOUT = {
    "gpu-bootstrap-overview": [("stat", STAT)] * 4 + [("timeseries", WIDE), ("table", HALF), ("table", HALF),
                                                      ("bargauge", WIDE)],
    "gpu-bootstrap-namespaces": [("timeseries", HALF)] * 5 + [("table", HALF)],
    "gpu-bootstrap-pods": [("timeseries", HALF)] * 3 + [("table", HALF)] * 2,
    "gpu-bootstrap-nodes": [("timeseries", HALF)] * 4 + [("table", HALF)] * 2,
    "gpu-bootstrap-allocation": [("bargauge", HALF), ("table", HALF), ("stat", STAT), ("stat", STAT),
                                 ("timeseries", HALF), ("table", HALF), ("timeseries", HALF)],
}


@pytest.mark.parametrize("uid", list(LAYOUT))
def test_each_board_lays_its_panels_out_as_designed(uid):
    assert [(p["type"], (p["gridPos"]["w"], p["gridPos"]["h"])) for p in boards()[uid]["panels"]] == LAYOUT[uid]


def test_queries_are_instant_exactly_where_the_panel_shows_the_current_value():
    for board in boards().values():
        for panel in board["panels"]:
            for target in panel["targets"]:
                assert target.get("instant", False) is (panel["type"] != "timeseries"), panel["title"]
                assert target.get("format") == ("table" if panel["type"] == "table" else None), panel["title"]


def test_a_declared_query_is_a_range_query_unless_it_says_otherwise():
    assert dashboards.Query("up").instant is False


def test_every_panel_carries_what_it_declares():
    assert list(boards()) == [board.uid for board in dashboards.BOARDS]
    for board in dashboards.BOARDS:
        built = boards()[board.uid]
        assert (built["uid"], built["title"], built["description"]) == (board.uid, board.title, board.description)
        assert [p["title"] for p in built["panels"]] == [p.title for p in board.panels]
        for declared, panel in zip(board.panels, built["panels"]):
            defaults = panel.get("fieldConfig", {}).get("defaults", {})
            assert (panel["description"], defaults.get("unit", "")) == (declared.description, declared.unit)
            assert defaults.get("noValue") == ("0" if declared.kind in ("stat", "bargauge") else None)
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert [(t["refId"], t["expr"], t.get("legendFormat", "")) for t in panel["targets"]] == [
                ("ABCDEFGH"[i], q.expr, q.legend) for i, q in enumerate(declared.queries)]


def test_legends_name_the_series_by_their_labels():
    free = next(p for p in boards()["gpu-bootstrap-overview"]["panels"] if p["title"] == "Free GPUs per node")
    assert free["targets"][0]["legendFormat"] == "{{node}}"
    held = next(p for p in boards()["gpu-bootstrap-namespaces"]["panels"] if p["title"] == "GPU utilisation")
    assert held["targets"][0]["legendFormat"] == "{{namespace}}"


GPU = 'resource="nvidia_com_gpu"'
VARIABLE_QUERIES = {
    "namespace": f"label_values(kube_pod_container_resource_requests{{{GPU}}}, namespace)",
    "pod": f'label_values(kube_pod_container_resource_requests{{{GPU}, namespace=~"$namespace"}}, pod)',
    "node": f"label_values(kube_node_status_allocatable{{{GPU}}}, node)"}


@pytest.mark.parametrize("uid, names", [
    ("gpu-bootstrap-overview", []), ("gpu-bootstrap-namespaces", ["namespace"]),
    ("gpu-bootstrap-pods", ["namespace", "pod"]), ("gpu-bootstrap-nodes", ["node"]),
    ("gpu-bootstrap-allocation", ["namespace"])])
def test_the_variables_select_many_values_or_all(uid, names):
    variables = boards()[uid]["templating"]["list"]
    assert [v["name"] for v in variables] == ["datasource", *names]
    for variable in variables[1:]:
        assert (variable["label"], variable["query"], variable["multi"], variable["includeAll"], variable["allValue"],
                variable["refresh"], variable["sort"]) == (variable["name"].capitalize(),
                                                           VARIABLE_QUERIES[variable["name"]], True, True, ".*", 2, 1)


def test_a_gpu_is_busy_from_10_percent_utilisation():
    busy = next(p for p in boards()["gpu-bootstrap-overview"]["panels"] if p["title"] == "GPUs busy")
    assert busy["targets"][0]["expr"] == "count(avg_over_time(DCGM_FI_DEV_GPU_UTIL[5m]) >= 10)"


def test_the_json_keys_come_in_order_so_the_configmaps_text_is_stable():
    for board in boards().values():
        assert list(board) == sorted(board)
        for panel in board["panels"]:
            assert list(panel) == sorted(panel)


def test_queries_lists_every_query_of_every_panel():
    assert dashboards.queries() == [(b.uid, p.title, q) for b in dashboards.BOARDS for p in b.panels for q in p.queries]
    assert len(dashboards.queries()) == sum(len(p["targets"]) for b in boards().values() for p in b["panels"])


def test_the_declarations_cannot_be_changed_after_the_fact():
    board = dashboards.BOARDS[0]
    for obj, name in ((board, "uid"), (board.panels[0], "title"), (board.panels[0].queries[0], "expr")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, "changed")
