"""What a fresh `up` of a config leaves on a cluster, without one: the offline plan's recorded changes made into a
cluster (adapters/after_up.py), with what the installed components make while they run and the tool's own state.
`teardown --dry-run --offline` runs the steps' teardown plan on it; scripts/generate-docs lists it in
docs/what-up-changes.md.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class FreshUp:
    submitted: list  # (step id, Change) as the gate recorded them, in order
    version: str  # the Kubernetes version planned for
    kube: object  # adapters.after_up.AfterUpKube
    helm: object  # adapters.after_up.AfterUpHelm
    notes: list[str]  # what could not be known (a chart helm could not render)


def fresh_up(options, config, build, reporter) -> FreshUp:
    """Plan a fresh install offline (as `up --dry-run --offline`) and make the cluster it leaves. `build`: app.commands'
    (options, reporter, config=) -> (ctx, runner, playbook); `reporter` hears nothing of it (a LogReporter)."""
    from gpu_bootstrap.adapters import after_up
    plan = dataclasses.replace(options, dry_run=True, offline=True, render_dir=None, purge_crds=False, json=False)
    ctx, runner, _playbook = build(plan, reporter, config=config)
    try:
        runner.up()
        version = ctx.server_version()
        submitted = list(ctx.gate.submitted)
        kube, helm, notes = after_up.world(submitted, [n.name for n in config.nodes], version,
                                           render=lambda body: chart_objects(ctx, body, version),
                                           stateless={s.id for s in runner.steps if s.stateless})
    finally:
        ctx.close()
    return FreshUp(submitted, version, kube, helm, notes)


def chart_objects(ctx, body: dict, version: str) -> list[dict]:
    """A release's chart as `helm template` renders it with the plan's values (CRDs included)."""
    import yaml
    from gpu_bootstrap.adapters.helm import _CrdLoader
    from gpu_bootstrap.core.refs import Chart
    chart = body["chart"]
    text = ctx.helm.template(body["release"], Chart(chart["ref"], chart.get("repo"), chart.get("version")),
                             body.get("values") or {}, body["namespace"], version, include_crds=True)
    return [d for d in yaml.load_all(text, Loader=_CrdLoader) if isinstance(d, dict) and d.get("kind")]


def add_running_and_state(kube, steps, ctx) -> list[dict]:
    """Into the world: what each step's components make once running (Step.made_while_running), and the tool's
    own namespace, checkpoint, key and lock. Returns what was added."""
    from gpu_bootstrap.pipeline import checkpoint as cp
    from gpu_bootstrap.pipeline.lock import LEASE
    added = [obj for step in steps for obj in step.made_while_running(ctx)]
    added += [cp.namespace_manifest()]
    added += [{"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": cp.NAMESPACE}}
              for kind, name in (("ConfigMap", cp.NAME), ("Secret", cp.KEY_SECRET))]
    added += [{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": LEASE, "namespace": cp.NAMESPACE}}]
    for obj in added:
        kube.put(obj)
    return added
