"""validate: prove the GPUs work by running NVIDIA's CUDA vector-add sample on the GPU nodes, then clean up.

One pod per node (or a sample of nodes), pinned by the node's name (a required node affinity on the metadata.name
field, as the DaemonSet controller pins its pods: a node's kubernetes.io/hostname label need not be its name, and is
not on the nodes Karpenter's KWOK provider makes) so the scheduler still places it, tolerating the GPU taint and requesting one nvidia.com/gpu. It passes when every pod completes with the sample's
"Test PASSED". The record's fingerprint covers the operator's inputs, so it runs again after any change to them.

With gpu_operator.allocation: dra those pods get their GPU through the extended resource (the driver's DeviceClass
serves nvidia.com/gpu), as users' pods written for the device plugin do; one more pod, on the first node, gets its
GPU through a ResourceClaimTemplate, as DRA-native workloads ask: both ways must work.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from gpu_bootstrap.core import dra
from gpu_bootstrap.core.objects import served, unschedulable, waiting
from gpu_bootstrap.core.catalogue import locate, locate_pods, registry_inputs
from gpu_bootstrap.pipeline.step import FAIL, PASS, Change, Check, Ref, Step, Verb, declare
from gpu_bootstrap.security.rbac_rules import APPLY, DOCTOR, READ, RUN, WRITE, need
from gpu_bootstrap.security import pod_security
from gpu_bootstrap.steps.preflight import facts_digest

POD_PREFIX = "gpu-bootstrap-validate-"
CLAIM_POD_PREFIX = POD_PREFIX + "claim-"
CLAIM_TEMPLATE = "gpu-bootstrap-validate-gpu"
EXPECTED = "Test PASSED"
NODE_CHECK_INTERVAL = 5.0  # seconds between checks that the pending pods' nodes are still in the cluster
LABEL = {"app.kubernetes.io/name": "gpu-bootstrap-validate", "app.kubernetes.io/managed-by": "gpu-bootstrap"}


def pinned_to(node: str) -> dict:
    """The affinity that lets a pod onto `node` only, by the node's name (not its hostname label), through the
    scheduler (spec.nodeName would skip it, and admission refuses it on GPU pods)."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}


@dataclass(frozen=True)
class ValidateFacts:
    leftovers: tuple[str, ...]  # validation pods an earlier run left behind
    namespace: pod_security.NamespaceDecision | None = None  # where they run: created or labelled restricted if ours
    leftover_templates: tuple[str, ...] = ()  # and its ResourceClaimTemplates (allocation: dra)
    scheduler: str | None = None  # the scheduler the pods name (scheduler_name); None: the default one


class Validate(Step):
    id = "validate"
    title = "Run a CUDA workload on the GPU nodes"
    stateless = True  # the pods are removed after the run: only the record says it passed


    def namespaces(self, ctx) -> list[str]:
        return [ctx.config.validation.namespace]

    @staticmethod
    def nodes(config) -> list[str]:
        names = [n.name for n in config.nodes]
        choice = config.validation.nodes
        if choice == "all":
            return names
        return names[:1] if choice == "sample" else names[:max(1, int(choice))]

    @classmethod
    def claim_node(cls, config) -> str | None:
        """The node whose extra pod gets its GPU through a ResourceClaimTemplate: the first, in DRA mode."""
        nodes = cls.nodes(config)
        return nodes[0] if nodes and config.gpu_operator.allocation == "dra" else None

    def inputs(self, ctx) -> dict:
        return {"validate": ctx.config.validation.model_dump(mode="json"), "nodes": self.nodes(ctx.config),
                "operator": ctx.config.gpu_operator.model_dump(mode="json"),
                "facts": facts_digest(ctx.node_facts.reports()), "scheduler": self.scheduler_name(ctx),
                **registry_inputs(ctx.config)}

    @staticmethod
    def scheduler_name(ctx) -> str | None:
        """The bin-packing scheduler when this playbook deploys it and it runs (or this very run deploys it), so
        validation also proves it schedules; else the default one. A pod named for a scheduler that does not run
        (`up --only ...,validate` with the scheduler never deployed) would wait for good, as admission's steering
        would (admission_state.steering decides both)."""
        if "binpack-scheduler" not in ctx.options.playbook or not ctx.config.scheduler.enabled:
            return None
        from gpu_bootstrap.steps.admission_state import steering
        runs, _why = steering(ctx)
        return ctx.config.scheduler.name if runs else None

    def check(self, ctx) -> Check:
        # Nothing persists between runs (the pods are removed), so the record's fingerprint decides.
        leftovers = tuple(p["metadata"]["name"] for p in self._pods(ctx))
        namespace = ctx.config.validation.namespace
        decision = pod_security.decide(namespace, ctx.kube.get("v1", "Namespace", namespace), pod_security.RESTRICTED,
                                       "the validation pods pass it", "where the validation pods run")
        claim = self.claim_node(ctx.config)
        return Check(PASS, f"CUDA vector-add ({locate(ctx.config.validation.image, ctx.config.registry)}) on "
                           f"{len(self.nodes(ctx.config))} GPU node(s)"
                           + (f", and once through a ResourceClaimTemplate on {claim}" if claim else ""), done=True,
                     facts=ValidateFacts(leftovers, decision, tuple(self._templates(ctx)),
                                         self.scheduler_name(ctx)))

    def _pod_name(self, node: str) -> str:
        return (POD_PREFIX + node)[:63].rstrip("-.")

    @staticmethod
    def _claim_pod_name(node: str) -> str:
        return (CLAIM_POD_PREFIX + node)[:63].rstrip("-.")

    def _names(self, config) -> dict[str, str]:
        """Pod name -> what it proves, for every validation pod this configuration runs."""
        names = {self._pod_name(node): node for node in self.nodes(config)}
        if claim := self.claim_node(config):
            names[self._claim_pod_name(claim)] = f"{claim} (GPU from a ResourceClaim)"
        return names

    def _pod(self, ctx, node: str, scheduler: str | None, through_claim: bool = False) -> dict:
        taint = ctx.config.node_prep.taint
        tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        if taint is not None and taint.key != "nvidia.com/gpu":
            tolerations.append({"key": taint.key, "operator": "Exists", "effect": taint.effect})
        # The restricted Pod Security profile: the sample needs no root, no capability and no syscall beyond the
        # runtime's default (the device plugin hands it the GPU device files, readable by any user).
        spec = {"restartPolicy": "Never", "affinity": pinned_to(node),
                "tolerations": tolerations, "automountServiceAccountToken": False,
                "securityContext": pod_security.restricted_pod(),
                "containers": [{"name": "vectoradd", "image": ctx.config.validation.image,
                                "securityContext": pod_security.restricted_container(),
                                "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
        if through_claim:  # the GPU comes from the claim the template makes for this pod, not the extended resource
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": CLAIM_TEMPLATE}]
            spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
        if scheduler:
            spec["schedulerName"] = scheduler
        name = self._claim_pod_name(node) if through_claim else self._pod_name(node)
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": ctx.config.validation.namespace, "labels": dict(LABEL)},
               "spec": spec}
        return locate_pods([pod], ctx.config.registry)[0]  # the sample from registry.mirror, when set

    def plan(self, ctx, check: Check) -> list[Change]:
        namespace = ctx.config.validation.namespace
        changes = []
        if check.facts.namespace is not None and (parts := check.facts.namespace.change()):
            changes.append(Change(Verb.APPLY, Ref("v1", "Namespace", namespace), *parts))
        changes += self._removals(namespace, check.facts.leftovers, check.facts.leftover_templates)
        for node in self.nodes(ctx.config):
            changes.append(Change(Verb.CREATE, Ref("v1", "Pod", self._pod_name(node), namespace),
                                  f"run {ctx.config.validation.image} with 1 GPU on {node}",
                                  "prove that a CUDA workload runs there", self._pod(ctx, node, check.facts.scheduler)))
        if claim := self.claim_node(ctx.config):
            template = dra.gpu_claim_template(CLAIM_TEMPLATE, namespace, LABEL)
            changes.append(Change(Verb.CREATE, Ref(dra.API_VERSION, "ResourceClaimTemplate", CLAIM_TEMPLATE,
                                                   namespace),
                                  f"a claim template for 1 GPU of DeviceClass {dra.GPU_CLASS}",
                                  "the next pod asks for its GPU as DRA-native workloads do", template))
            changes.append(Change(Verb.CREATE, Ref("v1", "Pod", self._claim_pod_name(claim), namespace),
                                  f"run {ctx.config.validation.image} on {claim} with 1 GPU from a ResourceClaim",
                                  "prove that a GPU allocated through a claim runs CUDA",
                                  self._pod(ctx, claim, check.facts.scheduler, through_claim=True)))
        return changes

    @staticmethod
    def _pods(ctx) -> list[dict]:
        return ctx.kube.list("v1", "Pod", ctx.config.validation.namespace,
                             label_selector="app.kubernetes.io/name=gpu-bootstrap-validate")

    @staticmethod
    def _templates(ctx) -> list[str]:
        """Our ResourceClaimTemplates, wherever resource.k8s.io/v1 is served (also after a move back from DRA)."""
        namespace = ctx.config.validation.namespace
        if not served(ctx.kube, dra.API_VERSION, "ResourceClaimTemplate"):  # a failure to ask propagates
            return []
        return [t["metadata"]["name"] for t in ctx.kube.list(
            dra.API_VERSION, "ResourceClaimTemplate", namespace,
            label_selector="app.kubernetes.io/name=gpu-bootstrap-validate")]

    @staticmethod
    def _removals(namespace: str, names, templates=()) -> list[Change]:
        """Pods first: the claims made from a template belong to their pods and go with them."""
        return [Change(Verb.DELETE, Ref("v1", "Pod", name, namespace), "remove a validation pod",
                       "left over from an earlier run") for name in names] + \
            [Change(Verb.DELETE, Ref(dra.API_VERSION, "ResourceClaimTemplate", name, namespace),
                    "remove the validation claim template", "left over from an earlier run") for name in templates]

    def _leftovers(self, ctx) -> list[Change]:
        return self._removals(ctx.config.validation.namespace, [p["metadata"]["name"] for p in self._pods(ctx)],
                              self._templates(ctx))

    def verify(self, ctx) -> Check:
        namespace = ctx.config.validation.namespace
        deadline = time.monotonic() + ctx.config.validation.timeout
        pending = self._names(ctx.config)
        failures, passed = [], []
        next_node_check = time.monotonic() + NODE_CHECK_INTERVAL
        while pending and time.monotonic() < deadline:
            if time.monotonic() >= next_node_check:  # a node that left the cluster never runs its pod: say so now
                next_node_check = time.monotonic() + NODE_CHECK_INTERVAL
                failures += self._gone_nodes(ctx, pending)
            for name, node in list(pending.items()):
                pod = ctx.kube.get("v1", "Pod", name, namespace)
                phase = ((pod or {}).get("status") or {}).get("phase")
                if phase in ("Succeeded", "Failed"):
                    del pending[name]
                    log = ctx.kube.logs(namespace, name)
                    if phase == "Succeeded" and EXPECTED in log:
                        passed.append(node)
                    else:
                        tail = " / ".join(log.strip().splitlines()[-3:]) or "no output"
                        failures.append(f"{node}: {phase} ({tail})")
            if pending:
                time.sleep(1.0)
        for name, node in pending.items():
            failures.append(f"{node}: did not finish within {ctx.config.validation.timeout}s "
                            f"({self._why_pending(ctx, name, namespace)})")
        if failures:
            return Check(FAIL, "CUDA vector-add failed on " + "; ".join(failures))
        return Check(PASS, f"CUDA vector-add passed on {', '.join(sorted(passed))}", done=True)

    @staticmethod
    def _gone_nodes(ctx, pending: dict[str, str]) -> list[str]:
        """Failures for the pending pods whose node is no longer in the cluster (they are dropped from `pending`)."""
        failures = []
        for name, node in list(pending.items()):
            node_name = node.split(" ", 1)[0]  # "<node> (GPU from a ResourceClaim)" for the claim pod
            if ctx.kube.get("v1", "Node", node_name) is None:
                del pending[name]
                failures.append(f"{node}: the node left the cluster while its validation pod waited (kubectl get "
                                f"node {node_name}: not found)")
        return failures

    @staticmethod
    def _why_pending(ctx, name: str, namespace: str) -> str:
        pod = ctx.kube.get("v1", "Pod", name, namespace) or {}
        if (message := unschedulable(pod)) is not None:
            return f"unschedulable: {message}"
        if found := waiting(pod):
            return f"{found[1]}: {found[2]}".rstrip(": ")
        scheduler = (pod.get("spec") or {}).get("schedulerName")
        if pod and not (pod.get("spec") or {}).get("nodeName") and scheduler not in (None, "default-scheduler"):
            return f"no scheduler named {scheduler} has picked it up: is the binpack-scheduler step's Deployment running?"
        return (pod.get("status") or {}).get("phase", "not found")

    def cleanup_plan(self, ctx) -> list[Change]:
        return self._leftovers(ctx)

    def undo_plan(self, ctx) -> list[Change]:
        return self._leftovers(ctx)


def rbac_needs(config) -> dict:
    # claim templates: leftovers of a run in DRA mode are found and removed in either mode
    return {READ: [need("", "pods", "list", "validation"),
                   need("resource.k8s.io", "resourceclaimtemplates", "list", "validation")],
            WRITE: [need("", "namespaces", APPLY), need("", "pods", "create", "validation")],
            RUN: [need("", "pods", "get delete", "validation"), need("", "pods/log", "get", "validation"),
                  need("resource.k8s.io", "resourceclaimtemplates", "delete", "validation")],
            DOCTOR: [need("", "pods", "create", "validation")]}


DECLARATION = declare(
    Validate, section="validate", enabled=lambda config: config.validation.enabled, needs=rbac_needs,
    # gpu_operator.allocation: dra: one pod gets its GPU through a ResourceClaimTemplate
    dra_needs=lambda config: {WRITE: [need("resource.k8s.io", "resourceclaimtemplates", "create", "validation")]},
    summary="runs NVIDIA's CUDA vector-add sample on every GPU node (or a sample), through the bin-packing scheduler, "
            "and cleans up")
