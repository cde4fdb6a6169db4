"""Small shared helpers: JSON tree copies, timestamps, and API errors rendered as Status objects."""
from __future__ import annotations

import datetime as _dt
import json


def jcopy(value):
    """Deep copy of a JSON tree (several times faster than copy.deepcopy)."""
    if isinstance(value, dict):
        return {k: jcopy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jcopy(v) for v in value]
    return value


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> _dt.datetime:
    return _dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.timezone.utc)


def age(timestamp: str | None) -> str:
    """kubectl-style short age: 5s, 3m, 2h10m, 4d."""
    if not timestamp:
        return "<unknown>"
    seconds = int((_dt.datetime.now(_dt.timezone.utc) - parse_time(timestamp)).total_seconds())
    seconds = max(seconds, 0)
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h{minutes % 60}m" if hours < 8 and minutes % 60 else f"{hours}h"
    return f"{hours // 24}d"


def dumps(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
    406: "NotAcceptable", 409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid",
    429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout",
}


class ApiError(Exception):
    """An error the apiserver reports as a metav1.Status with the given HTTP code."""

    def __init__(self, code: int, message: str, reason: str | None = None, details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> dict:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            # StatusDetails' fields are omitempty: the core group's "" is left out, as the real server does
            body["details"] = {k: v for k, v in self.details.items() if v != ""}
        return body


def not_found(rt, name: str) -> ApiError:
    what = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
    return ApiError(404, f'{what} "{name}" not found', "NotFound",
                    {"name": name, "group": rt.group, "kind": rt.plural})


def already_exists(rt, name: str) -> ApiError:
    what = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
    return ApiError(409, f'{what} "{name}" already exists', "AlreadyExists",
                    {"name": name, "group": rt.group, "kind": rt.plural})


def conflict(rt, name: str, message: str) -> ApiError:
    what = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
    return ApiError(409, f'Operation cannot be fulfilled on {what} "{name}": {message}', "Conflict",
                    {"name": name, "group": rt.group, "kind": rt.plural})


def invalid(rt, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """causes: (reason, field, message) triples, as in a 422 from the real apiserver."""
    kind = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
    summary = ", ".join(f"{field}: {message}" for _reason, field, message in causes)
    details = {"name": name, "group": rt.group, "kind": rt.kind,
               "causes": [{"reason": r, "message": m, "field": f} for r, f, m in causes]}
    return ApiError(422, f'{kind} "{name}" is invalid: {summary}', "Invalid", details)
