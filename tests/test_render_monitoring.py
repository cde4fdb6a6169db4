"""The monitoring step's pure parts as tables: label selectors, attach-mode targeting, the Grafana sidecars found,
kube-prometheus-stack's values, the DCGM ServiceMonitor values (one source for both steps), the config's bounds."""
from __future__ import annotations

import json
import re

import pytest

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.render import gpu_dashboards, gpu_operator_values
from gpu_bootstrap.render import monitoring as render

pytestmark = pytest.mark.unit  # host-free: the fast loop (pytest -m unit)

PLAYBOOK = ["preflight", "node-prep", "monitoring", "gpu-operator", "binpack-scheduler", "validate"]


def config(**monitoring) -> cfg.Config:
    return cfg.Config.model_validate({"nodes": [{"name": "node5"}], "monitoring": monitoring})


@pytest.mark.parametrize("selector, labels, selected", [
    (None, {"a": "1"}, False),
    ({}, {}, True),
    ({"matchLabels": {"release": "kps"}}, {"release": "kps", "x": "y"}, True),
    ({"matchLabels": {"release": "kps"}}, {"release": "other"}, False),
    ({"matchExpressions": [{"key": "team", "operator": "In", "values": ["gpu", "ml"]}]}, {"team": "ml"}, True),
    ({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["web"]}]}, {}, True),
    ({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]}, {"skip": ""}, False),
])
def test_selector_semantics(selector, labels, selected):
    assert render.matches(selector, labels) is selected


@pytest.mark.parametrize("selector, labels", [
    ({}, {}),
    ({"matchLabels": {"release": "kps"}}, {"release": "kps"}),
    ({"matchExpressions": [{"key": "prometheus", "operator": "In", "values": ["main", "b"]},
                           {"key": "x", "operator": "Exists"}, {"key": "y", "operator": "DoesNotExist"}]},
     {"prometheus": "main", "x": "gpu-bootstrap"}),
])
def test_the_fewest_labels_that_satisfy_a_selector(selector, labels):
    assert render.satisfying_labels(selector, "s") == labels
    assert render.matches(selector, labels)


@pytest.mark.parametrize("selector, problem", [
    (None, "is null, which selects nothing"),
    ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "a", "operator": "In", "values": ["2"]}]},
     "wants a to be 1 and one of ['2']"),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]},
                           {"key": "a", "operator": "NotIn", "values": ["1"]}]}, "cannot be satisfied"),
])
def test_selectors_no_labels_can_satisfy(selector, problem):
    with pytest.raises(render.SelectorProblem, match=problem.replace("[", r"\[").replace("]", r"\]")):
        render.satisfying_labels(selector, "s")


def prometheus(**spec) -> dict:
    base = {"serviceMonitorSelector": {}, "serviceMonitorNamespaceSelector": {}, "ruleSelector": {},
            "ruleNamespaceSelector": {}}
    return {"metadata": {"name": "k8s", "namespace": "obs"}, "spec": {**base, **spec}}


SIDECAR = {"kind": "Deployment", "metadata": {"name": "grafana", "namespace": "grafana"}, "spec": {"template": {
    "spec": {"containers": [{"name": "grafana", "image": "grafana/grafana"},
                            {"name": "grafana-sc-dashboard", "image": "quay.io/kiwigrid/k8s-sidecar:1.30.0",
                             "env": [{"name": "LABEL", "value": "gd"}, {"name": "FOLDER", "value": "/tmp/dashboards"}]},
                            {"name": "grafana-sc-datasources", "image": "quay.io/kiwigrid/k8s-sidecar:1.30.0",
                             "env": [{"name": "LABEL", "value": "grafana_datasource"},
                                     {"name": "FOLDER", "value": "/etc/grafana/provisioning/datasources"}]}]}}}}


def test_attach_labels_our_objects_and_reads_the_sidecar_without_changing_the_prometheus():
    found = prometheus(serviceMonitorSelector={"matchLabels": {"team": "gpu"}},
                       ruleSelector={"matchLabels": {"role": "alerts"}}, ruleNamespaceSelector=None)
    snapshot = json.dumps(found, sort_keys=True)
    sidecars = render.grafana_sidecars([SIDECAR])
    assert sidecars == [{"where": "Deployment grafana/grafana", "label": "gd", "value": "", "namespaces": ["grafana"]}]
    target = render.attach_target(found, {}, sidecars, "gpu-operator", "why")
    assert (target.mode, target.namespace, target.service_monitor_labels, target.rule_labels) == (
        "attach", "obs", {"team": "gpu"}, {"role": "alerts"})
    assert (target.dashboard_namespace, target.dashboard_label) == ("grafana", ("gd", "1"))
    assert json.dumps(found, sort_keys=True) == snapshot
    objects = render.objects(target)
    assert objects[0]["metadata"]["labels"]["role"] == "alerts" and objects[0]["metadata"]["namespace"] == "obs"
    assert all(o["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-bootstrap" for o in objects)
    assert {o["metadata"]["namespace"] for o in objects[1:]} == {"grafana"}
    assert target.scrape_values("30s")["additionalLabels"] == {"team": "gpu"}


@pytest.mark.parametrize("spec, namespaces, problem", [
    ({"serviceMonitorSelector": None}, {}, "serviceMonitorSelector is null"),
    ({"ruleSelector": None}, {}, "ruleSelector is null"),
    ({"serviceMonitorNamespaceSelector": None}, {},
     "only in its own namespace obs (selector null), not in gpu-operator"),
    ({"serviceMonitorNamespaceSelector": {"matchLabels": {"monitor": "yes"}}}, {"gpu-operator": {}},
     "only in namespaces matching monitor=yes"),
    ({"ruleNamespaceSelector": {"matchLabels": {"rules": "yes"}}}, {"obs": {}},
     "does not look for PrometheusRules in its own namespace obs"),
])
def test_attach_refuses_a_prometheus_that_would_ignore_us(spec, namespaces, problem):
    with pytest.raises(render.AttachProblem, match=re.escape(problem)):
        render.attach_target(prometheus(**spec), namespaces, [], "gpu-operator", "why")


def test_a_labelled_operator_namespace_is_selected():
    target = render.attach_target(prometheus(serviceMonitorNamespaceSelector={"matchLabels": {"monitor": "yes"}}),
                                  {"gpu-operator": {"monitor": "yes"}}, [], "gpu-operator", "why")
    assert target.warnings and "no Grafana with a dashboard sidecar found" in target.warnings[0]


def test_stack_values_layers_and_explains():
    conf = config(retention="30d", storage={"size": "100Gi", "storage_class": "fast"}, grafana={"enabled": False},
                  values={"grafana": {"adminPassword": "x"}})
    plan = render.stack_values(conf.monitoring)
    spec = plan.merged["prometheus"]["prometheusSpec"]
    assert spec["retention"] == "30d" and spec["serviceMonitorSelectorNilUsesHelmValues"] is False
    assert spec["storageSpec"]["volumeClaimTemplate"]["spec"] == {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "100Gi"}}, "storageClassName": "fast"}
    assert plan.merged["grafana"]["enabled"] is False and plan.merged["grafana"]["adminPassword"] == "x"
    assert render.installed_by_us(plan.merged)
    assert render.explain(plan)[-1] == "grafana.adminPassword  ← your monitoring.values (value not shown)"


def test_with_no_room_left_the_stacks_pods_tolerate_the_gpu_taint():
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    plan = render.stack_values(config().monitoring, toleration)
    merged = plan.merged
    assert merged["prometheusOperator"]["tolerations"] == [toleration]
    assert merged["prometheus"]["prometheusSpec"]["tolerations"] == [toleration]
    assert merged["kube-state-metrics"]["tolerations"] == [toleration] and merged["grafana"]["tolerations"]
    assert "prometheusOperator" not in render.stack_values(config().monitoring).merged


def test_the_operator_values_take_the_monitoring_steps_dcgm_values():
    conf = config(scrape_interval="30s")
    attach = render.dcgm_service_monitor("30s", {"team": "gpu"})
    plan = gpu_operator_values.derive([], conf, "v26.7.0", PLAYBOOK, scrape=attach)
    assert plan.merged["dcgmExporter"]["serviceMonitor"] == attach
    default = gpu_operator_values.derive([], conf, "v26.7.0", PLAYBOOK)
    assert default.merged["dcgmExporter"]["serviceMonitor"] == render.dcgm_service_monitor(
        "30s", {"release": "kube-prometheus-stack"})
    off = gpu_operator_values.derive([], conf, "v26.7.0", [s for s in PLAYBOOK if s != "monitoring"])
    assert off.merged["dcgmExporter"]["serviceMonitor"]["enabled"] is False
    relabelings = attach["relabelings"]
    assert relabelings[0]["targetLabel"] == "node" and relabelings[1]["action"] == "labeldrop"
    assert attach["honorLabels"] is True


@pytest.mark.parametrize("monitoring, field", [
    ({"mode": "sometimes"}, "monitoring.mode"),
    ({"retention": "15 days"}, "monitoring.retention"),
    ({"storage": {"size": "lots"}}, "monitoring.storage.size"),
    ({"storage": {"size": "10Gi", "storage_class": "Fast Disks"}}, "monitoring.storage.storage_class"),
    ({"prometheus": "just-a-name"}, "monitoring.prometheus"),
    ({"release": "Kube_Prometheus"}, "monitoring.release"),
    ({"scrape_interval": "often"}, "monitoring.scrape_interval"),
    ({"wait_timeout": 1}, "monitoring.wait_timeout"),
    ({"grafana": {"enabld": True}}, "monitoring.grafana.enabld"),
])
def test_bad_monitoring_config_names_the_field(monitoring, field):
    with pytest.raises(ConfigError) as raised:
        cfg.validate({"nodes": [{"name": "a"}], "monitoring": monitoring}, cfg.Source(None, {}))
    assert field in raised.value.message


def test_dashboards_are_sdk_models_with_every_panel_queried():
    boards = dict(gpu_dashboards.dashboards())
    assert set(boards) == {"gpu-bootstrap-overview", "gpu-bootstrap-namespaces", "gpu-bootstrap-pods",
                           "gpu-bootstrap-nodes", "gpu-bootstrap-allocation"}
    for uid, board in boards.items():
        assert board["uid"] == uid and board["schemaVersion"] >= 39
        assert board["templating"]["list"][0]["type"] == "datasource"
        for panel in board["panels"]:
            assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"])
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    variables = [v["name"] for v in boards["gpu-bootstrap-pods"]["templating"]["list"]]
    assert variables == ["datasource", "namespace", "pod"]
    configmaps = render.dashboard_configmaps(render.install_target(config().monitoring, "why"))
    assert [c["metadata"]["labels"]["grafana_dashboard"] for c in configmaps] == ["1"] * 5
    assert json.loads(next(iter(configmaps[0]["data"].values())))["uid"] == "gpu-bootstrap-overview"
