"""Table tests for render/crds.py: which of a chart's CRDs are applied before its release, and which are left alone
because the cluster's is newer (a CRD is never downgraded). Hand-made CRDs, so each rule is seen alone; the real
charts' CRDs are exercised end to end in test_gpu_operator_emulator.py and test_monitoring_emulator.py."""
from __future__ import annotations

import pytest

from gpu_bootstrap.render import crds

pytestmark = pytest.mark.unit


def crd(fields: dict, version: str | None = None, name: str = "widgets.example.com", stamp: str | None = None) -> dict:
    annotations = {}
    if version:
        annotations["operator.prometheus.io/version"] = version
    if stamp:
        annotations[crds.CHART_ANNOTATION] = stamp
    schema = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        key: {"type": kind} for key, kind in fields.items()}}}}
    return {"apiVersion": crds.API_VERSION, "kind": crds.KIND,
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"group": "example.com", "names": {"kind": "Widget", "plural": "widgets"}, "scope": "Namespaced",
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": schema}}]}}


OLD, NEW = {"size": "integer"}, {"size": "integer", "colour": "string"}


def plan(chart_crd: dict, live: dict | None, version: str = "v2.0.0") -> crds.CrdPlan:
    return crds.compare([chart_crd], {chart_crd["metadata"]["name"]: live}, version)


def test_a_missing_crd_is_created_and_stamped_with_the_chart_version():
    found = plan(crd(NEW), None)
    assert [(c.create, c.summary) for c in found.changes] == [
        (True, "Widget CRD (widgets.example.com): create (new in chart v2.0.0)")]
    assert found.changes[0].body["metadata"]["annotations"][crds.CHART_ANNOTATION] == "v2.0.0"


def test_an_older_unversioned_crd_is_upgraded_naming_the_new_fields():
    found = plan(crd(NEW), crd(OLD))
    assert [c.summary for c in found.changes] == ["Widget CRD (widgets.example.com): adds spec.colour"]


def test_prometheus_operator_versions_are_compared_and_shown():
    found = plan(crd(NEW, "0.93.1"), crd(OLD, "0.80.0"))
    assert found.changes[0].summary == ("Widget CRD (widgets.example.com): operator.prometheus.io/version 0.80.0 → "
                                        "0.93.1; adds spec.colour")


@pytest.mark.parametrize("chart_crd, live", [
    (crd(OLD, "0.80.0"), crd(NEW, "0.93.1")),  # the project's own version says newer
    (crd(OLD), crd(NEW, stamp="v3.0.0")),  # gpu-bootstrap applied a newer chart's
    (crd(OLD), crd(NEW)),  # no version anywhere: the cluster's has fields the chart's lacks, none missing
])
def test_a_crd_newer_in_the_cluster_is_never_downgraded(chart_crd, live):
    found = plan(chart_crd, live)
    assert found.changes == [] and len(found.kept) == 1 and "never downgraded" in found.kept[0]


@pytest.mark.parametrize("live", [crd(NEW), crd(NEW, stamp="v2.0.0"), crd(NEW, stamp="v1.0.0")])
def test_the_same_crd_is_not_written_again_whoever_applied_it(live):
    """helm's copy (no stamp) or ours: only the chart-version stamp differs, so nothing is written."""
    assert plan(crd(NEW), live).changes == []


def test_fields_walk_objects_lists_and_maps():
    found = crd({})
    spec = found["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"] = {"ports": {"type": "array", "items": {"type": "object", "properties": {"port": {}}}},
                          "labels": {"type": "object", "additionalProperties": {"type": "object",
                                                                                "properties": {"v": {}}}}}
    assert crds.fields(found) == {"spec", "spec.ports", "spec.ports[].port", "spec.labels", "spec.labels.*.v"}
