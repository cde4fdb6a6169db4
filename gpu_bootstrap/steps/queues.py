"""queues: GPU quotas per team, borrowing within a cohort and all-or-nothing admission, by Kueue.

Configured by teams (`queues.teams`: namespaces, GPU quota, borrowing, lending, priority), not by Kueue objects.
`up` installs Kueue from its pinned chart (a release of its own, labelled ours), with a Configuration that manages
workloads in the team namespaces only, then applies the objects render/queues.py makes from the teams and the GPU
nodes preflight found: ResourceFlavors, one ClusterQueue per team in one cohort, a LocalQueue in each team namespace.

Workloads join a queue by the label kueue.x-k8s.io/queue-name (or every one in a team namespace, with
`require_queue`). Kueue admits a Job's pods as one Workload against the team's quota and leaves placement to the
scheduler, so GPU pods are still steered to the bin-packing scheduler by admission when they are created.

No teams: nothing is installed, and the queues and Kueue release of an earlier run are removed. Teardown removes only
our queues and flavors and our release, and refuses while users' admitted workloads exist unless told
(--evict-workloads): removing Kueue removes its CRDs, and with them every Workload.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from gpu_bootstrap.core.errors import ClusterError, Unknown, Unreachable
from gpu_bootstrap.core.objects import condition_true, differences, served
from gpu_bootstrap.core.refs import Chart
from gpu_bootstrap.pipeline.step import FAIL, PASS, SKIP, WARN, Change, Check, Ref, Step, Verb, declare
from gpu_bootstrap.render import queues as render
from gpu_bootstrap.security.rbac_rules import APPLY, CLUSTER, DOCTOR, HELM, READ, RUN, WRITE, Need, need
from gpu_bootstrap.steps.queues_config import QueuesConfig

RELEASE_LABELS = {"app.kubernetes.io/managed-by": "gpu-bootstrap"}  # on the release's metadata and its namespace
RELEASE_SELECTOR = "app.kubernetes.io/managed-by=gpu-bootstrap"
EVICT_FLAG = "--evict-workloads"


@dataclass
class QueueFacts:
    chart: Chart
    rendered: render.Rendered
    release: dict  # gpu_operator_release.release_state's answer
    drift: dict  # Ref -> why
    leftovers: list  # Refs of ours no longer wanted
    namespace_missing: bool = False


def section_of(config) -> QueuesConfig:
    return DECLARATION.settings(config)


def dra_mode(config) -> bool:
    """The GPUs are served through DRA: Kueue must count claims and DRA-served extended resources as GPUs."""
    return config.gpu_operator.enabled and config.gpu_operator.allocation == "dra"


def chart_of(section: QueuesConfig) -> Chart:
    kueue = section.kueue
    local = Path(kueue.chart).expanduser()
    if local.exists() or kueue.chart.endswith(".tgz") or "/" in kueue.chart and not kueue.chart.startswith("oci://"):
        return Chart(str(local), None, None)
    if kueue.repository.startswith("oci://"):
        return Chart(f"{kueue.repository.rstrip('/')}/{kueue.chart}", None, kueue.version)
    return Chart(kueue.chart, kueue.repository, kueue.version)


class Queues(Step):
    id = "queues"
    title = "Team GPU quotas and all-or-nothing admission (Kueue)"

    def namespaces(self, ctx) -> list[str]:
        section = section_of(ctx.config)
        return [section.kueue.namespace] if section.teams else []

    def inputs(self, ctx) -> dict:
        from gpu_bootstrap.steps.preflight import facts_digest
        from gpu_bootstrap.core.catalogue import registry_inputs
        return {"queues": section_of(ctx.config).model_dump(mode="json"), "dra": dra_mode(ctx.config),
                "facts": facts_digest(ctx.node_facts.reports()), "gpu_labels": self.gpu_labels(ctx),
                **registry_inputs(ctx.config)}

    @staticmethod
    def gpu_labels(ctx) -> dict[str, str]:
        """The labels every GPU node carries: node-prep's (the flavor of "any GPU node" selects them)."""
        from gpu_bootstrap.render import node_prep as node_render
        labels, _taint = node_render.labels_and_taint(ctx.config.node_prep)
        return labels or {"nvidia.com/gpu.present": "true"}

    # --- reading the cluster ------------------------------------------------------------------------------------------
    def gpu_nodes(self, ctx) -> tuple[list[render.GpuNode], list[str]]:
        """The GPU nodes (products from preflight's facts, counts from the nodes' allocatable), and the nodes whose
        facts are unknown: configured nodes without a report, or whose probe failed."""
        from gpu_bootstrap.render.gpu_operator_values import facts_from_reports
        reports = ctx.node_facts.reports()
        facts = facts_from_reports(reports)
        listed = [n.name for n in ctx.config.nodes] if isinstance(ctx.config.nodes, list) else []
        unknown = [name for name in listed if name not in reports] if reports else (listed or ["the GPU nodes"])
        live = {n["metadata"]["name"]: n for n in ctx.kube.list("v1", "Node")} if reports else {}
        nodes = []
        for fact in facts:
            if fact.unknown:
                unknown.append(fact.name)
                continue
            allocatable = ((live.get(fact.name) or {}).get("status") or {}).get("allocatable") or {}
            count = allocatable.get(render.GPU)
            nodes.append(render.GpuNode(fact.name, tuple(fact.gpus),
                                        int(count) if count is not None else len(fact.gpus)))
        return nodes, unknown

    def check(self, ctx) -> Check:
        section = section_of(ctx.config)
        if not section.teams:
            return self._without_teams(ctx)
        live_namespace = ctx.kube.get("v1", "Namespace", section.kueue.namespace)
        if live_namespace and live_namespace["metadata"].get("deletionTimestamp"):
            return Check(FAIL, f"namespace {section.kueue.namespace} is being deleted (an earlier teardown): rerun "
                               f"once it is gone (kubectl get namespace {section.kueue.namespace})")
        chart = chart_of(section)
        nodes, unknown = self.gpu_nodes(ctx)
        rendered = render.render(section, None if unknown else nodes, self.gpu_labels(ctx), self.image(ctx),
                                 dra=dra_mode(ctx.config))
        release_ours, status = self._release(ctx)
        if status is not None and not release_ours:
            return Check(FAIL, f"a Kueue release {section.kueue.namespace}/{section.kueue.release} exists and "
                               f"gpu-bootstrap did not install it: set queues.kueue.release (and namespace) to another "
                               f"name, or uninstall that Kueue (only what gpu-bootstrap made is changed)")
        release = self._release_state(ctx, status, chart, rendered.values)
        is_served = self._served(ctx)
        drift, theirs = self._drift(ctx, rendered.objects) if is_served else (
            {Ref.of(o): "missing" for o in rendered.objects}, [])
        if theirs:
            return Check(FAIL, f"{', '.join(theirs[:3])} exist(s) and gpu-bootstrap did not create them: rename the "
                               f"team (or queues.local_queue), or remove them")
        leftovers = self._owned(ctx, exclude={Ref.of(o) for o in rendered.objects}) if is_served else []
        facts = QueueFacts(chart, rendered, release, drift, leftovers, live_namespace is None)
        warnings = list(rendered.warnings)
        if unknown:
            warnings.append(f"the GPUs of {', '.join(unknown[:3])}{' and more' if len(unknown) > 3 else ''} are "
                            f"unknown (no node facts): the quotas are not compared with the GPUs there are")
        summary = self._summary(section, release, drift, leftovers)
        if release["up_to_date"] and not drift and not leftovers:
            ready = self._queues_active(ctx, section)
            if ready.status != PASS:
                return Check(WARN, ready.message, facts=facts, warnings=warnings)
            return Check(PASS, f"{summary}; {ready.message}", done=True, facts=facts, warnings=warnings)
        return Check(WARN, summary, facts=facts, warnings=warnings)

    def image(self, ctx) -> str:
        from gpu_bootstrap.core.catalogue import locate
        section = section_of(ctx.config)
        return locate(f"{render.IMAGE}:v{section.kueue.version.lstrip('v')}", ctx.config.registry)

    @staticmethod
    def _summary(section, release: dict, drift: dict, leftovers: list) -> str:
        parts = []
        if not release["up_to_date"]:
            parts.append(f"Kueue {section.kueue.version}: {release['reason']}")
        missing = sum(1 for why in drift.values() if why == "missing")
        for count, what in ((missing, "to create"), (len(drift) - missing, "to update"),
                            (len(leftovers), "to remove")):
            if count:
                parts.append(f"{count} queue object(s) {what}")
        teams = ", ".join(t.name for t in section.teams)
        return (", ".join(parts) or f"Kueue {section.kueue.version} and the queues of {teams} in place") + \
            (f" (teams: {teams})" if parts else "")

    def _release(self, ctx) -> tuple[bool, dict | None]:
        """(the Kueue release is ours, helm's status of it). Without teams it is looked for only in a namespace we
        made: a cluster that never had queues costs no helm call, and a role made before this step needs no read."""
        section = section_of(ctx.config)
        kueue = section.kueue
        if not section.teams:
            namespace = ctx.kube.get("v1", "Namespace", kueue.namespace)
            if not namespace or not _ours_release_namespace(namespace):
                return False, None
        status = ctx.helm.status(kueue.release, kueue.namespace)
        return status is not None and ctx.helm.labelled(kueue.release, kueue.namespace, RELEASE_SELECTOR), status

    def _release_state(self, ctx, status, chart: Chart, values: dict) -> dict:
        from gpu_bootstrap.steps.gpu_operator_release import release_state
        kueue = section_of(ctx.config).kueue
        return release_state(ctx, status, chart, kueue.version, values, kueue.release, kueue.namespace)

    @staticmethod
    def _served(ctx) -> bool:
        try:
            return all(served(ctx.kube, render.API, kind) for kind in render.KINDS)
        except Unknown:
            return False

    @staticmethod
    def _drift(ctx, desired: list[dict]) -> tuple[dict, list[str]]:
        drift, theirs = {}, []
        for obj in desired:
            ref = Ref.of(obj)
            live = ctx.kube.get(ref.api_version, ref.kind, ref.name, ref.namespace)
            if live is None:
                drift[ref] = "missing"
            elif not _ours(live):
                theirs.append(str(ref))
            elif paths := differences(obj, live) + _removed(obj, live):
                drift[ref] = "differs at " + ", ".join(paths[:3])
        return drift, theirs

    @staticmethod
    def _owned(ctx, exclude: set) -> list[Ref]:
        """Our queue objects `exclude` does not list, in the order they are removed (queues before flavors)."""
        found = []
        for kind in reversed(render.KINDS):
            try:
                items = ctx.kube.list(render.API, kind, label_selector=render.OWNED_SELECTOR)
            except Unreachable:
                raise
            except ClusterError as error:
                if error.status:  # we could not read: unknown is not "none"
                    raise
                continue  # not served: nothing of ours
            found += [ref for obj in items if (ref := Ref.of({**obj, "apiVersion": render.API, "kind": kind}))
                      not in exclude]
        return found

    def _without_teams(self, ctx) -> Check:
        leftovers = self._owned(ctx, set()) if self._served(ctx) else []
        release_ours, _status = self._release(ctx)
        namespace = ctx.kube.get("v1", "Namespace", section_of(ctx.config).kueue.namespace)
        if not leftovers and not release_ours and not (namespace and _ours_release_namespace(namespace)):
            return Check(SKIP, "no teams configured (queues.teams)")
        what = [f"{len(leftovers)} queue object(s)"] if leftovers else []
        what += ["the Kueue release"] if release_ours else []
        return Check(WARN, f"no teams configured: {' and '.join(what)} of an earlier run to remove",
                     facts={"leftovers": leftovers, "release": release_ours})

    # --- planning -----------------------------------------------------------------------------------------------------
    def plan(self, ctx, check: Check) -> list[Change]:
        if isinstance(check.facts, dict):  # no teams: what an earlier run left
            return self._removals(ctx, check.facts["leftovers"], check.facts["release"], "queues.teams is empty")
        facts: QueueFacts = check.facts
        changes = []
        if not facts.release["up_to_date"]:
            if facts.namespace_missing:  # made here, labelled ours, so that teardown knows it may remove it
                changes.append(Change(Verb.APPLY, Ref("v1", "Namespace", section_of(ctx.config).kueue.namespace),
                                      "create", "Kueue's namespace, labelled as ours",
                                      namespace_object(section_of(ctx.config).kueue.namespace)))
            changes.append(self._upgrade(ctx, facts))
        wanted = {Ref.of(o): o for o in facts.rendered.objects}
        for ref, why in facts.drift.items():
            changes.append(Change(Verb.APPLY, ref, "create" if why == "missing" else "update",
                                  f"queues: {why}" if why != "missing" else "queues.teams", wanted[ref],
                                  details=tuple(line for line in facts.rendered.explained
                                                if ref.kind == "ClusterQueue" and line.startswith(
                                                    f"team {ref.name}:"))))
        changes += [Change(Verb.DELETE, ref, "remove", "no longer in queues.teams") for ref in facts.leftovers]
        return changes

    def _upgrade(self, ctx, facts: QueueFacts) -> Change:
        kueue = section_of(ctx.config).kueue
        action = "install" if facts.release.get("installed") is None else facts.release["reason"]
        body = {"release": kueue.release, "namespace": kueue.namespace,
                "chart": {"ref": facts.chart.ref, "repo": facts.chart.repo, "version": facts.chart.version},
                "chart_version": kueue.version, "values": facts.rendered.values, "derived": facts.rendered.explained,
                "warnings": facts.rendered.warnings, "kube_version": ctx.server_version(),
                "timeout": f"{kueue.wait_timeout}s", "labels": dict(RELEASE_LABELS),
                "chart_field": "queues.kueue.chart"}
        return Change(Verb.HELM_UPGRADE, Ref.release(kueue.release, kueue.namespace),
                      f"{action}: Kueue {kueue.version}",
                      "queues.teams (Kueue admits each team's workloads against its quota)", body,
                      details=tuple(facts.rendered.explained))

    def _removals(self, ctx, leftovers: list, release: bool, why: str, evicted: list | None = None) -> list[Change]:
        """Our queue objects, each waited for while Kueue releases its finalizer (a ClusterQueue once nothing is
        admitted into it); with `evicted` (teardown --evict-workloads), the users' workloads are deactivated first
        and their Kueue finalizers released before Kueue goes, or removing its CRDs would wait on them for good."""
        kueue = section_of(ctx.config).kueue
        evicted = evicted or []
        changes = [Change(Verb.PATCH, ref, "deactivate", f"{EVICT_FLAG}: Kueue evicts it (its Job is suspended, its "
                                                         f"pods deleted)", {"spec": {"active": False}})
                   for ref, _finalizers in evicted]
        changes += [Change(Verb.DELETE, ref, "remove", why, {"wait_gone": kueue.wait_timeout}) for ref in leftovers]
        changes += [Change(Verb.PATCH, ref, "release Kueue's finalizer",
                           f"{EVICT_FLAG}: Kueue is removed, and with it its Workloads",
                           {"metadata": {"finalizers": finalizers}}) for ref, finalizers in evicted]
        if release:
            changes.append(Change(Verb.HELM_UNINSTALL, Ref.release(kueue.release, kueue.namespace),
                                  f"uninstall {kueue.release}", why,
                                  {"release": kueue.release, "namespace": kueue.namespace,
                                   "timeout": f"{kueue.wait_timeout}s"}))
        live = ctx.kube.get("v1", "Namespace", kueue.namespace)
        if live and _ours_release_namespace(live):
            changes.append(Change(Verb.DELETE, Ref("v1", "Namespace", kueue.namespace), "remove",
                                  "the namespace gpu-bootstrap created for Kueue"))
        return changes

    # --- verifying ----------------------------------------------------------------------------------------------------
    def verify(self, ctx) -> Check:
        section = section_of(ctx.config)
        if not section.teams:
            return Check(PASS, "no teams configured (the queues of an earlier run are removed)", done=True)
        deadline = time.monotonic() + section.kueue.wait_timeout
        while True:
            state = self._queues_active(ctx, section)
            if state.status == PASS or time.monotonic() >= deadline:
                break
            time.sleep(1.0)
        if state.status != PASS:
            return Check(FAIL, f"{state.message} after {section.kueue.wait_timeout}s — kubectl -n "
                               f"{section.kueue.namespace} logs deploy/{section.kueue.release}-controller-manager")
        return Check(PASS, f"{state.message}; workloads join with the label {render.QUEUE_LABEL}: "
                           f"{section.local_queue}", done=True)

    def _queues_active(self, ctx, section) -> Check:
        """Every team's ClusterQueue Active (Kueue checked its flavors and admits into it) and every LocalQueue
        Active."""
        if not self._served(ctx):
            return Check(WARN, "Kueue's API is not served yet")
        inactive = []
        for team in section.teams:
            live = ctx.kube.get(render.API, "ClusterQueue", team.name)
            if not condition_true(live, "Active"):
                inactive.append(f"ClusterQueue {team.name} ({_reason(live, 'Active')})")
            for namespace in sorted(team.namespaces):
                local = ctx.kube.get(render.API, "LocalQueue", section.local_queue, namespace)
                if not condition_true(local, "Active"):
                    inactive.append(f"LocalQueue {namespace}/{section.local_queue} ({_reason(local, 'Active')})")
        if inactive:
            return Check(WARN, f"not active: {'; '.join(inactive[:4])}")
        return Check(PASS, f"{len(section.teams)} team queue(s) active in cohort {section.cohort}")

    # --- undo ---------------------------------------------------------------------------------------------------------
    def undo_plan(self, ctx) -> list[Change]:
        leftovers = self._owned(ctx, set()) if self._served(ctx) else []
        release_ours, _status = self._release(ctx)
        namespace = ctx.kube.get("v1", "Namespace", section_of(ctx.config).kueue.namespace)
        if not leftovers and not release_ours and not (namespace and _ours_release_namespace(namespace)):
            return []
        unfinished = self.unfinished_workloads(ctx, leftovers)
        if unfinished and not ctx.options.evict_workloads:
            names = [f"{ref.namespace}/{ref.name}" for ref, _f in unfinished]
            raise ClusterError(
                f"{len(unfinished)} workload(s) of users are admitted or waiting in our queues "
                f"({', '.join(names[:3])}{' and more' if len(names) > 3 else ''}): removing the queues and Kueue "
                f"would stop them, and leave their Jobs suspended",
                f"let them finish (kubectl get workloads -A), or rerun teardown with {EVICT_FLAG}")
        return self._removals(ctx, leftovers, release_ours, "teardown", unfinished)

    def unfinished_workloads(self, ctx, ours: list[Ref]) -> list[tuple[Ref, list[str]]]:
        """Workloads not finished that are admitted into, or wait in, one of our queues, with the finalizers they
        would keep without Kueue's own (namespace/name order)."""
        if not self._served(ctx) or not served(ctx.kube, render.API, "Workload"):
            return []
        cluster_queues = {ref.name for ref in ours if ref.kind == "ClusterQueue"}
        local_queues = {(ref.namespace, ref.name) for ref in ours if ref.kind == "LocalQueue"}
        found = []
        for workload in ctx.kube.list(render.API, "Workload"):
            meta = workload["metadata"]
            admitted_into = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue")
            waits_in = (meta.get("namespace"), (workload.get("spec") or {}).get("queueName"))
            if condition_true(workload, "Finished") or (admitted_into not in cluster_queues and
                                                    waits_in not in local_queues):
                continue
            keep = [f for f in meta.get("finalizers") or [] if not f.startswith("kueue.x-k8s.io/")]
            found.append((Ref(render.API, "Workload", meta["name"], meta.get("namespace")), keep))
        return sorted(found, key=lambda item: (item[0].namespace or "", item[0].name))

    # --- doctor -------------------------------------------------------------------------------------------------------
    def doctor(self, ctx) -> list[Check]:
        check = self.check(ctx)
        section = section_of(ctx.config)
        if check.status in (FAIL, SKIP) or not section.teams:
            return [check]
        # a passing check has read the queues' state already (its message says it)
        out = [check] if check.status == PASS else [check, self._queues_active(ctx, section)]
        if section.require_queue:
            out.append(self._bypassing(ctx, section))
        return out

    def _bypassing(self, ctx, section) -> Check:
        """GPU pods in the team namespaces that no queue admitted (require_queue is on)."""
        pods = [pod for team in section.teams for namespace in team.namespaces
                for pod in ctx.kube.list("v1", "Pod", namespace)]
        bypass = bypassing(pods)
        if bypass:
            more = f" and {len(bypass) - 5} more" if len(bypass) > 5 else ""
            return Check(WARN, f"{len(bypass)} GPU pod(s) outside any queue: {', '.join(bypass[:5])}{more} — "
                               f"created before Kueue managed the namespace? Delete and recreate them")
        return Check(PASS, "every GPU pod in the team namespaces went through a queue", done=True)


def bypassing(pods: list[dict]) -> list[str]:
    """'namespace/name' of the pods that ask for GPUs and that no queue admitted: no queue label of their own, and
    nothing Kueue marks on what it manages (a Job's pods carry the Job's workload through Kueue's labels). Pods that
    have finished hold no GPU and are left out."""
    return [f"{pod['metadata']['namespace']}/{pod['metadata']['name']}" for pod in pods
            if _requests_gpus(pod) and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and not (pod["metadata"].get("labels") or {}).get(render.QUEUE_LABEL) and not _admitted_by_kueue(pod)]


def _reason(obj: dict | None, kind: str) -> str:
    if obj is None:
        return "missing"
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c.get("message") or c.get("reason") or c.get("status")
    return "Kueue has not reported on it"


def _removed(wanted: dict, live: dict) -> list[str]:
    """Parts we no longer render that the live object still has (a borrowingLimit dropped when borrowing is turned
    on, a flavor's node label): a comparison of what we render against the live object cannot see them. Only the
    keys are compared (their values are differences()'), so the server's defaults and quantity forms do not count."""
    spec, live_spec = wanted.get("spec") or {}, live.get("spec") or {}
    if wanted.get("kind") == "ResourceFlavor":
        extra = set(live_spec.get("nodeLabels") or {}) - set(spec.get("nodeLabels") or {})
        return ["spec.nodeLabels"] if extra else []
    if wanted.get("kind") != "ClusterQueue":
        return []

    def quotas(groups) -> dict:
        return {(flavor.get("name"), quota.get("name")): set(quota) for group in groups or []
                for flavor in group.get("flavors") or [] for quota in flavor.get("resources") or []}
    return ["spec.resourceGroups"] if quotas(spec.get("resourceGroups")) != quotas(
        live_spec.get("resourceGroups")) else []


def namespace_object(name: str) -> dict:
    """Kueue's namespace: ours (teardown removes it), and held to the restricted Pod Security level, which Kueue's
    controller pod meets (non-root, no privilege escalation, every capability dropped, RuntimeDefault seccomp)."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
        **RELEASE_LABELS, "pod-security.kubernetes.io/enforce": "restricted"}}}


def _ours_release_namespace(namespace: dict) -> bool:
    labels = (namespace.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in RELEASE_LABELS.items())


def _ours(obj: dict) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in render.MANAGED.items())


def _requests_gpus(pod: dict) -> bool:
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        if any(render.GPU in (resources.get(key) or {}) for key in ("limits", "requests")):
            return True
    return False


def _admitted_by_kueue(pod: dict) -> bool:
    """A pod of a Job Kueue admitted carries the Job's queue label on the Job, not on itself: Kueue marks what it
    manages with its own annotations or owner (a Job's pods are owned by the Job it unsuspended)."""
    meta = pod.get("metadata") or {}
    return any(key.startswith("kueue.x-k8s.io/") for key in {**(meta.get("labels") or {}),
                                                              **(meta.get("annotations") or {})})


KUEUE_KINDS = ("resourceflavors", "clusterqueues", "localqueues", "workloadpriorityclasses")
CHART_KINDS = (("", "configmaps", True), ("", "secrets", True), ("", "services", True), ("", "serviceaccounts", True),
               ("apps", "deployments", True), ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", False),
               ("admissionregistration.k8s.io", "validatingwebhookconfigurations", False),
               ("apiregistration.k8s.io", "apiservices", False), ("rbac.authorization.k8s.io", "clusterroles", False),
               ("rbac.authorization.k8s.io", "clusterrolebindings", False),
               ("rbac.authorization.k8s.io", "roles", True),
               ("rbac.authorization.k8s.io", "rolebindings", True),
               ("apiextensions.k8s.io", "customresourcedefinitions", False))


# The roles Kueue's chart (0.17.0) makes, after its full name (`helm template` of the pinned chart lists them): the
# controller's own, and the editor/viewer roles it ships for users (aggregated into admin/edit/view). RBAC lets one
# create or bind a role only holding its permissions or with `escalate`/`bind` on it by name; holding them would
# mean editing every job kind Kueue knows, so `up` gets escalate and bind on these names only.
CHART_CLUSTER_ROLES = ("manager-role", "metrics-auth-role", "metrics-reader", "batch-admin-role", "batch-user-role",
                       "pending-workloads-cq-viewer-role", "pending-workloads-lq-viewer-role",
                       *(f"{kind}-{access}-role" for kind in (
                           "clusterqueue", "cohort", "localqueue", "resourceflavor", "topology", "workload", "job",
                           "jaxjob", "jobset", "leaderworkerset", "mpijob", "paddlejob", "pytorchjob", "raycluster",
                           "rayjob", "rayservice", "sparkapplication", "tfjob", "trainjob", "xgboostjob")
                         for access in ("editor", "viewer")))
CHART_ROLES = ("leader-election-role", "manager-secrets-role", "manager-clusterprofiles-role")


def chart_fullname(release: str, chart: str = "kueue") -> str:
    """The chart's `kueue.fullname`: the release's name when it holds the chart's, else `<release>-kueue`."""
    return release[:63].rstrip("-") if chart in release else f"{release}-{chart}"[:63].rstrip("-")


def rbac_needs(config) -> dict:
    """Reading our queues; with teams, installing Kueue's chart (its roles by name: RBAC lets one create a role only
    with its permissions or `escalate`), applying the queues and removing them. Without teams only the cluster-wide
    reads and removals of queue objects: no Role in a Kueue namespace that does not exist (a release an earlier run
    left is removed by the role that run was given)."""
    kinds = " ".join(KUEUE_KINDS)
    reads = [need("kueue.x-k8s.io", kinds, "get list"), need("", "namespaces", "get")]
    removes = [need("kueue.x-k8s.io", kinds, "delete"), need("kueue.x-k8s.io", "workloads", "list patch")]
    if not section_of(config).teams:
        return {READ: reads, RUN: removes}
    fullname = chart_fullname(section_of(config).kueue.release)
    chart = [(g, r, "kueue" if namespaced else CLUSTER) for g, r, namespaced in CHART_KINDS]
    return {READ: [*reads, need("", "nodes", "list"), need("", "secrets", "get list", "kueue")],
            WRITE: [need("kueue.x-k8s.io", kinds, APPLY), need("", "namespaces", APPLY),
                    *[Need(g, (r,), APPLY, scope) for g, r, scope in chart],
                    need("rbac.authorization.k8s.io", "clusterroles", "bind escalate", CLUSTER,
                         {f"{fullname}-{name}" for name in CHART_CLUSTER_ROLES}),
                    need("rbac.authorization.k8s.io", "roles", "bind escalate", "kueue",
                         {f"{fullname}-{name}" for name in CHART_ROLES}),
                    # the visibility server reads the API server's front-proxy CA: a RoleBinding in kube-system
                    need("rbac.authorization.k8s.io", "rolebindings", APPLY, "kube-system"),
                    need("rbac.authorization.k8s.io", "roles", "bind", "kube-system",
                         {"extension-apiserver-authentication-reader"})],
            RUN: [*removes, need("rbac.authorization.k8s.io", "rolebindings", HELM, "kube-system"), *[Need(g, (r,), HELM, scope) for g, r, scope in chart],
                  need("apps", "replicasets", "get list watch", "kueue"), need("", "pods", "get list watch", "kueue")],
            DOCTOR: [need("", "pods", "list"), need("kueue.x-k8s.io", "workloads", "list")]}


DECLARATION = declare(
    # no switch: without teams it still runs, to remove the queues and Kueue of an earlier run
    Queues, section="queues", model=QueuesConfig, needs=rbac_needs,
    scopes=lambda config: {"kueue": section_of(config).kueue.namespace},
    summary="when `queues.teams` is set: Kueue, with a GPU quota per team in one cohort (borrowing, reclaim) and "
            "all-or-nothing admission of distributed jobs ([Team queues](docs/steps/queues.md))")
