"""Saved node facts: the `nodes` part of `gpu-bootstrap doctor -o json`, reused by `up --preflight-report FILE`; and
the same facts as the last successful preflight recorded them in the cluster (a ConfigMap), reused by runs that
leave preflight out (`--skip preflight`, `--only gpu-operator`)."""
from __future__ import annotations

import json
from pathlib import Path

from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.probes.checks import CHECK_IDS, NodeReport


SCHEMA_HINT = ("its format: docs/preflight-report.schema.json (examples/preflight-report.json is one); write one "
               "with: gpu-bootstrap doctor -o json > report.json")
RECORD_NAMESPACE = "gpu-bootstrap"
RECORD_NAME = "gpu-bootstrap-node-facts"


def record_manifest(reports: dict[str, NodeReport], source: str, time: str) -> dict:
    """The ConfigMap that keeps the last successful preflight's facts, with where they came from and when."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": RECORD_NAME, "namespace": RECORD_NAMESPACE,
                         "labels": {"app.kubernetes.io/managed-by": "gpu-bootstrap"}},
            "data": {"nodes.json": json.dumps(document(list(reports.values())), sort_keys=True),
                     "source": source, "time": time}}


def recorded_facts(config_map: dict | None) -> tuple[dict[str, NodeReport], str]:
    """(reports by node, 'recorded by preflight at TIME from SOURCE') from the record; ({}, '') when there is none
    or it cannot be read (then the facts are unknown, never absent). Each report keeps the time its facts were read
    and the node's identity then (probes/recorded.py decides whether they may stand for the node now)."""
    data = (config_map or {}).get("data") or {}
    if "nodes.json" not in data:  # no record (no earlier preflight): nothing to say where facts came from
        return {}, ""
    try:
        nodes = json.loads(data.get("nodes.json") or "{}").get("nodes") or []
        reports = {r.name: r for r in (NodeReport.from_json(entry) for entry in nodes)}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}, ""
    for report in reports.values():  # a record from before facts carried their own time
        report.read_at = report.read_at or str(data.get("time") or "")
    return reports, f"recorded by preflight at {data.get('time', '?')} from {data.get('source', '?')}"


# --- the report's schema ---------------------------------------------------------------------------------------------
STATUSES = ("pass", "warn", "fail", "skip")
# the facts each check carries when it read them (pass, warn): a check that claims to have read a node but carries
# none of its facts is refused (taken as it is, it would make a driver or a runtime look absent)
FACTS = {
    "ssh": (("pass",), {"os": "string", "os_id": "string", "kernel": "string", "arch": "string"}),
    "nvidia-driver": (("pass", "warn"), {"driver_version": ["string", "null"], "gpus": "array"}),
    "nouveau": (("pass", "warn", "fail"), {"loaded": ["boolean", "null"]}),
    "container-runtime": (("pass",), {"runtime": "string", "config_path": "string", "socket": ["string", "null"],
                                      "distribution": "string"}),
    "nvidia-container-toolkit": (("pass", "warn"), {"installed": "boolean", "runtime_configured": "boolean",
                                                    "default_runtime": "boolean"}),
}
POOL_FACTS = {"pool": "string"}  # ssh skipped: a node of a Karpenter pool of ours, its facts from the pool


def schema() -> dict:
    """The preflight report's JSON Schema (draft 7): what `doctor -o json` writes and `--preflight-report` reads;
    published as docs/preflight-report.schema.json."""
    def facts(check_id: str, statuses, fields: dict) -> dict:
        return {"if": {"properties": {"id": {"const": check_id}, "status": {"enum": list(statuses)}},
                       "required": ["id", "status"]},
                "then": {"properties": {"data": {"type": "object", "required": sorted(fields),
                                                 "properties": {k: {"type": v} for k, v in fields.items()}}},
                         "required": ["data"]}}
    check = {"type": "object", "required": ["id", "status"],
             "properties": {"id": {"enum": list(CHECK_IDS)}, "status": {"enum": list(STATUSES)},
                            "message": {"type": "string"}, "data": {"type": "object"}},
             "allOf": [facts(i, statuses, fields) for i, (statuses, fields) in FACTS.items()]
             + [facts("ssh", ("skip",), POOL_FACTS)]}
    node = {"type": "object", "required": ["name", "checks"],
            "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
                                    "maxLength": 253},
                           "source": {"type": "string", "description": "how the facts were read: ssh or "
                                                                       "cluster"},
                           "read_at": {"type": "string", "pattern": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$",
                                       "description": "when the facts were read (UTC); a hand-written report may "
                                                      "leave it out (then: when it was given)"},
                           "identity": {"type": "object", "additionalProperties": False,
                                        "properties": {"boot_id": {"type": "string"},
                                                       "machine_id": {"type": "string"}},
                                        "description": "the node's status.nodeInfo bootID and machineID when the "
                                                       "facts were read: facts of another boot are refused"},
                           "came_from": {"enum": ["report", "recorded"],
                                         "description": "how the run got facts it did not read: a report, or the "
                                                        "record of an earlier run"},
                           "checks": {"type": "array", "items": check,
                                      "allOf": [{"contains": {"properties": {"id": {"const": i}}}}
                                                for i in CHECK_IDS]}}}
    return {"$schema": "http://json-schema.org/draft-07/schema#",
            "$id": "https://gpu-bootstrap.dev/preflight-report.schema.json",
            "title": "gpu-bootstrap preflight report",
            "description": "The GPU nodes' facts: the output of `gpu-bootstrap doctor -o json`, read by "
                           "`gpu-bootstrap up|export|images --preflight-report FILE`. Every node carries the five "
                           "checks; a check that read its node (pass, warn) carries its facts in `data`.",
            "type": "object", "required": ["nodes"],
            "properties": {"nodes": {"type": "array", "minItems": 1, "items": node},
                           "checks": {"type": "array"}, "ok": {"type": "boolean"}}}


def schema_problem(data) -> str | None:
    """The first place where `data` breaks the schema, as `path: what` (path in the document's own terms:
    nodes[0].checks[1].data), or None."""
    import jsonschema
    validator = jsonschema.Draft7Validator(schema())
    errors = list(validator.iter_errors(data))
    if not errors:
        return None
    # the first problem in the document's order (a reader fixes the file from the top)
    error = min(errors, key=lambda e: [(isinstance(p, str), p) for p in e.absolute_path])
    while error.context:  # an allOf/if-then failure: the innermost says which field
        error = jsonschema.exceptions.best_match(error.context)
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    node_check = _which_check(data, list(error.absolute_path))
    if error.validator == "contains":  # jsonschema would quote the whole list
        message = f"no {error.schema['contains']['properties']['id']['const']} check (every node has all of " \
                  f"{', '.join(CHECK_IDS)})"
    else:
        message = error.message if len(error.message) <= 200 else error.message[:197] + "..."
    return f"{where or '(top)'}{node_check}: {message}"


def _which_check(data, path: list) -> str:
    """' (nvidia-driver, pass)' when the path is inside a check: says which one without reading the file again."""
    try:
        if len(path) >= 4 and path[0] == "nodes" and path[2] == "checks":
            check = data["nodes"][path[1]]["checks"][path[3]]
            return f" ({check.get('id')}, {check.get('status')})"
    except (KeyError, IndexError, TypeError, AttributeError):
        pass
    return ""


def load(path: Path, wanted: list[str]) -> dict[str, NodeReport]:
    """Read a report and return the reports of the wanted nodes; a malformed file or a missing node is bad input."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"preflight report {path} not found",
                          "write one with: gpu-bootstrap doctor -o json > report.json") from None
    except OSError as error:
        raise ConfigError(f"cannot read the preflight report {path}: {error.strerror or error}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise ConfigError(f"preflight report {path}:{line} is not UTF-8 text (byte 0x{raw[error.start]:02x} at "
                          f"offset {error.start})", "write one with: gpu-bootstrap doctor -o json > report.json") \
            from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ConfigError(f"preflight report {path} is not valid JSON: {error}") from None
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list):
        raise ConfigError(f"preflight report {path}: expected the output of 'gpu-bootstrap doctor -o json' "
                          f"(an object with a 'nodes' list)", SCHEMA_HINT)
    if problem := schema_problem(data):
        raise ConfigError(f"preflight report {path}: {problem}", SCHEMA_HINT)
    reports = {}
    for index, entry in enumerate(nodes):
        try:
            report = NodeReport.from_json(entry)
        except (KeyError, TypeError, AttributeError):
            raise ConfigError(f"preflight report {path}: nodes[{index}] is malformed") from None
        if not isinstance(report.name, str):
            raise ConfigError(f"preflight report {path}: nodes[{index}].name is not a string")
        unknown = [c.id for c in report.checks if c.id not in CHECK_IDS]
        if unknown:
            raise ConfigError(f"preflight report {path}: nodes[{index}] has unknown checks {unknown}")
        reports[report.name] = report
    absent = [name for name in wanted if name not in reports]
    if absent:
        raise ConfigError(*_absent_nodes(path, absent, sorted(reports)))
    return {name: reports[name] for name in wanted}


def _absent_nodes(path: Path, absent: list[str], held: list[str]) -> tuple[str, str]:
    """Why configured nodes have no facts in the report, and the fix: a name close to one the report holds is most
    likely a typo in `nodes` (the report was written for the cluster's names); else the report predates the node."""
    import difflib
    shown = ", ".join(held[:10]) + (" ..." if len(held) > 10 else "") if held else "no nodes"
    message = f"preflight report {path} has no facts for {', '.join(absent)} (it has: {shown})"
    likely = {name: match[0] for name in absent if (match := difflib.get_close_matches(name, held, n=1, cutoff=0.8))}
    if likely:
        guesses = ", ".join(f"{name} -> {match}" for name, match in likely.items())
        return message, (f"did you mean {guesses}? fix the name in `nodes` (the report names nodes as the cluster "
                         f"does); a node the report does not know yet needs a fresh one: gpu-bootstrap doctor -o json "
                         f"> {path}")
    return message, (f"a node added since the report was written needs a fresh one: gpu-bootstrap doctor -o json > "
                     f"{path} (with every configured node); a node that is not in the cluster: fix `nodes` in the "
                     f"config")


def document(reports: list[NodeReport]) -> dict:
    return {"nodes": [r.to_json() for r in reports], "ok": all(r.ok for r in reports)}
