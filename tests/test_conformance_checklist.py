"""The AI Conformance checklist's documents (gpu_bootstrap/render/conformance.py): the program's YAML shape, the JUnit
file, and the structural checks of the program's validator (cncf/k8s-ai-conformance scripts/validate.go) reproduced
case by case: each case below is one branch of validateProduct, worded as it words it."""
from __future__ import annotations

import xml.etree.ElementTree as ElementTree

import pytest
import yaml

from gpu_bootstrap.render import conformance as checklist
from gpu_bootstrap.render.conformance import IMPLEMENTED, NOT_APPLICABLE, NOT_IMPLEMENTED, Result

pytestmark = pytest.mark.unit
METADATA = {"kubernetesVersion": "v1.37", "platformName": "gpu-bootstrap", "platformVersion": "0.9.0",
            "vendorName": "Example", "websiteUrl": "https://example.org", "repoUrl": "https://example.org/repo",
            "documentationUrl": "https://example.org/docs", "productLogoUrl": "https://example.org/logo.svg",
            "description": "GPU platform", "contactEmailAddress": "gpu@example.org",
            "k8sConformanceUrl": "https://github.com/cncf/k8s-conformance/tree/master/v1.37/example"}


def all_implemented() -> dict[str, Result]:
    _metadata, items = checklist.checklist()
    return {item.id: Result(item.id, IMPLEMENTED, "proved", evidence=[f"{item.id}.log"]) for item in items}


def test_the_checklist_has_the_program_s_sections_items_and_levels():
    metadata, items = checklist.checklist()
    assert [i.id for i in items] == [
        "driver_runtime_management", "gpu_sharing", "virtualized_accelerator", "ai_inference",
        "advanced_inference_ingress", "high_performance_networking", "disaggregated_inference", "gang_scheduling",
        "cluster_autoscaling", "pod_autoscaling", "accelerator_metrics", "ai_service_metrics",
        "secure_accelerator_access", "robust_controller"]
    assert {i.id for i in items if i.level == "MUST"} == {
        "ai_inference", "gang_scheduling", "cluster_autoscaling", "pod_autoscaling", "accelerator_metrics",
        "ai_service_metrics", "secure_accelerator_access", "robust_controller"}
    assert [s for s in dict.fromkeys(i.section for i in items)] == [
        "accelerators", "networking", "schedulingOrchestration", "observability", "security", "operator"]
    assert all(i.description for i in items) and "kubernetesVersion" in metadata


def test_the_filled_in_checklist_keeps_the_program_s_shape_and_words():
    _metadata, items = checklist.checklist()
    text = checklist.as_yaml(checklist.filled_in(METADATA, items, all_implemented()))
    document = yaml.safe_load(text)
    template = yaml.safe_load((checklist.DATA / "ai-conformance.yaml").read_text())
    assert list(document) == ["metadata", "spec"] and list(document["spec"]) == list(template["spec"])
    for section, entries in template["spec"].items():
        assert [(e["id"], e["description"], e["level"]) for e in document["spec"][section]] == \
               [(e["id"], e["description"], e["level"]) for e in entries]
        assert all(list(e) == ["id", "description", "level", "status", "evidence", "notes"]
                   for e in document["spec"][section])


def test_a_complete_honest_checklist_has_no_structural_problem():
    _metadata, items = checklist.checklist()
    document = checklist.filled_in(METADATA, items, all_implemented())
    assert checklist.structural_problems(document, items, {f"{i.id}.log" for i in items}) == []


def test_the_template_as_it_comes_has_every_problem_the_validator_names():
    _metadata, items = checklist.checklist()
    template = yaml.safe_load((checklist.DATA / "ai-conformance.yaml").read_text())
    problems = checklist.structural_problems(template, items, set())
    assert "Metadata field platformName has placeholder value: [Platform Name]" in problems
    assert "Missing metadata field: k8sConformanceUrl (or k8s_conformance_url)" in problems
    assert "Requirement 'gang_scheduling' is MUST level but status is ''. It must be 'Implemented'." in problems
    assert any(p.startswith("Invalid status '' for 'ai_inference'") for p in problems)
    assert not any("'gpu_sharing'" in p for p in problems)  # a SHOULD left empty is skipped, as validate.go does


@pytest.mark.parametrize("change, problem", [
    (lambda d: d["metadata"].pop("vendorName"), "Missing metadata field: vendorName (or vendor_name)"),
    (lambda d: d["metadata"].update(vendorName=""), "Metadata field vendorName is empty"),
    (lambda d: d["metadata"].update(repoUrl=""), None),  # optional: empty is fine
    (lambda d: d["metadata"].update(platformVersion=1), "Metadata field platformVersion is not a string"),
    (lambda d: d["metadata"].update(k8sConformanceUrl="https://example.org/x"),
     "Invalid k8sConformanceUrl format: https://example.org/x. Expected format: "
     "https://github.com/cncf/k8s-conformance/tree/master/v{version}/{product}"),
    (lambda d: d["metadata"].update(vendor_name=d["metadata"].pop("vendorName")), None),  # snake case accepted
    (lambda d: d.pop("metadata"), "Missing 'metadata' section"),
    (lambda d: d["spec"].pop("security"), "Missing spec category: security"),
    (lambda d: d["spec"]["operator"].clear(), "Missing requirement 'robust_controller' in category 'operator'"),
    (lambda d: d["spec"]["accelerators"][1].update(status="Done"),
     "Invalid status 'Done' for 'gpu_sharing'. Must be one of "
     "['Implemented', 'Partially Implemented', 'Not Implemented', 'N/A']"),
    (lambda d: d["spec"]["security"][0].update(status=NOT_IMPLEMENTED),
     "Requirement 'secure_accelerator_access' is MUST level but status is 'Not Implemented'. It must be "
     "'Implemented'."),
    (lambda d: d["spec"]["accelerators"][2].update(status=NOT_APPLICABLE, notes=""),
     "Notes required for 'virtualized_accelerator' when status is N/A"),
    (lambda d: d["spec"]["accelerators"][0].update(evidence=["gone.log"]),
     "Invalid evidence file for 'driver_runtime_management': gone.log (not found)"),
    (lambda d: d["spec"]["accelerators"][0].update(evidence=["https://example.org/evidence"]), None),  # URLs: online
])
def test_each_check_of_the_validator(change, problem):
    _metadata, items = checklist.checklist()
    document = checklist.filled_in(METADATA, items, all_implemented())
    change(document)
    problems = checklist.structural_problems(document, items, {f"{i.id}.log" for i in items})
    assert problems == ([problem] if problem else [])


def test_junit_has_a_case_per_item_failing_only_a_must_in_scope_that_is_not_implemented():
    _metadata, items = checklist.checklist()
    results = all_implemented()
    results["gang_scheduling"] = Result("gang_scheduling", NOT_IMPLEMENTED, "queues is not configured",
                                        log=["no ClusterQueue of ours"])
    results["ai_inference"] = Result("ai_inference", NOT_IMPLEMENTED, "no Gateway API", in_scope=False)
    results["virtualized_accelerator"] = Result("virtualized_accelerator", NOT_APPLICABLE, "no vGPU", in_scope=False)
    suite = ElementTree.fromstring(checklist.junit(items, results))
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert list(cases) == [i.id for i in items] and suite.get("tests") == str(len(items))
    assert [n for n, c in cases.items() if c.find("failure") is not None] == ["gang_scheduling"]
    assert sorted(n for n, c in cases.items() if c.find("skipped") is not None) == ["ai_inference",
                                                                                     "virtualized_accelerator"]
    assert (suite.get("failures"), suite.get("skipped")) == ("1", "2")
    assert "no ClusterQueue of ours" in cases["gang_scheduling"].find("failure").text
    assert [i.id for i in items if checklist.fails_the_run(i, results[i.id])] == ["gang_scheduling"]
