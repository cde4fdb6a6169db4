"""Label selectors (equality- and set-based), field selectors, and metav1.LabelSelector objects."""
from __future__ import annotations

import re
from dataclasses import dataclass

from .util import ApiError

_TOKEN = re.compile(r"\s*(\(|\)|,|!=|==|=|!|>|<|[^\s(),!=<>]+)")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # =, !=, in, notin, exists, !, gt, lt
    values: tuple[str, ...] = ()

    def matches(self, labels: dict) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("gt", "lt"):
            try:
                number, bound = int(value), int(self.values[0])
            except (TypeError, ValueError):
                return False
            return number > bound if self.op == "gt" else number < bound
        return False


def parse_label_selector(text: str) -> list[Requirement]:
    tokens = [t for t in _TOKEN.findall(text or "")]
    requirements: list[Requirement] = []
    pos = 0

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ApiError(400, f"unable to parse requirement: unexpected end of selector {text!r}")
        pos += 1
        return tokens[pos - 1]

    while pos < len(tokens):
        token = take()
        if token == "!":
            requirements.append(Requirement(take(), "!"))
        else:
            key = token
            if pos >= len(tokens) or tokens[pos] == ",":
                requirements.append(Requirement(key, "exists"))
            else:
                op = take()
                if op in ("=", "=="):
                    requirements.append(Requirement(key, "=", (_value(tokens, pos),)))
                    pos += 1 if pos < len(tokens) and tokens[pos] != "," else 0
                elif op == "!=":
                    requirements.append(Requirement(key, "!=", (_value(tokens, pos),)))
                    pos += 1 if pos < len(tokens) and tokens[pos] != "," else 0
                elif op in ("in", "notin"):
                    if take() != "(":
                        raise ApiError(400, f"unable to parse requirement: expected '(' in {text!r}")
                    values = []
                    while True:
                        item = take()
                        if item == ")":
                            break
                        if item != ",":
                            values.append(item)
                    requirements.append(Requirement(key, op, tuple(values)))
                elif op in (">", "<"):
                    requirements.append(Requirement(key, "gt" if op == ">" else "lt", (take(),)))
                else:
                    raise ApiError(400, f"unable to parse requirement: found {op!r}, expected an operator")
        if pos < len(tokens):
            if take() != ",":
                raise ApiError(400, f"unable to parse requirement: expected ',' in {text!r}")
    return requirements


def _value(tokens: list[str], pos: int) -> str:
    return "" if pos >= len(tokens) or tokens[pos] == "," else tokens[pos]


def labels_match(requirements: list[Requirement], labels: dict | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in requirements)


# --- field selectors -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FieldTerm:
    path: str
    op: str  # = or !=
    value: str


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, current, escaped = [], [], False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            current.append(char)
            escaped = True
        elif char == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def parse_field_selector(text: str, allowed: tuple[str, ...]) -> list[FieldTerm]:
    terms = []
    for part in _split_unescaped(text or "", ","):
        if not part:
            continue
        match = re.fullmatch(r"([^=!]+)(==|!=|=)(.*)", part)
        if not match:
            raise ApiError(400, f"invalid selector: '{text}'; can't understand '{part}'")
        path, op, value = match.group(1).strip(), match.group(2), _unescape(match.group(3))
        if path not in ("metadata.name", "metadata.namespace") and path not in allowed:
            raise ApiError(400, f'field label not supported: {path}')
        terms.append(FieldTerm(path, "!=" if op == "!=" else "=", value))
    return terms


def field_value(obj: dict, path: str) -> str:
    current = obj
    for part in path.split("."):
        if not isinstance(current, dict):
            return ""
        current = current.get(part)
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    if path == "source" and isinstance(current, dict):
        return current.get("component", "")
    return str(current)


def fields_match(terms: list[FieldTerm], obj: dict) -> bool:
    for term in terms:
        actual = field_value(obj, term.path)
        if (actual == term.value) != (term.op == "="):
            return False
    return True


# --- metav1.LabelSelector ----------------------------------------------------------------------------------
def selector_object_matches(selector: dict | None, labels: dict | None) -> bool:
    """Match a LabelSelector object (matchLabels + matchExpressions). An empty selector matches everything."""
    if selector is None:
        return False
    labels = labels or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        op, key, values = expr.get("operator"), expr.get("key"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def node_selector_term_matches(term: dict, node: dict) -> bool:
    """One NodeSelectorTerm (matchExpressions on labels, matchFields on metadata.name)."""
    labels = node.get("metadata", {}).get("labels") or {}
    for expr in term.get("matchExpressions") or []:
        if not _node_expr(expr, labels.get(expr.get("key")), expr.get("key") in labels):
            return False
    for expr in term.get("matchFields") or []:
        name = node.get("metadata", {}).get("name")
        if expr.get("key") == "metadata.name" and not _node_expr(expr, name, True):
            return False
    return True


def _node_expr(expr: dict, value, present: bool) -> bool:
    op, values = expr.get("operator"), expr.get("values") or []
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        try:
            number, bound = int(value), int(values[0])
        except (TypeError, ValueError, IndexError):
            return False
        return number > bound if op == "Gt" else number < bound
    return False
