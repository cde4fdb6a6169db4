"""The one gate every change passes. Dry-run, server-side dry-run and real runs differ only here, so steps never
ask which mode they are in."""
from __future__ import annotations

import logging
from pathlib import Path

import yaml

from ..adapters.kube import Ref
from .step import Change

log = logging.getLogger("gpu_bootstrap.gate")
APPLY, SERVER_DRY_RUN, RECORD = "apply", "server-dry-run", "record"


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (a ConfigMap's embedded config file) as readable `|` blocks."""


def _str(dumper, value: str):
    style = "|" if "\n" in value and not any(line != line.rstrip() for line in value.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def dump(obj) -> str:
    return yaml.dump(obj, Dumper=_BlockDumper, sort_keys=False)


class Renderer:
    """Writes each step's changes to DIR/<NN>-<step-id>/ as the exact documents sent to the cluster."""

    def __init__(self, root: Path, order: list[str]):
        self.root = root
        self.order = order
        self._counts: dict[str, int] = {}

    def folder(self, step_id: str) -> Path:
        index = self.order.index(step_id) + 1 if step_id in self.order else 0
        folder = self.root / f"{index:02d}-{step_id}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def write(self, step_id: str, change: Change) -> Path:
        folder = self.folder(step_id)
        count = self._counts[step_id] = self._counts.get(step_id, 0) + 1
        name = f"{count:02d}-{change.verb}-{change.target.kind.lower()}-{change.target.name}.yaml"
        header = [f"# {change.verb}" + (f" ({change.patch_type} patch)" if change.verb == "patch" else "") +
                  f" {change.target.api_version} {change.target}", f"# {change.summary}"]
        if change.reason:
            header.append(f"# why: {change.reason}")
        shown = change.body if change.verb != "helm-upgrade" else {k: v for k, v in change.body.items() if k != "values"}
        body = dump(shown) if shown is not None else ""
        path = folder / name
        path.write_text("\n".join(header) + "\n" + body)
        with (folder / "plan.txt").open("a") as plan:
            plan.write(change.describe() + "\n")
        return path

    def write_file(self, step_id: str, name: str, text: str) -> Path:
        path = self.folder(step_id) / name
        path.write_text(text)
        return path

    def write_release(self, step_id: str, change: Change, helm) -> None:
        """A Helm change renders as values.yaml (the exact merged values), release.yaml (what and why) and, when
        the chart can be read, manifests.yaml from `helm template` for the target Kubernetes version."""
        body = change.body
        self.write_file(step_id, "values.yaml", yaml.safe_dump(body["values"], sort_keys=False))
        release = {key: body[key] for key in ("release", "namespace", "chart", "chart_version", "kube_version")}
        release["derived_values"] = body.get("derived", [])
        release["warnings"] = body.get("warnings", [])
        self.write_file(step_id, "release.yaml", yaml.safe_dump(release, sort_keys=False))
        chart = body["chart"]
        try:
            from ..adapters.helm import Chart
            manifests = helm.template(body["release"], Chart(chart["ref"], chart.get("repo"), chart.get("version")),
                                      body["values"], body["namespace"], body["kube_version"])
            self.write_file(step_id, "manifests.yaml", manifests)
        except Exception as error:  # noqa: BLE001 - no chart offline is a note in the render, not a failed plan
            self.write_file(step_id, "manifests-not-rendered.txt",
                            f"helm template could not render {chart['ref']}: {error}\n"
                            f"For air-gapped or offline plans, set gpu_operator.chart to a local .tgz (helm pull).\n")


class Gate:
    def __init__(self, mode: str, kube_provider, renderer: Renderer | None = None, helm_provider=None):
        self.mode = mode
        self._kube = kube_provider
        self._helm = helm_provider
        self.renderer = renderer
        self.submitted: list[tuple[str, Change]] = []

    @property
    def dry_run(self) -> bool:
        return self.mode != APPLY

    def submit(self, step_id: str, change: Change):
        """Make one change real (or pretend to, in a dry run). Returns the API's answer, if any."""
        self.submitted.append((step_id, change))
        if self.renderer is not None:
            self.renderer.write(step_id, change)
            if change.verb == "helm-upgrade":
                self.renderer.write_release(step_id, change, self._helm())
        log.info("%s %s", "would" if self.dry_run else "do", change.describe())
        if self.mode == RECORD:
            return None
        handler = getattr(self, f"_{change.verb.replace('-', '_')}")
        return handler(change, self.mode == SERVER_DRY_RUN)

    def _ref(self, change: Change) -> Ref:
        target = change.target
        return Ref(target.api_version, target.kind, target.name, target.namespace)

    def _apply(self, change: Change, dry_run: bool):
        return self._kube().apply(change.body, dry_run=dry_run)

    def _patch(self, change: Change, dry_run: bool):
        return self._kube().patch(self._ref(change), change.body, change.patch_type, dry_run=dry_run)

    def _create(self, change: Change, dry_run: bool):
        return self._kube().create(change.body, dry_run=dry_run)

    def _delete(self, change: Change, dry_run: bool):
        return self._kube().delete(self._ref(change), dry_run=dry_run)

    def _helm_upgrade(self, change: Change, dry_run: bool):
        from ..adapters.helm import Chart
        body = change.body
        chart = Chart(body["chart"]["ref"], body["chart"].get("repo"), body["chart"].get("version"))
        return self._helm().upgrade(body["release"], chart, body["values"], body["namespace"], wait=True,
                                    timeout=body.get("timeout"), dry_run=dry_run)

    def _helm_recover(self, change: Change, dry_run: bool):
        if dry_run:
            return None
        body = change.body
        return self._helm().recover(body["release"], body["namespace"], body.get("timeout"))

    def _helm_uninstall(self, change: Change, dry_run: bool):
        body = change.body
        return self._helm().uninstall(body["release"], body["namespace"], wait=True, timeout=body.get("timeout"),
                                      dry_run=dry_run)
