"""The adapters for `teardown --dry-run --offline`: no cluster, but the one a fresh `up` would leave.

The world is made from what an offline `up` plan recorded at the gate, in order: each object applied or created
exists (a merge patch changes the object it names: node-prep's taint and labels, the records on the nodes), each
Helm release installed exists with its values and labels, and, where helm can render its chart, the chart's
CustomResourceDefinitions and Deployments exist too (what teardown asks of a release: which CRDs --purge-crds
deletes, which Service the Prometheus Operator makes). Steps name what their components make once running
(Step.made_while_running: the scheduler's Lease, the operator's kubelet Service), and the tool's own state is
there. The steps' own undo_plan then runs on this world as on a cluster: the preview is teardown itself.

What no plan can know stays out and is said: the labels the gpu-operator and NFD put on nodes depend on hardware.
"""
from __future__ import annotations

import copy

from gpu_bootstrap.adapters.offline import OfflineHelm, OfflineKube
from gpu_bootstrap.core.errors import ClusterError, GpuBootstrapError
from gpu_bootstrap.core.refs import Verb

# Kinds without a namespace that a chart or our steps make (a chart's rendered objects leave metadata.namespace out)
CLUSTER_SCOPED = {"Namespace", "Node", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                  "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
                  "PriorityClass", "RuntimeClass", "StorageClass", "APIService", "IngressClass", "NodePool",
                  "EC2NodeClass", "ClusterPolicy", "NVIDIADriver", "NodeFeatureRule"}


def merge_patch(target, patch):
    """RFC 7386: a JSON merge patch applied to `target` (null removes a key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _key(obj: dict) -> tuple:
    meta = obj.get("metadata") or {}
    return obj.get("apiVersion"), obj.get("kind"), meta.get("namespace"), meta.get("name")


def _selected(labels: dict, selector: str | None) -> bool:
    """An equality-based label selector (a=b, a!=b, a, !a, comma-joined), as the steps send them."""
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value.lstrip("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class AfterUpKube(OfflineKube):
    """Reads answered from the objects a fresh `up` leaves; writes refused like OfflineKube's."""

    host = "(offline: the cluster a fresh `up` leaves)"

    def __init__(self, node_names: list[str], kube_version: str):
        super().__init__(node_names, kube_version)
        self.objects: dict[tuple, dict] = {}
        self.charts_known = True  # every release's chart was rendered, so its CRDs are known
        for name in sorted(node_names):
            self.put(OfflineKube.get(self, "v1", "Node", name))

    def put(self, obj: dict) -> None:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if obj.get("kind") in CLUSTER_SCOPED:
            meta.pop("namespace", None)
        self.objects[_key(obj)] = obj

    def merge(self, api_version: str, kind: str, name: str, namespace: str | None, patch: dict) -> None:
        key = (api_version, kind, namespace, name)
        if key in self.objects:
            self.objects[key] = merge_patch(self.objects[key], patch)

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        found = self.objects.get((api_version, kind, namespace if kind not in CLUSTER_SCOPED else None, name))
        if found is None and kind == "CustomResourceDefinition":
            found = self._implied_crd(name)
        return copy.deepcopy(found) if found else None

    def _implied_crd(self, name: str) -> dict | None:
        """A CRD `up` needed for an object it applied (a PrometheusRule needs the stack's): it exists, whether or
        not its chart could be rendered."""
        for (api_version, kind, namespace, _name) in self.objects:
            group = api_version.rpartition("/")[0]
            if group and f"{kind.lower()}s.{group}" == name:
                return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                        "metadata": {"name": name},
                        "spec": {"group": group, "names": {"kind": kind, "plural": f"{kind.lower()}s"},
                                 "scope": "Namespaced" if namespace else "Cluster",
                                 "versions": [{"name": api_version.rpartition("/")[2], "served": True}]}}
        return None

    def list(self, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict]:
        return [copy.deepcopy(o) for (v, k, ns, _n), o in sorted(self.objects.items(), key=lambda i: str(i[0]))
                if (v, k) == (api_version, kind) and (namespace is None or ns == namespace)
                and _selected((o["metadata"].get("labels") or {}), label_selector)]

    def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        group, _, version = api_version.rpartition("/")
        for crd in self.list("apiextensions.k8s.io/v1", "CustomResourceDefinition"):
            spec = crd.get("spec") or {}
            names = spec.get("names") or {}
            if spec.get("group") == group and names.get("kind") == kind and \
                    any(v.get("name") == version and v.get("served", True) for v in spec.get("versions") or []):
                return names.get("plural", kind.lower() + "s"), spec.get("scope") != "Cluster"
        for (v, k, namespace, _name) in self.objects:  # `up` applied one: its kind is served
            if (v, k) == (api_version, kind):
                return kind.lower() + "s", namespace is not None
        try:
            return super().resource(api_version, kind)
        except GpuBootstrapError:
            # a CRD nothing installed: absent where every chart was rendered, else unknown (OfflineKube's answer)
            if "." in group and not group.endswith(".k8s.io") and self.charts_known:
                raise ClusterError(f"the cluster serves no {kind} in {api_version}") from None
            raise


class AfterUpHelm(OfflineHelm):
    """The releases a fresh `up` installed: their values (helm get values) and labels (helm --labels)."""

    def __init__(self, renderer=None):
        super().__init__(renderer)
        self.releases: dict[tuple[str, str], dict] = {}  # (namespace, release) -> the helm-upgrade change's body

    def status(self, release: str, namespace: str) -> dict | None:
        body = self.releases.get((namespace, release))
        if body is None:
            return None
        return {"name": release, "namespace": namespace, "info": {"status": "deployed"},
                "config": copy.deepcopy(body.get("values") or {}), "version": 1}

    def deployed_chart(self, release: str, namespace: str, version: str | None = None) -> str | None:
        body = self.releases.get((namespace, release))
        if body is None:
            return None
        chart = body.get("chart") or {}
        return f"{chart.get('ref', '').rpartition('/')[2]}-{body.get('chart_version') or chart.get('version')}"

    def labelled(self, release: str, namespace: str, selector: str) -> bool:
        body = self.releases.get((namespace, release))
        return body is not None and _selected(body.get("labels") or {}, selector)

    def user_values(self, release: str, namespace: str) -> dict:
        return copy.deepcopy((self.releases.get((namespace, release)) or {}).get("values") or {})


def world(submitted: list[tuple[str, object]], node_names: list[str], kube_version: str, render=None,
          stateless: set[str] = frozenset()) -> tuple[AfterUpKube, AfterUpHelm, list[str]]:
    """(kube, helm, notes) of the cluster the recorded plan leaves. `render(body) -> list[dict]`: a release's chart
    objects (helm template), or raises; `stateless`: steps whose objects do not outlive their run (validate)."""
    kube, helm, notes = AfterUpKube(node_names, kube_version), AfterUpHelm(), []
    for step, change in submitted:
        if step in stateless:
            continue
        verb, target = Verb(change.verb), change.target
        if verb in (Verb.APPLY, Verb.CREATE) and isinstance(change.body, dict):
            kube.put(change.body)
        elif verb == Verb.PATCH and change.patch_type == "merge" and isinstance(change.body, dict):
            kube.merge(target.api_version, target.kind, target.name, target.namespace, change.body)
        elif verb == Verb.HELM_UPGRADE:
            body = change.body
            helm.releases[(body["namespace"], body["release"])] = body
            notes += _chart_objects(kube, body, render)
    kube.charts_known = not notes  # a chart not rendered: the CRDs it brings are unknown, not absent
    return kube, helm, notes


def _chart_objects(kube: AfterUpKube, body: dict, render) -> list[str]:
    """The chart's CRDs and Deployments into the world, or a note saying why not."""
    if render is None:
        return [f"{body['release']}: its chart was not rendered, so what the release holds is not listed (helm "
                f"uninstall removes it; --purge-crds: its CRDs are not named)"]
    try:
        objects = render(body)
    except GpuBootstrapError as error:
        return [f"{body['release']}: its chart could not be rendered ({error.one_line()}), so what the release "
                f"holds is not listed (helm uninstall removes it; --purge-crds: its CRDs are not named)"]
    for obj in objects:
        if obj.get("kind") in ("CustomResourceDefinition", "Deployment"):
            if obj["kind"] == "Deployment":
                obj.setdefault("metadata", {}).setdefault("namespace", body["namespace"])
            kube.put(obj)
    return []
