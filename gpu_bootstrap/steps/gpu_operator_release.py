"""Is a deployed helm release of the gpu-operator step (the operator's, or the DRA driver's beside it) what the step
would deploy? Read from helm's record, or, where that record is unreadable (the dry identities), from the live
objects (adapters/secretless.py)."""
from __future__ import annotations

import yaml

from gpu_bootstrap.core.refs import Chart
from gpu_bootstrap.core.versions import version_change
from gpu_bootstrap.render import live_diff


def release_state(ctx, status: dict | None, chart: Chart, version: str, values: dict | None,
                   name: str | None = None, namespace: str | None = None) -> dict:
    """Is the deployed release (helm status) what we would deploy? values=None: no node facts (doctor
    --no-nodes), so only the chart version can be compared. `name`/`namespace`: another release of the step
    (the DRA driver's); default the operator's."""
    section = ctx.config.gpu_operator
    name, namespace = name or section.release, namespace or section.namespace
    if status is None:
        return {"up_to_date": False, "reason": "not installed", "installed": None}
    deployed = ctx.helm.deployed_chart(name, namespace, version) or ""
    installed = deployed.rsplit("-", 1)[-1] if "-" in deployed else deployed
    state = (status.get("info") or {}).get("status")
    if state and (state.startswith("pending") or state == "uninstalling"):
        return {"up_to_date": False, "reason": f"release is {state} (an interrupted helm run)",
                "installed": installed, "pending": state}
    if state != "deployed":
        return {"up_to_date": False, "reason": f"release is {state}", "installed": installed}
    if installed.lstrip("v") != version.lstrip("v"):
        return version_change(installed, version)
    if values is None:
        return {"up_to_date": True, "reason": "deployed (values not compared without node facts)",
                "installed": installed}
    if status.get("values_unknown"):
        return live_diff.release_state(ctx.helm.live_differences(name, chart, values, namespace), installed)
    if (status.get("config") or {}) != values:
        return {"up_to_date": False, "reason": "values changed", "installed": installed}
    if _documents(ctx.helm.dry_run_manifest(name, chart, values, namespace)) != \
            _documents(status.get("manifest", "")):
        return {"up_to_date": False, "reason": "the rendered manifest differs from the deployed one",
                "installed": installed}
    return {"up_to_date": True, "reason": "up to date", "installed": installed}


def _documents(manifest: str) -> list:
    """A manifest as a sorted list of documents, so formatting and order do not count as a difference."""
    docs = [doc for doc in yaml.safe_load_all(manifest or "") if doc]
    return sorted(docs, key=lambda d: (d.get("kind", ""), (d.get("metadata") or {}).get("namespace", ""),
                                       (d.get("metadata") or {}).get("name", "")))
