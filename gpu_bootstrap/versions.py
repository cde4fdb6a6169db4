"""Versions, in one place: parsing Kubernetes and chart versions, Helm's kubeVersion constraints, and the catalogue
of which gpu-operator release NVIDIA validated for which Kubernetes versions (data/gpu-operator-versions.yaml).
Pure: no cluster, no helm."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import yaml

from .paths import PACKAGE

KUBE_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")
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
    """'1.31' or 'v1.31.2' -> '1.31.0' / '1.31.2'. Raises ValueError for anything else."""
    match = KUBE_VERSION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes version")
    major, minor, patch = match.groups()
    return f"{major}.{minor}.{patch or 0}"


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


# --- the gpu-operator catalogue ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Line:
    line: str  # "26.7"
    latest: str
    k8s_min: tuple[int, int]
    k8s_max: tuple[int, int]
    source: str

    def supports(self, kube: tuple[int, int]) -> bool:
        return self.k8s_min <= kube <= self.k8s_max

    @property
    def range(self) -> str:
        return f"{self.k8s_min[0]}.{self.k8s_min[1]}-{self.k8s_max[0]}.{self.k8s_max[1]}"


@functools.lru_cache(maxsize=1)
def table() -> tuple[Line, ...]:
    rows = yaml.safe_load((PACKAGE / "data" / "gpu-operator-versions.yaml").read_text())
    return tuple(Line(str(r["line"]), r["latest"], minor_of(r["kubernetes"]["min"]), minor_of(r["kubernetes"]["max"]),
                      r.get("source", "")) for r in rows)


def line_of(operator_version: str) -> Line | None:
    key = "%d.%d" % minor_of(operator_version)
    return next((line for line in table() if line.line == key), None)


def fitting(kube_version: str) -> list[Line]:
    kube = minor_of(kube_version)
    return sorted((line for line in table() if line.supports(kube)), key=lambda l: minor_of(l.line), reverse=True)
