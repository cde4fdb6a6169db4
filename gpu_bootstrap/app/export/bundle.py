"""A fresh-install plan as ordered units for a GitOps engine. Pure.

The input is what the gate recorded in an offline run of the playbook: (step id, Change) in order. Consecutive
object changes of a step form one unit of plain manifests; each Helm release is a unit of its own; so a step such
as monitoring (its namespace, then the kube-prometheus-stack chart, then our alert rules and dashboards, which need
the chart's CRDs) becomes three units, and the engine applies them in that order (sync waves, dependsOn, needs).
A unit is named by its step and release alone (unit_id), never by a place in the playbook: users keep these names
(Argo CD Applications, Flux Kustomizations), and an engine prunes a name that disappears, with its resources.
What is not declarative (node taints and labels, the validation pods, the tool's own bookkeeping) is kept as the
lines of the plan that name it, for the export's README.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from gpu_bootstrap.security import redact, secret_values
from gpu_bootstrap.core.objects import GITOPS_ANNOTATION
from gpu_bootstrap.core.refs import Verb
from gpu_bootstrap.render.gpu_operator_values import NO_FACTS  # a value the chart's default decided, no fact


@dataclass
class Release:
    name: str
    namespace: str
    chart: str  # the chart's name in its repository, an oci:// reference, or a local path
    repo: str | None
    version: str | None
    values: dict  # without the values that are or may be secrets (secret_paths)
    derived: list[str]  # "path=value  ← why", as the plan says them
    secret_paths: list[str] = field(default_factory=list)  # helm --set style paths (a.b[0].c), never their values
    # the values document the user puts in a Secret (or a file outside the bundle): the tree of secret_paths, each
    # secret as a placeholder naming its path, and whole the lists that hold one (helm replaces a list, never merges it)
    secret_skeleton: dict = field(default_factory=dict)
    skip_crds: bool = False  # its CRDs are another release's (the DRA driver's ComputeDomain CRDs: the operator's)
    chart_field: str | None = None  # the config field that names the chart, where it is not `<step>.chart`


@dataclass
class Unit:
    id: str  # unit_id(): "monitoring", "monitoring-kube-prometheus-stack", "monitoring-2"
    step: str
    wave: int  # 0, 1, 2, ... in playbook order
    objects: list[dict] = field(default_factory=list)
    release: Release | None = None

    @property
    def namespace(self) -> str | None:
        """Where the unit's namespaced objects go: the release's, else its first namespaced object's, else the
        first namespace it creates."""
        if self.release is not None:
            return self.release.namespace
        for obj in self.objects:
            if obj["metadata"].get("namespace"):
                return obj["metadata"]["namespace"]
        return next((o["metadata"]["name"] for o in self.objects if o["kind"] == "Namespace"), None)


@dataclass
class Bundle:
    units: list[Unit]
    imperative: dict[str, list[str]]  # step id -> the plan's lines for what stays a command
    redacted: list[str]  # "Kind ns/name" of our objects with a secret-looking value replaced
    kube_version: str
    withheld: list[str] = field(default_factory=list)  # Secrets a rendered chart holds, left out (manifests)


KIND_ORDER = {"CustomResourceDefinition": 0, "Namespace": 1}


def build(submitted: list[tuple[str, Any]], kube_version: str, engine: str, run_steps=frozenset()) -> Bundle:
    """Group the recorded changes into units; `engine` is written on each object of ours (GITOPS_ANNOTATION), so
    that teardown knows a GitOps engine owns it. `run_steps`: steps that are runs, not state (Step.stateless:
    validation pods prove a node works once), which stay commands."""
    groups: list[tuple[str, str, list]] = []  # (step, "objects" | "release", changes)
    imperative: dict[str, list[str]] = {}
    for step, change in submitted:
        verb = Verb(change.verb)
        if step in run_steps:
            imperative.setdefault(step, []).append(change.describe())
        elif verb == Verb.APPLY:
            if groups and groups[-1][:2] == (step, "objects"):
                groups[-1][2].append(change)
            else:
                groups.append((step, "objects", [change]))
        elif verb == Verb.HELM_UPGRADE:
            groups.append((step, "release", [change]))
        elif not _bookkeeping(change):
            imperative.setdefault(step, []).append(change.describe())
    units, redacted = [], []
    for wave, (step, kind, changes) in enumerate(groups):
        earlier = sum(1 for g in groups[:wave] if g[0] == step and g[1] == "objects")
        unit = Unit(unit_id(step, changes[0].body["release"] if kind == "release" else None, earlier), step, wave)
        if kind == "release":
            unit.release = _release(changes[0].body)
        else:
            for change in changes:
                obj = _marked(change.body, engine)
                clean = redact.tree(obj)
                if clean != obj:
                    redacted.append(f"{obj['kind']} {_where(obj)}")
                unit.objects.append(clean)
            unit.objects.sort(key=lambda o: KIND_ORDER.get(o["kind"], 2))  # stable: CRDs, namespaces, the rest
        units.append(unit)
    return Bundle(units, imperative, redacted, kube_version)


def unit_id(step: str, release: str | None = None, earlier_object_units: int = 0) -> str:
    """A unit's name, from what it is and never from where it stands: a step's objects are `<step>` (a later group
    of them, after one of its releases, `<step>-2`, ...); a release is `<step>-<release>`. Inserting a step in the
    playbook, or a version that adds one, renames no other unit; only the sync waves move."""
    if release is not None:
        return f"{step}-{release}"
    return step if earlier_object_units == 0 else f"{step}-{earlier_object_units + 1}"


def _bookkeeping(change) -> bool:
    """A patch that only writes our own annotations (the gpu-operator step's record of a node's labels before the
    first install, kept for teardown): up's memory, not part of the platform."""
    body = change.body if isinstance(change.body, dict) else {}
    meta = body.get("metadata") or {}
    return Verb(change.verb) == Verb.PATCH and set(body) == {"metadata"} and set(meta) == {"annotations"} and \
        all(key.startswith("gpu-bootstrap.io/") for key in meta["annotations"])


def _marked(obj: dict, engine: str) -> dict:
    obj = copy.deepcopy(obj)
    obj.setdefault("metadata", {}).setdefault("annotations", {})[GITOPS_ANNOTATION] = engine
    return obj


def _where(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta['namespace']}/{meta.get('name', '')}" if meta.get("namespace") else meta.get("name", "")


def _release(body: dict) -> Release:
    values, secrets, skeleton = split_secrets(body["values"])
    chart = body["chart"]
    return Release(body["release"], body["namespace"], chart["ref"], chart.get("repo"), chart.get("version"),
                   values, _without(list(body.get("derived") or []), secrets), secrets, skeleton,
                   bool(body.get("skip_crds")), body.get("chart_field"))


def _without(derived: list[str], secrets: list[str]) -> list[str]:
    """The derived values' lines but those of a secret path (a value kept from a running release may be one): the
    lines go into the bundle as comments."""
    return [line for line in derived if line.partition("=")[0] not in secrets]


# --- facts and secrets -----------------------------------------------------------------------------------------------
def values_without_facts(bundle: Bundle) -> list[str]:
    """'release: path' of every value the plan decided without node facts (the chart's default stood in)."""
    found = []
    for unit in bundle.units:
        if unit.release is None:
            continue
        for line in unit.release.derived:
            path, _, why = line.partition("=")
            if why.partition("← ")[2].startswith(NO_FACTS):
                found.append(f"{unit.release.name}: {path}")
    return found


def split_secrets(values: dict) -> tuple[dict, list[str], dict]:
    """(the values without those that are or may be secret, their paths, the skeleton that brings them back):
    security/secret_values.py decides."""
    return secret_values.split(values)
