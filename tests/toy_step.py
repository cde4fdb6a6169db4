"""A toy step for tests that insert a step into the playbook: it applies one ConfigMap of ours in the tool's own
namespace (a unit of plain manifests in an export, a folder in a render) and removes it on teardown. Registered
for one test by `inserted()` (or the session, GPU_BOOTSTRAP_TOY_STEP_AT), never shipped."""
from __future__ import annotations

import contextlib
from pathlib import Path

import yaml
from pydantic import Field

from gpu_bootstrap.core.config.fields import Section

from gpu_bootstrap.core.objects import STATE_NAMESPACE
from gpu_bootstrap.pipeline.step import PASS, Change, Check, Ref, Step, Verb, declare
from gpu_bootstrap.security.rbac_rules import APPLY, READ, RUN, WRITE, need

TOY = "toy-labels"
NAME = "gpu-bootstrap-toy"
# the steps this version ships, in order (read from the file: GPU_BOOTSTRAP_TOY_STEP_AT changes what the tool loads)
SHIPPED = tuple(yaml.safe_load((Path(__file__).resolve().parents[1] / "playbooks" / "default.yaml").read_text())
                ["steps"])
# The steps the tests that list a run's steps were written for. Such a test ignores any other step: one a contributor
# adds (with tests of its own) or the toy, wherever it is inserted. Test data, not a product list: the product's
# lists come from the steps' declarations (tests/test_step_declarations.py).
WRITTEN_FOR = ("preflight", "node-prep", "gpu-pools", "monitoring", "gpu-operator", "binpack-scheduler",
               "admission-opa", "admission", "validate")


def written_for(ids):
    """The items of `ids` (step ids) that name a step these tests were written for (WRITTEN_FOR): a test of those
    steps ignores a step added or inserted beside them."""
    return [i for i in ids if i in WRITTEN_FOR]


class ToyConfig(Section):
    """The toy's own config section (`toy_labels:`), which the config gains from its declaration."""
    note: str = Field("toy", description="what the toy ConfigMap says")


class Toy(Step):
    id = TOY
    title = "A toy step (tests only)"

    def inputs(self, ctx) -> dict:
        return {"nodes": sorted(n.name for n in ctx.config.nodes), "note": DECLARATION.settings(ctx.config).note}

    def wanted(self, ctx) -> dict:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": NAME, "namespace": STATE_NAMESPACE,
                             "labels": {"app.kubernetes.io/managed-by": "gpu-bootstrap"}},
                "data": {"nodes": ",".join(self.inputs(ctx)["nodes"]), "note": self.inputs(ctx)["note"]}}

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


DECLARATION = declare(Toy, summary="a toy step (tests only)", section="toy_labels", model=ToyConfig,
                      needs=lambda config: {READ: [need("", "configmaps", "get", "state")],
                                            WRITE: [need("", "configmaps", APPLY, "state")],
                                            RUN: [need("", "configmaps", "delete", "state")]})


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
    monkeypatch.setitem(steps.ELSEWHERE, TOY, "tests.toy_step")
    yield
