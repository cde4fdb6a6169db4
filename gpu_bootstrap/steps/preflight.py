"""preflight: read every GPU node's facts (over SSH, through a cluster probe, or from --preflight-report) before
anything is installed.

The facts come from the context's node-facts source, read once per run and shared with later steps, which include
them in their fingerprints: a node whose driver or runtime changed makes exactly the steps that depend on it run
again. A node with a failing check stops `up` before any change.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from gpu_bootstrap.pipeline.step import FAIL, PASS, SKIP, WARN, Change, Check, Step, declare
from gpu_bootstrap.security.rbac_rules import RUN, need


def facts_digest(reports: dict) -> str:
    data = {name: {c.id: c.data for c in report.checks} for name, report in sorted(reports.items())}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PreflightFacts:
    reports: dict  # node name -> NodeReport
    source: str


def judge(reports: dict, source: str, why_none: str = "") -> Check:
    """Pure: the step's verdict on the node reports."""
    if not reports:
        return Check(SKIP, why_none or "no node facts", done=True)
    failures = [f"{name}: {c.id}: {c.message}" for name, r in reports.items() for c in r.checks if c.status == FAIL]
    if failures:
        return Check(FAIL, f"{len(failures)} node check(s) failed — " + "; ".join(failures))
    warnings = sum(1 for r in reports.values() for c in r.checks if c.status == WARN)
    note = f", {warnings} warning(s) (see 'gpu-bootstrap doctor')" if warnings else ""
    return Check(PASS, f"{len(reports)} GPU node(s) checked ({source}){note}", done=True,
                 facts=PreflightFacts(reports, source))


class Preflight(Step):
    id = "preflight"
    title = "Check GPU nodes (over SSH or a cluster probe)"
    reads_only = True
    revision = 2  # records the facts it read (runs that leave preflight out use them)

    def inputs(self, ctx) -> dict:
        return {"nodes": [n.model_dump(mode="json") for n in ctx.config.nodes],
                "facts": facts_digest(ctx.node_facts.reports())}

    def verify(self, ctx) -> Check:
        source = ctx.node_facts  # the record is written after verification (runner), so it is not asked for here
        return judge(source.reports(), source.source, getattr(source, "why", ""))

    def check(self, ctx) -> Check:
        verdict = self.verify(ctx)
        if verdict.done and verdict.facts is not None and (why := self._record_stale(ctx, verdict.facts.reports)):
            verdict.done = False  # read again, so recorded again (a plan of no change: the step writes its record)
            verdict.message += f"; the recorded facts are renewed: {why}"
        return verdict

    @staticmethod
    def _record_stale(ctx, reports: dict) -> str | None:
        """Why the facts read now must be recorded again (none recorded, changed, or past half their allowed age),
        or None; None too where the run's facts source keeps no record (it answers False)."""
        import time
        from gpu_bootstrap.core.config.fields import parse_age
        from gpu_bootstrap.probes.recorded import record_stale
        recorded = getattr(ctx.node_facts, "recorded_now", lambda: False)()
        if recorded is False:
            return None
        return record_stale(recorded, reports, time.time(), parse_age(ctx.config.preflight.max_facts_age))

    def plan(self, ctx, check: Check) -> list[Change]:
        return []  # preflight only reads

    def record(self, ctx, check: Check) -> dict | None:
        if check.facts is None:
            return None
        from gpu_bootstrap.pipeline.checkpoint import now
        from gpu_bootstrap.probes.report import record_manifest
        return record_manifest(check.facts.reports, check.facts.source, now())

    def undo_plan(self, ctx) -> list[Change]:
        """Probe namespaces a killed cluster probe left behind (a run removes its own on every other exit path)."""
        from gpu_bootstrap.probes.incluster import SELECTOR
        from gpu_bootstrap.core.refs import Ref, Verb
        return [Change(Verb.DELETE, Ref("v1", "Namespace", ns["metadata"]["name"]), "remove",
                       "left by an interrupted cluster probe")
                for ns in ctx.kube.list("v1", "Namespace", label_selector=SELECTOR)
                if not ns["metadata"].get("deletionTimestamp")]

    def doctor(self, ctx) -> list[Check]:
        return []  # its findings are the doctor's node section


DECLARATION = declare(
    Preflight, section="preflight",
    summary="reads every GPU node over SSH (all at once): NVIDIA driver and GPUs, nouveau, container runtime and its "
            "real config path (k3s, rke2, microk8s, k0s, CRI-O, docker), NVIDIA container toolkit; stops `up` on a "
            "failing node before anything changes",
    needs=lambda config: {RUN: [need("", "configmaps", "create patch", "state",
                                     why="preflight: the saved node facts (its report)")]})
