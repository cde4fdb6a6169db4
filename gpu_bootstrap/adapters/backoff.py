"""The one backoff rule of the adapters that repeat work (the Kubernetes API and helm): exponential steps capped,
each wait drawn from half to all of its step (jitter, so that many clients do not retry in lockstep), never shorter
than what the server asked for (Retry-After), and never past the caller's deadline."""
from __future__ import annotations

import logging
import random
import time


def wait(attempt: int, base: float, cap: float, deadline: float, what: str, log: logging.Logger,
         asked: float | None = None) -> bool:
    """Sleep before attempt `attempt + 1`; False (no sleep) when the wait would pass `deadline` (monotonic)."""
    step = min(base * 2 ** (attempt - 1), cap)
    delay = step / 2 + random.random() * step / 2
    if asked is not None:
        delay = max(delay, asked)
    if time.monotonic() + delay >= deadline:
        return False
    asked_for = " as the server asked (Retry-After)" if asked is not None and delay == asked else ""
    log.info("%s; retrying in %.1f s%s (attempt %d)", what, delay, asked_for, attempt + 1)
    time.sleep(delay)
    return True
