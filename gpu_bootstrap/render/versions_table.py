"""The docs' "Supported versions" tables (docs/supported-versions.md), generated from the version catalogues
(`python -m gpu_bootstrap.render.versions_table`; a test fails when the page drifts from it). Pure."""
from __future__ import annotations

import sys

from gpu_bootstrap.core import versions
from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.render.scheduler import config_api_version


def markdown() -> str:
    """The catalogues as tables, and what `up` chooses for each Kubernetes minor (docs/supported-versions.md, between its markers)."""
    out = []
    for chart in versions.CATALOGUES:
        cat = versions.catalogue(chart)
        out += [f"`{chart}` (`gpu_bootstrap/core/data/{cat.file}`):", "",
                "| line | installs | Kubernetes | source |", "|---|---|---|---|"]
        out += [f"| {r.label} | {r.version} | {r.range} | {r.source} |" for r in cat.releases]
        out.append("")
    operator, monitoring = versions.catalogue("gpu-operator"), versions.catalogue("kube-prometheus-stack")
    admitted = sorted({m for r in operator.releases for m in r.minors()})
    minors = [(1, admitted[0][1] - 1), *admitted, (1, admitted[-1][1] + 1)]
    out += ["What is chosen by default for each Kubernetes minor (the scheduler's image is always",
            "`kube-scheduler:v<the API server's version>`; kube-prometheus-stack is what the monitoring step installs):", "",
            "| Kubernetes | gpu-operator | scheduler config | kube-prometheus-stack |", "|---|---|---|---|"]
    for minor in minors:
        kube = f"{versions.minor_text(minor)}.0"
        cells = [_cell(operator, kube), _scheduler_cell(kube), _cell(monitoring, kube)]
        out.append(f"| {versions.minor_text(minor)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _cell(cat: versions.Catalogue, kube: str) -> str:
    fits = cat.fitting(kube)
    return f"{fits[0].label} ({fits[0].version})" if fits else "refused"


def _scheduler_cell(kube: str) -> str:
    try:
        return f"`{config_api_version(kube).rsplit('/', 1)[-1]}`"
    except ConfigError:
        return "refused"


if __name__ == "__main__":  # pragma: no cover - `python -m gpu_bootstrap.render.versions_table`
    sys.stdout.write(markdown())
