#!/usr/bin/env python3
"""GPU node-seconds on the real Karpenter: the same arrivals and departures of GPU pods under kube-scheduler's default
profile and under gpu-bootstrap's bin-packing one, with consolidation on.

    python benchmarks/autoscale_real.py --quick                   # 24 pods over 60 s: about 8 minutes
    python benchmarks/autoscale_real.py [--pods 60] [--span 240] [--seed 1] [--runs-for 20,120] [--per-gpu 12,48]
                                        [--consolidate-after 15] [--profiles default,binpack] [--json FILE]

Protocol, per profile, on a fresh local control plane (scripts/local-cluster up --karpenter --gpu-nodes 0): `up`
creates a KWOK pool of 8-GPU nodes (cloud: kwok, consolidate_after as given); `binpack` also installs the bin-packing
scheduler and admission, which steer the pods to it; `default` installs neither, so the pods (given the pool's
toleration by hand) go to the cluster's kube-scheduler with its default profile. Then one workload, the same for
both: pods of 1, 2, 4 or 8 GPUs (openb's GPU shape mix: 70/15/10/5 %), asking for cpu and memory with their GPUs as
users' pods do (--per-gpu: 12 cores and 48 GiB a GPU, about openb's 1-GPU pods), 60 % of them arriving in the first
third of SPAN seconds (a peak) and the rest over the other two thirds (the quieter hours after it), each running for
its own duration (--runs-for, 20-120 s, drawn with SEED) from the moment it is bound, then deleted (a finished Job's
pod). Karpenter launches nodes for the pods no node can take, and removes a node once it has been empty for
consolidate_after.

Counted from the first arrival until the last pool node is gone: the nodes Karpenter launched and the GPU node-seconds
(each node's life, first seen to gone, in a 1 s poll), how long pods waited to be bound, and the pods of others seen
on pool nodes (they would keep a node). A scheduler that packs leaves whole nodes empty when pods end, so
consolidation returns them; one that spreads (kube-scheduler's default scores the cpu and memory pods ask for,
LeastAllocated) puts each new pod on the emptiest node and keeps it. Same-run ratio: binpack / default node-seconds,
target <= 0.85 (15 % fewer), printed beside what `simulate --autoscale` predicts for the same arrivals.

Pods that ask for GPUs alone (--per-gpu 0,0) tie on every node in kube-scheduler's default fit scores (100 m and
200 MiB counted per pod are nothing on a 192-core node), and kube-scheduler 1.35+ breaks ties by the order its filter
found the nodes: a first fit, itself a packing. Such pods measure no difference (0.94-1.03 over three runs).

Only time is compressed: a real cluster's jobs run for hours and consolidate_after is minutes. What no kubelet does
here, this benchmark does: it ends each pod at its time.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

POOL = "gpus"
NAMESPACE = "work"
PAUSE = "registry.k8s.io/pause:3.10"
SHAPES = ((1, 0.70), (2, 0.15), (4, 0.10), (8, 0.05))  # GPUs per pod, share (openb's GPU pods, rounded)
QUICK = dict(pods=24, span=60)
PROFILES = ("default", "binpack")
STEPS = {"default": "node-prep,gpu-pools", "binpack": "node-prep,binpack-scheduler,admission-opa,admission,gpu-pools"}


@dataclass
class Arrival:
    name: str
    at: float  # seconds after the start
    gpus: int
    runs_for: float
    cpu_per_gpu: float = 0.0  # cores
    memory_per_gpu: int = 0  # GiB


INSTANCE_CORES, INSTANCE_GIB = 192, 2048  # the KWOK instance type gpu-h100-8x (tests/localcluster/karpenter.py)
PEAK_SHARE = 0.6  # of the pods arrive in the first third of the span (a busy hour), the rest over the other two


def workload(pods: int, span: float, seed: int, runs_for: tuple[float, float] = (20, 120),
             per_gpu: tuple[float, int] = (0.0, 0)) -> list[Arrival]:
    """A peak, then a quieter tail: the load that falls after the peak is what lets nodes empty out. Under a steady
    load every node stays busy whatever the profile, and a burst alone launches the same nodes for both. `per_gpu`:
    the cpu cores and GiB each pod asks for per GPU it asks for."""
    draw = random.Random(seed)
    shapes, weights = zip(*SHAPES)
    peak = round(pods * PEAK_SHARE)
    arrivals = [Arrival(f"job-{index:03d}",
                        draw.uniform(0, span / 3) if index < peak else draw.uniform(span / 3, span),
                        draw.choices(shapes, weights)[0], draw.uniform(*runs_for), *per_gpu) for index in range(pods)]
    return sorted(arrivals, key=lambda a: a.at)


@dataclass
class Run:
    profile: str
    launched: dict[str, float] = field(default_factory=dict)  # pool node -> first seen
    gone: dict[str, float] = field(default_factory=dict)  # pool node -> first seen gone
    bound: dict[str, float] = field(default_factory=dict)  # pod -> when first seen bound
    created: dict[str, float] = field(default_factory=dict)  # pod -> when created
    node_of: dict[str, str] = field(default_factory=dict)  # pod -> the node it was bound to
    others: set[str] = field(default_factory=set)  # pods not the workload's seen on pool nodes (they keep a node)
    ended: set[str] = field(default_factory=set)
    started: float = 0.0
    finished: float = 0.0

    def node_seconds(self) -> float:
        return sum(self.gone.get(name, self.finished) - first for name, first in self.launched.items())


def pod(arrival: Arrival, profile: str, taint: dict) -> dict:
    resources = {"limits": {"nvidia.com/gpu": str(arrival.gpus)}}
    if arrival.cpu_per_gpu or arrival.memory_per_gpu:  # as users write them: cpu and memory besides the GPUs
        resources["requests"] = {"cpu": f"{round(arrival.cpu_per_gpu * arrival.gpus * 1000)}m",
                                 "memory": f"{arrival.memory_per_gpu * arrival.gpus}Gi"}
    spec = {"containers": [{"name": "work", "image": PAUSE, "resources": resources}]}
    if profile == "default":  # no admission steers it: the pool's toleration by hand, kube-scheduler's default profile
        spec["tolerations"] = [{"key": taint["key"], "operator": "Exists", "effect": taint["effect"]}]
    from tests.localcluster.cluster import HOLD_LABEL
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": arrival.name, "labels": {HOLD_LABEL: "true", "app": "autoscale"}}, "spec": spec}


def config(cluster, path: Path, consolidate_after: int, limit: int) -> Path:
    path.write_text(json.dumps({
        "cluster": {"kubeconfig": str(cluster.kubeconfig)}, "nodes": f"karpenter.sh/nodepool={POOL}",
        "admission": {"wait_timeout": 300}, "monitoring": {"enabled": False},
        "pools": [{"name": POOL, "cloud": "kwok", "requirements": {"gpu_count": 8},
                   "limits": {"nvidia.com/gpu": limit},
                   "disruption": {"consolidate_after": f"{consolidate_after}s", "budgets": [{"nodes": "100%"}]}}]}))
    return path


def drive(cluster, run: Run, arrivals: list[Arrival], taint: dict, timeout: float) -> None:
    """Create each pod at its time, end it (delete) `runs_for` after it was bound, and follow the pool's nodes until
    every pod ended and every pool node is gone."""
    api = cluster.admin()
    pending = list(arrivals)
    durations = {a.name: a.runs_for for a in arrivals}
    run.started = time.monotonic()
    deadline = run.started + timeout
    while time.monotonic() < deadline:
        now = time.monotonic() - run.started
        while pending and pending[0].at <= now:
            arrival = pending.pop(0)
            api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod(arrival, run.profile, taint))
            run.created[arrival.name] = time.monotonic()
        for item in api.get(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector="app=autoscale")["items"]:
            name = item["metadata"]["name"]
            if item["spec"].get("nodeName") and name not in run.bound:
                run.bound[name] = time.monotonic()
                run.node_of[name] = item["spec"]["nodeName"]
            if name in run.bound and name not in run.ended and \
                    time.monotonic() - run.bound[name] >= durations[name]:
                api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}?gracePeriodSeconds=0")
                run.ended.add(name)
        seen = {n["metadata"]["name"] for n in
                api.get("/api/v1/nodes", labelSelector=f"karpenter.sh/nodepool={POOL}")["items"]}
        stamp = time.monotonic()
        if seen and int(stamp - run.started) % 10 == 0:
            run.others |= {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in
                           api.get("/api/v1/pods")["items"]
                           if p["spec"].get("nodeName") in seen and p["metadata"]["namespace"] != NAMESPACE}
        for name in seen - set(run.launched):
            run.launched[name] = stamp
        for name in set(run.launched) - seen - set(run.gone):
            run.gone[name] = stamp
        if not pending and len(run.ended) == len(arrivals) and not seen:
            break
        time.sleep(1)
    run.finished = time.monotonic()


def one(profile: str, arrivals: list[Arrival], args, taint: dict) -> Run:
    from tests.localcluster import cluster as local
    from tests.realfaults import UpRun
    with tempfile.TemporaryDirectory(prefix=f"autoscale-{profile}-") as temp:
        folder = Path(temp)
        cluster = local.up(folder / "cluster", gpu_nodes=0, cpu_nodes=1, die_with_parent=True, karpenter=True,
                           timeout=300)
        try:
            cluster.admin().create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            limit = 8 * len(arrivals)
            path = config(cluster, folder / "gpu-bootstrap.yaml", args.consolidate_after, limit)
            ended = UpRun(["up", "-c", str(path), "--only", STEPS[profile]], folder).wait(900)
            if ended.code != 0:
                raise SystemExit(f"{profile}: up failed:\n{ended.output[-4000:]}")
            run = Run(profile)
            drive(cluster, run, arrivals, taint, args.timeout)
            print(f"{profile}: {len(run.launched)} node(s) launched, {run.node_seconds():.0f} node-seconds, "
                  f"{len(run.ended)}/{len(arrivals)} pods ran", file=sys.stderr)
            return run
        finally:
            local.down(folder / "cluster")


def waits(run: Run) -> dict:
    """How long pods waited from creation to being bound (a node launched for them, then the scheduler), and where
    each went: a profile that binds late keeps nodes up with nothing on them."""
    waited = sorted(run.bound[name] - run.created[name] for name in run.bound if name in run.created)
    return {"median_wait_s": round(statistics.median(waited), 1) if waited else None,
            "max_wait_s": round(waited[-1], 1) if waited else None,
            "placements": {name: run.node_of[name] for name in sorted(run.node_of)},
            "other_pods_on_pool_nodes": sorted(run.others)}


def report(runs: dict[str, Run], arrivals: list[Arrival], args) -> dict:
    result = {"pods": len(arrivals), "gpus_asked": sum(a.gpus for a in arrivals), "span_s": args.span,
              "per_gpu": {"cores": args.per_gpu[0], "gib": args.per_gpu[1]},
              "seed": args.seed, "consolidate_after_s": args.consolidate_after,
              "profiles": {name: {"nodes_launched": len(run.launched), "gpu_node_seconds": round(run.node_seconds()),
                                  "pods_ran": len(run.ended), "wall_s": round(run.finished - run.started),
                                  **waits(run)}
                           for name, run in runs.items()}}
    if {"default", "binpack"} <= set(runs) and runs["default"].node_seconds():
        result["ratio"] = round(runs["binpack"].node_seconds() / runs["default"].node_seconds(), 3)
    result["model"] = model(arrivals, args.consolidate_after)
    return result


def model(arrivals: list[Arrival], consolidate_after: float) -> dict:
    """What `simulate --autoscale` predicts for the same arrivals (each pod leaving `runs_for` after it arrives, a node
    added the moment a pod fits nowhere): the peer the measured ratio is read against."""
    import statistics as stats
    from gpu_bootstrap.core.config import SchedulerConfig
    from gpu_bootstrap.sim import autoscale
    from gpu_bootstrap.sim.command import SimOptions, profiles
    from gpu_bootstrap.sim.engine import Node, Pod
    pods = [autoscale.TimedPod(Pod(round(a.cpu_per_gpu * a.gpus * 1000), a.memory_per_gpu * a.gpus * 1024, a.gpus),
                               a.at, a.at + a.runs_for) for a in arrivals]
    instance = Node("gpu-h100-8x", INSTANCE_CORES * 1000, INSTANCE_GIB * 1024, 8)
    default, ours = profiles(SimOptions(None), SchedulerConfig(), "1.37", autoscale.most_at_once(pods))[:2]
    seconds = {name: stats.median(autoscale.replay(pods, instance, profile, seed, consolidate_after).node_seconds
                                  for seed in range(42, 47))
               for name, profile in (("default", default), ("binpack", ours))}
    return {"node_seconds": {name: round(value) for name, value in seconds.items()},
            "ratio": round(seconds["binpack"] / seconds["default"], 3) if seconds["default"] else None}


def table(result: dict) -> str:
    lines = [f"{result['pods']} GPU pods ({result['gpus_asked']} GPUs) over {result['span_s']:g} s, seed "
             f"{result['seed']}, consolidate_after {result['consolidate_after_s']} s; 8-GPU nodes",
             f"{'profile':<10} {'nodes launched':>15} {'GPU node-seconds':>17} {'pods ran':>9} {'median wait':>12}"]
    for name, row in result["profiles"].items():
        lines.append(f"{name:<10} {row['nodes_launched']:>15} {row['gpu_node_seconds']:>17} {row['pods_ran']:>9} "
                     f"{row['median_wait_s']!s:>10} s")
    if "ratio" in result:
        lines.append(f"ratio binpack / default node-seconds: {result['ratio']:.3f} (target <= 0.85)")
    if result.get("model", {}).get("ratio") is not None:
        lines.append(f"the model (simulate --autoscale, 5 seeds) predicts {result['model']['ratio']:.3f} for the same "
                     f"arrivals ({result['model']['node_seconds']['default']} / "
                     f"{result['model']['node_seconds']['binpack']} node-seconds)")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK['pods']} pods over {QUICK['span']} s")
    parser.add_argument("--pods", type=int, default=60)
    parser.add_argument("--span", type=float, default=240.0, help="seconds over which the pods arrive")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs-for", default="20,120", metavar="MIN,MAX",
                        help="seconds each pod runs once bound, drawn between these")
    parser.add_argument("--consolidate-after", type=int, default=15, help="seconds (the pool's consolidate_after)")
    parser.add_argument("--per-gpu", default="12,48", metavar="CORES,GIB",
                        help="cpu cores and GiB of memory each pod asks for per GPU (openb's 1-GPU pods: about 11.4 "
                             "cores and 47 GiB); 0,0: GPUs only")
    parser.add_argument("--profiles", default=",".join(PROFILES), help="default,binpack (or one of them)")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per profile's workload")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.pods, args.span = QUICK["pods"], QUICK["span"]
    try:
        low, high = (float(part) for part in args.runs_for.split(","))
    except ValueError:
        parser.error(f"--runs-for: {args.runs_for!r} is not MIN,MAX seconds (e.g. 20,120)")
    if not 0 < low <= high:
        parser.error(f"--runs-for: {args.runs_for!r} needs 0 < MIN <= MAX")
    args.runs_for = (low, high)
    try:
        cores, gib = args.per_gpu.split(",")
        args.per_gpu = (float(cores), int(gib))
    except ValueError:
        parser.error(f"--per-gpu: {args.per_gpu!r} is not CORES,GIB (e.g. 12,48)")
    if args.per_gpu[0] * 8 > INSTANCE_CORES or args.per_gpu[1] * 8 > INSTANCE_GIB or min(args.per_gpu) < 0:
        parser.error(f"--per-gpu: an 8-GPU pod must fit the {INSTANCE_CORES}-core, {INSTANCE_GIB} GiB instance")
    args.profiles = [p for p in args.profiles.split(",") if p]
    unknown = [p for p in args.profiles if p not in PROFILES]
    if unknown or not args.profiles:
        parser.error(f"--profiles: {', '.join(unknown) or 'none given'}; choose from {', '.join(PROFILES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import signal
    # SIGTERM ends the run through `finally`, which stops the cluster (and Karpenter) it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from gpu_bootstrap import steps as registry
    from gpu_bootstrap.render import node_prep
    from tests.localcluster import cluster as local
    absent = local.missing_binaries(karpenter=True)
    if absent:
        print(f"not built: {', '.join(absent)} (scripts/install-test-tools)", file=sys.stderr)
        return 2
    _labels, taint = node_prep.labels_and_taint(
        registry.config_model().model_validate({"nodes": [{"name": "x"}]}).node_prep)
    arrivals = workload(args.pods, args.span, args.seed, args.runs_for, args.per_gpu)
    runs = {profile: one(profile, arrivals, args, taint) for profile in args.profiles}
    result = report(runs, arrivals, args)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
