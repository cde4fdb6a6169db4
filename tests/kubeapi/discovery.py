"""Discovery documents (legacy and aggregated) and OpenAPI v3 per group-version, built from the resource table and
the same schemas the store validates with."""
from __future__ import annotations

import hashlib
import json

from .resources import SUBRESOURCE_VERBS, ResourceTable, ResourceType
from .schema import INT_OR_STRING, QUANTITY, SchemaSet

AGGREGATED_MIN_MINOR = {"v2": 30, "v2beta1": 26}
COMMON_DEFS = ("io.k8s.apimachinery.pkg.apis.meta.v1.Status", "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
               "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent", "io.k8s.apimachinery.pkg.apis.meta.v1.Patch")


def version_info(kube_version: str) -> dict:
    major, minor, _patch = (kube_version.split(".") + ["0", "0"])[:3]
    return {"major": major, "minor": minor, "gitVersion": f"v{kube_version}",
            "gitCommit": hashlib.sha1(kube_version.encode()).hexdigest(), "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.4", "compiler": "gc", "platform": "linux/amd64"}


# --- legacy discovery --------------------------------------------------------------------------------------------
def api_versions(server_address: str) -> dict:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def _group_entry(group: str, versions: list[str]) -> dict:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(table: ResourceTable) -> dict:
    groups = [_group_entry(g, vs) for g, vs in sorted(table.groups().items(), key=_group_order) if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _group_order(item):
    group = item[0]
    return (not group.endswith(".k8s.io") and "." in group, group)


def api_group(table: ResourceTable, group: str) -> dict | None:
    versions = table.groups().get(group)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group, versions)}


def _storage_hash(rt: ResourceType) -> str:
    return hashlib.sha256(f"{rt.group}/{rt.version}/{rt.kind}".encode()).digest()[:8].hex()


def resource_list(table: ResourceTable, group: str, version: str) -> dict | None:
    rts = sorted((rt for rt in table.all() if rt.group == group and rt.version == version), key=lambda r: r.plural)
    if not rts and not (group == "" and version == "v1"):
        return None
    resources = []
    for rt in rts:
        entry = {"name": rt.plural, "singularName": rt.singular_name, "namespaced": rt.namespaced, "kind": rt.kind,
                 "verbs": list(rt.verbs)}
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        if "list" in rt.verbs:
            entry["storageVersionHash"] = _storage_hash(rt)
        resources.append(entry)
        for sub in rt.subresources:
            sub_entry = {"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced,
                         "kind": _sub_kind(rt, sub)[2], "verbs": list(SUBRESOURCE_VERBS[sub])}
            if sub == "scale":
                sub_entry.update({"group": "autoscaling", "version": "v1"})
            resources.append(sub_entry)
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources}


def _sub_kind(rt: ResourceType, sub: str) -> tuple[str, str, str]:
    return {"scale": ("autoscaling", "v1", "Scale"), "log": ("", "", ""), "binding": ("", "v1", "Binding"),
            "eviction": ("policy", "v1", "Eviction")}.get(sub, (rt.group, rt.version, rt.kind))


# --- aggregated discovery ----------------------------------------------------------------------------------------
def aggregated_version(accept: str, kube_minor: int) -> str | None:
    """The apidiscovery version to answer with, if the client asked for one this Kubernetes version serves."""
    for version in ("v2", "v2beta1"):
        if f"v={version}" in accept and "as=APIGroupDiscoveryList" in accept \
                and kube_minor >= AGGREGATED_MIN_MINOR[version]:
            return version
    return None


def aggregated(table: ResourceTable, legacy: bool, version: str) -> dict:
    groups = table.groups()
    items = []
    for group, versions in sorted(groups.items(), key=_group_order):
        if (group == "") != legacy:
            continue
        entries = []
        for v in versions:
            resources = []
            for rt in sorted((r for r in table.all() if r.group == group and r.version == v), key=lambda r: r.plural):
                entry = {"resource": rt.plural, "responseKind": {"group": rt.group, "version": rt.version,
                                                                 "kind": rt.kind},
                         "scope": "Namespaced" if rt.namespaced else "Cluster", "singularResource": rt.singular_name,
                         "verbs": list(rt.verbs)}
                if rt.short_names:
                    entry["shortNames"] = list(rt.short_names)
                if rt.categories:
                    entry["categories"] = list(rt.categories)
                subs = []
                for sub in rt.subresources:
                    g, sv, kind = _sub_kind(rt, sub)
                    item = {"subresource": sub, "verbs": list(SUBRESOURCE_VERBS[sub])}
                    if kind:
                        item["responseKind"] = {"group": g, "version": sv, "kind": kind}
                    subs.append(item)
                if subs:
                    entry["subresources"] = subs
                resources.append(entry)
            entries.append({"version": v, "resources": resources, "freshness": "Current"})
        items.append({"metadata": {"name": group, "creationTimestamp": None}, "versions": entries})
    return {"kind": "APIGroupDiscoveryList", "apiVersion": f"apidiscovery.k8s.io/{version}", "metadata": {},
            "items": items}


# --- OpenAPI v3 ------------------------------------------------------------------------------------------------------
def _path_key(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


class OpenAPI:
    """Builds and caches one OpenAPI v3 document per group-version."""

    def __init__(self, table: ResourceTable, schemas: SchemaSet, crd_lookup):
        self.table = table
        self.schemas = schemas
        self.crd_lookup = crd_lookup  # (group, plural) -> CRD object or None
        self._cache: dict[tuple, tuple[bytes, str]] = {}

    def _signature(self, group: str, version: str) -> tuple:
        rts = tuple(sorted((rt.plural, rt.kind) for rt in self.table.all() if rt.group == group and rt.version == version))
        crd_rvs = tuple(sorted((self.crd_lookup(group, p) or {}).get("metadata", {}).get("resourceVersion", "")
                               for p, _k in rts)) if any(rt.custom for rt in self.table.all() if rt.group == group) else ()
        return (group, version, rts, crd_rvs)

    def document(self, group: str, version: str) -> tuple[bytes, str] | None:
        if not any(rt.group == group and rt.version == version for rt in self.table.all()):
            return None
        signature = self._signature(group, version)
        if signature not in self._cache:
            body = json.dumps(self._build(group, version), separators=(",", ":")).encode()
            self._cache[signature] = (body, hashlib.sha512(body).hexdigest().upper())
        return self._cache[signature]

    def index(self) -> dict:
        paths = {}
        for group, versions in self.table.groups().items():
            for version in versions:
                _body, digest = self.document(group, version)
                key = _path_key(group, version)
                paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest}"}
        return {"paths": dict(sorted(paths.items()))}

    def _build(self, group: str, version: str) -> dict:
        schemas: dict[str, dict] = {}
        paths: dict[str, dict] = {}
        for rt in sorted((r for r in self.table.all() if r.group == group and r.version == version),
                         key=lambda r: r.plural):
            def_name = self._definition_for(rt, schemas)
            if def_name:
                paths.update(_paths_for(rt, def_name))
        for name in COMMON_DEFS:
            self._collect(name, schemas)
        return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "unversioned"}, "paths": paths,
                "components": {"schemas": dict(sorted(schemas.items()))}}

    def _definition_for(self, rt: ResourceType, schemas: dict) -> str | None:
        if not rt.custom:
            name = self.schemas.def_name_for(rt.group, rt.version, rt.kind)
            if name:
                self._collect(name, schemas)
            return name
        crd = self.crd_lookup(rt.group, rt.plural)
        if crd is None:
            return None
        reversed_group = ".".join(reversed(rt.group.split(".")))
        name = f"{reversed_group}.{rt.version}.{rt.kind}"
        raw = next(((v.get("schema") or {}).get("openAPIV3Schema") for v in crd["spec"].get("versions") or []
                    if v.get("name") == rt.version), None) or {"type": "object"}
        schema = json.loads(json.dumps(raw))
        schema.setdefault("properties", {})["metadata"] = {"allOf": [{"$ref": "#/components/schemas/"
                                                                              "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]}
        schema["x-kubernetes-group-version-kind"] = [{"group": rt.group, "version": rt.version, "kind": rt.kind}]
        schemas[name] = schema
        self._collect("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", schemas)
        return name

    def _collect(self, name: str, schemas: dict) -> None:
        """Add a definition and everything it references, in OpenAPI 3 spelling."""
        pending = [name]
        while pending:
            current = pending.pop()
            if current in schemas or current not in self.schemas.defs:
                continue
            converted, refs = _to_openapi(self.schemas.defs[current], current)
            schemas[current] = converted
            pending.extend(refs)


def _to_openapi(schema, def_name: str = "") -> tuple[dict, set]:
    refs: set[str] = set()
    if def_name in (INT_OR_STRING, QUANTITY):
        out = {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]} \
            if def_name == INT_OR_STRING else {"oneOf": [{"type": "string"}, {"type": "number"}]}
        return {**out, "description": schema.get("description", "")}, refs

    def convert(node):
        if isinstance(node, list):
            return [convert(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key == "$ref":
                target = value.split("/")[-1]
                refs.add(target)
                continue
            if key == "type" and isinstance(value, list):
                kept = [v for v in value if v != "null"]
                if kept:
                    out["type"] = kept[0]
                continue
            if key == "additionalProperties" and value is False:
                continue
            if key in ("properties",) and isinstance(value, dict):
                out[key] = {k: convert(v) for k, v in value.items()}
                continue
            out[key] = convert(value)
        if "$ref" in node:
            ref = {"$ref": "#/components/schemas/" + node["$ref"].split("/")[-1]}
            return {**out, "allOf": [ref]} if out else ref
        return out

    return convert(schema), refs


def _params(*names: str) -> list[dict]:
    return [{"name": n, "in": "query", "schema": {"type": "string" if n != "force" else "boolean"},
             "description": n, "uniqueItems": True} for n in names]


def _paths_for(rt: ResourceType, def_name: str) -> dict:
    ref = {"$ref": f"#/components/schemas/{def_name}"}
    gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    base = f"/apis/{rt.group}/{rt.version}" if rt.group else f"/api/{rt.version}"
    collection = f"{base}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{base}/{rt.plural}"
    item = f"{collection}/{{name}}"
    json_body = {"content": {"*/*": {"schema": ref}}, "required": True}
    response = {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}}
    path_params = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
    if rt.namespaced:
        path_params.append({"name": "namespace", "in": "path", "required": True, "schema": {"type": "string"}})

    def op(action, verb, body=None, params=()):
        entry = {"operationId": f"{action}{rt.kind}", "x-kubernetes-action": action,
                 "x-kubernetes-group-version-kind": gvk, "responses": response,
                 "parameters": _params(*params)}
        if body:
            entry["requestBody"] = body
        return entry

    patch_body = {"content": {t: {"schema": {"type": "object"}} for t in (
        "application/apply-patch+yaml", "application/json-patch+json", "application/merge-patch+json",
        "application/strategic-merge-patch+json")}, "required": True}
    writes = ("dryRun", "fieldManager", "fieldValidation")
    out = {}
    if "create" in rt.verbs:
        out[collection] = {"parameters": path_params[1:],
                           "post": op("post", "create", json_body, writes),
                           "get": op("list", "list", params=("labelSelector", "fieldSelector", "limit", "continue",
                                                              "watch", "resourceVersion"))}
    if "get" in rt.verbs:
        out[item] = {"parameters": path_params,
                     "get": op("get", "get"),
                     "put": op("put", "update", json_body, writes),
                     "patch": op("patch", "patch", patch_body, (*writes, "force")),
                     "delete": op("delete", "delete", params=("dryRun", "propagationPolicy", "gracePeriodSeconds"))}
    return out
