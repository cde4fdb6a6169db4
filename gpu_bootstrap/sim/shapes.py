"""The workload-shape benchmark: pods of one shape (or a mix) arrive until a share of the GPUs is asked for, and
what counts is how many whole GPU nodes are left empty, against the ideal (the fewest nodes those pods fit on).

A bin-packing scheduler exists to keep whole nodes free for the jobs that need a whole node. The openb trace alone
does not show whether it does that for every workload: its pods' cpu and memory are in step with their GPUs. These
shapes are the ones that are not: inference pods (a GPU, next to no cpu or memory), light multi-GPU pods, a light mix,
and training pods whose cpu and memory fill a node before its GPUs do.

Pure: benchmarks/packing_shapes.py runs it through the model and the real kube-scheduler.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from gpu_bootstrap.sim.engine import Cluster, Node, Pod

GIB = 1024  # MiB
# name -> (what it stands for, [(GPUs, millicores, MiB), ...] drawn with equal chance)
SHAPES: dict[str, tuple[str, list[tuple[int, int, int]]]] = {
    "inference": ("1 GPU, 500m cpu, 1 Gi", [(1, 500, 1 * GIB)]),
    "light-2gpu": ("2 GPUs, 1 cpu, 4 Gi", [(2, 1000, 4 * GIB)]),
    "light-mix": ("1, 2 or 4 GPUs with 500m cpu and 1 Gi a GPU", [(1, 500, 1 * GIB), (2, 1000, 2 * GIB),
                                                                   (4, 2000, 4 * GIB)]),
    "training": ("1 GPU, 8 cpu, 64 Gi", [(1, 8000, 64 * GIB)]),
}
LOADS = (25, 50, 75)  # percent of the GPUs asked for


@dataclass(frozen=True)
class ShapeRun:
    shape: str
    load: int
    empty: int  # whole GPU nodes left with no GPU in use
    ideal: int  # empty nodes when the pods take the fewest nodes they fit on
    unplaced: int

    @property
    def share(self) -> float:
        """Empty nodes as a percentage of the ideal (100 when the ideal leaves none empty and so do we)."""
        return 100.0 if self.ideal == 0 else 100.0 * self.empty / self.ideal


def gpu_nodes(nodes: list[Node], gpus: int = 8) -> list[Node]:
    """The benchmark's cluster: the nodes with `gpus` GPUs, models dropped (the shapes ask for any GPU)."""
    return [Node(n.name, n.cpu, n.memory, n.gpus) for n in nodes if n.gpus == gpus]


def arrivals(shape: str, nodes: list[Node], load: int, seed: int) -> list[Pod]:
    """Pods of `shape` in random order until the next would ask for more than `load` % of the GPUs."""
    rng = random.Random(seed)
    wanted = sum(n.gpus for n in nodes) * load / 100
    pods, asked = [], 0
    while True:
        gpus, cpu, memory = rng.choice(SHAPES[shape][1])
        if asked + gpus > wanted:
            return pods
        pods.append(Pod(cpu, memory, gpus))
        asked += gpus


def ideal_nodes_used(nodes: list[Node], pods: list[Pod]) -> int:
    """The fewest nodes the pods fit on, by first-fit-decreasing onto the roomiest nodes first: exact for one shape
    (every node takes as many pods as its GPUs, cpu and memory allow, the roomiest the most), and for the light mix
    (sizes dividing 8, cpu and memory never binding); an upper bound otherwise. Pods that fit on no node (the load
    asks for more than the nodes' cpu or memory holds, e.g. training pods on small nodes) are left out, as a
    scheduler leaves them pending."""
    order = sorted(nodes, key=lambda n: (-n.gpus, -n.cpu * n.memory, n.name))
    cluster = Cluster(order)
    for pod in sorted(pods, key=lambda p: (-p.gpus, -p.memory, -p.cpu)):
        index = next((i for i in range(len(order)) if cluster.fits(i, pod)), None)
        if index is not None:
            cluster.add(index, pod)
    return sum(1 for used in cluster.gpu if used)


def measure(shape: str, load: int, nodes: list[Node], pods: list[Pod], placer) -> ShapeRun:
    """Place `pods` in order with `placer(cluster)` (engine.Scheduler or the real scheduler) and count."""
    cluster = Cluster(nodes)
    scheduler = placer(cluster)
    unplaced = sum(1 for pod in pods if scheduler.place(pod) is None)
    empty = sum(1 for used in cluster.gpu if not used)
    return ShapeRun(shape, load, empty, len(nodes) - ideal_nodes_used(nodes, pods), unplaced)


TARGET_SHARE = 95.0  # a bin-packing profile should leave at least this share of the ideal empty nodes


def largest_gpu_nodes(nodes: list[Node]) -> list[Node]:
    """The inventory's nodes with the most GPUs: the nodes a whole-node job needs (openb: its 617 8-GPU nodes)."""
    most = max((n.gpus for n in nodes), default=0)
    return gpu_nodes(nodes, most) if most else []


def _one(job: tuple) -> tuple[str, str, int, int, ShapeRun]:
    from gpu_bootstrap.sim.engine import Scheduler
    nodes, profile, shape, load, seed = job
    pods = arrivals(shape, nodes, load, seed)
    run = measure(shape, load, nodes, pods, lambda cluster: Scheduler(cluster, profile, random.Random(seed * 7919 + 1)))
    return profile.name, shape, load, seed, run


def report(nodes: list[Node], profiles: list, seeds: list[int], shape_names=tuple(SHAPES), loads=LOADS,
           workers: int | None = None, progress=None) -> dict:
    """Every shape at every load under every profile, on `nodes` (empty), medians over `seeds`: the document that
    `simulate --shapes` shows. Seed 42 alone gives what benchmarks/packing_shapes.py's model column gives."""
    import os
    import statistics
    from concurrent.futures import ProcessPoolExecutor
    jobs = [(nodes, p, s, load, seed) for s in shape_names for load in loads for p in profiles for seed in seeds]
    workers = workers or min(os.cpu_count() or 1, len(jobs))
    results = []
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            for result in pool.map(_one, jobs):
                results.append(result)
                if progress is not None:
                    progress()
    else:
        for job in jobs:
            results.append(_one(job))
            if progress is not None:
                progress()
    rows = []
    for shape in shape_names:
        for load in loads:
            cell = [r for r in results if r[1] == shape and r[2] == load]
            row = {"shape": shape, "load_pct": load, "ideal": int(statistics.median(r[4].ideal for r in cell)),
                   "policies": {}}
            for profile in profiles:
                runs = [r[4] for r in cell if r[0] == profile.name]
                row["policies"][profile.name] = {
                    "empty": statistics.median(r.empty for r in runs),
                    "share_pct": round(statistics.median(r.share for r in runs), 1),
                    "unplaced": max(r.unplaced for r in runs)}
            rows.append(row)
    return {"shapes": {"nodes": len(nodes), "gpus_per_node": nodes[0].gpus if nodes else 0,
                       "seeds": len(seeds), "seed_values": list(seeds), "target_share_pct": TARGET_SHARE,
                       "shape_names": {s: SHAPES[s][0] for s in shape_names},
                       "policies": [{"name": p.name, "profile": p.describe()} for p in profiles], "rows": rows}}
