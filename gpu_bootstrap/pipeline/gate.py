"""The one gate every change passes. Dry-run, server-side dry-run and real runs differ only here, so steps never
ask which mode they are in."""
from __future__ import annotations

import logging

from ..refs import Chart, Verb
from .step import Change

log = logging.getLogger("gpu_bootstrap.gate")
APPLY, SERVER_DRY_RUN, RECORD = "apply", "server-dry-run", "record"


class Gate:
    """APPLY makes changes real; SERVER_DRY_RUN sends them with dryRun=All (the API server validates and admits them
    but stores nothing); RECORD only records them (offline). A render dir, when given, sees every change."""

    def __init__(self, mode: str, kube, helm, render_dir=None):
        self.mode = mode
        self.kube = kube
        self.helm = helm
        self.render_dir = render_dir
        self.submitted: list[tuple[str, Change]] = []
        self.problems: dict[str, list[str]] = {}  # step id -> what could not be rendered
        self._handlers = {Verb.APPLY: self._apply, Verb.PATCH: self._patch, Verb.CREATE: self._create,
                          Verb.DELETE: self._delete, Verb.HELM_UPGRADE: self._helm_upgrade,
                          Verb.HELM_RECOVER: self._helm_recover, Verb.HELM_UNINSTALL: self._helm_uninstall}

    @property
    def dry_run(self) -> bool:
        return self.mode != APPLY

    def submit(self, step_id: str, change: Change):
        """Make one change real (or pretend to, in a dry run). Returns the adapter's answer, if any."""
        self.submitted.append((step_id, change))
        if self.render_dir is not None:
            problem = self.render_dir.write(step_id, change)
            if problem:
                self.problems.setdefault(step_id, []).append(problem)
        log.info("%s %s", "would" if self.dry_run else "do", change.describe())
        if self.mode == RECORD:
            return None
        return self._handlers[Verb(change.verb)](change, self.mode == SERVER_DRY_RUN)

    def _apply(self, change: Change, dry_run: bool):
        return self.kube.apply(change.body, dry_run=dry_run)

    def _patch(self, change: Change, dry_run: bool):
        return self.kube.patch(change.target, change.body, change.patch_type, dry_run=dry_run)

    def _create(self, change: Change, dry_run: bool):
        return self.kube.create(change.body, dry_run=dry_run)

    def _delete(self, change: Change, dry_run: bool):
        return self.kube.delete(change.target, dry_run=dry_run)

    def _helm_upgrade(self, change: Change, dry_run: bool):
        body = change.body
        chart = Chart(body["chart"]["ref"], body["chart"].get("repo"), body["chart"].get("version"))
        return self.helm.upgrade(body["release"], chart, body["values"], body["namespace"], wait=True,
                                 timeout=body.get("timeout"), dry_run=dry_run)

    def _helm_recover(self, change: Change, dry_run: bool):
        if dry_run:
            return None
        body = change.body
        return self.helm.recover(body["release"], body["namespace"], body.get("timeout"))

    def _helm_uninstall(self, change: Change, dry_run: bool):
        body = change.body
        return self.helm.uninstall(body["release"], body["namespace"], wait=True, timeout=body.get("timeout"),
                                   dry_run=dry_run)
