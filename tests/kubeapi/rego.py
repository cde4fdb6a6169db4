"""Rego as OPA evaluates a webhook's policy, on a real Rego engine: `gordon-to-regorus`, a build of Microsoft's
regorus (Rust). It must pass the known-answer test in tests/test_admission_policy.py (base64.encode of a marshalled
object, the way a JSONPatch is built); regopy 1.5.2 does not."""
from __future__ import annotations

import json
import threading


def available() -> bool:
    try:
        import regorus  # noqa: F401
        return True
    except ImportError:
        return False


class Policy:
    """One loaded policy; `decide(rule, input)` evaluates a rule (e.g. data.system.main) as OPA's data API does."""

    def __init__(self, modules: dict[str, str]):
        import regorus
        self._engine = regorus.Engine()
        for name, text in modules.items():
            self._engine.add_policy(name, text)
        self._lock = threading.Lock()  # one engine, one input at a time

    def decide(self, rule: str, document) -> object:
        with self._lock:
            engine = self._engine.clone() if hasattr(self._engine, "clone") else self._engine
            engine.set_input_json(json.dumps(document))
            return engine.eval_rule(rule)
