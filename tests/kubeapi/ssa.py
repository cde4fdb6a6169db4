"""Field ownership (metadata.managedFields) and server-side apply, after sigs.k8s.io/structured-merge-diff.

A field set is a Python set of paths; a path is a tuple of path elements in the fieldsV1 spelling:
  f:<field>   a struct field or a map key
  k:{json}    an item of an associative list, named by its key fields
  v:<json>    an item of a set list
Lists are atomic (owned as a whole) unless their schema says x-kubernetes-list-type map or set.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .schema import ANY, Schema
from .util import ApiError, jcopy

# Fields the apiserver never tracks (fieldmanager's StripMeta).
IGNORED_TOP = {("f:apiVersion",), ("f:kind",)}
IGNORED_META = {"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp", "managedFields",
                "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds", "generateName"}
KEY_DEFAULTS = {"protocol": "TCP"}
_MISSING = object()


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def key_element(item, keys: list[str]) -> str:
    if not isinstance(item, dict):
        return "v:" + _compact(item)
    named = {k: item.get(k, KEY_DEFAULTS.get(k)) for k in sorted(keys) if k in item or k in KEY_DEFAULTS}
    return "k:" + _compact(named) if named else "v:" + _compact(item)


def _key_matches(item, element: str, keys: list[str]) -> bool:
    return key_element(item, keys) == element


# --- building field sets -----------------------------------------------------------------------------------------
def fieldset_of(obj: dict, schema: Schema, subresource: str = "", has_status: bool = False) -> set:
    out: set = set()
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict) and "managedFields" in meta:
        # Never tracked (IGNORED_META), and often a third of the object: leave it out of the walk, not only the set.
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    _walk(obj, schema, (), out)
    return _strip(out, subresource, has_status)


def _strip(paths: set, subresource: str, has_status: bool) -> set:
    kept = set()
    for path in paths:
        if not path or path[:1] in IGNORED_TOP:
            continue
        if path[0] == "f:metadata" and (len(path) == 1 or path[1][2:] in IGNORED_META):
            continue
        if has_status and subresource == "status" and path[0] != "f:status":
            continue
        if has_status and subresource != "status" and path[0] == "f:status":
            continue
        kept.add(path)
    return kept


def _walk(value, schema: Schema | None, path: tuple, out: set) -> None:
    schema = schema or ANY
    if isinstance(value, dict):
        if schema.atomic_map:
            out.add(path)
            return
        if not value:
            out.add(path)
            return
        for key, item in value.items():
            child = path + ("f:" + key,)
            declared = schema.prop(key) is not None
            if item is None or not declared:
                out.add(child)
            _walk(item, schema.child(key), child, out)
        return
    if isinstance(value, list):
        list_type = schema.list_type if not schema.is_any else "atomic"
        if list_type == "atomic" or not value:
            out.add(path)
            return
        keys = schema.list_keys
        for item in value:
            element = path + (key_element(item, keys) if list_type == "map" else "v:" + _compact(item),)
            out.add(element)
            if list_type == "map" and isinstance(item, dict):
                _walk(item, schema.items, element, out)
        return
    out.add(path)


# --- navigating values by path -----------------------------------------------------------------------------------
def value_at(obj, path: tuple, schema: Schema | None):
    current, node = obj, schema or ANY
    for element in path:
        if element.startswith("f:"):
            if not isinstance(current, dict) or element[2:] not in current:
                return _MISSING
            current, node = current[element[2:]], (node.child(element[2:]) or ANY)
        else:
            if not isinstance(current, list):
                return _MISSING
            keys = node.list_keys
            match = next((item for item in current if _element_of(item, element, keys)), _MISSING)
            if match is _MISSING:
                return _MISSING
            current, node = match, node.items
    return current


def _element_of(item, element: str, keys: list[str]) -> bool:
    if element.startswith("v:"):
        return _compact(item) == element[2:]
    return _key_matches(item, element, keys)


def remove_path(obj, path: tuple, schema: Schema | None) -> None:
    """Delete the value at `path`; silently does nothing when it is already gone."""
    parent = value_at(obj, path[:-1], schema) if len(path) > 1 else obj
    parent_schema = _schema_at(path[:-1], schema)
    last = path[-1]
    if last.startswith("f:") and isinstance(parent, dict):
        parent.pop(last[2:], None)
    elif isinstance(parent, list):
        keys = parent_schema.list_keys
        parent[:] = [item for item in parent if not _element_of(item, last, keys)]


def _schema_at(path: tuple, schema: Schema | None) -> Schema:
    node = schema or ANY
    for element in path:
        node = (node.child(element[2:]) or ANY) if element.startswith("f:") else node.items
    return node


# --- fieldsV1 ------------------------------------------------------------------------------------------------------
def to_fields_v1(paths: set) -> dict:
    root: dict = {}
    for path in paths:
        node = root
        for element in path:
            node = node.setdefault(element, {})
        node["."] = {}
    return _simplify(root)


def _simplify(node: dict) -> dict:
    children = {k: _simplify(v) for k, v in node.items() if k != "."}
    if not children:
        return {}
    if "." in node:
        return {".": {}, **dict(sorted(children.items()))}
    return dict(sorted(children.items()))


def from_fields_v1(tree: dict, prefix: tuple = ()) -> set:
    out = set()
    for key, sub in (tree or {}).items():
        if key == ".":
            out.add(prefix)
        elif not sub:
            out.add(prefix + (key,))
        else:
            out |= from_fields_v1(sub, prefix + (key,))
    return out


def describe_path(path: tuple) -> str:
    text = ""
    for element in path:
        if element.startswith("f:"):
            text += "." + element[2:]
        elif element.startswith("k:"):
            keys = json.loads(element[2:])
            text += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in keys.items()) + "]"
        else:
            text += "[=" + element[2:] + "]"
    return text


# --- managers ------------------------------------------------------------------------------------------------------
@dataclass
class Manager:
    manager: str
    operation: str
    api_version: str
    time: str
    fields: set = field(default_factory=set)
    subresource: str = ""
    read_from: dict | None = field(default=None, repr=False, compare=False)  # the entry it was read from
    read_fields: frozenset = field(default=frozenset(), repr=False, compare=False)

    @property
    def identity(self) -> tuple:
        return (self.manager, self.operation, self.subresource)

    def to_entry(self) -> dict:
        if self.read_from is not None and self.fields == self.read_fields and \
                (self.time, self.api_version) == (self.read_from.get("time"), self.read_from.get("apiVersion")):
            # Unchanged since it was read: its fieldsV1 tree is still right. Rebuilding every manager's tree on
            # every write was the emulator's largest cost at 1,000 pods (stored objects are never edited in place).
            return self.read_from
        entry = {"manager": self.manager, "operation": self.operation, "apiVersion": self.api_version,
                 "time": self.time, "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(self.fields)}
        if self.subresource:
            entry["subresource"] = self.subresource
        return entry


def read_managers(obj: dict | None) -> list[Manager]:
    entries = ((obj or {}).get("metadata") or {}).get("managedFields") or []
    managers = []
    for e in entries:
        fields = from_fields_v1(e.get("fieldsV1") or {})
        managers.append(Manager(e.get("manager", ""), e.get("operation", "Update"), e.get("apiVersion", ""),
                                e.get("time", ""), fields, e.get("subresource", ""), e, frozenset(fields)))
    return managers


def write_managers(obj: dict, managers: list[Manager]) -> None:
    entries = [m.to_entry() for m in managers if m.fields]
    if entries:
        obj.setdefault("metadata", {})["managedFields"] = entries
    else:
        obj.get("metadata", {}).pop("managedFields", None)


def changed_paths(before, after, paths: set, schema: Schema) -> set:
    """Paths of `paths` whose value differs between before and after (containers only when newly added)."""
    changed = set()
    inner = {path[:end] for path in paths for end in range(1, len(path))}  # paths with others below: no leaves
    for path in paths:
        old = value_at(before, path, schema) if before is not None else _MISSING
        if old is _MISSING:
            changed.add(path)
        elif path not in inner and old != value_at(after, path, schema):
            changed.add(path)
    return changed


# --- update (non-apply) tracking ---------------------------------------------------------------------------------
def track_update(old: dict | None, new: dict, manager: str, subresource: str, api_version: str, time: str,
                 schema: Schema, has_status: bool) -> None:
    managers = read_managers(old)
    new_set = fieldset_of(new, schema, subresource, has_status)
    old_set = fieldset_of(old, schema, subresource, has_status) if old else set()
    changed = changed_paths(old, new, new_set, schema)
    removed = old_set - new_set
    identity = (manager, "Update", subresource)
    mine = next((m for m in managers if m.identity == identity), None)
    for other in managers:
        if other is not mine:
            other.fields -= changed | removed
    if changed and mine is None:
        mine = Manager(manager, "Update", api_version, time, set(), subresource)
        managers.append(mine)
    if mine is not None:
        mine.fields = (mine.fields | changed) - removed
        if changed:
            mine.time, mine.api_version = time, api_version
    write_managers(new, managers)


# --- apply -----------------------------------------------------------------------------------------------------------
def structural_merge(live, applied, schema: Schema | None):
    schema = schema or ANY
    if isinstance(applied, dict) and isinstance(live, dict) and not schema.atomic_map:
        out = dict(live)
        for key, value in applied.items():
            out[key] = structural_merge(live[key], value, schema.child(key)) if key in live else jcopy(value)
        return out
    if isinstance(applied, list) and isinstance(live, list) and not schema.is_any:
        if schema.list_type == "map":
            keys = schema.list_keys
            out = list(live)
            index = {key_element(item, keys): i for i, item in enumerate(out)}
            for item in applied:
                element = key_element(item, keys)
                if element in index:
                    out[index[element]] = structural_merge(out[index[element]], item, schema.items)
                else:
                    index[element] = len(out)
                    out.append(jcopy(item))
            return out
        if schema.list_type == "set":
            return list(live) + [jcopy(item) for item in applied if item not in live]
    return jcopy(applied)


def apply(live: dict | None, applied: dict, manager: str, force: bool, schema: Schema, api_version: str, time: str,
          subresource: str = "", has_status: bool = False) -> dict:
    """Return the object after `manager` applies `applied` (raises 409 on conflicts unless force)."""
    managers = read_managers(live)
    applied_set = fieldset_of(applied, schema, subresource, has_status)
    base = jcopy(live) if live else {}
    merged = structural_merge(base, applied, schema)
    changed = changed_paths(live, merged, applied_set, schema)
    identity = (manager, "Apply", subresource)
    mine = next((m for m in managers if m.identity == identity), None)
    others = [m for m in managers if m is not mine]
    conflicts = [(other, path) for other in others for path in sorted(changed & other.fields)]
    if conflicts and not force:
        raise _conflict_error(conflicts)
    for other in others:
        other.fields -= changed if force else set()
    if mine is not None:
        _prune(merged, mine.fields - applied_set, others, schema)
    else:
        mine = Manager(manager, "Apply", api_version, time, set(), subresource)
        managers.append(mine)
    if mine.fields != applied_set or changed:
        mine.time, mine.api_version = time, api_version
    mine.fields = applied_set
    write_managers(merged, managers)
    return merged


def _prune(obj: dict, candidates: set, others: list[Manager], schema: Schema) -> None:
    owned_by_others = set().union(*(m.fields for m in others)) if others else set()
    for path in sorted(candidates, key=len):
        if path in owned_by_others or any(p[:len(path)] == path for p in owned_by_others):
            continue
        remove_path(obj, path, schema)


def _conflict_error(conflicts: list[tuple[Manager, tuple]]) -> ApiError:
    causes = [{"reason": "FieldManagerConflict", "message": f'conflict with "{m.manager}" using {m.api_version}',
               "field": describe_path(p)} for m, p in conflicts]
    count = len(conflicts)
    if count == 1:
        manager, path = conflicts[0]
        message = (f'Apply failed with 1 conflict: conflict with "{manager.manager}" using {manager.api_version}: '
                   f"{describe_path(path)}")
    else:
        lines = "\n".join(f'- conflict with "{m.manager}" using {m.api_version}: {describe_path(p)}'
                          for m, p in conflicts)
        message = f"Apply failed with {count} conflicts:\n{lines}"
    return ApiError(409, message, "Conflict", {"causes": causes})
