#!/usr/bin/env python3
"""Reproduce the FGD paper's table (Weng et al., USENIX ATC'23) with gpu-bootstrap's sharing model: for each of
the artifact's policies, the unallocated GPU % at 100 % and 130 % of the GPU capacity arrived, median over the
seeds, next to the paper's median (from the authors' cached results) and the difference; and the run time.

    python benchmarks/fgd_reproduction.py [--seeds 10] [--traces ../shared/traces] [--policy FGD ...]
                                         [--workers 1] [--json FILE] [--rng auto|go|python]

The protocol is the artifact's (sim/sharing.py): the openb GPU nodes (1213 nodes, 6212 GPUs); the trace's pods
shuffled with the seed, then pods drawn from it until 130 % of the capacity; arrival only; every node scored; the
allocated milli-GPU / capacity averaged over the arrivals whose demand rounds to each whole percent.
With Go's source tree installed (Debian golang-1.19-src, or GOROOT), `--rng go` (the default then) replays the
artifact's own random draws (sim/gorand.py, sharing.artifact_arrivals), so each seed is the authors' run.
`--json FILE` writes {"<policy>": {"100": <unallocated %>, "130": <unallocated %>}, ...}.
The traces are read from ../shared/traces (never copied into this repository); see its README for provenance.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_bootstrap.sim import gorand, sharing, trace  # noqa: E402

RNG_HELP = {"go": "Go's math/rand, the artifact's own draws", "python": "Python's random, not the artifact's draws"}

FIRST_SEED = 42
WORKLOAD = "openb_pod_list_default"


def paper(traces: Path) -> dict:
    """{policy: {"100": unallocated %, "130": ...}} from fgd_paper_unalloc_summary.csv (policy names without the
    artifact's "01-" prefixes)."""
    out: dict = {}
    with (traces / "fgd_paper_unalloc_summary.csv").open() as handle:
        for row in csv.DictReader(handle):
            if row["workload"] == WORKLOAD and row["arrived_pct_of_gpu_capacity"] in ("100", "130"):
                name = row["sc_policy"].split("-", 1)[1]
                out.setdefault(name, {})[row["arrived_pct_of_gpu_capacity"]] = float(row["median_unalloc_gpu_pct"])
    return out


def _one(job: tuple) -> tuple[str, int, float, float, float]:
    traces, policy, seed, rng = job
    nodes, pods, typical = _inputs(traces)
    capacity = sum(n.gpus for n in nodes) * sharing.MILLI
    prefixes = None
    if rng == "go":  # the artifact's own order and node prefixes for this seed
        sequence, prefixes = sharing.artifact_arrivals(pods, len(nodes), capacity, seed)
    else:
        sequence = sharing.arrivals(pods, capacity, seed)
    outcome = sharing.replay(nodes, sequence, policy, seed, typical, prefixes=prefixes)
    return policy, seed, 100.0 - outcome.at(100), 100.0 - outcome.at(130), outcome.seconds


_CACHE: dict = {}


def _inputs(traces: Path):
    if traces not in _CACHE:
        nodes = trace.load_nodes(traces / "openb_node_list_gpu_node.csv")
        rows = sorted(trace.load_pods(traces / f"{WORKLOAD}.csv"), key=lambda row: row["name"])  # as the artifact
        pods = sharing.share_pods(rows)
        _CACHE[traces] = nodes, pods, sharing.typical_pods(pods)
    return _CACHE[traces]


def run(traces: Path, policies: list[str], seeds: int, workers: int, rng: str = "python") -> dict:
    jobs = [(traces, policy, seed, rng) for policy in policies for seed in range(FIRST_SEED, FIRST_SEED + seeds)]
    started = time.perf_counter()
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(_one, jobs))
    else:
        results = [_one(job) for job in jobs]
    wall = time.perf_counter() - started
    out = {}
    for policy in policies:
        mine = [r for r in results if r[0] == policy]
        out[policy] = {"100": round(statistics.median(r[2] for r in mine), 2),
                       "130": round(statistics.median(r[3] for r in mine), 2),
                       "per_seed": {r[1]: [round(r[2], 2), round(r[3], 2)] for r in mine},
                       "seconds": round(sum(r[4] for r in mine), 1)}
    return {"policies": out, "wall_seconds": round(wall, 1), "seeds": seeds, "workers": workers, "rng": rng}


def table(result: dict, reference: dict) -> str:
    rows = [f"FGD artifact protocol on {WORKLOAD}: unallocated GPU % (median of {result['seeds']} seeds, 42...; "
            f"random numbers: {RNG_HELP[result['rng']]})",
            f"{'policy':14} {'ours@100':>8} {'paper':>6} {'diff':>6}   {'ours@130':>8} {'paper':>6} {'diff':>6}"
            f" {'cpu s':>6}"]
    worst = 0.0
    for policy, figures in result["policies"].items():
        cells = []
        for point in ("100", "130"):
            theirs = reference.get(policy, {}).get(point)
            diff = None if theirs is None else figures[point] - theirs
            worst = max(worst, abs(diff or 0.0))
            cells.append(f"{figures[point]:8.2f} {theirs if theirs is not None else float('nan'):6.2f} "
                         f"{diff if diff is not None else float('nan'):+6.2f}")
        rows.append(f"{policy:14} {cells[0]}   {cells[1]} {figures['seconds']:6.1f}")
    rows.append(f"largest difference: {worst:.2f} points (acceptance: 0.5); wall time {result['wall_seconds']} s "
                f"with {result['workers']} worker(s)")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--policy", action="append", choices=sharing.POLICIES)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--json", type=Path, metavar="FILE")
    parser.add_argument("--rng", choices=("auto", "go", "python"), default="auto",
                        help="go: Go's math/rand, so each seed gives the artifact's own pod order and node prefixes "
                             "(needs Go's source tree: Debian golang-1.19-src or GOROOT); python: Python's random "
                             "(same protocol, different draws); auto (default): go when the Go source is found")
    args = parser.parse_args()
    policies = args.policy or list(sharing.POLICIES)
    rng = args.rng
    if rng == "auto":
        rng = "go" if gorand.rng_go_path() else "python"
    elif rng == "go" and gorand.rng_go_path() is None:
        parser.error("--rng go: Go's math/rand source was not found (install golang-1.19-src or set GOROOT)")
    result = run(args.traces.resolve(), policies, args.seeds, args.workers, rng)
    print(table(result, paper(args.traces)))
    if args.json:
        args.json.write_text(json.dumps({p: {"100": f["100"], "130": f["130"]}
                                         for p, f in result["policies"].items()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
