"""constraints.txt pins every Python dependency the project and its test and bench extras name (scripts/freeze-constraints),
and the test toolchain installs with it (so CI and scripts/test test the same versions)."""
from __future__ import annotations

import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.tools import ROOT

pytestmark = pytest.mark.unit


def pinned() -> dict[str, Version]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not name==version"
            out[canonicalize_name(name)] = Version(version)
    return out


def test_every_direct_dependency_is_pinned_within_its_bounds():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    versions = pinned()
    extras = project["optional-dependencies"]
    for text in project["dependencies"] + extras["test"] + extras["bench"]:
        requirement = Requirement(text)
        if requirement.marker and not requirement.marker.evaluate():
            continue  # not for this Python (opa-golib-python-bindings: install-test-tools pins it itself)
        name = canonicalize_name(requirement.name)
        assert name in versions, f"{requirement.name} is not in constraints.txt (run scripts/freeze-constraints)"
        assert requirement.specifier.contains(versions[name], prereleases=True), (text, versions[name])


def test_the_toolchain_installs_with_the_constraints():
    script = (ROOT / "scripts" / "install-test-tools").read_text()
    assert re.search(r'"-c", str\(ROOT / "constraints.txt"\)', script)
    assert "scripts/install-test-tools" in (ROOT / "scripts" / "test").read_text()
