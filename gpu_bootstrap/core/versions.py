"""Versions, in one place: parsing Kubernetes and chart versions, Helm's kubeVersion constraints, and the release
catalogues that say which release of a chart fits which Kubernetes version (data/<chart>-versions.yaml), with the one
rule every chart's version choice follows: the newest release line whose row admits the cluster's version, and a
refusal naming the nearest lines on both sides and the two ways out when none does.
Pure: no cluster, no helm.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import yaml

from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.core.paths import DATA

# 'v1.31.4', '1.31', and the build suffixes distributions add after the patch ('1.31.4+k3s1', '1.31.4-eks-2d5f260')
KUBE_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+)(?:[-+][0-9A-Za-z][0-9A-Za-z.+-]*)?)?")
DEFAULT_KUBE_VERSION = "1.33.0"  # offline plans and simulate without a cluster: inside the default release's range


# --- parsing ----------------------------------------------------------------------------------------------------------
def minor_of(version: str) -> tuple[int, int]:
    """'v1.31.4' -> (1, 31). Raises ValueError for text that is not a version."""
    match = re.match(r"v?(\d+)\.(\d+)", version)
    if not match:
        raise ValueError(f"not a version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def version_tuple(text: str | None, parts: int = 3) -> tuple[int, ...]:
    """The first `parts` numbers of a version string ('1.7.30-k3s1' -> (1, 7, 30)); (0,) when there are none."""
    return tuple(int(p) for p in re.findall(r"\d+", text or "")[:parts]) or (0,)


def normalize_kube_version(text: str) -> str:
    """'1.31', 'v1.31.2' or '1.31.2+k3s1' -> '1.31.0' / '1.31.2' / '1.31.2'. Raises ValueError for anything else."""
    match = KUBE_VERSION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes version")
    major, minor, patch = match.groups()
    return f"{major}.{minor}.{patch or 0}"


# The newest patch release of each Kubernetes minor that this release of gpu-bootstrap knows (kubernetes.io/releases,
# read 2026-11-24). Where only a minor is known (an offline plan for "1.24", another command given "1.24"), the
# control-plane images use it: a vX.Y.0 image carries every bug fixed since, and the skew policy only speaks of minors.
KUBE_NEWEST_PATCH = {(1, 23): 17, (1, 24): 17, (1, 25): 16, (1, 26): 15, (1, 27): 16, (1, 28): 15, (1, 29): 15,
                     (1, 30): 14, (1, 31): 14, (1, 32): 11, (1, 33): 7, (1, 34): 8, (1, 35): 9, (1, 36): 4,
                     (1, 37): 1}


def control_plane_version(text: str) -> str:
    """The Kubernetes version a control-plane image (kube-scheduler) should carry for a cluster of version `text`:
    the exact patch when `text` has one ('v1.31.4', '1.31.4+k3s1' -> '1.31.4'), else the newest known patch of its
    minor ('1.24' -> '1.24.17'); 'x.y.0' only for a minor newer than the table. Raises ValueError for non-versions."""
    match = KUBE_VERSION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes version")
    major, minor, patch = match.groups()
    if patch is not None:
        return f"{major}.{minor}.{patch}"
    return f"{major}.{minor}.{KUBE_NEWEST_PATCH.get((int(major), int(minor)), 0)}"


def skew_problem(component: str, component_version: str, server: str) -> str:
    """Why a control-plane component's version breaks the skew policy against the API server ('' when allowed): never
    newer than the API server, at most one minor older (kubernetes.io/releases/version-skew-policy)."""
    ours, theirs = minor_of(component_version), minor_of(server)
    if ours > theirs:
        return f"{component} {component_version} is newer than the API server ({server})"
    if ours[0] != theirs[0] or theirs[1] - ours[1] > 1:
        return f"{component} {component_version} is more than one minor older than the API server ({server})"
    return ""


def server_version(info: dict) -> str:
    """The API server's /version answer -> 'x.y.z' (build suffixes such as '-eks-…' or '+k3s1' dropped)."""
    return (info.get("gitVersion") or "").lstrip("v").split("-")[0].split("+")[0]


def constraint_allows(constraint: str, kube_version: str) -> bool:
    """A chart's kubeVersion (e.g. '>= 1.16.0-0', '>=1.25.0-0 <1.38.0') against a server version."""
    kube = tuple(int(p) for p in re.findall(r"\d+", kube_version)[:3])
    constraint = re.sub(r"(\d)-[0-9A-Za-z.]+", r"\1", constraint or "")  # pre-release suffixes: '1.16.0-0'
    for op, version in re.findall(r"(>=|<=|>|<|=|\^|~)?\s*v?(\d+(?:\.\d+){0,2})", constraint):
        bound = tuple(int(p) for p in version.split("."))
        bound += (0,) * (3 - len(bound))
        checks = {">=": kube >= bound, ">": kube > bound, "<=": kube <= bound, "<": kube < bound,
                  "=": kube == bound, "": kube == bound, "^": kube >= bound and kube[0] == bound[0],
                  "~": kube >= bound and kube[:2] == bound[:2]}
        if not checks.get(op, True):
            return False
    return True


# --- release catalogues: which release of a chart fits which Kubernetes -----------------------------------------------
MINORS = range(100)  # the Kubernetes 1.x minors a catalogue is scanned over (nearest lines, docs/supported-versions.md)


def minor_text(minor: tuple[int, int]) -> str:
    return f"{minor[0]}.{minor[1]}"


@dataclass(frozen=True)
class Release:
    """One row of a catalogue: a release line, the version installed when it is chosen (its newest release), and
    the Kubernetes versions it fits, as a validated range of minors or as a Helm kubeVersion constraint."""

    line: str  # "26.7" (a gpu-operator release line), "88" (a chart major)
    version: str  # "v26.7.0": what is installed when this line is chosen
    source: str
    kube_min: tuple[int, int] | None = None
    kube_max: tuple[int, int] | None = None
    constraint: str = ""  # e.g. ">=1.25.0-0": the chart's own kubeVersion, when the row gives no validated range
    note: str = ""  # where sources disagree, and which reading the row follows

    def admits(self, kube_version: str) -> bool:
        if self.constraint:
            return constraint_allows(self.constraint, kube_version)
        return self.kube_min <= minor_of(kube_version) <= self.kube_max

    def minors(self) -> tuple[tuple[int, int], ...]:
        return tuple((1, m) for m in MINORS if self.admits(f"1.{m}.0"))

    @property
    def label(self) -> str:
        """'v26.7.x', '88.x': the line as people write it."""
        return f"{'v' if self.version.startswith('v') else ''}{self.line}.x"

    @property
    def range(self) -> str:
        """'1.33-1.37', or the constraint ('>=1.25.0-0')."""
        if self.constraint:
            return self.constraint
        return f"{minor_text(self.kube_min)}-{minor_text(self.kube_max)}"

    def describe(self) -> str:
        """For lists of releases: 'validated for 1.23-1.30' / 'kubeVersion >=1.19.0-0'."""
        return f"kubeVersion {self.constraint}" if self.constraint else f"validated for {self.range}"

    def requirement(self) -> str:
        """For refusals: 'is validated for Kubernetes 1.33-1.37' / 'requires Kubernetes >=1.25.0-0'."""
        return f"requires Kubernetes {self.constraint}" if self.constraint else \
            f"is validated for Kubernetes {self.range}"


@dataclass(frozen=True)
class Catalogue:
    chart: str  # "gpu-operator"
    section: str  # the config section whose `version` pins a release and whose `skip_version_check` overrides
    rule: str  # why the default is what it is ({kube}: 'x.y'): "newest release NVIDIA validated for Kubernetes 1.32"
    verb: str  # "is validated for" / "admits": "no <chart> release in gpu-bootstrap's table <verb> Kubernetes X"
    releases: tuple[Release, ...]  # newest line first
    file: str = ""

    def fitting(self, kube_version: str) -> list[Release]:
        return [release for release in self.releases if release.admits(kube_version)]

    def line_of(self, version: str) -> Release | None:
        """The row of a chart version's line ('v25.3.1' -> the 25.3 row), or None when the table lacks it."""
        for release in self.releases:
            parts = tuple(int(p) for p in release.line.split("."))
            if version_tuple(version, len(parts)) == parts:
                return release
        return None

    def nearest(self, kube_version: str) -> tuple[Release | None, Release | None]:
        """The closest lines on either side of a version no line admits: (the one for the newest older Kubernetes,
        the one for the oldest newer Kubernetes); newer lines win ties."""
        kube = minor_of(kube_version)
        older = [(max(m for m in r.minors() if m < kube), i, r) for i, r in enumerate(self.releases)
                 if any(m < kube for m in r.minors())]
        newer = [(min(m for m in r.minors() if m > kube), i, r) for i, r in enumerate(self.releases)
                 if any(m > kube for m in r.minors())]
        below = max(older, key=lambda t: (t[0], -t[1]))[2] if older else None
        above = min(newer, key=lambda t: (t[0], t[1]))[2] if newer else None
        return below, above


@dataclass(frozen=True)
class Choice:
    """The release to install and why, in one line for the plan."""

    release: Release | None  # None: a pinned version whose line the table does not have
    version: str
    reason: str
    validated: bool = True  # False: installed outside the table's ranges (skip_version_check) or not in it
    warning: str = ""


class UnsupportedVersion(ConfigError):
    """No release in the table fits the cluster's Kubernetes version, or the pinned one does not: bad input (exit
    2), refused before anything is written."""


CATALOGUES = {
    "gpu-operator": dict(file="gpu-operator-versions.yaml", section="gpu_operator",
                         rule="newest release NVIDIA validated for Kubernetes {kube}", verb="is validated for"),
    "kube-prometheus-stack": dict(file="kube-prometheus-stack-versions.yaml", section="monitoring",
                                  rule="newest release whose kubeVersion admits Kubernetes {kube}", verb="admits"),
}


def _release(row: dict, file: str) -> Release:
    try:
        line, version, source = str(row["line"]), str(row["latest"]), str(row["source"])
    except (KeyError, TypeError):
        raise ValueError(f"{file}: every row needs line, latest and source: {row!r}") from None
    if bool(row.get("kubernetes")) == bool(row.get("kube_version")):
        raise ValueError(f"{file}: line {line} needs exactly one of kubernetes: {{min, max}} and kube_version")
    if row.get("kubernetes"):
        low, high = minor_of(str(row["kubernetes"]["min"])), minor_of(str(row["kubernetes"]["max"]))
        if low > high:
            raise ValueError(f"{file}: line {line}: min {low} is above max {high}")
        return Release(line, version, source, low, high, note=str(row.get("note", "")))
    return Release(line, version, source, constraint=str(row["kube_version"]), note=str(row.get("note", "")))


@functools.lru_cache(maxsize=None)
def catalogue(chart: str) -> Catalogue:
    """The catalogue of a chart from data/<chart>-versions.yaml, newest line first."""
    spec = CATALOGUES[chart]
    rows = yaml.safe_load((DATA / spec["file"]).read_text())
    releases = sorted((_release(row, spec["file"]) for row in rows),
                      key=lambda r: tuple(int(p) for p in r.line.split(".")), reverse=True)
    return Catalogue(chart, spec["section"], spec["rule"], spec["verb"], tuple(releases), spec["file"])


def choose(cat: Catalogue, kube_version: str, skip_check: bool = False) -> Choice:
    """The default release for a cluster: the newest line that admits its Kubernetes version. When none does, a
    refusal; with skip_check the nearest line instead, flagged as not validated."""
    kube = minor_text(minor_of(kube_version))
    fits = cat.fitting(kube_version)
    if fits:
        scope = fits[0].range if not fits[0].constraint else f"kubeVersion {fits[0].constraint}"
        return Choice(fits[0], fits[0].version, f"{cat.rule.format(kube=kube)} ({scope})")
    if skip_check:
        below, above = cat.nearest(kube_version)
        release = _closest(kube_version, below, above)
        if release is not None:
            text = (f"no release {cat.verb} Kubernetes {kube}; the nearest line, {release.label} "
                    f"({release.describe()}), at your own risk ({cat.section}.skip_version_check: true)")
            return Choice(release, release.version, text, validated=False, warning=f"{cat.chart} {release.version}: "
                                                                                  f"{text}")
    raise refusal(cat, kube_version)


def _closest(kube_version: str, below: Release | None, above: Release | None) -> Release | None:
    if below is None or above is None:
        return below or above
    kube = minor_of(kube_version)[1]
    gap_below = kube - max(m for _, m in below.minors() if m < kube)
    gap_above = min(m for _, m in above.minors() if m > kube) - kube
    return below if gap_below <= gap_above else above


def check_pin(cat: Catalogue, version: str, kube_version: str, constraint: str | None = None,
              skip_check: bool = False, pinned_by: str = "") -> Choice:
    """A release the config names (a pinned version, or a local chart's version; `constraint` is its chart's own
    kubeVersion when known) against the cluster: accepted with the reason, or refused naming the releases that fit."""
    pinned_by = pinned_by or f"pinned by {cat.section}.version"
    kube = minor_text(minor_of(kube_version))
    row = cat.line_of(version)
    if row is not None and row.admits(kube_version):
        return Choice(row, version, f"{pinned_by}; {row.label}: {row.describe()}")
    if row is None and (not constraint or constraint_allows(constraint, kube_version)):
        checked = f"its chart's kubeVersion {constraint} admits {kube}" if constraint else \
            "its Kubernetes range is not checked"
        text = f"{pinned_by}; {version} is not in gpu-bootstrap's table, so {checked}"
        return Choice(None, version, text, validated=False, warning=f"{cat.chart} {version} is not in "
                                                                    f"gpu-bootstrap's table: {checked}")
    requirement = row.requirement() if row is not None else f"requires Kubernetes {constraint}"
    if skip_check:
        text = (f"{pinned_by}; {version} {requirement}, not {kube}: installed anyway "
                f"({cat.section}.skip_version_check: true)")
        return Choice(row, version, text, validated=False,
                      warning=f"{cat.chart} {version} {requirement}, but the cluster runs {kube_version}: installed "
                              f"anyway ({cat.section}.skip_version_check: true)")
    raise refusal(cat, kube_version, version, requirement)


def refusal(cat: Catalogue, kube_version: str, pinned: str | None = None,
            requirement: str = "") -> UnsupportedVersion:
    """The error for a cluster no release fits (pinned=None), or for a pinned release that does not fit: the
    releases that fit instead, or else the nearest lines on both sides; and the two ways out."""
    skip = f"or set {cat.section}.skip_version_check: true"
    if pinned is not None:
        subject = f"{cat.chart} {pinned} {requirement}, but the cluster runs {kube_version}"
        fits = cat.fitting(kube_version)
        if fits:
            listed = ", ".join(f"{r.version} ({r.describe()})" for r in fits)
            return UnsupportedVersion(f"{subject}; releases that fit: {listed}",
                                      f"pin one of them in {cat.section}.version (and {cat.section}.chart for a local "
                                      f"chart), {skip} to install {pinned} at your own risk")
        return UnsupportedVersion(f"{subject}, and no release in gpu-bootstrap's table {cat.verb} it; "
                                  f"{_nearest_text(cat, kube_version)}",
                                  f"pin another {cat.section}.version, {skip} to install {pinned} at your own risk")
    closest = _closest(kube_version, *cat.nearest(kube_version))
    anyway = f" to install {closest.version}" if closest else ""
    return UnsupportedVersion(f"no {cat.chart} release in gpu-bootstrap's table {cat.verb} Kubernetes {kube_version}; "
                              f"{_nearest_text(cat, kube_version)}",
                              f"pin {cat.section}.version to a release you have tested, {skip}{anyway} at your own "
                              f"risk")


def _nearest_text(cat: Catalogue, kube_version: str) -> str:
    """'the nearest lines are none for older Kubernetes and v24.6.x (validated for 1.23-1.30) for newer'"""
    below, above = cat.nearest(kube_version)
    older = f"{below.label} ({below.describe()})" if below else "none"
    newer = f"{above.label} ({above.describe()})" if above else "none"
    return f"the nearest lines are {older} for older Kubernetes and {newer} for newer"


# --- a deployed chart against the planned one (the gpu-operator's and the monitoring stack's steps) ----------------
def downgrade_refusal(section, name: str, release: dict, version: str) -> str:
    """Why a planned downgrade is refused ('' when it is no downgrade, or `<name>.allow_downgrade` is set)."""
    if not release.get("downgrade") or section.allow_downgrade:
        return ""
    return (f"{section.release} {release['installed']} is installed, newer than the {version} the config asks for "
            f"(a pinned {name}.version, a local chart, or an older gpu-bootstrap's default): a downgrade is refused, "
            f"since CRDs and the objects stored with them do not go back — pin {name}.version to "
            f"{release['installed']}, or set {name}.allow_downgrade: true to downgrade anyway")


def version_change(installed: str, version: str) -> dict:
    """The release state of a deployed chart whose version differs from the one planned: an upgrade, or a downgrade
    (which downgrade_refusal refuses unless allowed)."""
    downgrade = version_tuple(version) < version_tuple(installed)
    verb = "downgrade" if downgrade else "upgrade"
    return {"up_to_date": False, "reason": f"{verb} {installed} → {version}", "installed": installed,
            "downgrade": downgrade}
