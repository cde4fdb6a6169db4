"""The monitoring renderers' details the promtool and Prometheus tests cannot run in the unit layer: each alert's
hold time and severity (an alert that must fire at once has no `for`), the temperature threshold, the rule group;
label selectors on both sides of each operator and in words, attach mode's findings line by line, the Grafana
sidecars recognised, the DCGM ServiceMonitor values and the dashboard ConfigMaps' JSON."""
from __future__ import annotations

import json

import pytest

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.render import gpu_alerts, gpu_dashboards
from gpu_bootstrap.render import monitoring as render

pytestmark = pytest.mark.unit


def test_each_alert_holds_for_its_time_with_its_severity():
    assert [(r["alert"], r.get("for"), r["labels"]) for r in gpu_alerts.rules()] == [
        ("GpuXidErrorReported", None, {"severity": "warning"}),
        ("GpuXidHardwareFault", None, {"severity": "critical"}),
        ("GpuTooHot", "5m", {"severity": "warning"}),
        ("GpuRowRemapFailure", None, {"severity": "critical"}),
        ("GpuUncorrectableRowsRemapped", None, {"severity": "warning"}),
        ("GpuDcgmExporterMissing", "10m", {"severity": "warning"}),
        ("GpuAllocatedButIdle", "1h", {"severity": "info"}),
        ("GpuNodeAdvertisesNoGpus", "15m", {"severity": "warning"}),
        ("GpuPodsUnschedulable", "10m", {"severity": "warning"}),
        ("GpuPodsPendingOnBinpackScheduler", "15m", {"severity": "warning"}),
        ("GpuAdmissionWebhookFailing", "5m", {"severity": "warning"})]
    assert all("for" not in r for r in gpu_alerts.rules() if r["alert"].startswith("GpuXid"))


def test_a_gpu_is_too_hot_above_85_degrees():
    hot = next(r for r in gpu_alerts.rules() if r["alert"] == "GpuTooHot")
    assert hot["expr"] == "DCGM_FI_DEV_GPU_TEMP > 85 < 1000"


def test_the_alerts_form_one_group_and_the_workload_series_another_unless_turned_off():
    assert gpu_alerts.groups() == [{"name": "gpu-bootstrap.gpu", "rules": gpu_alerts.rules()},
                                   {"name": "gpu-bootstrap.gpu-workloads", "rules": gpu_alerts.workload_rules()}]
    assert gpu_alerts.groups(gpu_alerts.AlertSettings(workload_rules=False)) == [
        {"name": "gpu-bootstrap.gpu", "rules": gpu_alerts.rules()}]


# --- render/monitoring.py ---------------------------------------------------------------------------------------------

PART_OF = {"app.kubernetes.io/managed-by": "gpu-bootstrap", "app.kubernetes.io/part-of": "gpu-bootstrap-monitoring"}


def test_the_owned_selector_selects_exactly_our_labels_and_the_dcgm_job_is_the_exporters_app():
    assert dict(pair.split("=") for pair in render.OWNED_SELECTOR.split(",")) == PART_OF
    # the operator's ServiceMonitor has jobLabel: app, and the exporter's pods are app=nvidia-dcgm-exporter
    assert render.DCGM_JOB == "nvidia-dcgm-exporter"


def test_the_dcgm_service_monitor_keeps_the_exporters_labels_and_adds_the_node():
    assert render.dcgm_service_monitor("30s", {"z": "1", "a": "2"}) == {
        "enabled": True, "interval": "30s", "honorLabels": True, "additionalLabels": {"a": "2", "z": "1"},
        "relabelings": [
            {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"},
            {"regex": "^(namespace|pod|container)$", "action": "labeldrop"}]}


@pytest.mark.parametrize("selector, labels, selected", [
    ({}, None, True),
    ({"matchLabels": {"a": "1"}}, None, False),
    ({"matchExpressions": [{"key": "team", "operator": "In", "values": ["gpu"]}]}, {"team": "web"}, False),
    ({"matchExpressions": [{"key": "team", "operator": "In", "values": ["gpu"]}]}, {}, False),
    ({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["web"]}]}, {"team": "web"}, False),
    ({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["web"]}]}, {"team": "gpu"}, True),
    ({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, {"team": ""}, True),
    ({"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]}, {}, True),
])
def test_selector_semantics_on_both_sides(selector, labels, selected):
    assert render.matches(selector, labels) is selected


def test_an_unsatisfiable_selector_is_quoted_with_sorted_keys():
    selector = {"matchLabels": {"b": "1"}, "matchExpressions": [{"operator": "DoesNotExist", "key": "b"}]}
    with pytest.raises(render.SelectorProblem) as raised:
        render.satisfying_labels(selector, "ruleSelector")
    assert str(raised.value) == ('ruleSelector {"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}], '
                                 '"matchLabels": {"b": "1"}} cannot be satisfied by any labels')


@pytest.mark.parametrize("selector, text", [
    (None, "null (nothing)"),
    ({}, "{} (everything)"),
    ({"matchLabels": {}, "matchExpressions": []}, "{} (everything)"),
    ({"matchLabels": {"b": "2", "a": "1"}}, "a=1, b=2"),
    ({"matchExpressions": [{"key": "x", "operator": "Exists"}, {"key": "t", "operator": "In", "values": ["a", "b"]}]},
     "x Exists, t In a,b"),
    ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]},
     "a=1, x DoesNotExist"),
])
def test_selectors_are_described_in_words(selector, text):
    assert render.describe_selector(selector) == text


def test_a_target_cannot_be_changed_after_it_is_chosen():
    target = render.install_target(cfg.Config.model_validate({"nodes": [{"name": "a"}]}).monitoring, "why")
    with pytest.raises(AttributeError):  # dataclasses.FrozenInstanceError
        target.namespace = "elsewhere"
    assert target.namespace == "monitoring"


def prometheus(**spec) -> dict:
    base = {"serviceMonitorSelector": {}, "serviceMonitorNamespaceSelector": {}, "ruleSelector": {},
            "ruleNamespaceSelector": {}}
    return {"metadata": {"name": "k8s", "namespace": "obs"}, "spec": {**base, **spec}}


def sidecar(namespaces: list[str], value: str = "") -> dict:
    return {"where": "Deployment grafana/grafana", "label": "gd", "value": value, "namespaces": namespaces}


@pytest.mark.parametrize("sidecars, dashboards, label, seen", [
    ([sidecar(["ALL"], "yes")], "obs", ("gd", "yes"), "ConfigMaps labelled gd=yes in all namespaces → our dashboards "
                                                       "go to obs"),
    ([sidecar(["grafana", "obs"])], "obs", ("gd", "1"), "ConfigMaps labelled gd=1 in grafana, obs → our dashboards "
                                                         "go to obs"),
    ([sidecar(["grafana", "dash"]), sidecar(["obs"])], "grafana", ("gd", "1"),
     "ConfigMaps labelled gd=1 in grafana, dash → our dashboards go to grafana"),
])
def test_attach_says_what_it_found_and_where_the_dashboards_go(sidecars, dashboards, label, seen):
    target = render.attach_target(prometheus(serviceMonitorSelector={"matchLabels": {"team": "gpu"}}), {}, sidecars,
                                  "gpu-operator", "why")
    assert (target.dashboard_namespace, target.dashboard_label, target.warnings) == (dashboards, label, ())
    assert target.found == (
        "Prometheus obs/k8s",
        "serviceMonitorSelector team=gpu → the DCGM ServiceMonitor gets team=gpu",
        "ruleSelector {} (everything) → our PrometheusRule gets no labels (it selects everything)",
        "serviceMonitorNamespaceSelector all namespaces includes gpu-operator",
        "ruleNamespaceSelector all namespaces: our PrometheusRule goes to obs",
        f"Grafana dashboard sidecar in Deployment grafana/grafana: {seen}")


def test_attach_without_a_sidecar_warns_with_the_label_it_uses():
    target = render.attach_target(prometheus(ruleNamespaceSelector=None), {}, [], "gpu-operator", "why")
    assert target.found[-1] == "ruleNamespaceSelector its own namespace obs (selector null): our PrometheusRule goes " \
                               "to obs"
    assert target.warnings == ("no Grafana with a dashboard sidecar found: the dashboards are written as ConfigMaps "
                               "labelled grafana_dashboard=1 in obs; import their JSON into your Grafana by hand",)


def test_namespace_selectors_see_the_namespaces_labels_and_its_name():
    by_name = {"matchLabels": {"kubernetes.io/metadata.name": "gpu-operator"}}
    target = render.attach_target(prometheus(serviceMonitorNamespaceSelector=by_name,
                                             ruleNamespaceSelector={"matchLabels": {"rules": "yes"}}),
                                  {"gpu-operator": {"team": "x"}, "obs": {"rules": "yes"}}, [], "gpu-operator", "why")
    assert target.found[3:5] == (
        "serviceMonitorNamespaceSelector namespaces matching kubernetes.io/metadata.name=gpu-operator includes "
        "gpu-operator",
        "ruleNamespaceSelector namespaces matching rules=yes: our PrometheusRule goes to obs")


def test_attach_problems_carry_the_message_and_what_to_do():
    with pytest.raises(render.AttachProblem) as raised:
        render.attach_target(prometheus(ruleSelector=None), {}, [], "gpu-operator", "why")
    problem = raised.value
    assert str(problem) == problem.message == ("obs/k8s ruleSelector is null, which selects nothing: it would ignore "
                                               "the DCGM ServiceMonitor or our alerts")
    assert problem.hint == "set the selector on your Prometheus (e.g. {} for all), or use monitoring.mode: install"
    assert render.AttachProblem("only a message").hint == ""


def workload(*containers: dict, namespace: str = "grafana") -> dict:
    return {"kind": "StatefulSet", "metadata": {"name": "g", "namespace": namespace},
            "spec": {"template": {"spec": {"containers": list(containers)}}}}


def container(name: str, image: str, **env) -> dict:
    return {"name": name, "image": image, "env": [{"name": k, "value": v} for k, v in env.items()]}


FOUND = {"where": "StatefulSet grafana/g", "label": "gd", "value": "", "namespaces": ["grafana"]}


@pytest.mark.parametrize("containers, found", [
    ([container("sc-dashboard", "example/sidecar", LABEL="gd")], [FOUND]),
    ([container("watch", "quay.io/kiwigrid/k8s-sidecar:1.30.0", LABEL="gd", FOLDER="/tmp/dashboards")], [FOUND]),
    ([container("dashboards", "quay.io/kiwigrid/k8s-sidecar:1.30.0", LABEL="gd", FOLDER="/tmp/x")], [FOUND]),
    ([container("dashboards", "example/other", LABEL="gd")], []),  # neither the sidecar image nor its name
    ([container("watch", "quay.io/kiwigrid/k8s-sidecar:1.30.0", LABEL="gd")], []),  # no dashboard in name or folder
    ([container("sc-dashboard", "quay.io/kiwigrid/k8s-sidecar:1.30.0", FOLDER="/tmp/dashboards")], []),  # no LABEL
    ([container("sc-dashboard", "example/sidecar", LABEL="gd", LABEL_VALUE="on", NAMESPACE="all")],
     [{**FOUND, "value": "on", "namespaces": ["ALL"]}]),
    ([container("sc-dashboard", "example/sidecar", LABEL="gd", NAMESPACE=" a, b ,")],
     [{**FOUND, "namespaces": ["a", "b"]}]),
])
def test_grafana_dashboard_sidecars_are_recognised_by_image_or_name(containers, found):
    assert render.grafana_sidecars([workload(*containers)]) == found


def test_each_dashboard_configmap_holds_its_board_as_sorted_indented_json():
    target = render.install_target(cfg.Config.model_validate({"nodes": [{"name": "a"}]}).monitoring, "why")
    configmaps = render.dashboard_configmaps(target)
    assert [c["data"] for c in configmaps] == [
        {f"{uid}.json": json.dumps(board, sort_keys=True, indent=1)} for uid, board in gpu_dashboards.dashboards()]
    assert configmaps[0]["data"]["gpu-bootstrap-overview.json"].startswith('{\n "annotations"')
