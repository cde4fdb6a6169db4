"""The Kubernetes adapter for `--offline` dry runs: no cluster at all.

It answers reads as a fresh cluster would: every configured GPU node exists with no labels or taints, and nothing
else exists yet. It refuses writes; in an offline run the gate only records changes.
"""
from __future__ import annotations

from ..errors import GpuBootstrapError


class OfflineKube:
    host = "(offline)"

    def __init__(self, node_names: list[str], kube_version: str):
        self.node_names = set(node_names)
        self.kube_version = kube_version
        self.requests = 0

    def version(self) -> dict:
        major, minor, *_ = (self.kube_version.split(".") + ["0"])
        return {"major": major, "minor": minor, "gitVersion": f"v{self.kube_version}"}

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        if (api_version, kind) == ("v1", "Node") and name in self.node_names:
            return {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "spec": {}}
        return None

    def list(self, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict]:
        if (api_version, kind) == ("v1", "Node"):
            return [self.get("v1", "Node", name) for name in sorted(self.node_names)]
        return []

    def _refuse(self, *args, **kwargs):
        raise GpuBootstrapError("an offline dry run cannot write to a cluster (internal error)")

    apply = patch = create = update = delete = _refuse
