"""The EndpointSlice controller: one slice per Service with a selector, listing the pods it selects with their
readiness, as kube-controller-manager keeps them (name <service>-<5 chars>, label kubernetes.io/service-name, owned
by the Service so it goes with it)."""
from __future__ import annotations

from .controllers import owner_ref, pod_is_ready
from .selectors import selector_object_matches
from .util import jcopy

MANAGED_BY = "endpointslice-controller.k8s.io"


class EndpointSliceController:
    def __init__(self, manager):
        self.manager = manager
        self.store = manager.store

    def wants(self, key: tuple) -> bool:
        return (key[0], key[1]) in {("", "services"), ("", "pods")}

    def reconcile(self) -> None:
        services = self.store.objects.get(("", "services"), {})
        slices = self.store.objects.get(("discovery.k8s.io", "endpointslices"), {})
        wanted = set()
        for (namespace, name), service in list(services.items()):
            selector = (service.get("spec") or {}).get("selector")
            if not selector or service["metadata"].get("deletionTimestamp"):
                continue
            slice_name = f"{name}-{service['metadata']['uid'][:5]}"
            wanted.add((namespace, slice_name))
            body = self._slice(service, slice_name, selector)
            current = slices.get((namespace, slice_name))
            if current is None:
                self.manager._create("discovery.k8s.io", "endpointslices", namespace, body, MANAGED_BY)
            elif {k: current.get(k) for k in ("endpoints", "ports")} != {k: body.get(k) for k in ("endpoints", "ports")}:
                update = jcopy(current)
                update["endpoints"], update["ports"] = body["endpoints"], body["ports"]
                self.manager._update("discovery.k8s.io", "endpointslices", update, MANAGED_BY)
        for key, found in list(slices.items()):
            labels = found["metadata"].get("labels") or {}
            if labels.get("endpointslice.kubernetes.io/managed-by") == MANAGED_BY and key not in wanted:
                self.manager._delete("discovery.k8s.io", "endpointslices", found)

    def _slice(self, service: dict, name: str, selector: dict) -> dict:
        namespace = service["metadata"]["namespace"]
        endpoints = []
        for (ns, _pod_name), pod in sorted(self.store.objects.get(("", "pods"), {}).items()):
            if ns != namespace or not selector_object_matches({"matchLabels": selector},
                                                              pod["metadata"].get("labels")):
                continue
            ip = (pod.get("status") or {}).get("podIP")
            if not ip:
                continue
            ready = pod_is_ready(pod) and not pod["metadata"].get("deletionTimestamp")
            endpoints.append({"addresses": [ip], "conditions": {"ready": ready, "serving": ready,
                                                                "terminating": bool(pod["metadata"].get(
                                                                    "deletionTimestamp"))},
                              "nodeName": pod["spec"].get("nodeName"),
                              "targetRef": {"kind": "Pod", "namespace": namespace, "name": pod["metadata"]["name"],
                                            "uid": pod["metadata"]["uid"]}})
        ports = [{"name": p.get("name", ""), "port": p["targetPort"] if isinstance(p.get("targetPort"), int)
                  else p.get("port"), "protocol": p.get("protocol", "TCP")}
                 for p in (service.get("spec") or {}).get("ports") or []]
        return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"kubernetes.io/service-name": service["metadata"]["name"],
                                        "endpointslice.kubernetes.io/managed-by": MANAGED_BY},
                             "ownerReferences": [owner_ref(service)]},
                "endpoints": endpoints, "ports": ports}
