"""kube-scheduler's resource scoring, in the integer arithmetic of pkg/scheduler/framework/plugins/noderesources.

A node's score for a pod is  fit_weight * NodeResourcesFit + balanced_weight * NodeResourcesBalancedAllocation.
The other default score plugins (TaintToleration, NodeAffinity, ImageLocality, ...) give every node the same score
for the pods simulated here, so they do not change the choice and are left out.

Profiles are built from a rendered KubeSchedulerConfiguration (`profile_from_config`), so the simulator scores with
exactly what `gpu-bootstrap up` deploys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

MAX_NODE_SCORE = 100
MAX_CUSTOM_PRIORITY_SCORE = 10
GPU = "nvidia.com/gpu"
DEFAULT_RESOURCES = (("cpu", 1), ("memory", 1))
FIT, BALANCED = "NodeResourcesFit", "NodeResourcesBalancedAllocation"
STRATEGIES = ("LeastAllocated", "MostAllocated", "RequestedToCapacityRatio", "Random")


@dataclass(frozen=True)
class Profile:
    name: str
    strategy: str = "LeastAllocated"  # or MostAllocated, RequestedToCapacityRatio; Random: no scoring at all
    resources: tuple = DEFAULT_RESOURCES  # ((resource, weight), ...) for NodeResourcesFit
    shape: tuple = ((0, 10), (100, 0))  # RequestedToCapacityRatio: ((utilization, score 0-10), ...)
    fit_weight: int = 1
    balanced_weight: int = 1  # 0: BalancedAllocation disabled
    balanced_resources: tuple = ("cpu", "memory")
    percentage_of_nodes_to_score: int = 0  # 0: kube-scheduler's adaptive default; 100: every feasible node
    balanced_by_change: bool = False  # BalancedAllocation scores the change in balance (kube-scheduler 1.36+)

    def describe(self) -> str:
        if self.strategy == "Random":
            return "uniform random among feasible nodes"
        weights = " ".join(f"{name}={weight}" for name, weight in self.resources)
        shape = ""
        if self.strategy == "RequestedToCapacityRatio":
            shape = " shape " + ",".join(f"{u}:{s}" for u, s in self.shape)
        balanced = f" + BalancedAllocation x{self.balanced_weight}" if self.balanced_weight else ""
        if balanced and tuple(self.balanced_resources) != ("cpu", "memory"):
            balanced += f" over {','.join(self.balanced_resources)}"
        return f"{self.strategy} ({weights}{shape}) x{self.fit_weight}{balanced}"


DEFAULT_PROFILE = Profile("default")  # kube-scheduler's default profile, as of v1.23+
RANDOM_PROFILE = Profile("random", strategy="Random", balanced_weight=0, percentage_of_nodes_to_score=100)
# The widely copied blog recipe, fixed to the current API: RequestedToCapacityRatio gpu 100 / cpu 1 / memory 1,
# BalancedAllocation left on.
BLOG_PROFILE = Profile("blog-recipe", strategy="RequestedToCapacityRatio",
                       resources=((GPU, 100), ("cpu", 1), ("memory", 1)), shape=((0, 0), (100, 10)),
                       percentage_of_nodes_to_score=100)


def balanced_by_change(kube_version: str | None) -> bool:
    """Whether kube-scheduler of this version scores BalancedAllocation by the change the pod makes to the node's
    balance (kubernetes PR #135573, merged after 1.35's code freeze, so from 1.36) rather than by the balance after
    it alone. Found by measuring on the real 1.37 scheduler (benchmarks/packing_real.py)."""
    if kube_version is None:
        return False
    from gpu_bootstrap.core.versions import minor_of
    return minor_of(kube_version) >= (1, 36)


def profile_from_config(config: dict, profile_index: int = 0, kube_version: str | None = None) -> Profile:
    """The scoring profile a KubeSchedulerConfiguration (v1 or v1beta3) describes, as kube-scheduler `kube_version`
    scores it (None: before 1.36)."""
    profile = config["profiles"][profile_index]
    score = (profile.get("plugins") or {}).get("score") or {}
    weights = {FIT: 1, BALANCED: 1}
    for plugin in score.get("disabled") or []:
        if plugin["name"] in (FIT, BALANCED, "*"):
            for name in ((FIT, BALANCED) if plugin["name"] == "*" else (plugin["name"],)):
                weights[name] = 0
    for plugin in score.get("enabled") or []:
        if plugin["name"] in weights:
            weights[plugin["name"]] = plugin.get("weight") or 1
    fit_args = next((c.get("args") or {} for c in profile.get("pluginConfig") or [] if c["name"] == FIT), {})
    strategy = fit_args.get("scoringStrategy") or {}
    kind = strategy.get("type", "LeastAllocated")
    resources = tuple((r["name"], r.get("weight", 1)) for r in strategy.get("resources") or []) or DEFAULT_RESOURCES
    shape = tuple((p["utilization"], p["score"])
                  for p in (strategy.get("requestedToCapacityRatio") or {}).get("shape") or []) or Profile.shape
    balanced_args = next((c.get("args") or {} for c in profile.get("pluginConfig") or [] if c["name"] == BALANCED), {})
    balanced_resources = tuple(r["name"] for r in balanced_args.get("resources") or []) or ("cpu", "memory")
    percentage = profile.get("percentageOfNodesToScore", config.get("percentageOfNodesToScore")) or 0
    return Profile(profile.get("schedulerName", "default-scheduler"), kind, resources, shape, weights[FIT],
                   weights[BALANCED], balanced_resources, percentage, balanced_by_change(kube_version))


# --- the formulas ----------------------------------------------------------------------------------------------------
def _go_div(a: int, b: int) -> int:
    """Go's integer division truncates toward zero (Python's // floors)."""
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b > 0) else -quotient


def least_requested(requested: int, capacity: int) -> int:
    if capacity == 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


def most_requested(requested: int, capacity: int) -> int:
    if capacity == 0:
        return 0
    return min(requested, capacity) * MAX_NODE_SCORE // capacity


def broken_linear(shape: tuple, utilization: int) -> int:
    """helper.BuildBrokenLinearFunction over points whose scores are already scaled to 0-100."""
    for index, (point_u, point_s) in enumerate(shape):
        if utilization <= point_u:
            if index == 0:
                return point_s
            prev_u, prev_s = shape[index - 1]
            return prev_s + _go_div((point_s - prev_s) * (utilization - prev_u), point_u - prev_u)
    return shape[-1][1]


def scaled_shape(shape: tuple) -> tuple:
    factor = MAX_NODE_SCORE // MAX_CUSTOM_PRIORITY_SCORE
    return tuple((u, s * factor) for u, s in shape)


def ratio_resource_score(shape: tuple, requested: int, capacity: int) -> int:
    if capacity == 0 or requested > capacity:
        return broken_linear(shape, 100)
    return broken_linear(shape, requested * 100 // capacity)


def fit_score(strategy: str, weighted: list[tuple[int, int, int]], shape: tuple = ()) -> int:
    """NodeResourcesFit over (requested, allocatable, weight) of the resources that count for this pod. A resource
    whose allocatable is 0 is left out of the weighted mean, as upstream's scorers skip it."""
    node_score = weight_sum = 0
    if strategy == "RequestedToCapacityRatio":
        for requested, capacity, weight in weighted:
            if not capacity:
                continue
            score = ratio_resource_score(shape, requested, capacity)
            if score > 0:  # RequestedToCapacityRatio leaves zero scores out of the average
                node_score += score * weight
                weight_sum += weight
        return int(round_half_away(node_score / weight_sum)) if weight_sum else 0
    per_resource = most_requested if strategy == "MostAllocated" else least_requested
    for requested, capacity, weight in weighted:
        if capacity:
            node_score += per_resource(requested, capacity) * weight
            weight_sum += weight
    return node_score // weight_sum if weight_sum else 0


def round_half_away(value: float) -> float:
    """Go's math.Round (half away from zero), unlike Python's round (half to even)."""
    return math.floor(value + 0.5) if value >= 0 else -math.floor(-value + 0.5)


def balanced_score(fractions: list[float]) -> int:
    """NodeResourcesBalancedAllocation: (1 - standard deviation of requested/allocatable fractions) * 100."""
    fractions = [min(f, 1.0) for f in fractions]
    if len(fractions) == 2:
        std = abs(fractions[0] - fractions[1]) / 2
    elif len(fractions) > 2:
        mean = sum(fractions) / len(fractions)
        std = math.sqrt(sum((f - mean) ** 2 for f in fractions) / len(fractions))
    else:
        std = 0.0
    return int((1 - std) * MAX_NODE_SCORE)


def balanced_change_score(before: list[float], after: list[float]) -> int:
    """BalancedAllocation from kube-scheduler 1.36: 50 + (50 + score after - score before) / 2 in Go's integers, so
    a pod that leaves the node's balance as it was scores 75, one that makes it better up to 100, worse down to 50."""
    return MAX_NODE_SCORE // 2 + _go_div(MAX_NODE_SCORE // 2 + balanced_score(after) - balanced_score(before), 2)


def nodes_to_find(all_nodes: int, percentage: int) -> int:
    """numFeasibleNodesToFind: how many feasible nodes the scheduler looks for before it stops filtering."""
    min_feasible, min_percentage = 100, 5
    if all_nodes < min_feasible or percentage >= 100:
        return all_nodes
    if percentage == 0:
        percentage = max(50 - all_nodes // 125, min_percentage)
    return max(all_nodes * percentage // 100, min_feasible)
