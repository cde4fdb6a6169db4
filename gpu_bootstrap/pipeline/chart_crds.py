"""The CRD changes a chart step plans before its release change (render/crds.py decides; this reads the cluster and
the chart). On a first install with none of the chart's CRDs in the cluster, helm installs `crds/` itself and nothing
is planned here; on an upgrade, or over CRDs an earlier install left (another chart, a manual apply), every CRD the
chart brings is compared and the newer ones applied first, so the release's values are not pruned. Missing CRDs are
created here only on an upgrade (helm's install creates them, so a first install interrupted after helm's first CRD
converges to exactly what an uninterrupted one leaves)."""
from __future__ import annotations

from gpu_bootstrap.pipeline.step import Change, Ref, Verb
from gpu_bootstrap.render import crds as render


def plan_crds(ctx, chart, chart_version: str, release: dict,
              groups: tuple[str, ...]) -> render.CrdPlan:
    """`release`: the step's release state (installed, pending); `groups`: the API groups the chart's CRDs belong to
    (so a first install into a cluster without any of them needs no `helm show crds`). CRDs missing from the cluster
    are created here only on an upgrade of a deployed release (helm's install, and the install after a recovery,
    create `crds/` themselves)."""
    upgrading = bool(release.get("installed")) and not release.get("pending")
    present = {crd["metadata"]["name"]: crd for crd in ctx.kube.list(render.API_VERSION, render.KIND)
               if (crd.get("spec") or {}).get("group") in groups}
    if not upgrading and not present:
        return render.CrdPlan()
    chart_crds = ctx.helm.show_crds(chart)
    plan = render.compare(chart_crds, {c["metadata"]["name"]: present.get(c["metadata"]["name"])
                                       for c in chart_crds}, chart_version)
    if not upgrading:
        plan.changes = [change for change in plan.changes if not change.create]
    return plan


def crd_changes(plan: render.CrdPlan | None, chart_label: str) -> list[Change]:
    """Server-side applies (field manager gpu-bootstrap, conflicts forced), one per CRD, in the chart's order
    (None: the CRDs were not read, e.g. attach mode)."""
    return [Change(Verb.APPLY, Ref(render.API_VERSION, render.KIND, change.name),
                   "create" if change.create else "upgrade",
                   f"{change.summary} — before the {chart_label} release, so that its values are not pruned",
                   change.body) for change in (plan.changes if plan else [])]
