"""The manual: README.md short, the docs site built by the real MkDocs (strict: a broken link or a page missing
from the nav fails), the generated pages (CLI and config references, the config's JSON Schema) current, and every
module path the README or the docs name importable."""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools import missing

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))


def generator():
    loader = importlib.machinery.SourceFileLoader("generate_docs", str(ROOT / "scripts" / "generate-docs"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("generate_docs", loader))
    loader.exec_module(module)
    return module


@pytest.mark.unit
def test_the_generated_pages_are_current():
    stale = [str(path.relative_to(ROOT)) for path, text in generator().pages().items()
             if not path.exists() or _differs(path.read_text(), text)]
    assert stale == [], f"stale, run scripts/generate-docs: {stale}"


def _differs(written: str, generated: str) -> bool:
    """With a toy step inserted (GPU_BOOTSTRAP_TOY_STEP_AT, tests/conftest.py) the pages that list the steps gain
    its lines, which a contributor adding a step writes with scripts/generate-docs: only those lines may differ."""
    import difflib
    import os
    if written == generated or not os.environ.get("GPU_BOOTSTRAP_TOY_STEP_AT"):
        return written != generated
    from tests.toy_step import TOY
    changed = [line for line in difflib.ndiff(written.splitlines(), generated.splitlines())
               if line[:2] in ("- ", "+ ")]
    return not all(line.startswith("+ ") and TOY in line for line in changed)


# What belongs to the project's own history, not to a user's manual: our issue numbers, the shared folder the tests
# read (`../shared`), and notes about the machine something was measured on
DEVELOPER_NOTES = {
    "an issue number": re.compile(r"\bissues? \d+\b|(?<![\w/.\-\]])#\d+\b", re.IGNORECASE),
    "the shared folder": re.compile(r"\.\./shared\b"),
    "a machine note": re.compile(r"\d+-core machine|while other work ran|shared by \w+ developers|\bthis busy\b|"
                                 r"\bon this machine\b|\bhere\b(?= on \d+ cores)", re.IGNORECASE),
}


@pytest.mark.unit
def test_the_docs_carry_no_developer_notes_outside_how_it_is_built():
    """Found: "How this is proved (issue 11)", "on this 2-core machine while other work ran", "the default until
    #32", `../shared/traces/…` in the user's docs. Upstream references stay (owner/repo#N, links)."""
    found = []
    for page in [*PAGES, *DOCS.rglob("*.json")]:
        if page.name == "how-it-is-built.md":
            continue
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for what, pattern in DEVELOPER_NOTES.items():
                match = pattern.search(line)
                if match:
                    found.append(f"{page.relative_to(ROOT)}:{number}: {what}: {match.group(0)!r}")
    assert found == [], "\n".join(found)


@pytest.mark.unit
@pytest.mark.parametrize("line, flagged", [
    ("How this is proved (issue 11).", True), ("the default until #32", True), ("`../shared/traces/x.csv`", True),
    ("on this busy 2-core machine", True), ("NVIDIA/cloud-native-docs#488", False),
    ("[a](https://github.com/o/r/issues/883)", False), ("see [Testing](#testing-on-a-real-cluster)", False),
])
def test_the_developer_notes_check_tells_them_from_upstream_references(line, flagged):
    assert any(p.search(line) for p in DEVELOPER_NOTES.values()) is flagged


@pytest.mark.tools
def test_the_inventory_of_what_up_changes_is_current(helm_on_path):
    """docs/what-up-changes.md is made from the steps' own plans (`up` offline, then the teardown of what it leaves,
    with and without --purge-crds), with helm rendering the pinned charts to name their CRDs."""
    module = generator()
    tools = module.inventory_tools()
    if tools is None:
        missing("helm or the pinned charts are missing: the inventory names the charts' CRDs")
    text = module.what_up_changes(*tools)
    assert (DOCS / "what-up-changes.md").read_text() == text, "stale, run scripts/generate-docs"
    for expected in ("`nvidia.com/gpu=present:NoSchedule`", "MutatingWebhookConfiguration `gpu-bootstrap-gpu-pods`",
                     "`clusterpolicies.nvidia.com`", "`prometheusrules.monitoring.coreos.com`",
                     "Lease kube-system/gpu-binpack-scheduler"):
        assert expected in text, expected


@pytest.mark.unit
def test_the_cli_reference_names_every_command_and_option():
    import click
    import typer.main

    from gpu_bootstrap.cli.commands import app
    text = (DOCS / "reference" / "cli.md").read_text()
    group = typer.main.get_command(app)
    root = click.Context(group)
    for name in group.list_commands(root):
        assert f"## `gpu-bootstrap {name}`" in text
        for param in group.get_command(root, name).params:
            if param.param_type_name == "option" and not param.hidden:
                assert f"`{param.opts[-1]}`" in text, (name, param.opts)


@pytest.mark.unit
def test_the_readme_is_short_and_starts_with_the_two_fresh_machine_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    block = lines[lines.index("```bash") + 1:lines.index("```bash") + 3]
    assert block[0].startswith("pip install . && gpu-bootstrap up") and block[1] == "scripts/test", block


@pytest.mark.unit
def test_every_relative_link_of_the_readme_exists():
    text = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) if not t.startswith("http")]
    assert targets and all((ROOT / t).exists() for t in targets), [t for t in targets if not (ROOT / t).exists()]


FOLDERS = sorted(p.name for p in (ROOT / "gpu_bootstrap").iterdir() if (p / "__init__.py").exists())


@pytest.mark.unit
def test_every_module_path_the_readme_and_the_docs_name_imports():
    named = set()
    for page in [ROOT / "README.md", *PAGES]:
        text = page.read_text()
        named |= set(re.findall(r"\bgpu_bootstrap(?:\.[a-z_][a-z0-9_]*)+", text))
        named |= {p[:-3].replace("/", ".") for p in re.findall(r"\bgpu_bootstrap/[a-z_/]+\.py\b", text)}
        # a package folder's file named without the package (render/scheduler.py), but not tests/ or scripts/ ones
        named |= {"gpu_bootstrap." + p[:-3].replace("/", ".") for p in re.findall(
            r"(?<![\w/.])(?:" + "|".join(FOLDERS) + r")(?:/[a-z_]+)+\.py\b", text)}
    assert len(named) >= 8, named
    failed = []
    for name in sorted(named):
        parts = name.split(".")
        for end in range(len(parts), 0, -1):  # gpu_bootstrap.render.versions_table.markdown: a module, then a name
            try:
                module = importlib.import_module(".".join(parts[:end]))
            except ModuleNotFoundError:
                continue
            attribute = parts[end:]
            obj = module
            for part in attribute:
                obj = getattr(obj, part, None)
            if obj is None:
                failed.append(name)
            break
        else:
            failed.append(name)
    assert failed == [], failed


@pytest.mark.unit
def test_every_page_is_in_the_nav():
    import yaml

    def listed(nav) -> set[str]:
        found = set()
        for entry in nav:
            for value in (entry.values() if isinstance(entry, dict) else [entry]):
                found |= listed(value) if isinstance(value, list) else {value}
        return found
    nav = listed(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    pages = {p.relative_to(DOCS).as_posix() for p in PAGES}
    assert pages == nav, (sorted(pages - nav), sorted(nav - pages))


@pytest.mark.tools
def test_the_docs_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        missing("mkdocs and mkdocs-material are not installed (pip install '.[docs]')")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                            "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=300,
                           env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})  # tool_env: mkdocs
    assert built.returncode == 0, built.stderr[-3000:]
    for page in PAGES:
        html = tmp_path / "site" / page.relative_to(DOCS).with_suffix("") / "index.html"
        if page.name == "index.md":
            html = tmp_path / "site" / page.relative_to(DOCS).parent / "index.html"
        assert html.exists(), f"{page.relative_to(ROOT)} was not built"
