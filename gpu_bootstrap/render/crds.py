"""A chart's CRDs against the cluster's, before the release changes: helm installs `crds/` on a first install only and
never upgrades them, so a newer chart's values that use new fields would be pruned by the API server (gpu-operator
#139, #431, #826). Each CRD the chart brings is compared with the cluster's and, where the chart's is newer (or
missing on an upgrade), applied with server-side apply (field manager gpu-bootstrap, conflicts forced: the CRD is the
chart's, whoever wrote it last). A CRD the cluster holds in a newer version than the chart's is never downgraded.

How "newer" is told: prometheus-operator stamps its CRDs `operator.prometheus.io/version`; other charts' CRDs carry
no version, so gpu-bootstrap stamps the ones it applies with the chart version (`gpu-bootstrap.io/chart-version`);
where neither says, the fields decide (a cluster CRD with fields the chart's lacks, and none missing, is newer).
Pure: no cluster, no helm.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gpu_bootstrap.core.objects import differences
from gpu_bootstrap.core.versions import version_tuple

API_VERSION = "apiextensions.k8s.io/v1"
KIND = "CustomResourceDefinition"
VERSION_ANNOTATIONS = ("operator.prometheus.io/version",)  # versions the CRDs' own project stamps on them
CHART_ANNOTATION = "gpu-bootstrap.io/chart-version"  # the chart version whose CRD gpu-bootstrap applied
SHOWN = 4  # field paths named in a change's summary


@dataclass(frozen=True)
class CrdChange:
    name: str  # clusterpolicies.nvidia.com
    body: dict  # what is applied
    summary: str  # "ClusterPolicy CRD: adds spec.cdi.nriPluginEnabled, … (+3 more)"
    create: bool = False


@dataclass
class CrdPlan:
    changes: list[CrdChange] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # newer in the cluster: left alone (said as warnings)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.changes]


def desired(crd: dict, chart_version: str) -> dict:
    """The CRD as gpu-bootstrap applies it: the chart's spec, labels and annotations (plus the chart version), no
    status or server-set metadata."""
    meta = crd.get("metadata") or {}
    annotations = {**(meta.get("annotations") or {}), CHART_ANNOTATION: chart_version}
    metadata = {"name": meta["name"], "annotations": annotations}
    if meta.get("labels"):
        metadata["labels"] = dict(meta["labels"])
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": crd.get("spec") or {}}


def version_of(crd: dict) -> tuple[str, str] | None:
    """(annotation, version) that dates a CRD, or None when nothing does."""
    annotations = (crd.get("metadata") or {}).get("annotations") or {}
    for key in (*VERSION_ANNOTATIONS, CHART_ANNOTATION):
        if annotations.get(key):
            return key, str(annotations[key])
    return None


def fields(crd: dict) -> set[str]:
    """The field paths of the storage version's schema ('spec.cdi.nriPluginEnabled'); lists add '[]'."""
    versions = (crd.get("spec") or {}).get("versions") or []
    stored = next((v for v in versions if v.get("storage")), versions[0] if versions else {})
    schema = ((stored.get("schema") or {}).get("openAPIV3Schema")) or {}
    found: set[str] = set()

    def walk(node: dict, path: str) -> None:
        for name, child in (node.get("properties") or {}).items():
            here = f"{path}.{name}" if path else name
            found.add(here)
            walk(child or {}, here)
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}.*")

    walk(schema, "")
    return found


def _unstamped(crd: dict) -> dict:
    annotations = {k: v for k, v in crd["metadata"]["annotations"].items() if k != CHART_ANNOTATION}
    return {**crd, "metadata": {**crd["metadata"], "annotations": annotations}}


def _listed(paths: set[str]) -> str:
    shown = sorted(paths, key=lambda p: (p.count("."), p))[:SHOWN]
    more = len(paths) - len(shown)
    return ", ".join(shown) + (f" (+{more} more)" if more else "")


def _label(crd: dict) -> str:
    kind = ((crd.get("spec") or {}).get("names") or {}).get("kind") or crd["metadata"]["name"]
    return f"{kind} CRD ({crd['metadata']['name']})"


def compare(chart_crds: list[dict], live: dict[str, dict | None], chart_version: str) -> CrdPlan:
    """What to apply: `live` maps each chart CRD's name to the cluster's copy (None: absent)."""
    plan = CrdPlan()
    for crd in chart_crds:
        name = crd["metadata"]["name"]
        want, have = desired(crd, chart_version), live.get(name)
        if have is None:
            plan.changes.append(CrdChange(name, want, f"{_label(want)}: create (new in chart {chart_version})",
                                          create=True))
            continue
        added, removed = fields(want) - fields(have), fields(have) - fields(want)
        if not differences(_unstamped(want), have):  # the chart's CRD is all in the cluster's, whoever applied it
            if removed:  # ... which has more: a newer CRD
                plan.kept.append(f"{_label(want)}: the cluster's has fields the chart's lacks ({_listed(removed)}), "
                                 f"so it looks newer; left alone (a CRD is never downgraded)")
            continue
        ours, theirs = version_of(want), version_of(have)
        if theirs and ours and theirs[0] == ours[0]:
            old, new = theirs[1], ours[1]
            if version_tuple(old) > version_tuple(new):
                plan.kept.append(f"{_label(want)}: the cluster's is newer ({theirs[0]} {old}) than the chart's "
                                 f"({new}); left alone (a CRD is never downgraded)")
                continue
            what = f"{theirs[0]} {old} → {new}" if old != new else "restored to the chart's"
        elif removed and not added:
            plan.kept.append(f"{_label(want)}: the cluster's has fields the chart's lacks ({_listed(removed)}), so "
                             f"it looks newer; left alone (a CRD is never downgraded)")
            continue
        else:
            what = ""
        parts = ([what] if what else []) + ([f"adds {_listed(added)}"] if added else []) + \
            ([f"drops {_listed(removed)}"] if removed else []) or ["changed schema, same fields"]
        plan.changes.append(CrdChange(name, want, f"{_label(want)}: " + "; ".join(parts)))
    return plan


__all__ = ["CHART_ANNOTATION", "CrdChange", "CrdPlan", "compare", "desired", "fields", "version_of"]
