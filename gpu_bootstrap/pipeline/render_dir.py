"""--render-dir: each step's changes written to DIR/<NN>-<step-id>/ as the exact documents sent to the cluster, and a
Helm release as its values, its reasons and (when the chart can be read) the manifests `helm template` renders.

Secrets stay in the cluster: everything written here passes through security/redact.py (a Secret's data, values
under secret-looking keys, webhook URLs, URL passwords, private keys), and the folders are 0700, the files 0600, so
a render is safe to keep as a CI artifact or attach to a review.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import yaml

from gpu_bootstrap.security import redact
from gpu_bootstrap.core.errors import UsageError
from gpu_bootstrap.core.refs import Chart, Verb
from gpu_bootstrap.pipeline.step import Change


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (a ConfigMap's embedded config file) as readable `|` blocks."""


def _str(dumper, value: str):
    style = "|" if "\n" in value and not any(line != line.rstrip() for line in value.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def dump(obj) -> str:
    return yaml.dump(obj, Dumper=_BlockDumper, sort_keys=False)


def prepare(folder: Path) -> None:
    """Start from a clean render: remove the NN-step folders a previous render left, keep anything else."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--render-dir {folder} exists and is not a directory")
    if not folder.exists():
        folder.mkdir(parents=True, mode=0o700)
        folder.chmod(0o700)  # whatever the umask
    for child in folder.iterdir():
        if child.is_dir() and re.fullmatch(r"\d\d-[a-z0-9-]+", child.name):
            shutil.rmtree(child)


class RenderDir:
    """Writes each step's changes under root/; `helm` renders charts (the real or the offline Helm adapter)."""

    def __init__(self, root: Path, order: list[str], helm):
        self.root = root
        self.order = order
        self.helm = helm
        self._counts: dict[str, int] = {}

    def folder(self, step_id: str) -> Path:
        index = self.order.index(step_id) + 1 if step_id in self.order else 0
        folder = self.root / f"{index:02d}-{step_id}"
        if not folder.is_dir():
            folder.mkdir(parents=True, mode=0o700, exist_ok=True)
            folder.chmod(0o700)
        return folder

    def write(self, step_id: str, change: Change) -> str | None:
        """Write one change; returns a problem to report when part of it could not be rendered."""
        folder = self.folder(step_id)
        count = self._counts[step_id] = self._counts.get(step_id, 0) + 1
        name = f"{count:02d}-{change.verb}-{change.target.kind.lower()}-{change.target.name}.yaml"
        header = [f"# {change.verb}" + (f" ({change.patch_type} patch)" if change.verb == Verb.PATCH else "") +
                  f" {change.target.api_version} {change.target}", f"# {change.summary}"]
        if change.reason:
            header.append(f"# why: {change.reason}")
        header += [f"#   {line}" for line in change.details]
        release = change.verb == Verb.HELM_UPGRADE
        shown = change.body if not release else {k: v for k, v in change.body.items() if k != "values"}
        if isinstance(shown, dict) and shown.get("kind") == "Secret":
            # A Secret's data may hold private keys: they never leave the cluster, not even into a render.
            header.append("# data redacted: a Secret's values (private keys) are never written outside the cluster")
            shown = {**{k: v for k, v in shown.items() if k not in ("data", "stringData")},
                     "data": {key: "<redacted>" for key in sorted({**(shown.get("data") or {}),
                                                                   **(shown.get("stringData") or {})})}}
        body = dump(redact.tree(shown)) if shown is not None else ""
        _write_private(folder / name, redact.text("\n".join(header)) + "\n" + body)
        _write_private(folder / "plan.txt", redact.text(change.describe()) + "\n", append=True)
        return self._write_release(step_id, change) if release else None

    def write_file(self, step_id: str, name: str, text: str) -> Path:
        path = self.folder(step_id) / name
        _write_private(path, text)
        return path

    def _write_release(self, step_id: str, change: Change) -> str | None:
        """values.yaml (the exact merged values), release.yaml (what and why) and manifests.yaml from `helm template`
        for the target Kubernetes version; when the chart cannot be rendered, a note saying why instead."""
        body = change.body
        self.write_file(step_id, "values.yaml", VALUES_NOTE + yaml.safe_dump(redact.tree(body["values"]),
                                                                              sort_keys=False))
        release = {key: body[key] for key in ("release", "namespace", "chart", "chart_version", "kube_version")}
        release["derived_values"] = body.get("derived", [])
        release["warnings"] = body.get("warnings", [])
        self.write_file(step_id, "release.yaml", yaml.safe_dump(redact.tree(release), sort_keys=False))
        chart = body["chart"]
        try:
            manifests = self.helm.template(body["release"], Chart(chart["ref"], chart.get("repo"),
                                                                  chart.get("version")),
                                           body["values"], body["namespace"], body["kube_version"])
        except Exception as error:  # noqa: BLE001 - a chart we cannot read offline is a note, not a failed plan
            reason = getattr(error, "one_line", lambda: str(error))()
            self.write_file(step_id, "manifests-not-rendered.txt",
                            f"helm template could not render {chart['ref']}: {reason}\n"
                            f"For air-gapped or offline plans, set {step_id.replace('-', '_')}.chart to a local .tgz "
                            f"(helm pull).\n")
            return f"{chart['ref']} manifests not rendered ({reason})"
        self.write_file(step_id, "manifests.yaml", redact.manifests(manifests))
        return None


VALUES_NOTE = ("# The merged values, with secret-looking ones shown as <redacted>: helm gets the real ones on its stdin\n"
               "# only (see docs/security.md).\n")


def _write_private(path: Path, text: str, append: bool = False) -> None:
    """Write text to a file only its owner can read (0600, also when it existed with a wider mode)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            fd = -1
            out.write(text)
    finally:
        if fd >= 0:
            os.close(fd)
