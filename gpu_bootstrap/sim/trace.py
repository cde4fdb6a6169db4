"""Inputs for the simulator: node inventories and pod lists in the Alibaba openb CSV format, or a live cluster's
nodes. Bad rows are reported with file and line."""
from __future__ import annotations

import csv
from pathlib import Path

from ..errors import ConfigError
from .engine import Node, Pod

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")
MODEL_LABELS = ("nvidia.com/gpu.product", "nvidia.com/gpu.model")


def _rows(path: Path, columns: tuple, what: str):
    try:
        handle = path.open(newline="")
    except OSError as error:
        raise ConfigError(f"cannot read the {what} {path}: {error.strerror}", "check the path") from None
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path}:1: the {what} lacks column(s) {', '.join(missing)}",
                              f"expected the openb columns: {','.join(columns)}")
        for row in reader:
            yield reader.line_num, row


def _int(path: Path, line: int, row: dict, column: str, allow_empty: bool = False) -> int:
    value = (row.get(column) or "").strip()
    if not value and allow_empty:
        return 0
    try:
        number = int(float(value))
    except ValueError:
        raise ConfigError(f"{path}:{line}: column {column} is {value!r}, not a number") from None
    if number < 0:
        raise ConfigError(f"{path}:{line}: column {column} is negative ({number})")
    return number


def load_nodes(path: Path) -> list[Node]:
    nodes = []
    for line, row in _rows(path, NODE_COLUMNS, "node list"):
        nodes.append(Node(row["sn"], _int(path, line, row, "cpu_milli"), _int(path, line, row, "memory_mib"),
                          _int(path, line, row, "gpu"), (row.get("model") or "").strip()))
    if not any(n.gpus for n in nodes):
        raise ConfigError(f"{path}: no node in the list has a GPU")
    return nodes


def load_pods(path: Path) -> list[dict]:
    pods = []
    for line, row in _rows(path, POD_COLUMNS, "pod list"):
        spec = (row.get("gpu_spec") or "").strip()
        gpu_milli = _int(path, line, row, "gpu_milli", allow_empty=True)
        if gpu_milli > 1000:
            raise ConfigError(f"{path}:{line}: gpu_milli {gpu_milli} is more than one GPU (1000)")
        pods.append({"name": row["name"], "cpu_milli": _int(path, line, row, "cpu_milli"),
                     "memory_mib": _int(path, line, row, "memory_mib"),
                     "num_gpu": _int(path, line, row, "num_gpu"), "gpu_milli": gpu_milli,
                     "models": frozenset(m for m in spec.split("|") if m) or None})
    if not pods:
        raise ConfigError(f"{path}: the pod list is empty")
    return pods


# --- a live cluster ------------------------------------------------------------------------------------------------------
def quantity(value) -> float:
    """A Kubernetes quantity as a number of base units (cpu: cores, memory: bytes)."""
    text = str(value).strip()
    suffixes = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60,
                "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
    for suffix in sorted(suffixes, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * suffixes[suffix]
    return float(text)


def pod_requests(spec: dict) -> tuple[int, int, int]:
    """(cpu milli, memory MiB, GPUs): max(sum of containers, largest init container), as the scheduler counts."""
    def of(containers):
        totals = [0.0, 0.0, 0.0]
        for container in containers or []:
            requests = {**((container.get("resources") or {}).get("limits") or {}),
                        **((container.get("resources") or {}).get("requests") or {})}
            totals[0] += quantity(requests.get("cpu", 0)) * 1000
            totals[1] += quantity(requests.get("memory", 0)) / 2 ** 20
            totals[2] += quantity(requests.get("nvidia.com/gpu", 0))
        return totals
    main = of(spec.get("containers"))
    for init in spec.get("initContainers") or []:
        main = [max(a, b) for a, b in zip(main, of([init]))]
    return int(main[0]), int(main[1]), int(main[2])


def cluster_inventory(kube) -> tuple[list[Node], dict[str, Pod]]:
    """Schedulable nodes with their allocatable resources and GPU model, and what running pods already request."""
    nodes = []
    for node in kube.list("v1", "Node"):
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        labels = node["metadata"].get("labels") or {}
        model = next((labels[label] for label in MODEL_LABELS if labels.get(label)), "")
        nodes.append(Node(node["metadata"]["name"], int(quantity(allocatable.get("cpu", 0)) * 1000),
                          int(quantity(allocatable.get("memory", 0)) / 2 ** 20),
                          int(quantity(allocatable.get("nvidia.com/gpu", 0))), model))
    used: dict[str, list[int]] = {}
    for pod in kube.list("v1", "Pod"):
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        totals = used.setdefault(node, [0, 0, 0])
        for i, amount in enumerate(pod_requests(pod["spec"])):
            totals[i] += amount
    return nodes, {name: Pod(*totals) for name, totals in used.items()}
