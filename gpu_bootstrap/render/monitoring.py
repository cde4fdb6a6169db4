"""The monitoring step's pure parts: the DCGM exporter's ServiceMonitor values (one source for the gpu-operator's
values and the monitoring plan), kube-prometheus-stack's values in three layers, label selectors (what a Prometheus
selects, and labels that satisfy it), attach-mode targeting from the Prometheus object and Grafana sidecars read,
and the objects we create: the PrometheusRule and the dashboard ConfigMaps.

Pure: objects and config in, values and manifests out. The step (steps/monitoring.py) does the reading.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import yaml

from gpu_bootstrap.core import catalogue as images
from gpu_bootstrap.core.objects import deep_merge
from gpu_bootstrap.core.paths import data_path
from gpu_bootstrap.render.values import Derived, ValuesPlan, set_path

MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-bootstrap"}
PART_OF = {**MANAGED_BY, "app.kubernetes.io/part-of": "gpu-bootstrap-monitoring"}
DCGM_JOB = "nvidia-dcgm-exporter"  # the operator's ServiceMonitor has jobLabel: app, and app=nvidia-dcgm-exporter
RULE_NAME = "gpu-bootstrap-gpu-alerts"
OWNED_SELECTOR = "app.kubernetes.io/managed-by=gpu-bootstrap,app.kubernetes.io/part-of=gpu-bootstrap-monitoring"
DEFAULT_DASHBOARD_LABEL = ("grafana_dashboard", "1")  # kube-prometheus-stack's Grafana sidecar default
# Target relabelings for the operator's DCGM ServiceMonitor (its CRD takes no metricRelabelings):
# 1. `node` on every series, from the node the exporter pod runs on. Target relabelings cannot read the exporter's
#    own `Hostname` label (renamed `hostname` on dcgm-exporter HEAD); the pod's node is the same name under either.
# 2. Drop the target's own namespace/pod/container (the exporter's pod): with honorLabels: true, Prometheus fills a
#    label the sample lacks from the target, so a GPU no pod holds would otherwise look held by the exporter pod.
RELABELINGS = (
    {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"},
    {"regex": "^(namespace|pod|container)$", "action": "labeldrop"},
)


# --- the DCGM exporter's ServiceMonitor: one source --------------------------------------------------------------------
def dcgm_service_monitor(interval: str, labels: dict[str, str]) -> dict:
    """`dcgmExporter.serviceMonitor` for the gpu-operator: scraped at `interval`, labelled so that the Prometheus
    selects it, with the exporter's own namespace/pod/container labels kept (honorLabels: true, else they arrive as
    exported_namespace/exported_pod: dcgm-exporter#85) and a `node` label on every series."""
    return {"enabled": True, "interval": interval, "honorLabels": True,
            "additionalLabels": dict(sorted(labels.items())), "relabelings": [dict(r) for r in RELABELINGS]}


class MonitoringProblem(Exception):
    """The config and the cluster rule out a working setup; message says why, hint what to do."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def text(self) -> str:
        return f"{self.message} — {self.hint}" if self.hint else self.message


def kubelet_service_of(deployments: list[dict]) -> tuple[str, str] | None:
    """(namespace, name) from the --kubelet-service=NS/NAME argument of the operator among `deployments`."""
    for deployment in deployments:
        for container in (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
                "containers") or []:
            for arg in [*(container.get("args") or []), *(container.get("command") or [])]:
                if arg.startswith("--kubelet-service="):
                    namespace, _, name = arg.split("=", 1)[1].partition("/")
                    if namespace and name:
                        return namespace, name
    return None


# --- label selectors -----------------------------------------------------------------------------------------------------
class SelectorProblem(Exception):
    """No labels can satisfy a selector (or it selects nothing at all)."""


def matches(selector: dict | None, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics. None selects nothing; {} selects everything."""
    if selector is None:
        return False
    labels = labels or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, op, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def satisfying_labels(selector: dict | None, what: str) -> dict[str, str]:
    """The fewest labels an object needs for `selector` to select it; SelectorProblem when none can."""
    if selector is None:
        raise SelectorProblem(f"{what} is null, which selects nothing")
    labels = dict(selector.get("matchLabels") or {})
    for expression in selector.get("matchExpressions") or []:
        key, op, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        if op == "In":
            if key in labels and labels[key] not in values:
                raise SelectorProblem(f"{what} wants {key} to be {labels[key]} and one of {values}")
            labels.setdefault(key, values[0] if values else "")
        elif op == "Exists":
            labels.setdefault(key, "gpu-bootstrap")
    if not matches(selector, labels):
        raise SelectorProblem(f"{what} {json.dumps(selector, sort_keys=True)} cannot be satisfied by any labels")
    return labels


def describe_selector(selector: dict | None) -> str:
    if selector is None:
        return "null (nothing)"
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        return "{} (everything)"
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for e in selector.get("matchExpressions") or []:
        parts.append(f"{e.get('key')} {e.get('operator')} {','.join(e.get('values') or [])}".rstrip())
    return ", ".join(parts)


# --- where our objects go and how they are labelled ----------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    mode: str  # install | attach
    reason: str  # why this mode, for the plan
    namespace: str  # where the PrometheusRule and the dashboards go
    rule_labels: dict = field(default_factory=dict)
    service_monitor_labels: dict = field(default_factory=dict)  # the DCGM ServiceMonitor's additionalLabels
    dashboard_namespace: str = ""
    dashboard_label: tuple[str, str] = DEFAULT_DASHBOARD_LABEL
    prometheus: str = ""  # namespace/name of the Prometheus object (attach), or the one the chart creates (install)
    found: tuple[str, ...] = ()  # what was found and matched, one line each (attach)
    warnings: tuple[str, ...] = ()

    def scrape_values(self, interval: str) -> dict:
        return dcgm_service_monitor(interval, self.service_monitor_labels)


def install_target(section, reason: str) -> Target:
    """Install mode: our stack selects ServiceMonitors and rules from every namespace (base values), so labels are
    only belt and braces: `release: <release>` is what the chart's own default selector would want."""
    labels = {"release": section.release}
    return Target("install", reason, section.namespace, labels, labels, section.namespace,
                  DEFAULT_DASHBOARD_LABEL, f"{section.namespace}/{section.release}-prometheus")


class AttachProblem(Exception):
    """Attach mode cannot work with what was found: `message` says why, `hint` what to do."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint


def choose_prometheus(section, theirs: list[dict], found: list[dict] | None, crd: str) -> dict:
    """The Prometheus to attach to among the cluster's (`theirs`: not ours; `found` None: `crd` not served)."""
    if section.prometheus:
        namespace, _, name = section.prometheus.partition("/")
        for prometheus in theirs:
            if (prometheus["metadata"].get("namespace"), prometheus["metadata"]["name"]) == (namespace, name):
                return prometheus
        raise AttachProblem(f"monitoring.prometheus {section.prometheus}: no such Prometheus object",
                            f"found: {_names(theirs) or 'none'}")
    if not theirs:
        where = f"{crd} is not served" if found is None else "no Prometheus object exists"
        raise AttachProblem(f"monitoring.mode: attach, but there is no Prometheus to attach to ({where}; a plan made "
                            f"with no cluster to read sees a fresh one)",
                            "plan attach mode against the cluster (up --dry-run), or use monitoring.mode: install")
    if len(theirs) > 1:
        raise AttachProblem(f"the cluster runs {len(theirs)} Prometheus objects ({_names(theirs)})",
                            "name the one to attach to in monitoring.prometheus: <namespace>/<name>")
    return theirs[0]


def _names(objects: list[dict]) -> str:
    return ", ".join(f"{o['metadata'].get('namespace')}/{o['metadata']['name']}" for o in objects)


def attach_target(prometheus: dict, namespaces: dict[str, dict], sidecars: list[dict], operator_namespace: str,
                  reason: str) -> Target:
    """Attach mode: label our objects so that `prometheus` (a monitoring.coreos.com/v1 Prometheus, as read) selects
    them, and put them where it looks. `namespaces`: name -> labels of the namespaces involved (the operator's
    namespace may not exist yet: helm creates it with only kubernetes.io/metadata.name). `sidecars`: the Grafana
    dashboard sidecars found (see grafana_sidecars). Never changes the Prometheus object."""
    meta, spec = prometheus["metadata"], prometheus.get("spec") or {}
    own = meta.get("namespace", "default")
    name = f"{own}/{meta['name']}"
    found = [f"Prometheus {name}"]
    try:
        sm_labels = satisfying_labels(spec.get("serviceMonitorSelector"), f"{name} serviceMonitorSelector")
        rule_labels = satisfying_labels(spec.get("ruleSelector"), f"{name} ruleSelector")
    except SelectorProblem as problem:
        raise AttachProblem(f"{problem}: it would ignore the DCGM ServiceMonitor or our alerts",
                            f"set the selector on your Prometheus (e.g. {{}} for all), or use monitoring.mode: "
                            f"install") from None
    found.append(f"serviceMonitorSelector {describe_selector(spec.get('serviceMonitorSelector'))} → the DCGM "
                 f"ServiceMonitor gets {_labels_text(sm_labels)}")
    found.append(f"ruleSelector {describe_selector(spec.get('ruleSelector'))} → our PrometheusRule gets "
                 f"{_labels_text(rule_labels)}")
    operator_labels = namespaces.get(operator_namespace) or {"kubernetes.io/metadata.name": operator_namespace}
    sm_ns = spec.get("serviceMonitorNamespaceSelector")
    if not _namespace_selected(sm_ns, operator_namespace, operator_labels, own):
        raise AttachProblem(f"{name} looks for ServiceMonitors only in {_namespaces_text(sm_ns, own)}, not in "
                            f"{operator_namespace} where the gpu-operator creates the DCGM ServiceMonitor",
                            f"widen its serviceMonitorNamespaceSelector (or label namespace {operator_namespace} to "
                            f"match it), or use monitoring.mode: install")
    found.append(f"serviceMonitorNamespaceSelector {_namespaces_text(sm_ns, own)} includes {operator_namespace}")
    rule_ns = spec.get("ruleNamespaceSelector")
    if not _namespace_selected(rule_ns, own, namespaces.get(own) or {}, own):
        raise AttachProblem(f"{name} does not look for PrometheusRules in its own namespace {own} "
                            f"(ruleNamespaceSelector {describe_selector(rule_ns)})",
                            "label that namespace to match, or widen the selector")
    found.append(f"ruleNamespaceSelector {_namespaces_text(rule_ns, own)}: our PrometheusRule goes to {own}")
    warnings = []
    if sidecars:
        sidecar = sidecars[0]
        label = (sidecar["label"], sidecar["value"] or "1")
        watched = sidecar["namespaces"]
        dashboard_namespace = own if watched == ["ALL"] or own in watched else watched[0]
        found.append(f"Grafana dashboard sidecar in {sidecar['where']}: ConfigMaps labelled "
                     f"{label[0]}={label[1]} in {'all namespaces' if watched == ['ALL'] else ', '.join(watched)} → "
                     f"our dashboards go to {dashboard_namespace}")
    else:
        label, dashboard_namespace = DEFAULT_DASHBOARD_LABEL, own
        warnings.append(f"no Grafana with a dashboard sidecar found: the dashboards are written as ConfigMaps "
                        f"labelled {label[0]}={label[1]} in {own}; import their JSON into your Grafana by hand")
    return Target("attach", reason, own, rule_labels, sm_labels, dashboard_namespace, label, name, tuple(found),
                  tuple(warnings))


def _namespace_selected(selector: dict | None, namespace: str, labels: dict, own: str) -> bool:
    if selector is None:  # the Prometheus Operator: a null namespace selector means its own namespace only
        return namespace == own
    labels = {"kubernetes.io/metadata.name": namespace, **(labels or {})}
    return matches(selector, labels)


def _namespaces_text(selector: dict | None, own: str) -> str:
    if selector is None:
        return f"its own namespace {own} (selector null)"
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        return "all namespaces"
    return f"namespaces matching {describe_selector(selector)}"


def _labels_text(labels: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "no labels (it selects everything)"


def grafana_sidecars(deployments: list[dict]) -> list[dict]:
    """Grafana dashboard sidecars (kiwigrid k8s-sidecar, as in the grafana chart) among Deployments and StatefulSets:
    [{where, label, value, namespaces}], namespaces ['ALL'] or the list it watches (default: its own)."""
    out = []
    for obj in deployments:
        for container in ((obj.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []:
            env = {e.get("name"): e.get("value") for e in container.get("env") or [] if isinstance(e, dict)}
            folder = str(env.get("FOLDER") or "")
            if "LABEL" not in env or not ("dashboard" in container.get("name", "") or "dashboard" in folder):
                continue
            if "k8s-sidecar" not in str(container.get("image", "")) and "sc-dashboard" not in container.get("name", ""):
                continue
            namespace = obj["metadata"].get("namespace", "default")
            watched = [n.strip() for n in str(env.get("NAMESPACE") or namespace).split(",") if n.strip()]
            out.append({"where": f"{obj.get('kind', 'Deployment')} {namespace}/{obj['metadata']['name']}",
                        "label": env["LABEL"], "value": env.get("LABEL_VALUE") or "",
                        "namespaces": ["ALL"] if [w.upper() for w in watched] == ["ALL"] else watched})
    return sorted(out, key=lambda s: s["where"])


# --- kube-prometheus-stack values: base, derived, yours ------------------------------------------------------------------
# gpuBootstrap.installedBy: a value only gpu-bootstrap sets (stack_values derives it): helm keeps it with the release
# from its first (even unfinished) install, so a release carrying it is one gpu-bootstrap installed. teardown
# uninstalls the stack only then, and `mode: auto` keeps managing it instead of attaching to its Prometheus.
def installed_by_us(user_values: dict | None) -> bool:
    """Do a release's user-supplied values carry our marker?"""
    return ((user_values or {}).get("gpuBootstrap") or {}).get("installedBy") == "gpu-bootstrap"


def base_values() -> dict:
    return yaml.safe_load(data_path("values", "kube-prometheus-stack.yaml").read_text()) or {}


# kube-prometheus-stack's pods that must find a node (node-exporter already tolerates every taint)
TOLERATING = ("prometheusOperator.tolerations", "prometheusOperator.admissionWebhooks.patch.tolerations",
              "prometheus.prometheusSpec.tolerations", "alertmanager.alertmanagerSpec.tolerations",
              "grafana.tolerations", "kube-state-metrics.tolerations")


def stack_values(section, no_room_toleration: dict | None = None, registry=None) -> ValuesPlan:
    """`no_room_toleration`: when tainting the GPU nodes leaves no other node, the toleration the stack's own pods
    need to run at all (the same rule as the gpu-operator's control plane). `registry`: the registry section
    (registry.mirror moves every image of the stack there)."""
    base = base_values()
    derived = [Derived("prometheus.prometheusSpec.retention", section.retention, "monitoring.retention")]
    if no_room_toleration is not None:
        why = (f"no node stays untainted, schedulable and Ready once the GPU nodes carry the "
               f"{no_room_toleration['key']} taint: the stack's pods must tolerate it")
        derived += [Derived(path, [dict(no_room_toleration)], why) for path in TOLERATING]
    if section.storage is not None:
        claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": section.storage.size}}}
        if section.storage.storage_class:
            claim["storageClassName"] = section.storage.storage_class
        derived.append(Derived("prometheus.prometheusSpec.storageSpec", {"volumeClaimTemplate": {"spec": claim}},
                               f"monitoring.storage: a {section.storage.size} claim"
                               + (f" of class {section.storage.storage_class}" if section.storage.storage_class
                                  else " of the default StorageClass")))
    derived.append(Derived("grafana.enabled", section.grafana.enabled, "monitoring.grafana.enabled"))
    derived += [Derived(path, value, why) for path, value, why in images.stack_values(registry)]
    derived.append(Derived("gpuBootstrap.installedBy", "gpu-bootstrap", "marks the release as installed by "
                                                                         "gpu-bootstrap (teardown uninstalls only such "
                                                                         "a release)"))
    tree: dict = {}
    for item in derived:
        set_path(tree, item.path, item.value)
    merged = deep_merge(deep_merge(base, tree), section.values)
    return ValuesPlan(base, derived, dict(section.values), merged)


def explain(plan: ValuesPlan) -> list[str]:
    return [line.replace("your gpu_operator.values", "your monitoring.values") for line in plan.explain()]


# --- our objects ---------------------------------------------------------------------------------------------------------
def prometheus_rule(target: Target, alerts=None) -> dict:
    """`alerts`: gpu_alerts.AlertSettings from the config (None: the defaults)."""
    from gpu_bootstrap.render.gpu_alerts import AlertSettings, groups
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": RULE_NAME, "namespace": target.namespace,
                         "labels": {**target.rule_labels, **PART_OF}},
            "spec": {"groups": groups(alerts or AlertSettings())}}


def dashboard_configmaps(target: Target) -> list[dict]:
    from gpu_bootstrap.render.gpu_dashboards import dashboards
    key, value = target.dashboard_label
    out = []
    for uid, board in dashboards():
        out.append({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": f"gpu-bootstrap-dashboard-{uid.removeprefix('gpu-bootstrap-')}",
                                 "namespace": target.dashboard_namespace,
                                 "labels": {key: value, **PART_OF},
                                 "annotations": {"grafana_folder": "GPU"}},
                    "data": {f"{uid}.json": json.dumps(board, sort_keys=True, indent=1)}})
    return out


def objects(target: Target, alerts=None) -> list[dict]:
    """Everything we own besides the helm release, in apply order."""
    return [prometheus_rule(target, alerts), *dashboard_configmaps(target)]


__all__ = ["attach_target", "AttachProblem", "dashboard_configmaps", "dcgm_service_monitor", "describe_selector",
           "explain", "grafana_sidecars", "install_target", "installed_by_us", "kubelet_service_of", "matches",
           "MonitoringProblem", "objects", "prometheus_rule", "satisfying_labels", "SelectorProblem", "stack_values",
           "Target"]
