"""Fragmentation of a live snapshot, measured by the simulator's own code: `status` reports these figures and
`status --defrag` plans with the same packing, so they agree with what `simulate` reports on the same nodes.

Pure: nodes and what their pods request in, numbers and plans out (the caller reads the cluster)."""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

from gpu_bootstrap.sim.affinity import NodeAffinity
from gpu_bootstrap.sim.engine import NONZERO_CPU_MILLI, NONZERO_MEMORY_MIB, Cluster, Node, Pod, Scheduler
from gpu_bootstrap.sim.replay import SIZES, Outcome, _snapshot
from gpu_bootstrap.sim.scoring import Profile

DEFRAG_SEED = 42  # ties between equally scored nodes are broken at random, reproducibly


def smallest_request(pods: list[Pod]) -> tuple[int, int]:
    """(cpu milli, memory MiB) of the smallest GPU pod seen; without any, the scheduler's defaults for a container
    that requests nothing: a GPU whose node has less than that left is stranded."""
    gpu_pods = [p for p in pods if p.gpus]
    if not gpu_pods:
        return NONZERO_CPU_MILLI, NONZERO_MEMORY_MIB
    return min(p.cpu for p in gpu_pods), min(p.memory for p in gpu_pods)


def measures(nodes: list[Node], used: dict[str, Pod] | None, smallest: tuple[int, int]) -> dict:
    """Free GPUs, the largest request one node can take, how many more 1/2/4/8-GPU pods fit, and simulate's
    snapshot figures (stranded, on partly used nodes, wholly free 8- and 4-GPU nodes)."""
    cluster = Cluster(nodes, used)
    outcome = Outcome()
    _snapshot(outcome, cluster, smallest)  # the very function simulate's replay measures with
    cpu, memory = smallest
    fits = {str(size): _how_many_fit(nodes, used, Pod(cpu, memory, size)) for size in SIZES}
    largest = max((size for size in range(max(cluster.gpu_cap, default=0), 0, -1)
                   if any(cluster.fits(i, Pod(cpu, memory, size)) for i in range(len(nodes)))), default=0)
    return {"free_gpus": cluster.free_gpus(), "largest_fit": largest, "fits": fits,
            "stranded_gpus": outcome.stranded_gpus, "partial_free_gpus": outcome.partial_free_gpus,
            "free_8gpu_nodes": outcome.free_8gpu_nodes, "free_4gpu_nodes": outcome.free_4gpu_nodes,
            "smallest_pod": {"cpu_milli": cpu, "memory_mib": memory}}


def _how_many_fit(nodes: list[Node], used: dict[str, Pod] | None, pod: Pod) -> int:
    cluster = Cluster(nodes, used)
    count = 0
    for index in range(len(nodes)):
        while cluster.fits(index, pod):
            cluster.add(index, pod)
            count += 1
    return count


# --- defragmentation: which nodes could be emptied, and where their pods would go -------------------------------------
@dataclass
class Move:
    pod: str  # an opaque key the caller gave (namespace/name)
    gpus: int
    to: str  # the node the packing puts it on


@dataclass
class Drain:
    node: str
    gpus: int  # the node's GPUs, all free once it is drained
    moves: list[Move] = field(default_factory=list)


@dataclass
class DefragPlan:
    drains: list[Drain]
    wanted: list[int]  # GPU requests the plan frees room for (pending ones, else the largest node)
    unmet: list[int]  # of those, the ones still without a node after the plan
    skipped: dict[str, str]  # node -> why it was not considered for draining

    def to_json(self) -> dict:
        return asdict(self)


def defrag(nodes: list[Node], used: dict[str, Pod], movable: dict[str, list[tuple[str, Pod]]],
           wanted: list[int | tuple[int, NodeAffinity | None]], profile: Profile,
           pinned: dict[str, str] | None = None) -> DefragPlan:
    """Empty whole nodes for the `wanted` GPU requests by re-placing the pods of the least used candidates onto the
    other nodes with `profile`'s packing (the simulator's scheduler). A request is a GPU count, or (count, required
    node affinity) when only some nodes may take it. `used`: node -> what all its pods request; `movable`: node ->
    [(pod key, pod)] that a controller would re-create elsewhere; `pinned`: node -> why it cannot be drained.
    Returns the drains in order; nothing is changed anywhere."""
    skipped = dict(pinned or {})
    used = dict(used)
    requests = sorted(((w, None) if isinstance(w, int) else w for w in wanted), key=lambda w: -w[0])
    unmet = list(requests)
    drains: list[Drain] = []
    promised: set[str] = set()  # drained nodes, each kept for the request it was drained for
    receiving: set[str] = set()  # nodes the plan moves pods to: draining one later would strand those pods there
    while unmet:
        need, affinity = unmet[0]
        eligible = [n for n in nodes if affinity is None or affinity.matches(dict(n.labels))]
        free = [n.name for n in eligible if n.name not in promised and n.gpus - _gpus(used, n.name) >= need]
        if free:  # room already: the request takes that node
            promised.add(free[0])
            unmet.pop(0)
            continue
        drain = _cheapest_drain(eligible, nodes, used, movable, promised | receiving, promised, skipped, need,
                                profile)
        if drain is None:
            break
        drains.append(drain)
        promised.add(drain.node)
        for move in drain.moves:
            pod = next(p for key, p in movable[drain.node] if key == move.pod)
            used[drain.node] = _plus(used[drain.node], pod, -1)
            used[move.to] = _plus(used.get(move.to, Pod(0, 0, 0)), pod, 1)
            receiving.add(move.to)
        unmet.pop(0)
    return DefragPlan(drains, [w[0] for w in requests], [w[0] for w in unmet], skipped)


def _gpus(used: dict[str, Pod], name: str) -> int:
    return used[name].gpus if name in used else 0


def _plus(total: Pod, pod: Pod, sign: int) -> Pod:
    return Pod(total.cpu + sign * pod.cpu, total.memory + sign * pod.memory, total.gpus + sign * pod.gpus)


def _cheapest_drain(eligible, nodes, used, movable, kept, promised, skipped, need, profile) -> Drain | None:
    """The `eligible` candidate (not `kept`: promised or receiving moved pods) with the fewest GPUs in use whose pods
    all find room elsewhere among `nodes` (not on promised nodes)."""
    candidates = sorted((n for n in eligible if n.gpus >= need and n.name not in kept and n.name not in skipped),
                        key=lambda n: (_gpus(used, n.name), len(movable.get(n.name, [])), n.name))
    for node in candidates:
        moves = _replace(nodes, used, promised | {node.name}, movable.get(node.name, []), profile)
        if moves is not None:
            return Drain(node.name, node.gpus, moves)
    return None


def _replace(nodes, used, excluded, pods, profile) -> list[Move] | None:
    """Where the packing puts `pods` (largest first) on the nodes not `excluded`; None if one finds no room."""
    others = [n for n in nodes if n.name not in excluded]
    cluster = Cluster(others, {name: pod for name, pod in used.items() if name not in excluded})
    scheduler = Scheduler(cluster, profile, random.Random(DEFRAG_SEED))
    moves = []
    for key, pod in sorted(pods, key=lambda item: (-item[1].gpus, -item[1].cpu, item[0])):
        index = scheduler.place(pod)
        if index is None:
            return None
        moves.append(Move(key, pod.gpus, others[index].name))
    return moves
