"""Fault injection: rules matching method + path that answer with an error status, add a delay, reset the
connection, or run an action first (e.g. a concurrent change by "someone else"), for a number of matches or with a
probability."""
from __future__ import annotations

import random
import re
import threading
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Fault:
    method: str = "*"
    path: str = ".*"  # regular expression searched in the request path (without the query string)
    status: int | None = None  # answer with this code (a Status body)
    delay: float = 0.0  # seconds to wait before answering (or before the status / reset)
    reset: bool = False  # close the connection with a TCP reset instead of answering
    count: int | None = 1  # how many times the fault fires; None = every time
    after: int = 0  # let this many matching requests through first
    probability: float = 1.0
    query: str = ""  # regular expression searched in the query string
    message: str = "injected fault"
    headers: dict = field(default_factory=dict)  # extra response headers with `status`, e.g. {"Retry-After": "1"}
    action: Callable[[], None] | None = None  # runs when the fault fires, before the request is handled
    observe: Callable[[object], None] | None = None  # like action, but given the request (requestlog.Request)
    seen: int = 0
    fired: int = 0
    _pattern: re.Pattern = field(init=False, repr=False)

    def __post_init__(self):
        self._pattern = re.compile(self.path)

    def exhausted(self) -> bool:
        return self.count is not None and self.fired >= self.count

    def matches(self, method: str, path: str, query: str) -> bool:
        return (self.method in ("*", method) and self._pattern.search(path) is not None
                and (not self.query or re.search(self.query, query) is not None))


class Faults:
    def __init__(self, seed: int = 3):
        self._rules: list[Fault] = []
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._keyed: int | None = None
        self._occurrences: dict[tuple, int] = {}

    def seed(self, seed: int) -> None:
        """Seeded fault runs: from now on each draw of a `probability` rule is keyed by this seed, the rule, the
        request's method and path and how often the rule has seen that method and path, so the same requests draw
        the same faults whatever order concurrent clients send them in."""
        with self._lock:
            self._keyed = seed
            self._occurrences.clear()

    def add(self, method: str = "*", path: str = ".*", **options) -> Fault:
        rule = Fault(method.upper() if method != "*" else "*", path, **options)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def remove(self, rule: Fault) -> None:
        with self._lock:
            if rule in self._rules:
                self._rules.remove(rule)

    def pick(self, method: str, path: str, query: str) -> Fault | None:
        with self._lock:
            for rule in self._rules:
                if rule.exhausted() or not rule.matches(method, path, query):
                    continue
                rule.seen += 1
                if rule.seen <= rule.after or self._draw(rule, method, path) >= rule.probability:
                    continue
                rule.fired += 1
                return rule
        return None

    def _draw(self, rule: Fault, method: str, path: str) -> float:
        if self._keyed is None:
            return self._random.random()
        key = (rule.method, rule.path, rule.status, rule.reset, rule.delay, method, path)
        self._occurrences[key] = self._occurrences.get(key, 0) + 1
        return random.Random(f"{self._keyed}:{key}:{self._occurrences[key]}").random()
