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


def opa_available() -> bool:
    """OPA's own Go engine (v1.20.2), embedded through the wheel `opa-golib-python-bindings` (a c-shared build of
    github.com/open-policy-agent/opa/v1/rego; scripts/install-test-tools installs it)."""
    try:
        import opa_bindings.engine  # noqa: F401
        return True
    except (ImportError, OSError):
        return False


class OpaPolicy:
    """The same interface as Policy, evaluated by OPA's Go engine: what `opa run` evaluates, minus its HTTP server."""

    def __init__(self, modules: dict[str, str]):
        from opa_bindings.engine import OpaEngine
        self.modules = dict(modules)
        self.engine = OpaEngine()
        for name, text in self.modules.items():
            self.engine.add_policy(name, text)

    def decide(self, rule: str, document) -> object:
        from opa_bindings.engine import OpaUndefinedError
        path = rule.removeprefix("data.")
        try:
            return self.engine.eval_document(path, document)
        except OpaUndefinedError:
            return None
