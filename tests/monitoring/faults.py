"""Four hours of the series gpu-bootstrap's fault alerts read, for a real Prometheus (`promtool tsdb
create-blocks-from openmetrics`): each fault starts, persists for over an hour and clears, beside look-alikes that
must stay silent. Minutes are counted from T0; samples every minute, as Prometheus stores one scrape a minute.

* XID 79 on gpu-1 GPU 3 (fallen off the bus): from 30m to 150m, then DCGM reports 0 again (GPU reset).
* XID 13 on gpu-1 GPU 1 (an application fault): from 60m on; the gauge keeps 13 for the rest of the four hours.
* Pod ml/wait-0 (2 GPUs, the bin-packing scheduler): created at 10m, reported unschedulable from 40m, bound at 160m.
  Silent look-alikes: a default-scheduler GPU pod, a CPU-only pod of ours, a GPU pod of ours bound and pulling.
* The API server's calls to our webhook fail from 60m to 140m (one a minute); policy denials (no_error) go on all
  the time, and another webhook fails all the time.
"""
from __future__ import annotations

T0 = 1767225600  # 2026-01-01T00:00:00Z
MINUTES = 240
SCHEDULER = "gpu-binpack-scheduler"
WEBHOOK = "gpu-pods.gpu-bootstrap.io"


def at(minute: float) -> int:
    return T0 + int(minute * 60)


def _xid(gpu: int, minute: int) -> int:
    if gpu == 3:
        return 79 if 30 <= minute < 150 else 0
    if gpu == 1:
        return 13 if minute >= 60 else 0
    return 0


# pod -> (scheduler, GPUs, first minute, minute bound (None: never), node when bound, unschedulable from)
PODS = {
    ("ml", "wait-0"): (SCHEDULER, 2, 10, 160, "gpu-1", 40),
    ("web", "other"): ("default-scheduler", 1, 0, None, "", None),
    ("ml", "cpu-only"): (SCHEDULER, 0, 0, None, "", None),
    ("ml", "pulling"): (SCHEDULER, 1, 0, 0, "gpu-2", None),
}


def _series() -> dict[str, list[tuple[dict, int, float]]]:
    out: dict[str, list[tuple[dict, int, float]]] = {}

    def add(name: str, labels: dict, minute: int, value: float) -> None:
        out.setdefault(name, []).append((labels, at(minute), value))

    dcgm = {"node": "gpu-1", "job": "nvidia-dcgm-exporter", "instance": "10.244.1.7:9400"}
    ksm = {"job": "kube-state-metrics", "instance": "10.244.0.5:8080"}
    apiserver = {"job": "apiserver", "instance": "10.0.0.1:6443"}
    for minute in range(MINUTES + 1):
        for gpu in range(4):
            add("DCGM_FI_DEV_XID_ERRORS", {**dcgm, "gpu": str(gpu), "UUID": f"GPU-{gpu}"}, minute, _xid(gpu, minute))
        for (namespace, pod), (scheduler, gpus, first, bound, node, unschedulable) in PODS.items():
            if minute < first:
                continue
            who = {**ksm, "namespace": namespace, "pod": pod, "uid": f"uid-{pod}"}
            is_bound = bound is not None and minute >= bound
            running = is_bound and pod == "wait-0"
            add("kube_pod_scheduler", {**who, "name": scheduler}, minute, 1)
            add("kube_pod_info", {**who, "node": node if is_bound else ""}, minute, 1)
            for phase in ("Pending", "Running"):
                add("kube_pod_status_phase", {**who, "phase": phase}, minute,
                    1 if (phase == "Running") == running else 0)
            resource = ("nvidia_com_gpu", "integer") if gpus else ("cpu", "core")
            add("kube_pod_container_resource_requests",
                {**ksm, "namespace": namespace, "pod": pod, "container": "main", "node": node if is_bound else "",
                 "resource": resource[0], "unit": resource[1]}, minute, gpus or 1)
            if unschedulable is not None and unschedulable <= minute and not is_bound:
                add("kube_pod_status_unschedulable", who, minute, 1)
        failures = min(max(minute - 60, 0), 80)  # one a minute from 60m to 140m
        rejection = {**apiserver, "type": "admit", "operation": "CREATE"}
        add("apiserver_admission_webhook_rejection_count",
            {**rejection, "name": WEBHOOK, "error_type": "calling_webhook_error", "rejection_code": "0"}, minute,
            failures)
        add("apiserver_admission_webhook_rejection_count",
            {**rejection, "name": WEBHOOK, "error_type": "no_error", "rejection_code": "403"}, minute, minute * 3)
        add("apiserver_admission_webhook_rejection_count",
            {**rejection, "name": "other.example.com", "error_type": "calling_webhook_error",
             "rejection_code": "0"}, minute, minute)
    return out


def openmetrics() -> str:
    lines = []
    for name, samples in _series().items():
        lines.append(f"# TYPE {name} gauge")
        for labels, t, value in samples:
            text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if v != "")
            lines.append(f"{name}{{{text}}} {value:g} {t}")
    return "\n".join(lines) + "\n# EOF\n"
