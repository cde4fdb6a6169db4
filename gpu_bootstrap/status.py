"""The four outcomes of a check, shared by node probes and step checks (plain strings: they appear in JSON)."""
from __future__ import annotations

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
