"""The one gate every change passes. Dry-run, server-side dry-run and real runs differ only here, so steps never
ask which mode they are in."""
from __future__ import annotations

import logging

from gpu_bootstrap.core.objects import admission_configuration
from gpu_bootstrap.core.refs import Chart, Verb
from gpu_bootstrap.pipeline.step import Change

log = logging.getLogger("gpu_bootstrap.gate")
APPLY, SERVER_DRY_RUN, RECORD_ONLY = "apply", "server-dry-run", "record"
JUDGED_CLIENT_SIDE = ("judged client-side, not sent: admission does not run for admission configuration, so no "
                      "policy could keep a dry-run identity's write of it dry (rbac --for dry-run holds none)")


class Gate:
    """APPLY makes changes real; SERVER_DRY_RUN sends them with dryRun=All (the API server validates and admits them
    but stores nothing); RECORD_ONLY only records them (offline, and `up --dry-run=client`). A render dir, when
    given, sees every change."""

    def __init__(self, mode: str, kube, helm, render_dir=None):
        self.mode = mode
        self.kube = kube
        self.helm = helm
        self.render_dir = render_dir
        self.submitted: list[tuple[str, Change]] = []
        self.problems: dict[str, list[str]] = {}  # step id -> what could not be rendered
        self.notes: dict[str, list[str]] = {}  # step id -> how a dry run had to validate (said with the plan)
        self._dry_namespaces: set[str] = set()  # namespaces this dry run would create (they do not exist yet)
        self._unvalidated: dict[str, dict[str, int]] = {}  # step id -> namespace -> objects not validated
        self._handlers = {Verb.APPLY: self._apply, Verb.PATCH: self._patch, Verb.CREATE: self._create,
                          Verb.DELETE: self._delete, Verb.HELM_UPGRADE: self._helm_upgrade,
                          Verb.HELM_RECOVER: self._helm_recover, Verb.HELM_UNINSTALL: self._helm_uninstall}

    @property
    def dry_run(self) -> bool:
        return self.mode != APPLY

    def mark(self, step_id: str) -> tuple:
        """Where this step's submissions stand, for rewind()."""
        return (len(self.submitted), len(self.problems.get(step_id, [])), len(self.notes.get(step_id, [])),
                dict(self._unvalidated.get(step_id, {})))

    def rewind(self, step_id: str, mark: tuple) -> None:
        """Forget what a dry run submitted for a step since mark: its plan is being made again, whole (the cluster
        changed under it), and the plan that passes is the one to export, list, render and show, once."""
        submitted, problems, notes, unvalidated = mark
        del self.submitted[submitted:]
        for kept, count in ((self.problems, problems), (self.notes, notes)):
            if step_id in kept:
                del kept[step_id][count:]
        self._unvalidated[step_id] = unvalidated
        if self.render_dir is not None:
            self.render_dir.forget(step_id)

    def submit(self, step_id: str, change: Change):
        """Make one change real (or pretend to, in a dry run). Returns the adapter's answer, if any."""
        self.submitted.append((step_id, change))
        if self.render_dir is not None:
            problem = self.render_dir.write(step_id, change)
            if problem:
                self.problems.setdefault(step_id, []).append(problem)
        log.info("%s %s", "would" if self.dry_run else "do", change.describe())
        if self.mode == RECORD_ONLY:
            return None
        if self.mode == SERVER_DRY_RUN:
            return self._dry_run(step_id, change)
        return self._handlers[Verb(change.verb)](change, False)

    def _dry_run(self, step_id: str, change: Change):
        """Server-side dry run. An object in a namespace this same plan creates cannot be validated (the dry-run
        namespace is not stored), and is said to be so rather than failing the plan."""
        from gpu_bootstrap.core.errors import ClusterError, NotFound
        if admission_configuration(change.target.api_version, change.target.kind):
            self.notes.setdefault(step_id, []).append(f"{change.target} {JUDGED_CLIENT_SIDE}")
            return None
        if change.target.kind == "Secret" and not getattr(self.kube, "reads_secrets", True):
            # the answer to a dry-run apply is the Secret as stored: a dry run reads no Secret's values
            self.notes.setdefault(step_id, []).append(f"{change.target} not sent to the API server (a dry run "
                                                      f"reads no Secret's values)")
            return None
        if change.verb == Verb.HELM_UPGRADE:  # helm creates the release's namespace (--create-namespace)
            if self.kube.get("v1", "Namespace", change.body["namespace"]) is None:
                self._dry_namespaces.add(change.body["namespace"])
            return self._helm_dry_run(step_id, change)
        if (change.verb, change.target.kind) == (Verb.APPLY, "Namespace") and \
                self.kube.get("v1", "Namespace", change.target.name) is None:
            self._dry_namespaces.add(change.target.name)
        try:
            return self._handlers[Verb(change.verb)](change, True)
        except NotFound:
            if change.target.namespace not in self._dry_namespaces:
                raise
            counts = self._unvalidated.setdefault(step_id, {})
            counts[change.target.namespace] = counts.get(change.target.namespace, 0) + 1
            return None
        except ClusterError as error:  # a custom resource whose CRD an earlier change (a chart) brings
            if not error.message.startswith(("the cluster does not serve", "the cluster serves no")):
                raise
            self.notes.setdefault(step_id, []).append(
                f"{change.target} not validated by the API server ({error.message}; its CRD comes with an earlier "
                f"change of this plan)")
            return None

    def notes_for(self, step_id: str) -> list[str]:
        """What the plan of a step could not have validated by the API server, and how it was checked instead."""
        return self.notes.get(step_id, []) + [
            f"{count} object(s) in namespace {namespace} not validated by the API server (the plan creates the "
            f"namespace)" for namespace, count in sorted(self._unvalidated.get(step_id, {}).items())]

    def _apply(self, change: Change, dry_run: bool):
        return self.kube.apply(change.body, dry_run=dry_run)

    def _patch(self, change: Change, dry_run: bool):
        return self.kube.patch(change.target, change.body, change.patch_type, dry_run=dry_run)

    def _create(self, change: Change, dry_run: bool):
        return self.kube.create(change.body, dry_run=dry_run)

    def _delete(self, change: Change, dry_run: bool):
        """A DELETE whose body asks {"wait_gone": seconds} returns once the object is gone: a controller's finalizer
        (Kueue's on its queues) must be released while that controller still runs, before a later change removes
        it."""
        deleted = self.kube.delete(change.target, dry_run=dry_run)
        wait = (change.body or {}).get("wait_gone") if isinstance(change.body, dict) else None
        if deleted and wait and not dry_run:
            self._wait_gone(change.target, float(wait))
        return deleted

    def _wait_gone(self, ref, seconds: float) -> None:
        import time

        from gpu_bootstrap.core.errors import ClusterError
        deadline = time.monotonic() + seconds
        while (live := self.kube.get(ref.api_version, ref.kind, ref.name, ref.namespace)) is not None:
            if time.monotonic() >= deadline:
                holders = ", ".join((live.get("metadata") or {}).get("finalizers") or []) or "none"
                raise ClusterError(f"{ref} is still there {seconds:g}s after its deletion (finalizers: {holders})",
                                   "the controller that owns its finalizer must release it: check that it runs, "
                                   "then rerun")
            time.sleep(0.5)

    def _helm_upgrade(self, change: Change, dry_run: bool):
        body = change.body
        chart = Chart(body["chart"]["ref"], body["chart"].get("repo"), body["chart"].get("version"))
        extra = {"skip_crds": True} if body.get("skip_crds") else {}  # only when asked: fakes know no such keyword
        return self.helm.upgrade(body["release"], chart, body["values"], body["namespace"], wait=True,
                                 timeout=body.get("timeout"), dry_run=dry_run, labels=body.get("labels"), **extra)

    def _helm_dry_run(self, step_id: str, change: Change):
        """A server-side dry run of the release. Object by object instead, and said so, when helm's own would not
        do: a chart that renders admission configuration (its webhook configurations are judged client-side: no
        admission policy could keep a write of them dry, so a dry-run identity may not send one), or a fresh
        cluster that does not serve the kinds of the chart's own CRDs yet (its custom resources are validated
        against those CRDs' schemas). The rest of its objects go to the API server as dry runs where their
        namespace exists."""
        from gpu_bootstrap.core.errors import ClusterError
        from gpu_bootstrap.core.schemas import kinds_without_crds
        documents = self._rendered(change)
        if not getattr(self.helm, "reads_releases", True):
            missing = []  # helm's own dry run reads the release's record, a Secret this identity may not read
        elif not any(admission_configuration(d.get("apiVersion", ""), d.get("kind", "")) for d in documents):
            try:
                return self._helm_upgrade(change, True)
            except ClusterError as error:
                missing = kinds_without_crds(error.message)
                if not missing:
                    raise
        else:
            missing = []
        self.notes.setdefault(step_id, []).append(self._validate_by_object(change, documents, missing))
        return None

    def _rendered(self, change: Change) -> list[dict]:
        import yaml
        body = change.body
        chart = Chart(body["chart"]["ref"], body["chart"].get("repo"), body["chart"].get("version"))
        return [d for d in yaml.safe_load_all(self.helm.template(
            body["release"], chart, body["values"], body["namespace"], body["kube_version"])) if d]

    def _validate_by_object(self, change: Change, documents: list[dict], missing: list[tuple[str, str]]) -> str:
        from gpu_bootstrap.core import schemas
        from gpu_bootstrap.core.errors import ClusterError
        body = change.body
        chart = Chart(body["chart"]["ref"], body["chart"].get("repo"), body["chart"].get("version"))
        known = schemas.crd_schemas(self.helm.show_crds(chart))
        custom, skipped, checked, judged, secrets = [], 0, 0, [], []
        for doc in documents:
            key = (doc.get("apiVersion", ""), doc.get("kind", ""))
            name = f"{key[1]} {(doc.get('metadata') or {}).get('name', '')}"
            if admission_configuration(*key):
                judged.append(name)
            elif key == ("v1", "Secret") and not getattr(self.kube, "reads_secrets", True):
                secrets.append(name)  # a dry-run apply answers with the live Secret's values: not for dry runs
            elif key in known and (key in missing or not self._served(key) or
                                   not getattr(self.helm, "reads_releases", True)):
                # its CRD is not installed yet, or (object by object for want of helm's dry run) is upgraded by
                # this same plan first: the chart's own schema is the one that will judge it
                found = schemas.problems(doc, known[key])
                if found:
                    raise ClusterError(f"{name} is invalid against its CRD's schema: {'; '.join(found[:5])}",
                                       "fix gpu_operator.values (validated client-side: its CRD is not installed "
                                       "yet)")
                custom.append(name)
            elif key in missing:
                raise ClusterError(f"{name}: the cluster serves no {key[1]} in {key[0]} and the chart brings no CRD "
                                   f"for it")
            elif doc.get("kind") != "Namespace" and self._namespace_missing(doc, body["namespace"]):
                skipped += 1
            else:
                body_doc = {**doc, "metadata": {**doc["metadata"],
                                                "namespace": doc["metadata"].get("namespace") or body["namespace"]}}
                self.kube.apply(body_doc if self._namespaced(doc) else doc, dry_run=True)
                checked += 1
        parts = []
        if judged:
            parts.append(f"{', '.join(judged)} {JUDGED_CLIENT_SIDE}")
        if custom:
            parts.append(f"{', '.join(custom)} validated client-side against the chart's CRD schemas (the CRDs "
                         f"this plan installs)")
        if secrets:
            parts.append(f"{', '.join(secrets)} not sent (a dry run reads no Secret's values)")
        parts.append(f"{checked} {'other ' if parts else ''}object(s) validated by the API server"
                     + (f", {skipped} not (their namespace does not exist yet)" if skipped else ""))
        return "; ".join(parts)

    def _served(self, key: tuple[str, str]) -> bool:
        """Does the cluster serve this kind (its CRD installed)? An API that does not answer is not "no"."""
        from gpu_bootstrap.core.errors import ClusterError, Unreachable
        try:
            self.kube.resource(*key)
            return True
        except Unreachable:
            raise
        except ClusterError:
            return False

    def _namespaced(self, doc: dict) -> bool:
        return self.kube.resource(doc["apiVersion"], doc["kind"])[1]

    def _namespace_missing(self, doc: dict, namespace: str) -> bool:
        if not self._namespaced(doc):
            return False
        return self.kube.get("v1", "Namespace", doc["metadata"].get("namespace") or namespace) is None

    def _helm_recover(self, change: Change, dry_run: bool):
        if dry_run:
            return None
        body = change.body
        return self.helm.recover(body["release"], body["namespace"], body.get("timeout"))

    def _helm_uninstall(self, change: Change, dry_run: bool):
        body = change.body
        return self.helm.uninstall(body["release"], body["namespace"], wait=True, timeout=body.get("timeout"),
                                   dry_run=dry_run)
