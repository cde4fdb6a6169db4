"""The step interface and the data that flows through the pipeline.

A step reads real state (`check`), turns it into changes (`plan`, pure: everything it needs travels in the check
result), lets the runner push those changes through the one gate, confirms the result (`verify`), and can compute
how to undo itself (`undo_plan`).
"""
from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from gpu_bootstrap.core.refs import Ref, Verb
from gpu_bootstrap.core.outcomes import FAIL, PASS, SKIP, WARN, Check

if TYPE_CHECKING:
    from gpu_bootstrap.pipeline.context import Context

__all__ = ["FAIL", "PASS", "SKIP", "WARN", "Change", "Check", "Declaration", "ObjectsFacts", "Ref", "Step",
           "StepResult", "Verb", "declare"]


@dataclass(frozen=True)
class Change:
    """One planned change, as data. `verb` tells the gate which adapter call makes it real."""

    verb: Verb
    target: Ref
    summary: str  # what will change, for people
    reason: str = ""  # why (the state that made it necessary)
    body: Any = None  # manifest or patch document
    patch_type: str = "merge"
    details: tuple[str, ...] = ()  # one line each, shown under the change (e.g. every derived value)

    def describe(self) -> str:
        because = f"  ← {self.reason}" if self.reason else ""
        return f"{self.verb} {self.target}: {self.summary}{because}"


@dataclass(frozen=True)
class ObjectsFacts:
    """What a step that manages plain Kubernetes objects read: the objects the config wants (in apply order), how
    each differs from the cluster (Ref -> "missing" or "differs at …"), and objects of ours no longer wanted."""

    desired: list
    drift: dict
    leftovers: list
    notes: tuple[str, ...] = ()

    def changes(self, details=lambda ref: ()) -> list["Change"]:
        """Pure: apply what is missing or differs (in apply order), then remove what is no longer wanted."""
        changes = []
        for obj in self.desired:
            ref = Ref.of(obj)
            if why := self.drift.get(ref):
                changes.append(Change(Verb.APPLY, ref, "create" if why == "missing" else "update", why, obj,
                                      details=tuple(details(ref))))
        for ref in self.leftovers:
            changes.append(Change(Verb.DELETE, ref, "remove", "no longer wanted by the config"))
        return changes


@dataclass
class StepResult:
    id: str
    status: str  # applied | unchanged | probed | skipped | failed | planned | interrupted | undone | not installed
    changes: int = 0
    message: str = ""
    planned: list[Change] = field(default_factory=list)
    left_waiting: list[str] = field(default_factory=list)  # teardown: what it leaves waiting (Step.undo_leaves)

    def to_json(self) -> dict:
        document = {"id": self.id, "status": self.status, "changes": self.changes, "message": self.message}
        if self.left_waiting:
            document["left_waiting"] = list(self.left_waiting)
        if self.planned:  # a dry run's changes, as the plan prints them: what and why, never a body
            document["planned"] = [{"verb": str(c.verb), "target": str(c.target), "summary": c.summary,
                                    "reason": c.reason} for c in self.planned]
        return document


class Step:
    id: ClassVar[str] = ""
    title: ClassVar[str] = ""
    revision: ClassVar[int] = 1  # bump when the step's logic changes what it would do, so old records re-run
    reads_only: ClassVar[bool] = False  # a step that changes nothing (preflight): a run of it "probed"
    stateless: ClassVar[bool] = False  # leaves nothing in the cluster (validate): only its record says it passed

    def inputs(self, ctx: "Context") -> Any:
        """Everything the step's outcome depends on; its hash is the step's fingerprint."""
        raise NotImplementedError

    def fingerprints(self, ctx: "Context") -> tuple[str, str]:
        """(fingerprint, public_fingerprint) from one reading of the inputs (a step's inputs may ask helm)."""
        inputs = self.inputs(ctx)
        return self.fingerprint(ctx, inputs), self.public_fingerprint(ctx, inputs)

    def fingerprint(self, ctx: "Context", inputs: Any = None) -> str:
        """HMAC-SHA256 of the inputs under the cluster's own key (kept in a Secret beside the checkpoint): the inputs
        hold chart values, secrets among them, and a plain hash in a ConfigMap would let anyone who reads it confirm
        a guessed password. Without the key (a run that may not read it) there is nothing to compare: ''."""
        key = getattr(ctx, "fingerprint_key", None)
        if not key:
            return ""
        payload = json.dumps({"step": self.id, "revision": self.revision,
                              "inputs": self.inputs(ctx) if inputs is None else inputs},
                             sort_keys=True, default=str)
        return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()[:16]

    def public_fingerprint(self, ctx: "Context", inputs: Any = None) -> str:
        """SHA-256 of the inputs with every value that is or may be secret hidden, by the rules that keep values out
        of Git (security/secret_values.py: wider than the screen's, schema-first): what a role that may not read
        the key (the plan role) compares. Anyone who reads the record could confirm a guess of a value these rules
        miss (docs/security.md); the keyed fingerprint beside it confirms nothing to them."""
        from gpu_bootstrap.security import secret_values
        plain = json.loads(json.dumps(self.inputs(ctx) if inputs is None else inputs, default=str))
        payload = json.dumps({"step": self.id, "revision": self.revision,
                              "inputs": secret_values.hidden(plain) if isinstance(plain, dict) else plain},
                             sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    declaration: ClassVar["Declaration | None"] = None  # set by declare(), below the class in its module

    def enabled(self, ctx: "Context") -> bool:
        """The declaration's switch (a step with none always runs)."""
        declaration = type(self).declaration
        return declaration is None or declaration.enabled(ctx.config)

    def namespaces(self, ctx: "Context") -> list[str]:
        """The namespaces this step installs into, made by it when missing: `up` refuses to install into one that
        exists without being ours (pipeline/runner.py), lest its creator own what goes there."""
        return []

    def check(self, ctx: "Context") -> Check:
        raise NotImplementedError

    def plan(self, ctx: "Context", check: Check) -> list[Change]:
        """Pure: the changes that bring the cluster from what `check` read to the wanted state."""
        raise NotImplementedError

    def verify(self, ctx: "Context") -> Check:
        return self.check(ctx)

    def undo_plan(self, ctx: "Context") -> list[Change]:
        return []

    def undo_leaves(self, ctx: "Context", changes: list[Change]) -> list[str]:
        """What undoing `changes` leaves waiting for good (pods that name a scheduler it removes), one line each with
        what to do about it: teardown says it before it asks, in its summary, and in its exit status. Reads only."""
        return []

    def made_while_running(self, ctx: "Context") -> list[dict]:
        """The objects the components this step installs make once they run, outside anything we apply (a
        scheduler's leader-election Lease), that undo_plan removes: `teardown --dry-run --offline` adds them to the
        cluster a fresh `up` leaves (adapters/after_up.py). Read only from ctx.kube, as undo_plan does."""
        return []

    def record(self, ctx: "Context", check: Check) -> dict | None:
        """An object to keep beside the checkpoint once the step succeeded (not in dry runs), e.g. the node facts
        preflight read, so that later runs without preflight use them instead of guessing."""
        return None

    def cleanup_plan(self, ctx: "Context") -> list[Change]:
        """Changes that remove what only verification needed (run after verify, whether it passed or not)."""
        return []

    def doctor(self, ctx: "Context") -> list[Check]:
        return [self.check(ctx)]


def _always(config) -> bool:
    return True


def _no_needs(config) -> dict:
    return {}


@dataclass(frozen=True)
class Declaration:
    """What a step is, declared once at the bottom of its module (`DECLARATION = declare(TheStep, ...)`). Everything
    that lists steps is derived from these: the registry (steps/__init__.py), `rbac`'s roles, the config sections a
    step adds, `init`'s example, README's step table, the docs' navigation and the config reference
    (scripts/generate-docs). The order is not here: it lives in playbooks/*.yaml, which users may edit.

    `section` names the config key the step's switch reads (its section); `model` is given only for a section the step
    brings itself (a step added after the built-in sections: the config is extended with it, see
    steps.config_model()). `needs(config)` returns the API requests the step makes by phase (security/rbac_rules.py:
    read, write, run, doctor), `dra_needs(config)` what it adds when GPUs are allocated through DRA, `scopes(config)`
    the namespaces its needs name by a key of its own (a namespace of its section)."""

    step: type[Step]
    summary: str  # what it does, in one line: README's step table
    section: str | None = None
    enabled: Callable[[Any], bool] = _always  # config -> does the step run?
    needs: Callable[[Any], dict] = _no_needs
    dra_needs: Callable[[Any], dict] = _no_needs
    scopes: Callable[[Any], dict] = _no_needs  # config -> {scope key: namespace} its needs name beyond rbac's own
    model: Any = None  # the pydantic model of a section the step brings itself
    example: str = ""  # its section in `init`'s commented example (default: generated from the model)
    status: str = "available"
    docs: str = ""  # its page in docs/ (default: steps/<id>.md)

    @property
    def id(self) -> str:
        return self.step.id

    @property
    def title(self) -> str:
        return self.step.title

    def settings(self, config):
        """The step's own section of `config` (a step that brings one): its defaults where the config was built
        without the step's model (a config made in code, or before the step was known)."""
        found = getattr(config, self.section, None) if self.section else None
        return found if found is not None else self.model()

    @property
    def page(self) -> str:
        """Its page in docs/."""
        return self.docs or f"steps/{self.id}.md"


def declare(step: type[Step], summary: str, **fields) -> Declaration:
    """The step's declaration, tied to its class (so that Step.enabled follows the declared switch)."""
    declaration = Declaration(step, summary, **fields)
    step.declaration = declaration
    return declaration
