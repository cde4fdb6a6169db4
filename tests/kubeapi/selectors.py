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
    """Parse like k8s.io/apimachinery labels.Parse: requirements separated by commas, no empty ones."""
    tokens = _TOKEN.findall(text or "")
    if not tokens:
        return []
    parser = _SelectorParser(tokens, text)
    requirements = [parser.requirement()]
    while parser.peek() is not None:
        parser.expect(",")
        requirements.append(parser.requirement())
    return requirements


class _SelectorParser:
    def __init__(self, tokens: list[str], text: str):
        self.tokens, self.text, self.pos = tokens, text, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            self.fail("unexpected end of selector")
        self.pos += 1
        return token

    def expect(self, wanted: str) -> None:
        if self.take() != wanted:
            self.fail(f"expected {wanted!r}")

    def fail(self, why: str):
        raise ApiError(400, f"unable to parse requirement: {why} in {self.text!r}")

    def identifier(self) -> str:
        token = self.take()
        if token in ("(", ")", ",", "!=", "==", "=", "!", ">", "<"):
            self.fail(f"found {token!r}, expected an identifier")
        return token

    def requirement(self) -> Requirement:
        if self.peek() == "!":
            self.take()
            return Requirement(self.identifier(), "!")
        key = self.identifier()
        op = self.peek()
        if op is None or op == ",":
            return Requirement(key, "exists")
        self.take()
        if op in ("=", "==", "!="):
            value = "" if self.peek() in (None, ",") else self.identifier()
            return Requirement(key, "!=" if op == "!=" else "=", (value,))
        if op in (">", "<"):
            return Requirement(key, "gt" if op == ">" else "lt", (self.identifier(),))
        if op in ("in", "notin"):
            self.expect("(")
            values = []
            while self.peek() != ")":
                values.append(self.identifier())
                if self.peek() == ",":
                    self.take()
            self.take()
            return Requirement(key, op, tuple(values))
        self.fail(f"found {op!r}, expected an operator")


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
            known = ", ".join(f'"{label}"' for label in ("metadata.name", "metadata.namespace", *allowed))
            raise ApiError(400, f'"{path}" is not a known field selector: only {known}')
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
