"""gpu-operator: install or upgrade the NVIDIA gpu-operator with values derived from the nodes' facts, then wait
until its operands run on every GPU node and the nodes advertise their GPUs. The release is only upgraded when the
chart version, the values or the rendered manifest differ from what is deployed (a re-run with nothing new makes no
helm upgrade at all)."""
from __future__ import annotations

import time
from dataclasses import dataclass

from gpu_bootstrap.core import versions
from gpu_bootstrap.core.versions import downgrade_refusal
from gpu_bootstrap.core.catalogue import registry_inputs
from gpu_bootstrap.adapters import charts
from gpu_bootstrap.core.objects import pin_resource_version
from gpu_bootstrap.pipeline.step import FAIL, PASS, WARN, Change, Check, Ref, Step, Verb, declare
from gpu_bootstrap.security.rbac_rules import APPLY, DOCTOR, HELM, READ, RUN, WRITE, chart_needs, chart_rbac_needs, need
from gpu_bootstrap.core.refs import Chart
from gpu_bootstrap.render import dra_driver as dra_render
from gpu_bootstrap.render import gpu_operator_values as values_render
from gpu_bootstrap.render import node_prep as labels_render
from gpu_bootstrap.security import pod_security
from gpu_bootstrap.steps import gpu_operator_dra as dra_release
from gpu_bootstrap.steps.gpu_operator_release import release_state
from gpu_bootstrap.steps.gpu_operator_health import (UPGRADE_STATE, driver_upgrade_problems, gpu_resources,
                                                     operand_problems)
from gpu_bootstrap.steps.node_prep import no_room_warning
from gpu_bootstrap.steps.preflight import facts_digest

LABELS_ANNOTATION = "gpu-bootstrap.io/gpu-operator"
BEFORE_ANNOTATION = "gpu-bootstrap.io/labels-before-gpu-operator"  # operator/NFD labels a node had before it
# ... and the operator's own node annotations (nvidia.com/gpu-driver-upgrade-enabled: NVIDIA's controller sets it on
# every GPU node; seen on the real controller, tests/test_gpu_operator_real.py)
ANNOTATIONS_BEFORE = "gpu-bootstrap.io/annotations-before-gpu-operator"
MANAGED = {"app.kubernetes.io/managed-by": "gpu-bootstrap"}  # on the release's metadata and on its namespace
MANAGED_SELECTOR = "app.kubernetes.io/managed-by=gpu-bootstrap"
PRIVILEGED_WHY = "the operator's driver, container-toolkit, device-plugin and DCGM pods use the host (NVIDIA's advice)"
CRD_GROUPS = ("nvidia.com", "resource.nvidia.com", "nfd.k8s-sigs.io")  # the chart's CRDs (and NFD's)


@dataclass(frozen=True)
class OperatorFacts:
    chart: Chart
    version: str
    values: values_render.ValuesPlan
    nodes: dict  # configured node name -> the Node as read (None: not in the cluster)
    labels: dict  # node name -> the label patch the operator's values need there
    release: dict  # the deployed release compared with ours: up_to_date, reason, installed, pending
    kube_version: str
    choice: versions.Choice  # the release line and the rule that chose it
    namespace: str = "ours"  # the release's namespace: missing (we create it, labelled ours), ours, or theirs
    crds: object = None  # render.crds.CrdPlan: the chart's CRDs to apply before the release
    namespace_plan: pod_security.NamespaceDecision | None = None  # its Pod Security label (privileged)
    dra: object = None  # gpu_operator_dra.DraFacts with allocation: dra
    exporter: tuple = ()  # ours beside the DRA driver to apply (or remove): gpu_operator_dra.owned_changes
    remove_dra: bool = False  # a move back to the device plugin: our DRA driver goes first


class GpuOperator(Step):
    id = "gpu-operator"
    title = "Install the NVIDIA gpu-operator"


    def namespaces(self, ctx) -> list[str]:  # a release adopted (gpu_operator.adopt) brings its namespace along
        s = ctx.config.gpu_operator
        return ([] if s.adopt else [s.namespace]) + ([s.dra_driver.namespace] if s.allocation == "dra" else [])

    def __init__(self):
        self._chart: tuple[Chart, dict | None] | None = None  # read once per run
        self._choice: versions.Choice | None = None
        self._values: values_render.ValuesPlan | None = None
        self._service_monitors: bool | None = None  # service_monitors_come, read once per run

    # --- what to install -----------------------------------------------------------------------------------------
    def chart(self, ctx) -> tuple[Chart, dict | None]:
        """The chart to install (version resolved) and its Chart.yaml when it is local. The version follows the
        catalogue's rule (versions.choose / check_pin); a release that does not fit the cluster's Kubernetes is
        refused here with versions.UnsupportedVersion (bad input: exit 2), before anything is written."""
        if self._chart is not None:
            return self._chart
        section = ctx.config.gpu_operator
        catalogue, kube = versions.catalogue("gpu-operator"), ctx.server_version()
        skip = section.skip_version_check
        try:
            if charts.is_local(section.chart):
                meta = charts.local_chart_metadata(section.chart)
                if meta is None:
                    raise ChartProblem(f"gpu_operator.chart {section.chart} is neither a chart directory nor a .tgz")
                if section.version and section.version.lstrip("v") != str(meta.get("version", "")).lstrip("v"):
                    raise ChartProblem(f"gpu_operator.version {section.version} does not match the local chart "
                                       f"{section.chart} (version {meta.get('version')})")
                choice = versions.check_pin(catalogue, str(meta.get("version", "")), kube, meta.get("kubeVersion"),
                                            skip, f"the local chart {section.chart} (gpu_operator.chart)")
                resolved = (Chart(section.chart, None, None), meta)
            else:
                choice = versions.check_pin(catalogue, section.version, kube, None, skip) if section.version else \
                    versions.choose(catalogue, kube, skip)
                resolved = (Chart(section.chart, section.repository, choice.version), None)
        except versions.UnsupportedVersion as error:
            error.step = self.id
            raise
        self._choice = choice
        self._chart = resolved
        return resolved

    @staticmethod
    def version_of(chart: Chart, meta: dict | None) -> str:
        return str((meta or {}).get("version") or chart.version or "")

    def values(self, ctx, deployed: dict | None, no_room: bool) -> values_render.ValuesPlan:
        """The values to install; `deployed`, the running release's values, is what unknown node facts keep."""
        if self._values is None:
            chart, meta = self.chart(ctx)
            facts = values_render.facts_from_reports(ctx.node_facts.reports())
            from gpu_bootstrap.steps.monitoring_target import MonitoringProblem, dcgm_scrape
            try:
                scrape = dcgm_scrape(ctx)  # the monitoring step's DCGM ServiceMonitor values (one source)
            except MonitoringProblem as problem:
                raise values_render.Refusal(f"monitoring: {problem.message}", problem.hint) from None
            # a local chart's own defaults say which values hold an image repository (registry.mirror)
            defaults = charts.local_chart_values(chart.ref) if chart.repo is None else None
            self._values = values_render.derive(facts, ctx.config, self.version_of(chart, meta),
                                                list(ctx.options.playbook), deployed, no_room, scrape,
                                                chart_values=defaults, service_monitors=self.service_monitors(ctx))
        return self._values

    def service_monitors(self, ctx) -> bool:
        if self._service_monitors is None:
            self._service_monitors = service_monitors_come(ctx)
        return self._service_monitors

    def inputs(self, ctx) -> dict:
        chart, meta = self.chart(ctx)
        extra = {} if self.service_monitors(ctx) else {"service_monitors": False}  # as before, where they come
        config = ctx.config.gpu_operator.model_dump(mode="json")
        if config["allocation"] == "device-plugin":  # as before DRA: fingerprints recorded then still match
            config.pop("allocation")
            config.pop("dra_driver")
        return {"config": config, "chart": self.version_of(chart, meta),
                "facts": facts_digest(ctx.node_facts.reports()),
                "kube": ".".join(ctx.server_version().split(".")[:2]),
                "node_prep": ctx.config.node_prep.model_dump(mode="json"), "playbook": list(ctx.options.playbook),
                **registry_inputs(ctx.config), **extra}

    # --- check / plan ---------------------------------------------------------------------------------------------
    def check(self, ctx) -> Check:
        section = ctx.config.gpu_operator
        try:
            chart, meta = self.chart(ctx)  # an unsupported Kubernetes version raises UnsupportedVersion (exit 2)
        except ChartProblem as error:
            return Check(FAIL, str(error))
        if section.allocation == "dra":
            try:
                dra_render.check_kubernetes(ctx.server_version())
            except versions.UnsupportedVersion as error:
                error.step = self.id
                raise
        version = self.version_of(chart, meta)
        status = ctx.helm.status(section.release, section.namespace)
        dra_status, dra_ours = dra_release.release_status(ctx, MANAGED_SELECTOR)
        if dra_status is not None and not dra_ours and section.allocation == "dra":
            return Check(FAIL, f"a release {section.dra_driver.namespace}/{section.dra_driver.release} exists that "
                               f"gpu-bootstrap did not install, so it is left alone: remove it, or choose another "
                               f"gpu_operator.dra_driver.release / namespace")
        if refused := dra_release.switch_refusal(ctx, status, dra_ours):
            return Check(FAIL, refused)
        # values_unknown: the release's record (a Secret) was not readable (adapters/secretless.py)
        deployed = (status.get("config") or {}) if status and not status.get("values_unknown") else None
        ours = status is None or ctx.helm.labelled(section.release, section.namespace, MANAGED_SELECTOR)
        if not ours and not section.adopt:
            return Check(FAIL, f"a release {section.namespace}/{section.release} exists that gpu-bootstrap did not "
                               f"install, so it is left alone: set gpu_operator.adopt: true to manage it (it is "
                               f"upgraded with gpu-bootstrap's values, and teardown uninstalls it), or choose another "
                               f"gpu_operator.release / namespace")
        everything = ctx.kube.list("v1", "Node")
        no_room = bool(no_room_warning(everything, ctx.config, ctx.options.playbook))
        try:
            plan = self.values(ctx, deployed, no_room)
        except ChartProblem as error:
            return Check(FAIL, str(error))
        except values_render.Refusal as refusal:
            return Check(FAIL, f"{refusal.message} — {refusal.fix}")
        by_name = {node["metadata"]["name"]: node for node in everything}
        nodes = {n.name: by_name.get(n.name) for n in ctx.config.nodes}
        dra_facts = None
        if section.allocation == "dra":
            advertising = [name for name, node in nodes.items() if node is not None and gpu_resources(node)]
            if taken := dra_release.foreign_capacity(advertising, status):
                return Check(FAIL, f"{', '.join(taken[:4])} advertise nvidia.com/gpu from a device plugin "
                                   f"gpu-bootstrap does not manage: a node must not serve its GPUs through DRA as well "
                                   f"— remove that device plugin first, or use allocation: device-plugin")
            if dra_status is None and (refused := dra_release.foreign_driver_refusal(ctx)):
                return Check(FAIL, refused)
            try:
                dra_facts = dra_release.facts(ctx, plan, dra_status)
            except ValueError as error:
                return Check(FAIL, str(error))
            except values_render.Refusal as refusal:
                return Check(FAIL, f"{refusal.message} — {refusal.fix}")
        wanted = {name: {**plan.node_labels.get(name, {}), **(dra_facts.values.node_labels.get(name, {})
                                                               if dra_facts else {})} for name in nodes}
        label_patches = {name: labels_render.prepare_patch(node, wanted.get(name, {}), None, LABELS_ANNOTATION)
                         for name, node in nodes.items() if node is not None}
        label_patches = {k: v for k, v in label_patches.items() if v}
        if status is None:  # a first install: remember which operator labels each node has without it
            for name, node in nodes.items():
                if node is not None and (before := labels_render.labels_before_patch(node, BEFORE_ANNOTATION,
                                                                                       ANNOTATIONS_BEFORE)):
                    label_patches[name] = labels_render.deep_merge_patch(label_patches.get(name), before)
        release = release_state(ctx, status, chart, version,
                                      plan.merged if ctx.node_facts.reports() else None)
        if not ours and release["up_to_date"]:  # adopt: one upgrade records that the release is now ours
            release = {**release, "up_to_date": False, "reason": "to adopt (gpu_operator.adopt: true)"}
        ns_plan = pod_security.decide(section.namespace, ctx.kube.get("v1", "Namespace", section.namespace),
                                      pod_security.PRIVILEGED, PRIVILEGED_WHY, "the release's namespace")
        namespace = ns_plan.state
        if release["installed"] and not release["up_to_date"] and not ctx.options.allow_operand_restart and \
                deployed is not None:
            if changes := values_render.restarts(deployed or {}, plan.merged):
                return Check(FAIL, f"the plan changes what the running {section.release} does on every GPU node "
                                   f"({'; '.join(changes)}), which restarts its operands there — rerun with "
                                   f"--allow-operand-restart to apply it, or check the node facts first "
                                   f"(gpu-bootstrap doctor)")
        if refused := downgrade_refusal(section, "gpu_operator", release, version):
            return Check(FAIL, refused)
        from gpu_bootstrap.pipeline.chart_crds import plan_crds
        crds = plan_crds(ctx, chart, version, release, CRD_GROUPS)
        remove_dra = section.allocation == "device-plugin" and dra_ours
        exporter = tuple(dra_release.owned_changes(ctx, dra_facts.values.merged, MANAGED) if dra_facts else
                         dra_release.owned_removals(ctx, MANAGED) if remove_dra else ())
        facts = OperatorFacts(chart, version, plan, nodes, label_patches, release, ctx.server_version(), self._choice,
                              namespace, crds, ns_plan, dra=dra_facts, remove_dra=remove_dra, exporter=exporter)
        warnings = ([self._choice.warning] if self._choice.warning else []) + list(plan.warnings) + crds.kept
        warnings += [ns_plan.advice] if ns_plan.advice else []
        warnings += list(dra_facts.values.warnings) if dra_facts else []
        unknown = [d.path for d in plan.derived if d.because.startswith(values_render.NO_FACTS)]
        unknown += [f"dra_driver:{d.path}" for d in (dra_facts.values.derived if dra_facts else [])
                    if d.because.startswith(values_render.NO_FACTS)]
        dra_done = (dra_facts is None or (dra_facts.release["up_to_date"] and dra_facts.namespace_plan.action ==
                                          "none" and not exporter)) and not remove_dra
        warnings += [dra_facts.namespace_plan.advice] if dra_facts and dra_facts.namespace_plan.advice else []
        if ns_plan.action == "label" and release["up_to_date"] and not label_patches and not crds.changes and dra_done:
            return Check(WARN, f"{section.release} {version} up to date; its namespace needs "
                               f"{pod_security.ENFORCE}=privileged", facts=facts, warnings=warnings, unknown=unknown)
        if release["up_to_date"] and not label_patches and not crds.changes and dra_done:
            shown = f" and DRA driver {dra_facts.version}" if dra_facts else ""
            return Check(PASS, f"{section.release} {version}{shown} deployed and up to date", done=True, facts=facts,
                         warnings=warnings)
        todo = release["reason"] if not release["up_to_date"] else "up to date"
        if dra_facts and not dra_facts.release["up_to_date"]:
            todo += f"; DRA driver {dra_facts.version}: {dra_facts.release['reason']}"
        if remove_dra:
            todo += "; DRA driver to remove (allocation: device-plugin)"
        if crds.changes:
            todo += f"; {len(crds.changes)} CRD(s) to apply first"
        return Check(WARN, f"{section.release} {version}: {todo}", facts=facts, warnings=warnings, unknown=unknown)

    def plan(self, ctx, check: Check) -> list[Change]:
        facts: OperatorFacts = check.facts
        section = ctx.config.gpu_operator
        release = Ref.release(section.release, section.namespace)
        changes = []
        for name, patch in sorted(facts.labels.items()):
            why = "the operator reads these node labels" if (patch.get("metadata") or {}).get("labels") else \
                "remember which operator labels the node has before the first install (teardown keeps those)"
            changes.append(Change(Verb.PATCH, Ref.node(name), labels_render.describe(patch), why,
                                  pin_resource_version(patch, facts.nodes[name])))
        if facts.release.get("pending"):
            changes.append(Change(Verb.HELM_RECOVER, release, f"clear the {facts.release['pending']} state",
                                  "a helm run was interrupted; helm refuses new operations until it is cleared",
                                  {"release": section.release, "namespace": section.namespace,
                                   "timeout": f"{section.wait_timeout}s"}))
        if facts.namespace_plan is not None and (parts := facts.namespace_plan.change()):
            changes.append(Change(Verb.APPLY, Ref("v1", "Namespace", section.namespace), *parts))
        from gpu_bootstrap.pipeline.chart_crds import crd_changes
        changes += crd_changes(facts.crds, f"gpu-operator {facts.version}")
        if facts.remove_dra:  # before the device plugin returns: a node never serves its GPUs both ways
            changes.append(dra_release.uninstall_change(ctx, "gpu_operator.allocation: device-plugin (moved back "
                                                             "with --allow-allocation-change)"))
        if not facts.release["up_to_date"]:
            plan = facts.values
            action = "install" if facts.release["installed"] is None else facts.release["reason"]
            body = {"release": section.release, "namespace": section.namespace,
                    "chart": {"ref": facts.chart.ref, "repo": facts.chart.repo, "version": facts.chart.version},
                    "chart_version": facts.version, "values": plan.merged, "derived": plan.explain(),
                    "warnings": plan.warnings, "kube_version": facts.kube_version,
                    "timeout": f"{section.wait_timeout}s", "labels": dict(MANAGED)}
            choice = facts.choice
            shown = f"{choice.release.label} ({facts.version})" if choice.release else facts.version
            changes.append(Change(Verb.HELM_UPGRADE, release, f"{action}: gpu-operator {shown}", choice.reason,
                                  body, details=tuple(plan.explain())))
        changes += list(facts.exporter)
        if facts.dra is not None and (parts := facts.dra.namespace_plan.change()):
            changes.append(Change(Verb.APPLY, Ref("v1", "Namespace", section.dra_driver.namespace), *parts))
        if facts.dra is not None and facts.dra.release.get("pending"):
            dra = section.dra_driver
            changes.append(Change(Verb.HELM_RECOVER, Ref.release(dra.release, dra.namespace),
                                  f"clear the {facts.dra.release['pending']} state",
                                  "a helm run was interrupted; helm refuses new operations until it is cleared",
                                  {"release": dra.release, "namespace": dra.namespace,
                                   "timeout": f"{section.wait_timeout}s"}))
        if facts.dra is not None and not facts.dra.release["up_to_date"]:  # after the operator's device plugin stops
            changes.append(dra_release.upgrade_change(ctx, facts.dra, MANAGED))
        return changes

    # --- verify: wait for the operands ------------------------------------------------------------------------------
    def verify(self, ctx) -> Check:
        section = ctx.config.gpu_operator
        deadline = time.monotonic() + section.wait_timeout
        last_note = 0.0
        while True:
            problems = self.operand_problems(ctx)
            if not problems and section.allocation == "dra":
                problems = dra_release.problems(ctx, self._gpu_counts(ctx))
                if not problems:
                    from gpu_bootstrap.core import dra
                    published = dra.gpu_devices_by_node(ctx.kube.list(dra.API_VERSION, "ResourceSlice"))
                    gpus = sum(published.get(n.name, 0) for n in ctx.config.nodes)
                    return Check(PASS, f"operands and the DRA driver ready on {len(ctx.config.nodes)} GPU node(s), "
                                       f"{gpus} GPU(s) published as ResourceSlices", done=True)
            if not problems:
                gpus = sum(gpu_resources(ctx.kube.get("v1", "Node", n.name) or {}) for n in ctx.config.nodes)
                return Check(PASS, f"operands ready on {len(ctx.config.nodes)} GPU node(s), {gpus} GPU(s) "
                                   f"advertised", done=True)
            if time.monotonic() >= deadline:
                return Check(FAIL, f"not ready after {section.wait_timeout}s: " + "; ".join(problems[:6]) +
                             (f" (+{len(problems) - 6} more)" if len(problems) > 6 else ""))
            if time.monotonic() - last_note > 10:
                ctx.reporter.note(f"waiting for the gpu-operator operands: {problems[0]}")
                last_note = time.monotonic()
            time.sleep(min(2.0, max(deadline - time.monotonic(), 0.1)))

    def operand_problems(self, ctx) -> list[str]:
        namespace = ctx.config.gpu_operator.namespace
        daemonsets = ctx.kube.list("apps/v1", "DaemonSet", namespace)
        pods = ctx.kube.list("v1", "Pod", namespace)
        listed = {n["metadata"]["name"]: n for n in ctx.kube.list("v1", "Node")}  # one list, not a GET per node
        nodes = {n.name: listed.get(n.name) for n in ctx.config.nodes}
        return operand_problems(daemonsets, pods, nodes, namespace, ctx.config.gpu_operator.allocation == "dra")

    @staticmethod
    def _gpu_counts(ctx) -> dict[str, int | None]:
        """node -> the GPUs preflight found there (None: its facts are unknown or were not read)."""
        facts = {f.name: f for f in values_render.facts_from_reports(ctx.node_facts.reports())}
        return {n.name: (len(facts[n.name].gpus) if n.name in facts and not facts[n.name].unknown else None)
                for n in ctx.config.nodes}

    def doctor(self, ctx) -> list[Check]:
        try:
            check = self.check(ctx)
        except versions.UnsupportedVersion as error:  # doctor reports it as a failed check; up refuses (exit 2)
            return [Check(FAIL, error.one_line().removeprefix(f"[{self.id}] "))]
        if check.status == FAIL or check.facts.release.get("installed") is None:
            return [check]
        problems = self.operand_problems(ctx)
        checks = [check, Check(WARN if problems else PASS, "; ".join(problems[:4]) if problems else
                               "operands ready on every GPU node")]
        upgrade = self._driver_upgrade(ctx)
        return checks + ([upgrade] if upgrade else [])

    def _driver_upgrade(self, ctx) -> Check | None:
        """The operator's driver upgrade on the GPU nodes: None while no node carries an upgrade state."""
        section = ctx.config.gpu_operator
        listed = {n["metadata"]["name"]: n for n in ctx.kube.list("v1", "Node")}  # one list, not a GET per node
        nodes = {n.name: listed.get(n.name) for n in ctx.config.nodes}
        states = {name: ((node or {}).get("metadata", {}).get("labels") or {}).get(UPGRADE_STATE)
                  for name, node in nodes.items()}
        if not any(states.values()):
            return None
        from gpu_bootstrap.core.errors import ClusterError, Unknown
        try:
            events = ctx.kube.list("v1", "Event", field_selector="involvedObject.kind=Node,reason=GPUDriverUpgrade")
        except (ClusterError, Unknown):  # events unreadable: a state's age is unknown, which is not "stuck"
            events = []
        problems = driver_upgrade_problems(nodes, events, section.driver_upgrade, section.namespace, time.time())
        if problems:
            return Check(WARN, "; ".join(problems[:4]))
        counts: dict[str, int] = {}
        for state in states.values():
            counts[state or "none"] = counts.get(state or "none", 0) + 1
        shown = ", ".join(f"{n} node(s) {state}" for state, n in sorted(counts.items()))
        return Check(PASS, f"driver upgrade: {shown}")

    # --- undo -------------------------------------------------------------------------------------------------------
    def undo_plan(self, ctx) -> list[Change]:
        """Only what is ours: the release when we installed it (or it was adopted), its namespace when we created
        it, the node labels we set; a release someone else installed is left alone."""
        section = ctx.config.gpu_operator
        changes = []
        dra = section.dra_driver
        if dra_release.release_status(ctx, MANAGED_SELECTOR)[1]:
            changes.append(dra_release.uninstall_change(ctx, "teardown"))
        changes += dra_release.owned_removals(ctx, MANAGED)
        live_dra_ns = ctx.kube.get("v1", "Namespace", dra.namespace) if dra.namespace != section.namespace else None
        if live_dra_ns and (live_dra_ns["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == \
                "gpu-bootstrap":
            changes.append(Change(Verb.DELETE, Ref("v1", "Namespace", dra.namespace), "remove",
                                  "the namespace gpu-bootstrap created for the DRA driver"))
        if ctx.helm.status(section.release, section.namespace) is not None and (
                section.adopt or ctx.helm.labelled(section.release, section.namespace, MANAGED_SELECTOR)):
            changes.append(Change(Verb.HELM_UNINSTALL, Ref.release(section.release, section.namespace),
                                  f"uninstall {section.release}", "teardown",
                                  {"release": section.release, "namespace": section.namespace,
                                   "timeout": f"{section.wait_timeout}s"}))
        live_ns = ctx.kube.get("v1", "Namespace", section.namespace)
        if live_ns and (live_ns["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == \
                "gpu-bootstrap":
            changes.append(Change(Verb.DELETE, Ref("v1", "Namespace", section.namespace), "remove",
                                  "the namespace gpu-bootstrap created for the release"))
        for configured in ctx.config.nodes:
            node = ctx.kube.get("v1", "Node", configured.name)
            patch = labels_render.undo_patch(node, LABELS_ANNOTATION) if node else None
            if patch:
                changes.append(Change(Verb.PATCH, Ref.node(configured.name), labels_render.describe(patch),
                                      "remove the labels gpu-operator set", patch))
        for configured in ctx.config.nodes:  # the labels the operator and NFD left behind (not the user's)
            node = ctx.kube.get("v1", "Node", configured.name)
            keep = set(labels_render.read_record(node or {}).get("labels") or {})  # node-prep's own undo
            patch = labels_render.operator_labels_undo(node, BEFORE_ANNOTATION, keep, ANNOTATIONS_BEFORE) \
                if node else None
            if patch:
                changes.append(Change(Verb.PATCH, Ref.node(configured.name), labels_render.describe(patch),
                                      "remove the labels and annotations the gpu-operator added", patch))
        if ctx.options.purge_crds:
            changes += self._crd_deletions(ctx)
        return changes

    def _crd_deletions(self, ctx) -> list[Change]:
        chart, _meta = self.chart(ctx)
        names = [crd["metadata"]["name"] for crd in ctx.helm.show_crds(chart)]
        return [Change(Verb.DELETE, Ref("apiextensions.k8s.io/v1", "CustomResourceDefinition", name),
                       "delete the CRD and every object of it", "--purge-crds")
                for name in names if ctx.kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)]


class ChartProblem(Exception):
    pass


def rbac_needs(config) -> dict:
    return {READ: [need("", "nodes", "get list"), *chart_needs("gpu-operator", "operator", ("get", "list")),
                   need("apiextensions.k8s.io", "customresourcedefinitions", "get")],
            WRITE: [need("", "nodes", "patch"), need("", "namespaces", APPLY),
                    *chart_needs("gpu-operator", "operator", APPLY),
                    *chart_rbac_needs("gpu-operator", config.gpu_operator.release, "operator")],
            RUN: [*chart_needs("gpu-operator", "operator", HELM), need("", "pods", "list", "operator")],
            DOCTOR: [need("apps", "daemonsets", "list", "operator"), need("", "pods", "list create", "operator")]}


DECLARATION = declare(
    GpuOperator, section="gpu_operator", enabled=lambda config: config.gpu_operator.enabled, needs=rbac_needs,
    dra_needs=dra_release.rbac_needs,
    summary="installs or upgrades the NVIDIA gpu-operator with values derived from the preflight facts, refuses "
            "releases not validated for your Kubernetes version, then waits until the operands run on every GPU node "
            "and the GPUs are advertised")


def service_monitors_come(ctx) -> bool:
    """Whether the DCGM exporter's ServiceMonitor can be made: the monitoring step runs in this run (before this
    step: it installs the Prometheus Operator's CRDs or attaches to a cluster that serves them), or the cluster
    serves the CRD now. True when no ServiceMonitor is planned at all. An API error is raised, not taken for
    "not served"."""
    from gpu_bootstrap.steps.monitoring import SERVICE_MONITOR_CRD
    from gpu_bootstrap.steps.monitoring_prometheus import crd_exists
    if "monitoring" not in ctx.options.playbook or not ctx.config.monitoring.enabled:
        return True
    if not ctx.options.selected or "monitoring" in ctx.options.selected:
        return True
    return crd_exists(ctx, SERVICE_MONITOR_CRD)
