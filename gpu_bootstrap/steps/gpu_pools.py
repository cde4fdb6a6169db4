"""gpu-pools: a Karpenter NodePool and node class (EC2NodeClass on AWS, KWOKNodeClass on KWOK) per configured pool,
so GPU nodes that do not exist yet arrive with node-prep's taint and labels (no SSH, no window in which ordinary pods land on them).

The Karpenter API is read from discovery: the manifests are Karpenter v1's, and a cluster without Karpenter's v1 CRDs
is refused with what to do (a plan without a cluster renders them anyway, saying it could not check). With no pools
configured the step does nothing (pools it created earlier are removed). Objects it owns carry the managed-by and
component labels; teardown deletes those and nothing else (each NodePool before its node class).
"""
from __future__ import annotations

from gpu_bootstrap.core.errors import ClusterError, Unknown, Unreachable
from gpu_bootstrap.core.objects import differences
from gpu_bootstrap.pipeline.step import FAIL, PASS, SKIP, WARN, Change, Check, ObjectsFacts, Ref, Step, Verb, declare
from gpu_bootstrap.security.rbac_rules import APPLY, READ, RUN, WRITE, need
from gpu_bootstrap.render import gpu_pools as render
from gpu_bootstrap.render import node_prep as node_render
from gpu_bootstrap.core.objects import served

OLD_API = "v1beta1"  # Karpenter before 1.0


class GpuPools(Step):
    id = "gpu-pools"
    title = "Autoscaled GPU pools (Karpenter)"

    def inputs(self, ctx) -> dict:
        return {"pools": [p.model_dump(mode="json") for p in ctx.config.pools],
                "template": node_render.labels_and_taint(ctx.config.node_prep)}

    # --- reading the cluster ------------------------------------------------------------------------------------------
    def karpenter(self, ctx) -> str | None:
        """None when Karpenter's v1 API (and the node class of each cloud the pools use) is served; else why not (a
        sentence saying what to do)."""
        wanted = dict.fromkeys(kind for cloud in render.clouds_of(ctx.config) or ["aws"]
                               for kind in render.kinds(cloud=cloud))
        missing = [f"{kind} {api}" for api, kind in wanted if not served(ctx.kube, api, kind)]
        if not missing:
            return None
        old = [kind for api, kind in render.kinds(OLD_API) if served(ctx.kube, api, kind)]
        if old:
            return (f"this cluster runs a Karpenter older than 1.0 (it serves {', '.join(old)} in {OLD_API} only); "
                    f"gpu-pools writes Karpenter v1 objects: upgrade Karpenter to 1.x, or remove `pools` from the config")
        return (f"Karpenter's CRDs are not installed (the cluster serves no {' and no '.join(missing)}): install "
                f"Karpenter first (its chart installs them), or remove `pools` from the config")

    def check(self, ctx) -> Check:
        try:
            absent, unchecked = self.karpenter(ctx), None
        except Unknown as why:  # no cluster to ask (a plan made without one): render for Karpenter v1, and say so
            absent, unchecked = None, why.message
        if not ctx.config.pools:
            return self._without_pools(ctx, skip_reading=absent is not None)
        if absent:
            return Check(FAIL, absent)
        desired = render.manifests(ctx.config)
        drift, theirs = _drift(ctx.kube, desired)
        if theirs:
            return Check(FAIL, f"{', '.join(theirs)} exist(s) and gpu-bootstrap did not create them: give the pool "
                               f"another name in `pools` (only what gpu-bootstrap made is changed)")
        leftovers = self._owned(ctx, exclude={Ref.of(obj) for obj in desired})
        facts = ObjectsFacts(desired, drift, leftovers)
        if unchecked:
            return Check(WARN, _summary(drift, leftovers) + f" ({self._names(ctx)}); Karpenter's CRDs not checked "
                               f"({unchecked}): rendered for karpenter.sh/v1", facts=facts)
        if drift or leftovers:
            return Check(WARN, _summary(drift, leftovers) + f" ({self._names(ctx)})", facts=facts)
        return Check(PASS, f"{len(ctx.config.pools)} pool(s) in place ({self._names(ctx)})", done=True, facts=facts)

    def _without_pools(self, ctx, skip_reading: bool) -> Check:
        """No pools configured: nothing to do, unless pools we created earlier are still there."""
        leftovers = [] if skip_reading else self._owned(ctx, exclude=set())
        if not leftovers:
            return Check(SKIP, "no pools configured")
        return Check(WARN, f"{len(leftovers)} object(s) of pools no longer configured to remove",
                     facts=ObjectsFacts([], {}, leftovers))

    @staticmethod
    def _names(ctx) -> str:
        return ", ".join(f"{p.name}: {p.ami_family}" + (f" on {p.cloud}" if p.cloud != "aws" else "")
                         for p in ctx.config.pools)

    def _owned(self, ctx, exclude: set) -> list[Ref]:
        """Our NodePools, then our node classes of every cloud, that `exclude` does not list (the order undo deletes
        them in)."""
        found = []
        node_pool = render.kinds()[1]
        for api_version, kind in [node_pool, *(render.kinds(cloud=cloud)[0] for cloud in render.CLOUDS)]:
            try:
                items = ctx.kube.list(api_version, kind, label_selector=render.OWNED_SELECTOR)
            except Unreachable:
                raise
            except ClusterError as error:
                if error.status:  # we could not read: unknown is not "none"
                    raise
                continue  # the kind is not served: it holds nothing of ours
            found += [ref for obj in items if (ref := Ref.of({**obj, "apiVersion": api_version, "kind": kind}))
                      not in exclude]
        return found

    def plan(self, ctx, check: Check) -> list[Change]:
        pools = {p.name: p for p in ctx.config.pools}

        def details(ref: Ref) -> list[str]:
            pool = pools.get(ref.name)
            return render.explain(pool, ctx.config.node_prep) if ref.kind == "NodePool" and pool else []
        return check.facts.changes(details)

    def verify(self, ctx) -> Check:
        check = self.check(ctx)
        if check.status == SKIP:  # the pools no longer configured are gone
            return Check(PASS, "no pools configured (the earlier ones are removed)", done=True)
        return check

    # --- undo ---------------------------------------------------------------------------------------------------------
    def undo_plan(self, ctx) -> list[Change]:
        return [Change(Verb.DELETE, ref, "remove", "teardown of the autoscaled GPU pools (Karpenter drains and "
                                                   "terminates their nodes)") for ref in self._owned(ctx, set())]

    # --- doctor -------------------------------------------------------------------------------------------------------
    def doctor(self, ctx) -> list[Check]:
        check = self.check(ctx)
        if check.status in (FAIL, SKIP) or not ctx.config.pools:
            return [check]
        return [check, self._ready(ctx), self._pool_nodes(ctx), self._pending_pods(ctx)]

    def _ready(self, ctx) -> Check:
        api, kind = render.kinds()[1]
        not_ready = []
        for pool in ctx.config.pools:
            live = ctx.kube.get(api, kind, pool.name) or {}
            conditions = {c.get("type"): c for c in (live.get("status") or {}).get("conditions") or []}
            ready = conditions.get("Ready") or {}
            if ready.get("status") != "True":
                not_ready.append(f"{pool.name} ({ready.get('message') or 'Karpenter has not reported Ready'})")
        if not_ready:
            return Check(WARN, f"NodePool(s) not Ready: {'; '.join(not_ready)} — kubectl describe nodepool, and "
                               f"check its node class (on AWS: the EC2NodeClass's role, subnets, security groups)")
        return Check(PASS, f"{len(ctx.config.pools)} NodePool(s) Ready", done=True)

    def _pool_nodes(self, ctx) -> Check:
        """Every node launched from our pools carries node-prep's taint and labels."""
        labels, taint = node_render.labels_and_taint(ctx.config.node_prep)
        count, wrong = 0, []
        for pool in ctx.config.pools:
            for node in ctx.kube.list("v1", "Node", label_selector=f"karpenter.sh/nodepool={pool.name}"):
                count += 1
                have = (node.get("metadata") or {}).get("labels") or {}
                taints = (node.get("spec") or {}).get("taints") or []
                lacks = [f"{k}={v}" for k, v in labels.items() if have.get(k) != v]
                if taint is not None and not any(t.get("key") == taint["key"] and t.get("effect") == taint["effect"]
                                                 for t in taints):
                    lacks.append(f"taint {node_render.describe_taint(taint)}")
                if lacks:
                    wrong.append(f"{node['metadata']['name']} lacks {', '.join(lacks)}")
        if wrong:
            return Check(WARN, f"pool node(s) not prepared: {'; '.join(wrong)} — launched before the NodePool carried "
                               f"them? Karpenter replaces them as drifted")
        return Check(PASS, f"{count} pool node(s), all with node-prep's taint and labels", done=True)

    def _pending_pods(self, ctx) -> Check:
        """Karpenter provisions for pods a scheduler marked Unschedulable, whichever scheduler: a GPU pod pending on
        ours without that mark (our scheduler not running) or without the pools' toleration is never provisioned for."""
        scheduler = ctx.config.scheduler.name
        _, taint = node_render.labels_and_taint(ctx.config.node_prep)
        unseen, intolerant, waiting = [], [], 0
        for pod in ctx.kube.list("v1", "Pod", field_selector="status.phase=Pending"):
            spec = pod.get("spec") or {}
            if spec.get("schedulerName") != scheduler or spec.get("nodeName"):
                continue
            waiting += 1
            name = f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"
            marked = any(c.get("type") == "PodScheduled" and c.get("status") == "False" and
                         c.get("reason") == "Unschedulable" for c in (pod.get("status") or {}).get("conditions") or [])
            if not marked:
                unseen.append(name)
            elif taint is not None and not _tolerates(spec.get("tolerations") or [], taint):
                intolerant.append(name)
        problems = []
        if unseen:
            problems.append(f"{_some(unseen)} pending on {scheduler} but not marked Unschedulable, so Karpenter does "
                            f"not see them (is the binpack-scheduler running?)")
        if intolerant:
            problems.append(f"{_some(intolerant)} do not tolerate {node_render.describe_taint(taint)}, so no pool "
                            f"node can take them")
        if problems:
            return Check(WARN, "; ".join(problems))
        return Check(PASS, f"{waiting} GPU pod(s) pending on {scheduler}, all visible to Karpenter", done=True)


def _drift(kube, desired: list[dict]) -> tuple[dict, list[str]]:
    """How each wanted object differs from the cluster (Ref -> why), and those of the same name we did not create."""
    drift, theirs = {}, []
    for obj in desired:
        ref = Ref.of(obj)
        live = kube.get(ref.api_version, ref.kind, ref.name)
        if live is None:
            drift[ref] = "missing"
        elif not _ours(live):
            theirs.append(str(ref))
        elif paths := differences(obj, live):
            drift[ref] = "differs at " + ", ".join(paths[:3])
    return drift, theirs


def _ours(obj: dict) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in render.MANAGED.items())


def _tolerates(tolerations: list[dict], taint: dict) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") not in (None, "", taint["effect"]):
            continue
        if toleration.get("operator") == "Exists" and toleration.get("key") in (None, "", taint["key"]):
            return True
        if toleration.get("key") == taint["key"] and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _summary(drift: dict, leftovers: list) -> str:
    missing = sum(1 for why in drift.values() if why == "missing")
    counts = [(missing, "to create"), (len(drift) - missing, "to update"), (len(leftovers), "to remove")]
    return ", ".join(f"{n} object(s) {what}" for n, what in counts if n)


def rbac_needs(config) -> dict:
    kinds = (("karpenter.sh", "nodepools"), *((c.group, c.resource) for c in render.CLOUDS.values()))
    leftovers = {READ: [need(group, resource, "get list") for group, resource in kinds],
                 RUN: [need(group, resource, "delete") for group, resource in kinds]}
    if not config.pools:  # it still looks for pools of ours no longer configured, and removes them
        return leftovers
    used = {("karpenter.sh", "nodepools"), *((c.group, c.resource) for name, c in render.CLOUDS.items()
                                             if name in render.clouds_of(config))}
    return {READ: [*leftovers[READ], need("", "pods", "list")], RUN: leftovers[RUN],
            WRITE: [need(group, resource, APPLY) for group, resource in kinds if (group, resource) in used]}


DECLARATION = declare(
    # no switch: without `pools` it still runs, to remove the pools of ours no longer configured
    GpuPools, section="pools", needs=rbac_needs,
    summary="when `pools` is set: Karpenter v1 NodePools and their node classes (EC2NodeClass, KWOKNodeClass) whose "
            "nodes arrive with node-prep's taint and labels, never consolidated while they run GPU pods ([Autoscaled GPU pools](docs/steps/gpu-pools.md))")
