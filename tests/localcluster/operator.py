"""The gpu-operator stand-in on the real API server, for the charts whose controller cannot be built (the module
proxy serves one commit of NVIDIA's operator, the 25.3 line, which the agent runs for real: agent.OWN_TAG_ONLY).
It is the emulator's controller (tests/kubeapi/gpu_operator_sim.py), unchanged, given a snapshot of the real
cluster to read and the API to write through.

Each round lists the kinds the controller reads, hands it those objects in the emulator store's shape, and turns
its writes into real requests (field manager `gpu-operator`, or `nfd-master` for NFD's label, as in the emulator).
A write that conflicts (someone else changed the object) is dropped and made again from the next round's snapshot,
as a controller's requeue would.

Two differences from the emulator, both because the nodes here are KWOK's: GPU nodes are the nodes whose capacity
names nvidia.com/gpu (the emulator marks them with an annotation), and their GPUs are advertised from the start, as
on a host with a device plugin already running, so the stand-in never takes them away. The operands' DaemonSets it
creates do run (KWOK plays their pods), so every status the gpu-operator step waits for comes from the real
DaemonSet controller.
"""
from __future__ import annotations

import time

from tests.kubeapi.gpu_operator_sim import GpuOperatorSim
from tests.localcluster.rest import ApiError, Rest

# (group, plural) -> (API path prefix, apiVersion, kind, namespaced)
KINDS = {
    ("nvidia.com", "clusterpolicies"): ("/apis/nvidia.com/v1", "nvidia.com/v1", "ClusterPolicy", False),
    ("apps", "deployments"): ("/apis/apps/v1", "apps/v1", "Deployment", True),
    ("", "nodes"): ("/api/v1", "v1", "Node", False),
    ("", "pods"): ("/api/v1", "v1", "Pod", True),
    ("apps", "daemonsets"): ("/apis/apps/v1", "apps/v1", "DaemonSet", True),
    ("", "configmaps"): ("/api/v1", "v1", "ConfigMap", True),
    ("", "services"): ("/api/v1", "v1", "Service", True),
    ("", "serviceaccounts"): ("/api/v1", "v1", "ServiceAccount", True),
    ("monitoring.coreos.com", "servicemonitors"): ("/apis/monitoring.coreos.com/v1", "monitoring.coreos.com/v1",
                                                   "ServiceMonitor", True),
    ("apiextensions.k8s.io", "customresourcedefinitions"): ("/apis/apiextensions.k8s.io/v1",
                                                            "apiextensions.k8s.io/v1", "CustomResourceDefinition",
                                                            False),
}
GPU_RESOURCE = "nvidia.com/gpu"
NVIDIA_PCI = "feature.node.kubernetes.io/pci-10de.present"  # NFD's label: a --dra cluster's GPU nodes have no capacity


class Snapshot:
    """What the controller reads as `store.objects`: {(group, plural): {(namespace, name): object}}."""

    def __init__(self, api: Rest):
        self.objects = {}
        for key, (prefix, api_version, kind, _namespaced) in KINDS.items():
            try:
                items = api.get(f"{prefix}/{key[1]}")["items"]
            except ApiError as error:
                if error.status != 404:  # 404: the kind is not served (its CRD is not installed)
                    raise
                items = []
            found = {}
            for item in items:
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                found[(item["metadata"].get("namespace", ""), item["metadata"]["name"])] = item
            self.objects[key] = found


class Writer:
    """What the controller calls `manager`: its writes, as requests to the real API server."""

    def __init__(self, api: Rest, store: Snapshot):
        self.api, self.store = api, store

    @staticmethod
    def path(group: str, plural: str, namespace: str | None, name: str | None = None) -> str:
        prefix, _v, _k, namespaced = KINDS[(group, plural)]
        base = f"{prefix}/namespaces/{namespace}/{plural}" if namespaced and namespace else f"{prefix}/{plural}"
        return f"{base}/{name}" if name else base

    def _body(self, group: str, plural: str, obj: dict) -> dict:
        _prefix, api_version, kind, _n = KINDS[(group, plural)]
        return {"apiVersion": api_version, "kind": kind, **obj}

    def _create(self, group: str, plural: str, namespace: str | None, obj: dict, manager: str) -> dict | None:
        return self._send("POST", self.path(group, plural, namespace), self._body(group, plural, obj), manager)

    def _update(self, group: str, plural: str, obj: dict, manager: str) -> dict | None:
        meta = obj["metadata"]
        return self._send("PUT", self.path(group, plural, meta.get("namespace"), meta["name"]),
                          self._body(group, plural, obj), manager)

    def _write_status(self, group: str, plural: str, obj: dict, status: dict, manager: str) -> None:
        if obj.get("status") == status:
            return
        meta = obj["metadata"]
        self._send("PUT", self.path(group, plural, meta.get("namespace"), meta["name"]) + "/status",
                   self._body(group, plural, {**obj, "status": status}), manager)

    def _delete(self, group: str, plural: str, obj: dict, policy: str = "Background") -> None:
        meta = obj["metadata"]
        try:
            self.api.request("DELETE", self.path(group, plural, meta.get("namespace"), meta["name"]),
                             {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": policy})
        except ApiError as error:
            if error.status != 404:
                raise

    def _send(self, method: str, path: str, body: dict, manager: str) -> dict | None:
        try:
            return self.api.request(method, path, body, params={"fieldManager": manager})
        except ApiError as error:
            if error.status in (404, 409):  # gone, or changed since the snapshot: the next round redoes it
                return None
            raise


class LocalOperatorSim(GpuOperatorSim):
    def _gpu_nodes(self) -> list[dict]:
        nodes = self.store.objects.get(("", "nodes"), {}).values()
        return [n for n in nodes if int(((n.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE, "0")) > 0
                or ((n.get("metadata") or {}).get("labels") or {}).get(NVIDIA_PCI) == "true"]  # a --dra cluster's

    def _advertise(self, namespace, spec) -> None:
        """KWOK's GPU nodes advertise their GPUs from the start (see the module docstring)."""

    def _publish_slices(self) -> None:
        """No DRA driver runs on the local cluster: a --dra cluster's slices are written at its start
        (cluster._publish_dra_gpus), and tests/test_dra_scheduling.py writes those of its DRA-only nodes itself."""


class OperatorStandIn:
    """Plays the controller for a ClusterPolicy whose operator Deployment the real controller does not serve:
    `served_by_real(deployment)` says which one it does (the agent runs NVIDIA's controller for the operator image
    of the chart built beside it); the stand-in then leaves the cluster alone, so that two controllers never fight."""

    def __init__(self, api: Rest, served_by_real=lambda deployment: False):
        self.api = api
        self.sim = None
        self.errors = 0
        self.served_by_real = served_by_real

    def reconcile(self) -> None:
        try:  # nothing to do (and no load to put on the API server) until a ClusterPolicy exists
            if not self.api.get("/apis/nvidia.com/v1/clusterpolicies")["items"]:
                return
        except ApiError as error:
            if error.status == 404:
                return
            raise
        store = Snapshot(self.api)
        if any(self.served_by_real(d) for d in store.objects[("apps", "deployments")].values()):
            return
        writer = Writer(self.api, store)
        if self.sim is None:
            self.sim = LocalOperatorSim(writer)
        self.sim.manager, self.sim.store = writer, store
        try:
            self.sim.reconcile()
        except ApiError as error:
            self.errors += 1
            print(f"{time.strftime('%H:%M:%S')} gpu-operator stand-in: {error}", flush=True)
