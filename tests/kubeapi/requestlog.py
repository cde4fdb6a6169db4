"""Every HTTP request the emulator served, for tests to assert on (e.g. "a second run writes nothing")."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")


@dataclass
class Request:
    method: str
    path: str
    query: dict
    content_type: str
    user_agent: str
    verb: str = ""
    status: int = 0
    dry_run: bool = False
    duration: float = 0.0
    started: float = 0.0  # time.monotonic() when the request arrived
    body: bytes = field(default=b"", repr=False)
    access: object = None  # the RBAC attributes it was authorized by (tests/kubeapi/rbac.py Attributes), if any

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS and self.verb not in ("selfsubjectaccessreview",)

    def __str__(self) -> str:
        query = "&".join(f"{k}={v}" for k, v in self.query.items())
        return f"{self.method} {self.path}{'?' + query if query else ''} -> {self.status}"


class RequestLog:
    def __init__(self):
        self._items: list[Request] = []
        self._lock = threading.Lock()

    def add(self, request: Request) -> None:
        with self._lock:
            self._items.append(request)

    def all(self) -> list[Request]:
        with self._lock:
            return list(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def writes(self, include_dry_run: bool = False) -> list[Request]:
        """Requests that could change state (dry-run writes excluded unless asked for)."""
        return [r for r in self.all() if r.is_write and (include_dry_run or not r.dry_run)]

    def matching(self, method: str = "*", path_contains: str = "") -> list[Request]:
        return [r for r in self.all() if method in ("*", r.method) and path_contains in r.path]

    def __len__(self) -> int:
        return len(self.all())
