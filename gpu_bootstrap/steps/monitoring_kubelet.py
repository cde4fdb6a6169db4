"""The monitoring step's one object outside its release: the Service (and its Endpoints) the Prometheus Operator of
a kube-prometheus-stack we installed makes for the kubelets, named by the operator's --kubelet-service flag.
`helm uninstall` leaves it (the chart's README says to delete it by hand); it is ours through the release, so
teardown removes it, and only while the operator's own managed-by label says the operator made it.
"""
from __future__ import annotations

from gpu_bootstrap.pipeline.step import Change, Ref, Verb
from gpu_bootstrap.render.monitoring import kubelet_service_of

MADE_BY = {"app.kubernetes.io/managed-by": "prometheus-operator"}
KINDS = ("Service", "Endpoints")


def kubelet_service(ctx) -> tuple[str, str] | None:
    """(namespace, name) of the Service the Prometheus Operator of our release makes for the kubelets."""
    section = ctx.config.monitoring
    operators = [d for d in ctx.kube.list("apps/v1", "Deployment", section.namespace)
                 if (d["metadata"].get("labels") or {}).get("release") == section.release]
    return kubelet_service_of(operators)


def made_while_running(ctx) -> list[dict]:
    """The Service and Endpoints as the running operator makes them (Step.made_while_running)."""
    target = kubelet_service(ctx)
    if target is None:
        return []
    namespace, name = target
    return [{"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": namespace,
                                                            "labels": dict(MADE_BY)}} for kind in KINDS]


def removal(ctx) -> list[Change]:
    """teardown: delete them, where the operator's label says it made them."""
    target = kubelet_service(ctx)
    if target is None:
        return []
    namespace, name = target
    changes = []
    for kind in KINDS:
        found = ctx.kube.get("v1", kind, name, namespace)
        labels = (found or {}).get("metadata", {}).get("labels") or {}
        if found and labels.get("app.kubernetes.io/managed-by") == MADE_BY["app.kubernetes.io/managed-by"]:
            changes.append(Change(Verb.DELETE, Ref("v1", kind, name, namespace), "remove",
                                  f"made by the Prometheus Operator of {ctx.config.monitoring.release} "
                                  f"(--kubelet-service); helm uninstall leaves it"))
    return changes
