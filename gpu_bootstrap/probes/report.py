"""Saved node facts: the `nodes` part of `gpu-bootstrap doctor -o json`, reused by `up --preflight-report FILE`; and
the same facts as the last successful preflight recorded them in the cluster (a ConfigMap), reused by runs that
leave preflight out (`--skip preflight`, `--only gpu-operator`)."""
from __future__ import annotations

import json
from pathlib import Path

from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.probes.checks import CHECK_IDS, NodeReport


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
    or it cannot be read (then the facts are unknown, never absent)."""
    data = (config_map or {}).get("data") or {}
    if "nodes.json" not in data:  # no record (no earlier preflight): nothing to say where facts came from
        return {}, ""
    try:
        nodes = json.loads(data.get("nodes.json") or "{}").get("nodes") or []
        reports = {r.name: r for r in (NodeReport.from_json(entry) for entry in nodes)}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}, ""
    return reports, f"recorded by preflight at {data.get('time', '?')} from {data.get('source', '?')}"


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
                          f"(an object with a 'nodes' list)")
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
        raise ConfigError(f"preflight report {path} has no facts for {', '.join(absent)}",
                          "run 'gpu-bootstrap doctor -o json' again with every configured node")
    return {name: reports[name] for name in wanted}


def document(reports: list[NodeReport]) -> dict:
    return {"nodes": [r.to_json() for r in reports], "ok": all(r.ok for r in reports)}
