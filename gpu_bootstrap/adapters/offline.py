"""The adapters for `--offline` dry runs: no cluster at all.

OfflineKube answers reads as a fresh cluster would: every configured GPU node exists with no labels or taints, and
nothing else exists yet. OfflineHelm knows no releases (nothing is installed on a fresh cluster) but still renders
charts with the real `helm template`, which needs no cluster. Both refuse writes: in an offline run the gate only
records changes, so a write reaching them is a bug.
"""
from __future__ import annotations

from gpu_bootstrap.core.errors import ClusterError, GpuBootstrapError, Unknown
from gpu_bootstrap.core.versions import minor_of

# What API discovery shows on a fresh cluster with default feature gates: (apiVersion, kind) -> first minor served.
# Anything not listed here is a CRD or off by default (e.g. MutatingAdmissionPolicy v1beta1 on 1.34-1.35).
FRESH_DISCOVERY = {
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): 30,
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): 30,
    ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy"): 36,
    ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicyBinding"): 36,
}


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

    def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """Discovery as a fresh cluster of this version answers it, for the kinds whose presence depends on the
        version; built-in kinds the tool uses are always served; a CRD's kind is Unknown (not absent)."""
        first = FRESH_DISCOVERY.get((api_version, kind))
        group = api_version.rpartition("/")[0]
        if first is not None:
            served = minor_of(self.kube_version)[1] >= first
        elif group == "admissionregistration.k8s.io":
            served = api_version.endswith("/v1") and kind.endswith("WebhookConfiguration")
        elif "." not in group or group.endswith(".k8s.io"):
            served = True
        else:  # a CRD's group: whether it is installed is a fact of a cluster we do not have
            raise Unknown(f"no cluster to ask whether it serves {kind} in {api_version}")
        if not served:
            raise ClusterError(f"the cluster serves no {kind} in {api_version}")
        return kind.lower() + "s", True

    apply = patch = create = update = delete = staticmethod(_refuse)


class OfflineHelm:
    """No release exists; charts are rendered by the real helm binary (template, show), which needs no cluster."""

    def __init__(self, renderer=None):
        from gpu_bootstrap.adapters.helm import Helm
        self._helm = renderer or Helm()

    def status(self, release: str, namespace: str) -> dict | None:
        return None

    def deployed_chart(self, release: str, namespace: str, version: str | None = None) -> str | None:
        return None

    def history(self, release: str, namespace: str) -> list[dict]:
        return []

    def labelled(self, release: str, namespace: str, selector: str) -> bool:
        return False

    def template(self, *args, **kwargs) -> str:
        return self._helm.template(*args, **kwargs)

    def show_chart(self, chart) -> dict:
        return self._helm.show_chart(chart)

    def show_crds(self, chart) -> list[dict]:
        return self._helm.show_crds(chart)

    upgrade = rollback = recover = uninstall = dry_run_manifest = user_values = manifest = staticmethod(_refuse)
