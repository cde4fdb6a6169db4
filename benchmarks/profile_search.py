#!/usr/bin/env python3
"""Search stock kube-scheduler score configurations for a whole-GPU profile that packs well at both loads.

    python benchmarks/profile_search.py [--seeds 5] [--traces ../shared/traces] [--workers 1] [--json FILE]

Track A of the openb trace (whole-GPU pods; docs/status-and-simulate.md), every candidate over the same seeds.
Candidates: NodeResourcesFit's strategies (LeastAllocated, MostAllocated, RequestedToCapacityRatio with several
shapes) and resource weights (nvidia.com/gpu, cpu, memory), NodeResourcesBalancedAllocation with and without
nvidia.com/gpu among its resources, and the two plugins' weights; percentageOfNodesToScore 100 throughout, as `up`
deploys. Judged by GPUs allocated at 100 % and 130 % arrived and GPUs stranded on cpu- or memory-full nodes. The bar
for replacing the default profile: at least 98.3 % at 100 % and the default kube-scheduler profile's 99.44 % at
130 %. Prints every candidate, the Pareto front (no other candidate is at least as good on all three figures and
better on one) and which candidates pass the bar.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_bootstrap.sim import run, scoring, trace  # noqa: E402
from gpu_bootstrap.sim.scoring import GPU, Profile  # noqa: E402

BAR_100, BAR_130 = 98.3, 99.44
SHAPES = {"up": ((0, 0), (100, 10)), "steep": ((0, 0), (50, 2), (100, 10)), "early": ((0, 0), (50, 8), (100, 10))}
REFINED_SHAPES = {"steep": SHAPES["steep"], "steeper": ((0, 0), (50, 1), (100, 10)),
                  "late": ((0, 0), (75, 2), (100, 10)), "knee90": ((0, 0), (90, 5), (100, 10))}
FINE_SHAPES = {"steeper": REFINED_SHAPES["steeper"], "knee40": ((0, 0), (40, 1), (100, 10)),
               "knee60": ((0, 0), (60, 1), (100, 10))}


def candidates() -> list[Profile]:
    out = [dataclass_replace(scoring.DEFAULT_PROFILE, percentage_of_nodes_to_score=100)]
    weights = {"gpu": ((GPU, 100),), "gpu+cpu": ((GPU, 100), ("cpu", 1)), "gpu+cpu+mem": ((GPU, 100), ("cpu", 1),
                                                                                           ("memory", 1)),
               "gpu=cpu=mem": ((GPU, 1), ("cpu", 1), ("memory", 1)), "gpu10+cpu+mem": ((GPU, 10), ("cpu", 1),
                                                                                    ("memory", 1))}
    balanced = {"off": (0, ("cpu", "memory")), "cpu,mem": (1, ("cpu", "memory")),
                "cpu,mem,gpu": (1, ("cpu", "memory", GPU))}
    for wname, resources in weights.items():
        for bname, (bweight, bresources) in balanced.items():
            for fit_weight in ((1,) if bweight == 0 else (1, 3)):
                out.append(Profile(f"Most {wname} bal={bname} w{fit_weight}", "MostAllocated", resources,
                                   fit_weight=fit_weight, balanced_weight=bweight, balanced_resources=bresources,
                                   percentage_of_nodes_to_score=100))
    for sname, shape in SHAPES.items():
        for wname in ("gpu", "gpu+cpu+mem"):
            for bname in ("off", "cpu,mem,gpu"):
                bweight, bresources = balanced[bname]
                out.append(Profile(f"RTCR {sname} {wname} bal={bname}", "RequestedToCapacityRatio",
                                   weights[wname], shape=shape, balanced_weight=bweight,
                                   balanced_resources=bresources, percentage_of_nodes_to_score=100))
    # round 2, around the first round's best (RequestedToCapacityRatio + BalancedAllocation with the GPU)
    for sname, shape in REFINED_SHAPES.items():
        for fit_weight, bw in ((1, 1), (1, 2), (1, 3), (2, 1)):
            out.append(Profile(f"RTCR {sname} gpu bal=cpu,mem,gpu w{fit_weight}/{bw}", "RequestedToCapacityRatio",
                               weights["gpu"], shape=shape, fit_weight=fit_weight, balanced_weight=bw,
                               balanced_resources=("cpu", "memory", GPU), percentage_of_nodes_to_score=100))
    # round 3: between round 2's two best weightings (2/1 and 1/1), near the bar
    for sname, shape in FINE_SHAPES.items():
        for fit_weight, bw in ((3, 2), (4, 3), (5, 4)):
            out.append(Profile(f"RTCR {sname} gpu bal=cpu,mem,gpu w{fit_weight}:{bw}", "RequestedToCapacityRatio",
                               weights["gpu"], shape=shape, fit_weight=fit_weight, balanced_weight=bw,
                               balanced_resources=("cpu", "memory", GPU), percentage_of_nodes_to_score=100))
    for bname in ("cpu,mem", "cpu,mem,gpu"):
        bweight, bresources = balanced[bname]
        for fit_weight, bw in ((1, 1), (1, 3)):
            out.append(Profile(f"Least cpu+mem bal={bname} w{fit_weight}/{bw}", "LeastAllocated",
                               fit_weight=fit_weight, balanced_weight=bw, balanced_resources=bresources,
                               percentage_of_nodes_to_score=100))
    return out


def dataclass_replace(profile: Profile, **changes) -> Profile:
    import dataclasses
    return dataclasses.replace(profile, **changes)


def pareto(rows: list[dict]) -> list[dict]:
    def dominates(a, b):
        better_or_equal = (a["alloc_pct_at_100"] >= b["alloc_pct_at_100"] and
                           a["alloc_pct_at_130"] >= b["alloc_pct_at_130"] and a["stranded_gpus"] <= b["stranded_gpus"])
        strictly = (a["alloc_pct_at_100"] > b["alloc_pct_at_100"] or a["alloc_pct_at_130"] > b["alloc_pct_at_130"] or
                    a["stranded_gpus"] < b["stranded_gpus"])
        return better_or_equal and strictly
    return [r for r in rows if not any(dominates(o, r) for o in rows)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--json", type=Path, metavar="FILE")
    parser.add_argument("--only", metavar="TEXT", help="only the candidates whose name contains TEXT (and ours)")
    parser.add_argument("--kube-version", default="1.33.0", metavar="X.Y.Z",
                        help="the kube-scheduler whose scoring is modelled (1.36+ scores BalancedAllocation by the "
                             "change in balance; default 1.33.0)")
    args = parser.parse_args()
    nodes = trace.load_nodes(args.traces / "openb_node_list_gpu_node.csv")
    pods = trace.load_pods(args.traces / "openb_pod_list_default.csv")
    from gpu_bootstrap.core.config import SchedulerConfig
    from gpu_bootstrap.render import scheduler as render
    ours = scoring.profile_from_config(render.scheduler_configuration(SchedulerConfig(), args.kube_version), 0,
                                       args.kube_version)
    by_change = scoring.balanced_by_change(args.kube_version)
    profiles = [dataclass_replace(ours, name="ours (current default)")] + [
        dataclass_replace(p, balanced_by_change=by_change) for p in candidates() if not args.only or args.only in p.name]
    document = run(nodes, pods, profiles, "A", args.seeds, workers=args.workers)
    rows = [{"name": p["name"], "profile": p["profile"], "alloc_pct_at_100": p["alloc_pct_at_100"],
             "alloc_pct_at_130": p["alloc_pct_at_130"], "stranded_gpus": p["stranded_gpus"]}
            for p in document["policies"]]
    front = pareto(rows)
    passing = [r for r in rows if r["alloc_pct_at_100"] >= BAR_100 and r["alloc_pct_at_130"] >= BAR_130]
    print(f"track A, {document['inventory']['gpus']} GPUs, median of {args.seeds} seeds, {len(rows)} candidates, "
          f"{document['speed']['seconds']} s")
    print(f"{'candidate':44} {'@100':>6} {'@130':>6} {'stranded':>8}  pareto")
    for r in sorted(rows, key=lambda r: (-r["alloc_pct_at_100"], -r["alloc_pct_at_130"])):
        print(f"{r['name'][:44]:44} {r['alloc_pct_at_100']:6.2f} {r['alloc_pct_at_130']:6.2f} "
              f"{r['stranded_gpus']:8g}  {'*' if r in front else ''}")
    print(f"bar (>= {BAR_100} @100 and >= {BAR_130} @130): "
          f"{', '.join(r['name'] for r in passing) if passing else 'no candidate passes'}")
    if args.json:
        args.json.write_text(json.dumps({"candidates": rows, "pareto": front, "passing": passing}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
