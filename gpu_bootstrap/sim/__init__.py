"""`gpu-bootstrap simulate`: what a scheduling profile does to GPU packing, measured on a trace before deploying it.

run() replays every (policy, seed) pair, in parallel processes when there is more than one core, and reduces them
to medians over the seeds, plus the aggregate-capacity bound and an offline first-fit-decreasing reference.

The parts, all pure but command.py (which reads the files `simulate` names): engine.py (nodes, pods, the scheduling
cycle), scoring.py (kube-scheduler's scoring plugins), affinity.py, replay.py (a trace replayed under a profile),
fragmentation.py, sharing.py and deployable.py (the milli-GPU model and `--sharing`), trace.py, gorand.py (Go's
math/rand, for the FGD artifact's seeds).

May import: core, render.
"""
from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict

from gpu_bootstrap.sim import replay
from gpu_bootstrap.sim.engine import Node, Pod
from gpu_bootstrap.sim.scoring import Profile

FIRST_SEED = 42  # the paper's seeds are 42-51
SCALARS = ("alloc_pct_at_100", "alloc_pct_at_130", "first_frag_failure_pct", "first_failure_pct", "stranded_gpus",
           "partial_free_gpus", "free_8gpu_nodes", "free_4gpu_nodes", "frag_failed_gpus", "unplaced_cpu_pods")


def _one(job: tuple) -> tuple[str, int, dict, float]:
    nodes, arrivals, profile, seed, used, departures = job
    started = time.perf_counter()
    outcome = replay.replay(nodes, arrivals, profile, seed, used, departures)
    return profile.name, seed, asdict(outcome), time.perf_counter() - started


def _reference(job: tuple) -> tuple[int, dict]:
    nodes, arrivals, seed, used = job
    return seed, replay.offline_reference(nodes, arrivals, used)


def run(nodes: list[Node], pods: list[dict], profiles: list[Profile], track: str = "A", seeds: int = 3,
        tune: float = 1.3, used: dict[str, Pod | list[Pod]] | None = None, departures: float = 0.0,
        workers: int | None = None, progress=None) -> dict:
    capacity = sum(n.gpus for n in nodes)
    chosen = replay.population(pods, track)
    seed_list = list(range(FIRST_SEED, FIRST_SEED + seeds))
    arrivals = {seed: replay.sample(chosen, capacity, seed, tune) for seed in seed_list}
    jobs = [(nodes, arrivals[seed], profile, seed, used, departures) for profile in profiles for seed in seed_list]
    references = [(nodes, arrivals[seed], seed, used) for seed in seed_list]
    workers = workers or min(os.cpu_count() or 1, len(jobs))
    started = time.perf_counter()
    results, offline = [], {}
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            pending = [pool.submit(_one, job) for job in jobs]
            reference = [pool.submit(_reference, job) for job in references]
            for future in pending:
                results.append(future.result())
                _tick(progress)
            offline = dict(f.result() for f in reference)
    else:
        for job in jobs:
            results.append(_one(job))
            _tick(progress)
        offline = dict(_reference(job) for job in references)
    elapsed = time.perf_counter() - started
    placed = sum(r[2]["placed"] for r in results)
    return {
        "policies": [_summarise(p, [r for r in results if r[0] == p.name]) for p in profiles],
        "bounds": _bounds(offline),
        "track": track, "seeds": seeds, "seed_values": seed_list, "tune": tune, "departures": departures,
        "inventory": {"nodes": len(nodes), "gpu_nodes": sum(1 for n in nodes if n.gpus), "gpus": capacity},
        "population": {"pods": len(chosen), "gpu_pods": sum(1 for p in chosen if p.gpus),
                       "constrained_pods": sum(1 for p in chosen if p.models is not None or p.affinity is not None)},
        "arrivals_per_seed": statistics.median(len(a.pods) for a in arrivals.values()),
        "speed": {"seconds": round(elapsed, 2), "workers": workers,
                  "pods_per_second": round(sum(len(arrivals[r[1]].pods) for r in results) /
                                           max(sum(r[3] for r in results), 1e-9)),
                  "placed": placed},
    }


def _tick(progress) -> None:
    if progress is not None:
        progress()


def _median(values: list):
    present = [v for v in values if v is not None]
    if len(present) < len(values) / 2:  # most seeds never reached it: report "never"
        return None
    return round(statistics.median(present), 2)


def _summarise(profile: Profile, results: list) -> dict:
    outcomes = [r[2] for r in sorted(results, key=lambda r: r[1])]
    summary = {"name": profile.name, "profile": profile.describe()}
    for key in SCALARS:
        summary[key] = _median([o[key] for o in outcomes])
    for key in ("frag_failures", "frag_failures_to_end"):
        sizes = sorted({s for o in outcomes for s in o[key]}, key=int)
        summary[key] = {s: _median([o[key].get(s, 0) for o in outcomes]) for s in sizes}
    summary["curve"] = outcomes[0]["curve"]  # the first seed's, for plots
    return summary


def _bounds(offline: dict) -> dict:
    runs = list(offline.values())
    orders = sorted({r["order_at_100"] for r in runs} | {r["order_at_130"] for r in runs})
    return {"aggregate": {"alloc_pct_at_100": 100.0, "alloc_pct_at_130": 100.0,
                          "note": "allocated = min(arrived, capacity)"},
            "offline_ffd": {"alloc_pct_at_100": _median([r["alloc_pct_at_100"] for r in runs]),
                            "alloc_pct_at_130": _median([r["alloc_pct_at_130"] for r in runs]),
                            "note": "all pods known in advance; best of first-fit-decreasing orders: " +
                                    "; ".join(orders)}}


def gap_closed(document: dict, policy: str, baseline: str = "default") -> float | None:
    """How much of the gap between the baseline and the offline reference (at 100 % arrived) a policy closes."""
    by_name = {p["name"]: p for p in document["policies"]}
    if policy not in by_name or baseline not in by_name:
        return None
    reference = document["bounds"]["offline_ffd"]["alloc_pct_at_100"]
    base = by_name[baseline]["alloc_pct_at_100"]
    if reference is None or reference - base <= 0:
        return None
    return round(100.0 * (by_name[policy]["alloc_pct_at_100"] - base) / (reference - base), 1)
