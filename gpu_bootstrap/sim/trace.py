"""Inputs for the simulator: node inventories and pod lists in the Alibaba openb CSV format, or a live cluster's
nodes. Bad rows are reported with file and line.

Trace files are UTF-8 (a byte-order mark is allowed) and bounded, so that a wrong or hostile file is refused at once
instead of exhausting memory or time. The limits are far above the openb trace (1523 node rows, 6212 GPUs, 8152 pod
rows, files under 1 MB) and above any real node: at most 32 MiB per file, 10,000 node rows, 200,000 pod rows, 64 GPUs
per node or pod, 100,000 GPUs in all, 10,000,000 cpu_milli (10,000 cores) and 64 TiB of memory per node or pod."""
from __future__ import annotations

import codecs
import csv
import decimal
import io
import math
from pathlib import Path

from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.sim import affinity as node_affinity
from gpu_bootstrap.sim.engine import (
    NONZERO_CPU_MILLI,
    NONZERO_MEMORY_MIB,
    Container,
    Node,
    Pod,
    aggregate_requests,
    merge_pods,
)

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")
# Optional columns beyond openb's: a node's labels (key=value,...) and a pod's required node affinity (affinity.py).
LABELS_COLUMN, AFFINITY_COLUMN = "labels", "node_affinity"
TIME_COLUMNS = ("creation_time", "deletion_time")  # openb's, in seconds: what `simulate --autoscale` replays
MODEL_LABELS = ("nvidia.com/gpu.product", "nvidia.com/gpu.model")
PRODUCT_LABEL = MODEL_LABELS[0]
GPU_RESOURCE = "nvidia.com/gpu"
MIB = 2 ** 20

MAX_FILE_BYTES = 32 * 2 ** 20  # per trace file
MAX_NODE_ROWS = 10_000
MAX_POD_ROWS = 200_000
MAX_GPUS_PER_NODE = 64  # also the most GPUs one pod may request
MAX_TOTAL_GPUS = 100_000  # in a node list; the replay draws pods until 1.3 x this, so it bounds memory and time
MAX_CPU_MILLI = 10_000_000  # 10,000 cores, per node or pod
MAX_MEMORY_MIB = 64 * 2 ** 20  # 64 TiB, per node or pod
MAX_TRACE_SECONDS = 10 * 366 * 86400  # creation_time / deletion_time: ten years of trace
LIMITS = {"cpu_milli": MAX_CPU_MILLI, "memory_mib": MAX_MEMORY_MIB, "gpu": MAX_GPUS_PER_NODE,
          "num_gpu": MAX_GPUS_PER_NODE, "gpu_milli": 1000, "creation_time": MAX_TRACE_SECONDS,
          "deletion_time": MAX_TRACE_SECONDS}


def _text(path: Path, what: str) -> str:
    """The whole file as text: at most MAX_FILE_BYTES, UTF-8, or a ConfigError naming the file (and line)."""
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"cannot read the {what} {path}: {error.strerror or error}", "check the path") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: the {what} is larger than {MAX_FILE_BYTES // 2 ** 20} MiB",
                          "split it, or sample it: the simulator draws from it at random anyway")
    start = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as error:
        offset = start + error.start
        line = data.count(b"\n", 0, offset) + 1
        raise ConfigError(f"{path}:{line}: the {what} is not UTF-8 text (byte 0x{data[offset]:02x} at offset "
                          f"{offset})", "save it as UTF-8 CSV") from None


def _rows(path: Path, columns: tuple, what: str, max_rows: int):
    reader = csv.DictReader(io.StringIO(_text(path, what), newline=""))
    try:
        fieldnames = reader.fieldnames or []
        missing = [c for c in columns if c not in fieldnames]
        if missing:
            raise ConfigError(f"{path}:1: the {what} lacks column(s) {', '.join(missing)}",
                              f"expected the openb columns: {','.join(columns)}")
        for count, row in enumerate(reader, 1):
            if count > max_rows:
                raise ConfigError(f"{path}:{reader.line_num}: the {what} has more than {max_rows:,} rows",
                                  "split it, or sample it: the simulator draws from it at random anyway")
            yield reader.line_num, row
    except csv.Error as error:
        raise ConfigError(f"{path}:{reader.reader.line_num}: the {what} is not valid CSV: {error}") from None


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "...")


def _field(path: Path, line: int, row: dict, column: str) -> str:
    value = row.get(column)
    if value is None:  # a short row
        raise ConfigError(f"{path}:{line}: column {column} is missing (the row has too few fields)")
    return value.strip()


def _int(path: Path, line: int, row: dict, column: str, allow_empty: bool = False) -> int:
    value = (row.get(column) or "").strip() if allow_empty else _field(path, line, row, column)
    if not value and allow_empty:
        return 0
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{path}:{line}: column {column} is {_shown(value)}, not a number") from None
    if not math.isfinite(number):
        raise ConfigError(f"{path}:{line}: column {column} is {_shown(value)}, not a finite number")
    if number < 0:
        raise ConfigError(f"{path}:{line}: column {column} is negative ({_shown(value)})")
    limit = LIMITS[column]
    if number > limit and column == "gpu_milli":
        raise ConfigError(f"{path}:{line}: column gpu_milli is {_shown(value)}, more than one GPU (1000)")
    if number > limit:
        raise ConfigError(f"{path}:{line}: column {column} is {_shown(value)}, more than the limit {limit:,}",
                          "is the column in the unit the openb format uses (milli-cores, MiB, whole GPUs)?")
    return int(number)


def _labels(path: Path, line: int, row: dict, model: str) -> tuple[tuple[str, str], ...]:
    """The node's `labels` column, plus its model as nvidia.com/gpu.product unless the column sets that label: the
    model column is the product name GPU feature discovery would label the node with."""
    try:
        labels = node_affinity.parse_labels(row.get(LABELS_COLUMN) or "")
    except ValueError as error:
        raise ConfigError(f"{path}:{line}: column {LABELS_COLUMN}: {error}",
                          "write the labels as key=value,key=value (quote the field: it has commas)") from None
    if model:
        labels.setdefault(PRODUCT_LABEL, model)
    return tuple(sorted(labels.items()))


def load_nodes(path: Path) -> list[Node]:
    nodes, total = [], 0
    for line, row in _rows(path, NODE_COLUMNS, "node list", MAX_NODE_ROWS):
        model = (row.get("model") or "").strip()
        node = Node(_field(path, line, row, "sn"), _int(path, line, row, "cpu_milli"),
                    _int(path, line, row, "memory_mib"), _int(path, line, row, "gpu"), model,
                    _labels(path, line, row, model))
        total += node.gpus
        if total > MAX_TOTAL_GPUS:
            raise ConfigError(f"{path}:{line}: column gpu: the node list has more than {MAX_TOTAL_GPUS:,} GPUs in "
                              f"all", "simulate a sample of the nodes: packing is measured in percent")
        nodes.append(node)
    if not any(n.gpus for n in nodes):
        raise ConfigError(f"{path}: no node in the list has a GPU")
    return nodes


def load_pods(path: Path) -> list[dict]:
    pods = []
    for line, row in _rows(path, POD_COLUMNS, "pod list", MAX_POD_ROWS):
        spec = (row.get("gpu_spec") or "").strip()
        gpu_milli = _int(path, line, row, "gpu_milli", allow_empty=True)
        pods.append({"name": _field(path, line, row, "name"), "cpu_milli": _int(path, line, row, "cpu_milli"),
                     "memory_mib": _int(path, line, row, "memory_mib"),
                     "num_gpu": _int(path, line, row, "num_gpu"), "gpu_milli": gpu_milli,
                     "models": frozenset(m for m in spec.split("|") if m) or None,
                     "affinity": _affinity(path, line, row), **_times(path, line, row)})
    if not pods:
        raise ConfigError(f"{path}: the pod list is empty")
    return pods


def _times(path: Path, line: int, row: dict) -> dict:
    """start/end in seconds when the list has openb's time columns (None where a row leaves one empty)."""
    if not all(column in row for column in TIME_COLUMNS):
        return {"start": None, "end": None}
    start, end = (_int(path, line, row, column) if (row.get(column) or "").strip() else None
                  for column in TIME_COLUMNS)
    return {"start": start, "end": end}


def _affinity(path: Path, line: int, row: dict):
    try:
        return node_affinity.parse(row.get(AFFINITY_COLUMN) or "")
    except ValueError as error:
        raise ConfigError(f"{path}:{line}: column {AFFINITY_COLUMN}: {error}",
                          "e.g. \"nvidia.com/gpu.memory>40000\" or \"nvidia.com/gpu.product in (A100,H100)\" (quote the "
                          "field when it has commas; ';' between alternative terms)") from None


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


_SUFFIXES = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60,
             "n": decimal.Decimal("1e-9"), "u": decimal.Decimal("1e-6"), "m": decimal.Decimal("1e-3"), "k": 10 ** 3,
             "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15, "E": 10 ** 18}


def amount(value, milli: bool = False) -> int:
    """A quantity as a whole number of base units (or of thousandths with `milli`), rounded up as Kubernetes'
    Quantity.Value() and MilliValue() do. Exact: "100m" is 100 millicores, not 100.00000000000001."""
    text = str(value).strip()
    factor = 1
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix):  # "1E" is exa; "1E3" ends in a digit and is Decimal's exponent form
            text, factor = text[:-len(suffix)], _SUFFIXES[suffix]
            break
    number = decimal.Decimal(text) * factor * (1000 if milli else 1)
    return int(number.to_integral_value(rounding=decimal.ROUND_CEILING))


def _container(container: dict, extended: str, restartable: bool = False) -> Container:
    """One container's requests in millicores and bytes; None where a request is not set. A limit without a request
    stands in for it, as the API server's defaulting does."""
    resources = container.get("resources") or {}
    requests = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return Container(amount(requests["cpu"], milli=True) if "cpu" in requests else None,
                     amount(requests["memory"]) if "memory" in requests else None,
                     amount(requests.get(extended, 0)), restartable)


def pod_from_spec(spec: dict, memory_unit: int = MIB, extended: str = GPU_RESOURCE,
                  models: frozenset | None = None) -> Pod:
    """The pod as kube-scheduler counts it, container by container (engine.aggregate_requests): init containers,
    sidecars (restartPolicy: Always) and the pod's overhead included, the non-zero defaults applied per container
    whose cpu or memory request is not set. Memory in `memory_unit` bytes (MiB for the engine); `extended` is the
    extended resource the engine models as its GPUs."""
    containers = [_container(c, extended) for c in spec.get("containers") or []]
    inits = [_container(c, extended, c.get("restartPolicy") == "Always") for c in spec.get("initContainers") or []]
    overhead = spec.get("overhead") or {}
    extra_cpu, extra_memory = amount(overhead.get("cpu", 0), milli=True), amount(overhead.get("memory", 0))
    cpu, memory, gpus = aggregate_requests(containers, inits)
    defaults = (NONZERO_CPU_MILLI, NONZERO_MEMORY_MIB * MIB)
    nonzero_cpu, nonzero_memory, _ = aggregate_requests(containers, inits, defaults)
    return Pod(cpu + extra_cpu, (memory + extra_memory) // memory_unit, gpus, models, nonzero_cpu + extra_cpu,
               (nonzero_memory + extra_memory) // memory_unit)


def pod_requests(spec: dict) -> tuple[int, int, int]:
    """(cpu milli, memory MiB, GPUs) as the scheduler counts them (pod_from_spec, without the non-zero defaults)."""
    pod = pod_from_spec(spec)
    return pod.cpu, pod.memory, pod.gpus


def node_from_object(node: dict, memory_unit: int = MIB, extended: str = GPU_RESOURCE) -> Node:
    """A Node object's allocatable cpu (millicores), memory (`memory_unit` bytes), GPUs, GPU model label and labels."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    labels = node["metadata"].get("labels") or {}
    model = next((labels[label] for label in MODEL_LABELS if labels.get(label)), "")
    return Node(node["metadata"]["name"], amount(allocatable.get("cpu", 0), milli=True),
                amount(allocatable.get("memory", 0)) // memory_unit, amount(allocatable.get(extended, 0)), model,
                tuple(sorted(labels.items())))


def cluster_snapshot(kube) -> tuple[list[Node], dict[str, list[Pod]]]:
    """Schedulable nodes, and the pods running (or bound) on each node, one Pod per pod: the non-zero defaults
    count per container, as kube-scheduler's NodeInfo counts them, not once per node."""
    nodes = [node_from_object(node) for node in kube.list("v1", "Node")
             if not (node.get("spec") or {}).get("unschedulable")]
    running: dict[str, list[Pod]] = {}
    for pod in kube.list("v1", "Pod"):
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        running.setdefault(node, []).append(pod_from_spec(pod["spec"]))
    return nodes, running


def cluster_inventory(kube) -> tuple[list[Node], dict[str, Pod]]:
    """Schedulable nodes with their allocatable resources and GPU model, and what running pods already request, one
    merged Pod per node (its non-zero counts are the per-container sums; cluster_snapshot keeps the pods apart)."""
    nodes, running = cluster_snapshot(kube)
    return nodes, {name: merge_pods(pods) for name, pods in running.items()}
