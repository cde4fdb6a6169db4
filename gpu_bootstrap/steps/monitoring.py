"""monitoring: who uses which GPU. Installs kube-prometheus-stack (install mode) or attaches to the Prometheus
Operator the cluster already runs (attach mode, nothing installed, the user's Prometheus never changed), then keeps
our PrometheusRule (GPU alerts) and dashboard ConfigMaps labelled so that Prometheus and Grafana pick them up.

The DCGM exporter's ServiceMonitor is the gpu-operator's: its values come from `dcgm_scrape()` (monitoring_target.py,
where install or attach is decided), which this step's plan shows and the gpu-operator step installs (one source).
The playbook runs this step before gpu-operator, because
the operator creates that ServiceMonitor only when the Prometheus Operator's CRDs exist, and until they do reports
its ClusterPolicy notReady (NVIDIA's controller, tests/test_gpu_operator_real.py); a run without this step where no
CRD is served has the ServiceMonitor off (gpu_operator.service_monitors_come).

Mode `auto` attaches when the cluster runs a Prometheus object gpu-bootstrap did not install, else installs. A
Prometheus object that could not be read is not "none": an API error fails the check instead of choosing a mode.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from gpu_bootstrap.core import versions
from gpu_bootstrap.core.catalogue import registry_inputs
from gpu_bootstrap.adapters import charts
from gpu_bootstrap.core.errors import ClusterError, GpuBootstrapError
from gpu_bootstrap.core.objects import differences, toleration_for
from gpu_bootstrap.pipeline.step import FAIL, PASS, WARN, Change, Check, Ref, Step, Verb, declare
from gpu_bootstrap.security.rbac_rules import (APPLY, CLUSTER, DOCTOR, HELM, READ, RUN, WRITE, chart_needs,
    chart_rbac_needs, need)
from gpu_bootstrap.core.refs import Chart
from gpu_bootstrap.render import monitoring as render
from gpu_bootstrap.render.monitoring import MonitoringProblem
from gpu_bootstrap.steps import monitoring_kubelet as kubelet
from gpu_bootstrap.security import pod_security
from gpu_bootstrap.render.gpu_operator_values import ValuesPlan
from gpu_bootstrap.steps import monitoring_prometheus as prometheus
from gpu_bootstrap.steps.monitoring_prometheus import DCGM_SERVICE, MONITORING_API, crd_exists
from gpu_bootstrap.steps.monitoring_target import decide
from gpu_bootstrap.steps.node_prep import gpu_taint, no_room_warning

RULE_CRD = "prometheusrules.monitoring.coreos.com"
SERVICE_MONITOR_CRD = "servicemonitors.monitoring.coreos.com"
CRD_GROUPS = ("monitoring.coreos.com",)  # the chart's CRDs (its crds subchart)
PRIVILEGED_WHY = "kube-prometheus-stack's node-exporter uses the host's network, PID namespace and files"


# --- the step ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MonitoringFacts:
    target: render.Target
    desired: list  # our objects, in apply order
    drift: dict  # Ref -> "missing" / "differs at ..."
    leftovers: list  # Refs of our objects the config no longer wants
    scrape: dict  # dcgmExporter.serviceMonitor, as the gpu-operator step will install it
    kube_version: str
    chart: Chart | None = None  # install mode
    version: str = ""
    choice: versions.Choice | None = None
    values: ValuesPlan | None = None
    release: dict = field(default_factory=dict)  # up_to_date, reason, installed, pending (install mode)
    namespace: pod_security.NamespaceDecision | None = None  # the stack's namespace, labelled privileged (install mode)
    crds: object = None  # render.crds.CrdPlan: the chart's CRDs to apply before the release (install mode)
    unlooked: str = ""  # where leftovers could not be looked for (this identity may not list there)


class Monitoring(Step):
    id = "monitoring"
    title = "GPU monitoring: Prometheus, the DCGM exporter's metrics, dashboards and alerts"

    def __init__(self):
        self._chart: tuple[Chart, dict | None, versions.Choice] | None = None


    def namespaces(self, ctx) -> list[str]:
        """Its namespace when it installs the stack; attaching, it writes only where the user's Prometheus looks."""
        try:
            return [ctx.config.monitoring.namespace] if decide(ctx).mode == "install" else []
        except MonitoringProblem:
            return []  # the step says why itself

    def inputs(self, ctx) -> dict:
        return {"monitoring": ctx.config.monitoring.model_dump(mode="json"),
                "kube": ".".join(ctx.server_version().split(".")[:2]),
                "operator_namespace": ctx.config.gpu_operator.namespace, "nodes": [n.name for n in ctx.config.nodes],
                **registry_inputs(ctx.config)}

    # --- the chart (install mode) --------------------------------------------------------------------------------------
    def chart(self, ctx) -> tuple[Chart, dict | None, versions.Choice]:
        """kube-prometheus-stack at the version the catalogue's rule picks (or the pinned/local one, checked)."""
        if self._chart is not None:
            return self._chart
        section = ctx.config.monitoring
        catalogue, kube = versions.catalogue("kube-prometheus-stack"), ctx.server_version()
        try:
            if charts.is_local(section.chart):
                meta = charts.local_chart_metadata(section.chart)
                if meta is None:
                    raise MonitoringProblem(f"monitoring.chart {section.chart} is neither a chart directory nor a .tgz")
                local_version = str(meta.get("version", ""))
                if section.version and section.version.lstrip("v") != local_version.lstrip("v"):
                    raise MonitoringProblem(f"monitoring.version {section.version} does not match the local chart "
                                            f"{section.chart} (version {local_version})")
                choice = versions.check_pin(catalogue, local_version, kube, meta.get("kubeVersion"),
                                            section.skip_version_check,
                                            f"the local chart {section.chart} (monitoring.chart)")
                resolved = (Chart(section.chart, None, None), meta, choice)
            else:
                choice = versions.check_pin(catalogue, section.version, kube, None, section.skip_version_check) \
                    if section.version else versions.choose(catalogue, kube, section.skip_version_check)
                resolved = (Chart(section.chart, section.repository, choice.version), None, choice)
        except versions.UnsupportedVersion as error:
            error.step = self.id
            raise
        self._chart = resolved
        return resolved

    # --- check / plan ----------------------------------------------------------------------------------------------------
    def check(self, ctx) -> Check:
        section = ctx.config.monitoring
        try:
            target = decide(ctx)
            facts = self._facts(ctx, target)
        except MonitoringProblem as problem:
            return Check(FAIL, problem.text())
        warnings = list(target.warnings) + ([facts.unlooked] if facts.unlooked else [])
        if facts.choice is not None and facts.choice.warning:
            warnings.append(facts.choice.warning)
        if target.mode == "attach" and not self._has_kube_state_metrics(ctx):
            warnings.append("no kube-state-metrics found (Deployment labelled app.kubernetes.io/name="
                            "kube-state-metrics): the allocation panels and the node and pod alerts need it")
        if target.mode == "attach":
            warnings.append("the 'GPU node advertises no GPUs' alert and the product-label panel need "
                            "kube-state-metrics to export the node labels nvidia.com/gpu.present and "
                            "nvidia.com/gpu.product (--metric-labels-allowlist=nodes=[...])")
        todo = []
        if facts.namespace is not None:
            warnings += [facts.namespace.advice] if facts.namespace.advice else []
            if facts.namespace.action == "label":
                todo.append(f"namespace {section.namespace} needs {pod_security.ENFORCE}=privileged")
        if target.mode == "install" and not facts.release.get("up_to_date"):
            todo.append(f"{section.release} {facts.version}: {facts.release.get('reason')}")
        if facts.crds is not None:
            warnings += facts.crds.kept
            if facts.crds.changes:
                todo.append(f"{len(facts.crds.changes)} CRD(s) to apply before the release")
        if facts.drift or facts.leftovers:
            missing = sum(1 for why in facts.drift.values() if why == "missing")
            counts = [(missing, "to create"), (len(facts.drift) - missing, "to update"),
                      (len(facts.leftovers), "to remove")]
            todo.append(", ".join(f"{n} object(s) {what}" for n, what in counts if n))
        where = f"{target.mode} mode ({target.prometheus})"
        if not todo:
            return Check(PASS, f"{where}: dashboards and alerts in place", done=True, facts=facts, warnings=warnings)
        return Check(WARN, f"{where}: " + "; ".join(todo), facts=facts, warnings=warnings)

    def _facts(self, ctx, target: render.Target) -> MonitoringFacts:
        section = ctx.config.monitoring
        from gpu_bootstrap.render.gpu_alerts import settings_from
        desired = render.objects(target, settings_from(ctx.config))
        rules_served = crd_exists(ctx, RULE_CRD)
        drift = {}
        for obj in desired:
            ref = Ref.of(obj)
            live = None
            if ref.kind != "PrometheusRule" or rules_served:
                live = ctx.kube.get(ref.api_version, ref.kind, ref.name, ref.namespace)
            if live is None:
                drift[ref] = "missing"
            elif paths := differences(obj, live):
                drift[ref] = "differs at " + ", ".join(paths[:3])
        owned, unlooked = self._owned_where_readable(ctx, rules_served, {Ref.of(o).namespace for o in desired})
        leftovers = [ref for ref in owned if ref not in {Ref.of(o) for o in desired}]
        facts = dict(target=target, desired=desired, drift=drift, leftovers=leftovers, unlooked=unlooked,
                     scrape=target.scrape_values(section.scrape_interval), kube_version=ctx.server_version())
        if target.mode == "install":
            chart, meta, choice = self.chart(ctx)
            version = str((meta or {}).get("version") or chart.version or "")
            no_room = no_room_warning(ctx.kube.list("v1", "Node"), ctx.config, ctx.options.playbook)
            plan = render.stack_values(section, toleration_for(gpu_taint(ctx.config, ctx.options.playbook))
                                       if no_room else None, ctx.config.registry)
            release = self._release_state(ctx, chart, version, plan.merged)
            from gpu_bootstrap.core.versions import downgrade_refusal
            if refused := downgrade_refusal(section, "monitoring", release, version):
                raise MonitoringProblem(refused)
            from gpu_bootstrap.pipeline.chart_crds import plan_crds
            facts.update(chart=chart, version=version, choice=choice, values=plan, release=release,
                         namespace=pod_security.decide(section.namespace,
                                                       ctx.kube.get("v1", "Namespace", section.namespace),
                                                       pod_security.PRIVILEGED, PRIVILEGED_WHY,
                                                       "the stack's namespace (install mode)"),
                         crds=plan_crds(ctx, chart, version, release, CRD_GROUPS))
        return MonitoringFacts(**facts)

    def _release_state(self, ctx, chart: Chart, version: str, values: dict) -> dict:
        section = ctx.config.monitoring
        status = ctx.helm.status(section.release, section.namespace)
        if status is None:
            return {"up_to_date": False, "reason": "not installed", "installed": None}
        if not status.get("values_unknown") and not render.installed_by_us(status.get("config")):
            raise MonitoringProblem(f"a helm release {section.namespace}/{section.release} exists that gpu-bootstrap "
                                    f"did not install", "use monitoring.mode: attach to use it as it is, or choose "
                                                        "another monitoring.release / monitoring.namespace")
        deployed = ctx.helm.deployed_chart(section.release, section.namespace, version) or ""
        installed = deployed.rsplit("-", 1)[-1] if "-" in deployed else deployed
        state = (status.get("info") or {}).get("status")
        if state and state.startswith("pending"):
            return {"up_to_date": False, "reason": f"release is {state} (an interrupted helm run)",
                    "installed": installed, "pending": state}
        if state != "deployed":
            return {"up_to_date": False, "reason": f"release is {state}", "installed": installed}
        if installed.lstrip("v") != version.lstrip("v"):
            from gpu_bootstrap.core.versions import version_change
            return version_change(installed, version)
        if status.get("values_unknown"):  # its record is a Secret this identity may not read
            from gpu_bootstrap.render import live_diff
            return live_diff.release_state(ctx.helm.live_differences(section.release, chart, values,
                                                                     section.namespace), installed)
        if (status.get("config") or {}) != values:
            return {"up_to_date": False, "reason": "values changed", "installed": installed}
        return {"up_to_date": True, "reason": "up to date", "installed": installed}

    def _owned_where_readable(self, ctx, rules_served: bool, namespaces: set) -> tuple[list[Ref], str]:
        """Our objects across the cluster; for an identity that may list them only in some namespaces (the plan
        role reads ConfigMaps only where it plans), those namespaces, and what was not looked at (unknown, never
        "none there")."""
        try:
            return self._owned(ctx, rules_served), ""
        except ClusterError as error:
            if error.status != 403:
                raise
        where = sorted(n for n in namespaces if n)
        found = [ref for namespace in where for ref in self._owned(ctx, rules_served, namespace)]
        return found, (f"objects of ours outside {', '.join(where)} (left by an earlier config) were not looked for: "
                       f"this identity may not list ConfigMaps across the cluster")

    def _owned(self, ctx, rules_served: bool, namespace: str | None = None) -> list[Ref]:
        found = [Ref("v1", "ConfigMap", o["metadata"]["name"], o["metadata"].get("namespace"))
                 for o in ctx.kube.list("v1", "ConfigMap", namespace=namespace, label_selector=render.OWNED_SELECTOR)]
        if rules_served:
            found += [Ref(MONITORING_API, "PrometheusRule", o["metadata"]["name"], o["metadata"].get("namespace"))
                      for o in ctx.kube.list(MONITORING_API, "PrometheusRule", namespace=namespace,
                                             label_selector=render.OWNED_SELECTOR)]
        return found

    @staticmethod
    def _has_kube_state_metrics(ctx) -> bool:
        return bool(ctx.kube.list("apps/v1", "Deployment", label_selector="app.kubernetes.io/name=kube-state-metrics"))

    def plan(self, ctx, check: Check) -> list[Change]:
        facts: MonitoringFacts = check.facts
        section = ctx.config.monitoring
        target = facts.target
        changes = []
        if target.mode == "install":
            release = Ref.release(section.release, section.namespace)
            if facts.namespace is not None and (parts := facts.namespace.change()):
                changes.append(Change(Verb.APPLY, Ref("v1", "Namespace", section.namespace), *parts))
            if facts.release.get("pending"):
                changes.append(Change(Verb.HELM_RECOVER, release, f"clear the {facts.release['pending']} state",
                                      "a helm run was interrupted; helm refuses new operations until it is cleared",
                                      {"release": section.release, "namespace": section.namespace,
                                       "timeout": f"{section.wait_timeout}s"}))
            from gpu_bootstrap.pipeline.chart_crds import crd_changes
            changes += crd_changes(facts.crds, f"kube-prometheus-stack {facts.version}")
            if not facts.release.get("up_to_date"):
                plan = facts.values
                action = "install" if facts.release.get("installed") is None else facts.release["reason"]
                choice = facts.choice
                shown = f"{choice.release.label} ({facts.version})" if choice and choice.release else facts.version
                details = (target.reason, *render.explain(plan))
                body = {"release": section.release, "namespace": section.namespace,
                        "chart": {"ref": facts.chart.ref, "repo": facts.chart.repo, "version": facts.chart.version},
                        "chart_version": facts.version, "values": plan.merged, "derived": render.explain(plan),
                        "warnings": [], "kube_version": facts.kube_version, "timeout": f"{section.wait_timeout}s"}
                changes.append(Change(Verb.HELM_UPGRADE, release, f"{action}: kube-prometheus-stack {shown}",
                                      choice.reason if choice else "", body, details=details))
        for obj in facts.desired:
            ref = Ref.of(obj)
            why = facts.drift.get(ref)
            if why:
                # the mode's reason once: on the release (install mode), else on the rule (attach mode); the DCGM
                # exporter's ServiceMonitor values are the gpu-operator step's, which shows them
                details = (target.reason, *target.found) if ref.kind == "PrometheusRule" and \
                    target.mode != "install" else ()
                changes.append(Change(Verb.APPLY, ref, "create" if why == "missing" else "update",
                                      f"{why}; labelled for {target.mode} mode ({target.prometheus})", obj,
                                      details=details))
        for ref in facts.leftovers:
            changes.append(Change(Verb.DELETE, ref, "remove", "no longer wanted by the config"))
        return changes

    # --- verify / doctor --------------------------------------------------------------------------------------------------
    def verify(self, ctx) -> Check:
        section = ctx.config.monitoring
        deadline = time.monotonic() + section.wait_timeout
        last_note = 0.0
        blocked = 0  # answers in a row saying the service-proxy route fails while Prometheus' endpoints are ready
        while True:
            state = self.health(ctx)
            blocked = blocked + 1 if isinstance(state.facts, prometheus.RouteBlocked) else 0
            if blocked >= prometheus.ROUTE_CONFIRMATIONS:  # a private control plane: do not wait out the timeout on it
                ctx.reporter.warn(f"{self.id}: {state.facts.warning}")
                return Check(PASS, f"{state.facts.verified}; not verified: {state.facts.warning}", done=True)
            if state.status == PASS or time.monotonic() >= deadline:
                break
            if time.monotonic() - last_note > 10:
                ctx.reporter.note(f"waiting for monitoring: {state.message}")
                last_note = time.monotonic()
            time.sleep(min(2.0, max(deadline - time.monotonic(), 0.1)))
        if state.status != PASS:
            return Check(FAIL, f"not ready after {section.wait_timeout}s: {state.message}")
        return Check(PASS, state.message, done=True)

    def health(self, ctx) -> Check:
        """The stack's workloads ready (install mode), Prometheus answering through the API server's service proxy,
        and, once the gpu-operator runs its DCGM exporter, a healthy DCGM target on every GPU node."""
        target = decide(ctx)
        if target.mode == "install":
            if problems := prometheus.workload_problems(ctx):
                return Check(WARN, "; ".join(problems[:4]))
        proxy = None
        try:
            proxy = prometheus.prometheus_proxy(ctx, target)
            if isinstance(proxy, str):
                return Check(WARN, proxy)
            answer = prometheus.query(ctx, proxy, f'up{{job="{render.DCGM_JOB}"}}')
        except ClusterError as error:
            message = f"Prometheus does not answer through the API server's service proxy yet: {error.message}"
            return Check(WARN, message, facts=prometheus.route_blocked(ctx, target, proxy, error))
        if ctx.kube.get("v1", "Service", DCGM_SERVICE, ctx.config.gpu_operator.namespace) is None:
            return Check(PASS, f"{target.mode} mode ({target.prometheus}): Prometheus answers; dashboards and "
                               f"alerts in place; the DCGM exporter is not deployed yet (the gpu-operator step "
                               f"deploys it; doctor then checks its targets)", done=True)
        missing = prometheus.missing_targets(ctx, answer)
        if missing:
            return Check(WARN, f"no healthy DCGM exporter target in Prometheus for {', '.join(missing)}")
        return Check(PASS, f"{target.mode} mode ({target.prometheus}): DCGM exporter scraped on "
                           f"{len(ctx.config.nodes)} GPU node(s); dashboards and alerts in place", done=True)

    def doctor(self, ctx) -> list[Check]:
        try:
            check = self.check(ctx)
        except GpuBootstrapError as error:  # a refused version, no helm, an unreadable Prometheus: one failed check
            return [Check(FAIL, error.one_line().removeprefix(f"[{self.id}] "))]
        if check.status == FAIL:
            return [check]
        return [check, prometheus.scrape_report(ctx, check.facts.target)]

    # --- undo ---------------------------------------------------------------------------------------------------------------
    def made_while_running(self, ctx) -> list[dict]:
        return kubelet.made_while_running(ctx)

    def undo_plan(self, ctx) -> list[Change]:
        section = ctx.config.monitoring
        rules_served = crd_exists(ctx, RULE_CRD)
        changes = [Change(Verb.DELETE, ref, "remove", "teardown: made by gpu-bootstrap's monitoring step")
                   for ref in self._owned(ctx, rules_served)]
        status = ctx.helm.status(section.release, section.namespace)
        if status is not None and render.installed_by_us(status.get("config")):
            changes.append(Change(Verb.HELM_UNINSTALL, Ref.release(section.release, section.namespace),
                                  f"uninstall {section.release}", "teardown: gpu-bootstrap installed it",
                                  {"release": section.release, "namespace": section.namespace,
                                   "timeout": f"{section.wait_timeout}s"}))
            changes += kubelet.removal(ctx)
            if ctx.options.purge_crds:  # the chart's CRDs are the Prometheus Operator's, group monitoring.coreos.com
                for crd in ctx.kube.list("apiextensions.k8s.io/v1", "CustomResourceDefinition"):
                    if (crd.get("spec") or {}).get("group") == "monitoring.coreos.com":
                        changes.append(Change(Verb.DELETE, Ref("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                                                               crd["metadata"]["name"]),
                                              "delete the CRD and every object of it",
                                              "--purge-crds (gpu-bootstrap installed the stack that brought it)"))
        if section.mode != "attach" and pod_security.ownership(ctx.kube.get("v1", "Namespace", section.namespace)) == "ours":
            changes.append(Change(Verb.DELETE, Ref("v1", "Namespace", section.namespace), "remove",
                                  "the namespace gpu-bootstrap created for the stack"))
        return changes


def rbac_needs(config) -> dict:
    install = config.monitoring.mode in ("install", "auto")  # auto installs when there is no Prometheus
    attach_scope = "monitoring" if config.monitoring.mode == "install" else CLUSTER  # attach: the user's Prometheus
    return {
        READ: [need("apiextensions.k8s.io", "customresourcedefinitions", "get list"),
               need("monitoring.coreos.com", "prometheuses prometheusrules", "get list"),
               need("apps", "deployments statefulsets", "list"), need("", "configmaps", "list"),
               need("", "configmaps", "get", attach_scope), need("", "pods", "list", "monitoring"),
               need("monitoring.coreos.com", "prometheusrules", "get", attach_scope),
               *(chart_needs("monitoring", "monitoring", ("get", "list")) if install else [])],
        WRITE: [need("", "configmaps", APPLY, attach_scope),
                need("monitoring.coreos.com", "prometheusrules", APPLY, attach_scope),
                *([need("", "namespaces", APPLY)] + chart_needs("monitoring", "monitoring", APPLY)
                  + chart_rbac_needs("monitoring", config.monitoring.release, "monitoring") if install else [])],
        RUN: [*(chart_needs("monitoring", "monitoring", HELM) if install else []),
              need("", "configmaps", "delete", attach_scope),
              need("monitoring.coreos.com", "prometheusrules", "delete", attach_scope),
              need("apps", "daemonsets deployments statefulsets replicasets", "list", "monitoring"),
              need("", "pods", "list", "monitoring"), need("", "services", "list"),
              need("", "services/proxy", "get"), need("", "services", "get", "operator"),
              need("discovery.k8s.io", "endpointslices", "list")],
        DOCTOR: [need("", "services", "list"), need("", "services/proxy", "get"), need("", "pods", "list"),
                 need("", "services", "get", "operator"),
                 need("apps", "deployments daemonsets statefulsets", "list", "monitoring")]}


DECLARATION = declare(
    Monitoring, section="monitoring", enabled=lambda config: config.monitoring.enabled, needs=rbac_needs,
    summary="who uses which GPU: installs kube-prometheus-stack (or attaches to the Prometheus Operator you run), has "
            "the DCGM exporter scraped with pod and node labels, adds GPU dashboards and alerts; runs before "
            "`gpu-operator`, which creates the DCGM ServiceMonitor only when Prometheus' CRDs exist")
