"""--render-dir: each step's changes written to DIR/<step-id>/ as the exact documents sent to the cluster, and a
Helm release as its values, its reasons and (when the chart can be read) the manifests `helm template` renders.
DIR/steps.txt lists the steps in the playbook's order. A folder is named by its step alone, so a step inserted in
the playbook changes no other step's folder (renders are diffed across versions).

Secrets stay in the cluster: everything written here passes through security/redact.py (a Secret's data, values
under secret-looking keys, webhook URLs, URL passwords, private keys), and the folders are 0700, the files 0600, so
a render is safe to keep as a CI artifact or attach to a review.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml

from gpu_bootstrap.security import outdir, redact, secret_values
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
    return yaml.dump(obj, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True)


NUMBERED_FOLDER = re.compile(r"\d\d-[a-z0-9-]+")  # earlier versions' <NN>-<step> folders (removed)
STEP_ID = re.compile(r"[a-z0-9][a-z0-9-]*")
INDEX = "steps.txt"


def prepare(folder: Path, steps: list[str]) -> None:
    """Start from a clean render: remove the step folders a previous render left (those its steps.txt lists, the
    `steps` about to be written when they hold a plan.txt, and numbered folders of older versions), keep anything
    else. A folder with a link planted where we write (its top, the step folders) is refused (security/outdir.py)."""
    listed = set(_listed(folder))
    ours = listed | set(steps)
    outdir.refuse_planted(folder, "--render-dir",
                          descend=lambda name: name in ours or NUMBERED_FOLDER.fullmatch(name))
    outdir.make_folder(folder)
    removed = [child for child in folder.iterdir() if child.is_dir() and (
        child.name in listed or NUMBERED_FOLDER.fullmatch(child.name) or
        (child.name in steps and (child / "plan.txt").is_file()))]
    foreign = [child.name for child in folder.iterdir() if child.is_dir() and child.name in steps and
               child not in removed and any(child.iterdir())]
    if foreign:  # a folder of the user's where a step's would go: never mixed with a render, never removed
        raise UsageError(f"--render-dir {folder} holds {', '.join(sorted(foreign))}, which no render of gpu-bootstrap "
                         f"wrote (no steps.txt names it, no plan.txt in it), where a step's folder goes",
                         "move it, or give another --render-dir")
    for child in removed:
        shutil.rmtree(child)
    outdir.write(folder, INDEX, "".join(f"{step}\n" for step in steps))


def step_folders(root: Path) -> list[tuple[str, Path]]:
    """(step id, its folder) of a render, in the playbook's order (steps.txt), for the steps that wrote one."""
    folders = [(step, root / RenderDir.folder(step)) for step in _listed(root)]
    return [(step, folder) for step, folder in folders if folder.is_dir()]


def _listed(folder: Path) -> list[str]:
    """The step folders steps.txt names (the render that wrote it): valid step ids only, never a path."""
    index = folder / INDEX
    if not index.is_file() or index.is_symlink():
        return []
    return [line.strip() for line in index.read_text(errors="replace").splitlines()
            if STEP_ID.fullmatch(line.strip())]


class RenderDir:
    """Writes each step's changes under root/; `helm` renders charts (the real or the offline Helm adapter)."""

    def __init__(self, root: Path, order: list[str], helm):
        self.root = root
        self.order = order
        self.helm = helm
        self._counts: dict[str, int] = {}
        self._releases: dict[str, list[str]] = {}  # step -> the releases written for it, in order

    @staticmethod
    def folder(step_id: str) -> str:
        """The step's folder, relative to the root: its id alone (steps.txt holds the order)."""
        return step_id

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
        outdir.write(self.root, f"{folder}/{name}", redact.text("\n".join(header)) + "\n" + body)
        outdir.write(self.root, f"{folder}/plan.txt", redact.text(change.describe()) + "\n", append=True)
        return self._write_release(step_id, change) if release else None

    def forget(self, step_id: str) -> None:
        """Remove what was written for a step: its plan is being made again, whole (the gate's rewind)."""
        folder = self.root / self.folder(step_id)
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
        self._counts.pop(step_id, None)
        self._releases.pop(step_id, None)

    def write_file(self, step_id: str, name: str, text: str) -> Path:
        return outdir.write(self.root, f"{self.folder(step_id)}/{name}", text)

    def _write_release(self, step_id: str, change: Change) -> str | None:
        """values.yaml (the exact merged values), release.yaml (what and why) and manifests.yaml from `helm template`
        for the target Kubernetes version; when the chart cannot be rendered, a note saying why instead."""
        body = change.body
        # a step's first release writes values.yaml, release.yaml and manifests.yaml; another of the same step (the
        # DRA driver beside the gpu-operator) prefixes them with its release name
        self._releases.setdefault(step_id, [])
        prefix = f"{body['release']}-" if self._releases[step_id] and body["release"] not in \
            self._releases[step_id][:1] else ""
        self._releases[step_id].append(body["release"])
        self.write_file(step_id, f"{prefix}values.yaml", VALUES_NOTE + yaml.safe_dump(secret_values.hidden(body["values"]),
                                                                              sort_keys=False, allow_unicode=True))
        release = {key: body[key] for key in ("release", "namespace", "chart", "chart_version", "kube_version")}
        release["derived_values"] = body.get("derived", [])
        release["warnings"] = body.get("warnings", [])
        self.write_file(step_id, f"{prefix}release.yaml", yaml.safe_dump(redact.tree(release), sort_keys=False,
                                                                        allow_unicode=True))
        chart = body["chart"]
        try:
            manifests = self.helm.template(body["release"], Chart(chart["ref"], chart.get("repo"),
                                                                  chart.get("version")),
                                           body["values"], body["namespace"], body["kube_version"])
        except Exception as error:  # noqa: BLE001 - a chart we cannot read offline is a note, not a failed plan
            reason = getattr(error, "one_line", lambda: str(error))()
            field = body.get("chart_field") or f"{step_id.replace('-', '_')}.chart"
            self.write_file(step_id, f"{prefix}manifests-not-rendered.txt",
                            f"helm template could not render {chart['ref']}: {reason}\n"
                            f"For air-gapped or offline plans, set {field} to a local .tgz (helm pull).\n")
            return f"{chart['ref']} manifests not rendered ({reason})"
        self.write_file(step_id, f"{prefix}manifests.yaml", redact.manifests(manifests))
        return None


VALUES_NOTE = ("# The merged values, with those that are or may be secret shown as <redacted>: helm gets the real ones\n"
               "# on its stdin only (see docs/security.md).\n")
