"""The monitoring step's first question, read-only: install kube-prometheus-stack or attach to the Prometheus
Operator the cluster runs, where our objects go and how they are labelled. The gpu-operator step asks the same
question (dcgm_scrape: the DCGM exporter's ServiceMonitor values)."""
from __future__ import annotations

from gpu_bootstrap.render import monitoring as render
from gpu_bootstrap.render.monitoring import MonitoringProblem
from gpu_bootstrap.steps.monitoring_prometheus import MONITORING_API, PROMETHEUS_CRD, crd_exists

__all__ = ["dcgm_scrape", "decide", "ours"]


def ours(ctx, prometheus: dict) -> bool:
    """Is this Prometheus object part of the kube-prometheus-stack release gpu-bootstrap installed?"""
    section = ctx.config.monitoring
    meta = prometheus["metadata"]
    if meta.get("namespace") != section.namespace or (meta.get("labels") or {}).get("release") != section.release:
        return False
    status = ctx.helm.status(section.release, section.namespace)
    if status is not None and status.get("values_unknown"):
        return True  # its record (a Secret, with our marker in it) is unreadable here: ours by its name and labels
    return status is not None and render.installed_by_us(status.get("config"))


def decide(ctx) -> render.Target:
    """Install or attach, where our objects go and how they are labelled. Raises MonitoringProblem when attach mode
    cannot work, and lets API errors through: a Prometheus we could not read is not an absent one."""
    section = ctx.config.monitoring
    if section.mode == "install":
        return render.install_target(section, "monitoring.mode: install")
    found = ctx.kube.list(MONITORING_API, "Prometheus") if crd_exists(ctx, PROMETHEUS_CRD) else None
    theirs = [p for p in found or [] if not ours(ctx, p)]
    if section.mode == "auto" and not theirs:
        if found is None:
            why = f"no Prometheus Operator in the cluster ({PROMETHEUS_CRD} not served; a plan made with no cluster to " \
                  f"read sees a fresh one, so it plans install mode — set monitoring.mode: attach to plan for your own)"
        elif found:
            why = f"the only Prometheus is the one gpu-bootstrap installed ({section.namespace}/{section.release})"
        else:
            why = "the Prometheus Operator's CRDs exist but there is no Prometheus object"
        return render.install_target(section, f"monitoring.mode: auto: {why}")
    try:
        chosen = render.choose_prometheus(section, theirs, found, PROMETHEUS_CRD)
    except render.AttachProblem as problem:
        raise MonitoringProblem(problem.message, problem.hint) from None
    name = f"{chosen['metadata'].get('namespace')}/{chosen['metadata']['name']}"
    reason = ("monitoring.mode: attach" if section.mode == "attach" else "monitoring.mode: auto: the cluster runs "
              "the Prometheus Operator") + f"; attaching to Prometheus {name} (it is not changed)"
    operator_ns = ctx.config.gpu_operator.namespace
    namespaces = {}
    for namespace in {operator_ns, chosen["metadata"].get("namespace", "default")}:
        live = ctx.kube.get("v1", "Namespace", namespace)
        if live is not None:
            namespaces[namespace] = (live.get("metadata") or {}).get("labels") or {}
    workloads = ctx.kube.list("apps/v1", "Deployment") + ctx.kube.list("apps/v1", "StatefulSet")
    try:
        return render.attach_target(chosen, namespaces, render.grafana_sidecars(workloads), operator_ns, reason)
    except render.AttachProblem as problem:
        raise MonitoringProblem(problem.message, problem.hint) from None


def dcgm_scrape(ctx) -> dict | None:
    """The gpu-operator's `dcgmExporter.serviceMonitor` values when this playbook monitors the cluster, else None.
    The one source for those values: the monitoring plan shows them, the gpu-operator step installs them."""
    section = ctx.config.monitoring
    if "monitoring" not in ctx.options.playbook or not section.enabled:
        return None
    return decide(ctx).scrape_values(section.scrape_interval)
