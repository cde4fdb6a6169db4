"""validate: prove the GPUs work by running NVIDIA's CUDA vector-add sample on the GPU nodes, then clean up.

One pod per node (or a sample of nodes), pinned by the kubernetes.io/hostname label so the scheduler still places
it, tolerating the GPU taint and requesting one nvidia.com/gpu. It passes when every pod completes with the sample's
"Test PASSED". The record's fingerprint covers the operator's inputs, so it runs again after any change to them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from gpu_bootstrap.core.objects import unschedulable, waiting
from gpu_bootstrap.core.catalogue import locate, locate_pods, registry_inputs
from gpu_bootstrap.pipeline.step import FAIL, PASS, Change, Check, Ref, Step, Verb
from gpu_bootstrap.security import pod_security
from gpu_bootstrap.steps.preflight import facts_digest

POD_PREFIX = "gpu-bootstrap-validate-"
EXPECTED = "Test PASSED"
LABEL = {"app.kubernetes.io/name": "gpu-bootstrap-validate", "app.kubernetes.io/managed-by": "gpu-bootstrap"}


@dataclass(frozen=True)
class ValidateFacts:
    leftovers: tuple[str, ...]  # validation pods an earlier run left behind
    namespace: pod_security.NamespaceDecision | None = None  # where they run: created or labelled restricted if ours


class Validate(Step):
    id = "validate"
    title = "Run a CUDA workload on the GPU nodes"
    stateless = True  # the pods are removed after the run: only the record says it passed

    def enabled(self, ctx) -> bool:
        return ctx.config.validation.enabled

    @staticmethod
    def nodes(config) -> list[str]:
        names = [n.name for n in config.nodes]
        choice = config.validation.nodes
        if choice == "all":
            return names
        return names[:1] if choice == "sample" else names[:max(1, int(choice))]

    def inputs(self, ctx) -> dict:
        return {"validate": ctx.config.validation.model_dump(mode="json"), "nodes": self.nodes(ctx.config),
                "operator": ctx.config.gpu_operator.model_dump(mode="json"),
                "facts": facts_digest(ctx.node_facts.reports()), "scheduler": self.scheduler_name(ctx),
                **registry_inputs(ctx.config)}

    @staticmethod
    def scheduler_name(ctx) -> str | None:
        """The bin-packing scheduler when this playbook deploys it, so validation also proves it schedules."""
        if "binpack-scheduler" in ctx.options.playbook and ctx.config.scheduler.enabled:
            return ctx.config.scheduler.name
        return None

    def check(self, ctx) -> Check:
        # Nothing persists between runs (the pods are removed), so the record's fingerprint decides.
        leftovers = tuple(p["metadata"]["name"] for p in self._pods(ctx))
        namespace = ctx.config.validation.namespace
        decision = pod_security.decide(namespace, ctx.kube.get("v1", "Namespace", namespace), pod_security.RESTRICTED,
                                       "the validation pods pass it", "where the validation pods run")
        return Check(PASS, f"CUDA vector-add ({locate(ctx.config.validation.image, ctx.config.registry)}) on "
                           f"{len(self.nodes(ctx.config))} GPU node(s)", done=True,
                     facts=ValidateFacts(leftovers, decision))

    def _pod_name(self, node: str) -> str:
        return (POD_PREFIX + node)[:63].rstrip("-.")

    def _pod(self, ctx, node: str) -> dict:
        taint = ctx.config.node_prep.taint
        tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        if taint is not None and taint.key != "nvidia.com/gpu":
            tolerations.append({"key": taint.key, "operator": "Exists", "effect": taint.effect})
        # The restricted Pod Security profile: the sample needs no root, no capability and no syscall beyond the
        # runtime's default (the device plugin hands it the GPU device files, readable by any user).
        spec = {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": node},
                "tolerations": tolerations, "automountServiceAccountToken": False,
                "securityContext": pod_security.restricted_pod(),
                "containers": [{"name": "vectoradd", "image": ctx.config.validation.image,
                                "securityContext": pod_security.restricted_container(),
                                "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
        if scheduler := self.scheduler_name(ctx):
            spec["schedulerName"] = scheduler
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": self._pod_name(node), "namespace": ctx.config.validation.namespace,
                            "labels": dict(LABEL)},
               "spec": spec}
        return locate_pods([pod], ctx.config.registry)[0]  # the sample from registry.mirror, when set

    def plan(self, ctx, check: Check) -> list[Change]:
        namespace = ctx.config.validation.namespace
        changes = []
        if check.facts.namespace is not None and (parts := check.facts.namespace.change()):
            changes.append(Change(Verb.APPLY, Ref("v1", "Namespace", namespace), *parts))
        changes += self._removals(namespace, check.facts.leftovers)
        for node in self.nodes(ctx.config):
            changes.append(Change(Verb.CREATE, Ref("v1", "Pod", self._pod_name(node), namespace),
                                  f"run {ctx.config.validation.image} with 1 GPU on {node}",
                                  "prove that a CUDA workload runs there", self._pod(ctx, node)))
        return changes

    @staticmethod
    def _pods(ctx) -> list[dict]:
        return ctx.kube.list("v1", "Pod", ctx.config.validation.namespace,
                             label_selector="app.kubernetes.io/name=gpu-bootstrap-validate")

    @staticmethod
    def _removals(namespace: str, names) -> list[Change]:
        return [Change(Verb.DELETE, Ref("v1", "Pod", name, namespace), "remove a validation pod",
                       "left over from an earlier run") for name in names]

    def _leftovers(self, ctx) -> list[Change]:
        return self._removals(ctx.config.validation.namespace, [p["metadata"]["name"] for p in self._pods(ctx)])

    def verify(self, ctx) -> Check:
        namespace = ctx.config.validation.namespace
        deadline = time.monotonic() + ctx.config.validation.timeout
        pending = {self._pod_name(node): node for node in self.nodes(ctx.config)}
        failures, passed = [], []
        while pending and time.monotonic() < deadline:
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
