"""Schemas for built-in kinds (the official OpenAPI-derived JSON schemas shipped by kubernetes-validate)
and for custom resources (a CRD's openAPIV3Schema), behind one node interface.

The same nodes drive strict field validation, strategic-merge list keys, server-side-apply list types and
the OpenAPI documents the emulator serves, so all four agree with each other and with upstream.
"""
from __future__ import annotations

import functools
import json
import re
from importlib import resources

DEF_PREFIX = "#/$defs/"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


def available_minors() -> list[int]:
    root = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    minors = []
    for entry in root.iterdir():
        match = re.fullmatch(r"v1\.(\d+)\.0-local-strict", entry.name)
        if match:
            minors.append(int(match.group(1)))
    return sorted(minors)


def nearest_schema_minor(minor: int) -> int:
    minors = available_minors()
    at_least = [m for m in minors if m >= minor]
    return at_least[0] if at_least else minors[-1]


@functools.lru_cache(maxsize=4)
def load_definitions(schema_minor: int) -> dict:
    path = (resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v1.{schema_minor}.0-local-strict"
            / "_definitions.json")
    return json.loads(path.read_text())["$defs"]


class Schema:
    """One node of a schema tree. `defs` resolves $refs for built-in schemas; CRD schemas have none."""

    # Nodes are shared and their `raw` never changes, so every derived property is computed once
    # (cached_property): validation, field tracking and merges ask them for every field of every write.

    def __init__(self, raw: dict, defs: dict | None = None, def_name: str = ""):
        local = raw
        while "$ref" in raw and defs is not None:
            def_name = raw["$ref"][len(DEF_PREFIX):]
            target = defs[def_name]
            extras = {k: v for k, v in local.items() if k.startswith("x-kubernetes-")}
            raw = {**target, **extras} if extras else target
        self.raw = raw
        self.defs = defs
        self.def_name = def_name
        self._children: dict[str, "Schema | None"] = {}

    # --- shape -------------------------------------------------------------------------------------------------
    @functools.cached_property
    def types(self) -> frozenset[str]:
        if self.def_name == INT_OR_STRING or self.raw.get("x-kubernetes-int-or-string"):
            return frozenset({"integer", "string"})
        if self.def_name == QUANTITY:
            return frozenset({"number", "integer", "string"})
        declared = self.raw.get("type")
        if declared is None and "oneOf" in self.raw:
            found: set[str] = set()
            for option in self.raw["oneOf"]:
                found |= Schema(option, self.defs).types
            return frozenset(found)
        if declared is None:
            return frozenset()
        names = [declared] if isinstance(declared, str) else declared
        return frozenset(n for n in names if n != "null")

    @functools.cached_property
    def nullable(self) -> bool:
        declared = self.raw.get("type")
        return bool(self.raw.get("nullable")) or (isinstance(declared, list) and "null" in declared)

    @classmethod
    def make(cls, raw: dict, defs: dict | None) -> "Schema":
        """Built-in schema nodes live as long as their definitions, so they are built once and shared."""
        if defs is None:
            return cls(raw)
        entry = _NODE_CACHE.get(id(raw))
        if entry is None or entry[0] is not raw:
            entry = _NODE_CACHE[id(raw)] = (raw, cls(raw, defs))  # holding raw keeps its id from being reused
        return entry[1]

    @functools.cached_property
    def properties(self) -> dict[str, "Schema"]:
        return {name: Schema.make(sub, self.defs) for name, sub in self.raw.get("properties", {}).items()}

    def prop(self, name: str) -> "Schema | None":
        return self.properties.get(name)

    @functools.cached_property
    def is_struct(self) -> bool:
        return "properties" in self.raw

    @functools.cached_property
    def additional(self) -> "Schema | None":
        extra = self.raw.get("additionalProperties")
        if isinstance(extra, dict):
            return Schema.make(extra, self.defs)
        if extra is True:
            return ANY
        return None

    @functools.cached_property
    def items(self) -> "Schema":
        sub = self.raw.get("items")
        return Schema.make(sub, self.defs) if isinstance(sub, dict) else ANY

    @functools.cached_property
    def preserve_unknown(self) -> bool:
        return bool(self.raw.get("x-kubernetes-preserve-unknown-fields")) or self.is_any

    @functools.cached_property
    def is_any(self) -> bool:
        """No constraint at all (e.g. apiextensions JSON, RawExtension): everything is kept and owned atomically."""
        return not self.types and "properties" not in self.raw and "additionalProperties" not in self.raw \
            and "items" not in self.raw

    @functools.cached_property
    def embedded_resource(self) -> bool:
        return bool(self.raw.get("x-kubernetes-embedded-resource"))

    def child(self, key: str) -> "Schema | None":
        """Schema of a map entry: a declared property, else additionalProperties, else None (unknown)."""
        try:
            return self._children[key]
        except KeyError:
            found = self._children[key] = self._child(key)
            return found

    def _child(self, key: str) -> "Schema | None":
        declared = self.prop(key)
        if declared is not None:
            return declared
        if self.embedded_resource and key in ("apiVersion", "kind", "metadata"):
            return Schema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}) if key == "metadata" \
                else Schema({"type": "string"})
        extra = self.additional
        if extra is not None:
            return extra
        if self.preserve_unknown or self.free_form:
            return ANY
        return None

    @functools.cached_property
    def free_form(self) -> bool:
        """A built-in `object` with no declared fields (FieldsV1, RawExtension) holds arbitrary JSON. In a CRD the
        same shape is structural and prunes everything, so only schemas from the built-in definitions qualify."""
        return self.defs is not None and not self.is_struct and "additionalProperties" not in self.raw

    # --- list and map semantics (structured-merge-diff and strategic merge patch) ---------------------------
    @functools.cached_property
    def list_type(self) -> str:
        declared = self.raw.get("x-kubernetes-list-type")
        if declared:
            return declared
        strategy = self.raw.get("x-kubernetes-patch-strategy", "")
        if "merge" in strategy:
            return "map" if self.raw.get("x-kubernetes-patch-merge-key") else "set"
        return "atomic"

    @property
    def list_keys(self) -> list[str]:
        keys = self.raw.get("x-kubernetes-list-map-keys")
        if keys:
            return list(keys)
        merge_key = self.raw.get("x-kubernetes-patch-merge-key")
        return [merge_key] if merge_key else []

    @property
    def patch_strategy(self) -> str:
        return self.raw.get("x-kubernetes-patch-strategy", "")

    @property
    def patch_merge_key(self) -> str:
        return self.raw.get("x-kubernetes-patch-merge-key", "")

    @functools.cached_property
    def atomic_map(self) -> bool:
        return self.raw.get("x-kubernetes-map-type") == "atomic"

    # --- validation helpers ----------------------------------------------------------------------------------
    @property
    def required(self) -> list[str]:
        return list(self.raw.get("required", ()))

    @property
    def enum(self) -> list | None:
        return self.raw.get("enum")

    @property
    def default(self):
        return self.raw.get("default", _MISSING)

    @functools.cached_property
    def type_label(self) -> str:
        """Go-ish type name used in decode errors."""
        if self.def_name:
            return self.def_name.rsplit(".", 1)[-1]
        types = sorted(self.types)
        return {"integer": "int64", "number": "float64", "boolean": "bool"}.get(types[0], types[0]) if types else "any"


_NODE_CACHE: dict[int, tuple[dict, "Schema"]] = {}
_MISSING = object()
MISSING = _MISSING
ANY = Schema({"x-kubernetes-preserve-unknown-fields": True})


class SchemaSet:
    """Built-in schemas for one Kubernetes minor, indexed by group/version/kind."""

    def __init__(self, kube_minor: int):
        self.schema_minor = nearest_schema_minor(kube_minor)
        self.defs = load_definitions(self.schema_minor)
        self._by_gvk = _index_by_gvk(self.schema_minor)

    def for_gvk(self, group: str, version: str, kind: str) -> Schema | None:
        name = self._by_gvk.get((group, version, kind))
        return Schema(self.defs[name], self.defs, name) if name else None

    def definition(self, name: str) -> Schema:
        return Schema(self.defs[name], self.defs, name)

    def def_name_for(self, group: str, version: str, kind: str) -> str | None:
        return self._by_gvk.get((group, version, kind))

    def object_meta(self) -> Schema:
        return self.definition(OBJECT_META)


@functools.lru_cache(maxsize=4)
def _index_by_gvk(schema_minor: int) -> dict[tuple[str, str, str], str]:
    index = {}
    for name, body in load_definitions(schema_minor).items():
        for gvk in body.get("x-kubernetes-group-version-kind", ()):
            # Several definitions may claim DeleteOptions etc.; the concrete object type is the one with metadata.
            if "metadata" in body.get("properties", {}) or (gvk["group"], gvk["version"], gvk["kind"]) not in index:
                index[(gvk["group"], gvk["version"], gvk["kind"])] = name
    return index


def crd_version_schema(crd: dict, version: str, meta: Schema) -> Schema:
    """The structural schema of one version of a CRD, with the implicit apiVersion/kind/metadata at the root."""
    for entry in crd.get("spec", {}).get("versions", []):
        if entry.get("name") == version:
            raw = (entry.get("schema") or {}).get("openAPIV3Schema") or {"type": "object",
                                                                         "x-kubernetes-preserve-unknown-fields": True}
            break
    else:
        raw = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    properties = dict(raw.get("properties", {}))
    properties.setdefault("apiVersion", {"type": "string"})
    properties.setdefault("kind", {"type": "string"})
    root = {**raw, "type": "object", "properties": properties}
    schema = Schema(root)
    schema.properties["metadata"] = meta  # ObjectMeta semantics always apply to a custom object's metadata
    return schema
