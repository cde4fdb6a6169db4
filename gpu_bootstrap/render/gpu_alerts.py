"""The GPU alerts gpu-bootstrap installs (a PrometheusRule), each with a runbook line.

Inputs: the DCGM exporter's series (with `node` from the ServiceMonitor's relabeling and the exporter's own
namespace/pod labels kept by honorLabels), kube-state-metrics (`kube_pod_scheduler` names a pod's schedulerName)
and the API server's admission webhook metrics (kube-prometheus-stack scrapes the API server by default).
`tests/monitoring/alerts-test.yaml` makes every alert fire and keeps it silent with `promtool test rules`;
tests/test_monitoring_alert_faults.py runs the fault alerts over four hours of series on a real Prometheus.
Pure data: no cluster, no SDK.
"""
from __future__ import annotations

from dataclasses import dataclass

# kube-state-metrics writes nvidia.com/gpu as nvidia_com_gpu; time-sliced (renamed) GPUs and MIG slices too
GPU_RESOURCES = 'resource=~"nvidia_com_gpu|nvidia_com_gpu_shared|nvidia_com_mig_.+"'
XID_WINDOW = "30m"  # application XIDs (13, 31, 43 ...): the gauge keeps the last one, so only a change is news
# XIDs that mean failing hardware or a lost GPU: NVIDIA's XID catalogue lists them with a GPU reset, a node reboot or
# the hardware vendor as the resolution (not "restart the application"): 48 double-bit ECC, 61/62 internal
# micro-controller breakpoint/halt, 63/64 row remap or page retirement recorded/failed, 74 NVLink, 79 fallen off the
# bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP timeout/error, 140 unrecovered ECC,
# 154 recovery action changed (reset or reboot required). DCGM keeps reporting them until the GPU is reset, and so
# long does the alert fire.
HARDWARE_XIDS = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 154)
WEBHOOK_NAME = "gpu-pods.gpu-bootstrap.io"  # render/admission.py's webhook, as the API server's metrics name it
WEBHOOK_WINDOW = "10m"


@dataclass(frozen=True)
class AlertSettings:
    """What the rules need from the config (render/monitoring.py passes it; the defaults are the config's)."""

    scheduler: str = "gpu-binpack-scheduler"  # scheduler.name: GPU pods waiting for it are ours to report
    pending_for: str = "15m"  # monitoring.alerts.gpu_pod_pending_for
    workload_rules: bool = True  # monitoring.workload_gpu_rules


def settings_from(config) -> AlertSettings:
    return AlertSettings(config.scheduler.name, config.monitoring.alerts.gpu_pod_pending_for,
                         config.monitoring.workload_gpu_rules)


def _hardware_xid() -> str:
    return " or ".join(f"DCGM_FI_DEV_XID_ERRORS == {xid}" for xid in HARDWARE_XIDS)


def _not_hardware_xid() -> str:
    return "DCGM_FI_DEV_XID_ERRORS " + " ".join(f"!= {xid}" for xid in HARDWARE_XIDS)
HOT_CELSIUS = 85
BLANK = "1e15"  # DCGM's "no value" sentinels are ~9.2e18: anything this large is not a reading


def _rule(name: str, expr: str, duration: str, severity: str, summary: str, description: str, runbook: str) -> dict:
    rule = {"alert": name, "expr": " ".join(expr.split()), "labels": {"severity": severity},
            "annotations": {"summary": summary, "description": description, "runbook": runbook}}
    if duration != "0m":
        rule["for"] = duration
    return rule


def rules(settings: AlertSettings = AlertSettings()) -> list[dict]:
    return [
        _rule("GpuXidErrorReported",
              f"""({_not_hardware_xid()}) > 0 < {BLANK}
                  and (changes(DCGM_FI_DEV_XID_ERRORS[{XID_WINDOW}]) > 0
                       or (DCGM_FI_DEV_XID_ERRORS unless DCGM_FI_DEV_XID_ERRORS offset {XID_WINDOW}))""",
              "0m", "warning",
              "GPU {{ $labels.gpu }} on {{ $labels.node }} reported XID {{ $value }}",
              "DCGM_FI_DEV_XID_ERRORS holds the last XID the driver reported (a gauge, not a count); it changed to "
              "{{ $value }} within the last " + XID_WINDOW + " (pod {{ $labels.namespace }}/{{ $labels.pod }}). "
              "XIDs that mean failing hardware raise GpuXidHardwareFault instead.",
              "Look the XID up in NVIDIA's XID catalogue; 13/31/43 are usually the application's own fault (read "
              "the pod's log); the alert clears by itself after " + XID_WINDOW + "."),
        _rule("GpuXidHardwareFault",
              f"{_hardware_xid()}", "0m", "critical",
              "GPU {{ $labels.gpu }} on {{ $labels.node }} reports XID {{ $value }}: failing hardware or a lost GPU",
              "DCGM still reports XID {{ $value }} as the GPU's last error; NVIDIA's XID catalogue resolves it with a "
              "GPU reset, a reboot or the hardware vendor, and the alert fires until DCGM stops reporting it (pod "
              "{{ $labels.namespace }}/{{ $labels.pod }}).",
              "Cordon the node (kubectl cordon NODE), drain its GPU pods, reset the GPU (nvidia-smi -r) or reboot, "
              "and check `nvidia-smi -q` before uncordoning; 79 (fallen off the bus) and a recurring 48/64/95 mean "
              "the GPU or its slot needs service."),
        _rule("GpuTooHot",
              f"DCGM_FI_DEV_GPU_TEMP > {HOT_CELSIUS} < 1000", "5m", "warning",
              "GPU {{ $labels.gpu }} on {{ $labels.node }} is at {{ $value }} °C",
              f"The GPU has been above {HOT_CELSIUS} °C for 5 minutes; it throttles its clocks to cool down.",
              "Check the node's fans, airflow and inlet temperature (ipmitool sdr), and whether DCGM reports "
              "thermal violations (DCGM_FI_DEV_THERMAL_VIOLATION); move the workload if one GPU is hotter than "
              "its neighbours."),
        _rule("GpuRowRemapFailure",
              f"DCGM_FI_DEV_ROW_REMAP_FAILURE > 0 < {BLANK}", "0m", "critical",
              "GPU {{ $labels.gpu }} on {{ $labels.node }} failed to remap a memory row",
              "Row remapping failed: the GPU's memory has an uncorrectable fault it can no longer hide.",
              "Cordon the node (kubectl cordon NODE), drain its GPU pods and have the GPU replaced (RMA); "
              "nvidia-smi -q -d ROW_REMAPPER shows the remapping state."),
        _rule("GpuUncorrectableRowsRemapped",
              f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS > 0 < {BLANK}", "0m", "warning",
              "GPU {{ $labels.gpu }} on {{ $labels.node }} remapped {{ $value }} memory row(s) after uncorrectable "
              "errors",
              "Rows are remapped after uncorrectable ECC errors; a pending remap takes effect only at the next GPU "
              "reset.",
              "Drain the node's GPU pods, reset the GPU (nvidia-smi -r) or reboot, then check nvidia-smi -q -d "
              "ROW_REMAPPER: 'Pending: No' and no failure. A growing count means the GPU should be replaced."),
        _rule("GpuDcgmExporterMissing",
              f"""(max by (node) (kube_node_labels{{label_nvidia_com_gpu_present="true"}})
                   or max by (node) (kube_node_status_allocatable{{{GPU_RESOURCES}}} > 0))
                  unless on (node) max by (node) (up{{job="nvidia-dcgm-exporter"}} == 1)""",
              "10m", "warning",
              "No DCGM exporter is scraped on GPU node {{ $labels.node }}",
              "The node has GPUs (labelled nvidia.com/gpu.present=true or advertising them) but Prometheus has no "
              "healthy nvidia-dcgm-exporter target there, so its GPUs are invisible to the dashboards and alerts.",
              "kubectl -n gpu-operator get pods -o wide | grep dcgm-exporter: is the pod on that node running? If "
              "it runs, the ServiceMonitor is not selected (gpu-bootstrap doctor names the cause); if not, check "
              "the driver pod on that node first."),
        _rule("GpuAllocatedButIdle",
              'DCGM_FI_DEV_GPU_UTIL{pod!=""} < 1', "1h", "info",
              "{{ $labels.namespace }}/{{ $labels.pod }} holds GPU {{ $labels.gpu }} on {{ $labels.node }} without "
              "using it",
              "The GPU has been allocated to this pod and at 0 % utilisation for an hour.",
              "Ask the pod's owner whether it still needs the GPU (a notebook left open, a stuck job); GPUs held "
              "idle block other pods (see the 'GPU allocation' dashboard for who waits)."),
        _rule("GpuNodeAdvertisesNoGpus",
              f"""max by (node) (kube_node_labels{{label_nvidia_com_gpu_present="true"}})
                  unless on (node) (max by (node) (kube_node_status_allocatable{{{GPU_RESOURCES}}}) > 0)""",
              "15m", "warning",
              "GPU node {{ $labels.node }} advertises no nvidia.com/gpu",
              "The node is labelled nvidia.com/gpu.present=true but its allocatable resources hold no GPU, so "
              "nothing can be scheduled on its GPUs.",
              "kubectl -n gpu-operator get pods -o wide --field-selector spec.nodeName=NODE: the device plugin pod "
              "is not ready there (usually the driver or the toolkit; gpu-bootstrap doctor names which)."),
        _rule("GpuPodsUnschedulable",
              f"""max by (namespace, pod) (kube_pod_status_unschedulable == 1)
                  and on (namespace, pod)
                      (max by (namespace, pod) (kube_pod_container_resource_requests{{{GPU_RESOURCES}}}) > 0)
                  unless on (namespace, pod) kube_pod_scheduler{{name="{settings.scheduler}"}}""",
              "10m", "warning",
              "GPU pod {{ $labels.namespace }}/{{ $labels.pod }} has been unschedulable for 10 minutes",
              "The scheduler cannot place the pod: not enough free GPUs on one node, or its selectors and "
              "tolerations fit no GPU node.",
              "kubectl -n NAMESPACE describe pod POD shows the scheduler's reason; the 'GPU allocation' dashboard "
              "shows the free GPUs per node (fragmentation: enough GPUs in total but not on one node)."),
        # value 1: the scheduler looked and found no node (PodScheduled=False, Unschedulable); 0: nobody looked
        _rule("GpuPodsPendingOnBinpackScheduler",
              f"""(max by (namespace, pod) (kube_pod_status_unschedulable)
                   or max by (namespace, pod) (kube_pod_scheduler{{name="{settings.scheduler}"}}) * 0)
                  and on (namespace, pod) kube_pod_scheduler{{name="{settings.scheduler}"}}
                  and on (namespace, pod) kube_pod_status_phase{{phase="Pending"}} == 1
                  and on (namespace, pod) kube_pod_info{{node=""}}
                  and on (namespace, pod)
                      (max by (namespace, pod) (kube_pod_container_resource_requests{{{GPU_RESOURCES}}}) > 0)""",
              settings.pending_for, "warning",
              "GPU pod {{ $labels.namespace }}/{{ $labels.pod }} has waited " + settings.pending_for + " for "
              + settings.scheduler,
              "{{ if eq $value 1.0 }}" + settings.scheduler + " looked at the pod and found no node for it (its "
              "event says which check failed on each node).{{ else }}No scheduler has looked at the pod: "
              + settings.scheduler + " is not running, not leading, or stuck.{{ end }}",
              "Unschedulable: kubectl -n NAMESPACE describe pod POD shows the reason; the 'GPU allocation' dashboard "
              "shows the free GPUs per node. Never looked at: gpu-bootstrap doctor (binpack-scheduler) names what "
              "is wrong with the scheduler; kubectl -n kube-system logs deploy/" + settings.scheduler + "."),
        _rule("GpuAdmissionWebhookFailing",
              f"""sum by (name) (increase(apiserver_admission_webhook_rejection_count{{name="{WEBHOOK_NAME}",
                      error_type=~"calling_webhook_error|apiserver_internal_error"}}[{WEBHOOK_WINDOW}])) > 0
                  or sum by (name) (
                      increase(apiserver_admission_webhook_fail_open_count{{name="{WEBHOOK_NAME}"}}[{WEBHOOK_WINDOW}])
                  ) > 0""",
              "5m", "warning",
              "The API server cannot reach the admission webhook {{ $labels.name }}",
              "Calls to the webhook failed or timed out {{ $value | humanize }} time(s) in the last "
              + WEBHOOK_WINDOW + " (apiserver_admission_webhook_rejection_count with a calling error, or "
              "_fail_open_count): with failurePolicy Ignore GPU pods are created without being steered (the 1.30+ "
              "backstop policy rejects them), with Fail they are refused.",
              "gpu-bootstrap doctor (admission) names the cause; kubectl -n NAMESPACE get pods,endpoints for the OPA "
              "server; a TLS error after a certificate change: run gpu-bootstrap up to renew the caBundle."),
    ]


# --- GPU use per pod and per workload: what a KEDA ScaledObject (or an HPA through a metrics adapter) scales on -------
# name -> the DCGM field it averages (utilization, %) or sums (framebuffer used, MiB) per pod
POD_SERIES = {"namespace_pod:dcgm_gpu_utilization:avg": ("avg", "DCGM_FI_DEV_GPU_UTIL"),
              "namespace_pod:dcgm_fb_used_mib:sum": ("sum", "DCGM_FI_DEV_FB_USED")}
# kube-prometheus-stack's own recording rule (kubernetes-mixin's k8s.rules, from kube-state-metrics' kube_pod_owner
# and kube_replicaset_owner): one series per pod naming its workload (a Deployment rather than its ReplicaSet)
POD_OWNER = "namespace_workload_pod:kube_pod_owner:relabel"


def workload_rules() -> list[dict]:
    """Per pod: a pod's GPUs' utilization averaged and their framebuffer use summed, from the series the DCGM exporter
    labels with the pod holding the GPU (DCGM's blank values left out). Per workload (namespace, workload,
    workload_type): the pods' figures averaged and summed, joined on kube-prometheus-stack's pod-owner series, so a
    Deployment's figure is one series whatever its pods are called."""
    recorded = []
    for name, (how, field) in POD_SERIES.items():
        recorded.append({"record": name,
                         "expr": f'{how} by (namespace, pod) ({field}{{pod!=""}} < {BLANK})'})
    for name, (how, _field) in POD_SERIES.items():
        workload = name.replace("namespace_pod:", "namespace_workload:")
        recorded.append({"record": workload, "expr": (
            f"{how} by (namespace, workload, workload_type) ({name} * on (namespace, pod) "
            f"group_left (workload, workload_type) max by (namespace, pod, workload, workload_type) ({POD_OWNER}))")})
    return recorded


def groups(settings: AlertSettings = AlertSettings()) -> list[dict]:
    found = [{"name": "gpu-bootstrap.gpu", "rules": rules(settings)}]
    if settings.workload_rules:
        found.append({"name": "gpu-bootstrap.gpu-workloads", "rules": workload_rules()})
    return found


__all__ = ["AlertSettings", "groups", "rules", "settings_from", "workload_rules", "GPU_RESOURCES", "HARDWARE_XIDS",
           "POD_SERIES"]
