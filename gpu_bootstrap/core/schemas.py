"""Client-side validation of custom resources against their CustomResourceDefinition's OpenAPI v3 schema, for the
one case the API server cannot do it: a dry run on a cluster where the chart's CRDs are not installed yet. Pure."""
from __future__ import annotations

import re

MISSING_KIND = re.compile(r'no matches for kind "([^"]+)" in version "([^"]+)"')


def kinds_without_crds(message: str) -> list[tuple[str, str]]:
    """(apiVersion, kind) pairs an API server said it does not serve (helm's 'no matches for kind' error)."""
    return sorted({(version, kind) for kind, version in MISSING_KIND.findall(message or "")})


def crd_schemas(crds: list[dict]) -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the openAPIV3Schema of that served version."""
    schemas = {}
    for crd in crds:
        spec = crd.get("spec") or {}
        group, kind = spec.get("group", ""), (spec.get("names") or {}).get("kind", "")
        for version in spec.get("versions") or []:
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if schema and version.get("served", True):
                schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


def problems(obj: dict, schema: dict) -> list[str]:
    """What the schema refuses in `obj`, as 'path: message' lines (empty when it is valid). The object is first
    made what the API server validates: null values of fields that are not nullable dropped, then the schema's
    defaults filled in (apiextensions' order). Without that, the gpu-operator 25.3 chart's ClusterPolicy was refused
    here for `migManager.config.name: null` and a missing `operator.defaultRuntime` (defaulted by its CRD), which
    the real API server accepts (tests/live on the real controller's chart)."""
    import jsonschema

    validator = jsonschema.Draft7Validator(_plain(schema))
    found = []
    for error in sorted(validator.iter_errors(as_served(obj, schema)), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in error.absolute_path) or "(root)"
        found.append(f"{path}: {error.message}")
    return found


def as_served(value, schema: dict):
    """`value` as the API server holds it before validating: nulls of non-nullable fields dropped, defaults applied
    (a copy; the given object is not changed)."""
    if isinstance(value, dict) and isinstance(schema, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            sub = properties.get(key, extra if isinstance(extra, dict) else None)
            if item is None and isinstance(sub, dict) and not sub.get("nullable"):
                continue  # pruned before defaulting
            out[key] = as_served(item, sub) if isinstance(sub, dict) else item
        for key, sub in properties.items():
            if key not in out and isinstance(sub, dict) and "default" in sub:
                out[key] = as_served(_copy(sub["default"]), sub)
        return out
    if isinstance(value, list) and isinstance(schema, dict) and isinstance(schema.get("items"), dict):
        return [as_served(item, schema["items"]) for item in value]
    return value


def _copy(value):
    import copy
    return copy.deepcopy(value)


def _plain(schema):
    """OpenAPI v3 as JSON Schema: drop the Kubernetes extensions, and `nullable` becomes a null type."""
    if isinstance(schema, list):
        return [_plain(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _plain(value) for key, value in schema.items() if not key.startswith("x-kubernetes-")}
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in out:
        out.pop("type", None) if out.get("type") == "object" and not out.get("additionalProperties") else None
    return out
