"""A toy step for tests that insert a step into the playbook: it applies one ConfigMap of ours in the tool's own
namespace (a unit of plain manifests in an export, a folder in a render) and removes it on teardown. Registered
for one test by `inserted()`, never shipped."""
from __future__ import annotations

import contextlib
from pathlib import Path

import yaml

from gpu_bootstrap.core.objects import STATE_NAMESPACE
from gpu_bootstrap.pipeline.step import PASS, Change, Check, Ref, Step, Verb

TOY = "toy-labels"
NAME = "gpu-bootstrap-toy"
# the steps this version ships, in order (read from the file: GPU_BOOTSTRAP_TOY_STEP_AT changes what the tool loads)
SHIPPED = tuple(yaml.safe_load((Path(__file__).resolve().parents[1] / "playbooks" / "default.yaml").read_text())
                ["steps"])


def shipped(ids):
    """The items of `ids` (step ids) that name a step this version ships: a test of those steps ignores a step a
    contributor inserted."""
    return [i for i in ids if i in SHIPPED]


class Toy(Step):
    id = TOY
    title = "A toy step (tests only)"

    def inputs(self, ctx) -> dict:
        return {"nodes": sorted(n.name for n in ctx.config.nodes)}

    def wanted(self, ctx) -> dict:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": NAME, "namespace": STATE_NAMESPACE,
                             "labels": {"app.kubernetes.io/managed-by": "gpu-bootstrap"}},
                "data": {"nodes": ",".join(self.inputs(ctx)["nodes"])}}

    def check(self, ctx) -> Check:
        live = ctx.kube.get("v1", "ConfigMap", NAME, STATE_NAMESPACE)
        wanted = self.wanted(ctx)
        done = live is not None and live.get("data") == wanted["data"]
        return Check(PASS, "the toy ConfigMap is there" if done else "the toy ConfigMap is missing", done=done,
                     facts=wanted)

    def plan(self, ctx, check: Check) -> list[Change]:
        obj = check.facts
        return [] if check.done else [Change(Verb.APPLY, Ref.of(obj), "create", "the toy step", obj)]

    def undo_plan(self, ctx) -> list[Change]:
        if ctx.kube.get("v1", "ConfigMap", NAME, STATE_NAMESPACE) is None:
            return []
        return [Change(Verb.DELETE, Ref("v1", "ConfigMap", NAME, STATE_NAMESPACE), "remove", "teardown")]


def playbook_with_toy(folder: Path, position: int | None) -> Path:
    """The shipped default playbook with the toy step inserted at `position` (0: first; -1: last)."""
    steps = list(SHIPPED)
    if position is not None:  # None: the shipped playbook as it is
        steps.insert(len(steps) if position == -1 else position, TOY)
    path = folder / (f"toy-at-{position}.yaml" if position is not None else "shipped.yaml")
    path.write_text(yaml.safe_dump({"name": "with-toy", "steps": steps}))
    return path


@contextlib.contextmanager
def inserted(monkeypatch):
    """The toy step known to the step registry for the test's duration."""
    from gpu_bootstrap import steps
    monkeypatch.setitem(steps.REGISTRY, TOY, "tests.toy_step:Toy")
    yield
