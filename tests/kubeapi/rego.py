"""Rego as OPA evaluates a webhook's policy, on a real Rego engine: `gordon-to-regorus`, a build of Microsoft's
regorus (Rust). It must pass the known-answer test in tests/test_admission_policy.py (base64.encode of a marshalled
object, the way a JSONPatch is built); regopy 1.5.2 does not."""
from __future__ import annotations

import json


def available() -> bool:
    try:
        import regorus  # noqa: F401
        return True
    except ImportError:
        return False


class Policy:
    """One policy; `decide(rule, input)` evaluates a rule (e.g. data.system.main) as OPA's data API does. The engine
    may only be used on the thread that made it, so each evaluation compiles its own (the modules are checked once,
    here, so a policy that does not parse fails at load, as `opa run` does)."""

    def __init__(self, modules: dict[str, str]):
        self.modules = dict(modules)
        self._engine()

    def _engine(self):
        import regorus
        engine = regorus.Engine()
        for name, text in self.modules.items():
            engine.add_policy(name, text)
        return engine

    def decide(self, rule: str, document) -> object:
        engine = self._engine()
        engine.set_input_json(json.dumps(document))
        return engine.eval_rule(rule)
