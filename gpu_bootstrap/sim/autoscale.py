"""`simulate --autoscale`: a trace's pods arrive and leave at their own times on a cluster that grows and shrinks as
an autoscaler with consolidation makes it (Karpenter's WhenEmpty), and what counts is the node-hours each scheduling
profile costs.

The autoscaler modelled: a node of one instance type is added the moment a pod fits on no node (Karpenter provisions
for pending pods; the minute a real launch takes is left out, the same for every profile), and a node that has been
empty for `consolidate_after` is removed, as our NodePools' `consolidationPolicy: WhenEmpty` does. Running pods are
never moved. So a profile changes the bill only through where it puts each arriving pod: packing leaves the
emptiest nodes alone until they empty out and go; spreading (kube-scheduler's default, LeastAllocated) puts new pods
on exactly those nodes and keeps them alive.

Pure: command.py reads the files; benchmarks/autoscale_real.py measures the same thing on the real Karpenter.
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from gpu_bootstrap.sim.engine import Cluster, Node, Pod, Scheduler
from gpu_bootstrap.sim.scoring import Profile

HOUR = 3600.0


@dataclass(frozen=True)
class TimedPod:
    """A pod with the trace's times, in seconds: it asks at `start` and is gone at `end`."""

    pod: Pod
    start: int
    end: int


@dataclass(frozen=True)
class Run:
    """One profile, one seed."""

    nodes_launched: int
    node_seconds: float
    peak_nodes: int
    unplaceable: int  # pods no node of the instance type can ever take (too big, another GPU model, affinity)


def timed(rows: list[dict], track: str) -> list[TimedPod]:
    """The GPU pods of a pod list with both times, in arrival order. Track A: whole-GPU pods only; B: every GPU pod,
    a fractional GPU rounded up to one (CPU-only pods never land on GPU nodes, so they cost no GPU node)."""
    chosen = []
    for row in rows:
        start, end = row.get("start"), row.get("end")
        if row["num_gpu"] == 0 or start is None or end is None or end <= start:
            continue
        if track == "A" and row["gpu_milli"] not in (0, 1000, None):
            continue
        pod = Pod(row["cpu_milli"], row["memory_mib"], row["num_gpu"], row["models"], affinity=row.get("affinity"))
        chosen.append(TimedPod(pod, start, end))
    return sorted(chosen, key=lambda p: p.start)


def instance_type(nodes: list[Node]) -> Node:
    """What the autoscaler adds: the commonest shape among the inventory's nodes with the most GPUs (the nodes a GPU
    NodePool launches), labels kept for pods' node affinity."""
    most = max(n.gpus for n in nodes)
    shapes: dict[tuple, list[Node]] = {}
    for node in nodes:
        if node.gpus == most:
            shapes.setdefault((node.cpu, node.memory, node.model, node.labels), []).append(node)
    return max(shapes.values(), key=lambda same: (len(same), same[0].cpu, same[0].memory))[0]


def most_at_once(pods: list[TimedPod]) -> int:
    """The most pods running at one time: no more nodes than that are ever up at once, since a node is added only
    when no node, empty ones included, can take the pod."""
    events = sorted([(p.start, 1) for p in pods] + [(p.end, -1) for p in pods])  # a pod leaves before one arrives
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


class Autoscaled:
    """A cluster of `size` slots of one instance type. A slot not in use holds a placeholder that fills it, so no pod
    fits there and the scheduler model's caches need no other notion of a node that is not there."""

    def __init__(self, template: Node, size: int, profile: Profile, seed: int, consolidate_after: float):
        self.after = consolidate_after
        nodes = [Node(f"slot-{i}", template.cpu, template.memory, template.gpus, template.model, template.labels)
                 for i in range(size)]
        self.filler = Pod(template.cpu, template.memory, template.gpus, nonzero_cpu=template.cpu,
                          nonzero_memory=template.memory)
        self.cluster = Cluster(nodes, {n.name: self.filler for n in nodes})
        self.scheduler = Scheduler(self.cluster, profile, random.Random(seed * 7919 + 1))
        self.free = list(range(size - 1, -1, -1))  # slots to launch into, lowest first
        self.pods_on = [0] * size
        self.up_since: dict[int, float] = {}
        self.expiry: list[tuple[float, int, int]] = []  # (remove at, slot, emptied as the slot's n-th time)
        self.emptied = [0] * size
        self.launched = self.peak = 0
        self.node_seconds = 0.0

    def consolidate(self, now: float) -> None:
        """Remove every node that has been empty for `consolidate_after` by `now`."""
        while self.expiry and self.expiry[0][0] <= now:
            at, slot, count = heapq.heappop(self.expiry)
            if self.pods_on[slot] == 0 and self.emptied[slot] == count and slot in self.up_since:
                self.node_seconds += at - self.up_since.pop(slot)
                self.cluster.add(slot, self.filler)
                self.free.append(slot)

    def arrive(self, pod: Pod, now: float) -> int:
        slot = self.scheduler.place(pod)
        if slot is None:
            self._launch(now)
            slot = self.scheduler.place(pod)
        self.pods_on[slot] += 1
        return slot

    def leave(self, slot: int, pod: Pod, now: float) -> None:
        self.scheduler.remove(slot, pod)
        self.pods_on[slot] -= 1
        if self.pods_on[slot] == 0:
            self.emptied[slot] += 1
            heapq.heappush(self.expiry, (now + self.after, slot, self.emptied[slot]))

    def _launch(self, now: float) -> None:
        slot = self.free.pop()
        self.cluster.add(slot, self.filler, sign=-1)
        self.up_since[slot] = now
        self.launched += 1
        self.peak = max(self.peak, len(self.up_since))


def placeable(pods: list[TimedPod], template: Node) -> list[TimedPod]:
    """The pods an empty node of the instance type can take: the autoscaler can launch nothing for the others."""
    empty = Cluster([template])
    return [p for p in pods if empty.fits(0, p.pod)]


def replay(pods: list[TimedPod], template: Node, profile: Profile, seed: int, consolidate_after: float) -> Run:
    """Every pod from its start to its end; at the end every node empties and is removed `consolidate_after` later."""
    chosen = placeable(pods, template)
    model = Autoscaled(template, max(most_at_once(chosen), 1), profile, seed, consolidate_after)
    events = sorted([(p.start, 1, i) for i, p in enumerate(chosen)] +
                    [(p.end, 0, i) for i, p in enumerate(chosen)])  # at one time, departures first
    where: dict[int, int] = {}
    for now, arriving, index in events:
        model.consolidate(now)
        if arriving:
            where[index] = model.arrive(chosen[index].pod, now)
        else:
            model.leave(where.pop(index), chosen[index].pod, now)
    model.consolidate(float("inf"))
    return Run(model.launched, model.node_seconds, model.peak, len(pods) - len(chosen))


def report(pods: list[TimedPod], template: Node, profiles: list[Profile], seeds: list[int],
           consolidate_after: float, progress=None) -> dict:
    """Every profile under every seed (ties between equal nodes are broken at random), medians: the document
    `simulate --autoscale` shows. The first profile is the baseline the others are compared with."""
    import statistics
    chosen = placeable(pods, template)
    policies = []
    for profile in profiles:
        runs = []
        for seed in seeds:
            runs.append(replay(chosen, template, profile, seed, consolidate_after))
            if progress is not None:
                progress()
        node_seconds = statistics.median(r.node_seconds for r in runs)
        policies.append({"name": profile.name, "profile": profile.describe(), "node_seconds": node_seconds,
                         "node_hours": round(node_seconds / HOUR, 1),
                         "nodes_launched": statistics.median(r.nodes_launched for r in runs),
                         "peak_nodes": statistics.median(r.peak_nodes for r in runs)})
    baseline = policies[0]["node_seconds"]
    for policy in policies:
        policy["vs_baseline_pct"] = round(100.0 * (policy["node_seconds"] - baseline) / baseline, 1) if baseline \
            else 0.0
    span = (max(p.end for p in chosen) - min(p.start for p in chosen)) / HOUR if chosen else 0.0
    floor = gpu_hours(chosen) / template.gpus
    return {"autoscale": {
        "instance": {"gpus": template.gpus, "cpu_milli": template.cpu, "memory_mib": template.memory,
                     "model": template.model},
        "consolidate_after_seconds": consolidate_after, "pods": len(pods), "unplaceable": len(pods) - len(chosen),
        "most_pods_at_once": most_at_once(chosen), "span_hours": round(span, 1),
        "floor_node_hours": round(floor, 1), "seeds": len(seeds), "seed_values": list(seeds),
        "baseline": policies[0]["name"], "policies": policies}}


def gpu_hours(pods: list[TimedPod]) -> float:
    """The GPU-hours the pods ask for: divided by the instance's GPUs, the node-hours no scheduler can go below."""
    return sum(p.pod.gpus * (p.end - p.start) for p in pods) / HOUR
