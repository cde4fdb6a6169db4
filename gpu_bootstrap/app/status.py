"""`gpu-bootstrap status`: where the GPUs are, who holds them, why GPU pods wait, and how fragmented the free GPUs
are, read from the cluster in three paginated list calls (nodes, pods, FailedScheduling events), plus, for the
utilisation columns, the Services (to find Prometheus) and one query through the API server's service proxy, and the
server's version for --defrag.

Read-only, and independent of what gpu-bootstrap installed: any cluster whose nodes advertise nvidia.com/* resources
(or carry the GPU feature discovery's nvidia.com/gpu.present label) is shown. The fragmentation figures and the
--defrag plan come from the simulator's code (sim/fragmentation.py) over the same snapshot `simulate --from-cluster`
reads (sim/trace.cluster_inventory), so the two always agree. The JSON document is a contract (API_VERSION,
docs/status-and-simulate.md): fields are added, never renamed or removed, within one version.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import gc
from dataclasses import dataclass, field

from gpu_bootstrap.core.objects import parse_time

API_VERSION = "gpu-bootstrap.io/status/v1"
GPU = "nvidia.com/gpu"
PREFIX = "nvidia.com/"
PRODUCT_LABEL = "nvidia.com/gpu.product"
PRESENT_LABEL = "nvidia.com/gpu.present"
MEMORY_LABEL = "nvidia.com/gpu.memory"  # GPU feature discovery: MiB per GPU
COMPUTE_LABELS = ("nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor")
DAEMONSET = "DaemonSet"
DONE = ("Succeeded", "Failed")  # pods in these phases hold nothing


@dataclass
class Snapshot:
    """What one `status` read: every node, pod and FailedScheduling event, listed once. `list` answers the way the
    Kubernetes adapter does, so the simulator's cluster_inventory reads this snapshot instead of the API."""

    nodes: list[dict]
    pods: list[dict]
    events: list[dict] | None  # None: they could not be read (unknown, not "no events")
    host: str = ""
    notes: list[str] = field(default_factory=list)
    taken: _dt.datetime = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc))

    def list(self, api_version: str, kind: str, *_args, **_kwargs) -> list[dict]:
        return {"Node": self.nodes, "Pod": self.pods, "Event": self.events or []}[kind]


def read(kube) -> Snapshot:
    """Three list calls, paginated by the adapter (500 a page); no per-node or per-pod request. Nodes and pods are
    the figures (without them there is no status); events only explain, so a refusal to list them is a note."""
    from gpu_bootstrap.core.errors import ClusterError, Unreachable
    nodes = kube.list("v1", "Node")
    pods = kube.list("v1", "Pod")
    notes = []
    try:
        events = kube.list("v1", "Event", field_selector="reason=FailedScheduling")
    except Unreachable:
        raise
    except ClusterError as error:
        events = None
        notes.append(f"scheduling events could not be read ({error.message}): pending pods show their PodScheduled "
                     f"condition only")
    from gpu_bootstrap.core import dra
    nodes, pods = dra.counted(kube, nodes, pods, notes)
    return Snapshot(nodes, pods, events, kube.host, notes=notes)



# --- quantities and requests ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> float:
    from gpu_bootstrap.sim.trace import quantity as parse
    try:
        return parse(text)
    except (TypeError, ValueError):
        return 0.0  # not a quantity the API server would have accepted: counts as nothing


def quantity(value) -> float:
    """A Kubernetes quantity in base units; a cluster repeats a few dozen values, so each is parsed once."""
    return _parsed(str(value))


def pod_requests(pod: dict) -> dict[str, float]:
    """What the scheduler counts for a pod: per resource, the larger of the containers' sum and the largest init
    container (a container's limits stand in for requests it does not give), plus the pod's overhead."""
    spec = pod.get("spec") or {}

    def of(container: dict) -> dict[str, float]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: quantity(amount) for name, amount in merged.items()}

    total: dict[str, float] = {}
    for container in spec.get("containers") or []:
        for name, amount in of(container).items():
            total[name] = total.get(name, 0.0) + amount
    for init in spec.get("initContainers") or []:
        for name, amount in of(init).items():
            total[name] = max(total.get(name, 0.0), amount)
    for name, amount in (spec.get("overhead") or {}).items():
        total[name] = total.get(name, 0.0) + quantity(amount)
    return total


def nvidia(resources: dict) -> dict[str, int]:
    """The nvidia.com/* resources among `resources` (whole GPUs, MIG slices, shared GPUs), as integers."""
    return {name: int(quantity(amount)) for name, amount in sorted(resources.items())
            if name.startswith(PREFIX) and quantity(amount)}


def holds(pod: dict) -> bool:
    """Bound to a node and not finished: its requests count against the node."""
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get("phase") not in DONE


def waits(pod: dict) -> bool:
    return not (pod.get("spec") or {}).get("nodeName") and (pod.get("status") or {}).get("phase") not in DONE


def _key(pod: dict) -> str:
    return f"{pod['metadata'].get('namespace', '')}/{pod['metadata']['name']}"


def _age(stamp: str | None, now: _dt.datetime) -> int | None:
    created = parse_time(stamp)
    return None if created is None else max(int((now - created).total_seconds()), 0)


# --- the document -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    scheduler: str  # our scheduler's name (the config's scheduler.name)
    taint_key: str | None  # node-prep's taint key (None: the config taints nothing)
    namespace: str | None = None  # --namespace: pods, namespaces and pending pods of this namespace only


def document(snapshot: Snapshot, settings: Settings) -> dict:
    """The `status -o json` document (docs/status-and-simulate.md lists every field)."""
    requests = {_key(p): pod_requests(p) for p in snapshot.pods}
    gpu_nodes = [n for n in snapshot.nodes if _is_gpu_node(n)]
    by_node: dict[str, list[dict]] = {}
    for pod in snapshot.pods:
        if holds(pod):
            by_node.setdefault(pod["spec"]["nodeName"], []).append(pod)
    nodes = [_node_row(n, by_node.get(n["metadata"]["name"], []), requests, settings) for n in gpu_nodes]
    gpu_names = {n["metadata"]["name"] for n in gpu_nodes}
    shown = [p for p in snapshot.pods
             if settings.namespace is None or p["metadata"].get("namespace") == settings.namespace]
    pods = [_pod_row(p, requests[_key(p)], settings, snapshot.taken) for p in shown
            if holds(p) and nvidia(requests[_key(p)])]
    events: dict[tuple, list[dict]] = {}
    for event in snapshot.events or []:
        about = event.get("involvedObject") or {}
        events.setdefault((about.get("namespace"), about.get("name")), []).append(event)
    pending = [_pending_row(p, requests[_key(p)], settings, snapshot.taken, events) for p in shown
               if waits(p) and nvidia(requests[_key(p)])]
    runs = scheduler_runs(snapshot.pods, settings.scheduler)
    stranded = [p for p in pending if p["ours"]]
    for row in stranded:
        row["scheduler_running"], row["stale"] = runs, not runs
    notes = list(snapshot.notes)
    if stranded and not runs:
        notes.append(f"the scheduler {settings.scheduler} does not run (no ready pod of it in the cluster): "
                     f"{len(stranded)} pending GPU pod(s) name it and nothing will schedule them; their reasons are "
                     f"from before it stopped (stale). Run `gpu-bootstrap up` (binpack-scheduler), or have those pods "
                     f"name another scheduler")
    return {
        "apiVersion": API_VERSION, "cluster": snapshot.host,
        "time": snapshot.taken.strftime("%Y-%m-%dT%H:%M:%SZ"), "scheduler": settings.scheduler,
        "namespace": settings.namespace,
        "totals": _totals(nodes, pods, pending),
        "nodes": sorted(nodes, key=lambda n: n["name"]),
        "namespaces": _namespaces(pods, pending),
        "pods": sorted(pods, key=lambda p: (p["namespace"], p["name"])),
        "pending": sorted(pending, key=lambda p: (p["namespace"], p["name"])),
        "fragmentation": fragmentation(snapshot, requests),
        "utilisation": None,
        "other_nodes_with_gpu_pods": sorted({p["node"] for p in pods} - gpu_names),
        "events_read": snapshot.events is not None,
        "scheduler_running": runs,
        "notes": notes,
    }


def scheduler_runs(pods: list[dict], name: str) -> bool:
    """Does the bin-packing scheduler `name` run: a Running, Ready pod of the Deployment up makes (its labels,
    render/scheduler.py)? Read from every pod of the cluster, which status lists anyway."""
    from gpu_bootstrap.render.scheduler import MANAGED
    wanted = {"app.kubernetes.io/name": name, **MANAGED}
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        status = pod.get("status") or {}
        if all(labels.get(k) == v for k, v in wanted.items()) and status.get("phase") == "Running" and \
                any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
            return True
    return False


def _is_gpu_node(node: dict) -> bool:
    status = node.get("status") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    return bool(nvidia(status.get("allocatable") or {}) or nvidia(status.get("capacity") or {})) or \
        labels.get(PRESENT_LABEL) == "true"


def _ready(node: dict) -> bool | None:
    """True/False from the Ready condition; None when the node reports none (unknown is not "not ready")."""
    condition = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"),
                     None)
    return None if condition is None or condition.get("status") == "Unknown" else condition.get("status") == "True"


def _node_row(node: dict, on_node: list[dict], requests: dict, settings: Settings) -> dict:
    """One GPU node; `on_node`: the pods that hold resources on it."""
    name = node["metadata"]["name"]
    labels = node["metadata"].get("labels") or {}
    allocatable = nvidia((node.get("status") or {}).get("allocatable") or {})
    used: dict[str, float] = {}
    for pod in on_node:
        for resource, amount in requests[_key(pod)].items():
            used[resource] = used.get(resource, 0.0) + amount
    cpu_alloc = quantity(((node.get("status") or {}).get("allocatable") or {}).get("cpu", 0))
    mem_alloc = quantity(((node.get("status") or {}).get("allocatable") or {}).get("memory", 0))
    gpus = allocatable.get(GPU, 0)
    taints = (node.get("spec") or {}).get("taints") or []
    return {
        "name": name, "product": labels.get(PRODUCT_LABEL), "gpu_memory_mib": _whole(labels.get(MEMORY_LABEL)),
        "compute_capability": _compute_capability(labels), "ready": _ready(node),
        "schedulable": not (node.get("spec") or {}).get("unschedulable", False),
        "tainted": any(t.get("key") == settings.taint_key for t in taints) if settings.taint_key else None,
        "gpus": {"allocatable": gpus, "requested": int(used.get(GPU, 0)), "free": gpus - int(used.get(GPU, 0))},
        "resources": {resource: {"allocatable": amount, "requested": int(used.get(resource, 0)),
                                 "free": amount - int(used.get(resource, 0))}
                      for resource, amount in allocatable.items() if resource != GPU},
        "mig_strategy": labels.get("nvidia.com/mig.strategy"),
        "sharing": _sharing(labels),
        # the gpu-operator's driver upgrade controller: upgrade-required ... upgrade-done | upgrade-failed (or None)
        "driver_upgrade": labels.get("nvidia.com/gpu-driver-upgrade-state") or None,
        # the Karpenter NodePool that launched it (it comes and goes with the pods), or None: a node of the cluster's own
        "pool": labels.get("karpenter.sh/nodepool") or None,
        "gpu_pods": sum(1 for p in on_node if nvidia(requests[_key(p)])),
        "cpu": {"allocatable_milli": int(cpu_alloc * 1000), "requested_milli": int(used.get("cpu", 0) * 1000)},
        "memory": {"allocatable_mib": int(mem_alloc / 2 ** 20), "requested_mib": int(used.get("memory", 0) / 2 ** 20)},
    }


def _whole(text: str | None) -> int | None:
    """A label's whole number, or None when it is absent or not a number (a label we cannot read says nothing)."""
    return int(text) if text and text.isdigit() else None


def _compute_capability(labels: dict) -> str | None:
    """'8.0' from GPU feature discovery's compute major/minor labels, or None unless both are whole numbers."""
    major, minor = (_whole(labels.get(label)) for label in COMPUTE_LABELS)
    return None if major is None or minor is None else f"{major}.{minor}"


def _sharing(labels: dict) -> dict | None:
    """Time-slicing or MPS as the device plugin labels it (replicas per GPU), else None."""
    replicas = labels.get("nvidia.com/gpu.replicas")
    if not replicas or replicas in ("0", "1"):
        return None
    return {"replicas": int(quantity(replicas)), "strategy": labels.get("nvidia.com/gpu.sharing-strategy")}


def _pod_row(pod: dict, requests: dict, settings: Settings, now: _dt.datetime) -> dict:
    spec = pod.get("spec") or {}
    held = nvidia(requests)
    scheduler = spec.get("schedulerName", "default-scheduler")
    return {"namespace": pod["metadata"].get("namespace", ""), "name": pod["metadata"]["name"],
            "node": spec.get("nodeName"), "phase": (pod.get("status") or {}).get("phase", "Pending"),
            "gpus": held.get(GPU, 0), "resources": {k: v for k, v in held.items() if k != GPU},
            "scheduler": scheduler, "ours": scheduler == settings.scheduler,
            "created": pod["metadata"].get("creationTimestamp"),
            "age_seconds": _age(pod["metadata"].get("creationTimestamp"), now),
            "owner": next((o.get("kind") for o in pod["metadata"].get("ownerReferences") or []
                           if o.get("controller")), None)}


def _pending_row(pod: dict, requests: dict, settings: Settings, now: _dt.datetime, events: dict) -> dict:
    row = _pod_row(pod, requests, settings, now)
    condition = next((c for c in (pod.get("status") or {}).get("conditions") or []
                      if c.get("type") == "PodScheduled"), None)
    row.update(reason=(condition or {}).get("reason"), message=(condition or {}).get("message"),
               event=_latest_event(pod, events.get((pod["metadata"].get("namespace"), pod["metadata"]["name"]), [])))
    return row


def _latest_event(pod: dict, events: list[dict]) -> dict | None:
    """The pod's newest FailedScheduling event among `events` (its own; matched by uid when the event names one,
    so an earlier pod of the same name does not count)."""
    mine = [e for e in events if (e.get("involvedObject") or {}).get("uid") in (None, "", pod["metadata"].get("uid"))]
    if not mine:
        return None
    newest = max(mine, key=_event_time)
    return {"reason": newest.get("reason"), "message": newest.get("message"), "count": newest.get("count") or 1,
            "time": _event_stamp(newest), "from": (newest.get("source") or {}).get("component") or
            newest.get("reportingComponent")}


def _event_stamp(event: dict) -> str | None:
    return event.get("lastTimestamp") or event.get("eventTime") or \
        (event.get("series") or {}).get("lastObservedTime") or event.get("firstTimestamp")


def _event_time(event: dict) -> _dt.datetime:
    return parse_time(_event_stamp(event)) or _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)


def _totals(nodes: list[dict], pods: list[dict], pending: list[dict]) -> dict:
    return {"gpu_nodes": len(nodes),
            "gpus_allocatable": sum(n["gpus"]["allocatable"] for n in nodes),
            "gpus_requested": sum(n["gpus"]["requested"] for n in nodes),
            "gpus_free": sum(n["gpus"]["free"] for n in nodes),
            "gpu_pods": len(pods), "pending_gpu_pods": len(pending),
            "pending_gpus": sum(p["gpus"] for p in pending)}


def _namespaces(pods: list[dict], pending: list[dict]) -> list[dict]:
    rows: dict[str, dict] = {}
    for pod in pods:
        row = rows.setdefault(pod["namespace"], _empty_namespace(pod["namespace"]))
        row["gpu_pods"] += 1
        row["gpus"] += pod["gpus"]
        row["schedulers"][pod["scheduler"]] = row["schedulers"].get(pod["scheduler"], 0) + 1
        for resource, amount in pod["resources"].items():
            row["resources"][resource] = row["resources"].get(resource, 0) + amount
    for pod in pending:
        row = rows.setdefault(pod["namespace"], _empty_namespace(pod["namespace"]))
        row["pending_pods"] += 1
        row["pending_gpus"] += pod["gpus"]
    return [rows[name] for name in sorted(rows)]


def _empty_namespace(name: str) -> dict:
    return {"name": name, "gpu_pods": 0, "gpus": 0, "resources": {}, "schedulers": {}, "pending_pods": 0,
            "pending_gpus": 0}


# --- fragmentation, by the simulator's code ---------------------------------------------------------------------------
def inventory(snapshot: Snapshot):
    """(nodes, used) exactly as `simulate --from-cluster` reads them, from this snapshot."""
    from gpu_bootstrap.sim.trace import cluster_inventory
    return cluster_inventory(snapshot)


def fragmentation(snapshot: Snapshot, requests: dict) -> dict:
    """simulate's measures over the schedulable nodes; the smallest GPU pod (bound or waiting) sets what a node
    needs left to use a free GPU."""
    from gpu_bootstrap.sim import fragmentation as frag
    nodes, used = inventory(snapshot)
    gpu_pods = [_simulated(requests[_key(pod)]) for pod in snapshot.pods
                if (holds(pod) or waits(pod)) and requests[_key(pod)].get(GPU)]
    return frag.measures([n for n in nodes if n.gpus], used, frag.smallest_request(gpu_pods))


# --- --defrag ---------------------------------------------------------------------------------------------------------
def defrag(snapshot: Snapshot, profile, pending: list[dict]) -> dict:
    """Which nodes to drain (and where their pods would go, by the packing of `profile`) so that the pending GPU
    requests, or else one request as large as the largest node, find a whole node. A plan only: nothing is evicted."""
    from gpu_bootstrap.sim import fragmentation as frag
    from gpu_bootstrap.sim.affinity import from_pod_spec
    nodes, used = inventory(snapshot)
    gpu_nodes = [n for n in nodes if n.gpus]
    waiting = {_key(pod): pod for pod in snapshot.pods if waits(pod)}
    wanted = [(p["gpus"], _affinity_of(waiting.get(f"{p['namespace']}/{p['name']}"))) for p in pending if p["gpus"]] \
        or [max((n.gpus for n in gpu_nodes), default=0)]
    movable: dict[str, list] = {}
    pinned: dict[str, str] = {}
    for pod in snapshot.pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not holds(pod) or node is None:
            continue
        owner = next((o.get("kind") for o in pod["metadata"].get("ownerReferences") or [] if o.get("controller")),
                     None)
        if owner == DAEMONSET:
            continue  # stays (a drain leaves DaemonSet pods), and holds no GPU the plan moves
        asked = pod_requests(pod)
        if owner is None:
            pinned.setdefault(node, f"{_key(pod)} has no controller to re-create it")
        elif not asked.get(GPU) and nvidia(asked):
            pinned.setdefault(node, f"{_key(pod)} holds {', '.join(nvidia(asked))}")
        elif not asked.get(GPU):
            pinned.setdefault(node, f"{_key(pod)} is a CPU-only pod the plan does not place")
        else:
            try:  # re-created, it may only go where its required node affinity lets it
                affinity = from_pod_spec(pod.get("spec") or {})
            except ValueError as why:
                pinned.setdefault(node, f"{_key(pod)}: {why}")
                continue
            movable.setdefault(node, []).append((_key(pod), _simulated(asked, affinity)))
    plan = frag.defrag(gpu_nodes, used or {}, movable, wanted, profile, pinned)
    document = plan.to_json()
    document["profile"] = profile.name
    document["commands"] = [line for drain in plan.drains for line in _commands(drain)]
    return document


def _affinity_of(pod: dict | None):
    """A pending pod's required node affinity for the plan: the node freed for it must be one it may use. A
    constraint the model cannot express (matchFields) is left out: the plan may then free a node the pod cannot take."""
    from gpu_bootstrap.sim.affinity import from_pod_spec
    try:
        return from_pod_spec((pod or {}).get("spec") or {})
    except ValueError:
        return None


def _simulated(asked: dict, affinity=None):
    """A pod's requests (this module's units: cores, bytes) as the simulator's Pod (millicores, MiB, GPUs)."""
    from gpu_bootstrap.sim.engine import Pod
    return Pod(int(asked.get("cpu", 0) * 1000), int(asked.get("memory", 0) / 2 ** 20), int(asked[GPU]),
               affinity=affinity)


def _commands(drain) -> list[str]:
    """What an admin would run to carry out one drain (we run none of it): cordon and evict through the Eviction
    API (PodDisruptionBudgets apply), then make the emptied node schedulable again for the waiting request."""
    return [f"kubectl drain {drain.node} --ignore-daemonsets --delete-emptydir-data",
            f"kubectl uncordon {drain.node}  # once its {len(drain.moves)} re-created pod(s) run elsewhere"]



# --- utilisation, from Prometheus through the API server's service proxy ----------------------------------------------
UTIL_QUERY = 'avg_over_time(DCGM_FI_DEV_GPU_UTIL{{pod!=""}}[{window}])'


def find_prometheus(kube, given: str | None, configured=None) -> tuple[str, str, str] | None:
    """(namespace, service, port) of a Prometheus: --prometheus NAMESPACE/SERVICE[:PORT], else the config's (the
    Service `rbac --for status` lets the status role proxy to) when it exists, else the Service the Prometheus
    Operator puts in front of one (what the monitoring step installs or attaches to)."""
    if given:
        namespace, _, rest = given.partition("/")
        name, _, port = rest.partition(":")
        return namespace, name, port or "9090"
    services = kube.list("v1", "Service")
    if configured is not None and any((s["metadata"].get("namespace"), s["metadata"]["name"]) ==
                                      (configured.namespace, configured.service) for s in services):
        return configured.namespace, configured.service, configured.port
    for service in services:
        selector = (service.get("spec") or {}).get("selector") or {}
        labels = service["metadata"].get("labels") or {}
        if "operator.prometheus.io/name" in selector or service["metadata"]["name"] == "prometheus-operated" or \
                labels.get("app.kubernetes.io/name") == "prometheus":
            ports = (service.get("spec") or {}).get("ports") or []
            port = next((p for p in ports if p.get("name") in ("http-web", "web")), ports[0] if ports else {})
            return service["metadata"]["namespace"], service["metadata"]["name"], \
                str(port.get("name") or port.get("port") or 9090)
    return None


def utilisation(kube, prometheus: str | None, window: str, idle_below: float, configured=None) -> dict:
    """Mean utilisation per GPU a pod holds over `window` (the DCGM exporter's DCGM_FI_DEV_GPU_UTIL with its
    namespace/pod attribution); a GPU below `idle_below` percent is allocated but idle. Never fails `status`: an
    unreachable Prometheus is a note."""
    from gpu_bootstrap.core.errors import GpuBootstrapError
    base = {"window": window, "idle_below_pct": idle_below, "prometheus": None, "gpus": [], "idle": [], "pods": [],
            "note": ""}
    try:
        proxy = find_prometheus(kube, prometheus, configured)
        if proxy is None:
            return {**base, "note": "no Prometheus found (pass --prometheus NAMESPACE/SERVICE[:PORT])"}
        namespace, service, port = proxy
        base["prometheus"] = f"{namespace}/{service}:{port}"
        answer = kube.request("GET", f"/api/v1/namespaces/{namespace}/services/{service}:{port}/proxy/api/v1/query",
                              {"query": UTIL_QUERY.format(window=window)})
    except GpuBootstrapError as error:
        return {**base, "note": f"Prometheus could not be queried through the API server's service proxy: "
                                f"{error.message}"}
    if answer.get("status") != "success":
        return {**base, "note": f"Prometheus refused the query: {answer.get('error', answer)}"}
    rows = []
    for series in (answer.get("data") or {}).get("result") or []:
        labels, mean = series.get("metric") or {}, float(series["value"][1])
        rows.append({"namespace": labels.get("namespace", ""), "pod": labels.get("pod", ""),
                     "node": labels.get("node") or labels.get("Hostname") or labels.get("hostname"),
                     "gpu": labels.get("gpu", "") if not labels.get("UUID") else f"{labels.get('gpu', '')} "
                                                                                  f"{labels['UUID'][:12]}".strip(),
                     "uuid": labels.get("UUID"), "mean_pct": round(mean, 2), "idle": mean < idle_below})
    rows.sort(key=lambda r: (r["namespace"], r["pod"], r["gpu"]))
    note = "" if rows else "no DCGM_FI_DEV_GPU_UTIL series with a pod label in the window"
    return {**base, "gpus": rows, "idle": [r for r in rows if r["idle"]], "pods": _per_pod(rows), "note": note}


def _per_pod(rows: list[dict]) -> list[dict]:
    """Utilisation per pod: the mean over its GPUs, and how many of them are idle."""
    pods: dict[tuple, list[dict]] = {}
    for row in rows:
        pods.setdefault((row["namespace"], row["pod"]), []).append(row)
    return [{"namespace": namespace, "pod": pod, "node": held[0]["node"], "gpus": len(held),
             "mean_pct": round(sum(r["mean_pct"] for r in held) / len(held), 2),
             "idle_gpus": sum(1 for r in held if r["idle"])} for (namespace, pod), held in pods.items()]


# --- the command ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StatusOptions:
    by: str = "node"
    namespace: str | None = None
    defrag: bool = False
    prometheus: str | None = None  # NAMESPACE/SERVICE[:PORT]; None: found by its Service
    utilisation: bool = True
    window: str = "1h"
    idle_below: float = 5.0


def validate(options: StatusOptions) -> None:
    import re

    from gpu_bootstrap.core.errors import UsageError
    if not re.fullmatch(r"([0-9]+(ms|s|m|h|d|w|y))+", options.window):
        raise UsageError(f"--window {options.window!r}: a Prometheus duration, e.g. 30m, 1h, 1d")
    if not 0 < options.idle_below <= 100:
        raise UsageError(f"--idle-below {options.idle_below:g}: a percentage above 0, up to 100")
    if options.prometheus is not None and not re.fullmatch(r"[a-z0-9-]+/[a-z0-9.-]+(:[A-Za-z0-9-]+)?",
                                                           options.prometheus):
        raise UsageError(f"--prometheus {options.prometheus!r}: expected NAMESPACE/SERVICE[:PORT]",
                         "e.g. monitoring/prometheus-operated:9090")


def collect(kube, options: StatusOptions, sections) -> dict:
    """One status document from the live cluster: the snapshot, optionally utilisation and the --defrag plan."""
    taint = sections.node_prep.taint
    settings = Settings(sections.scheduler.name, taint.key if taint else None, options.namespace)
    before = kube.requests
    with _without_cycle_collection():
        snapshot = read(kube)
        result = document(snapshot, settings)
    if options.utilisation:
        from gpu_bootstrap.security.rbac import prometheus_service
        result["utilisation"] = utilisation(kube, options.prometheus, options.window, options.idle_below,
                                            prometheus_service(sections))
    from gpu_bootstrap.app import status_pools
    status_pools.annotate(result["pending"], {(p["metadata"].get("namespace", ""), p["metadata"]["name"]): p
                                              for p in snapshot.pods}, status_pools.read(kube))
    if (note := _outgrown(kube, sections, snapshot.nodes)) is not None:
        result["notes"].append(note)
    from gpu_bootstrap.app.status_queues import queues
    if (found := queues(kube)) is not None:
        result["queues"] = found
    if options.defrag:
        result["defrag"] = defrag(snapshot, _profile(kube, sections.scheduler, len(snapshot.nodes)),
                                  result["pending"])
    result["requests"] = kube.requests - before  # API requests this document took (attempts, retries included)
    return result


def _outgrown(kube, sections, nodes: list[dict]) -> str | None:
    """A note when the running bin-packing scheduler scores every node of a cluster that grew past what that suits
    (render.scheduler.outgrown); None when it fits, or its config cannot be read (status shows what it can)."""
    import yaml
    from gpu_bootstrap.core.errors import ClusterError, Unreachable
    from gpu_bootstrap.render import scheduler as render
    settings = sections.scheduler
    try:
        live = kube.get("v1", "ConfigMap", f"{settings.name}-config", settings.namespace)
        percentage = (yaml.safe_load(((live or {}).get("data") or {}).get(render.CONFIG_FILE) or "") or {}).get(
            "percentageOfNodesToScore")
    except Unreachable:
        raise
    except (ClusterError, yaml.YAMLError, AttributeError):
        return None
    count = render.nodes_to_plan_for(nodes, getattr(sections, "pools", None) or [])
    problem = render.outgrown(settings, percentage, count)
    return f"{settings.name}: {problem}" if problem else None


@contextlib.contextmanager
def _without_cycle_collection():
    """Decoding a large cluster's lists makes millions of objects, and the cycle collector would walk every one of
    them again and again while they accumulate (0.4 s of 1.9 s on 10,000 pods). JSON makes no reference cycles:
    reference counting frees all of it, so the collector is paused for the read and resumed after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _profile(kube, scheduler, node_count: int):
    """The bin-packing profile `up` deploys (the config's scheduler section) on a cluster of `node_count` nodes, as
    the simulator scores it."""
    from gpu_bootstrap.render import scheduler as render
    from gpu_bootstrap.sim import scoring
    from gpu_bootstrap.core.versions import DEFAULT_KUBE_VERSION, server_version
    version = server_version(kube.version()) or DEFAULT_KUBE_VERSION
    return scoring.profile_from_config(render.scheduler_configuration(scheduler, version, node_count), 0, version)
