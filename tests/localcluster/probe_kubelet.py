"""The kubelet stand-in (tests/kubeapi/kubelet_sim.py) as the local cluster's kubelet for nodes with a file tree.

KWOK plays a pod's lifecycle but runs nothing, so the in-cluster node probe (a DaemonSet whose init containers run
the probe script in the node's own shell) would report nothing from a KWOK node. For the nodes named in
<cluster>/node-trees.json (`{"node": "/path/to/its/root"}`, written by a test; tests/nodes builds the trees, the same
ones the sshd tests serve) the agent runs those pods with the emulator's kubelet stand-in instead: their init
containers really run (busybox, chrooted, the hostPath mapped to the node's tree) and their exit codes and
termination messages go into the pod's status through the real API server, with the kubelet's cuts. KWOK keeps its
hands off pods bound to these nodes (nodes.TREE_NODES in the pod-ready Stage's selector), except to finish
their deletion, as it does for every pod.
"""
from __future__ import annotations

import json
from pathlib import Path

from tests.kubeapi.kubelet_sim import KubeletSim
from tests.localcluster.nodes import TREE_NODES
from tests.localcluster.rest import ApiError, Rest

TREES_FILE = "node-trees.json"


class ProbeKubelet(KubeletSim):
    """KubeletSim reading and writing through the real API server (the agent's Rest client, user agent
    local-cluster-agent) instead of the emulator's store."""

    def __init__(self, api: Rest, folder: Path, busybox: str):
        super().__init__(None, busybox, workers=4)
        self.api = api
        self.file = folder / TREES_FILE
        self._stamp = None

    def load_trees(self) -> None:
        """Take <cluster>/node-trees.json as it is now (a test writes and removes it)."""
        try:
            stamp = self.file.stat().st_mtime_ns
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp:
            return
        self._stamp = stamp
        trees = json.loads(self.file.read_text()) if stamp is not None else {}
        self.trees = {name: Path(root) for name, root in trees.items() if name in TREE_NODES}

    def sync(self, pods: list[dict]) -> None:
        """Hand every live pod bound to a node with a tree to the stand-in (it takes each pod once, by uid); refuse
        a pod bound to a tree node without one when that node has no room for it, as its kubelet would."""
        self.load_trees()
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if pod["metadata"].get("deletionTimestamp"):
                continue
            if node in self.trees:
                self.handle(pod, node)
            elif node in TREE_NODES:  # KWOK leaves these nodes' pods alone: the kubelet's own refusal is ours
                self.refuse_if_full(pod, node)

    # --- the API side -------------------------------------------------------------------------------------------
    def _node(self, name: str) -> dict | None:
        try:
            return self.api.get(f"/api/v1/nodes/{name}")
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def _running_pods(self, node_name: str, uid: str) -> int:
        pods = self.api.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node_name}")["items"]
        return sum(1 for p in pods if p["metadata"]["uid"] != uid
                   and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))

    def _current(self, pod: dict) -> dict | None:
        meta = pod["metadata"]
        try:
            current = self.api.get(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return current if current["metadata"]["uid"] == meta["uid"] else None

    def _exists(self, pod: dict) -> bool:
        return self._current(pod) is not None

    def _write(self, pod: dict, status: dict) -> None:
        """Replace the pod's status (PUT .../status with the resourceVersion read, again on a conflict)."""
        for _ in range(5):
            current = self._current(pod)
            if current is None:
                return  # deleted meanwhile
            current["status"] = {**(current.get("status") or {}), **status}
            meta = pod["metadata"]
            try:
                self.api.request("PUT", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                                 current)
                return
            except ApiError as error:
                if error.status != 409:
                    raise

    def _config_map_data(self, namespace: str, name: str) -> dict:
        try:
            return dict(self.api.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}").get("data") or {})
        except ApiError as error:
            if error.status == 404:
                return {}
            raise
