"""The adapters for `--offline` dry runs: no cluster at all.

OfflineKube answers reads as a fresh cluster would: every configured GPU node exists with no labels or taints, and
nothing else exists yet. OfflineHelm knows no releases (nothing is installed on a fresh cluster) but still renders
charts with the real `helm template`, which needs no cluster. Both refuse writes: in an offline run the gate only
records changes, so a write reaching them is a bug.
"""
from __future__ import annotations

from ..errors import GpuBootstrapError


def _refuse(*args, **kwargs):
    raise GpuBootstrapError("an offline dry run cannot write to a cluster (internal error)")


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

    apply = patch = create = update = delete = staticmethod(_refuse)


class OfflineHelm:
    """No release exists; charts are rendered by the real helm binary (template, show), which needs no cluster."""

    def __init__(self, renderer=None):
        from .helm import Helm
        self._helm = renderer or Helm()

    def status(self, release: str, namespace: str) -> dict | None:
        return None

    def deployed_chart(self, release: str, namespace: str) -> str | None:
        return None

    def history(self, release: str, namespace: str) -> list[dict]:
        return []

    def template(self, *args, **kwargs) -> str:
        return self._helm.template(*args, **kwargs)

    def show_chart(self, chart) -> dict:
        return self._helm.show_chart(chart)

    def show_crds(self, chart) -> list[dict]:
        return self._helm.show_crds(chart)

    upgrade = rollback = recover = uninstall = dry_run_manifest = user_values = manifest = staticmethod(_refuse)
