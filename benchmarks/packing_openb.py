#!/usr/bin/env python3
"""GPU packing on the Alibaba openb trace: kube-scheduler's default profile, gpu-bootstrap's profile, the old blog
recipe and random placement, with the offline reference, for both tracks; then the simulator's own speed against
a plain scan of every node per pod (the loop kube-scheduler itself runs) in the same run.

    python benchmarks/packing_openb.py [--seeds 10] [--traces ../shared/traces] [--json out.json]

The trace is read from ../shared/traces (never copied into this repository); see its README for provenance.
The paper's published figures (fgd_paper_unalloc_summary.csv) come from a milli-GPU sharing model, where a pod
may take 0.3 of a GPU. Tracks A and B here are whole-GPU models (what kube-scheduler and the device plugin do), so
those figures are not comparable with these and are not compared.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_bootstrap.sim import engine, replay, scoring  # noqa: E402
from gpu_bootstrap.core.config import SchedulerConfig  # noqa: E402
from gpu_bootstrap.sim.command import SimOptions, simulate  # noqa: E402


def table(document: dict) -> str:
    rows = [f"track {document['track']}: {document['inventory']['gpus']} GPUs on "
            f"{document['inventory']['gpu_nodes']} nodes, {document['population']['pods']} pods in the population, "
            f"median of {document['seeds']} seeds",
            f"{'policy':24} {'alloc@100':>9} {'alloc@130':>9} {'1st frag':>8} {'frag 1/2/4/8':>14} "
            f"{'stranded':>8} {'free/used':>9}"]
    for p in document["policies"]:
        frag = "/".join(f"{p['frag_failures'].get(s, 0):g}" for s in ("1", "2", "4", "8"))
        first = "never" if p["first_frag_failure_pct"] is None else f"{p['first_frag_failure_pct']:.1f}"
        rows.append(f"{p['name']:24} {p['alloc_pct_at_100']:9.2f} {p['alloc_pct_at_130']:9.2f} {first:>8} "
                    f"{frag:>14} {p['stranded_gpus']:8g} {p['partial_free_gpus']:9g}")
    offline = document["bounds"]["offline_ffd"]
    rows.append(f"{'offline FFD reference':24} {offline['alloc_pct_at_100']:9.2f} {offline['alloc_pct_at_130']:9.2f}")
    rows.append(f"{'aggregate bound':24} {100:9.2f} {100:9.2f}")
    rows.append(f"gpu-binpack-scheduler closes {document['gap_closed_pct']}% of the default -> offline gap at 100%")
    return "\n".join(rows)


def speed(traces: Path) -> str:
    """Pods placed per second: the simulator's score buckets against scanning every node for every pod."""
    from gpu_bootstrap.render import scheduler as render
    from gpu_bootstrap.sim import trace
    nodes = trace.load_nodes(traces / "openb_node_list_gpu_node.csv")
    pods = replay.population(trace.load_pods(traces / "openb_pod_list_default.csv"), "A")
    arrivals = replay.sample(pods, sum(n.gpus for n in nodes), 42, 1.3)
    ours = scoring.profile_from_config(render.scheduler_configuration(SchedulerConfig(), "1.33.0"))
    lines = []
    for profile in (scoring.DEFAULT_PROFILE, ours):
        timings = {}
        for mode in ("buckets", "scan"):
            scheduler = engine.Scheduler(engine.Cluster(nodes), profile, random.Random(1))
            place = scheduler.place if mode == "buckets" else (
                lambda pod, s=scheduler: _scan(s, pod))
            started = time.perf_counter()
            for pod in arrivals.pods:
                place(pod)
            timings[mode] = len(arrivals.pods) / (time.perf_counter() - started)
        lines.append(f"{profile.name:24} {timings['buckets']:10.0f} pods/s  scan {timings['scan']:8.0f} pods/s  "
                     f"ratio {timings['buckets'] / timings['scan']:.1f}x")
    return "\n".join(lines)


def _scan(scheduler: engine.Scheduler, pod) -> int | None:
    scorer = scheduler.scorers[pod.gpus > 0]
    cluster = scheduler.cluster
    scores = [(scorer.score(i, pod), i) for i in range(len(cluster.nodes)) if cluster.fits(i, pod)]
    if not scores:
        return None
    top = max(s for s, _ in scores)
    index = scheduler.rng.choice([i for s, i in scores if s == top])
    cluster.add(index, pod)
    return index


def constraints(traces: Path, seeds: int) -> str:
    """The openb gpuspec33 pod list (a third of its pods limited to GPU models) as given, and rewritten with each
    gpu_spec as a node_affinity on nvidia.com/gpu.product: the figures must be equal, and the label matching should
    cost about what the model check costs."""
    import csv
    import tempfile
    source = traces / "openb_pod_list_gpuspec33.csv"
    rows = list(csv.DictReader(source.open()))
    lines = []
    with tempfile.TemporaryDirectory() as folder:
        rewritten = Path(folder) / "gpuspec33-affinity.csv"
        with rewritten.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, [*rows[0], "node_affinity"], lineterminator="\n")
            writer.writeheader()
            for row in rows:
                models = [m for m in row["gpu_spec"].split("|") if m]
                writer.writerow({**row, "gpu_spec": "", "node_affinity":
                                 f"nvidia.com/gpu.product in ({','.join(models)})" if models else ""})
        figures, seconds = [], []
        for pods in (source, rewritten):
            started = time.perf_counter()
            document = simulate(SimOptions(pods=pods, nodes=traces / "openb_node_list_gpu_node.csv", seeds=seeds,
                                           workers=1), SchedulerConfig())
            seconds.append(time.perf_counter() - started)
            figures.append([(p["name"], p["alloc_pct_at_100"], p["alloc_pct_at_130"]) for p in document["policies"]])
            lines.append(f"  {'gpu_spec' if pods == source else 'node_affinity':14} {seconds[-1]:6.1f} s  "
                         f"{document['population']['constrained_pods']} constrained pods  " +
                         ", ".join(f"{name} {a:.2f}/{b:.2f}" for name, a, b in figures[-1]))
    lines.append(f"  same figures: {figures[0] == figures[1]}; time ratio node_affinity/gpu_spec: "
                 f"{seconds[1] / seconds[0]:.2f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--json", type=Path, help="also write the full results here")
    args = parser.parse_args()
    nodes = args.traces / "openb_node_list_gpu_node.csv"
    pods = args.traces / "openb_pod_list_default.csv"
    if not nodes.exists() or not pods.exists():
        print(f"the openb trace is not in {args.traces}", file=sys.stderr)
        return 2
    results = {}
    for track in ("A", "B"):
        started = time.perf_counter()
        document = simulate(SimOptions(pods=pods, nodes=nodes, track=track, seeds=args.seeds,
                                       policies=["blog-recipe", "random"]), SchedulerConfig())
        results[track] = document
        print(table(document))
        print(f"({time.perf_counter() - started:.1f}s, {document['speed']['workers']} workers)\n")
    print("simulator speed, one seed, track A (score buckets vs scanning every node per pod):")
    print(speed(args.traces))
    print("\nGPU-spec constraints (gpuspec33): gpu_spec against the same limits written as node_affinity:")
    print(constraints(args.traces, min(args.seeds, 3)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
