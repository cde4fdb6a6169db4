"""The Kubernetes AI Conformance checklist, filled in: the program's YAML shape, a JUnit file with one test case per
item, and the structural checks of the program's own validator (cncf/k8s-ai-conformance scripts/validate.go), so a
submission's problems are told before it is sent.

Pure: the live checks are app/conformance.py's; this module turns their results into documents.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

import yaml

from gpu_bootstrap.core.paths import DATA

IMPLEMENTED, PARTIAL, NOT_IMPLEMENTED, NOT_APPLICABLE = ("Implemented", "Partially Implemented", "Not Implemented",
                                                         "N/A")
STATUSES = (IMPLEMENTED, PARTIAL, NOT_IMPLEMENTED, NOT_APPLICABLE)
# validate.go's metadataFields: name -> required
METADATA_FIELDS = {"kubernetesVersion": True, "platformName": True, "platformVersion": True, "vendorName": True,
                   "websiteUrl": True, "repoUrl": False, "documentationUrl": True, "productLogoUrl": True,
                   "description": True, "contactEmailAddress": True, "k8sConformanceUrl": True}
K8S_CONFORMANCE_URL = re.compile(r"^https://github\.com/cncf/k8s-conformance/tree/(master|main)/v\d+\.\d+/[^/]+/?$")


@dataclass(frozen=True)
class Item:
    """One requirement of the checklist, as the program's file states it."""

    section: str
    id: str
    level: str  # MUST or SHOULD
    description: str


@dataclass
class Result:
    """What one live check found for one item. `in_scope`: gpu-bootstrap provides what the item asks for, so a MUST
    that is not Implemented fails the run; items outside it are reported honestly and never fail it."""

    id: str
    status: str
    notes: str
    in_scope: bool = True
    evidence: list[str] = field(default_factory=list)  # file names beside the checklist
    log: list[str] = field(default_factory=list)  # what the check did and saw, written to <id>.log
    seconds: float = 0.0


def checklist() -> tuple[dict, list[Item]]:
    """The program's checklist file (metadata placeholders, items in order)."""
    document = yaml.safe_load((DATA / "ai-conformance.yaml").read_text())
    items = [Item(section, entry["id"], entry["level"], entry["description"])
             for section, entries in document["spec"].items() for entry in entries]
    return document["metadata"], items


def fails_the_run(item: Item, result: Result) -> bool:
    """Exit 1: a MUST that gpu-bootstrap's platform covers is not Implemented."""
    return item.level == "MUST" and result.in_scope and result.status != IMPLEMENTED


def filled_in(metadata: dict, items: list[Item], results: dict[str, Result]) -> dict:
    """The checklist in the program's shape: `metadata`, then per section its items with status, evidence, notes."""
    spec: dict[str, list] = {}
    for item in items:
        result = results[item.id]
        spec.setdefault(item.section, []).append({
            "id": item.id, "description": item.description, "level": item.level, "status": result.status,
            "evidence": list(result.evidence), "notes": result.notes})
    return {"metadata": dict(metadata), "spec": spec}


def as_yaml(document: dict) -> str:
    header = ("# Kubernetes AI Conformance Checklist, filled in by `gpu-bootstrap doctor --conformance` from live checks\n"
              "# on the cluster; each item's evidence files are beside this one, with junit.xml.\n")
    return header + yaml.safe_dump(document, sort_keys=False, width=120, allow_unicode=True)


def junit(items: list[Item], results: dict[str, Result]) -> str:
    """One test case per item (classname: its section): a failure for a MUST in scope that is not Implemented,
    skipped for an item gpu-bootstrap does not cover or does not implement, passed otherwise."""
    cases, failures, skipped = [], 0, 0
    for item in items:
        result = results[item.id]
        inner = ""
        message = quoteattr(f"{result.status}: {result.notes}")
        if fails_the_run(item, result):
            failures += 1
            inner = f"<failure message={message}>{escape(chr(10).join(result.log))}</failure>"
        elif result.status in (NOT_IMPLEMENTED, NOT_APPLICABLE):
            skipped += 1
            inner = f"<skipped message={message}/>"
        output = f"<system-out>{escape(chr(10).join(result.log))}</system-out>" if result.log else ""
        cases.append(f'  <testcase classname={quoteattr(item.section)} name={quoteattr(item.id)} '
                     f'time="{result.seconds:.3f}">{inner}{output}</testcase>')
    total = sum(r.seconds for r in results.values())
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="ai-conformance" tests="{len(items)}" '
            f'failures="{failures}" errors="0" skipped="{skipped}" time="{total:.3f}">\n' + "\n".join(cases) +
            "\n</testsuite>\n")


def structural_problems(document: dict, items: list[Item], present: set[str]) -> list[str]:
    """What the program's validate.go would say, but for its network checks (URLs reachable, the vendor a CNCF
    member): metadata fields present, strings, not empty, not placeholders; k8sConformanceUrl's form; every item of
    every section present with a valid status; MUSTs Implemented; notes for N/A; local evidence files present
    (`present`: the names of the files beside the checklist). Worded as validate.go words them."""
    problems = []
    metadata = document.get("metadata")
    if metadata is None:
        problems.append("Missing 'metadata' section")
    else:
        problems += _metadata_problems(metadata)
    spec = document.get("spec")
    if spec is None:
        return problems + ["Missing 'spec' section"]
    for section in dict.fromkeys(item.section for item in items):
        if section not in spec:
            problems.append(f"Missing spec category: {section}")
            continue
        given = {entry.get("id"): entry for entry in spec[section] or []}
        for item in (i for i in items if i.section == section):
            if item.id not in given:
                problems.append(f"Missing requirement '{item.id}' in category '{section}'")
                continue
            problems += _item_problems(item, given[item.id], present)
    return problems


def _metadata_problems(metadata: dict) -> list[str]:
    problems = []
    for name, required in METADATA_FIELDS.items():
        value = metadata.get(name, metadata.get(_snake(name)))
        if value is None:
            if required:
                problems.append(f"Missing metadata field: {name} (or {_snake(name)})")
            continue
        if not isinstance(value, str):
            problems.append(f"Metadata field {name} is not a string")
        elif value == "":
            if required:
                problems.append(f"Metadata field {name} is empty")
        elif value.startswith("[") and value.endswith("]"):
            problems.append(f"Metadata field {name} has placeholder value: {value}")
        elif name == "k8sConformanceUrl" and not K8S_CONFORMANCE_URL.match(value):
            problems.append(f"Invalid k8sConformanceUrl format: {value}. Expected format: "
                            f"https://github.com/cncf/k8s-conformance/tree/master/v{{version}}/{{product}}")
    return problems


def _item_problems(item: Item, entry: dict, present: set[str]) -> list[str]:
    status, evidence = entry.get("status") or "", entry.get("evidence") or []
    if item.level == "SHOULD" and status == "" and not evidence:
        return []
    problems = []
    if status not in STATUSES:
        problems.append(f"Invalid status '{status}' for '{item.id}'. Must be one of {list(STATUSES)}")
    if item.level == "MUST" and status != IMPLEMENTED:
        problems.append(f"Requirement '{item.id}' is MUST level but status is '{status}'. It must be 'Implemented'.")
    if status == NOT_APPLICABLE and not entry.get("notes"):
        problems.append(f"Notes required for '{item.id}' when status is N/A")
    for link in evidence:
        if link and not link.startswith(("http://", "https://")) and link not in present:
            problems.append(f"Invalid evidence file for '{item.id}': {link} (not found)")
    return problems


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)
