"""The step interface and the data that flows through the pipeline.

A step reads real state (`check`), turns it into changes (`plan`, pure), lets the runner push those changes through
the one gate, confirms the result (`verify`), and can compute how to undo itself (`undo_plan`).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ..context import Context

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"


@dataclass(frozen=True)
class Target:
    """What a change acts on: a Kubernetes object, a Helm release, or a node."""

    kind: str
    name: str
    namespace: str | None = None
    api_version: str = ""

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


@dataclass(frozen=True)
class Change:
    """One planned change, as data. `verb` tells the gate which adapter call makes it real."""

    verb: str  # apply | patch | create | delete | ...
    target: Target
    summary: str  # what will change, for people
    reason: str = ""  # why (the state that made it necessary)
    body: Any = None  # manifest or patch document
    patch_type: str = "merge"

    def describe(self) -> str:
        because = f"  ← {self.reason}" if self.reason else ""
        return f"{self.verb} {self.target}: {self.summary}{because}"


@dataclass
class Check:
    """The outcome of reading real state. `done` means the step's desired state already holds."""

    status: str = PASS  # pass | warn | fail
    message: str = ""
    done: bool = False
    facts: dict = field(default_factory=dict)


@dataclass
class StepResult:
    id: str
    status: str  # applied | unchanged | skipped | failed | planned | interrupted | undone
    changes: int = 0
    message: str = ""
    planned: list[Change] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"id": self.id, "status": self.status, "changes": self.changes, "message": self.message}


class Step:
    id: ClassVar[str] = ""
    title: ClassVar[str] = ""
    revision: ClassVar[int] = 1  # bump when the step's logic changes what it would do, so old records re-run

    def inputs(self, ctx: "Context") -> Any:
        """Everything the step's outcome depends on; its hash is the step's fingerprint."""
        raise NotImplementedError

    def fingerprint(self, ctx: "Context") -> str:
        payload = json.dumps({"step": self.id, "revision": self.revision, "inputs": self.inputs(ctx)},
                             sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def enabled(self, ctx: "Context") -> bool:
        return True

    def check(self, ctx: "Context") -> Check:
        raise NotImplementedError

    def plan(self, ctx: "Context", check: Check) -> list[Change]:
        raise NotImplementedError

    def verify(self, ctx: "Context") -> Check:
        return self.check(ctx)

    def undo_plan(self, ctx: "Context") -> list[Change]:
        return []

    def cleanup_plan(self, ctx: "Context") -> list[Change]:
        """Changes that remove what only verification needed (run after verify, whether it passed or not)."""
        return []

    def doctor(self, ctx: "Context") -> list[Check]:
        return [self.check(ctx)]
