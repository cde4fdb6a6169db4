"""node-prep: taint the GPU nodes so ordinary pods stay off, and label them so GPU workloads can find them."""
from __future__ import annotations

from dataclasses import dataclass

from gpu_bootstrap.core.objects import pin_resource_version, room_for_platform
from gpu_bootstrap.pipeline.step import FAIL, PASS, WARN, Change, Check, Ref, Step, Verb, declare
from gpu_bootstrap.security.rbac_rules import READ, WRITE, need
from gpu_bootstrap.render import node_prep as render


@dataclass(frozen=True)
class NodePrepFacts:
    nodes: dict  # configured node name -> the Node as read


def gpu_taint(config, playbook) -> dict | None:
    """The taint the GPU nodes carry once this playbook ran (None: node-prep does not taint them)."""
    section = config.node_prep
    if not (section.enabled and section.taint and "node-prep" in playbook):
        return None
    return section.taint.as_taint()


def no_room_warning(nodes: list[dict], config, playbook) -> str | None:
    """Said when tainting the GPU nodes leaves no node for the platform's own pods."""
    taint = gpu_taint(config, playbook)
    if taint is None or room_for_platform(nodes, {n.name for n in config.nodes}, taint) != []:
        return None  # room, or unknown (which is not "no room")
    return (f"tainting the GPU nodes leaves no untainted, schedulable, Ready node: the gpu-operator's control plane "
            f"(operator, NFD master and gc) and the bin-packing scheduler get a toleration for {config.node_prep.taint} "
            f"so that they can run on the GPU nodes")


def untolerating_pods(config, playbook) -> str:
    """What happens to a GPU pod that does not tolerate the GPU taint (most GPU pods as users write them)."""
    taint = config.node_prep.taint
    admission = config.admission
    if admission.enabled and "admission" in playbook and admission.mode == "mutate":
        return f"GPU pods that do not tolerate {taint} get the toleration from admission (mode mutate)"
    why = "admission is off" if not admission.enabled or "admission" not in playbook else \
        "admission mode enforce adds nothing"
    return (f"GPU pods that do not tolerate {taint} stay Pending ({why}): add the toleration to them, use "
            f"admission.mode: mutate, or enable the API server's ExtendedResourceToleration plugin (kubeadm does not)")


class NodePrep(Step):
    id = "node-prep"
    title = "Taint and label GPU nodes"


    @staticmethod
    def labels_and_taint(config) -> tuple[dict, dict | None]:
        return render.labels_and_taint(config.node_prep)

    def inputs(self, ctx) -> dict:
        labels, taint = self.labels_and_taint(ctx.config)
        return {"nodes": sorted(n.name for n in ctx.config.nodes), "labels": labels, "taint": taint}

    def check(self, ctx) -> Check:
        labels, taint = self.labels_and_taint(ctx.config)
        nodes, missing, pending = {}, [], []
        for configured in ctx.config.nodes:
            node = ctx.kube.get("v1", "Node", configured.name)
            if node is None:
                missing.append(configured.name)
                continue
            nodes[configured.name] = node
            if render.prepare_patch(node, labels, taint) is not None:
                pending.append(configured.name)
        facts = NodePrepFacts(nodes)
        if not ctx.config.nodes:  # `nodes: <selector>` and no node matches yet
            return Check(PASS, f"no node matches nodes: {ctx.config.node_selector} yet (nodes launched from `pools` "
                               f"arrive with the taint and labels)", done=True, facts=facts)
        everything = ctx.kube.list("v1", "Node")
        warnings = [w for w in [no_room_warning(everything, ctx.config, ctx.options.playbook)] if w]
        if missing:
            known = sorted(n["metadata"]["name"] for n in everything)
            return Check(FAIL, f"node(s) {', '.join(missing)} not found in the cluster (it has: "
                               f"{', '.join(known[:10]) or 'no nodes'}{' ...' if len(known) > 10 else ''}); fix "
                               f"`nodes` in the config", facts=facts)
        if pending:
            why = f"; {untolerating_pods(ctx.config, ctx.options.playbook)}" if taint else ""
            return Check(WARN, f"{len(pending)} of {len(nodes)} GPU node(s) need taint/labels: {', '.join(pending)}"
                               f"{why}", facts=facts, warnings=warnings)
        return Check(WARN if warnings else PASS, f"{len(nodes)} GPU node(s) tainted and labelled", done=True,
                     facts=facts, warnings=warnings)

    def plan(self, ctx, check: Check) -> list[Change]:
        labels, taint = self.labels_and_taint(ctx.config)
        changes = []
        for name, node in check.facts.nodes.items():
            patch = render.prepare_patch(node, labels, taint)
            if patch is not None:
                changes.append(Change(Verb.PATCH, Ref.node(name), render.describe(patch),
                                      "the node lacks the wanted GPU taint/labels", pin_resource_version(patch, node)))
        return changes

    def undo_plan(self, ctx) -> list[Change]:
        changes = []
        for configured in ctx.config.nodes:
            node = ctx.kube.get("v1", "Node", configured.name)
            patch = render.undo_patch(node) if node else None
            if patch is not None:
                changes.append(Change(Verb.PATCH, Ref.node(configured.name), render.describe(patch),
                                      "remove what node-prep added", pin_resource_version(patch, node)))
        return changes


DECLARATION = declare(
    NodePrep, section="node_prep", enabled=lambda config: config.node_prep.enabled,
    summary="taints GPU nodes `nvidia.com/gpu=present:NoSchedule` so ordinary pods stay off, labels them "
            "`nvidia.com/gpu.present=true` (plus your labels)",
    needs=lambda config: {READ: [need("", "nodes", "get list")], WRITE: [need("", "nodes", "patch")]})
