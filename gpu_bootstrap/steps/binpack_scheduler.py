"""binpack-scheduler: a second kube-scheduler whose profile packs GPU pods onto as few nodes as possible.

It runs as a leader-elected Deployment with in-cluster credentials (no control-plane kubeconfig), at the image tag
of the API server's version. The default scheduler keeps scheduling everything else; GPU pods opt in with
`spec.schedulerName`. Objects it owns carry the app.kubernetes.io/component=scheduler and managed-by labels, so a
renamed scheduler or a dropped PodDisruptionBudget is removed rather than left behind.
"""
from __future__ import annotations

import time

from gpu_bootstrap.core import dra
from gpu_bootstrap.core.errors import ClusterError, ConfigError, GpuBootstrapError
from gpu_bootstrap.core.catalogue import locate_pods, registry_inputs
from gpu_bootstrap.core.objects import (differences, lease_fresh, parse_time, served, toleration_for, unschedulable,
                                        waiting)
from gpu_bootstrap.pipeline.step import FAIL, PASS, WARN, Change, Check, ObjectsFacts, Ref, Step, Verb, declare
from gpu_bootstrap.security.rbac_rules import APPLY, CLUSTER, DOCTOR, READ, RUN, WRITE, need
from gpu_bootstrap.render import scheduler as render
from gpu_bootstrap.core.versions import KUBE_VERSION, minor_of, minor_text, skew_problem
from gpu_bootstrap.steps.node_prep import gpu_taint, no_room_warning

OWNED_KINDS = (  # (apiVersion, kind, namespaced) in the order they are applied
    ("v1", "ServiceAccount", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", False),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", True),
    ("rbac.authorization.k8s.io/v1", "Role", True),
    ("v1", "ConfigMap", True),
    ("apps/v1", "Deployment", True),
    ("policy/v1", "PodDisruptionBudget", True),
)
OWNED_SELECTOR = "app.kubernetes.io/managed-by=gpu-bootstrap,app.kubernetes.io/component=scheduler"
POD_FIXES = {
    "ImagePullBackOff": "the nodes cannot pull the image: set scheduler.image to a mirror that has it",
    "ErrImagePull": "the nodes cannot pull the image: set scheduler.image to a mirror that has it",
    "CrashLoopBackOff": "the scheduler exits at start: read its log (a config the cluster's version rejects?)",
    "CreateContainerConfigError": "the container cannot be created: kubectl describe pod",
}


SchedulerFacts = ObjectsFacts
STUCK_AFTER = 120  # seconds a pod may wait without any word from a live scheduler


def _image_version(image: str) -> str | None:
    """'registry.k8s.io/kube-scheduler:v1.31.4' -> '1.31.4'; None for a tag that is no version (a digest, 'latest')."""
    name = image.rpartition("/")[2]
    match = KUBE_VERSION.match(name.partition(":")[2]) if ":" in name else None
    return f"{match[1]}.{match[2]}.{match[3] or 0}" if match else None


def _age_seconds(pod: dict) -> float:
    import datetime as _dt
    created = parse_time(pod["metadata"].get("creationTimestamp"))
    return 0.0 if created is None else (_dt.datetime.now(_dt.timezone.utc) - created).total_seconds()


class BinpackScheduler(Step):
    id = "binpack-scheduler"
    title = "Deploy the bin-packing GPU scheduler"


    def namespaces(self, ctx) -> list[str]:
        return [ctx.config.scheduler.namespace]

    def inputs(self, ctx) -> dict:
        return {"scheduler": ctx.config.scheduler.model_dump(mode="json"), "kube": ctx.server_version(),
                **registry_inputs(ctx.config)}

    def desired(self, ctx, nodes: list[dict], dra_classes: tuple[str, ...] = ()) -> list[dict]:
        """`nodes`: the cluster's nodes; when tainting the GPU nodes leaves none of them free, the scheduler
        tolerates the GPU taint (it would never start otherwise). `dra_classes`: the DeviceClasses that serve
        nvidia.com/gpu through DRA (the profile then balances cpu and memory only: render.for_cluster)."""
        tolerations = []
        if no_room_warning(nodes, ctx.config, ctx.options.playbook):
            tolerations = [toleration_for(gpu_taint(ctx.config, ctx.options.playbook))]
        # pinned to the catalogue's digest for this tag and moved to registry.mirror (core/catalogue.py)
        return locate_pods(render.manifests(ctx.config.scheduler, ctx.server_version(), tolerations,
                                            render.nodes_to_plan_for(nodes, ctx.config.pools), dra_classes),
                           ctx.config.registry)

    @staticmethod
    def dra_gpu_classes(ctx) -> tuple[str, ...]:
        """The DeviceClasses that serve nvidia.com/gpu through DRA; none where resource.k8s.io/v1 is not served. A
        failure to read them is not "none": it propagates, and the step fails naming it."""
        if not served(ctx.kube, dra.API_VERSION, "DeviceClass"):
            return ()
        return tuple(dra.gpu_classes(ctx.kube.list(dra.API_VERSION, "DeviceClass")))

    # --- reading the cluster ------------------------------------------------------------------------------------------
    def check(self, ctx) -> Check:
        settings = ctx.config.scheduler
        nodes = ctx.kube.list("v1", "Node")
        dra_classes = self.dra_gpu_classes(ctx)
        try:
            desired = self.desired(ctx, nodes, dra_classes)
        except ConfigError as error:  # a cluster too old for the profile: a failed check, not bad input
            return Check(FAIL, error.one_line())
        pinned = _image_version(render.image(settings, ctx.server_version())) if settings.image_tag else None
        if pinned and (problem := skew_problem("kube-scheduler", pinned, ctx.server_version())):
            return Check(FAIL, f"scheduler.image_tag {settings.image_tag}: {problem}, which the skew policy forbids; "
                               f"set a v{minor_text(minor_of(ctx.server_version()))}.x tag or remove image_tag")
        drift = {}
        for obj in desired:
            ref = Ref.of(obj)
            live = ctx.kube.get(ref.api_version, ref.kind, ref.name, ref.namespace)
            if live is None:
                drift[ref] = "missing"  # the summary says "create"
            elif paths := differences(obj, live):
                drift[ref] = "differs at " + ", ".join(paths[:3])
        leftovers = self._owned(ctx, exclude={Ref.of(obj) for obj in desired})
        facts = SchedulerFacts(desired, drift, leftovers)
        if drift or leftovers:
            return Check(WARN, self._summary(settings, ctx, drift, leftovers,
                                             render.nodes_to_plan_for(nodes, ctx.config.pools), dra_classes),
                         facts=facts)
        running = self._running(ctx)
        if running.status != PASS:
            return Check(WARN, running.message, facts=facts)
        return Check(PASS, f"{settings.name} runs ({running.message})", done=True, facts=facts)

    @staticmethod
    def _summary(settings, ctx, drift: dict, leftovers: list, node_count: int, dra_classes: tuple[str, ...]) -> str:
        missing = sum(1 for why in drift.values() if why == "missing")
        counts = [(missing, "to create"), (len(drift) - missing, "to update"), (len(leftovers), "to remove")]
        return (", ".join(f"{n} object(s) {what}" for n, what in counts if n) +
                f" ({settings.name}, {render.image(settings, ctx.server_version())}; scoring: "
                f"{render.profile_line(settings, ctx.server_version(), node_count, dra_classes)})")

    def _owned(self, ctx, exclude: set) -> list[Ref]:
        """Objects we created earlier that the current config does not want (e.g. after a rename)."""
        settings = ctx.config.scheduler
        namespaces = {settings.namespace, "kube-system"}
        found = []
        for api_version, kind, namespaced in OWNED_KINDS:
            for namespace in sorted(namespaces) if namespaced else [None]:
                try:
                    items = ctx.kube.list(api_version, kind, namespace, label_selector=OWNED_SELECTOR)
                except ClusterError as error:  # the plan role lists no ConfigMap in kube-system (aws-auth is there)
                    if error.status != 403 or kind != "ConfigMap":
                        raise
                    ctx.reporter.note(f"leftover ConfigMaps of ours in {namespace} not looked for: this identity "
                                      f"may not list ConfigMaps there")
                    continue
                for obj in items:
                    ref = Ref(api_version, kind, obj["metadata"]["name"], obj["metadata"].get("namespace"))
                    if ref not in exclude and ref not in found:
                        found.append(ref)
        return found

    def plan(self, ctx, check: Check) -> list[Change]:
        return check.facts.changes()

    # --- verifying ----------------------------------------------------------------------------------------------------
    def verify(self, ctx) -> Check:
        deadline = time.monotonic() + ctx.config.scheduler.wait_timeout
        while True:
            state = self._running(ctx)
            if state.status == PASS or time.monotonic() >= deadline:
                break
            time.sleep(1.0)
        if state.status != PASS:
            return Check(FAIL, f"{state.message} after {ctx.config.scheduler.wait_timeout}s")
        return Check(PASS, f"{ctx.config.scheduler.name} runs ({state.message}); GPU pods use it with "
                           f"spec.schedulerName: {ctx.config.scheduler.name}", done=True)

    def _running(self, ctx) -> Check:
        """The Deployment rolled out and available, and one of its pods holds the leader lease."""
        settings = ctx.config.scheduler
        deploy = ctx.kube.get("apps/v1", "Deployment", settings.name, settings.namespace)
        if deploy is None:
            return Check(WARN, f"Deployment {settings.namespace}/{settings.name} does not exist")
        status = deploy.get("status") or {}
        wanted = settings.replicas
        rolled_out = status.get("observedGeneration", 0) >= deploy["metadata"].get("generation", 1) and \
            status.get("updatedReplicas", 0) == wanted and status.get("replicas", 0) == wanted
        pods = ctx.kube.list("v1", "Pod", settings.namespace, label_selector=f"app.kubernetes.io/name={settings.name}")
        if not rolled_out or status.get("availableReplicas", 0) < wanted:
            return Check(WARN, f"{status.get('availableReplicas', 0)} of {wanted} scheduler replica(s) available"
                               f"{self._pod_trouble(pods)}")
        holder = self._leader(ctx, pods)
        if holder is None:
            return Check(WARN, f"no scheduler pod holds the lease {settings.namespace}/{settings.lease} yet")
        return Check(PASS, f"{wanted} replica(s), leader {holder}")

    def _leader(self, ctx, pods: list[dict]) -> str | None:
        settings = ctx.config.scheduler
        lease = ctx.kube.get("coordination.k8s.io/v1", "Lease", settings.lease, settings.namespace)
        spec = (lease or {}).get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        names = {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}
        pod = holder.split("_", 1)[0]  # leader election identity: <hostname>_<uuid>, hostname = pod name
        # a dead leader's lease goes stale: renewed within twice its duration (at least 15 s) counts as alive
        if pod not in names or not lease_fresh(spec, 15, slack=2, floor=15):
            return None
        return pod

    @staticmethod
    def _pod_trouble(pods: list[dict]) -> str:
        for pod in pods:
            if found := waiting(pod):
                fix = POD_FIXES.get(found[1], "kubectl describe pod for the reason")
                return f"; pod {pod['metadata']['name']}: {found[1]} — {fix}"
            if (message := unschedulable(pod)) is not None:
                return f"; pod {pod['metadata']['name']} unschedulable: {message}"
        return ""

    # --- doctor -------------------------------------------------------------------------------------------------------
    def doctor(self, ctx) -> list[Check]:
        """Day 2: the step's own check (Deployment rolled out, leader lease fresh), then the GPU pods that name the
        scheduler and still wait: with no live scheduler they wait forever (fail); a live one that never looked at
        a pod is stuck (fail); pods it found no room for are reported with its reason (warn)."""
        check = self.check(ctx)
        if check.status == FAIL:
            return [check]
        alive = check.status == PASS or self._running(ctx).status == PASS  # drift (a changed config) is not death
        extra = [found for found in (self._skew(ctx), self._outgrown(ctx)) if found]
        return [check, *extra, self._waiting_pods(ctx, alive)]

    def _outgrown(self, ctx) -> Check | None:
        """The running config scores every node, and the cluster grew past what that suits (render.outgrown)."""
        import yaml
        settings = ctx.config.scheduler
        live = ctx.kube.get("v1", "ConfigMap", f"{settings.name}-config", settings.namespace)
        text = ((live or {}).get("data") or {}).get(render.CONFIG_FILE)
        if not text:
            return None
        try:
            percentage = (yaml.safe_load(text) or {}).get("percentageOfNodesToScore")
        except yaml.YAMLError:
            return None  # not ours to judge: the drift check above names a changed config
        nodes = render.nodes_to_plan_for(ctx.kube.list("v1", "Node"), ctx.config.pools)
        problem = render.outgrown(settings, percentage, nodes)
        return Check(WARN, problem) if problem else None

    def _skew(self, ctx) -> Check | None:
        """The running scheduler's version against the API server's (after a cluster upgrade it lags until the next
        `up`): a skew the policy forbids fails, naming both versions and the fix; one minor behind warns. None when
        the minors match or no versioned image runs."""
        settings = ctx.config.scheduler
        deploy = ctx.kube.get("apps/v1", "Deployment", settings.name, settings.namespace)
        containers = (((deploy or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
        image = next((c.get("image") or "" for c in containers if c.get("name") == "kube-scheduler"), "")
        running = _image_version(image)
        if running is None:
            return None
        server = ctx.server_version()
        problem = skew_problem("kube-scheduler", running, server)
        if not problem:
            if minor_of(running) == minor_of(server):
                return None  # the usual case: nothing to say
            return Check(WARN, f"kube-scheduler {running} is one minor older than the API server {server} (the skew "
                               f"policy allows it); gpu-bootstrap up rolls it to {render.image(settings, server)}")
        if settings.image_tag:
            fix = (f"scheduler.image_tag pins {settings.image_tag}: set a v{minor_text(minor_of(server))}.x tag (or "
                   f"remove it to follow the server), then run gpu-bootstrap up")
        else:
            fix = f"run gpu-bootstrap up, which rolls it to {render.image(settings, server)}"
        return Check(FAIL, f"{problem}; the skew policy allows the server's minor or one older, and a scheduler "
                           f"outside it may schedule nothing. Fix: {fix}")

    def _waiting_pods(self, ctx, alive: bool) -> Check:
        name = ctx.config.scheduler.name
        pods = [p for p in ctx.kube.list("v1", "Pod", field_selector=f"spec.schedulerName={name},status.phase=Pending")
                if not (p.get("spec") or {}).get("nodeName") and not p["metadata"].get("deletionTimestamp")]
        if not pods:
            return Check(PASS, f"no pod waits for {name}")
        shown = ", ".join(f"{p['metadata'].get('namespace')}/{p['metadata']['name']}" for p in pods[:3]) + \
            (f" and {len(pods) - 3} more" if len(pods) > 3 else "")
        if not alive:
            return Check(FAIL, f"{len(pods)} pod(s) wait for {name}, which is not running: {shown}")
        unseen = [p for p in pods if unschedulable(p) is None and _age_seconds(p) > STUCK_AFTER]
        if unseen:
            return Check(FAIL, f"{name} holds its lease but has not looked at {len(unseen)} pod(s) waiting over "
                               f"{STUCK_AFTER} s (is it stuck? read its log): {shown}")
        reason = next((unschedulable(p) for p in pods if unschedulable(p)), "")
        return Check(WARN, f"{len(pods)} pod(s) wait for {name}: {shown}" + (f"; it says: {reason}" if reason else ""))

    # --- undo ---------------------------------------------------------------------------------------------------------
    def made_while_running(self, ctx) -> list[dict]:
        """The scheduler's leader-election Lease, which it takes once it runs."""
        settings = ctx.config.scheduler
        return [{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": settings.lease, "namespace": settings.namespace}}]

    def undo_plan(self, ctx) -> list[Change]:
        settings = ctx.config.scheduler
        owned = self._owned(ctx, exclude=set())
        changes = [Change(Verb.DELETE, ref, "remove", "teardown of the bin-packing scheduler")
                   for ref in reversed(owned)]
        if ctx.kube.get("coordination.k8s.io/v1", "Lease", settings.lease, settings.namespace) is not None:
            changes.append(Change(Verb.DELETE, Ref("coordination.k8s.io/v1", "Lease", settings.lease,
                                                   settings.namespace), "remove",
                                  "the scheduler's leader election lease"))
        return changes

    def undo_leaves(self, ctx, changes: list[Change]) -> list[str]:
        """Pods not yet scheduled that name this scheduler (in their own spec, or steered to it by our admission):
        once its Deployment is gone nothing schedules them, and they stay Pending for good."""
        if not any(c.verb == Verb.DELETE and c.target.kind == "Deployment" for c in changes):
            return []
        name = ctx.config.scheduler.name
        try:
            pods = ctx.kube.list("v1", "Pod", field_selector=f"spec.schedulerName={name},spec.nodeName=")
        except GpuBootstrapError as error:  # unknown is not none: say that it could not be told
            return [f"could not tell whether pods wait for {name} ({error.one_line()}); kubectl get pods -A "
                    f"--field-selector spec.schedulerName={name},spec.nodeName= lists them"]
        pending = sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods
                         if not (p.get("metadata") or {}).get("deletionTimestamp")
                         and (p.get("status") or {}).get("phase", "Pending") == "Pending")
        if not pending:
            return []
        shown = ", ".join(pending[:5]) + (f" and {len(pending) - 5} more" if len(pending) > 5 else "")
        return [f"{len(pending)} pending pod(s) name {name} ({shown}): once it is removed nothing schedules them and "
                f"they stay Pending; delete them, or recreate them without spec.schedulerName (it may be in their "
                f"owner's template), or keep the scheduler: teardown --skip binpack-scheduler"]


def rbac_needs(config) -> dict:
    own_config, leader_election = f"{config.scheduler.name}-config", f"{config.scheduler.name}-leader-election"
    return {
        # check reads the pods and the leader Lease once nothing drifts (found on a real cluster: a dry run of an
        # up-to-date cluster was refused `list pods` in kube-system)
        READ: [need("", "serviceaccounts configmaps", "get list", "scheduler"),
               need("", "configmaps", "get", "scheduler", (own_config,),
                    why="binpack-scheduler: its own config (the plan role reads it by name only)"),
               need("", "pods", "list", "scheduler"), need("coordination.k8s.io", "leases", "get", "scheduler"),
               need("apps", "deployments", "get list", "scheduler"),
               need("policy", "poddisruptionbudgets", "get list", "scheduler"),
               need("rbac.authorization.k8s.io", "roles rolebindings", "get list", "scheduler"),
               need("rbac.authorization.k8s.io", "clusterrolebindings", "get list"), need("", "nodes", "list"),
               need("resource.k8s.io", "deviceclasses", "list",
                    why="binpack-scheduler: does a DRA DeviceClass serve nvidia.com/gpu?")],
        WRITE: [need("", "serviceaccounts configmaps", APPLY, "scheduler"),
                need("apps", "deployments", APPLY, "scheduler"),
                need("policy", "poddisruptionbudgets", APPLY, "scheduler"),
                need("rbac.authorization.k8s.io", "roles rolebindings", APPLY, "scheduler"),
                need("rbac.authorization.k8s.io", "clusterrolebindings", APPLY),
                # binding the system roles kube-scheduler runs with, and making the leader-election Role: RBAC's
                # escalation checks ask for `bind` (and `escalate`) on exactly those, by name
                need("rbac.authorization.k8s.io", "clusterroles", "bind", CLUSTER,
                     ("system:kube-scheduler", "system:volume-scheduler")),
                need("rbac.authorization.k8s.io", "roles", "bind", "kube-system",
                     ("extension-apiserver-authentication-reader",)),
                need("rbac.authorization.k8s.io", "roles", "bind escalate", "scheduler", (leader_election,))],
        RUN: [need("", "serviceaccounts configmaps", "delete", "scheduler"),
              need("apps", "deployments", "delete", "scheduler"), need("", "pods", "list", "scheduler"),
              need("", "pods", "list", why="binpack-scheduler: teardown names the pending pods that name it, in "
                                           "every namespace, before it removes it"),
              need("coordination.k8s.io", "leases", "get", "scheduler")],
        DOCTOR: [need("", "pods", "list"), need("", "pods", "list", "scheduler"),
                 need("coordination.k8s.io", "leases", "get", "scheduler")]}


DECLARATION = declare(
    BinpackScheduler, section="scheduler", enabled=lambda config: config.scheduler.enabled, needs=rbac_needs,
    summary="deploys a second, leader-elected kube-scheduler whose profile packs GPU pods onto as few nodes as "
            "possible (`spec.schedulerName: gpu-binpack-scheduler`), with the config version and image that fit your "
            "cluster, a profile for its scoring generation (up to 1.35, 1.36+) and, above 1,500 nodes, "
            "kube-scheduler's adaptive share of nodes scored")
