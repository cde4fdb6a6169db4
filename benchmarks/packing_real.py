#!/usr/bin/env python3
"""GPU packing measured on the real kube-scheduler: the openb trace's track A replayed as real pods, one at a time,
against kube-scheduler built by scripts/install-test-tools, then the same arrivals through `simulate`'s model.

    python benchmarks/packing_real.py --quick                 # 1 seed, 150 sampled nodes: about 2 minutes here
    python benchmarks/packing_real.py [--seeds 5] [--nodes-sample N] [--profiles a,b] [--json FILE] [--markdown]
    python benchmarks/packing_real.py --real-from FILE.json   # only the model again, against saved real figures
    python benchmarks/packing_real.py --dra [--quick]         # the GPUs served through DRA instead (1.37)
    python benchmarks/packing_real.py --dra --claims [--quick]  # and each pod's GPUs from its own ResourceClaim

Protocol (benchmarks/packing_openb.py, ../shared/notes/packing-benchmark.md): whole-GPU pods of the openb pod list
drawn with replacement until their GPU requests reach 130 % of the nodes' GPUs, in that random order, no departures;
seeds 42, 43, ... as `simulate`. Each pod is a real bare pod (its cpu, memory and nvidia.com/gpu requests) created
on a real control plane (etcd and kube-apiserver, tests/localcluster); the benchmark waits until kube-scheduler binds
it or reports it unschedulable (an unschedulable pod is then deleted, so a later retry cannot take capacity: the
protocol is the simulator's online one) before the next. The nodes are Node objects with the openb nodes' cpu,
memory and GPUs (no kubelet: nothing needs to run, only to be placed). kube-scheduler is started afresh for every
(profile, seed) once the last run's pods are gone, with one profile: kube-scheduler's default (no plugin
configuration, adaptive percentageOfNodesToScore), or one rendered by gpu-bootstrap's own renderer
(render/scheduler.py) from a `scheduler:` config section, exactly what `up` deploys; preemption is turned off in
both (every pod has the same priority, so it never finds a victim and only costs time). The model reads its profile
from that same rendered configuration (sim.scoring.profile_from_config) and scores as the cluster's kube-scheduler.

Per profile and seed: GPUs allocated at 100 % and 130 % arrived, GPUs stranded on nodes whose cpu or memory can no
longer take the smallest GPU pod (at 100 %), pods placed per second on the real scheduler; then the model's figures
for the same arrivals and the difference. Counted by the same code for both (sim.replay with the real scheduler as
its placer). Ties between equally scored nodes are broken at random by both, so single seeds differ by chance;
compare medians over seeds.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_bootstrap.core.config import SchedulerConfig  # noqa: E402
from gpu_bootstrap.render import scheduler as render  # noqa: E402
from gpu_bootstrap.sim import FIRST_SEED, replay, scoring, trace  # noqa: E402
from gpu_bootstrap.sim.engine import Node, Pod  # noqa: E402

NAMESPACE = "packing"
GPU = "nvidia.com/gpu"
QUICK_NODES = 150
WAIT_PER_POD = 120  # seconds; the first pod of a run also waits for the scheduler's start

# The profiles compared: kube-scheduler's default, and `scheduler:` sections as a user writes them.
RTCR_GPU = {"strategy": "RequestedToCapacityRatio", "resource_weights": {GPU: 100},
            "balanced_allocation_resources": ["cpu", "memory", GPU], "percentage_of_nodes_to_score": 100}
PROFILES: dict[str, dict | None] = {
    "kube-default": None,
    "mostalloc-gpu": {"strategy": "MostAllocated", "resource_weights": {GPU: 100}, "fit_weight": 1,
                      "balanced_allocation_weight": 0, "percentage_of_nodes_to_score": 100},
    "rtcr-50:1-w2:1": {**RTCR_GPU, "shape": [{"utilization": 0, "score": 0}, {"utilization": 50, "score": 1},
                                             {"utilization": 100, "score": 10}],
                       "fit_weight": 2, "balanced_allocation_weight": 1},
    "rtcr-50:1-w3:1": {**RTCR_GPU, "shape": [{"utilization": 0, "score": 0}, {"utilization": 50, "score": 1},
                                             {"utilization": 100, "score": 10}],
                       "fit_weight": 3, "balanced_allocation_weight": 1},
    "rtcr-50:2-w1:2": {**RTCR_GPU, "shape": [{"utilization": 0, "score": 0}, {"utilization": 50, "score": 2},
                                             {"utilization": 100, "score": 10}],
                       "fit_weight": 1, "balanced_allocation_weight": 2},
    "rtcr-60:1-w3:2": {**RTCR_GPU, "shape": [{"utilization": 0, "score": 0}, {"utilization": 60, "score": 1},
                                             {"utilization": 100, "score": 10}],
                       "fit_weight": 3, "balanced_allocation_weight": 2},
    "rtcr-75:2-w1:3": {**RTCR_GPU, "shape": [{"utilization": 0, "score": 0}, {"utilization": 75, "score": 2},
                                             {"utilization": 100, "score": 10}],
                       "fit_weight": 1, "balanced_allocation_weight": 3},
}
# kube-scheduler's default, gpu-bootstrap's default until #32, its default before 1.36 (since the shape benchmark:
# w3:1, which packs light GPU pods too; w2:1 before it) and from 1.36 (the default of a full run too)
QUICK_PROFILES = ("kube-default", "mostalloc-gpu", "rtcr-50:1-w3:1", "rtcr-50:2-w1:2")
# --kube-scheduler: which real kube-scheduler places the pods (tests/localcluster/cluster.binaries())
SCHEDULERS = {"1.37": "kube-scheduler", "1.35": "kube-scheduler-1.35"}
scheduler_binary = SCHEDULERS["1.37"]
# --dra: the nodes advertise no nvidia.com/gpu; NVIDIA's DRA driver's ResourceSlices and DeviceClass (with
# extendedResourceName, tests/localcluster/dra.py) serve it, and the pods ask nvidia.com/gpu as before
dra_mode = False
# --claims (with --dra): each pod asks for its GPUs through a ResourceClaim of its own (count N of gpu.nvidia.com),
# as NVIDIA's DRA examples write pods, instead of nvidia.com/gpu. kube-scheduler scores no devices for explicit
# claims (KEP-4970 is open): NodeResourcesFit sees only the pod's cpu and memory, and DRA takes the first devices that
# fit. The model ("sim") columns still score the GPU, as for the extended resource: the packing the claims forgo.
claims_mode = False


def scheduler_config(name: str, kubeconfig: Path) -> dict:
    """The KubeSchedulerConfiguration for one benchmark run: the profile named `name`, our client settings."""
    settings = settings_of(name)
    if settings is None:
        config = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                  "profiles": [{"schedulerName": "default-scheduler"}]}
    else:
        config = render.scheduler_configuration(SchedulerConfig(**settings), scheduler_version(),
                                                dra_classes=dra_classes())
    # Preemption looks for lower-priority pods to evict for every unschedulable pod; all pods here have the same
    # priority, so it never finds any and only costs time (most of the scheduler's, once the nodes fill up).
    config["profiles"][0].setdefault("plugins", {})["postFilter"] = {"disabled": [{"name": "DefaultPreemption"}]}
    # The API client's rate limit (50/s by default) would cap pods per second; it does not change where pods go.
    config["clientConnection"] = {"kubeconfig": str(kubeconfig), "qps": 5000, "burst": 5000}
    config["leaderElection"] = {"leaderElect": False}
    return config


def settings_of(name: str) -> dict | None:
    """Profile `name`'s `scheduler:` section; with --dra without the GPU in BalancedAllocation, as `up` requires
    there (render.for_cluster: kube-scheduler 1.37 crashes balancing a DRA-backed resource)."""
    settings = PROFILES[name]
    if settings is None or not dra_mode or GPU not in settings.get("balanced_allocation_resources", ()):
        return settings
    return {**settings, "balanced_allocation_resources": [r for r in settings["balanced_allocation_resources"]
                                                          if r != GPU]}


def dra_classes() -> tuple[str, ...]:
    """The DeviceClasses serving nvidia.com/gpu, as `up` reads them (render.for_cluster): --dra's one, or none."""
    from tests.localcluster import dra
    return (dra.GPU_CLASS,) if dra_mode else ()


def scheduler_version() -> str:
    """The version of the kube-scheduler that places the pods (--kube-scheduler)."""
    from tests.localcluster.cluster import gomod_version
    component = "kubernetes" if scheduler_binary == "kube-scheduler" else scheduler_binary
    return gomod_version(component, "k8s.io/kubernetes").removeprefix("v")


def model_profile(name: str, kube_version: str) -> scoring.Profile:
    """`simulate`'s model of profile `name` as kube-scheduler `kube_version` scores it."""
    settings = settings_of(name)
    if settings is None:
        return dataclasses.replace(scoring.DEFAULT_PROFILE,
                                   balanced_by_change=scoring.balanced_by_change(kube_version))
    return scoring.profile_from_config(render.scheduler_configuration(SchedulerConfig(**settings), kube_version,
                                                                      dra_classes=dra_classes()), 0, kube_version)


# --- nodes ---

def stratified_sample(nodes: list[Node], count: int | None) -> list[Node]:
    """`count` nodes in the proportions of each (GPU count, model) stratum (largest remainder; every stratum gets
    one where `count` allows), taken evenly spaced from the stratum sorted by cpu and memory, so the sizes within a
    stratum are spread too; all nodes when count is None or not smaller."""
    if count is None or count >= len(nodes):
        return list(nodes)
    strata: dict[tuple, list[Node]] = collections.defaultdict(list)
    for node in nodes:
        strata[(node.gpus, node.model)].append(node)
    keys = sorted(strata, key=lambda k: (-len(strata[k]), k))
    exact = {k: count * len(strata[k]) / len(nodes) for k in keys}
    floor = 1 if count >= len(keys) else 0
    share = {k: max(floor, int(exact[k])) for k in keys}
    for key in sorted(keys, key=lambda k: exact[k] - int(exact[k]), reverse=True):
        if sum(share.values()) >= count:
            break
        share[key] += 1
    while sum(share.values()) > count:  # the "at least one" rule overshot: take back from the largest strata
        share[max((k for k in keys if share[k] > 1), key=lambda k: share[k])] -= 1
    chosen = []
    for key in keys:
        members = sorted(strata[key], key=lambda n: (n.cpu, n.memory, n.name))
        if share[key]:
            step = len(members) / share[key]
            chosen += [members[int(i * step + step / 2)] for i in range(share[key])]
    return sorted(chosen, key=lambda n: n.name)


def node_object(node: Node) -> dict:
    capacity = {"cpu": f"{node.cpu}m", "memory": f"{node.memory}Mi", "pods": "110", GPU: str(node.gpus),
                "ephemeral-storage": "500Gi"}
    labels = {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux", **dict(node.labels)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name, "labels": labels},
            "status": {"capacity": capacity, "allocatable": dict(capacity),
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "benchmark node (no kubelet)"}]}}


def claim_object(name: str, pod: Pod) -> dict:
    """--claims: the pod's own ResourceClaim, for its GPUs of NVIDIA's DeviceClass."""
    from tests.localcluster import dra
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name,
                                                                                      "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": dra.GPU_CLASS, "allocationMode": "ExactCount", "count": pod.gpus}}]}}}


def pod_object(name: str, pod: Pod, scheduler_name: str) -> dict:
    requests = {} if claims_mode else {GPU: str(pod.gpus)}
    if pod.cpu:  # the trace's 0 means "not set": left out, as kube-scheduler's defaults then apply
        requests["cpu"] = f"{pod.cpu}m"
    if pod.memory:
        requests["memory"] = f"{pod.memory}Mi"
    spec = {"schedulerName": scheduler_name, "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "work", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": requests, "limits": {GPU: str(pod.gpus)}}}]}
    if claims_mode:
        spec["containers"][0]["resources"] = {"requests": requests, "claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    if pod.models is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                   "values": sorted(pod.models)}]}]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


# --- the API, kept alive ---

class Api:
    """JSON over one kept-alive HTTPS connection (a new TLS handshake per pod would be most of the time)."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.connection: http.client.HTTPSConnection | None = None

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        for attempt in range(3):
            if self.connection is None:
                rest = self.cluster.admin("packing-real")
                self.connection = http.client.HTTPSConnection("127.0.0.1", self.cluster.ports["apiserver"],
                                                              context=rest.context, timeout=60)
            try:
                headers = {"Accept": "application/json", "User-Agent": "packing-real"}
                data = None
                if body is not None:
                    data = json.dumps(body)
                    headers["Content-Type"] = "application/merge-patch+json" if method == "PATCH" else \
                        "application/json"
                self.connection.request(method, path, body=data, headers=headers)
                response = self.connection.getresponse()
                text = response.read()
                if response.status == 429 or response.status >= 500:
                    time.sleep(0.5 * (attempt + 1))
                    continue
                return response.status, json.loads(text) if text else {}
            except (OSError, http.client.HTTPException):
                self.connection.close()
                self.connection = None
                if attempt == 2:
                    raise
        raise RuntimeError(f"{method} {path}: the API server kept refusing")


class Outcomes:
    """One watch on the namespace's pods in a thread: which pod was bound where, which was found unschedulable."""

    def __init__(self, cluster, resource_version: str):
        self.cluster = cluster
        self.found: dict[str, tuple[str, str]] = {}
        self.changed = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self._follow, args=(resource_version,), daemon=True)
        self.thread.start()

    def _follow(self, resource_version: str) -> None:
        rest = self.cluster.admin("packing-real-watch")
        while not self.stopped:
            try:
                for kind, pod in rest.watch(f"/api/v1/namespaces/{NAMESPACE}/pods", resource_version, timeout=300):
                    resource_version = pod["metadata"].get("resourceVersion", resource_version)
                    if kind in ("ADDED", "MODIFIED"):
                        self._note(pod)
            except Exception as error:  # noqa: BLE001 - the watch ended (expired or reset): start another one
                if "410" in str(error):
                    resource_version = rest.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["metadata"][
                        "resourceVersion"]
                time.sleep(0.2)

    def _note(self, pod: dict) -> None:
        name = pod["metadata"]["name"]
        outcome = None
        if pod["spec"].get("nodeName"):
            outcome = ("bound", pod["spec"]["nodeName"])
        else:
            for condition in pod.get("status", {}).get("conditions") or []:
                if condition["type"] == "PodScheduled" and condition["status"] == "False" and \
                        condition.get("reason") == "Unschedulable":
                    outcome = ("unschedulable", condition.get("message", ""))
        if outcome is not None:
            with self.changed:
                self.found[name] = outcome
                self.changed.notify_all()

    def wait(self, name: str, timeout: float) -> tuple[str, str]:
        with self.changed:
            if not self.changed.wait_for(lambda: name in self.found, timeout):
                raise RuntimeError(f"pod {name} was neither bound nor found unschedulable within {timeout:.0f} s")
            return self.found.pop(name)


class RealScheduler:
    """sim.replay's placer: every pod goes to the real kube-scheduler; the answer is booked into the model's
    cluster for counting, as engine.Scheduler.place books its own."""

    def __init__(self, cluster, api: Api, outcomes: Outcomes, scheduler_name: str, index: dict[str, int]):
        self.cluster, self.api, self.outcomes = cluster, api, outcomes
        self.scheduler_name, self.index = scheduler_name, index
        self.count = 0
        self.placed = 0
        self.seconds = 0.0

    def place(self, pod: Pod) -> int | None:
        self.count += 1
        name = f"p{self.count:05d}"
        started = time.perf_counter()
        if claims_mode:
            status, answer = self.api.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims",
                                              claim_object(name, pod))
            if status != 201:
                raise RuntimeError(f"creating claim {name} was refused ({status}): {answer.get('message', answer)}")
        status, answer = self.api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods",
                                          pod_object(name, pod, self.scheduler_name))
        if status != 201:
            raise RuntimeError(f"creating pod {name} was refused ({status}): {answer.get('message', answer)}")
        verdict, where = self.outcomes.wait(name, WAIT_PER_POD)
        self.seconds += time.perf_counter() - started
        if verdict == "unschedulable":
            self.api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}?gracePeriodSeconds=0")
            if claims_mode:  # not allocated (its pod found no node), so nothing holds it
                self.api.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{name}")
            return None
        self.placed += 1
        index = self.index[where]
        self.cluster.add(index, pod)
        return index


# --- one run ---

@dataclass
class Run:
    profile: str
    seed: int
    real: replay.Outcome
    model: replay.Outcome
    pods: int
    pods_per_second: float
    seconds: float


def clear_pods(api: Api, cluster) -> None:
    api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods?gracePeriodSeconds=0")
    rest = cluster.admin("packing-real")
    deadline = time.monotonic() + 300
    while rest.get(f"/api/v1/namespaces/{NAMESPACE}/pods", limit="1")["items"]:
        if time.monotonic() > deadline:
            raise RuntimeError("the last run's pods were not deleted within 300 s")
        time.sleep(0.2)
    if dra_mode:  # the claims kube-scheduler wrote hold their devices until deleted; with no controller-manager to
        # see their pods gone, their delete-protection finalizer is lifted here
        path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
        for claim in rest.get(path)["items"]:
            api.request("PATCH", f"{path}/{claim['metadata']['name']}", {"metadata": {"finalizers": None}})
        api.request("DELETE", path)


def start_scheduler(cluster, profile: str, folder: Path) -> str:
    from tests.localcluster.cluster import binaries
    config = scheduler_config(profile, cluster.folder / "scheduler.kubeconfig")
    path = folder / "scheduler-config.yaml"
    path.write_text(json.dumps(config))
    cluster.spawn("kube-scheduler", [str(binaries()[scheduler_binary]), f"--config={path}",
                                     "--bind-address=127.0.0.1", "--secure-port=0", "--v=1"], die_with_parent=True)
    return config["profiles"][0]["schedulerName"]


def stop_scheduler(cluster) -> None:
    from tests.localcluster.cluster import _signal_group, start_time
    import signal
    pid, started = cluster.pids.pop("kube-scheduler")
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while start_time(pid) == started and time.monotonic() < deadline:
        time.sleep(0.05)
    if start_time(pid) == started:
        _signal_group(pid, signal.SIGKILL)
    cluster.save()


def one_run(cluster, api: Api, nodes: list[Node], arrivals: replay.Sample, profile: str, seed: int,
            folder: Path, progress) -> Run:
    kube_version = scheduler_version()  # the scoring modelled is that of the scheduler placing the pods
    clear_pods(api, cluster)
    listed = cluster.admin("packing-real").get(f"/api/v1/namespaces/{NAMESPACE}/pods")
    outcomes = Outcomes(cluster, listed["metadata"]["resourceVersion"])
    scheduler_name = start_scheduler(cluster, profile, folder)
    index = {node.name: i for i, node in enumerate(nodes)}
    holder: dict = {}

    def placer(model_cluster):
        holder["real"] = RealScheduler(model_cluster, api, outcomes, scheduler_name, index)
        return holder["real"]
    started = time.perf_counter()
    try:
        real = replay.replay(nodes, arrivals, model_profile(profile, kube_version), seed, placer=placer)
    finally:
        outcomes.stopped = True
        stop_scheduler(cluster)
    seconds = time.perf_counter() - started
    model = replay.replay(nodes, arrivals, model_profile(profile, kube_version), seed)
    placer_used = holder["real"]
    run = Run(profile, seed, real, model, placer_used.count, placer_used.count / max(placer_used.seconds, 1e-9),
              seconds)
    progress(f"  {profile:16} seed {seed}: real {real.alloc_pct_at_100:6.2f} / {real.alloc_pct_at_130:6.2f}  "
             f"model {model.alloc_pct_at_100:6.2f} / {model.alloc_pct_at_130:6.2f}  "
             f"{run.pods} pods in {seconds:.0f} s")
    return run


# --- report ---

def table(runs: list[Run], profiles: list[str]) -> str:
    lines = [f"{'profile':16} {'seed':>4} | {'real@100':>8} {'real@130':>8} {'stranded':>8} {'pods/s':>6} | "
             f"{'sim@100':>7} {'sim@130':>7} {'stranded':>8} | {'diff@100':>8} {'diff@130':>8}"]
    for run in runs:
        lines.append(f"{run.profile:16} {run.seed:4} | {run.real.alloc_pct_at_100:8.2f} "
                     f"{run.real.alloc_pct_at_130:8.2f} {run.real.stranded_gpus:8} {run.pods_per_second:6.1f} | {run.model.alloc_pct_at_100:7.2f} "
                     f"{run.model.alloc_pct_at_130:7.2f} {run.model.stranded_gpus:8} | "
                     f"{run.model.alloc_pct_at_100 - run.real.alloc_pct_at_100:+8.2f} "
                     f"{run.model.alloc_pct_at_130 - run.real.alloc_pct_at_130:+8.2f}")
    lines.append("")
    lines.append(f"{'median of seeds':16} {'n':>4} | {'real@100':>8} {'real@130':>8} {'stranded':>8} {'pods/s':>6} | "
                 f"{'sim@100':>7} {'sim@130':>7} {'stranded':>8} | {'diff@100':>8} {'diff@130':>8} | spread@130")
    for name in profiles:
        mine = [r for r in runs if r.profile == name]
        if not mine:
            continue
        med = summary(mine)
        lines.append(f"{name:16} {len(mine):4} | {med['real_100']:8.2f} {med['real_130']:8.2f} "
                     f"{med['real_stranded']:8g} {med['pods_per_second']:6.1f} | {med['sim_100']:7.2f} "
                     f"{med['sim_130']:7.2f} {med['sim_stranded']:8g} | {med['sim_100'] - med['real_100']:+8.2f} "
                     f"{med['sim_130'] - med['real_130']:+8.2f} | {med['spread_130']:.2f}")
    return "\n".join(lines)


def summary(runs: list[Run]) -> dict:
    real_130 = [r.real.alloc_pct_at_130 for r in runs]
    return {"real_100": statistics.median(r.real.alloc_pct_at_100 for r in runs),
            "real_130": statistics.median(real_130),
            "real_stranded": statistics.median(r.real.stranded_gpus for r in runs),
            "sim_100": statistics.median(r.model.alloc_pct_at_100 for r in runs),
            "sim_130": statistics.median(r.model.alloc_pct_at_130 for r in runs),
            "sim_stranded": statistics.median(r.model.stranded_gpus for r in runs),
            "pods_per_second": statistics.median(r.pods_per_second for r in runs),
            "spread_130": max(real_130) - min(real_130)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"1 seed, {QUICK_NODES} sampled nodes, profiles {', '.join(QUICK_PROFILES)}")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--nodes-sample", type=int, default=None,
                        help="a stratified sample of this many nodes (by GPU count and model); default: all")
    parser.add_argument("--profiles", default=None, help=f"comma-separated, of: {', '.join(PROFILES)} (default: "
                                                         f"{', '.join(QUICK_PROFILES)})")
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    parser.add_argument("--markdown", action="store_true", help="also print the medians as a Markdown table")
    parser.add_argument("--kube-scheduler", choices=sorted(SCHEDULERS), default="1.37",
                        help="the real kube-scheduler's minor: 1.37 (the local cluster's) or 1.35 (the last that "
                             "scores BalancedAllocation by the balance after placement)")
    parser.add_argument("--dra", action="store_true",
                        help="the nodes' GPUs served through DRA (ResourceSlices of NVIDIA's driver and its DeviceClass "
                             "with extendedResourceName, no nvidia.com/gpu capacity); the pods unchanged")
    parser.add_argument("--claims", action="store_true",
                        help="with --dra: each pod gets its GPUs through a ResourceClaim of its own, not nvidia.com/gpu "
                             "(no device scoring upstream; the model columns still score the GPU)")
    parser.add_argument("--real-from", type=Path, metavar="JSON", action="append",
                        help="take the real scheduler's figures from an earlier --json (repeatable) and run only the "
                             "model")
    args = parser.parse_args(argv)
    global scheduler_binary, dra_mode, claims_mode
    scheduler_binary = SCHEDULERS[args.kube_scheduler]
    dra_mode, claims_mode = args.dra, args.claims
    if claims_mode and not dra_mode:
        parser.error("--claims needs --dra (the claims ask for the DRA driver's devices)")
    if dra_mode and args.kube_scheduler != "1.37":
        parser.error("--dra needs --kube-scheduler 1.37 (DRA-backed extended resources are GA there, alpha in 1.35)")
    seeds = 1 if args.quick and "--seeds" not in (argv or sys.argv) else args.seeds
    sample_size = args.nodes_sample if args.nodes_sample is not None else (QUICK_NODES if args.quick else None)
    profiles = args.profiles.split(",") if args.profiles else list(QUICK_PROFILES)
    unknown = [p for p in profiles if p not in PROFILES]
    if unknown:
        parser.error(f"--profiles: unknown {', '.join(unknown)}; choose from {', '.join(PROFILES)}")
    node_file, pod_file = args.traces / "openb_node_list_gpu_node.csv", args.traces / "openb_pod_list_default.csv"
    if not node_file.exists() or not pod_file.exists():
        print(f"the openb trace is not in {args.traces}", file=sys.stderr)
        return 2
    from tests.localcluster import cluster as local
    if not args.real_from and any(not path.exists() for name, path in local.binaries().items()
           if name in ("etcd", "kube-apiserver", scheduler_binary)):
        print("etcd, kube-apiserver and kube-scheduler are not built: run scripts/install-test-tools",
              file=sys.stderr)
        return 2
    all_nodes = trace.load_nodes(node_file)
    nodes = stratified_sample(all_nodes, sample_size)
    capacity = sum(n.gpus for n in nodes)
    population = replay.population(trace.load_pods(pod_file), "A")
    seed_list = list(range(FIRST_SEED, FIRST_SEED + seeds))
    arrivals = {seed: replay.sample(population, capacity, seed, 1.3) for seed in seed_list}
    print(f"nodes: {len(nodes)} of {len(all_nodes)}"
          f"{' (stratified sample by GPU count and model)' if len(nodes) < len(all_nodes) else ''}, "
          f"{capacity} GPUs; track A, {len(population)} pods in the population; seeds {seed_list}; "
          f"{statistics.median(len(a.pods) for a in arrivals.values()):.0f} arrivals per seed; "
          f"profiles: {', '.join(profiles)}"
          f"{'; GPUs served through DRA (ResourceSlices, DeviceClass with extendedResourceName)' if dra_mode else ''}"
          f"{'; each pod asks through a ResourceClaim of its own' if claims_mode else ''}")
    kube_version = scheduler_version()
    for name in profiles:
        print(f"  {name:16} {model_profile(name, kube_version).describe()}"
              f"{'' if PROFILES[name] is None else ', percentageOfNodesToScore 100'}")
    started = time.perf_counter()
    if args.real_from:
        saved = [json.loads(path.read_text()) for path in args.real_from]
        runs = [run for document in saved for run in rerun_model(document, nodes, arrivals, profiles, seed_list)]
        elapsed = sum(document.get("seconds", 0.0) for document in saved)
        print(f"(the real scheduler's figures from {', '.join(map(str, args.real_from))}; the model's computed now)")
    else:
        runs = real_runs(local, nodes, arrivals, profiles, seed_list, started)
        elapsed = time.perf_counter() - started
    print()
    print(table(runs, profiles))
    if args.markdown:
        print()
        print(markdown(runs, profiles))
    print(f"\n{len(runs)} runs in {elapsed / 60:.1f} min; 'stranded': GPUs free at 100 % arrived on nodes whose cpu "
          f"or memory cannot take the smallest GPU pod; diff: model minus real, in points")
    if args.json:
        args.json.write_text(json.dumps({"nodes": len(nodes), "gpus": capacity, "seeds": seed_list, "dra": dra_mode,
                                         "claims": claims_mode,
                                         "kube_version": kube_version, "seconds": round(elapsed, 1), "runs": [
            {"profile": r.profile, "seed": r.seed, "pods": r.pods, "pods_per_second": round(r.pods_per_second, 1),
             "real": {k: getattr(r.real, k) for k in FIGURES}, "model": {k: getattr(r.model, k) for k in FIGURES}}
            for r in runs]}, indent=2))
    return 0


FIGURES = ("alloc_pct_at_100", "alloc_pct_at_130", "stranded_gpus")


def markdown(runs: list[Run], profiles: list[str]) -> str:
    """The medians as docs/steps/binpack-scheduler.md's table ("Choosing the scoring")."""
    lines = ["| profile | real @100 | real @130 | stranded | `simulate` @100 | @130 | seeds' spread @130 | pods/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in profiles:
        mine = [r for r in runs if r.profile == name]
        if mine:
            med = summary(mine)
            lines.append(f"| {name}: {model_profile(name, '1.37.2').describe()} | {med['real_100']:.2f} | "
                         f"{med['real_130']:.2f} | {med['real_stranded']:g} | {med['sim_100']:.2f} | "
                         f"{med['sim_130']:.2f} | {med['spread_130']:.2f} | {med['pods_per_second']:.0f} |")
    return "\n".join(lines)


def real_runs(local, nodes: list[Node], arrivals: dict, profiles: list[str], seed_list: list[int],
              started: float) -> list[Run]:
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="packing-real-") as scratch:
        folder = Path(scratch)
        print("starting etcd and kube-apiserver ...", flush=True)
        cluster = local.control_plane(folder / "cluster", die_with_parent=True)
        try:
            api = Api(cluster)
            prepare(api, nodes)
            print(f"control plane {cluster.version} up with {len(nodes)} nodes in "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
            for seed in seed_list:
                for name in profiles:
                    runs.append(one_run(cluster, api, nodes, arrivals[seed], name, seed, folder,
                                        lambda line: print(line, flush=True)))
        finally:
            local.stop_processes(cluster)
    return runs


def rerun_model(saved: dict, nodes: list[Node], arrivals: dict, profiles: list[str], seed_list: list[int]) -> list[Run]:
    """The real figures of an earlier run (--json), with the model run again: for checking a change to the model
    against the real scheduler without replaying the pods (the arrivals depend only on the seed and the nodes)."""
    if saved["nodes"] != len(nodes) or saved["seeds"] != seed_list:
        raise SystemExit(f"--real-from holds {saved['nodes']} nodes and seeds {saved['seeds']}; this run has "
                         f"{len(nodes)} nodes and seeds {seed_list}: give the same --nodes-sample and --seeds")
    kube_version = saved.get("kube_version", "1.37.2")
    runs = []
    for item in saved["runs"]:
        if item["profile"] not in profiles:
            continue
        real = replay.Outcome(**item["real"])
        model = replay.replay(nodes, arrivals[item["seed"]], model_profile(item["profile"], kube_version),
                              item["seed"])
        runs.append(Run(item["profile"], item["seed"], real, model, item["pods"], item["pods_per_second"], 0.0))
    return runs


def prepare(api: Api, nodes: list[Node]) -> None:
    """The namespace, its default ServiceAccount (no controller-manager makes it here) and the nodes; with --dra the
    DeviceClass and each node's ResourceSlice instead of its nvidia.com/gpu capacity."""
    for path, body in (("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}),
                       (f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {"metadata": {"name": "default"}})):
        status, answer = api.request("POST", path, body)
        if status not in (201, 409):
            raise RuntimeError(f"POST {path}: {status} {answer}")
    if dra_mode:
        from tests.localcluster import dra
        status, answer = api.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", dra.device_class())
        if status not in (201, 409):
            raise RuntimeError(f"creating the DeviceClass: {status} {answer.get('message', answer)}")
    for node in nodes:
        body = node_object(node)
        if dra_mode:
            for field in ("capacity", "allocatable"):
                del body["status"][field][GPU]
            status, answer = api.request("POST", "/apis/resource.k8s.io/v1/resourceslices",
                                         dra.resource_slice(node.name, node.gpus))
            if status not in (201, 409):
                raise RuntimeError(f"the ResourceSlice of {node.name}: {status} {answer.get('message', answer)}")
        status, answer = api.request("POST", "/api/v1/nodes", body)
        if status not in (201, 409):
            raise RuntimeError(f"creating node {node.name}: {status} {answer.get('message', answer)}")
        # The TaintNodesByCondition admission plugin gives every new node node.kubernetes.io/not-ready, which the
        # controller-manager lifts once the kubelet reports Ready; there is neither here, so it is lifted by hand.
        status, answer = api.request("PATCH", f"/api/v1/nodes/{node.name}", {"spec": {"taints": None}})
        if status != 200:
            raise RuntimeError(f"untainting node {node.name}: {status} {answer.get('message', answer)}")


if __name__ == "__main__":
    sys.exit(main())
