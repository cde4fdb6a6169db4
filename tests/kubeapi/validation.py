"""Object validation as the apiserver does it: decode-time type checks, unknown fields (fieldValidation),
required fields, enums, CRD structural pruning and defaulting, and object names and labels."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .schema import MISSING, Schema
from .util import jcopy

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


@dataclass
class Problems:
    unknown: list[str] = field(default_factory=list)
    type_errors: list[tuple[str, str, str]] = field(default_factory=list)  # (path, expected, got)
    invalid: list[tuple[str, str, str, object]] = field(default_factory=list)  # (reason, path, message, value)

    def require(self, path: str) -> None:
        self.invalid.append(("FieldValueRequired", path, "Required value", None))

    def bad(self, path: str, value, message: str) -> None:
        self.invalid.append(("FieldValueInvalid", path, f"Invalid value: {_show(value)}: {message}", value))

    def unsupported(self, path: str, value, allowed) -> None:
        choices = ", ".join(_show(a) for a in allowed)
        self.invalid.append(("FieldValueNotSupported", path, f"Unsupported value: {_show(value)}: supported values: "
                                                             f"{choices}", value))


def _show(value) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


JSON_TYPE = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}


def _scalar_ok(value, types: frozenset[str]) -> bool:
    if isinstance(value, bool):
        return "boolean" in types
    if isinstance(value, int):
        return bool(types & {"integer", "number"})
    if isinstance(value, float):
        return "number" in types or ("integer" in types and value.is_integer())
    if isinstance(value, str):
        return "string" in types
    return False


def clean(value, schema: Schema, path: str, problems: Problems, custom: bool):
    """Return `value` with unknown fields and nulls pruned (and CRD defaults applied); record problems."""
    types = schema.types
    if isinstance(value, dict):
        if types and "object" not in types:
            problems.type_errors.append((path, schema.type_label, "object"))
            return value
        if schema.is_any or (schema.preserve_unknown and not schema.is_struct and schema.additional is None):
            return value
        out = {}
        for key, item in value.items():
            if item is None:
                continue
            sub = schema.child(key)
            if sub is None:
                problems.unknown.append(join(path, key))
                continue
            out[key] = clean(item, sub, join(path, key), problems, custom)
        for name in schema.required:
            if name not in out:
                problems.require(join(path, name))
        if custom:
            for name, sub in schema.properties.items():
                if name not in out and sub.default is not MISSING:
                    out[name] = jcopy(sub.default)
        return out
    if isinstance(value, list):
        if types and "array" not in types:
            problems.type_errors.append((path, schema.type_label, "array"))
            return value
        items = schema.items
        return [clean(item, items, f"{path}[{index}]", problems, custom) for index, item in enumerate(value)]
    if types and not _scalar_ok(value, types):
        problems.type_errors.append((path, schema.type_label, JSON_TYPE.get(type(value), "null")))
        return value
    allowed = schema.enum
    if allowed is not None and value not in allowed:
        problems.unsupported(path, value, allowed)
    return value


# --- names and metadata ------------------------------------------------------------------------------------------
def name_problem(name: str, style: str) -> str | None:
    if style == "path":
        if name in (".", "..") or "/" in name or "%" in name:
            return "may not be '.' or '..' and may not contain '/' or '%'"
        return None
    pattern, limit, what = ((DNS1123_LABEL, 63, "RFC 1123 label") if style == "label"
                            else (DNS1123_SUBDOMAIN, 253, "RFC 1123 subdomain"))
    if len(name) > limit:
        return f"must be no more than {limit} characters"
    if not pattern.fullmatch(name):
        return (f"a lowercase {what} must consist of lower case alphanumeric characters, '-' or '.', and must start "
                f"and end with an alphanumeric character")
    return None


def label_key_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return "prefix part must be a lowercase RFC 1123 subdomain"
    if not name or len(name) > 63 or not LABEL_NAME.fullmatch(name):
        return ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                "alphanumeric character")
    return None


def label_value_problem(value: str) -> str | None:
    if len(value) > 63 or not LABEL_VALUE.fullmatch(value):
        return ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
                "must start and end with an alphanumeric character")
    return None


def check_metadata(meta: dict, name_style: str, problems: Problems) -> None:
    name = meta.get("name", "")
    if not name:
        problems.require("metadata.name")
    else:
        issue = name_problem(name, name_style)
        if issue:
            problems.bad("metadata.name", name, issue)
    for key, value in (meta.get("labels") or {}).items():
        issue = label_key_problem(key)
        if issue:
            problems.bad("metadata.labels", key, issue)
        elif not isinstance(value, str) or label_value_problem(value):
            problems.bad(f"metadata.labels", value, label_value_problem(str(value)) or "must be a string")
    for key in (meta.get("annotations") or {}):
        issue = label_key_problem(key)
        if issue:
            problems.bad("metadata.annotations", key, issue)
