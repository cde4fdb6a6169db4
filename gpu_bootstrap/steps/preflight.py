"""preflight: read every GPU node's facts over SSH (or from --preflight-report) before anything is installed.

Later steps read the facts from ctx.facts["preflight"] and include them in their fingerprints, so a node whose
driver or runtime changed makes exactly the steps that depend on it run again. A node with a failing check stops
`up` before any change.
"""
from __future__ import annotations

import hashlib
import json

from ..pipeline.step import FAIL, PASS, SKIP, WARN, Check, Step


def node_facts(ctx) -> dict:
    """{node name: NodeReport}; gathered once per run (SSH, or the report file), then shared."""
    if "preflight" not in ctx.facts:
        names = [n.name for n in ctx.config.nodes]
        if ctx.preflight_report is not None:
            from ..probes import report
            ctx.facts["preflight"] = report.load(ctx.preflight_report, names)
            ctx.facts["preflight_source"] = str(ctx.preflight_report)
        elif ctx.offline:
            ctx.facts["preflight"] = {}
            ctx.facts["preflight_source"] = "none (offline)"
        else:
            from ..probes import probe_nodes
            reports = probe_nodes(ctx.ssh, names)
            ctx.facts["preflight"] = {r.name: r for r in reports}
            ctx.facts["preflight_source"] = "ssh"
    return ctx.facts["preflight"]


def facts_digest(reports: dict) -> str:
    data = {name: {c.id: c.data for c in report.checks} for name, report in sorted(reports.items())}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Preflight(Step):
    id = "preflight"
    title = "Check GPU nodes over SSH"

    def inputs(self, ctx) -> dict:
        return {"nodes": [n.model_dump(mode="json") for n in ctx.config.nodes],
                "facts": facts_digest(node_facts(ctx))}

    def check(self, ctx) -> Check:
        reports = node_facts(ctx)
        if not reports:
            return Check(SKIP, "no node facts in an offline run; pass --preflight-report FILE (a saved "
                               "'gpu-bootstrap doctor -o json') to plan with them", done=True)
        failures = [f"{name}: {c.id}: {c.message}" for name, r in reports.items() for c in r.checks
                    if c.status == FAIL]
        if failures:
            return Check(FAIL, f"{len(failures)} node check(s) failed — " + "; ".join(failures))
        warnings = sum(1 for r in reports.values() for c in r.checks if c.status == WARN)
        source = ctx.facts.get("preflight_source", "ssh")
        note = f", {warnings} warning(s) (see 'gpu-bootstrap doctor')" if warnings else ""
        return Check(PASS, f"{len(reports)} GPU node(s) checked ({source}){note}", done=True,
                     facts={"reports": reports})

    def plan(self, ctx, check: Check) -> list:
        return []  # preflight only reads

    def doctor(self, ctx) -> list[Check]:
        return []  # its findings are the doctor's node section

