"""GPU sharing: per-GPU milli accounting and the scheduling policies of the FGD artifact (Weng et al., "Beware of
Fragmentation", USENIX ATC'23; hkust-adsl/kubernetes-scheduler-simulator), re-implemented from their definitions.

The model, as in the artifact:
- every GPU has 1000 milli; a pod with num_gpu == 1 and gpu_milli < 1000 takes that share of one GPU with enough
  milli left; any other GPU pod takes num_gpu whole free GPUs (the lowest-numbered free ones);
- filter: the pod's cpu and memory fit the node's free allocatable, the GPUs as above, its gpu_spec allows the node's
  model. GPU memory is not modelled (the artifact does not model it either). CPU-only pods may use any node;
- score: one policy, over every feasible node (percentageOfNodesToScore: 100); among the best nodes the artifact's
  kube-scheduler fork takes the smallest node name, and the artifact has prefixed every name with a random
  "%04d-" first, so ties follow a random node order fixed for the run ("prefix", the default; "name": the original
  names; "random": stock kube-scheduler's uniform choice per pod).

The policies (artifact file in brackets; MaxSpec: 128 cores, 8 GPUs):
- Random [random_score.go]: a uniformly random feasible node; a share goes to a random GPU with room.
- DotProd [dot_product_score.go, merge + max norm]: 100·(1 − (cpu_free/128000 · cpu/128000 + gpu_free/8000 ·
  gpu/8000)/2), truncated: the node whose free vector is least aligned with the request.
- GpuClustering [gpu_clustering_score.go]: nodes already running only pods of this pod's GPU kind (share, 1-GPU,
  2-GPU, ...) score 75-100, mixed nodes with that kind 50-75, empty nodes 25-50, others 0-25; within a band, the
  fuller node (⌊25·(8000 − gpu_free)/8000⌋) wins.
- GpuPacking [gpu_packing_score.go]: a share of an already shared GPU first (100 − ⌊⌊left·100/1000⌋/10⌋, at least
  50), then free GPUs on a used node (50 − GPUs taken, at least 33), then an unused node (max(33 − GPUs, GPUs)).
- BestFit [best_fit_score.go]: 100·(1 − ½(cpu_free − cpu)/128000 − ½(gpu_free − gpu)/8000), truncated.
- FGD [fgd_score.go, frag.go NodeGpuShareFragAmount]: a node's fragment F = Σ_m p_m·F(m) over the typical pod specs
  m (the most frequent (cpu, gpu milli, GPUs, model) specs of the trace covering 95 % of its pods, CPU-only pods
  included, p_m renormalised); F(m) is the node's free GPU milli that m cannot use: all of it if m asks for no GPU,
  may not use the node's model, or does not fit (cpu, or fewer than m's GPUs with m's milli free), else the milli
  of the GPUs with less than m's milli free. Score = ⌊100·sigmoid((F_before − F_after)/1000)⌋, evaluated for every
  GPU a share could take; the node's best GPU (the first on ties) is the one the pod gets.
Except for Random and FGD, a share goes to the GPU with the least milli left that fits (the artifact's `best`).

Speed: a node's score for a pod depends only on that node's state and the pod's shape (cpu, memory, GPUs, milli,
models), and traces repeat a few hundred shapes. So each shape keeps its scores, and only the nodes changed since that
shape was last scored are scored again, all at once with numpy; FGD's per-spec counts are vectorised the same way.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

MILLI = 1000
MAX_SPEC_CPU = 128_000  # the artifact's normalisers (open-gpu-share/utils/const.go)
MAX_SPEC_GPU = 8_000
POLICIES = ("Random", "DotProd", "GpuClustering", "GpuPacking", "BestFit", "FGD")
TYPICAL_COVERAGE = 0.95  # typicalPodsConfig.podPopularityThreshold: 95
KINDS = ("share", 1, 2, 4, 8)  # GpuClustering's pod kinds; other GPU counts get a column of their own


@dataclass(frozen=True)
class SharePod:
    """A pod as the sharing model sees it: gpu_milli is per GPU (1000 = whole)."""

    cpu: int
    memory: int
    num_gpu: int = 0
    gpu_milli: int = 0
    models: frozenset | None = None

    @property
    def fractional(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < MILLI

    @property
    def total_milli(self) -> int:
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0


def share_pods(pods: list[dict]) -> list[SharePod]:
    """The trace's rows (trace.load_pods) as SharePods; a GPU pod with gpu_milli 0 or empty asks for whole GPUs."""
    out = []
    for pod in pods:
        gpus = pod["num_gpu"]
        milli = (pod["gpu_milli"] or MILLI) if gpus else 0
        out.append(SharePod(pod["cpu_milli"], pod["memory_mib"], gpus, milli, pod.get("models")))
    return out


@dataclass(frozen=True)
class TypicalPod:
    cpu: int
    gpu_milli: int
    num_gpu: int
    models: frozenset | None
    share: float  # p_m, summing to 1 over the typical pods


def typical_pods(pods: list[SharePod], coverage: float = TYPICAL_COVERAGE) -> list[TypicalPod]:
    """The artifact's GetTypicalPods (popularity threshold 95 %, step 1, CPU-only pods included): specs by count,
    most frequent first (ties: the larger spec first), taken until they cover `coverage` of the pods."""
    counts = Counter((p.cpu, p.gpu_milli if p.num_gpu else 0, p.num_gpu, _model_key(p.models)) for p in pods)
    ordered = sorted(counts.items(), key=lambda item: (item[1], item[0]), reverse=True)
    chosen, covered = [], 0
    for spec, count in ordered:
        if covered >= coverage * len(pods):
            break
        chosen.append((spec, count))
        covered += count
    return [TypicalPod(cpu, milli, gpus, frozenset(models.split("|")) if models else None, count / covered)
            for (cpu, milli, gpus, models), count in chosen]


def _model_key(models: frozenset | None) -> str:
    return "|".join(sorted(models)) if models else ""


class ShareCluster:
    """Free cpu, memory and per-GPU milli of every node, in numpy arrays; `version` counts each node's changes."""

    def __init__(self, nodes):
        self.nodes = nodes
        count = len(nodes)
        self.width = max([n.gpus for n in nodes] + [1])
        self.cpu_cap = np.array([n.cpu for n in nodes], dtype=np.int64)
        self.cpu_left = self.cpu_cap.copy()
        self.mem_left = np.array([n.memory for n in nodes], dtype=np.int64)
        self.gpus = np.array([n.gpus for n in nodes], dtype=np.int64)
        # milli left per GPU; the columns beyond a node's GPUs hold 0 and are never candidates
        self.left = np.where(np.arange(self.width)[None, :] < self.gpus[:, None], MILLI, 0).astype(np.int64)
        self.models = [n.model for n in nodes]
        self.kinds = np.zeros((count, len(KINDS) + 1), dtype=np.int64)  # pods per GpuClustering kind
        self.version = np.zeros(count, dtype=np.int64)
        self.capacity_milli = int(self.gpus.sum()) * MILLI
        self.used_milli = 0
        self._model_masks: dict = {}

    def model_mask(self, models: frozenset | None) -> np.ndarray | None:
        if models is None:
            return None
        if models not in self._model_masks:
            self._model_masks[models] = np.array([m in models for m in self.models], dtype=bool)
        return self._model_masks[models]

    def feasible(self, pod: SharePod, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        ok = (self.cpu_left[rows] >= pod.cpu) & (self.mem_left[rows] >= pod.memory)
        if pod.num_gpu:
            left = self.left[rows]
            if pod.fractional:
                ok &= left.max(axis=1) >= pod.gpu_milli
            else:
                ok &= (left == MILLI).sum(axis=1) >= pod.num_gpu
            mask = self.model_mask(pod.models)
            if mask is not None:
                ok &= mask[rows]
        return ok

    def place(self, index: int, pod: SharePod, gpus: list[int]) -> None:
        self.cpu_left[index] -= pod.cpu
        self.mem_left[index] -= pod.memory
        for gpu in gpus:
            self.left[index, gpu] -= pod.gpu_milli
        self.used_milli += pod.total_milli
        if pod.num_gpu:
            self.kinds[index, kind_column(pod)] += 1
        self.version[index] += 1

    def free_gpus(self, index: int, count: int) -> list[int]:
        """The lowest-numbered whole free GPUs (the artifact's AllocateExclusiveGpuId)."""
        return [int(g) for g in np.flatnonzero(self.left[index] == MILLI)[:count]]

    def gpus_in_use(self) -> int:
        return int(((self.left < MILLI) & (np.arange(self.width)[None, :] < self.gpus[:, None])).sum())


def kind_column(pod: SharePod) -> int:
    if pod.fractional:
        return 0
    return KINDS.index(pod.num_gpu) if pod.num_gpu in KINDS else len(KINDS)


# --- the FGD fragment measure ---------------------------------------------------------------------------------------
class Fragment:
    """F for many node states at once (frag.go NodeGpuShareFragAmountScore), vectorised over nodes and specs."""

    def __init__(self, typical: list[TypicalPod], cluster: ShareCluster):
        self.typical = typical
        self.p = np.array([t.share for t in typical], dtype=np.float64)
        self.cpu = np.array([t.cpu for t in typical], dtype=np.int64)
        self.milli = np.array([t.gpu_milli for t in typical], dtype=np.int64)
        self.num = np.array([t.num_gpu for t in typical], dtype=np.int64)
        self.gpu_spec = self.milli > 0  # CPU-only specs count every free milli as fragment (frag.go: XL/XR)
        # access[n, m]: may spec m use node n's model (else "no access": all free milli is fragment)
        self.access = np.array([[t.models is None or model in t.models for t in typical] for model in cluster.models],
                               dtype=bool).reshape(len(cluster.models), len(typical))

    def counts(self, left: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per node and spec: GPUs with at least the spec's milli free, and the milli of the other GPUs."""
        enough = left[:, None, :] >= self.milli[None, :, None]
        return enough.sum(axis=2), np.where(enough, 0, left[:, None, :]).sum(axis=2)

    def combine(self, fits: np.ndarray, small: np.ndarray, total: np.ndarray) -> np.ndarray:
        """Σ_m p_m · (small if the spec fits else total), the last axis being the specs."""
        return np.where(fits, small, total[..., None]) @ self.p

    def amount(self, cpu_left: np.ndarray, left: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """F of nodes whose free cpu and per-GPU milli are given (rows: their node numbers, for the model)."""
        enough, small = self.counts(left)
        fits = (cpu_left[:, None] >= self.cpu[None, :]) & (enough >= self.num[None, :])
        fits &= self.gpu_spec[None, :] & self.access[rows]
        return self.combine(fits, small, left.sum(axis=1).astype(np.float64))


def _fgd_score(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """⌊100 · sigmoid((F_before − F_after) / 1000)⌋ (Go's int64() of a positive float)."""
    return np.floor(100.0 / (1.0 + np.exp(-(before - after) / 1000.0))).astype(np.int64)


# --- the policies ---------------------------------------------------------------------------------------------------
class Policy:
    """scores(cluster, pod, rows) -> (score per row, GPU per row for a share, -1 where the policy leaves it to the
    best-fit GPU). `rows` are feasible nodes."""

    name = ""

    def __init__(self, cluster: ShareCluster, typical: list[TypicalPod] | None = None):
        self.cluster = cluster

    def scores(self, pod: SharePod, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        raise NotImplementedError


class DotProd(Policy):
    name = "DotProd"

    def scores(self, pod, rows):
        c = self.cluster
        dot = (c.cpu_left[rows] / MAX_SPEC_CPU) * (pod.cpu / MAX_SPEC_CPU)
        dot = dot + (c.left[rows].sum(axis=1) / MAX_SPEC_GPU) * (pod.total_milli / MAX_SPEC_GPU)
        return np.trunc(100.0 * (1.0 - dot / 2)).astype(np.int64), None


class GpuClustering(Policy):
    name = "GpuClustering"

    def scores(self, pod, rows):
        c = self.cluster
        if not pod.num_gpu:
            return np.zeros(len(rows), dtype=np.int64), None
        kinds = c.kinds[rows]
        mine = kinds[:, kind_column(pod)] > 0
        distinct = (kinds > 0).sum(axis=1)
        band = np.where(mine, np.where(distinct == 1, 75, 50), np.where(distinct == 0, 25, 0))
        return band + 25 * (MAX_SPEC_GPU - c.left[rows].sum(axis=1)) // MAX_SPEC_GPU, None


class GpuPacking(Policy):
    name = "GpuPacking"

    def scores(self, pod, rows):
        c = self.cluster
        if not pod.num_gpu:
            return np.zeros(len(rows), dtype=np.int64), None
        left = c.left[rows]
        real = np.arange(c.width)[None, :] < c.gpus[rows][:, None]
        free = ((left == MILLI) & real).sum(axis=1)
        unused = free == c.gpus[rows]
        if pod.fractional:
            # the GPU taken: the least milli left that fits; a fully free one means "free GPUs on a used node"
            fitting = np.where(left >= pod.gpu_milli, left, MILLI + 1)
            chosen = fitting.min(axis=1)
            shared = np.maximum(100 - (chosen * 100 // MILLI) // 10, 50)
            used_node = np.where(chosen == MILLI, max(50 - 1, 33), shared)
        else:
            used_node = np.full(len(rows), max(50 - pod.num_gpu, 33))
        return np.where(unused, np.maximum(33 - free, free), used_node), None


class BestFit(Policy):
    name = "BestFit"

    def scores(self, pod, rows):
        c = self.cluster
        score = (c.cpu_left[rows] - pod.cpu) / MAX_SPEC_CPU * 0.5
        score = score + (c.left[rows].sum(axis=1) - pod.total_milli) / MAX_SPEC_GPU * 0.5
        # NormalizeScore's min-max rescaling is strictly increasing when scores span at most 100: same choice
        return np.trunc((1.0 - score) * 100).astype(np.int64), None


class FGD(Policy):
    name = "FGD"

    def __init__(self, cluster: ShareCluster, typical: list[TypicalPod] | None = None):
        super().__init__(cluster)
        if not typical:
            raise ValueError("FGD needs the typical pods of the workload")
        self.fragment = Fragment(typical, cluster)
        all_rows = np.arange(len(cluster.nodes))
        self.current = self.fragment.amount(cluster.cpu_left, cluster.left, all_rows)  # F of every node now
        self.seen = cluster.version.copy()

    def _refresh(self) -> None:
        c = self.cluster
        stale = np.flatnonzero(self.seen != c.version)
        if len(stale):
            self.current[stale] = self.fragment.amount(c.cpu_left[stale], c.left[stale], stale)
            self.seen[stale] = c.version[stale]

    def scores(self, pod, rows):
        self._refresh()
        c, f = self.cluster, self.fragment
        before = self.current[rows]
        cpu_after = c.cpu_left[rows] - pod.cpu
        left = c.left[rows]
        if not pod.fractional:
            after_left = left
            if pod.num_gpu:  # the lowest-numbered free GPUs go
                free = left == MILLI
                taken = free & (np.cumsum(free, axis=1) <= pod.num_gpu)
                after_left = np.where(taken, 0, left)
            return _fgd_score(before, f.amount(cpu_after, after_left, rows)), None
        # a share: F after taking it from GPU j, from the per-spec counts by difference (no copy per GPU)
        enough, small = f.counts(left)  # (K, M)
        g = pod.gpu_milli
        lj = left[:, :, None]  # (K, G, 1) milli left on GPU j before
        lj_after = lj - g
        spec = f.milli[None, None, :]
        enough_after = enough[:, None, :] - ((lj >= spec) & (lj_after < spec))
        small_after = small[:, None, :] - np.where(lj < spec, lj, 0) + np.where(lj_after < spec, lj_after, 0)
        fits = (cpu_after[:, None, None] >= f.cpu[None, None, :]) & (enough_after >= f.num[None, None, :])
        fits &= f.gpu_spec[None, None, :] & f.access[rows][:, None, :]
        total_after = (left.sum(axis=1) - g).astype(np.float64)
        after = f.combine(fits, small_after, np.broadcast_to(total_after[:, None], lj.shape[:2]))  # (K, G)
        score = _fgd_score(before[:, None], after)
        score = np.where(left >= g, score, -1)  # GPUs without room are no candidates
        best_gpu = score.argmax(axis=1)  # the first GPU with the best score
        return score[np.arange(len(rows)), best_gpu], best_gpu


class RandomPolicy(Policy):
    name = "Random"

    def scores(self, pod, rows):
        return np.zeros(len(rows), dtype=np.int64), None


POLICY_CLASSES = {cls.name: cls for cls in (RandomPolicy, DotProd, GpuClustering, GpuPacking, BestFit, FGD)}


class _ShapeScores:
    """One pod shape's feasibility, score and GPU per node, valid while the node's version is unchanged."""

    def __init__(self, count: int):
        self.version = np.full(count, -1, dtype=np.int64)
        self.ok = np.zeros(count, dtype=bool)
        self.score = np.zeros(count, dtype=np.int64)
        self.gpu = np.full(count, -1, dtype=np.int64)


def prefixed_ranks(name_ranks: np.ndarray, rng: random.Random) -> np.ndarray:
    """Each node's rank by name once the artifact has renamed it: simulator.go syncClusterResourceList sorts the
    nodes by name, draws `rand.Perm(len(nodes))` and renames the j-th node to `fmt.Sprintf("%04d-", perm[j]) +
    name` before creating it, so the fork's "smallest name wins" (selectHost) follows a random node order drawn once
    per run (from the run's seed), not the original names. `name_ranks[i]`: node i's position by original name."""
    perm = list(range(len(name_ranks)))
    rng.shuffle(perm)
    return np.asarray(perm, dtype=np.int64)[name_ranks]


class ShareScheduler:
    """Places pods one at a time with one policy: filter, score every feasible node, break ties, take GPUs."""

    def __init__(self, cluster: ShareCluster, policy: str, rng: random.Random,
                 typical: list[TypicalPod] | None = None, ties: str = "prefix", prefixes: list[int] | None = None):
        if policy not in POLICY_CLASSES:
            raise ValueError(f"unknown sharing policy {policy!r}; choose from {', '.join(POLICIES)}")
        self.cluster = cluster
        # the artifact's kube-scheduler fork (mental2008/kubernetes v1.20.5-minor, selectHost) takes the smallest
        # node name among the best; "prefix": after the artifact's random renaming (prefixed_ranks), "name": the
        # original names; "random": stock kube-scheduler's uniform choice
        self.ties = ties
        self.by_name = np.argsort(np.argsort([n.name for n in cluster.nodes], kind="stable"), kind="stable")
        if ties == "prefix":  # `prefixes`: the artifact's own perm (artifact_arrivals), else one drawn from rng
            self.by_name = (np.asarray(prefixes, dtype=np.int64)[self.by_name] if prefixes is not None
                            else prefixed_ranks(self.by_name, rng))
        self.policy = POLICY_CLASSES[policy](cluster, typical)
        self.random = policy == "Random"
        self.rng = rng
        self.shapes: dict[SharePod, _ShapeScores] = {}

    def _state(self, pod: SharePod) -> _ShapeScores:
        c = self.cluster
        state = self.shapes.get(pod)
        if state is None:
            state = self.shapes[pod] = _ShapeScores(len(c.nodes))
        stale = np.flatnonzero(state.version != c.version)
        if len(stale):
            ok = c.feasible(pod, stale)
            state.ok[stale] = ok
            rows = stale[ok]
            if len(rows):
                score, gpu = self.policy.scores(pod, rows)
                state.score[rows] = score
                if gpu is not None:
                    state.gpu[rows] = gpu
            state.version[stale] = c.version[stale]
        return state

    def choose(self, pod: SharePod) -> tuple[int, list[int]] | None:
        """The node and GPUs the policy picks, or None when no node fits."""
        state = self._state(pod)
        feasible = np.flatnonzero(state.ok)
        if not len(feasible):
            return None
        if self.random:
            node = int(feasible[self.rng.randrange(len(feasible))])
        else:
            scores = state.score[feasible]
            top = feasible[scores == scores.max()]
            if len(top) == 1:
                node = int(top[0])
            elif self.ties in ("name", "prefix"):
                node = int(top[np.argmin(self.by_name[top])])
            else:
                node = int(top[self.rng.randrange(len(top))])
        return node, self._gpus(node, pod, int(state.gpu[node]))

    def _gpus(self, node: int, pod: SharePod, scored_gpu: int) -> list[int]:
        if not pod.num_gpu:
            return []
        if not pod.fractional:
            return self.cluster.free_gpus(node, pod.num_gpu)
        left = self.cluster.left[node]
        if scored_gpu >= 0:
            return [scored_gpu]
        fitting = np.flatnonzero(left >= pod.gpu_milli)
        if self.random:
            return [int(fitting[self.rng.randrange(len(fitting))])]
        return [int(fitting[np.argmin(left[fitting])])]  # best fit: least left, the first on ties

    def place(self, pod: SharePod) -> tuple[int, list[int]] | None:
        choice = self.choose(pod)
        if choice is not None:
            self.cluster.place(choice[0], pod, choice[1])
        return choice


# --- the artifact's protocol ----------------------------------------------------------------------------------------
def arrivals(pods: list[SharePod], capacity_milli: int, seed: int, tune: float = 1.3) -> list[SharePod]:
    """The trace's pods in a seeded random order, then pods drawn from it with replacement until the GPU demand
    would pass `tune` x capacity (simulator.go SortClusterPods with shufflePod, then tuneUpPods: the original pods
    all arrive first, the draws are appended). As there, the stop test adds one GPU's milli of the drawn pod."""
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    demand = sum(p.total_milli for p in pods)
    while True:
        pod = pods[rng.randrange(len(pods))]
        if demand + pod.gpu_milli > tune * capacity_milli:
            break
        demand += pod.total_milli
        order.append(pod)
    return order


ARTIFACT_WATCH_DRAWS = 10  # Int63 draws between tuneUpPods and rand.Perm in the artifact (see artifact_arrivals)


def artifact_arrivals(pods: list[SharePod], node_count: int, capacity_milli: int, seed: int,
                      tune: float = 1.3) -> tuple[list[SharePod], list[int]]:
    """The artifact's own arrival order and node-name prefixes for `seed`, drawn with Go's math/rand (gorand) as
    its code draws them: core.go Simulate seeds the global source, `log.Debugf(..., rand.Int())` takes one draw
    (Go evaluates the arguments), SortClusterPods shuffles the pods sorted by name (`pods` must be in name order,
    as the openb CSV is), tuneUpPods draws with rand.Intn until the GPU demand would pass `tune` x capacity, and
    syncClusterResourceList's rand.Perm(len(nodes)) gives the prefixes. Between the last two, starting the
    scheduler's informers takes ARTIFACT_WATCH_DRAWS draws from the same global source (client-go's reflector
    picks each watch's timeout with rand.Float64); 10 is the count with which all 50 runs of DotProd,
    GpuClustering, GpuPacking, BestFit and FGD (seeds 42-51) give the authors' cached results to the hundredth."""
    from gpu_bootstrap.sim.gorand import GoRand
    go = GoRand(seed)
    go.int63()
    order = list(pods)
    go.shuffle(order)
    demand = sum(p.total_milli for p in pods)
    while True:
        pod = pods[go.intn(len(pods))]
        if demand + pod.gpu_milli > tune * capacity_milli:
            break
        demand += pod.total_milli
        order.append(pod)
    for _ in range(ARTIFACT_WATCH_DRAWS):
        go.int63()
    return order, go.perm(node_count)


@dataclass
class ShareOutcome:
    """Allocated milli-GPU as % of capacity, averaged over the arrivals whose arrived demand rounds to each whole
    percent (merge_alloc_discrete.py), and the run's counts."""

    curve: dict = field(default_factory=dict)  # arrived % -> allocated %
    placed: int = 0
    failed: int = 0
    gpus_in_use: int = 0
    seconds: float = 0.0  # CPU time of the replay (the machine may be shared)

    def at(self, percent: int) -> float | None:
        if percent in self.curve:
            return self.curve[percent]
        near = [self.curve[p] for p in (percent - 1, percent + 1) if p in self.curve]
        return round(sum(near) / len(near), 2) if near else None


def replay(nodes, sequence: list[SharePod], policy: str, seed: int,
           typical: list[TypicalPod] | None = None, ties: str = "prefix",
           prefixes: list[int] | None = None) -> ShareOutcome:
    import time
    started = time.process_time()
    cluster = ShareCluster(nodes)
    scheduler = ShareScheduler(cluster, policy, random.Random(seed * 7919 + 1), typical, ties, prefixes)
    capacity = cluster.capacity_milli
    sums: dict[int, list] = {}
    outcome = ShareOutcome()
    arrived = 0
    for pod in sequence:
        arrived += pod.total_milli
        if scheduler.place(pod) is None:
            outcome.failed += 1
        else:
            outcome.placed += 1
        bucket = round(100.0 * arrived / capacity)
        entry = sums.setdefault(bucket, [0.0, 0])
        entry[0] += round(100.0 * cluster.used_milli / capacity, 2)
        entry[1] += 1
    outcome.curve = {p: round(total / count, 2) for p, (total, count) in sorted(sums.items())}
    outcome.gpus_in_use = cluster.gpus_in_use()
    outcome.seconds = time.process_time() - started
    return outcome
