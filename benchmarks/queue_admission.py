#!/usr/bin/env python3
"""Jobs through team queues against the same Jobs without a queue, on the real Kueue, kube-scheduler v1.37 (the Job
controller), our bin-packing scheduler and admission, in one run of the local control plane.

    python benchmarks/queue_admission.py --quick                  # 100 nodes, 200 Jobs: a few minutes
    python benchmarks/queue_admission.py [--nodes 1000] [--jobs 2000] [--teams 4] [--all-or-nothing on|off]
                                         [--sequential-admission] [--order no-queue-first|queue-first] [--json FILE]

Protocol: the local cluster (scripts/local-cluster) with N API-only GPU nodes (8 nvidia.com/gpu each, KWOK keeps them
Ready; they carry node-prep's label and taint from the start, as a prepared fleet does). `up` installs the
bin-packing scheduler, admission and the queues step: T teams of one namespace each, their quotas splitting the
Jobs' GPUs evenly, all-or-nothing (and sequential admission) as given. Then two phases of M single-GPU Jobs as users write them (no scheduler
name, no toleration):
  no-queue   the Jobs in a namespace Kueue does not manage: the Job controller makes each pod at once
  queue      the same Jobs spread over the teams' namespaces, each naming its team's LocalQueue: Kueue admits each
             Workload against its quota, then unsuspends the Job
Both phases run on one cluster: the nodes have room for both (the first phase's pods keep running).

No kubelet runs the pods of these nodes: this benchmark plays it, marking each bound pod Running and Ready in one
status write (so Kueue's all-or-nothing sees its pods ready, and the Job controller counts them). Both phases pay that
write. Pods per second are counted from the first Job's creation to the last pod's binding. Stages (medians, from
watches in this process): Job created -> Workload admitted (Kueue's scheduler) -> Job unsuspended (Kueue's Job
reconciler) -> pod created (the Job controller) -> pod bound (our scheduler). Same-run ratio: queue /
no-queue, target >= 0.5.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GPU = "nvidia.com/gpu"
GPUS_PER_NODE = 8
NO_QUEUE = "no-queue"
QUEUE = "gpus"
STEPS = "node-prep,binpack-scheduler,admission-opa,admission,queues"
PAUSE = "registry.k8s.io/pause:3.10"
WORKERS = 8
QUICK = dict(nodes=100, jobs=200)


@dataclass
class Phase:
    name: str
    jobs: int
    created: dict[str, float] = field(default_factory=dict)  # job -> when its POST returned
    admitted: dict[str, float] = field(default_factory=dict)  # job -> its Workload first seen Admitted
    started: dict[str, float] = field(default_factory=dict)  # job -> first seen unsuspended
    evicted: set[str] = field(default_factory=set)  # jobs whose Workload was evicted (pods not ready in time)
    pod_seen: dict[str, float] = field(default_factory=dict)  # job -> its pod first seen
    bound: dict[str, float] = field(default_factory=dict)  # job -> its pod first seen bound
    done: threading.Event = field(default_factory=threading.Event)

    def rate(self) -> float:
        span = max(self.bound.values()) - min(self.created.values())
        return len(self.bound) / max(span, 1e-6)

    def stage(self, since: dict, until: dict) -> float | None:
        gaps = [until[j] - since[j] for j in until if j in since]
        return statistics.median(gaps) if gaps else None


class Watcher:
    """Watches of pods and Workloads across the namespaces: the times each phase's Jobs reach each stage, and the
    kubelet's part for the fleet's pods (Running and Ready once bound)."""

    def __init__(self, cluster, phases: dict[str, Phase]):
        self.cluster, self.phases = cluster, phases
        self.marked: set[str] = set()
        self.lock = threading.Lock()
        self.stopped = False
        self.kubelet = ThreadPoolExecutor(4)
        self.local = threading.local()  # one connection per kubelet thread (a client is not shared between threads)
        for path, follow in (("/api/v1/pods", self._pod), ("/apis/kueue.x-k8s.io/v1beta2/workloads", self._workload),
                             ("/apis/batch/v1/jobs", self._job)):
            threading.Thread(target=self._watch, args=(path, follow), daemon=True).start()

    def _phase(self, namespace: str) -> Phase | None:
        return self.phases["no-queue"] if namespace == NO_QUEUE else \
            self.phases["queue"] if namespace.startswith("team-") else None

    def _watch(self, path: str, follow) -> None:
        rest = self.cluster.admin(agent="queue-admission-watch")
        version = None
        while not self.stopped:
            try:
                if version is None:
                    version = rest.get(path, limit="1")["metadata"]["resourceVersion"]
                for kind, obj in rest.watch(path, version, timeout=600):
                    version = obj["metadata"].get("resourceVersion", version)
                    if kind in ("ADDED", "MODIFIED"):
                        follow(obj, time.perf_counter())
            except Exception:  # noqa: BLE001 - the watch ended (or its CRD is not served yet): resume
                time.sleep(0.2)

    def _pod(self, pod: dict, now: float) -> None:
        meta = pod["metadata"]
        phase = self._phase(meta["namespace"])
        job = (meta.get("labels") or {}).get("job-name")
        if phase is None or not job:
            return
        phase.pod_seen.setdefault(job, now)
        node = pod["spec"].get("nodeName")
        if node and meta.get("deletionTimestamp"):  # evicted (all-or-nothing's timeout): the kubelet removes it
            key = f"{meta['namespace']}/{meta['name']}/deleted"
            with self.lock:
                fresh = key not in self.marked
                self.marked.add(key)
            if fresh:
                self.kubelet.submit(self._remove, meta["namespace"], meta["name"])
        elif node:
            phase.bound.setdefault(job, now)
            if len(phase.bound) >= phase.jobs:
                phase.done.set()
            key = f"{meta['namespace']}/{meta['name']}"
            with self.lock:
                fresh = key not in self.marked and (pod.get("status") or {}).get("phase") != "Running"
                self.marked.add(key)
            if fresh:
                self.kubelet.submit(self._run, meta["namespace"], meta["name"])

    def _remove(self, namespace: str, name: str) -> None:
        """The kubelet's end of a pod being deleted: its containers stopped, the object removed at once."""
        self._write(namespace, name, lambda api: api.delete(
            f"/api/v1/namespaces/{namespace}/pods/{name}?gracePeriodSeconds=0"))

    def _write(self, namespace: str, name: str, write) -> None:
        """One write on this thread's connection; once more on a new one when the server closed it (idle)."""
        for attempt in (1, 2):
            if not hasattr(self.local, "api") or attempt == 2:
                self.local.api = self.cluster.admin(agent="queue-admission-kubelet")
            try:
                write(self.local.api)
                return
            except Exception as error:  # noqa: BLE001 - a closed connection, or the pod is gone
                if attempt == 2:
                    print(f"  (kubelet: {namespace}/{name}: {error})", file=sys.stderr)

    def _run(self, namespace: str, name: str) -> None:
        """The kubelet's report of a started container: Running and Ready."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ready = [{"type": kind, "status": "True", "lastTransitionTime": now}
                 for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")]
        status = {"phase": "Running", "startTime": now, "conditions": ready, "containerStatuses": [
            {"name": "main", "image": PAUSE, "imageID": "", "ready": True, "started": True, "restartCount": 0,
             "state": {"running": {"startedAt": now}}}]}
        self._write(namespace, name, lambda api: api.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                                                           {"status": status}, kind="strategic"))

    def _job(self, job: dict, now: float) -> None:
        phase = self._phase(job["metadata"]["namespace"])
        if phase is not None and not job["spec"].get("suspend"):
            phase.started.setdefault(job["metadata"]["name"], now)

    def _workload(self, workload: dict, now: float) -> None:
        phase = self._phase(workload["metadata"]["namespace"])
        owner = next((o["name"] for o in workload["metadata"].get("ownerReferences") or [] if o["kind"] == "Job"),
                     None)
        conditions = (workload.get("status") or {}).get("conditions") or []
        if phase is not None and owner and any(c.get("type") == "Admitted" and c.get("status") == "True"
                                               for c in conditions):
            phase.admitted.setdefault(owner, now)
        if phase is not None and owner and any(c.get("type") == "Evicted" and c.get("status") == "True"
                                               for c in conditions):
            phase.evicted.add(owner)


def add_fleet(cluster, count: int, labels: dict, taint: dict | None) -> None:
    """count GPU nodes (fleet-NNNNN) prepared as node-prep leaves them; waits until KWOK has them Ready."""
    from tests.localcluster.nodes import FLEET_PREFIX, KWOK_ANNOTATION
    api = cluster.admin()

    def create(index: int) -> None:
        name = f"{FLEET_PREFIX}{index:05d}"
        capacity = {"cpu": "128", "memory": "1Ti", "pods": "110", GPU: str(GPUS_PER_NODE)}
        api.create("/api/v1/nodes", {
            "metadata": {"name": name, "annotations": {KWOK_ANNOTATION: "fake"},
                         "labels": {"kubernetes.io/hostname": name, "type": "kwok", **labels}},
            "spec": {"taints": [taint] if taint else []},
            "status": {"capacity": capacity, "allocatable": dict(capacity)}})
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, range(count)))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        ready = sum(1 for n in api.get("/api/v1/nodes")["items"] if n["metadata"]["name"].startswith(FLEET_PREFIX)
                    and any(c["type"] == "Ready" and c["status"] == "True"
                            for c in (n.get("status") or {}).get("conditions") or []))
        if ready == count:
            return
        time.sleep(1)
    raise SystemExit(f"KWOK did not make {count} fleet nodes Ready within 600 s")


def job(name: str, queue: str | None) -> dict:
    """A single-GPU Job as users write it. Its pod runs until the benchmark ends, as training does (the local
    cluster's KWOK would otherwise complete a Job's pod as soon as it runs: HOLD_LABEL)."""
    from tests.localcluster.cluster import HOLD_LABEL
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue} if queue else {}},
            "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {HOLD_LABEL: "true"}}, "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": PAUSE, "resources": {"limits": {GPU: "1"}}}]}}}}


def submit(cluster, phase: Phase, namespaces: list[str], queue: str | None, timeout: float) -> None:
    local = threading.local()

    def create(index: int) -> None:
        if not hasattr(local, "api"):
            local.api = cluster.admin(agent="queue-admission")
        name = f"{phase.name}-{index:05d}"
        local.api.create(f"/apis/batch/v1/namespaces/{namespaces[index % len(namespaces)]}/jobs", job(name, queue))
        phase.created[name] = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(create, range(phase.jobs)))
    if not phase.done.wait(timeout):
        raise SystemExit(f"{phase.name}: {len(phase.bound)} of {phase.jobs} pods bound within {timeout:.0f} s "
                         f"({len(phase.admitted)} admitted, {len(phase.pod_seen)} pods made)")


def config(cluster, folder: Path, names: list[str], teams: int, jobs: int, all_or_nothing: bool,
           sequential: bool, timeout: str) -> Path:
    from tests.localcluster.cluster import binaries
    from tests.nodes.reports import write_report
    write_report(folder / "report.json", names, gpus=GPUS_PER_NODE)
    path = folder / "gpu-bootstrap.yaml"
    share = -(-jobs // teams)
    path.write_text(json.dumps({
        "cluster": {"kubeconfig": str(cluster.kubeconfig)}, "nodes": [{"name": n} for n in names],
        "admission": {"wait_timeout": 600}, "scheduler": {"wait_timeout": 600}, "monitoring": {"enabled": False},
        "queues": {"kueue": {"chart": str(binaries()["kueue-chart"]), "wait_timeout": 600},
                   "all_or_nothing": all_or_nothing, "sequential_admission": sequential, "timeout": timeout,
                   "teams": [{"name": f"team-{i}", "namespaces": [f"team-{i}"], "gpus": share, "borrow": False}
                             for i in range(teams)]}}))
    return path


def report(phases: dict[str, Phase], args) -> dict:
    out = {"nodes": args.nodes, "jobs": args.jobs, "teams": args.teams, "all_or_nothing": args.all_or_nothing,
           "sequential_admission": args.sequential_admission, "pods_ready_timeout": args.pods_ready_timeout,
           "order": args.order, "phases": {}}
    for name, phase in phases.items():
        out["phases"][name] = {
            "pods_per_second": round(phase.rate(), 2),
            "median_s": {"created_to_admitted": phase.stage(phase.created, phase.admitted),
                         "admitted_to_started": phase.stage(phase.admitted, phase.started),
                         "started_to_pod": phase.stage(phase.started, phase.pod_seen),
                         "created_to_pod": phase.stage(phase.created, phase.pod_seen),
                         "pod_to_bound": phase.stage(phase.pod_seen, phase.bound)},
            "last_bound_after_s": round(max(phase.bound.values()) - min(phase.created.values()), 1),
            "evicted_jobs": len(phase.evicted)}
    out["ratio_queue_to_no_queue"] = round(out["phases"]["queue"]["pods_per_second"] /
                                           out["phases"]["no-queue"]["pods_per_second"], 3)
    return out


def table(result: dict) -> str:
    def seconds(value) -> str:
        return "-" if value is None else f"{value:.2f}"
    lines = [f"{result['nodes']} nodes, {result['jobs']} single-GPU Jobs per phase, {result['teams']} teams, "
             f"all-or-nothing {result['all_or_nothing']} (timeout {result['pods_ready_timeout']})"
             f"{', sequential admission' if result['sequential_admission'] else ''}",
             f"{'phase':<9} {'pods/s':>8} {'last bound':>11} {'job->admitted':>14} {'->unsuspended':>14} "
             f"{'->pod':>7} {'job->pod':>9} {'pod->bound':>11}"]
    for name, phase in result["phases"].items():
        median = phase["median_s"]
        lines.append(f"{name:<9} {phase['pods_per_second']:>8.2f} {phase['last_bound_after_s']:>10.1f}s "
                     f"{seconds(median['created_to_admitted']):>14} {seconds(median['admitted_to_started']):>14} "
                     f"{seconds(median['started_to_pod']):>7} "
                     f"{seconds(median['created_to_pod']):>9} {seconds(median['pod_to_bound']):>11}")
    evicted = result["phases"]["queue"]["evicted_jobs"]
    if evicted:
        lines.append(f"{evicted} Job(s) evicted by all-or-nothing's timeout ({result['pods_ready_timeout']}) while "
                     f"their pods waited to be made: raise queues.timeout above the time a burst takes")
    verdict = "meets" if result["ratio_queue_to_no_queue"] >= 0.5 else "misses"
    lines.append(f"queue / no-queue: {result['ratio_queue_to_no_queue']:.3f}x ({verdict} the 0.5x target)")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 nodes and 200 Jobs")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=2000, help="single-GPU Jobs per phase")
    parser.add_argument("--teams", type=int, default=4)
    parser.add_argument("--all-or-nothing", choices=("on", "off"), default="on")
    parser.add_argument("--sequential-admission", action="store_true",
                        help="queues.sequential_admission: true (Kueue's blockAdmission)")
    parser.add_argument("--pods-ready-timeout", default="5m",
                        help="queues.timeout: how long an admitted Job's pods may take to be ready (default: up's)")
    parser.add_argument("--order", choices=("no-queue-first", "queue-first"), default="no-queue-first")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a phase may take")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.jobs = QUICK["nodes"], QUICK["jobs"]
    if args.nodes * GPUS_PER_NODE < 2 * args.jobs:
        parser.error(f"--nodes {args.nodes} has {args.nodes * GPUS_PER_NODE} GPUs; both phases need {2 * args.jobs}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import signal
    # SIGTERM ends the run through `finally`, which stops the cluster and its pods' processes (Python's default
    # would leave them running, holding their pods' addresses)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from gpu_bootstrap import steps as registry
    from gpu_bootstrap.render import node_prep
    from tests.localcluster import cluster as local
    from tests.localcluster.nodes import FLEET_PREFIX
    from tests.realfaults import UpRun
    absent = local.missing_binaries()
    if absent:
        print(f"not built: {', '.join(absent)} (scripts/install-test-tools)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="queue-admission-") as temp:
        folder = Path(temp)
        cluster = local.up(folder / "cluster", gpu_nodes=0, cpu_nodes=1, die_with_parent=True, timeout=300)
        try:
            prep = registry.config_model().model_validate({"nodes": [{"name": "x"}]}).node_prep
            labels, taint = node_prep.labels_and_taint(prep)
            started = time.perf_counter()
            add_fleet(cluster, args.nodes, labels, taint)
            print(f"{args.nodes} nodes Ready in {time.perf_counter() - started:.0f} s", file=sys.stderr)
            names = [f"{FLEET_PREFIX}{i:05d}" for i in range(args.nodes)]
            teams = [f"team-{i}" for i in range(args.teams)]
            api = cluster.admin()
            for namespace in (NO_QUEUE, *teams):
                api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
            path = config(cluster, folder, names, args.teams, args.jobs, args.all_or_nothing == "on",
                          args.sequential_admission, args.pods_ready_timeout)
            started = time.perf_counter()
            ended = UpRun(["up", "-c", str(path), "--only", STEPS, "--preflight-report", str(folder / "report.json")],
                          folder).wait(1800)
            if ended.code != 0:
                print(ended.output[-4000:], file=sys.stderr)
                return 1
            print(f"up: {time.perf_counter() - started:.0f} s", file=sys.stderr)
            phases = {"no-queue": Phase("no-queue", args.jobs), "queue": Phase("queue", args.jobs)}
            watcher = Watcher(cluster, phases)
            time.sleep(2)  # the watches are open
            order = ("no-queue", "queue") if args.order == "no-queue-first" else ("queue", "no-queue")
            for name in order:
                started = time.perf_counter()
                if name == "no-queue":
                    submit(cluster, phases[name], [NO_QUEUE], None, args.timeout)
                else:
                    submit(cluster, phases[name], teams, QUEUE, args.timeout)
                print(f"{name}: {args.jobs} pods bound in {time.perf_counter() - started:.0f} s", file=sys.stderr)
            watcher.stopped = True
            result = report(phases, args)
        finally:
            local.down(folder / "cluster")
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
