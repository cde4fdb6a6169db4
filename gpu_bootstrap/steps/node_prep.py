"""node-prep: taint the GPU nodes so ordinary pods stay off, and label them so GPU workloads can find them."""
from __future__ import annotations

from ..pipeline.step import FAIL, PASS, WARN, Change, Check, Step, Target
from ..render import node_prep as render


class NodePrep(Step):
    id = "node-prep"
    title = "Taint and label GPU nodes"

    def enabled(self, ctx) -> bool:
        return ctx.config.node_prep.enabled

    def _wanted(self, ctx) -> tuple[dict, dict | None]:
        section = ctx.config.node_prep
        return section.wanted_labels(), section.taint.as_taint() if section.taint else None

    def inputs(self, ctx) -> dict:
        labels, taint = self._wanted(ctx)
        return {"nodes": sorted(n.name for n in ctx.config.nodes), "labels": labels, "taint": taint}

    def check(self, ctx) -> Check:
        labels, taint = self._wanted(ctx)
        nodes, missing, pending = {}, [], []
        for configured in ctx.config.nodes:
            node = ctx.kube.get("v1", "Node", configured.name)
            if node is None:
                missing.append(configured.name)
                continue
            nodes[configured.name] = node
            if render.prepare_patch(node, labels, taint) is not None:
                pending.append(configured.name)
        if missing:
            known = sorted(n["metadata"]["name"] for n in ctx.kube.list("v1", "Node"))
            return Check(FAIL, f"node(s) {', '.join(missing)} not found in the cluster (it has: "
                               f"{', '.join(known[:10]) or 'no nodes'}{' ...' if len(known) > 10 else ''}); fix "
                               f"`nodes` in the config", facts={"nodes": nodes})
        if pending:
            return Check(WARN, f"{len(pending)} of {len(nodes)} GPU node(s) need taint/labels: {', '.join(pending)}",
                         facts={"nodes": nodes})
        return Check(PASS, f"{len(nodes)} GPU node(s) tainted and labelled", done=True, facts={"nodes": nodes})

    def plan(self, ctx, check: Check) -> list[Change]:
        labels, taint = self._wanted(ctx)
        changes = []
        for name, node in check.facts["nodes"].items():
            patch = render.prepare_patch(node, labels, taint)
            if patch is None:
                continue
            if node["metadata"].get("resourceVersion"):
                # Optimistic concurrency: if the node changed since we read it, the API answers 409 and the
                # runner re-reads and re-plans instead of overwriting someone's taints.
                patch.setdefault("metadata", {})["resourceVersion"] = node["metadata"]["resourceVersion"]
            changes.append(Change("patch", Target("Node", name, api_version="v1"), render.describe(patch),
                                  "the node lacks the wanted GPU taint/labels", patch))
        return changes

    def undo_plan(self, ctx) -> list[Change]:
        changes = []
        for configured in ctx.config.nodes:
            node = ctx.kube.get("v1", "Node", configured.name)
            patch = render.undo_patch(node) if node else None
            if patch is None:
                continue
            if node["metadata"].get("resourceVersion"):
                patch["metadata"]["resourceVersion"] = node["metadata"]["resourceVersion"]
            changes.append(Change("patch", Target("Node", configured.name, api_version="v1"),
                                  render.describe(patch), "remove what node-prep added", patch))
        return changes
