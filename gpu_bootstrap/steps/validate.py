"""validate: prove the GPUs work by running NVIDIA's CUDA vector-add sample on the GPU nodes, then clean up.

One pod per node (or a sample of nodes), pinned by the kubernetes.io/hostname label so the scheduler still places
it, tolerating the GPU taint and requesting one nvidia.com/gpu. It passes when every pod completes with the sample's
"Test PASSED". The record's fingerprint covers the operator's inputs, so it runs again after any change to them.
"""
from __future__ import annotations

import time

from ..pipeline.step import FAIL, PASS, Change, Check, Step, Target
from .preflight import facts_digest, node_facts

POD_PREFIX = "gpu-bootstrap-validate-"
EXPECTED = "Test PASSED"
LABEL = {"app.kubernetes.io/name": "gpu-bootstrap-validate", "app.kubernetes.io/managed-by": "gpu-bootstrap"}


class Validate(Step):
    id = "validate"
    title = "Run a CUDA workload on the GPU nodes"

    def enabled(self, ctx) -> bool:
        return ctx.config.validation.enabled

    def nodes(self, ctx) -> list[str]:
        names = [n.name for n in ctx.config.nodes]
        choice = ctx.config.validation.nodes
        if choice == "all":
            return names
        return names[:1] if choice == "sample" else names[:max(1, int(choice))]

    def inputs(self, ctx) -> dict:
        return {"validate": ctx.config.validation.model_dump(mode="json"), "nodes": self.nodes(ctx),
                "operator": ctx.config.gpu_operator.model_dump(mode="json"),
                "facts": facts_digest(node_facts(ctx)), "scheduler": self.scheduler_name(ctx)}

    @staticmethod
    def scheduler_name(ctx) -> str | None:
        """The bin-packing scheduler when this playbook deploys it, so validation also proves it schedules."""
        if "binpack-scheduler" in ctx.facts.get("playbook", ()) and ctx.config.scheduler.enabled:
            return ctx.config.scheduler.name
        return None

    def check(self, ctx) -> Check:
        # Nothing persists between runs (the pods are removed), so the record's fingerprint decides.
        return Check(PASS, f"CUDA vector-add ({ctx.config.validation.image}) on {len(self.nodes(ctx))} GPU node(s)",
                     done=True)

    def _pod_name(self, node: str) -> str:
        return (POD_PREFIX + node)[:63].rstrip("-.")

    def _pod(self, ctx, node: str) -> dict:
        taint = ctx.config.node_prep.taint
        tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        if taint is not None and taint.key != "nvidia.com/gpu":
            tolerations.append({"key": taint.key, "operator": "Exists", "effect": taint.effect})
        spec = {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": node},
                "tolerations": tolerations,
                "containers": [{"name": "vectoradd", "image": ctx.config.validation.image,
                                "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
        if scheduler := self.scheduler_name(ctx):
            spec["schedulerName"] = scheduler
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": self._pod_name(node), "namespace": ctx.config.validation.namespace,
                             "labels": dict(LABEL)},
                "spec": spec}

    def plan(self, ctx, check: Check) -> list[Change]:
        namespace = ctx.config.validation.namespace
        changes = [Change("apply", Target("Namespace", namespace, api_version="v1"), "ensure the namespace",
                          "validation pods run there",
                          {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})]
        changes += self._leftovers(ctx)
        for node in self.nodes(ctx):
            changes.append(Change("create", Target("Pod", self._pod_name(node), namespace, "v1"),
                                  f"run {ctx.config.validation.image} with 1 GPU on {node}",
                                  "prove that a CUDA workload runs there", self._pod(ctx, node)))
        return changes

    def _leftovers(self, ctx) -> list[Change]:
        namespace = ctx.config.validation.namespace
        pods = ctx.kube.list("v1", "Pod", namespace, label_selector="app.kubernetes.io/name=gpu-bootstrap-validate")
        return [Change("delete", Target("Pod", p["metadata"]["name"], namespace, "v1"), "remove a validation pod",
                       "left over from an earlier run") for p in pods]

    def verify(self, ctx) -> Check:
        namespace = ctx.config.validation.namespace
        deadline = time.monotonic() + ctx.config.validation.timeout
        pending = {self._pod_name(node): node for node in self.nodes(ctx)}
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
        return Check(PASS, f"CUDA vector-add passed on {', '.join(passed)}", done=True)

    @staticmethod
    def _why_pending(ctx, name: str, namespace: str) -> str:
        pod = ctx.kube.get("v1", "Pod", name, namespace) or {}
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                return f"unschedulable: {condition.get('message', '')}"
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting")
            if waiting:
                return f"{waiting.get('reason')}: {waiting.get('message', '')}".rstrip(": ")
        scheduler = (pod.get("spec") or {}).get("schedulerName")
        if pod and not (pod.get("spec") or {}).get("nodeName") and scheduler not in (None, "default-scheduler"):
            return f"no scheduler named {scheduler} has picked it up: is the binpack-scheduler step's Deployment running?"
        return (pod.get("status") or {}).get("phase", "not found")

    def cleanup_plan(self, ctx) -> list[Change]:
        return self._leftovers(ctx)

    def undo_plan(self, ctx) -> list[Change]:
        return self._leftovers(ctx)
