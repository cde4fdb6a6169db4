"""The outcome of a check: four statuses (plain strings: they appear in JSON), shared by node probes, step checks
and the hardening checks, and the Check record a step's `check` returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"


@dataclass
class Check:
    """The outcome of reading real state. `done` means the step's desired state already holds; `facts` is the
    step's own typed record of what it read (its plan needs nothing else); `warnings` are reported by the runner."""

    status: str = PASS  # pass | warn | fail | skip
    message: str = ""
    done: bool = False
    facts: Any = None
    warnings: list[str] = field(default_factory=list)
    # what the plan had to decide without the facts it depends on (gpu-operator: driver.enabled with no node facts):
    # such a plan is incomplete, not "planned"
    unknown: list[str] = field(default_factory=list)
