"""The packing benchmark's protocol (../shared/notes/packing-benchmark.md, after Weng et al., ATC'23): sample pods
with replacement until their GPU requests reach `tune` x the cluster's GPUs, place them one by one in that random
order (no departures unless asked), and measure allocation against arrived demand."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from gpu_bootstrap.sim.engine import Cluster, Node, Pod, Scheduler, best_offline
from gpu_bootstrap.sim.scoring import Profile

SIZES = (1, 2, 4, 8)
CURVE_STEP = 1.0  # percent of capacity between recorded curve points


@dataclass
class Sample:
    """One seed's arrival sequence, and where 100 % of the GPU capacity had arrived."""

    pods: list[Pod]
    at_100: int  # number of pods arrived when demand first reached 100 %


def population(pods: list[dict], track: str) -> list[Pod]:
    """Track A: whole-GPU pods only. Track B: every pod, a fractional GPU rounded up to one whole GPU (what a stock
    device-plugin cluster does), CPU-only pods included."""
    chosen = []
    for pod in pods:
        whole = pod["gpu_milli"] in (0, 1000) or pod["num_gpu"] == 0
        if track == "A" and (pod["num_gpu"] == 0 or not whole):
            continue
        chosen.append(Pod(pod["cpu_milli"], pod["memory_mib"], pod["num_gpu"], pod["models"],
                          affinity=pod.get("affinity")))
    return chosen


def sample(pods: list[Pod], capacity: int, seed: int, tune: float) -> Sample:
    """Draw with replacement until the GPU requests reach tune x capacity (draws are already in random order)."""
    rng = random.Random(seed)
    if not any(p.gpus for p in pods):
        raise ValueError("the pod list has no GPU pods for this track")
    drawn, demand, at_100 = [], 0, None
    while demand < tune * capacity:
        pod = rng.choice(pods)
        drawn.append(pod)
        demand += pod.gpus
        if at_100 is None and demand >= capacity:
            at_100 = len(drawn)
    return Sample(drawn, at_100 or len(drawn))


@dataclass
class Outcome:
    """What one policy did with one seed's arrivals."""

    alloc_pct_at_100: float = 0.0
    alloc_pct_at_130: float = 0.0
    frag_failures: dict = field(default_factory=lambda: {str(s): 0 for s in SIZES})  # up to 100 % arrived
    frag_failures_to_end: dict = field(default_factory=lambda: {str(s): 0 for s in SIZES})
    frag_failed_gpus: int = 0
    first_frag_failure_pct: float | None = None
    first_failure_pct: float | None = None
    stranded_gpus: int = 0  # at 100 %: free GPUs on nodes whose cpu or memory cannot take the smallest GPU pod
    partial_free_gpus: int = 0  # at 100 %: free GPUs on nodes already partly used
    free_8gpu_nodes: int = 0  # at 100 %: 8-GPU nodes with no GPU in use
    free_4gpu_nodes: int = 0
    unplaced_cpu_pods: int = 0
    curve: list = field(default_factory=list)  # [(arrived %, allocated %)]
    placed: int = 0


def replay(nodes: list[Node], arrivals: Sample, profile: Profile, seed: int, used: dict | None = None,
           departures: float = 0.0, placer=None) -> Outcome:
    """`placer(cluster)`, when given, makes what places the pods instead of the model (benchmarks/packing_real.py
    hands in the real kube-scheduler): an object with place(pod) -> node index or None, which books a placed pod
    into `cluster` as engine.Scheduler does, so the figures are counted the same way for both."""
    cluster = Cluster(nodes, used)
    rng = random.Random(seed * 7919 + 1)
    scheduler = placer(cluster) if placer is not None else Scheduler(cluster, profile, rng)
    capacity = cluster.total_gpus
    smallest = _smallest_gpu_pod(arrivals.pods)
    outcome = Outcome()
    running: list[tuple[int, Pod]] = []
    arrived = allocated = 0
    next_point = 0.0
    for number, pod in enumerate(arrivals.pods, start=1):
        arrived += pod.gpus
        index = scheduler.place(pod)
        if index is not None:
            allocated += pod.gpus
            outcome.placed += 1
            if departures:
                running.append((index, pod))
        elif pod.gpus:
            _failure(outcome, cluster, pod, 100.0 * arrived / capacity, number <= arrivals.at_100)
        else:
            outcome.unplaced_cpu_pods += 1
        if departures and running and rng.random() < departures:
            leaving, gone = running.pop(rng.randrange(len(running)))
            scheduler.remove(leaving, gone)
            allocated -= gone.gpus
        if 100.0 * arrived / capacity >= next_point:
            outcome.curve.append((round(100.0 * arrived / capacity, 2), round(100.0 * allocated / capacity, 2)))
            next_point += CURVE_STEP
        if number == arrivals.at_100:
            outcome.alloc_pct_at_100 = 100.0 * allocated / capacity
            _snapshot(outcome, cluster, smallest)
    outcome.alloc_pct_at_130 = 100.0 * allocated / capacity
    return outcome


def _failure(outcome: Outcome, cluster: Cluster, pod: Pod, arrived_pct: float, before_100: bool) -> None:
    if outcome.first_failure_pct is None:
        outcome.first_failure_pct = round(arrived_pct, 2)
    if cluster.free_gpus(pod.models, pod.affinity) < pod.gpus:
        return  # not fragmentation: the GPUs are not there at all
    size = str(pod.gpus)
    outcome.frag_failures_to_end[size] = outcome.frag_failures_to_end.get(size, 0) + 1
    if before_100:
        outcome.frag_failures[size] = outcome.frag_failures.get(size, 0) + 1
        outcome.frag_failed_gpus += pod.gpus
    if outcome.first_frag_failure_pct is None:
        outcome.first_frag_failure_pct = round(arrived_pct, 2)


def _smallest_gpu_pod(pods: list[Pod]) -> tuple[int, int]:
    gpu_pods = [p for p in pods if p.gpus]
    return min(p.cpu for p in gpu_pods), min(p.memory for p in gpu_pods)


def _snapshot(outcome: Outcome, cluster: Cluster, smallest: tuple[int, int]) -> None:
    min_cpu, min_mem = smallest
    for i in range(len(cluster.nodes)):
        free = cluster.gpu_cap[i] - cluster.gpu[i]
        if not free:
            continue
        if cluster.gpu[i]:
            outcome.partial_free_gpus += free
        if cluster.cpu_cap[i] - cluster.cpu[i] < min_cpu or cluster.mem_cap[i] - cluster.mem[i] < min_mem:
            outcome.stranded_gpus += free
        if not cluster.gpu[i] and cluster.gpu_cap[i] in (4, 8):
            if cluster.gpu_cap[i] == 8:
                outcome.free_8gpu_nodes += 1
            else:
                outcome.free_4gpu_nodes += 1


def offline_reference(nodes: list[Node], arrivals: Sample, used: dict | None = None) -> dict:
    """Offline first-fit decreasing over the pods arrived by 100 % and by the end (best of a few orders)."""
    capacity = sum(n.gpus for n in nodes)
    at_100, order_100 = best_offline(nodes, arrivals.pods[:arrivals.at_100], used)
    at_end, order_end = best_offline(nodes, arrivals.pods, used)
    return {"alloc_pct_at_100": 100.0 * at_100 / capacity, "alloc_pct_at_130": 100.0 * at_end / capacity,
            "order_at_100": order_100, "order_at_130": order_end}
