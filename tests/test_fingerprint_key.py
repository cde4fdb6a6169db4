"""Step fingerprints are keyed per cluster (pipeline/step.py, checkpoint.KEY_SECRET): the checkpoint ConfigMap is
readable by roles that may not read Secrets, and a plain hash of inputs that hold chart values would let such a
reader confirm a guessed password offline."""
from __future__ import annotations

import hashlib
import hmac
import json
from types import SimpleNamespace

import pytest

from gpu_bootstrap.pipeline.step import Step


class ValuesStep(Step):
    id = "monitoring"

    def __init__(self, password: str):
        self.password = password

    def inputs(self, ctx):
        return {"values": {"grafana": {"adminPassword": self.password}}}


def unkeyed(step: Step, ctx) -> str:
    """What a reader of the ConfigMap could compute for a guess, were the fingerprint a plain hash."""
    payload = json.dumps({"step": step.id, "revision": step.revision, "inputs": step.inputs(ctx)}, sort_keys=True,
                         default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@pytest.mark.unit
def test_a_fingerprint_cannot_confirm_a_guessed_secret_without_the_key():
    ctx = SimpleNamespace(fingerprint_key=b"k" * 32)
    recorded = ValuesStep("hunter2").fingerprint(ctx)
    assert recorded != unkeyed(ValuesStep("hunter2"), ctx)  # the right guess, hashed, does not match
    assert recorded == hmac.new(b"k" * 32, json.dumps(
        {"step": "monitoring", "revision": 1, "inputs": ValuesStep("hunter2").inputs(ctx)},
        sort_keys=True).encode(), hashlib.sha256).hexdigest()[:16]
    assert recorded != ValuesStep("hunter2").fingerprint(SimpleNamespace(fingerprint_key=b"o" * 32))  # per cluster
    assert ValuesStep("hunter2").fingerprint(SimpleNamespace(fingerprint_key=None)) == ""  # no key: matches nothing
    assert ValuesStep("hunter3").fingerprint(ctx) != recorded  # a changed secret still re-runs the step

