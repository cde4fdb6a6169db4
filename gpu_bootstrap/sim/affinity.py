"""Required node affinity, as kube-scheduler's NodeAffinity filter reads it, for the simulator: which nodes a pod may
land on, judged by the node's labels (GPU feature discovery's nvidia.com/gpu.memory, gpu.product,
gpu.compute.major/minor, or any other).

A NodeAffinity is the pod's `nodeSelector` (every key=value must hold) and its
`requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms` (any one term must hold; within a term every
expression must). Operators and their meaning follow k8s.io/apimachinery's labels.Requirement:

- In: the label is set to one of the values; NotIn: the label is not set, or set to none of them;
- Exists / DoesNotExist: the label is set / not set;
- Gt / Lt: the label is set and both it and the single value are integers, label > value / label < value.

A term with no expression matches no node (as upstream). `matchFields` (node name) is not modelled: a trace has no
node identity to hold a pod to, so such a pod is refused rather than simulated wrongly.

In trace files the same constraints are written as text, the way kubectl writes label selectors, with `>` and `<`
for Gt and Lt and `;` between alternative terms:

    nvidia.com/gpu.memory>40000
    nvidia.com/gpu.product in (NVIDIA-H100-80GB-HBM3,NVIDIA-H100-PCIe)
    nvidia.com/gpu.compute.major>7,nvidia.com/gpu.family!=volta ; karpenter.k8s.aws/instance-gpu-name=h100
    nvidia.com/mig.capable,!example.com/reserved
"""
from __future__ import annotations

import re
from dataclasses import dataclass

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
# A label key as Kubernetes validates it: an optional DNS-subdomain prefix and a name of at most 63 characters.
_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_INTEGER = re.compile(r"^[+-]?[0-9]+$")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: dict) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if not present or not _INTEGER.match(labels[self.key]):
            return False  # Gt / Lt: a label that is not an integer matches neither
        have, bound = int(labels[self.key]), int(self.values[0])
        return have > bound if self.operator == "Gt" else have < bound

    def text(self) -> str:
        symbol = {"Gt": ">", "Lt": "<"}.get(self.operator)
        if symbol:
            return f"{self.key}{symbol}{self.values[0]}"
        if self.operator in ("Exists", "DoesNotExist"):
            return ("" if self.operator == "Exists" else "!") + self.key
        if len(self.values) == 1:
            return f"{self.key}{'=' if self.operator == 'In' else '!='}{self.values[0]}"
        return f"{self.key} {self.operator.lower()} ({','.join(self.values)})"


@dataclass(frozen=True, eq=False)
class NodeAffinity:
    """Alternative terms (any one must hold), each a conjunction of requirements. The filter looks an affinity up
    once per node it tries, so its hash is computed once, not from the nested terms at every lookup."""

    terms: tuple[tuple[Requirement, ...], ...]

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash(self.terms))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or isinstance(other, NodeAffinity) and self.terms == other.terms

    def matches(self, labels: dict) -> bool:
        return any(term and all(r.matches(labels) for r in term) for term in self.terms)

    def text(self) -> str:
        return " ; ".join(",".join(r.text() for r in term) for term in self.terms)


_INTERNED: dict[NodeAffinity, NodeAffinity] = {}


def _interned(affinity: NodeAffinity) -> NodeAffinity:
    """One object per distinct constraint: a trace repeats a few constraints over thousands of rows, and the
    filter's per-affinity lookups then succeed on identity instead of comparing nested terms."""
    return _INTERNED.setdefault(affinity, affinity)


def requirement(key: str, operator: str, values=()) -> Requirement:
    """A checked requirement: the key and values as Kubernetes validates them, the value count the operator needs."""
    if isinstance(values, (str, bytes, dict)):
        raise ValueError(f"the values of {key} must be a list, not {values!r}")
    values = tuple(str(v) for v in values or ())
    if operator not in OPERATORS:
        raise ValueError(f"operator {operator!r} is not one of {', '.join(OPERATORS)}")
    if not isinstance(key, str) or not _KEY.match(key) or len(key.rpartition("/")[0]) > 253:
        raise ValueError(f"{key!r} is not a label key")
    bad = next((v for v in values if not _VALUE.match(v)), None)
    if bad is not None:
        raise ValueError(f"{bad!r} (for {key}) is not a label value")
    if operator in ("In", "NotIn") and not values:
        raise ValueError(f"{key} {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise ValueError(f"{key} {operator} takes no values")
    if operator in ("Gt", "Lt") and (len(values) != 1 or not _INTEGER.match(values[0])):
        raise ValueError(f"{key} {operator} needs exactly one integer value")
    if operator in ("In", "NotIn"):
        values = tuple(sorted(set(values)))  # a set: equal constraints compare (and share a shape) as equal
    return Requirement(key, operator, values)


def _term(requirements) -> tuple[Requirement, ...]:
    """A conjunction in one canonical order: the same constraint written in another order is the same term."""
    return tuple(sorted(set(requirements), key=lambda r: (r.key, r.operator, r.values)))


# --- text, as trace files carry it ---------------------------------------------------------------------------------------
_EXPRESSION = re.compile(r"""^\s*(?:
    (?P<not>!)\s*(?P<absent>[^\s=!<>(),]+)                                  # !key
  | (?P<setkey>[^\s=!<>(),]+)\s+(?P<setop>in|notin)\s*\((?P<values>[^()]*)\)  # key in (a,b) / key notin (a,b)
  | (?P<key>[^\s=!<>(),]+)\s*(?P<op>==|=|!=|>|<)\s*(?P<value>[^\s=!<>(),]*)  # key=v, key!=v, key>n, key<n
  | (?P<exists>[^\s=!<>(),]+)                                               # key
)\s*$""", re.VERBOSE)


def parse(text: str) -> NodeAffinity | None:
    """The trace syntax (module docstring) as a NodeAffinity; None for empty text. ValueError says what is wrong."""
    text = (text or "").strip()
    if not text:
        return None
    terms = []
    for term_text in text.split(";"):
        if not term_text.strip():
            raise ValueError(f"an empty term in {text!r} (';' separates alternative terms)")
        terms.append(_term(_expression(part) for part in _split(term_text)))
    return _interned(NodeAffinity(tuple(terms)))


def _split(term: str) -> list[str]:
    """A term's expressions: split at the commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in term:
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return parts + [current]


def _expression(text: str) -> Requirement:
    found = _EXPRESSION.match(text)
    if not found:
        raise ValueError(f"{text.strip()!r} is not an expression (key=value, key!=value, key in (a,b), "
                         f"key notin (a,b), key>N, key<N, key, !key)")
    if found["absent"]:
        return requirement(found["absent"], "DoesNotExist")
    if found["exists"]:
        return requirement(found["exists"], "Exists")
    if found["setkey"]:
        values = [v.strip() for v in found["values"].split(",")]
        return requirement(found["setkey"], "In" if found["setop"] == "in" else "NotIn", [v for v in values if v])
    operator = {"=": "In", "==": "In", "!=": "NotIn", ">": "Gt", "<": "Lt"}[found["op"]]
    return requirement(found["key"], operator, [found["value"]])


def parse_labels(text: str) -> dict[str, str]:
    """Node labels as `key=value,key=value` (as `kubectl label` takes them); ValueError says what is wrong."""
    labels = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise ValueError(f"{part.strip()!r} is not key=value")
        requirement(key.strip(), "In", [value.strip()])  # the same validation as a selector's
        labels[key.strip()] = value.strip()
    return labels


# --- a Pod object --------------------------------------------------------------------------------------------------------
def from_pod_spec(spec: dict) -> NodeAffinity | None:
    """The required node affinity of a pod spec: its nodeSelector joined to each required nodeSelectorTerm (both
    must hold, as upstream). None when the pod has neither. ValueError for what the simulator does not model."""
    selector = [requirement(k, "In", [v]) for k, v in sorted((spec.get("nodeSelector") or {}).items())]
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is None:
        return _interned(NodeAffinity((_term(selector),))) if selector else None
    terms = []
    for term in required.get("nodeSelectorTerms") or []:
        if term.get("matchFields"):
            raise ValueError("matchFields (a node by name) is not modelled: a trace's nodes have no identity to hold "
                             "a pod to")
        expressions = tuple(requirement(e.get("key", ""), e.get("operator", ""), e.get("values"))
                            for e in term.get("matchExpressions") or [])
        terms.append(_term(selector + list(expressions)) if expressions else ())
    return _interned(NodeAffinity(tuple(terms)))
