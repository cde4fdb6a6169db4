"""One synthetic GPU cluster, as the DCGM exporter and kube-state-metrics would show it, for two uses:

* `exporter_text(node, t)`: what a node's dcgm-exporter serves at /metrics at time t. The exposition follows
  dcgm-exporter's own template, line for line: internal/pkg/rendermetrics/render_metrics.go and the default field
  list etc/default-counters.csv at tag 4.5.3-4.8.2 (commit 691c92762eb5, labels `Hostname`, DCGM_FI_DRIVER_VERSION
  as a label field, HELP/TYPE lines from the CSV), and HEAD (d5e5f510a1b6, 2026-05-12), which renamed the label to
  `hostname`. gpu-1 speaks the 4.8.2 dialect, gpu-2 HEAD's. The pod attribution (container/namespace/pod on a GPU a
  pod holds, absent otherwise) is what the exporter adds with DCGM_EXPORTER_KUBERNETES=true. The values are ours: no
  capture from a real GPU node could be made here.
* `openmetrics()`: two hours of the series Prometheus stores after scraping both (DCGM series with `node` from the
  ServiceMonitor's relabeling, job/instance; kube-state-metrics' node and pod series), for
  `promtool tsdb create-blocks-from openmetrics`.

What it covers: two GPU nodes of different models (8x H100, 8x A100), a third labelled nvidia.com/gpu.present that
advertises no GPU and runs no exporter; pods in two namespaces holding 1-4 GPUs each (busy, moderately busy, idle),
a finished pod whose request no longer counts, two pending GPU pods (one reported unschedulable), a CPU pod; an XID
79 appearing on one GPU, a failed row remap and remapped rows on another, one GPU running hot, free GPUs spread so
that a node is partly used.
"""
from __future__ import annotations

import math

T0 = 1767225600  # 2026-01-01T00:00:00Z
SPAN = 2 * 3600
STEP = 30
QUERY_AT = T0 + SPAN - 5 * 60  # where the dashboard queries are evaluated
DRIVER = "580.65.06"

# node -> (DCGM modelName, GFD product label, hostname label name, framebuffer MiB, PCI bus prefix)
NODES = {
    "gpu-1": ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", "Hostname", 81559, "00000000:1"),
    "gpu-2": ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", "hostname", 81920, "00000000:2"),
}
LABELLED_ONLY = "gpu-3"  # labelled nvidia.com/gpu.present=true, advertises nothing, runs no exporter
# (node, gpu index) -> (namespace, pod, container, utilisation %)
HOLDERS = {
    **{("gpu-1", i): ("ml", "train-0", "trainer", 85) for i in range(4)},
    ("gpu-1", 4): ("ml", "notebook-0", "jupyter", 0),
    ("gpu-1", 5): ("vision", "infer-0", "server", 40),
    ("gpu-2", 0): ("vision", "train-1", "main", 70),
    ("gpu-2", 1): ("vision", "train-1", "main", 70),
}
# namespace, pod, container, GPUs requested, node ("" = not bound), phase, unschedulable
PODS = [
    ("ml", "train-0", "trainer", 4, "gpu-1", "Running", False),
    ("ml", "notebook-0", "jupyter", 1, "gpu-1", "Running", False),
    ("vision", "infer-0", "server", 1, "gpu-1", "Running", False),
    ("vision", "train-1", "main", 2, "gpu-2", "Running", False),
    ("ml", "done-0", "main", 1, "gpu-2", "Succeeded", False),
    ("ml", "big-train", "trainer", 8, "", "Pending", True),
    ("vision", "queued-0", "main", 1, "", "Pending", False),
    ("web", "frontend", "nginx", 0, "cpu-1", "Running", False),
]
HOT = ("gpu-1", 5)
XID = ("gpu-1", 3, 79, T0 + 90 * 60)  # node, gpu, XID, from when
ROW_REMAP_FAILED = ("gpu-2", 6)
FIELDS = [  # (field, type, help) as in etc/default-counters.csv at 4.5.3-4.8.2 (the ones the dashboards use)
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
]


def _uuid(node: str, gpu: int) -> str:
    seed = sum(map(ord, node)) * 16 + gpu
    return f"GPU-{seed:08x}-2b5d-6b20-f903-{seed * 7919:012x}"


def _value(field: str, node: str, gpu: int, t: int, pods: bool = True) -> float:
    holder = HOLDERS.get((node, gpu))
    wave = math.sin((t - T0) / 600 + gpu)
    util = 0 if holder is None else max(0, min(100, holder[3] + (round(5 * wave) if holder[3] else 0)))
    total = NODES[node][3]
    used = 0 if holder is None else int(total * (0.2 + 0.7 * util / 100)) + (2048 if holder[3] == 0 else 0)
    return {
        "DCGM_FI_DEV_SM_CLOCK": 1980 if util else 345,
        "DCGM_FI_DEV_MEMORY_TEMP": 9223372036854775794 if node == "gpu-2" else 45 + util // 5,  # blank on A100
        "DCGM_FI_DEV_GPU_TEMP": 88 + round(wave) if (node, gpu) == HOT else 38 + util // 3,
        "DCGM_FI_DEV_POWER_USAGE": round(70 + 6 * util + 3 * wave, 3),
        "DCGM_FI_DEV_GPU_UTIL": util,
        "DCGM_FI_DEV_MEM_COPY_UTIL": util // 2,
        "DCGM_FI_DEV_XID_ERRORS": XID[2] if (node, gpu) == XID[:2] and t >= XID[3] else 0,
        "DCGM_FI_DEV_FB_FREE": total - used - 512,
        "DCGM_FI_DEV_FB_USED": used,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 3 if (node, gpu) == ROW_REMAP_FAILED else 0,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 1 if (node, gpu) == ROW_REMAP_FAILED else 0,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(util / 100 * 0.6, 6),
    }[field]


def _labels(node: str, gpu: int, pods: bool, hostname: str | None = None) -> list[tuple[str, str]]:
    model, _product, host_label, _fb, bus = NODES[node]
    labels = [("gpu", str(gpu)), ("UUID", _uuid(node, gpu)), ("pci_bus_id", f"{bus}{gpu}:00.0"),
              ("device", f"nvidia{gpu}"), ("modelName", model), (host_label, hostname or node),
              ("DCGM_FI_DRIVER_VERSION", DRIVER)]
    holder = HOLDERS.get((node, gpu))
    if pods and holder is not None:
        labels += [("container", holder[2]), ("namespace", holder[0]), ("pod", holder[1])]
    return labels


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def exporter_text(node: str, t: int, pods: bool = True, hostname: str | None = None) -> str:
    """/metrics of the node's dcgm-exporter at time t (pods=False: an exporter that maps no GPU to a pod;
    hostname: the node name it reports, when it stands in for another node)."""
    lines = []
    for field, kind, help_text in FIELDS:
        lines += [f"# HELP {field} {help_text}", f"# TYPE {field} {kind}"]
        for gpu in range(8):
            labels = ",".join(f'{k}="{v}"' for k, v in _labels(node, gpu, pods, hostname))
            lines.append(f"{field}{{{labels}}} {_number(_value(field, node, gpu, t))}")
    return "\n".join(lines) + "\n"


# --- the TSDB: what Prometheus holds after scraping -----------------------------------------------------------------------
def _series(name: str, labels: list[tuple[str, str]], values) -> list[str]:
    text = ",".join(f'{k}="{v}"' for k, v in labels)
    return [f"{name}{{{text}}} {_number(v)} {t}" for t, v in values]


def openmetrics() -> str:
    times = range(T0, T0 + SPAN + 1, STEP)
    families: dict[str, tuple[str, list[str]]] = {}

    def add(name: str, kind: str, labels, fn) -> None:
        families.setdefault(name, (kind, []))[1].extend(_series(name, labels, ((t, fn(t)) for t in times)))

    for index, (node, spec) in enumerate(sorted(NODES.items())):
        target = [("instance", f"10.244.{index + 1}.7:9400"), ("job", "nvidia-dcgm-exporter"), ("node", node)]
        add("up", "gauge", target, lambda t: 1)
        for field, kind, _help in FIELDS:
            for gpu in range(8):
                labels = _labels(node, gpu, True) + target
                add(field, "gauge" if kind == "gauge" else "gauge", labels,
                    lambda t, f=field, n=node, g=gpu: _value(f, n, g, t))
    ksm = [("instance", "10.244.0.5:8080"), ("job", "kube-state-metrics")]
    for node, spec in sorted(NODES.items()):
        add("kube_node_status_allocatable", "gauge",
            [("node", node), ("resource", "nvidia_com_gpu"), ("unit", "integer")] + ksm, lambda t: 8)
        add("kube_node_labels", "gauge", [("label_nvidia_com_gpu_present", "true"),
                                          ("label_nvidia_com_gpu_product", spec[1]), ("node", node)] + ksm,
            lambda t: 1)
    add("kube_node_labels", "gauge", [("label_nvidia_com_gpu_present", "true"), ("node", LABELLED_ONLY)] + ksm,
        lambda t: 1)
    add("kube_node_labels", "gauge", [("node", "cpu-1")] + ksm, lambda t: 1)
    add("kube_node_status_allocatable", "gauge", [("node", "cpu-1"), ("resource", "cpu"), ("unit", "core")] + ksm,
        lambda t: 15)
    for namespace, pod, container, gpus, node, phase, unschedulable in PODS:
        who = [("namespace", namespace), ("pod", pod)]
        resource = ("nvidia_com_gpu", "integer") if gpus else ("cpu", "core")
        add("kube_pod_container_resource_requests", "gauge",
            [("container", container), ("namespace", namespace), ("node", node), ("pod", pod),
             ("resource", resource[0]), ("unit", resource[1])] + ksm, lambda t, g=gpus: g or 1)
        for state in ("Pending", "Running", "Succeeded", "Failed", "Unknown"):
            add("kube_pod_status_phase", "gauge", who + [("phase", state)] + ksm,
                lambda t, s=state, p=phase: 1 if s == p else 0)
        if unschedulable:
            add("kube_pod_status_unschedulable", "gauge", who + ksm, lambda t: 1)
    out = []
    for name, (kind, lines) in families.items():
        out += [f"# TYPE {name} {kind}", *lines]
    return "\n".join(out) + "\n# EOF\n"
