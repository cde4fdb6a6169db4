"""kube-scheduler's scoring at the cases the earlier tables skipped: disabling every score plugin with '*', zero and
over-capacity resources under RequestedToCapacityRatio, profile parsing defaults, and the edges of each formula.
Only the public functions of sim/scoring are used (the engine's request accounting is tested elsewhere)."""
from __future__ import annotations

import pytest

from gpu_bootstrap.sim import scoring
from gpu_bootstrap.sim.scoring import BALANCED, FIT, GPU, Profile

pytestmark = pytest.mark.unit


def config(score: dict | None = None, plugin_config: list | None = None, **profile) -> dict:
    body = {"schedulerName": "s", **profile}
    if score is not None:
        body["plugins"] = {"score": score}
    if plugin_config is not None:
        body["pluginConfig"] = plugin_config
    return {"profiles": [body]}


@pytest.mark.parametrize("score, fit, balanced", [
    ({"disabled": [{"name": "*"}]}, 0, 0),
    ({"disabled": [{"name": "*"}], "enabled": [{"name": FIT, "weight": 3}]}, 3, 0),
    ({"disabled": [{"name": BALANCED}]}, 1, 0),
    ({"disabled": [{"name": FIT}]}, 0, 1),
    ({"disabled": [{"name": "TaintToleration"}]}, 1, 1),
    ({"enabled": [{"name": BALANCED, "weight": 5}, {"name": "ImageLocality", "weight": 9}]}, 1, 5),
    ({"enabled": [{"name": FIT}]}, 1, 1),
    ({}, 1, 1),
])
def test_score_plugins_disabled_and_enabled(score, fit, balanced):
    profile = scoring.profile_from_config(config(score))
    assert (profile.fit_weight, profile.balanced_weight) == (fit, balanced)


def test_a_bare_profile_is_the_default_scheduler():
    assert scoring.profile_from_config({"profiles": [{}]}) == Profile("default-scheduler")
    assert scoring.profile_from_config(config()) == Profile("s")


def test_every_argument_is_read():
    fit_args = {"scoringStrategy": {"type": "RequestedToCapacityRatio",
                                    "resources": [{"name": GPU, "weight": 7}, {"name": "cpu"}],
                                    "requestedToCapacityRatio": {"shape": [{"utilization": 0, "score": 1},
                                                                           {"utilization": 80, "score": 9}]}}}
    balanced_args = {"resources": [{"name": GPU}, {"name": "cpu"}]}
    profile = scoring.profile_from_config({"percentageOfNodesToScore": 40, "profiles": [
        {"schedulerName": "a"},
        {"schedulerName": "b", "pluginConfig": [{"name": FIT, "args": fit_args},
                                                {"name": BALANCED, "args": balanced_args}]}]}, 1)
    assert profile == Profile("b", "RequestedToCapacityRatio", ((GPU, 7), ("cpu", 1)), ((0, 1), (80, 9)), 1, 1,
                              (GPU, "cpu"), 40)
    assert scoring.profile_from_config(config(percentageOfNodesToScore=10)).percentage_of_nodes_to_score == 10


@pytest.mark.parametrize("requested, capacity, expected", [
    (0, 0, 100), (1, 0, 100), (5, 4, 100), (4, 4, 100), (2, 4, 50), (0, 4, 0),
])
def test_requested_to_capacity_ratio_counts_zero_and_over_capacity_as_full(requested, capacity, expected):
    shape = scoring.scaled_shape(((0, 0), (100, 10)))
    assert scoring.ratio_resource_score(shape, requested, capacity) == expected


def test_a_zero_capacity_resource_scores_full_on_a_spreading_shape_too():
    shape = scoring.scaled_shape(((0, 10), (100, 0)))
    assert [scoring.ratio_resource_score(shape, r, c) for r, c in ((0, 0), (3, 2), (0, 2), (1, 2))] == [0, 0, 100, 50]


@pytest.mark.parametrize("weighted, expected", [
    ([(1, 0, 5), (1, 2, 1)], 50),  # a resource the node has none of is left out, as kube-scheduler does
    ([(0, 2, 5), (1, 2, 1)], 50),  # a zero score is left out of the average
    ([(0, 2, 1)], 0),
    ([], 0),
])
def test_ratio_fit_score_with_zero_and_over_capacity(weighted, expected):
    shape = scoring.scaled_shape(((0, 0), (100, 10)))
    assert scoring.fit_score("RequestedToCapacityRatio", weighted, shape) == expected


@pytest.mark.parametrize("strategy, weighted, expected", [
    ("MostAllocated", [(5, 4, 1)], 100), ("LeastAllocated", [(5, 4, 1)], 0), ("MostAllocated", [(1, 0, 1)], 0),
    ("LeastAllocated", [(0, 0, 1)], 0), ("LeastAllocated", [], 0), ("MostAllocated", [(1, 4, 1), (3, 4, 3)], 62),
])
def test_fit_score_edges(strategy, weighted, expected):
    assert scoring.fit_score(strategy, weighted) == expected


@pytest.mark.parametrize("value, rounded", [(0.5, 1), (1.5, 2), (2.5, 3), (-0.5, -1), (-2.5, -3), (0.49, 0), (0, 0)])
def test_round_half_away_from_zero(value, rounded):
    assert scoring.round_half_away(value) == rounded


@pytest.mark.parametrize("fractions, expected", [
    ([1.5, 1.0], 100), ([0.5], 100), ([], 100), ([0.2, 0.2, 0.8], 71), ([0.0, 1.0], 50),
])
def test_balanced_score_caps_fractions_at_one(fractions, expected):
    assert scoring.balanced_score(fractions) == expected


@pytest.mark.parametrize("shape, utilization, expected", [
    (((10, 20), (50, 60)), 0, 20), (((10, 20), (50, 60)), 10, 20), (((10, 20), (50, 60)), 30, 40),
    (((10, 20), (50, 60)), 90, 60), (((0, 100), (100, 0)), 33, 67), (((0, 0), (3, 100)), 1, 33),
])
def test_broken_linear_truncates_toward_zero(shape, utilization, expected):
    assert scoring.broken_linear(shape, utilization) == expected


@pytest.mark.parametrize("nodes, percentage, expected", [
    (99, 10, 99), (100, 10, 100), (1000, 100, 1000), (1000, 150, 1000), (1000, 0, 420), (10000, 0, 500),
    (2000, 10, 200), (1000, 5, 100), (1000, 1, 100), (125, 0, 100), (6000, 0, 300),
])
def test_nodes_to_find_at_its_edges(nodes, percentage, expected):
    assert scoring.nodes_to_find(nodes, percentage) == expected


@pytest.mark.parametrize("profile, text", [
    (scoring.DEFAULT_PROFILE, "LeastAllocated (cpu=1 memory=1) x1 + BalancedAllocation x1"),
    (scoring.RANDOM_PROFILE, "uniform random among feasible nodes"),
    (scoring.BLOG_PROFILE, "RequestedToCapacityRatio (nvidia.com/gpu=100 cpu=1 memory=1 shape 0:0,100:10) x1 "
                           "+ BalancedAllocation x1"),
    (Profile("p", "MostAllocated", ((GPU, 100),), fit_weight=2, balanced_weight=0),
     "MostAllocated (nvidia.com/gpu=100) x2"),
])
def test_profiles_describe_themselves(profile, text):
    assert profile.describe() == text


def test_requested_to_capacity_ratio_without_a_shape_gets_the_default_shape():
    fit_args = {"scoringStrategy": {"type": "RequestedToCapacityRatio", "resources": [{"name": GPU, "weight": 1}]}}
    profile = scoring.profile_from_config(config(plugin_config=[{"name": FIT, "args": fit_args}]))
    assert profile.shape == ((0, 10), (100, 0))  # kube-scheduler's default: spread (score 10 at 0 % used)


def test_a_profile_is_a_value():
    import dataclasses
    with pytest.raises(dataclasses.FrozenInstanceError):
        scoring.DEFAULT_PROFILE.fit_weight = 2
    assert {scoring.DEFAULT_PROFILE: 1}[Profile("default")] == 1


@pytest.mark.parametrize("shape, utilization, expected", [
    (((0, 100), (3, 0)), 1, 67),  # -33.3 truncates toward zero to -33 (Python's // would give -34)
    (((0, 100), (1, 0)), 1, 0),  # a step of one percent, falling
    (((0, 0), (1, 100)), 1, 100),
])
def test_broken_linear_on_falling_and_one_percent_steps(shape, utilization, expected):
    assert scoring.broken_linear(shape, utilization) == expected


def test_the_utilization_is_requested_over_capacity_in_whole_percent():
    shape = scoring.scaled_shape(((0, 0), (100, 10)))
    assert [scoring.ratio_resource_score(shape, r, 3) for r in (1, 2)] == [33, 66]


def test_a_score_of_one_still_counts_in_the_ratio_average():
    shape = scoring.scaled_shape(((0, 0), (100, 10)))
    assert scoring.fit_score("RequestedToCapacityRatio", [(1, 100, 1), (50, 100, 1)], shape) == 26
