#!/usr/bin/env python3
"""Whole GPU nodes left empty, by workload shape: the real kube-scheduler and `simulate`'s model, side by side.

    python benchmarks/packing_shapes.py --model-only                   # the model, all 617 8-GPU nodes: a minute
    python benchmarks/packing_shapes.py --quick [--kube-scheduler 1.35]  # real: 40 nodes, 50 % load: minutes
    python benchmarks/packing_shapes.py [--nodes-sample N] [--loads 25,50,75] [--shapes a,b] [--profiles a,b]
                                        [--kube-scheduler 1.37|1.35] [--check-ties] [--feature-gates G=false]
                                        [--json FILE]

Protocol (gpu_bootstrap/sim/shapes.py): the openb trace's 8-GPU nodes (617; a sample keeps every stratum's share
by cpu and memory); pods of one shape arrive in random order (seed 42) until the next would ask for more than the
load's share of the GPUs; they are created as real pods in arrival order, without waiting for each (kube-scheduler
takes them in that order, one per cycle, counting those it placed; `--sequential` waits for each to be bound or found
unschedulable before the next, as benchmarks/packing_real.py does, to check that). Counted: 8-GPU nodes with no GPU
in use, against the ideal (the fewest nodes those pods fit on, given each node's cpu and memory). A bin-packing
scheduler should leave at least 95 % of the ideal empty: those nodes are what an 8-GPU job needs.

Shapes: inference (1 GPU, 500m, 1 Gi), light-2gpu (2 GPUs, 1 cpu, 4 Gi), light-mix (1/2/4 GPUs, 500m and 1 Gi a
GPU), training (1 GPU, 8 cpu, 64 Gi). Profiles: kube-default (kube-scheduler's own), up (what `up` renders for the
chosen scheduler's version and this many nodes), up-before-shapes (what `up` rendered before this benchmark: up to
1.35 fit weight 2 against BalancedAllocation 1; from 1.36 the same as up).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_bootstrap.core.config import SchedulerConfig  # noqa: E402
from gpu_bootstrap.render import scheduler as render  # noqa: E402
from gpu_bootstrap.sim import scoring, shapes, trace  # noqa: E402
from gpu_bootstrap.sim.engine import Scheduler  # noqa: E402
from benchmarks import packing_real as real  # noqa: E402

PROFILES = ("kube-default", "up", "up-before-shapes")
SEED = 42


def config_of(profile: str, kube_version: str, node_count: int) -> dict:
    if profile == "kube-default":
        return {"apiVersion": render.config_api_version(kube_version), "kind": "KubeSchedulerConfiguration",
                "profiles": [{"schedulerName": "default-scheduler"}]}
    settings = SchedulerConfig()
    if profile == "up-before-shapes" and not scoring.balanced_by_change(kube_version):
        settings = SchedulerConfig(fit_weight=2)  # up to 1.35 the default had fit weight 2; from 1.36 it is unchanged
    return render.scheduler_configuration(settings, kube_version, node_count)


def model_of(profile: str, kube_version: str, node_count: int) -> scoring.Profile:
    if profile == "kube-default":
        import dataclasses
        return dataclasses.replace(scoring.DEFAULT_PROFILE,
                                   balanced_by_change=scoring.balanced_by_change(kube_version))
    return scoring.profile_from_config(config_of(profile, kube_version, node_count), 0, kube_version)


def sample(nodes, count: int | None):
    """`count` of the 8-GPU nodes, spread over their sizes (benchmarks/packing_real.py's stratified sample)."""
    eight = shapes.gpu_nodes(nodes)
    return real.stratified_sample(eight, count) if count else eight


def model_run(profile: str, shape: str, load: int, nodes, kube_version: str) -> shapes.ShapeRun:
    pods = shapes.arrivals(shape, nodes, load, SEED)
    model = model_of(profile, kube_version, len(nodes))
    return shapes.measure(shape, load, nodes, pods,
                          lambda cluster: Scheduler(cluster, model, random.Random(SEED * 7919 + 1)))


def burst(cluster_api, api, outcomes, scheduler_name: str, shape: str, load: int, nodes, pods) -> shapes.ShapeRun:
    """Create the pods in arrival order from one connection without waiting for each (only the first, which also
    waits out the scheduler's start), then read where each went. kube-scheduler takes its queue in arrival order, one
    pod per scheduling cycle, with the pods it placed before already counted (assumed), so the placements are those
    of one-at-a-time arrivals (`--sequential` checks it), in a fraction of the time."""
    from gpu_bootstrap.sim.engine import Cluster
    names = [f"p{i:05d}" for i in range(1, len(pods) + 1)]
    for number, (name, pod) in enumerate(zip(names, pods)):
        status, answer = api.request("POST", f"/api/v1/namespaces/{real.NAMESPACE}/pods",
                                     real.pod_object(name, pod, scheduler_name))
        if status != 201:
            raise RuntimeError(f"creating pod {name} was refused ({status}): {answer.get('message', answer)}")
        if number == 0:
            outcomes.wait(name, real.WAIT_PER_POD)
    for name in names[1:]:
        outcomes.wait(name, real.WAIT_PER_POD)
    listed = cluster_api.get(f"/api/v1/namespaces/{real.NAMESPACE}/pods")["items"]
    where = {pod["metadata"]["name"]: pod["spec"].get("nodeName") for pod in listed}
    index = {node.name: i for i, node in enumerate(nodes)}
    booked = Cluster(nodes)
    unplaced = 0
    for name, pod in zip(names, pods):
        if where.get(name):
            booked.add(index[where[name]], pod)
        else:
            unplaced += 1
    empty = sum(1 for used in booked.gpu if not used)
    burst.placements = [index[where[name]] if where.get(name) else None for name in names]
    return shapes.ShapeRun(shape, load, empty, len(nodes) - shapes.ideal_nodes_used(nodes, pods), unplaced)


@dataclass
class TieCheck:
    """The real scheduler's placements replayed in the model, pod by pod, in arrival order."""
    placed: int = 0
    off_top: int = 0  # the real node was not among the model's top-scored nodes: the scoring disagrees
    tied: int = 0  # more than one node had the top score: the tie-break decided
    first_of_tie: int = 0  # of those, the real node was the first tied node in node order
    tie_sizes: list = field(default_factory=list)

    def describe(self) -> str:
        if not self.placed:
            return "no placements to replay"
        sizes = sorted(self.tie_sizes)
        median = sizes[len(sizes) // 2] if sizes else 0
        return (f"{self.placed - self.off_top}/{self.placed} real placements on a node the model scores top; "
                f"{self.tied} decided among tied nodes (median {median} tied), "
                f"{self.first_of_tie} of them the first tied node in node order")


def check_ties(model: scoring.Profile, nodes, pods, placements) -> TieCheck:
    """Replays where the real scheduler put each pod and scores every node the model's way just before it: tells
    a scoring difference (the real node is not top-scored) from a tie-break difference (it is, among equals)."""
    from gpu_bootstrap.sim.engine import Cluster, Scorer
    cluster = Cluster(nodes)
    scorer = Scorer(model, cluster)
    check = TieCheck()
    for pod, chosen in zip(pods, placements):
        if chosen is None:
            continue
        scores = [(scorer.score(i, pod), i) for i in range(len(nodes)) if cluster.fits(i, pod)]
        top = max(score for score, _ in scores)
        tied = [i for score, i in scores if score == top]
        check.placed += 1
        check.off_top += chosen not in tied
        if len(tied) > 1 and chosen in tied:
            check.tied += 1
            check.tie_sizes.append(len(tied))
            check.first_of_tie += chosen == tied[0]
        cluster.add(chosen, pod)
    return check


def real_run(local_cluster, api, folder: Path, profile: str, shape: str, load: int, nodes,
             kube_version: str, sequential: bool = False, feature_gates: str = "") -> shapes.ShapeRun:
    pods = shapes.arrivals(shape, nodes, load, SEED)
    real.clear_pods(api, local_cluster)
    listed = local_cluster.admin("packing-shapes").get(f"/api/v1/namespaces/{real.NAMESPACE}/pods")
    outcomes = real.Outcomes(local_cluster, listed["metadata"]["resourceVersion"])
    config = config_of(profile, kube_version, len(nodes))
    config["profiles"][0].setdefault("plugins", {})["postFilter"] = {"disabled": [{"name": "DefaultPreemption"}]}
    config["clientConnection"] = {"kubeconfig": str(local_cluster.folder / "scheduler.kubeconfig"), "qps": 5000,
                                  "burst": 5000}
    config["leaderElection"] = {"leaderElect": False}
    path = folder / "scheduler-config.json"
    path.write_text(json.dumps(config))
    from tests.localcluster.cluster import binaries
    local_cluster.spawn("kube-scheduler", [str(binaries()[real.scheduler_binary]), f"--config={path}",
                                           "--bind-address=127.0.0.1", "--secure-port=0", "--v=1",
                                           *([f"--feature-gates={feature_gates}"] if feature_gates else [])],
                        die_with_parent=True)
    index = {node.name: i for i, node in enumerate(nodes)}
    try:
        if not sequential:
            got = burst(local_cluster.admin("packing-shapes"), api, outcomes, config["profiles"][0]["schedulerName"],
                        shape, load, nodes, pods)
            real_run.replay = (model_of(profile, kube_version, len(nodes)), pods, burst.placements)
            return got
        return shapes.measure(shape, load, nodes, pods, lambda cluster: real.RealScheduler(
            cluster, api, outcomes, config["profiles"][0]["schedulerName"], index))
    finally:
        outcomes.stopped = True
        real.stop_scheduler(local_cluster)


def share(run: shapes.ShapeRun | None) -> str:
    return "-" if run is None else f"{run.empty}/{run.ideal} ({run.share:.0f} %)"


def table(rows: list[dict], profiles: list[str], real_side: bool) -> str:
    head = f"{'shape':11} {'load':>4} {'ideal':>5}"
    for profile in profiles:
        head += f" | {profile + (' real' if real_side else ' model'):>24}" + (f" {'model':>16}" if real_side else "")
    lines = [head]
    for row in rows:
        line = f"{row['shape']:11} {row['load']:>3}% {row['ideal']:5}"
        for profile in profiles:
            got = row["runs"][profile]
            if real_side:
                line += f" | {share(got.get('real')):>24} {share(got.get('model')):>16}"
            else:
                line += f" | {share(got.get('model')):>24}"
        lines.append(line)
    return "\n".join(lines)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="40 sampled nodes, 50 %% load only")
    parser.add_argument("--model-only", action="store_true", help="only `simulate`'s model (no control plane)")
    parser.add_argument("--nodes-sample", type=int, default=None, help="this many of the 617 8-GPU nodes")
    parser.add_argument("--loads", default=",".join(map(str, shapes.LOADS)), help="percent of the GPUs asked for")
    parser.add_argument("--shapes", default=",".join(shapes.SHAPES), help=f"of: {', '.join(shapes.SHAPES)}")
    parser.add_argument("--profiles", default=",".join(PROFILES), help=f"of: {', '.join(PROFILES)}")
    parser.add_argument("--kube-scheduler", choices=sorted(real.SCHEDULERS), default="1.37",
                        help="whose scoring: the real scheduler of that minor (and the model of it)")
    parser.add_argument("--sequential", action="store_true",
                        help="wait for each pod's placement before creating the next (slow; the burst's check)")
    parser.add_argument("--check-ties", action="store_true",
                        help="replay each real run in the model: were the real nodes top-scored, and how many tied?")
    parser.add_argument("--feature-gates", default="", metavar="GATES",
                        help="passed to the real kube-scheduler, e.g. OpportunisticBatching=false (the model has "
                             "no such switch)")
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--json", type=Path, metavar="FILE")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes_sample = args.nodes_sample or 40
        args.loads = "50" if "--loads" not in (argv or sys.argv) else args.loads
    try:
        args.loads = [int(x) for x in args.loads.split(",")]
    except ValueError:
        parser.error("--loads: comma-separated percentages, e.g. 25,50,75")
    if any(not 0 < load < 100 for load in args.loads):
        parser.error("--loads: each between 1 and 99")
    args.shapes, args.profiles = args.shapes.split(","), args.profiles.split(",")
    for name, given, known in (("--shapes", args.shapes, shapes.SHAPES), ("--profiles", args.profiles, PROFILES)):
        if unknown := [g for g in given if g not in known]:
            parser.error(f"{name}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    real.scheduler_binary = real.SCHEDULERS[args.kube_scheduler]
    node_file = args.traces / "openb_node_list_gpu_node.csv"
    if not node_file.exists():
        print(f"the openb trace is not in {args.traces}", file=sys.stderr)
        return 2
    nodes = sample(trace.load_nodes(node_file), args.nodes_sample)
    kube_version = real.scheduler_version()
    print(f"{len(nodes)} 8-GPU nodes of the openb trace; kube-scheduler {kube_version}'s scoring; seed {SEED}")
    for profile in args.profiles:
        print(f"  {profile:17} {model_of(profile, kube_version, len(nodes)).describe()}")
    started = time.perf_counter()
    rows = [{"shape": shape, "load": load, "ideal": None, "runs": {p: {} for p in args.profiles}}
            for shape in args.shapes for load in args.loads]
    for row in rows:
        for profile in args.profiles:
            row["runs"][profile]["model"] = model_run(profile, row["shape"], row["load"], nodes, kube_version)
            row["ideal"] = row["runs"][profile]["model"].ideal
    if not args.model_only:
        from tests.localcluster import cluster as local
        if not local.binaries()[real.scheduler_binary].exists():
            print(f"{real.scheduler_binary} is not built: run scripts/install-test-tools", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory(prefix="packing-shapes-") as scratch:
            folder = Path(scratch)
            print("starting etcd and kube-apiserver ...", flush=True)
            local_cluster = local.control_plane(folder / "cluster", die_with_parent=True)
            try:
                api = real.Api(local_cluster)
                real.prepare(api, nodes)
                for row in rows:
                    for profile in args.profiles:
                        got = real_run(local_cluster, api, folder, profile, row["shape"], row["load"], nodes,
                                       kube_version, args.sequential, args.feature_gates)
                        row["runs"][profile]["real"] = got
                        print(f"  {row['shape']:11} {row['load']:3}% {profile:17} real {share(got):>16}  "
                              f"model {share(row['runs'][profile]['model'])}", flush=True)
                        if args.check_ties and not args.sequential:
                            print(f"      {check_ties(real_run.replay[0], nodes, *real_run.replay[1:]).describe()}",
                                  flush=True)
            finally:
                local.stop_processes(local_cluster)
    print()
    print(table(rows, args.profiles, not args.model_only))
    print(f"\n{(time.perf_counter() - started) / 60:.1f} min; empty/ideal: 8-GPU nodes left with no GPU in use, "
          f"against the fewest nodes the pods fit on")
    if args.json:
        args.json.write_text(json.dumps({"kube_version": kube_version, "nodes": len(nodes), "seed": SEED, "rows": [
            {"shape": r["shape"], "load": r["load"], "ideal": r["ideal"],
             "runs": {p: {side: got.__dict__ for side, got in sides.items()} for p, sides in r["runs"].items()}}
            for r in rows]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
