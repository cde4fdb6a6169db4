"""Which gpu-operator release fits which Kubernetes version: the validated table (data), pure lookups."""
from __future__ import annotations

import functools
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..paths import PACKAGE


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


def minor_of(version: str) -> tuple[int, int]:
    match = re.match(r"v?(\d+)\.(\d+)", version)
    if not match:
        raise ValueError(f"not a version: {version!r}")
    return int(match.group(1)), int(match.group(2))


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


def local_chart_metadata(ref: str) -> dict | None:
    """Chart.yaml of a local chart (.tgz or directory) without needing helm; None for a repository chart."""
    path = Path(ref).expanduser()
    if path.is_dir() and (path / "Chart.yaml").exists():
        return yaml.safe_load((path / "Chart.yaml").read_text())
    if path.is_file() and path.name.endswith((".tgz", ".tar.gz")):
        with tarfile.open(path, "r:gz") as archive:
            member = next((m for m in archive.getmembers() if m.name.count("/") == 1
                           and m.name.endswith("/Chart.yaml")), None)
            if member is not None:
                return yaml.safe_load(archive.extractfile(member).read())
    return None


def is_local(ref: str) -> bool:
    return ref.startswith((".", "/", "~")) or ref.endswith((".tgz", ".tar.gz")) or Path(ref).expanduser().exists()
