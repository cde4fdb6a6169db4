"""`doctor --conformance DIR`: the Kubernetes AI Conformance checklist filled in by proving each item on the live
cluster (render/conformance.py writes the documents).

Each check that gpu-bootstrap's platform covers does what the item asks and looks at the result: a gang Job admitted
whole through a team's queue, a pending GPU pod bringing a node from a NodePool, Prometheus answering for every GPU of
every GPU node, a fresh workload's metrics scraped, the device-access attack refused, Kueue's webhooks answering and
its queues reconciled. What a check creates lives in a namespace of its own (the gang's Job in a team namespace, the
only place a team's queue reaches), labelled as ours, and is removed afterwards; with `read_only` a check only reads
(and sends server-side dry runs, which change nothing). A fact a check could not read is not a pass: the item says
what could not be checked, and a MUST in scope then fails the run.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from gpu_bootstrap.app.conformance_autoscaling import cluster_autoscaling, pod_autoscaling
from gpu_bootstrap.app.conformance_probe import GPU, NAMESPACE_PREFIX, PART_OF, WITHIN, Probe, pause_pod, prometheus, \
    query
from gpu_bootstrap.core.errors import ClusterError, GpuBootstrapError
from gpu_bootstrap.core.objects import condition_true
from gpu_bootstrap.core.refs import Ref
from gpu_bootstrap.render import conformance as checklist
from gpu_bootstrap.render import queues as kueue
from gpu_bootstrap.render.conformance import IMPLEMENTED, NOT_IMPLEMENTED, PARTIAL, Result

CHECKLIST_FILE = "AIConformance.yaml"
OUT_OF_SCOPE = {
    "virtualized_accelerator": "gpu-bootstrap does not manage vGPU (NVIDIA's vGPU manager and licensed guest "
                               "drivers); the gpu-operator's vGPU options would provide it",
    "ai_inference": "gpu-bootstrap installs no Gateway API implementation; an implementation such as Envoy Gateway, "
                    "Istio or Cilium would provide it (the program's validator refuses a submission until it is "
                    "Implemented)",
    "advanced_inference_ingress": "gpu-bootstrap installs no Gateway API Inference Extension; an implementation of it "
                                  "(e.g. the inference extension's endpoint picker with a Gateway) would provide it",
    "high_performance_networking": "gpu-bootstrap manages no RDMA or secondary networks; NVIDIA's network operator "
                                   "or DRANET would provide it",
    "disaggregated_inference": "gpu-bootstrap installs no inference server; llm-d, Dynamo, vLLM or SGLang with "
                               "separate prefill and decode would provide it",
}


# --- the checks ---------------------------------------------------------------------------------------------------------
def driver_runtime_management(probe: Probe) -> Result:
    """Every GPU node's driver and container runtime, as the node facts tell them (SSH, the in-cluster probe, a report
    or the recorded facts, each named)."""
    reports = list(probe.ctx.node_facts.reports().values())
    if not reports:
        return Result("driver_runtime_management", NOT_IMPLEMENTED, "no GPU node's facts were read", in_scope=False)
    good = True
    for report in reports:
        cells = {c.id: c for c in report.checks if c.id in ("nvidia-driver", "container-runtime",
                                                              "nvidia-container-toolkit")}
        source = report.came_from or report.source or "not said"
        probe.say(f"{report.name} (facts from {source}): " +
                  "; ".join(f"{name} {c.status}: {c.message}" for name, c in cells.items()))
        good = good and report.read and len(cells) == 3 and all(c.status != "fail" for c in cells.values())
    status = IMPLEMENTED if good else PARTIAL
    return Result("driver_runtime_management", status, (
        f"gpu-bootstrap's preflight reads each GPU node's driver, container runtime and NVIDIA container toolkit "
        f"({len(reports)} node(s)); the gpu-operator installs what is missing and doctor says what to fix"
        + ("" if good else "; a node's driver or runtime did not pass (see the log)")), in_scope=False)


def gpu_sharing(probe: Probe) -> Result:
    sharing = probe.ctx.config.gpu_operator.sharing
    mode = getattr(sharing, "mode", "none")
    if mode in (None, "none"):
        return Result("gpu_sharing", NOT_IMPLEMENTED, "gpu_operator.sharing is not configured (time-slicing or MIG "
                                                      "would provide it)", in_scope=False)
    nodes = probe.ctx.kube.list("v1", "Node")
    shared = []
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        capacity = (node.get("status") or {}).get("capacity") or {}
        replicas = labels.get("nvidia.com/gpu.replicas")
        mig = [k for k in capacity if k.startswith("nvidia.com/mig-")]
        if (replicas and replicas.isdigit() and int(replicas) > 1) or mig:
            shared.append(node["metadata"]["name"])
            probe.say(f"{node['metadata']['name']}: gpu.replicas {replicas}, MIG resources {mig}, "
                      f"{GPU} {capacity.get(GPU)}")
    if not shared:
        return Result("gpu_sharing", PARTIAL, f"gpu_operator.sharing.mode {mode} is configured but no node advertises "
                                              f"shared GPUs yet", in_scope=False)
    return Result("gpu_sharing", IMPLEMENTED, f"{mode}: {len(shared)} node(s) advertise shared GPUs "
                                              f"({', '.join(shared[:5])})", in_scope=False)


def accelerator_metrics(probe: Probe) -> Result:
    """Utilization and framebuffer use for every GPU of every GPU node, labelled by node, from the Prometheus the
    monitoring step installed or attached to."""
    item = "accelerator_metrics"
    if "monitoring" not in probe.steps:
        return Result(item, NOT_IMPLEMENTED, "the monitoring step is off (monitoring.enabled: true provides it)")
    proxy = prometheus(probe)
    if isinstance(proxy, str):
        return Result(item, NOT_IMPLEMENTED, f"Prometheus cannot be asked: {proxy}")
    expected = _gpus_per_node(probe)
    if not expected:
        return Result(item, NOT_IMPLEMENTED, "no node advertises GPUs")
    counts = {}
    for field_name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"):
        promql = f"count by (node) ({field_name} < 1e15)"
        answer = probe.wait(f"Prometheus answers {promql} for every GPU node",
                            lambda promql=promql: _covers(query(probe, proxy, promql), expected))
        counts[field_name] = answer or _by_node(query(probe, proxy, promql))
    short = {f"{node} {name}": f"{counts[name].get(node, 0)}/{gpus}" for name in counts
             for node, gpus in expected.items() if counts[name].get(node, 0) < gpus}
    for node, gpus in expected.items():
        probe.say(f"{node}: {gpus} GPU(s); utilization series {counts['DCGM_FI_DEV_GPU_UTIL'].get(node, 0)}, "
                  f"framebuffer series {counts['DCGM_FI_DEV_FB_USED'].get(node, 0)}")
    held = query(probe, proxy, 'count(DCGM_FI_DEV_GPU_UTIL{pod!=""})')
    probe.say(f"series labelled with the pod that holds the GPU: {held[0]['value'][1] if held else 0}")
    if short:
        return Result(item, NOT_IMPLEMENTED, f"missing DCGM series: {', '.join(sorted(short)[:6])}")
    return Result(item, IMPLEMENTED, (
        f"NVIDIA's DCGM exporter (the gpu-operator's) scraped by Prometheus: DCGM_FI_DEV_GPU_UTIL and "
        f"DCGM_FI_DEV_FB_USED for all {sum(expected.values())} GPU(s) of {len(expected)} node(s), labelled node, "
        f"gpu, UUID and, while a pod holds the GPU, namespace and pod; temperature, power and XID alongside"))


def ai_service_metrics(probe: Probe) -> Result:
    """A fresh workload exposing Prometheus metrics, with a PodMonitor, is scraped."""
    item = "ai_service_metrics"
    if "monitoring" not in probe.steps:
        return Result(item, NOT_IMPLEMENTED, "the monitoring step is off (monitoring.enabled: true provides it)")
    if probe.read_only:
        return Result(item, NOT_IMPLEMENTED, "not checked (--read-only): it deploys a workload and a PodMonitor")
    proxy = prometheus(probe)
    if isinstance(proxy, str):
        return Result(item, NOT_IMPLEMENTED, f"Prometheus cannot be asked: {proxy}")
    from gpu_bootstrap.core.catalogue import default
    from gpu_bootstrap.steps.monitoring_target import decide
    namespace = probe.namespace
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "metrics-server", "namespace": namespace, "labels": {"app": "conformance-metrics"}},
           # OPA (the admission step's image, so it is mirrored where ours are) serves /metrics on :8181
           "spec": {"containers": [{"name": "server", "image": default("opa"), "args": ["run", "--server"],
                                    "ports": [{"name": "metrics", "containerPort": 8181}]}]}}
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
               "metadata": {"name": "conformance-metrics", "namespace": namespace,
                            "labels": dict(decide(probe.ctx).service_monitor_labels)},
               "spec": {"selector": {"matchLabels": {"app": "conformance-metrics"}},
                        "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "10s"}]}}
    probe.create(pod)
    probe.create(monitor)
    promql = f'up{{namespace="{namespace}",pod="metrics-server"}} == 1'
    scraped = probe.wait(f"Prometheus scrapes the workload ({promql})", lambda: query(probe, proxy, promql))
    if not scraped:
        return Result(item, NOT_IMPLEMENTED, f"a workload's PodMonitor was not scraped within {probe.within:g} s")
    return Result(item, IMPLEMENTED, (
        "the Prometheus Operator discovers ServiceMonitors and PodMonitors in any namespace; a fresh workload in its "
        "own namespace serving the Prometheus format was scraped (up == 1) with no other setup"))


def secure_accelerator_access(probe: Probe) -> Result:
    """The device-access attack (a pod given no GPU that sets NVIDIA_VISIBLE_DEVICES=all) is refused, and the
    runtime ignores that variable in unprivileged containers where the gpu-operator installs the toolkit."""
    item = "secure_accelerator_access"
    if not probe.steps & {"admission", "admission-opa"} or not probe.ctx.config.admission.device_access:
        return Result(item, NOT_IMPLEMENTED, "admission is off (admission.enabled and admission.device_access "
                                             "provide it)")
    namespace = probe.namespace or "default"
    plain = pause_pod("conformance-device-access")
    plain["metadata"]["namespace"] = namespace
    probe.ctx.kube.create(plain, dry_run=True)  # first: a refusal below must be the variable's, not any pod's
    probe.say("a pod given no GPU is admitted (server-side dry run)")
    attack = pause_pod("conformance-device-access")
    attack["metadata"]["namespace"] = namespace
    attack["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    refused = None
    try:
        probe.ctx.kube.create(attack, dry_run=True)
        probe.say("the same pod setting NVIDIA_VISIBLE_DEVICES=all was ADMITTED (server-side dry run)")
    except ClusterError as error:
        if not _admission_denied(error):
            raise
        refused = error.message
        probe.say(f"the same pod setting NVIDIA_VISIBLE_DEVICES=all was refused: {refused}")
    runtime = _toolkit_setting(probe)
    if refused is None:
        return Result(item, NOT_IMPLEMENTED, "a pod given no GPU could ask for every GPU with NVIDIA_VISIBLE_DEVICES")
    return Result(item, IMPLEMENTED, (
        "GPUs reach a container only through the device plugin (or DRA): admission refuses NVIDIA_VISIBLE_DEVICES "
        "and NVIDIA's RuntimeClasses in pods given no GPU (checked now: refused); " + runtime))


def gang_scheduling(probe: Probe) -> Result:
    """A 2-pod Job through a team's queue is admitted whole: both pods exist and are bound, or none."""
    item = "gang_scheduling"
    section = _team_queues(probe)
    if section is None:
        return Result(item, NOT_IMPLEMENTED, "the queues step is off (queues.teams provides Kueue's all-or-nothing "
                                             "admission)")
    if probe.read_only:
        return Result(item, NOT_IMPLEMENTED, "not checked (--read-only): it submits a gang Job to a team's queue")
    team = section.teams[0]
    namespace = team.namespaces[0]
    name = f"conformance-gang-{secrets.token_hex(3)}"
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": name, "namespace": namespace, "labels": {kueue.QUEUE_LABEL: section.local_queue}},
           "spec": {"parallelism": 2, "completions": 2, "suspend": True, "backoffLimit": 0,
                    "template": {"metadata": {"labels": PART_OF | {"job-name": name}},
                                 "spec": {**pause_pod(name, gpus=1)["spec"], "restartPolicy": "Never"}}}}
    probe.create(job)
    try:
        def bound():
            pods = probe.ctx.kube.list("v1", "Pod", namespace, label_selector=f"job-name={name}")
            placed = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
            done = [p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"]
            return len(placed) >= 2 or len(done) >= 2
        admitted = probe.wait(f"Kueue admits the 2-pod Job {namespace}/{name} and both pods are bound", bound)
    finally:
        probe.ctx.kube.delete(Ref("batch/v1", "Job", name, namespace), propagation="Foreground")
        probe.say(f"deleted Job {namespace}/{name}")
    if not admitted:
        return Result(item, NOT_IMPLEMENTED, f"a 2-pod gang Job in {namespace} was not admitted whole within "
                                             f"{probe.within:g} s (is the team's quota in use?)")
    return Result(item, IMPLEMENTED, (
        f"Kueue (installed by the queues step) admits a Job's pods all or none through each team's LocalQueue "
        f"{section.local_queue}; a 2-pod, 1-GPU-each Job in {namespace} was admitted whole and both pods bound"))


def robust_controller(probe: Probe) -> Result:
    """Kueue's webhooks answer (its defaulting suspends a queued Job, its validation refuses a bad queue name) and
    its queues reconcile; the gpu-operator's ClusterPolicy is ready as a second witness."""
    item = "robust_controller"
    section = _team_queues(probe)
    if section is None:
        return Result(item, NOT_IMPLEMENTED, "Kueue is not installed (queues.teams): gpu-bootstrap proves this item "
                                             "with Kueue's webhooks and controller")
    namespace = section.teams[0].namespaces[0]
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "conformance-webhook", "namespace": namespace,
                        "labels": {kueue.QUEUE_LABEL: section.local_queue}},
           "spec": {"suspend": False, "template": {"spec": {**pause_pod("x")["spec"], "restartPolicy": "Never"}}}}
    defaulted = probe.ctx.kube.create(job, dry_run=True)
    suspended = (defaulted.get("spec") or {}).get("suspend") is True
    probe.say(f"a queued Job sent with suspend: false comes back from Kueue's defaulting webhook with suspend: "
              f"{(defaulted.get('spec') or {}).get('suspend')} (server-side dry run)")
    refused = None
    bad = dict(job, metadata=dict(job["metadata"], labels={kueue.QUEUE_LABEL: "Not_A_Queue"}))
    try:
        probe.ctx.kube.create(bad, dry_run=True)
        probe.say("a Job naming the queue Not_A_Queue was ADMITTED")
    except ClusterError as error:
        if not _admission_denied(error):
            raise
        refused = error.message
        probe.say(f"a Job naming the queue Not_A_Queue was refused: {refused}")
    queues = [q for q in probe.ctx.kube.list(kueue.API, "ClusterQueue")
              if (q["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "gpu-bootstrap"]
    active = [q["metadata"]["name"] for q in queues if condition_true(q, "Active")]
    probe.say(f"ClusterQueues of ours: {len(queues)}, Active: {', '.join(active) or 'none'}")
    policy = _cluster_policy_state(probe)
    ok = suspended and refused and queues and len(active) == len(queues)
    if not ok:
        return Result(item, NOT_IMPLEMENTED, "Kueue's webhooks or controller did not answer as they should (see the "
                                             "log)")
    return Result(item, IMPLEMENTED, (
        f"Kueue (CRDs, controller, mutating and validating webhooks): a queued Job is suspended by its defaulting "
        f"webhook, a bad queue name is refused by its validating webhook, and all {len(queues)} ClusterQueue(s) of "
        f"ours reconcile to Active; {policy}"))


CHECKS = {"driver_runtime_management": driver_runtime_management, "gpu_sharing": gpu_sharing,
          "gang_scheduling": gang_scheduling, "cluster_autoscaling": cluster_autoscaling,
          "pod_autoscaling": pod_autoscaling, "accelerator_metrics": accelerator_metrics,
          "ai_service_metrics": ai_service_metrics, "secure_accelerator_access": secure_accelerator_access,
          "robust_controller": robust_controller}


# --- helpers --------------------------------------------------------------------------------------------------------------
def _by_node(result: list[dict]) -> dict[str, int]:
    return {r["metric"].get("node", ""): int(float(r["value"][1])) for r in result}


def _covers(result: list[dict], expected: dict[str, int]) -> dict[str, int] | None:
    found = _by_node(result)
    return found if all(found.get(node, 0) >= gpus for node, gpus in expected.items()) else None


def _gpus_per_node(probe: Probe) -> dict[str, int]:
    """Physical GPUs per GPU node: GPU feature discovery's count label, else the advertised capacity."""
    found = {}
    for node in probe.ctx.kube.list("v1", "Node"):
        labels = node["metadata"].get("labels") or {}
        capacity = ((node.get("status") or {}).get("capacity") or {}).get(GPU, "0")
        count = labels.get("nvidia.com/gpu.count") or capacity
        if str(count).isdigit() and int(count) > 0:
            found[node["metadata"]["name"]] = int(count)
    return found


def _team_queues(probe: Probe):
    """The queues section when the run's queues step has teams to prove Kueue with, else None."""
    section = getattr(probe.ctx.config, "queues", None)
    return section if "queues" in probe.steps and section is not None and section.teams else None


def _admission_denied(error: ClusterError) -> bool:
    """A refusal by an admission webhook or policy, not by RBAC (both can answer 403)."""
    return "denied the request" in error.message or "ValidatingAdmissionPolicy" in error.message


def _toolkit_setting(probe: Probe) -> str:
    for policy in _cluster_policies(probe):
        env = {e.get("name"): e.get("value") for e in ((policy.get("spec") or {}).get("toolkit") or {}).get("env")
               or []}
        value = env.get("ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED")
        probe.say(f"ClusterPolicy {policy['metadata']['name']}: the toolkit's "
                  f"ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED={value}")
        if value == "false":
            return "the container toolkit the gpu-operator installs ignores the variable in unprivileged containers"
        if not ((policy.get("spec") or {}).get("toolkit") or {}).get("enabled", True):
            return ("the container toolkit is the hosts' (the gpu-operator's is off): doctor's "
                    "nvidia-container-toolkit check warns on a node whose toolkit honours the variable")
    return "no ClusterPolicy says how the runtime treats the variable"


def _cluster_policies(probe: Probe) -> list[dict]:
    try:
        return probe.ctx.kube.list("nvidia.com/v1", "ClusterPolicy")
    except ClusterError:
        return []


def _cluster_policy_state(probe: Probe) -> str:
    states = [(p["metadata"]["name"], (p.get("status") or {}).get("state")) for p in _cluster_policies(probe)]
    probe.say(f"ClusterPolicy state: {states or 'none'}")
    return ("the gpu-operator's ClusterPolicy reconciles to " + ", ".join(f"{n}: {s}" for n, s in states)) \
        if states else "no gpu-operator ClusterPolicy to witness"


# --- the run -----------------------------------------------------------------------------------------------------------------
@dataclass
class ConformanceReport:
    items: list
    results: dict[str, Result]
    folder: Path
    problems: list[str]  # what the program's validator would say (structurally)

    @property
    def ok(self) -> bool:
        return not any(checklist.fails_the_run(item, self.results[item.id]) for item in self.items)


def run(ctx, steps: set[str], folder: Path, read_only: bool, metadata: dict, progress=None,
        within: float = WITHIN) -> ConformanceReport:
    """Every item: its check where one exists, the honest out-of-scope answer otherwise; then the documents."""
    template, items = checklist.checklist()
    namespace = None if read_only else _own_namespace(ctx)
    results: dict[str, Result] = {}
    try:
        for item in items:
            if progress is not None:
                progress(item.id)
            results[item.id] = _one(ctx, steps, item, namespace, read_only, within)
    finally:
        if namespace is not None:
            ctx.kube.delete(Ref("v1", "Namespace", namespace), propagation="Foreground")
    version = (ctx.kube.version() or {}).get("gitVersion", "")
    filled = {**{k: "" for k in checklist.METADATA_FIELDS}, **{k: v for k, v in template.items()
                                                                if not str(v).startswith("[")},
              "kubernetesVersion": ".".join(version.split(".")[:2]) if version else "", **metadata}
    return _write(folder, items, results, filled)


def _one(ctx, steps: set[str], item, namespace: str | None, read_only: bool, within: float) -> Result:
    """The item's check (an out-of-scope item's honest answer), timed, its log and junit.xml as its evidence."""
    probe = Probe(ctx, steps, namespace, read_only, within)
    started = time.monotonic()
    if item.id in OUT_OF_SCOPE:
        probe.say(f"not covered by gpu-bootstrap: {OUT_OF_SCOPE[item.id]}")
        result = Result(item.id, NOT_IMPLEMENTED, OUT_OF_SCOPE[item.id], in_scope=False)
    else:
        try:
            result = CHECKS[item.id](probe)
        except GpuBootstrapError as error:  # unknown is not a pass
            probe.say(f"could not check: {error.one_line()}")
            result = Result(item.id, NOT_IMPLEMENTED, f"could not check: {error.one_line()}")
    result.log = probe.log + result.log
    result.seconds = time.monotonic() - started
    result.evidence = [f"{item.id}.log", "junit.xml"]
    return result


def _own_namespace(ctx) -> str:
    name = NAMESPACE_PREFIX + secrets.token_hex(3)
    ctx.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(PART_OF)}})
    return name


def _write(folder: Path, items, results: dict[str, Result], metadata: dict) -> ConformanceReport:
    folder.mkdir(parents=True, exist_ok=True)
    for item in items:
        result = results[item.id]
        (folder / f"{item.id}.log").write_text(
            f"{item.id} ({item.section}, {item.level}): {result.status}\n{result.notes}\n\n" +
            "\n".join(result.log) + "\n")
    (folder / "junit.xml").write_text(checklist.junit(items, results))
    document = checklist.filled_in(metadata, items, results)
    (folder / CHECKLIST_FILE).write_text(checklist.as_yaml(document))
    present = {p.name for p in folder.iterdir()}
    return ConformanceReport(items, results, folder, checklist.structural_problems(document, items, present))
