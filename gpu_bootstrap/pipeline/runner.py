"""Runs steps in playbook order: `up` (check -> plan -> gate -> verify -> checkpoint), `doctor` (checks only) and
`teardown` (undo plans, in reverse order, through the same gate).

`up` first checks every step read-only. When all are done with unchanged inputs it stops there: no lock, no
checkpoint write, no request that changes anything. Otherwise it takes the lock and works through the steps.
"""
from __future__ import annotations

import logging

from gpu_bootstrap.core.errors import (
    CheckFailed,
    ClusterError,
    ConfigError,
    Conflict,
    GpuBootstrapError,
    Interrupted,
    StepFailed,
)
from gpu_bootstrap.core.refs import Ref
from gpu_bootstrap.pipeline import checkpoint as cp
from gpu_bootstrap.pipeline.lock import Lock
from gpu_bootstrap.security import pod_security
from gpu_bootstrap.pipeline.step import FAIL, PASS, SKIP, WARN, Check, Step, StepResult

SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", "default")  # the admins' own
log = logging.getLogger("gpu_bootstrap.runner")
REPLANS = 3
UNKNOWN_WHY = ("unknown: this step's state is kept in a Secret (such as the webhook's serving certificate) that a "
               "dry run does not read (no role but up's reads Secret values), so the plan cannot say whether it "
               "would change anything; `up` judges it")


def refused_secret(error: GpuBootstrapError) -> bool:
    """Was this a read of Secrets that RBAC refused (the API's 403, or helm's report of one)?"""
    text = error.message
    return isinstance(error, ClusterError) and "secrets" in text and "forbidden" in text.lower() and (
        error.status in (0, 403))


class Runner:
    def __init__(self, ctx, steps: list[Step], unselected: list[str] = (), order: list[str] | None = None,
                 shown_as_skipped: list[str] = (), unselected_steps: list[Step] = ()):
        self.ctx = ctx
        self.steps = steps
        # the playbook's steps --only/--skip left out, by id: a teardown of the others keeps the tool's state ...
        self.unselected = list(unselected)
        self.unselected_steps = list(unselected_steps)  # ... unless these, loaded, have nothing left to undo
        self.shown_as_skipped = list(shown_as_skipped)  # of them, those the summary shows (--skip; --only hides)
        self.order = list(order or [s.id for s in steps] + self.unselected)
        self.results: list[StepResult] = []
        self.checkpoint = cp.Checkpoint(ctx.kube)

    # --- up -----------------------------------------------------------------------------------------------------------
    def up(self, force_unlock: bool = False) -> list[StepResult]:
        records = self.checkpoint.load()
        active = [s for s in self.steps if s.enabled(self.ctx)]
        self._note_skipped(active)
        self._refuse_foreign_namespaces(active)
        if self.ctx.gate.dry_run:
            self.ctx.fingerprint_key = self.checkpoint.key(create=False)  # None for a role that may not read it
            for step in active:  # a dry run plans every step, whatever one of them found, then sums up
                try:
                    self._plan_only(step, records)
                except ConfigError:
                    raise  # bad input: nothing else is worth planning until it is fixed
                except GpuBootstrapError as error:
                    message = error.one_line().removeprefix(f"[{step.id}] ")
                    if refused_secret(error):
                        # a client-side plan (the plan role reads no Secret): this step's state is unknown, which
                        # is neither "unchanged" nor a failure of the plan
                        self._finish(StepResult(step.id, "unknown", 0, f"{UNKNOWN_WHY}: {message}"))
                        continue
                    self._finish(StepResult(step.id, "failed", 0, message))
            return self.ordered_results()
        lock = Lock(self.ctx.kube)
        lock_state = lock.inspect(force_unlock)  # a live run elsewhere: refuse now, even if nothing is to do
        self.ctx.fingerprint_key = self.checkpoint.key(create=False)
        probe = {step.id: self._current(step, records) for step in active}
        if all(done for done, _check in probe.values()) and lock_state == "free":
            for step in active:
                check = probe[step.id][1]
                self._finish(StepResult(step.id, "skipped" if check.status == SKIP else "unchanged", 0,
                                        _noted(check.message, check)))
            return self.ordered_results()
        self.ctx.kube.apply(cp.namespace_manifest())
        lock.acquire(force=force_unlock)
        if lock.took_over:
            self.ctx.reporter.warn(f"took over the lock from {lock.took_over} (it was no longer running)")
        try:
            if self.ctx.fingerprint_key is None:  # the first run on this cluster (or since the key's Secret went)
                self.ctx.fingerprint_key = self.checkpoint.key(create=True)
            for step in active:
                self._run(step, records, lock)
        finally:
            self._release(lock)
        return self.ordered_results()

    def _refuse_foreign_namespaces(self, active: list[Step]) -> None:
        """Namespace squatting: a namespace that exists without our managed-by label was made by someone else, who
        then owns what `up` would install there (OPA's policy and key, the operators' tokens). Refuse before anything
        changes, unless the config adopts it (cluster.adopt_namespaces); the system's own are the admins'."""
        adopted = set(getattr(self.ctx.config.cluster, "adopt_namespaces", []) or [])
        wanted: dict[str, list[str]] = {cp.NAMESPACE: ["the state record"]}
        for step in active:
            for namespace in step.namespaces(self.ctx):
                wanted.setdefault(namespace, []).append(step.id)
        foreign = []
        for namespace, users in sorted(wanted.items()):
            if namespace in SYSTEM_NAMESPACES or namespace in adopted:
                continue
            if pod_security.ownership(self.ctx.kube.get("v1", "Namespace", namespace)) == "theirs":
                foreign.append(f"{namespace} ({', '.join(users)})")
        if foreign:
            raise ConfigError(
                f"namespace(s) {'; '.join(foreign)} exist but gpu-bootstrap did not create them (no "
                f"{pod_security.MANAGED_BY}={pod_security.OURS} label): whoever created a namespace controls what "
                f"`up` would install into it",
                "if they are yours (and only admins may create namespaces here), list them in "
                "cluster.adopt_namespaces; otherwise delete them, or choose other namespaces in the config "
                "(nothing was changed)")

    @staticmethod
    def _release(lock: Lock) -> None:
        """Release the run lock; when that fails while an error or an interrupt is already unwinding, the first
        cause is the one to report (the lease then expires by itself or is taken over as stale)."""
        import sys
        unwinding = sys.exc_info()[0] is not None  # called from a `finally`: is an exception on its way out?
        try:
            lock.release()
        except GpuBootstrapError as error:
            if not unwinding:
                raise
            log.warning("could not release the lock: %s", error)

    def _current(self, step: Step, records: dict) -> tuple[bool, Check]:
        check = self._check(step)
        record = records.get(step.id)
        if check.status == SKIP:  # nothing to do; a record left by an earlier, stopped run is cleared by _run
            return record is None, check
        fresh = record is not None and record.fingerprint == step.fingerprint(self.ctx) and \
            record.status in ("applied", "unchanged", "probed")
        return fresh and check.done, check

    def _check(self, step: Step) -> Check:
        check = step.check(self.ctx)
        if check.status == FAIL:
            raise CheckFailed(check.message, step=step.id)
        return check

    def _run(self, step: Step, records: dict, lock: Lock) -> None:
        self.ctx.reporter.step_started(step)
        try:
            done, check = self._current(step, records)
            if check.status == SKIP:
                if step.id in records:  # e.g. "interrupted" while it checked: it is not what happened now
                    self.checkpoint.forget(step.id)
                self._finish(StepResult(step.id, "skipped", 0, check.message))
                return
            if done:
                self._finish(StepResult(step.id, "unchanged", 0, _noted(check.message, check)))
                return
            count = self._apply(step, check, lock)
            try:
                verified = step.verify(self.ctx)
            finally:
                for change in step.cleanup_plan(self.ctx):
                    self.ctx.gate.submit(step.id, change)
            if verified.status == FAIL or not verified.done:
                raise StepFailed(f"verification failed: {verified.message}", step=step.id)
            status = "probed" if step.reads_only else "applied" if count else "unchanged"
            if (kept := step.record(self.ctx, check)) is not None:
                self.checkpoint.keep(kept)
            keyed, public = step.fingerprints(self.ctx)
            self.checkpoint.save(step.id, status, keyed, count, verified.message, public)
            self._finish(StepResult(step.id, status, count, _noted(verified.message, check)))
        except KeyboardInterrupt:
            self._record_failure(step, "interrupted", "interrupted by a signal")
            self._finish(StepResult(step.id, "interrupted", 0, "interrupted"))
            raise Interrupted(step.id) from None
        except GpuBootstrapError as error:
            error.step = error.step or step.id
            self._record_failure(step, "failed", error.message)
            self._finish(StepResult(step.id, "failed", 0, error.one_line()))
            raise

    def _apply(self, step: Step, check: Check, lock: Lock) -> int:
        """Push the plan through the gate; when the cluster changed under us (409), re-read and re-plan."""
        self._warn(step, check)
        return len(self._through_gate(step, lambda again: step.plan(self.ctx, self._check(step) if again else check),
                                      lock))

    def _through_gate(self, step: Step, plan, lock: Lock | None = None) -> list:
        """Submit what plan(again) returns through the gate. When the cluster changed under us (409: an object's
        resourceVersion moved since we read it, as a Node's does with every status update of its kubelet), read
        again and plan again (plan(True)), up to REPLANS times; undo and up plans are made from live state, so the
        new plan holds what is still to do. A real run reports each change as it lands and returns all that landed;
        a dry run reports (and keeps in the gate) only the plan that passed whole, so nothing shows twice."""
        real = not self.ctx.gate.dry_run
        landed: list = []
        for attempt in range(REPLANS + 1):
            mark, passed = self.ctx.gate.mark(step.id), []
            try:
                for change in plan(attempt > 0):
                    if lock is not None:
                        lock.check()
                    self.ctx.gate.submit(step.id, change)
                    (landed if real else passed).append(change)
                    if real:
                        self.ctx.reporter.change(step.id, change, applied=True)
                break
            except Conflict:
                if attempt == REPLANS:
                    raise
                log.info("%s: the cluster changed under the plan (409); re-reading and re-planning", step.id)
                if not real:
                    self.ctx.gate.rewind(step.id, mark)
        for change in passed if not real else ():
            self.ctx.reporter.change(step.id, change, applied=False)
        return landed if real else passed

    def _record_failure(self, step: Step, status: str, message: str) -> None:
        try:
            keyed, public = step.fingerprints(self.ctx)
            self.checkpoint.save(step.id, status, keyed, 0, message, public)
        except (GpuBootstrapError, KeyboardInterrupt) as error:
            log.warning("could not record %s for %s: %s", status, step.id, error)

    def _plan_only(self, step: Step, records: dict) -> None:
        self.ctx.reporter.step_started(step)
        check = self._check(step)
        if check.status == SKIP:
            self._finish(StepResult(step.id, "skipped", 0, check.message))
            return
        if step.stateless and check.done and (passed := self._passed_with_these_inputs(step, records.get(step.id))):
            self._finish(StepResult(step.id, "unchanged", 0, passed))  # as `up` would skip it
            return
        self._warn(step, check)
        checks = [check]

        def plan(again: bool) -> list:
            if again:  # the cluster changed under the plan: what the plan says is what the new check found
                checks.append(self._check(step))
            return step.plan(self.ctx, checks[-1])
        changes = self._through_gate(step, plan)
        check = checks[-1]
        status, message = "planned" if changes else "unchanged", _noted(check.message, check)
        if notes := self.ctx.gate.notes_for(step.id):
            message = "; ".join([message, *notes])
        problems = list(self.ctx.gate.problems.get(step.id, []))
        if check.unknown:
            problems.append(f"{', '.join(check.unknown)} decided without node facts (pass --preflight-report FILE, "
                            f"or plan against the cluster)")
        if problems:
            # a plan whose manifests could not be rendered, or that decided values without the facts they depend on,
            # is not a complete plan: say so, not "planned"
            status, message = "incomplete", "planned, but " + "; ".join(problems)
        self._finish(StepResult(step.id, status, len(changes), message, planned=changes))

    def _passed_with_these_inputs(self, step: Step, record) -> str:
        """For a step that leaves nothing behind (validate): its record says it passed with these very inputs (the
        keyed fingerprint; without the key, the public one, which leaves secret values out). '' otherwise."""
        if record is None or record.status not in ("applied", "unchanged", "probed"):
            return ""
        if self.ctx.fingerprint_key:
            same, note = record.fingerprint == step.fingerprint(self.ctx), ""
        else:
            same = bool(record.public) and record.public == step.public_fingerprint(self.ctx)
            note = " (secret values not compared: this identity may not read the fingerprints' key)"
        return f"passed at {record.time} with these inputs{note}" if same else ""

    def _warn(self, step: Step, check: Check) -> None:
        for warning in check.warnings:
            self.ctx.reporter.warn(f"{step.id}: {warning}")

    # --- doctor ---------------------------------------------------------------------------------------------------------
    def doctor(self) -> list[tuple[Step, Check]]:
        records = self.checkpoint.load()
        findings = []
        for step in self.steps:
            if not step.enabled(self.ctx):
                continue
            try:
                checks = step.doctor(self.ctx)
            except GpuBootstrapError as error:  # doctor diagnoses: one step's trouble is a failed row, not the end
                line = error.one_line().removeprefix(f"[{step.id}] ")
                checks = [Check(WARN, "unknown: its state is kept in a Secret (such as the webhook's serving "
                                      "certificate), which doctor does not read (docs/security.md)")
                          if refused_secret(error) else Check(FAIL, line)]
            for check in checks:
                findings.append((step, self._as_recorded(step, check, records.get(step.id))))
        return findings

    @staticmethod
    def _as_recorded(step: Step, check: Check, record) -> Check:
        """A step whose outcome leaves nothing in the cluster (validate) passes only when a recorded run passed."""
        if not step.stateless or check.status != PASS:
            return check
        if record is None:
            return Check(SKIP, "not run yet (gpu-bootstrap up runs it)")
        if record.status in ("applied", "unchanged", "probed"):
            return Check(PASS, f"passed at {record.time}: {record.message}", done=True)
        return Check(FAIL, f"{record.status} at {record.time}: {record.message}")

    # --- teardown -------------------------------------------------------------------------------------------------------
    def undo_plans(self) -> list[tuple[Step, list]]:
        return [(step, step.undo_plan(self.ctx)) for step in reversed(self.steps)]

    def left_waiting(self, plans: list[tuple[Step, list]]) -> dict[str, list[str]]:
        """step id -> what undoing its planned changes leaves waiting (Step.undo_leaves), for the steps that leave
        something."""
        found = {step.id: step.undo_leaves(self.ctx, changes) for step, changes in plans if changes}
        return {step_id: lines for step_id, lines in found.items() if lines}

    def teardown(self, force_unlock: bool = False, plans: list | None = None) -> list[StepResult]:
        """`plans`: the undo plans already shown (and confirmed); they are read again when not given."""
        plans = plans if plans is not None else self.undo_plans()
        self._refuse_gitops_owned(plans)
        waiting = self.left_waiting(plans)  # read before anything is removed: afterwards, nothing says why
        if self.ctx.gate.dry_run:
            for index, (step, first) in enumerate(plans):
                changes = self._through_gate(step, lambda again, step=step, first=first:
                                             step.undo_plan(self.ctx) if again else first)
                plans[index] = (step, changes)
                self._finish(StepResult(step.id, "planned" if changes else "unchanged", len(changes),
                                        _undo_message(changes, planned=True), planned=list(changes),
                                        left_waiting=waiting.get(step.id, [])))
            if self._last_of_ours(plans) and self.ctx.kube.get("v1", "Namespace", cp.NAMESPACE) is not None:
                self.ctx.reporter.note(f"then the tool's own namespace {cp.NAMESPACE} (its checkpoint ConfigMap "
                                       f"{cp.NAME}, the key Secret {cp.KEY_SECRET} and its lock) would be removed")
            return self.ordered_results()
        self.checkpoint.load()
        self.ctx.kube.apply(cp.namespace_manifest())
        lock = Lock(self.ctx.kube)
        lock.acquire(force=force_unlock)
        try:
            for step in reversed(self.steps):
                self.ctx.reporter.step_started(step)
                done = self._through_gate(step, lambda again, step=step: step.undo_plan(self.ctx), lock)
                self.checkpoint.forget(step.id)
                self._finish(StepResult(step.id, "undone" if done else "unchanged", len(done),
                                        _undo_message(done, planned=False),
                                        left_waiting=waiting.get(step.id, []) if done else []))
        except KeyboardInterrupt:
            raise Interrupted() from None
        finally:
            self._release(lock)
        if self._last_of_ours():
            self._remove_state()
        return self.ordered_results()

    def _last_of_ours(self, planned: list | None = None) -> bool:
        """Whether this teardown leaves nothing of ours, so the tool's own namespace (checkpoint, key, lock) goes too:
        always for the whole playbook; for part of it (--only/--skip), when no step left out has a record in the
        checkpoint or anything to undo in the cluster (`up --only a,b` then `teardown --only a,b`). A step whose
        undo cannot be read keeps the namespace (an error is raised, never taken for "nothing left"). `planned`: a
        dry run's plans, where the selected steps' records are still there (a real teardown has forgotten them)."""
        if not self.unselected:
            return True
        if len(self.unselected_steps) != len(self.unselected):
            return False  # not told which steps were left out (a runner built without them): keep the state
        undone = {step.id for step, _changes in planned or []}
        if set(self.checkpoint.load()) - undone:
            return False
        for step in self.unselected_steps:
            try:
                if step.undo_plan(self.ctx):
                    return False
            except GpuBootstrapError as error:  # unknown is not "nothing left": the state stays
                self.ctx.reporter.note(f"the tool's own namespace {cp.NAMESPACE} is kept: whether {step.id} (left "
                                       f"out) still has objects could not be read ({error.one_line()})")
                return False
        return True

    def _refuse_gitops_owned(self, plans) -> None:
        """Only touch what is ours: an object a GitOps engine applies (an export of ours, or one Argo CD or Flux
        marks as theirs) would come back at the next sync, and removing it is the engine's job. Refused before
        anything is removed, naming the first such objects."""
        from gpu_bootstrap.core.objects import gitops_owner
        from gpu_bootstrap.core.refs import Verb
        owned = []
        for step, changes in plans:
            for change in changes:
                if change.verb != Verb.DELETE:
                    continue
                live = self.ctx.kube.get(change.target.api_version, change.target.kind, change.target.name,
                                         change.target.namespace)
                owner = gitops_owner(live) if live else None
                if owner:
                    owned.append(f"{change.target} ({owner})")
        if owned:
            shown = "; ".join(owned[:3]) + (f" and {len(owned) - 3} more" if len(owned) > 3 else "")
            raise GpuBootstrapError(f"teardown refused: a GitOps engine owns {len(owned)} object(s) it would remove: "
                                    f"{shown}", "remove them from Git (the units of your `gpu-bootstrap export`) and "
                                                "let the engine prune them; nothing was changed")

    def _remove_state(self) -> None:
        """A full teardown also removes the tool's own namespace (its checkpoint and lock)."""
        self.ctx.kube.delete(Ref("v1", "Namespace", cp.NAMESPACE))

    # --- results -----------------------------------------------------------------------------------------------------------
    def _note_skipped(self, active: list[Step]) -> None:
        for step in self.steps:
            if step not in active:
                self._finish(StepResult(step.id, "skipped", 0, "disabled in the config"))
        for step_id in self.shown_as_skipped:
            self._finish(StepResult(step_id, "skipped", 0, "left out (--skip)"))

    def _finish(self, result: StepResult) -> None:
        self.results.append(result)
        self.ctx.reporter.step_finished(result)

    def ordered_results(self) -> list[StepResult]:
        return sorted(self.results, key=lambda r: self.order.index(r.id) if r.id in self.order else len(self.order))


def _undo_message(changes: list, planned: bool) -> str:
    if not changes:
        return "nothing to undo"
    shown = "; ".join(f"{c.summary} {c.target}" for c in changes[:3])
    more = f" (+{len(changes) - 3} more)" if len(changes) > 3 else ""
    return f"{'would ' if planned else ''}{shown}{more}"


def _noted(message: str, check: Check) -> str:
    """A step's result message with the warnings its check found (they are part of what the step did)."""
    return " — ".join([message, *check.warnings]) if check.warnings else message
