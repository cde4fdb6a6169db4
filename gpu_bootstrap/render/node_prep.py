"""Pure node patches for node-prep: what to change on a node to get the wanted taint and labels, and how to undo
exactly that.

What the tool changed is recorded on the node itself, in the annotation `gpu-bootstrap.io/node-prep`, in the same
patch as the change (so a node is never half-prepared):
  {"labels": {key: {"set": value, "prev": previous value or null}},
   "taint": the taint we added or null, "replaced": a taint with the same key and effect we replaced, or null}
Undo restores `prev` only where the value is still the one we set, so anything a user did since is kept.
"""
from __future__ import annotations

import json

ANNOTATION = "gpu-bootstrap.io/node-prep"


def labels_and_taint(section) -> tuple[dict[str, str], dict | None]:
    """The labels and taint node-prep gives every GPU node (`section`: the config's node_prep). The one source for
    node-prep's patches and the gpu-pools node templates, so pool nodes arrive exactly as node-prep leaves others."""
    if not section.enabled:
        return {}, None
    return section.wanted_labels(), section.taint.as_taint() if section.taint else None


def describe_taint(taint: dict | None) -> str:
    if taint is None:
        return "(none)"
    return f"{taint['key']}{'=' + taint['value'] if taint.get('value') else ''}:{taint['effect']}"


def read_record(node: dict, annotation: str = ANNOTATION) -> dict:
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(annotation)
    try:
        record = json.loads(text) if text else {}
    except ValueError:
        record = {}
    if not isinstance(record, dict):  # valid JSON but not a record (`null`, a list): as unreadable as bad JSON
        record = {}
    return {"labels": dict(record.get("labels") or {}), "taint": record.get("taint"),
            "replaced": record.get("replaced")}


def _same_slot(a: dict, b: dict) -> bool:
    """Kubernetes keeps one taint per key and effect."""
    return a.get("key") == b.get("key") and a.get("effect") == b.get("effect")


def _taint_identity(taint: dict) -> tuple:
    return (taint.get("key"), taint.get("value") or "", taint.get("effect"))


def _encode(record: dict) -> str | None:
    if not record["labels"] and not record["taint"] and not record["replaced"]:
        return None
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def prepare_patch(node: dict, labels: dict[str, str], taint: dict | None,
                  annotation: str = ANNOTATION) -> dict | None:
    """A JSON merge patch bringing `node` to the wanted labels and taint, or None when nothing needs to change.
    `annotation` names the record, so each step owns its own labels."""
    meta = node.get("metadata") or {}
    current = dict(meta.get("labels") or {})
    record = read_record(node, annotation)
    label_patch: dict = {}
    for key, entry in list(record["labels"].items()):
        if key not in labels:  # we set it once, the config no longer wants it: give back what was there
            if current.get(key) == entry.get("set"):
                label_patch[key] = entry.get("prev")
            del record["labels"][key]
    for key, value in labels.items():
        if current.get(key) != value:
            label_patch[key] = value
            if key not in record["labels"]:
                record["labels"][key] = {"set": value, "prev": current.get(key)}
            else:
                record["labels"][key]["set"] = value
        elif key in record["labels"]:
            record["labels"][key]["set"] = value
    taints = [dict(t) for t in (node.get("spec") or {}).get("taints") or []]
    new_taints = _wanted_taints(taints, record, taint)
    patch: dict = {}
    if label_patch:
        patch.setdefault("metadata", {})["labels"] = label_patch
    if [_taint_identity(t) for t in new_taints] != [_taint_identity(t) for t in taints]:
        patch["spec"] = {"taints": new_taints or None}
    encoded = _encode(record)
    if encoded != (meta.get("annotations") or {}).get(annotation):
        patch.setdefault("metadata", {})["annotations"] = {annotation: encoded}
    return patch or None


def _wanted_taints(taints: list[dict], record: dict, taint: dict | None) -> list[dict]:
    ours = record["taint"]
    if ours and (taint is None or _taint_identity(ours) != _taint_identity(taint)):
        taints = [t for t in taints if _taint_identity(t) != _taint_identity(ours)]
        if record["replaced"]:
            taints.append(record["replaced"])
        record["taint"], record["replaced"] = None, None
    if taint is None:
        return taints
    if any(_taint_identity(t) == _taint_identity(taint) for t in taints):
        return taints  # already there (ours, or a user's identical taint, which stays theirs)
    clash = next((t for t in taints if _same_slot(t, taint)), None)
    if clash is not None:
        record["replaced"] = clash
        taints = [t for t in taints if t is not clash]
    record["taint"] = dict(taint)
    return taints + [dict(taint)]


def undo_patch(node: dict, annotation: str = ANNOTATION) -> dict | None:
    """A merge patch removing what prepare_patch added (and restoring what it replaced), or None."""
    meta = node.get("metadata") or {}
    if annotation not in (meta.get("annotations") or {}):
        return None
    current = meta.get("labels") or {}
    record = read_record(node, annotation)
    labels = {key: entry.get("prev") for key, entry in record["labels"].items()
              if current.get(key) == entry.get("set")}
    taints = [dict(t) for t in (node.get("spec") or {}).get("taints") or []]
    undone = list(taints)
    if record["taint"]:
        undone = [t for t in undone if _taint_identity(t) != _taint_identity(record["taint"])]
        if record["replaced"] and not any(_same_slot(t, record["replaced"]) for t in undone):
            undone.append(record["replaced"])
    patch: dict = {"metadata": {"annotations": {annotation: None}}}
    if labels:
        patch["metadata"]["labels"] = labels
    if [_taint_identity(t) for t in undone] != [_taint_identity(t) for t in taints]:
        patch["spec"] = {"taints": undone or None}
    return patch


OPERATOR_PREFIXES = ("nvidia.com/", "feature.node.kubernetes.io/")  # labels the operator and NFD put on nodes


def deep_merge_patch(first: dict | None, second: dict) -> dict:
    """Two merge patches as one (the second's keys win)."""
    from gpu_bootstrap.core.objects import deep_merge
    return deep_merge(first or {}, second)


OPERATOR_ANNOTATIONS = "nvidia.com/"  # annotations the operator puts on nodes (gpu-driver-upgrade-enabled, ...)


def labels_before_patch(node: dict, annotation: str, annotations_record: str | None = None) -> dict | None:
    """Before the gpu-operator first runs: remember which operator/NFD labels (in `annotation`) and which operator
    annotations (in `annotations_record`) the node already had, so that teardown removes only the ones that came
    with it. The annotations are remembered only with the labels, before the operator ran: a node it already ran on
    has its marks. None when already remembered."""
    meta = node.get("metadata") or {}
    if annotation in (meta.get("annotations") or {}):
        return None
    before = sorted(k for k in (meta.get("labels") or {}) if k.startswith(OPERATOR_PREFIXES))
    records = {annotation: json.dumps(before, separators=(",", ":"))}
    if annotations_record:
        marks = sorted(k for k in (meta.get("annotations") or {}) if k.startswith(OPERATOR_ANNOTATIONS))
        records[annotations_record] = json.dumps(marks, separators=(",", ":"))
    return {"metadata": {"annotations": records}}


def operator_labels_undo(node: dict, annotation: str, keep: set[str] = frozenset(),
                         annotations_record: str | None = None) -> dict | None:
    """After the gpu-operator is gone: remove the operator/NFD labels the node did not have before it (and that
    nobody else recorded as theirs, `keep`), the operator's annotations it did not have (when they were
    remembered), and the records themselves. None when nothing was remembered."""
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if annotation not in annotations and (annotations_record or "") not in annotations:
        return None
    patch: dict = {"metadata": {"annotations": {}}}
    if annotation in annotations:
        before = _recorded(annotations[annotation], meta.get("labels") or {})
        gone = {k: None for k in (meta.get("labels") or {})
                if k.startswith(OPERATOR_PREFIXES) and k not in before and k not in keep}
        patch["metadata"]["annotations"][annotation] = None
        if gone:
            patch["metadata"]["labels"] = gone
    if annotations_record and annotations_record in annotations:
        before = _recorded(annotations[annotations_record], annotations)
        patch["metadata"]["annotations"].update({k: None for k in annotations if k.startswith(OPERATOR_ANNOTATIONS)
                                                 and k not in before})
        patch["metadata"]["annotations"][annotations_record] = None
    return patch


def _recorded(text: str, present: dict) -> set[str]:
    """The keys a record names; an unreadable record names every key present (removes nothing: unknown is not
    absent)."""
    try:
        return set(json.loads(text))
    except (ValueError, TypeError):
        return set(present)


def describe(patch: dict) -> str:
    """A short human summary of a node patch."""
    parts = []
    for key, value in ((patch.get("metadata") or {}).get("labels") or {}).items():
        parts.append(f"label {key}={value}" if value is not None else f"remove label {key}")
    for key, value in ((patch.get("metadata") or {}).get("annotations") or {}).items():
        if value is None and not key.startswith("gpu-bootstrap.io/"):  # our own records go unsaid
            parts.append(f"remove annotation {key}")
    taints = (patch.get("spec") or {}).get("taints", "unchanged")
    if taints != "unchanged":
        shown = ", ".join(f"{t['key']}{'=' + t['value'] if t.get('value') else ''}:{t['effect']}" for t in taints or [])
        parts.append(f"taints [{shown}]")
    return ", ".join(parts) or "update the gpu-bootstrap record"
