"""Does the cluster hold what a chart would render? Pure: the rendered documents against the live objects.

Used where a helm release's record cannot be read (its storage is a Secret, which the plan role may not read): the
chart is rendered locally with the values `up` would install, and each rendered object is compared with the live
object of the same kind, namespace and name. The comparison is a subset one, as the API server adds defaults and
controllers add status: every field the chart sets must be there with the same value; fields only the live object
has are not differences, nor are a chart's nulls and the zero values the server omits when it stores an object
(false, 0, "", empty lists and maps: found so on the real API server), nor `checksum/*` annotations (hashes of
other objects, compared themselves). A difference names the object and the field, never a value (the rendered or
the live one may be a secret). Left out, and said: Secrets (never read), helm hooks (helm deletes them after
they ran), and CustomResourceDefinitions (compared by the CRD step of each chart).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

HOOK = "helm.sh/hook"
SKIPPED_KINDS = ("Secret", "CustomResourceDefinition")
# the server rewrites these, so a rendered value never equals the stored one byte for byte
IGNORED_PATHS = ("metadata.annotations.deployment.kubernetes.io/revision", "status")
# charts roll pods on a config change with an annotation hashing it (`checksum/secret`, `checksum/config`); a
# Secret's may hash a value the chart generates anew at each render (grafana's admin password): found so on the
# real API server
CHECKSUM = re.compile(r"(^|\.)annotations\.checksum/")


@dataclass
class Diff:
    differences: list[str] = field(default_factory=list)  # "Kind ns/name: path: <how it differs>", never a value
    missing: list[str] = field(default_factory=list)  # rendered objects the cluster lacks
    not_compared: list[str] = field(default_factory=list)  # Secrets, hooks

    @property
    def same(self) -> bool:
        return not self.differences and not self.missing


def release_state(diff: Diff, installed: str) -> dict:
    """A step's release state from a live comparison (the release's values unknown)."""
    skipped = f"; not compared: {len(diff.not_compared)} object(s) (Secrets, hooks)" if diff.not_compared else ""
    if diff.same:
        return {"up_to_date": True, "installed": installed,
                "reason": f"its live objects match the chart rendered with these values{skipped}"}
    shown = [f"missing {m}" for m in diff.missing[:2]] + diff.differences[:3]
    more = len(diff.missing) + len(diff.differences) - len(shown)
    return {"up_to_date": False, "installed": installed,
            "reason": "its live objects differ from the chart rendered with these values: " + "; ".join(shown)
                      + (f" (and {more} more)" if more > 0 else "")}


def key(doc: dict) -> tuple[str, str, str]:
    meta = doc.get("metadata") or {}
    return doc.get("kind", ""), meta.get("namespace") or "", meta.get("name", "")


def compare(rendered: list[dict], live: dict[tuple[str, str, str], dict | None], namespace: str) -> Diff:
    """`live`: (kind, namespace, name) -> the live object, None when absent (as read for each rendered one)."""
    diff = Diff()
    for doc in rendered:
        kind, ns, name = key(doc)
        ns = ns or (namespace if (kind, namespace, name) in live else "")
        label = f"{kind} {ns + '/' if ns else ''}{name}"
        if kind in SKIPPED_KINDS or HOOK in ((doc.get("metadata") or {}).get("annotations") or {}):
            diff.not_compared.append(label)
            continue
        found = live.get((kind, ns, name))
        if found is None:
            diff.missing.append(label)
            continue
        for path, want, have in _subset(doc, found, ""):
            diff.differences.append(f"{label}: {path}: {_how(want, have)}")
    return diff


def _subset(want, have, path: str):
    if path in IGNORED_PATHS or want is None:
        return  # a null in a chart's output means "not set"
    if CHECKSUM.search(path):
        return  # a hash of another object's content: that object is compared itself (or is a Secret, unknown)
    if have is None and _empty(want):
        return  # false, 0, "" and empty collections are omitted when stored (omitempty)
    if isinstance(want, dict):
        if not isinstance(have, dict):
            if want:
                yield path, want, have
            return
        for k, v in want.items():
            sub = f"{path}.{k}" if path else str(k)
            if k not in have:
                if not _empty(v):
                    yield sub, v, None
                continue
            yield from _subset(v, have[k], sub)
        return
    if isinstance(want, list):
        if not isinstance(have, list):
            if want:
                yield path, want, have
            return
        if all(isinstance(i, dict) and "name" in i for i in want) and all(isinstance(i, dict) for i in have):
            by_name = {i.get("name"): i for i in have}
            for item in want:
                sub = f"{path}[{item['name']}]"
                if item["name"] not in by_name:
                    yield sub, item, None
                else:
                    yield from _subset(item, by_name[item["name"]], sub)
            return
        if len(want) != len(have):
            yield path, want, have
            return
        for index, (a, b) in enumerate(zip(want, have)):
            yield from _subset(a, b, f"{path}[{index}]")
        return
    if not _equal(want, have, path):
        yield path, want, have


def _empty(value) -> bool:
    """What the API server does not store: a zero value of an omitempty field."""
    return value is None or value is False or (value == 0 and not isinstance(value, bool)) or value in ({}, [], "")


def _equal(want, have, path: str) -> bool:
    """Scalars as the API server stores them: a number may come back as its string (int-or-string fields), and a
    quantity under `resources` in its canonical form ("1024Mi" is stored as "1Gi")."""
    if want == have:
        return True
    if isinstance(want, (int, float)) and not isinstance(want, bool) and str(want) == str(have):
        return True
    if ".resources." in f".{path}." or path.startswith("resources."):
        return quantity(want) is not None and quantity(want) == quantity(have)
    return False


_SUFFIX = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60, "n": "1e-9",
           "u": "1e-6", "m": "1e-3", "k": "1e3", "M": "1e6", "G": "1e9", "T": "1e12", "P": "1e15", "E": "1e18"}


def quantity(value):
    """A Kubernetes quantity as an exact Decimal of base units; None when it is not one."""
    import decimal
    text = str(value).strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if text.endswith(suffix):
            try:
                return decimal.Decimal(text[:-len(suffix)]) * decimal.Decimal(_SUFFIX[suffix])
            except decimal.InvalidOperation:
                return None
    try:
        return decimal.Decimal(text)
    except decimal.InvalidOperation:
        return None


def _how(want, have) -> str:
    """How a live field differs from the rendered one, without either value: a plan names paths, never values (a
    chart's value may be a password, and no rule tells every secret by its name)."""
    if have is None:
        return "not set on the live object"
    if type(want) is not type(have) and not (_scalar(want) and _scalar(have)):
        return f"the live value is {_kind(have)}, the chart renders {_kind(want)}"
    return "the live value differs from the rendered one"


def _scalar(value) -> bool:
    return isinstance(value, (str, int, float, bool))


def _kind(value) -> str:
    return "a map" if isinstance(value, dict) else "a list" if isinstance(value, list) else "a value"
