"""The three patch formats the apiserver accepts besides apply: JSON merge patch (RFC 7386), strategic merge
patch (schema-aware, with its $patch / $setElementOrder / $deleteFromPrimitiveList / $retainKeys directives),
and JSON patch (RFC 6902)."""
from __future__ import annotations

from .schema import Schema
from .util import ApiError, jcopy


# --- RFC 7386 -----------------------------------------------------------------------------------------------------
def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return jcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- strategic merge patch ---------------------------------------------------------------------------------------
DIRECTIVE_KEYS = ("$patch", "$retainKeys")
SET_ORDER = "$setElementOrder/"
DELETE_PRIMITIVES = "$deleteFromPrimitiveList/"


def strategic_merge(original, patch, schema: Schema | None):
    """Apply a strategic merge patch. Returns None when the patch deletes the whole map ($patch: delete)."""
    if not isinstance(patch, dict):
        return jcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    if directive == "replace":
        return strip_directives(patch)
    if directive not in (None, "merge"):
        raise ApiError(400, f"unknown patch type: {directive!r}")
    result = dict(original) if isinstance(original, dict) else {}
    orders = {}
    for key, value in patch.items():
        if key in DIRECTIVE_KEYS:
            continue
        if key.startswith(SET_ORDER):
            orders[key[len(SET_ORDER):]] = value
            continue
        if key.startswith(DELETE_PRIMITIVES):
            field = key[len(DELETE_PRIMITIVES):]
            result[field] = [item for item in result.get(field) or [] if item not in value]
            continue
        sub = schema.child(key) if schema is not None else None
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge(result.get(key), value, sub)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, sub)
        else:
            result[key] = value
    retain = patch.get("$retainKeys")
    if retain is not None:
        result = {k: v for k, v in result.items() if k in retain}
    for field, order in orders.items():
        if isinstance(result.get(field), list):
            result[field] = _apply_order(result[field], order, schema.child(field) if schema else None)
    return result


def _merge_list(original, patch: list, schema: Schema | None) -> list:
    original = original if isinstance(original, list) else []
    strategy = schema.patch_strategy if schema is not None else ""
    if "merge" not in strategy:
        return strip_directives(patch)
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [strip_directives(i) for i in patch if not (isinstance(i, dict) and i.get("$patch") == "replace")]
    key = schema.patch_merge_key
    if not key:
        merged = original + [item for item in patch if item not in original]
        return _patch_order(merged, patch, original, None)
    result = list(original)
    for item in patch:
        if not isinstance(item, dict):
            raise ApiError(400, f"merging an object in {schema.def_name or 'list'}: expected a map with merge key {key!r}")
        position = next((i for i, existing in enumerate(result)
                         if isinstance(existing, dict) and existing.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if position is not None:
                result.pop(position)
            continue
        if position is None:
            result.append(strip_directives(item))
        else:
            result[position] = strategic_merge(result[position], item, schema.items)
    kept = [item for item in patch if not (isinstance(item, dict) and item.get("$patch") == "delete")]
    return _patch_order(result, kept, [o for o in original if any(
        isinstance(r, dict) and r.get(key) == o.get(key) for r in result)], key)


def _patch_order(merged: list, patch: list, original: list, key: str | None) -> list:
    """The order mergeSlice leaves a merged list in (apimachinery strategicpatch normalizeElementOrder, found with the
    real API server): the patch's items in the patch's order, the other items in the live order, woven together by
    the live order where both items are in it, and a patch item that is new goes before the rest."""
    def identity(item):
        return item.get(key) if key and isinstance(item, dict) else item

    wanted = [identity(item) for item in patch]
    live = [identity(item) for item in original]
    from_patch = sorted((m for m in merged if identity(m) in wanted), key=lambda m: wanted.index(identity(m)))
    server_only = [m for m in merged if identity(m) not in wanted]
    out, i, j = [], 0, 0
    while i < len(server_only) or j < len(from_patch):
        if j >= len(from_patch):
            out.append(server_only[i])
            i += 1
        elif i >= len(server_only):
            out.append(from_patch[j])
            j += 1
        else:
            left, right = identity(server_only[i]), identity(from_patch[j])
            if left in live and right in live and live.index(left) < live.index(right):
                out.append(server_only[i])
                i += 1
            else:
                out.append(from_patch[j])
                j += 1
    return out


def _apply_order(items: list, order: list, schema: Schema | None) -> list:
    key = schema.patch_merge_key if schema is not None else ""

    def identity(item):
        return item.get(key) if key and isinstance(item, dict) else item

    wanted = [identity(o) for o in order]
    ordered = sorted((item for item in items if identity(item) in wanted), key=lambda i: wanted.index(identity(i)))
    return ordered + [item for item in items if identity(item) not in wanted]


def strip_directives(value):
    if isinstance(value, dict):
        return {k: strip_directives(v) for k, v in value.items()
                if k not in DIRECTIVE_KEYS and not k.startswith((SET_ORDER, DELETE_PRIMITIVES))}
    if isinstance(value, list):
        return [strip_directives(v) for v in value]
    return value


# --- RFC 6902 -----------------------------------------------------------------------------------------------------
def json_patch(document, operations):
    if not isinstance(operations, list):
        raise ApiError(400, "json patch must be a list of operations")
    doc = jcopy(document)
    for op in operations:
        doc = _apply_op(doc, op)
    return doc


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc, parts: list[str], path: str):
    current = doc
    for part in parts[:-1]:
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            raise ApiError(422, f"jsonpatch: doc is missing path: {path!r}")
    return current


def _get(doc, path: str):
    parts = _pointer(path)
    if not parts:
        return doc
    parent, last = _parent(doc, parts, path), parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise ApiError(422, f"jsonpatch: doc is missing path: {path!r}")


def _add(doc, path: str, value, replace: bool):
    parts = _pointer(path)
    if not parts:
        return value
    parent, last = _parent(doc, parts, path), parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise ApiError(422, f"jsonpatch replace operation does not apply: doc is missing key: {path}")
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise ApiError(422, f"jsonpatch: index out of range at {path!r}")
    else:
        raise ApiError(422, f"jsonpatch: cannot add at {path!r}")
    return doc


def _remove(doc, path: str):
    parts = _pointer(path)
    parent, last = _parent(doc, parts, path), parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise ApiError(422, f"jsonpatch remove operation does not apply: doc is missing path: {path}")


def _apply_op(doc, op: dict):
    kind, path = op.get("op"), op.get("path", "")
    if kind == "add":
        return _add(doc, path, jcopy(op.get("value")), replace=False)
    if kind == "replace":
        return _add(doc, path, jcopy(op.get("value")), replace=True)
    if kind == "remove":
        _remove(doc, path)
        return doc
    if kind == "move":
        value = _remove(doc, op["from"])
        return _add(doc, path, value, replace=False)
    if kind == "copy":
        return _add(doc, path, jcopy(_get(doc, op["from"])), replace=False)
    if kind == "test":
        if _get(doc, path) != op.get("value"):
            raise ApiError(422, f"testing value {path} failed")
        return doc
    raise ApiError(400, f"unexpected json patch operation {kind!r}")
