"""Replays pods onto nodes one at a time with a model of kube-scheduler's filter and score.

Filter: the pod's cpu, memory and whole GPUs fit the node's free allocatable, its GPU model and labels are ones the
pod allows (gpu_spec; required node affinity, affinity.py), CPU-only pods stay off the tainted GPU nodes. Score: the
profile's NodeResourcesFit and BalancedAllocation (scoring.py). Ties: uniform random, seeded.

Requests are counted as kube-scheduler counts them (component-helpers' PodRequests): a pod is its containers, app
containers summed, sidecars (init containers with restartPolicy: Always) added, and at least what any init container
needs while it runs. For NodeResourcesFit a container whose cpu or memory request is not set counts 100m / 200 MiB;
an explicit 0 stays 0 (so a pod without containers counts nothing). BalancedAllocation counts the plain requests and
leaves out pods that request none of its resources (kubernetes PR #130260).

Speed: a node's score for a pod depends only on the node's usage and the pod's requests, and traces repeat a few
dozen request shapes. So each shape keeps its feasible nodes bucketed by score and re-scores only the nodes that
changed since that shape was last placed. With percentageOfNodesToScore below 100 the scheduler's answer also
depends on where its round-robin search starts, so that mode scans the nodes in order, as the scheduler does.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from gpu_bootstrap.sim import scoring
from gpu_bootstrap.sim.affinity import NodeAffinity
from gpu_bootstrap.sim.scoring import GPU, Profile

NONZERO_CPU_MILLI = 100  # kube-scheduler's defaults per container without a request (Fit scoring only)
NONZERO_MEMORY_MIB = 200


@dataclass(frozen=True)
class Node:
    name: str
    cpu: int  # allocatable millicores
    memory: int  # allocatable MiB
    gpus: int
    model: str = ""
    labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs: what required node affinity is matched on


@dataclass(frozen=True)
class Container:
    """One container's requests. None: the request is not set; 0: set to zero (the difference matters to Fit)."""

    cpu: int | None = None
    memory: int | None = None
    gpus: int = 0
    restartable: bool = False  # an init container with restartPolicy: Always, i.e. a sidecar


@dataclass(frozen=True)
class Pod:
    """A pod's requests. nonzero_cpu / nonzero_memory are what NodeResourcesFit counts (the per-container defaults
    included); left out, the pod is taken as one container whose 0 means "not set" (the openb CSV cannot tell an
    explicit 0 from a missing request), so they default to cpu or 100 and memory or 200."""

    cpu: int
    memory: int
    gpus: int
    models: frozenset | None = None  # allowed GPU models; None: any
    nonzero_cpu: int | None = None
    nonzero_memory: int | None = None
    affinity: NodeAffinity | None = None  # required node affinity; None: any node

    def __post_init__(self):
        if self.nonzero_cpu is None:
            object.__setattr__(self, "nonzero_cpu", self.cpu or NONZERO_CPU_MILLI)
        if self.nonzero_memory is None:
            object.__setattr__(self, "nonzero_memory", self.memory or NONZERO_MEMORY_MIB)

    @property
    def shape(self) -> tuple:
        return self.cpu, self.memory, self.gpus, self.models, self.affinity, self.nonzero_cpu, self.nonzero_memory

    @classmethod
    def from_containers(cls, containers, init_containers=(), models: frozenset | None = None,
                        overhead: tuple[int, int] = (0, 0)) -> "Pod":
        """The pod kube-scheduler sees, from containers in the engine's units (millicores, MiB, GPUs)."""
        cpu, memory, gpus = aggregate_requests(containers, init_containers)
        nonzero_cpu, nonzero_memory, _ = aggregate_requests(containers, init_containers,
                                                            (NONZERO_CPU_MILLI, NONZERO_MEMORY_MIB))
        return cls(cpu + overhead[0], memory + overhead[1], gpus, models, nonzero_cpu + overhead[0],
                   nonzero_memory + overhead[1])


def aggregate_requests(containers, init_containers=(), defaults: tuple[int, int] | None = None) -> tuple[int, ...]:
    """(cpu, memory, gpus) of a pod as resource.PodRequests adds them up: the app containers' sum plus the sidecars,
    or, if larger, what an init container needs while it runs (itself plus the sidecars started before it).
    `defaults` (cpu, memory) stand in, per container, for a request that is not set (NonMissingContainerRequests)."""
    def amounts(container: Container) -> tuple[int, int, int]:
        cpu, memory = container.cpu, container.memory
        if defaults:
            cpu = defaults[0] if cpu is None else cpu
            memory = defaults[1] if memory is None else memory
        return cpu or 0, memory or 0, container.gpus

    def add(a, b):
        return tuple(x + y for x, y in zip(a, b))

    total = (0, 0, 0)
    for container in containers:
        total = add(total, amounts(container))
    sidecars = peak = (0, 0, 0)
    for container in init_containers:
        own = amounts(container)
        if container.restartable:  # runs on beside the app containers
            total = add(total, own)
            sidecars = add(sidecars, own)
            running = sidecars
        else:
            running = add(own, sidecars)
        peak = tuple(max(x, y) for x, y in zip(peak, running))
    return tuple(max(x, y) for x, y in zip(total, peak))


def merge_pods(pods) -> Pod:
    """Pods on one node as one Pod: every count, the non-zero ones included, is a sum."""
    pods = list(pods)
    return Pod(sum(p.cpu for p in pods), sum(p.memory for p in pods), sum(p.gpus for p in pods), None,
               sum(p.nonzero_cpu for p in pods), sum(p.nonzero_memory for p in pods))


class Cluster:
    """Free and requested resources per node, and a log of which nodes changed (for the score caches).

    `used`: what already runs on a node, as one Pod or a list of pods (each with its own non-zero counts)."""

    def __init__(self, nodes: list[Node], used: dict[str, Pod | list[Pod]] | None = None):
        self.nodes = nodes
        self.cpu_cap = [n.cpu for n in nodes]
        self.mem_cap = [n.memory for n in nodes]
        self.gpu_cap = [n.gpus for n in nodes]
        self.model = [n.model for n in nodes]
        self.labels = [dict(n.labels) for n in nodes]
        self._eligible: dict[NodeAffinity, list[bool]] = {}  # per affinity: which nodes it admits (labels never change)
        count = len(nodes)
        self.cpu = [0] * count  # requested
        self.mem = [0] * count
        self.nz_cpu = [0] * count  # requested, with the non-zero defaults (what Fit scores)
        self.nz_mem = [0] * count
        self.gpu = [0] * count
        self.changes: list[int] = []
        self.total_gpus = sum(self.gpu_cap)
        for index, node in enumerate(nodes):
            if used and node.name in used:
                running = used[node.name]
                for pod in (running if isinstance(running, (list, tuple)) else [running]):
                    self.add(index, pod)

    def fits(self, index: int, pod: Pod) -> bool:
        if pod.affinity is not None and not (self._eligible.get(pod.affinity) or self.eligible(pod.affinity))[index]:
            return False
        if pod.gpus:
            if self.gpu_cap[index] - self.gpu[index] < pod.gpus:
                return False
            if pod.models is not None and self.model[index] not in pod.models:
                return False
        elif self.gpu_cap[index]:
            return False  # CPU-only pods do not tolerate the GPU nodes' taint
        return self.cpu_cap[index] - self.cpu[index] >= pod.cpu and self.mem_cap[index] - self.mem[index] >= pod.memory

    def add(self, index: int, pod: Pod, sign: int = 1) -> None:
        self.cpu[index] += sign * pod.cpu
        self.mem[index] += sign * pod.memory
        self.nz_cpu[index] += sign * pod.nonzero_cpu
        self.nz_mem[index] += sign * pod.nonzero_memory
        self.gpu[index] += sign * pod.gpus
        self.changes.append(index)

    def eligible(self, affinity: NodeAffinity) -> list[bool]:
        """Which nodes' labels satisfy `affinity`, computed once per affinity."""
        if affinity not in self._eligible:
            self._eligible[affinity] = [affinity.matches(labels) for labels in self.labels]
        return self._eligible[affinity]

    def free_gpus(self, models: frozenset | None = None, affinity: NodeAffinity | None = None) -> int:
        """Free GPUs on the nodes of the given models (None: any) that the affinity admits (None: all)."""
        admitted = self.eligible(affinity) if affinity is not None else [True] * len(self.nodes)
        return sum(cap - used for cap, used, model, ok in zip(self.gpu_cap, self.gpu, self.model, admitted)
                   if ok and (models is None or model in models))


class Scorer:
    """score(node, pod) for one profile, with kube-scheduler's integer arithmetic."""

    def __init__(self, profile: Profile, cluster: Cluster):
        self.profile = profile
        self.cluster = cluster
        self.shape = scoring.scaled_shape(profile.shape)
        self.fit_resources = [(name, weight) for name, weight in profile.resources if name in ("cpu", "memory", GPU)]
        self.balanced_resources = [r for r in profile.balanced_resources if r in ("cpu", "memory", GPU)]
        self.balances_cpu = "cpu" in self.balanced_resources
        self.balances_memory = "memory" in self.balanced_resources
        self.balances_gpu = GPU in self.balanced_resources

    def score(self, index: int, pod: Pod) -> int:
        profile, c = self.profile, self.cluster
        if profile.strategy == "Random":
            return 0
        weighted = []  # fit_score leaves out a resource whose allocatable is 0
        for name, weight in self.fit_resources:
            if name == "cpu":
                weighted.append((c.nz_cpu[index] + pod.nonzero_cpu, c.cpu_cap[index], weight))
            elif name == "memory":
                weighted.append((c.nz_mem[index] + pod.nonzero_memory, c.mem_cap[index], weight))
            elif pod.gpus and c.gpu_cap[index]:  # an extended resource the pod does not request is left out
                weighted.append((c.gpu[index] + pod.gpus, c.gpu_cap[index], weight))
        total = profile.fit_weight * scoring.fit_score(profile.strategy, weighted, self.shape)
        if profile.balanced_weight and not self.best_effort(pod):
            before, after = [], []  # requested / allocatable without and with the pod
            for name in self.balanced_resources:
                if name == "cpu" and c.cpu_cap[index]:
                    used, added, capacity = c.cpu[index], pod.cpu, c.cpu_cap[index]
                elif name == "memory" and c.mem_cap[index]:
                    used, added, capacity = c.mem[index], pod.memory, c.mem_cap[index]
                elif name == GPU and pod.gpus and c.gpu_cap[index]:
                    used, added, capacity = c.gpu[index], pod.gpus, c.gpu_cap[index]
                else:
                    continue
                before.append(used / capacity)
                after.append((used + added) / capacity)
            balanced = scoring.balanced_change_score(before, after) if profile.balanced_by_change else \
                scoring.balanced_score(after)
            total += profile.balanced_weight * balanced
        return total

    def best_effort(self, pod: Pod) -> bool:
        """BalancedAllocation's PreScore skips a pod that requests none of its resources (kubernetes PR #130260):
        otherwise every such pod would score the emptiest node best and pile onto it."""
        return not ((self.balances_cpu and pod.cpu) or (self.balances_memory and pod.memory) or
                    (self.balances_gpu and pod.gpus))


class ShapeIndex:
    """For one pod shape: its feasible nodes grouped by score, brought up to date from the cluster's change log."""

    def __init__(self, scorer: Scorer, pod: Pod):
        self.scorer = scorer
        self.pod = pod
        self.node_score: dict[int, int] = {}
        self.buckets: dict[int, set[int]] = {}
        self.seen = len(scorer.cluster.changes)
        for index in range(len(scorer.cluster.nodes)):
            self._rescore(index)

    def _rescore(self, index: int) -> None:
        old = self.node_score.pop(index, None)
        if old is not None:
            bucket = self.buckets[old]
            bucket.discard(index)
            if not bucket:
                del self.buckets[old]
        if self.scorer.cluster.fits(index, self.pod):
            score = self.scorer.score(index, self.pod)
            self.node_score[index] = score
            self.buckets.setdefault(score, set()).add(index)

    def best(self, rng: random.Random) -> int | None:
        changes = self.scorer.cluster.changes
        if self.seen < len(changes):
            for index in set(changes[self.seen:]):
                self._rescore(index)
            self.seen = len(changes)
        if not self.buckets:
            return None
        top = self.buckets[max(self.buckets)]
        return next(iter(top)) if len(top) == 1 else rng.choice(tuple(top))


class Scheduler:
    """Places pods with one profile (GPU pods) and the default profile (CPU-only pods), as deployed."""

    def __init__(self, cluster: Cluster, gpu_profile: Profile, rng: random.Random,
                 cpu_profile: Profile = scoring.DEFAULT_PROFILE):
        self.cluster = cluster
        self.rng = rng
        self.scorers = {True: Scorer(gpu_profile, cluster), False: Scorer(cpu_profile, cluster)}
        self.indexes: dict[tuple, ShapeIndex] = {}
        self.next_start = {True: 0, False: 0}

    def place(self, pod: Pod) -> int | None:
        scorer = self.scorers[pod.gpus > 0]
        percentage = scorer.profile.percentage_of_nodes_to_score
        if scoring.nodes_to_find(len(self.cluster.nodes), percentage) < len(self.cluster.nodes):
            index = self._place_scanning(scorer, pod)
        else:
            key = (pod.gpus > 0, pod.shape)
            if key not in self.indexes:
                self.indexes[key] = ShapeIndex(scorer, pod)
            index = self.indexes[key].best(self.rng)
        if index is not None:
            self.cluster.add(index, pod)
        return index

    def _place_scanning(self, scorer: Scorer, pod: Pod) -> int | None:
        """findNodesThatFitPod + selectHost: filter from a rotating start until enough nodes fit, then score."""
        count = len(self.cluster.nodes)
        wanted = scoring.nodes_to_find(count, scorer.profile.percentage_of_nodes_to_score)
        start = self.next_start[pod.gpus > 0]
        feasible, processed = [], 0
        for offset in range(count):
            index = (start + offset) % count
            processed += 1
            if self.cluster.fits(index, pod):
                feasible.append(index)
                if len(feasible) >= wanted:
                    break
        self.next_start[pod.gpus > 0] = (start + processed) % count
        if not feasible:
            return None
        scores = [(scorer.score(index, pod), index) for index in feasible]
        top = max(score for score, _ in scores)
        tied = [index for score, index in scores if score == top]
        return tied[0] if len(tied) == 1 else self.rng.choice(tied)

    def remove(self, index: int, pod: Pod) -> None:
        self.cluster.add(index, pod, sign=-1)


def _per_gpu(amount: int, gpus: int) -> float:
    return amount / gpus if gpus else float(amount)


# (name, pod order, node order). Pods always go largest GPU request first; within a size, cpu per GPU decides.
FFD_ORDERS = (
    ("light pods first, cpu-lean nodes first",
     lambda p: (-p.gpus, _per_gpu(p.cpu, p.gpus)), lambda n: _per_gpu(n.cpu, n.gpus)),
    ("heavy pods first, cpu-rich nodes first",
     lambda p: (-p.gpus, -_per_gpu(p.cpu, p.gpus)), lambda n: -_per_gpu(n.cpu, n.gpus)),
    ("heavy pods first, largest nodes first", lambda p: (-p.gpus, -p.cpu, -p.memory), lambda n: -n.gpus),
)


def first_fit_decreasing(nodes: list[Node], pods: list[Pod], pod_key, node_key,
                         used: dict[str, Pod | list[Pod]] | None = None) -> int:
    """Offline: every pod known in advance, taken in `pod_key` order (largest GPU request first), each onto the
    first node in `node_key` order where it fits (cpu, memory, model). Returns the GPUs allocated."""
    order = sorted(range(len(nodes)), key=lambda i: (node_key(nodes[i]), i))
    cluster = Cluster([nodes[i] for i in order], used)
    candidates: dict[int, list[int]] = {}  # GPU size -> nodes that may still take it (full ones dropped)
    allocated = 0
    for pod in sorted(pods, key=pod_key):
        if pod.gpus not in candidates:
            candidates[pod.gpus] = [i for i in range(len(order))
                                    if (cluster.gpu_cap[i] >= pod.gpus if pod.gpus else not cluster.gpu_cap[i])]
        kept = candidates[pod.gpus]
        for position, index in enumerate(kept):
            if cluster.fits(index, pod):
                cluster.add(index, pod)
                allocated += pod.gpus
                if pod.gpus and cluster.gpu_cap[index] - cluster.gpu[index] < pod.gpus:
                    del kept[position]
                break
    return allocated


def best_offline(nodes: list[Node], pods: list[Pod],
                 used: dict[str, Pod | list[Pod]] | None = None) -> tuple[int, str]:
    """The best of a few first-fit-decreasing orders: an achievable offline reference, not a proven optimum."""
    return max((first_fit_decreasing(nodes, pods, pod_key, node_key, used), name)
               for name, pod_key, node_key in FFD_ORDERS)
