#!/usr/bin/env python3
"""Scheduler throughput on the real kube-scheduler at 1,000 to 15,000 nodes, in the style of scheduler_perf.

    python benchmarks/scheduler_throughput.py --quick          # 1,000 nodes, 600 pods, 1 round: a few minutes
    python benchmarks/scheduler_throughput.py [--nodes 1000,5000,15000] [--pods 3000] [--rounds 2]
                                              [--modes lifted,deployed] [--profiles a,b] [--json FILE]

Protocol: real etcd and kube-apiserver (tests/localcluster), N API-only nodes (8 nvidia.com/gpu, 128 cpu and 1 TiB
each; no kubelet: pods only need to be placed). M pods (1 or 2 GPUs, 2 cpu, 8 Gi) are created while no scheduler
runs; then one kube-scheduler starts with one profile, and the benchmark follows one watch until every pod is bound.
Pods per second are counted from the first binding to the last (the scheduler's start and its informers' first list
are left out, as scheduler_perf leaves them out); "to last" adds the start. Every profile runs once per round,
rounds interleaved (profile order rotated each round), so the ratios compare runs made under the same load; the
figures are medians over the rounds. The node count grows in place (1,000 nodes, then 4,000 more, ...): one control
plane per run of the benchmark.

Profiles (each rendered by `up`'s own renderer for the node count at hand, render/scheduler.py, with leader election
off, as one replica would run it):
  kube-default        kube-scheduler's own default profile (adaptive percentageOfNodesToScore), the reference
  up                  what `up` deploys today for a cluster of this many nodes
  up-every-node       the same scoring with percentageOfNodesToScore: 100 (the default before this release)
  up-adaptive         the same scoring with kube-scheduler's adaptive share of nodes

Modes: "lifted" raises every scheduler's client QPS and burst to 5000 (the algorithm's own cost); "deployed" keeps the
clientConnection that `up` deploys (kube-scheduler's defaults, 50 QPS and burst 100: what users get). Same-run ratios
against kube-default are what to compare; pods per second depend on the machine and what else runs on it.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_bootstrap.core.config import SchedulerConfig  # noqa: E402
from gpu_bootstrap.render import scheduler as render  # noqa: E402
from gpu_bootstrap.sim.engine import Node  # noqa: E402
# the kept-alive API client, node objects, scheduler start and stop
from benchmarks import packing_real as real  # noqa: E402

NAMESPACE = real.NAMESPACE
GPU = "nvidia.com/gpu"
NODE = dict(cpu=128_000, memory=1024 * 1024, gpus=8)  # millicores, MiB
POD_CPU, POD_MEMORY = 2000, 8 * 1024
PROFILES = ("kube-default", "up", "up-every-node", "up-adaptive")
MODES = ("lifted", "deployed")
QUICK = dict(nodes=[1000], pods=600, rounds=1, profiles=list(PROFILES), modes=["lifted"])
WORKERS = 6  # parallel API connections for creating nodes and pods


def scheduler_config(profile: str, kube_version: str, nodes: int, mode: str, kubeconfig: Path) -> dict:
    if profile == "kube-default":
        config = {"apiVersion": render.config_api_version(kube_version), "kind": "KubeSchedulerConfiguration",
                  "profiles": [{"schedulerName": "default-scheduler"}]}
    else:
        pinned = {"up-every-node": {"percentage_of_nodes_to_score": 100},
                  "up-adaptive": {"percentage_of_nodes_to_score": 0}}.get(profile, {})
        config = render.scheduler_configuration(SchedulerConfig(**pinned), kube_version, node_count=nodes)
    config["leaderElection"] = {"leaderElect": False}
    connection = {"kubeconfig": str(kubeconfig)}
    if mode == "lifted":
        connection.update(qps=5000, burst=5000)
    else:  # what `up` deploys: the rendered config's own clientConnection, or kube-scheduler's defaults
        connection.update({k: v for k, v in config.get("clientConnection", {}).items() if k != "kubeconfig"})
    config["clientConnection"] = connection
    return config


def node_names(start: int, stop: int) -> list[str]:
    return [f"gpu-{i:05d}" for i in range(start, stop)]


class Pool:
    """One kept-alive API connection per worker thread (a connection serves one request at a time)."""

    def __init__(self, cluster, workers: int = WORKERS):
        self.cluster, self.workers = cluster, workers
        self.local = threading.local()

    def api(self):
        if not hasattr(self.local, "api"):
            self.local.api = real.Api(self.cluster)
        return self.local.api

    def each(self, function, items) -> None:
        with ThreadPoolExecutor(self.workers) as executor:
            list(executor.map(function, items))


def add_nodes(pool: Pool, start: int, stop: int) -> None:
    names = node_names(start, stop)

    def create(name: str):
        api = pool.api()
        obj = real.node_object(Node(name, NODE["cpu"], NODE["memory"], NODE["gpus"]))
        status, answer = api.request("POST", "/api/v1/nodes", obj)
        if status not in (201, 409):
            raise RuntimeError(f"creating node {name}: {status} {answer.get('message', answer)}")
        # TaintNodesByCondition gives a new node the not-ready taint; no controller-manager lifts it here
        status, answer = api.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}})
        if status != 200:
            raise RuntimeError(f"untainting node {name}: {status} {answer.get('message', answer)}")
    pool.each(create, names)


def pod_body(name: str, gpus: int, scheduler_name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"schedulerName": scheduler_name, "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "work", "image": "registry.k8s.io/pause:3.10", "resources": {
                         "requests": {"cpu": f"{POD_CPU}m", "memory": f"{POD_MEMORY}Mi", GPU: str(gpus)},
                         "limits": {GPU: str(gpus)}}}]}}


def create_pods(pool: Pool, count: int, scheduler_name: str, seed: int) -> None:
    rng = random.Random(seed)
    sizes = [rng.choice((1, 2)) for _ in range(count)]

    def create(position: int):
        status, answer = pool.api().request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods",
                                     pod_body(f"p{position:05d}", sizes[position], scheduler_name))
        if status != 201:
            raise RuntimeError(f"creating pod p{position:05d}: {status} {answer.get('message', answer)}")
    pool.each(create, range(count))


class Bindings:
    """One watch on the namespace's pods: when each pod was first seen bound."""

    def __init__(self, cluster, resource_version: str, expected: int):
        self.cluster, self.expected = cluster, expected
        self.bound: dict[str, float] = {}
        self.done = threading.Event()
        self.stopped = False
        self.thread = threading.Thread(target=self._follow, args=(resource_version,), daemon=True)
        self.thread.start()

    def _follow(self, resource_version: str) -> None:
        rest = self.cluster.admin("scheduler-throughput-watch")
        while not self.stopped:
            try:
                for kind, pod in rest.watch(f"/api/v1/namespaces/{NAMESPACE}/pods", resource_version, timeout=600):
                    now = time.perf_counter()
                    resource_version = pod["metadata"].get("resourceVersion", resource_version)
                    if kind == "MODIFIED" and pod["spec"].get("nodeName"):
                        self.bound.setdefault(pod["metadata"]["name"], now)
                        if len(self.bound) >= self.expected:
                            self.done.set()
                            return
            except Exception as error:  # noqa: BLE001 - the watch ended: resume from where it was
                if "410" in str(error):
                    raise RuntimeError("the pod watch expired mid-run; rerun with fewer pods") from error
                time.sleep(0.1)


@dataclass
class Result:
    nodes: int
    mode: str
    profile: str
    round: int
    pods: int
    pods_per_second: float  # first binding to last
    to_last: float  # seconds from the scheduler's start to the last binding


def one_run(cluster, pool: Pool, folder: Path, nodes: int, pods: int, profile: str, mode: str, round_: int,
            kube_version: str, timeout: float) -> Result:
    rest = cluster.admin("scheduler-throughput")
    config = scheduler_config(profile, kube_version, nodes, mode, cluster.folder / "scheduler.kubeconfig")
    scheduler_name = config["profiles"][0]["schedulerName"]
    real.clear_pods(pool.api(), cluster)
    create_pods(pool, pods, scheduler_name, seed=round_)
    listed = rest.get(f"/api/v1/namespaces/{NAMESPACE}/pods", limit="1")
    bindings = Bindings(cluster, listed["metadata"]["resourceVersion"], pods)
    path = folder / "scheduler-config.json"
    path.write_text(json.dumps(config))
    from tests.localcluster.cluster import binaries
    started = time.perf_counter()
    cluster.spawn("kube-scheduler", [str(binaries()["kube-scheduler"]), f"--config={path}",
                                     "--bind-address=127.0.0.1", "--secure-port=0", "--v=0"], die_with_parent=True)
    try:
        if not bindings.done.wait(timeout):
            raise RuntimeError(f"{profile} ({mode}) bound {len(bindings.bound)} of {pods} pods in {timeout:.0f} s")
    finally:
        bindings.stopped = True
        real.stop_scheduler(cluster)
    times = sorted(bindings.bound.values())
    span = max(times[-1] - times[0], 1e-6)
    return Result(nodes, mode, profile, round_, pods, (len(times) - 1) / span, times[-1] - started)


def table(results: list[Result]) -> str:
    lines = [f"{'nodes':>6} {'mode':9} {'profile':14} {'rounds':>6} {'pods/s':>8} {'ratio':>6} {'to last (s)':>11}"]
    keys = sorted({(r.nodes, r.mode) for r in results}, key=lambda k: (k[0], MODES.index(k[1])))
    for nodes, mode in keys:
        mine = [r for r in results if (r.nodes, r.mode) == (nodes, mode)]
        medians = {p: statistics.median(r.pods_per_second for r in mine if r.profile == p)
                   for p in PROFILES if any(r.profile == p for r in mine)}
        reference = medians.get("kube-default")
        for profile, rate in medians.items():
            ratio = f"{rate / reference:5.2f}x" if reference else "  -   "
            last = statistics.median(r.to_last for r in mine if r.profile == profile)
            count = sum(1 for r in mine if r.profile == profile)
            lines.append(f"{nodes:6} {mode:9} {profile:14} {count:6} {rate:8.0f} {ratio:>6} {last:11.1f}")
    return "\n".join(lines)


def markdown(results: list[Result]) -> str:
    lines = ["| nodes | mode | kube-scheduler default | " + " | ".join(p for p in PROFILES[1:]) + " |",
             "|---:|---|---:|" + "---:|" * (len(PROFILES) - 1)]
    for nodes, mode in sorted({(r.nodes, r.mode) for r in results}, key=lambda k: (k[0], MODES.index(k[1]))):
        mine = [r for r in results if (r.nodes, r.mode) == (nodes, mode)]
        medians = {p: statistics.median(r.pods_per_second for r in mine if r.profile == p)
                   for p in PROFILES if any(r.profile == p for r in mine)}
        reference = medians.get("kube-default")
        cells = [f"{medians[p]:.0f}" + (f" ({medians[p] / reference:.2f}×)" if reference else "") if p in medians
                 else "–" for p in PROFILES[1:]]
        lines.append(f"| {nodes:,} | {mode} | {reference:.0f} pods/s | " + " | ".join(cells) + " |"
                     if reference else f"| {nodes:,} | {mode} | – | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1,000 nodes, 600 pods, one round, QPS lifted")
    parser.add_argument("--nodes", default="1000,5000,15000", help="node counts, ascending (default %(default)s)")
    parser.add_argument("--pods", type=int, default=3000, help="pending pods per run (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of every profile per size and mode")
    parser.add_argument("--modes", default=",".join(MODES), help=f"of: {', '.join(MODES)}")
    parser.add_argument("--profiles", default=",".join(PROFILES), help=f"of: {', '.join(PROFILES)}")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run may take to bind every pod")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write every run's figures here")
    parser.add_argument("--markdown", action="store_true", help="also print the medians as a Markdown table")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.pods, args.rounds = QUICK["nodes"], QUICK["pods"], QUICK["rounds"]
        args.modes = QUICK["modes"] if "--modes" not in (argv or sys.argv) else args.modes.split(",")
        args.profiles = args.profiles.split(",")
    else:
        try:
            args.nodes = [int(n) for n in args.nodes.split(",")]
        except ValueError:
            parser.error("--nodes: comma-separated whole numbers, e.g. 1000,5000")
        args.modes, args.profiles = args.modes.split(","), args.profiles.split(",")
    if args.nodes != sorted(args.nodes) or min(args.nodes) < 1:
        parser.error("--nodes: positive and ascending (the cluster grows between sizes)")
    for name, given, known in (("--modes", args.modes, MODES), ("--profiles", args.profiles, PROFILES)):
        unknown = [g for g in given if g not in known]
        if unknown:
            parser.error(f"{name}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    if args.pods > 8 * min(args.nodes):  # every pod must fit: 8 GPUs a node, 1 or 2 a pod
        parser.error(f"--pods: at most {8 * min(args.nodes)} for {min(args.nodes)} nodes")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from tests.localcluster import cluster as local
    absent = [n for n, p in local.binaries().items() if n in ("etcd", "kube-apiserver", "kube-scheduler")
              and not p.exists()]
    if absent:
        print(f"not built: {', '.join(absent)}; run scripts/install-test-tools", file=sys.stderr)
        return 2
    kube_version = local.kubernetes_version().removeprefix("v")
    results: list[Result] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="scheduler-throughput-") as scratch:
        folder = Path(scratch)
        print("starting etcd and kube-apiserver ...", flush=True)
        cluster = local.control_plane(folder / "cluster", die_with_parent=True)
        try:
            pool = Pool(cluster)
            real.prepare(pool.api(), [])
            have = 0
            for nodes in args.nodes:
                began = time.perf_counter()
                add_nodes(pool, have, nodes)
                have = nodes
                print(f"{nodes} nodes ready ({time.perf_counter() - began:.0f} s to add them)", flush=True)
                for mode in args.modes:
                    for round_ in range(args.rounds):
                        order = args.profiles[round_ % len(args.profiles):] + args.profiles[:round_ %
                                                                                          len(args.profiles)]
                        for profile in order:
                            result = one_run(cluster, pool, folder, nodes, args.pods, profile, mode, round_,
                                             kube_version, args.timeout)
                            results.append(result)
                            print(f"  {nodes:6} {mode:9} round {round_ + 1} {profile:14} "
                                  f"{result.pods_per_second:7.0f} pods/s, last bound {result.to_last:6.1f} s "
                                  f"after the start", flush=True)
        finally:
            local.stop_processes(cluster)
    print()
    print(f"kube-scheduler {kube_version}; {args.pods} pods a run; {args.rounds} round(s); "
          f"{(time.perf_counter() - started) / 60:.1f} min")
    print(table(results))
    if args.markdown:
        print()
        print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps({"kube_version": kube_version, "pods": args.pods,
                                         "results": [r.__dict__ for r in results]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
