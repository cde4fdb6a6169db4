"""`simulate` without the flag parsing: each option's bounds accepted exactly at the edge and refused beyond it,
--set applied or refused naming the setting, the profiles compared (built-ins once each, an unknown one refused),
and a tiny run's document saying where its inputs came from and which scheduler it measured."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.core.errors import ConfigError, UsageError
from gpu_bootstrap.sim import command, scoring

pytestmark = pytest.mark.unit

OPTIONS = command.SimOptions(pods=Path("p.csv"), nodes=Path("n.csv"))


@pytest.mark.parametrize("changes", [
    {}, {"seeds": 1}, {"seeds": 100}, {"tune": 1.0}, {"tune": 3.0}, {"departures": 0.0}, {"departures": 0.99},
    {"default_percentage": 0}, {"default_percentage": 100}, {"track": "B"},
    {"nodes": None, "from_cluster": True}])
def test_options_at_their_bounds_are_accepted(changes):
    assert command.validate(dataclasses.replace(OPTIONS, **changes)) is None


@pytest.mark.parametrize("changes, message", [
    ({"nodes": None}, "give the nodes with exactly one of --nodes FILE or --from-cluster"),
    ({"from_cluster": True}, "give the nodes with exactly one of --nodes FILE or --from-cluster"),
    ({"track": "C"}, "--track 'C': choose A (whole-GPU pods) or B (all pods, fractions rounded up)"),
    ({"seeds": 0}, "--seeds 0: choose between 1 and 100"),
    ({"seeds": 101}, "--seeds 101: choose between 1 and 100"),
    ({"tune": 0.99}, "--tune 0.99: arrived demand must end between 1.0 and 3.0 x capacity"),
    ({"tune": 3.01}, "--tune 3.01: arrived demand must end between 1.0 and 3.0 x capacity"),
    ({"departures": -0.01}, "--departures -0.01: a probability per arrival, from 0 up to 1"),
    ({"departures": 1.0}, "--departures 1.0: a probability per arrival, from 0 up to 1"),
    ({"default_percentage": -1}, "--default-nodes-to-score: a percentage, 0 (adaptive) to 100"),
    ({"default_percentage": 101}, "--default-nodes-to-score: a percentage, 0 (adaptive) to 100"),
])
def test_options_beyond_their_bounds_are_refused(changes, message):
    with pytest.raises(UsageError) as raised:
        command.validate(dataclasses.replace(OPTIONS, **changes))
    assert raised.value.message == message


def test_the_defaults_are_track_a_five_seeds_up_to_130_percent_without_departures():
    options = command.SimOptions(pods=Path("p.csv"))
    assert (options.nodes, options.from_cluster, options.sets, options.track, options.seeds, options.tune,
            options.policies, options.default_percentage, options.departures, options.workers) == (
        None, False, [], "A", 5, 1.3, [], 100, 0.0, None)


def test_a_run_checks_its_options_before_reading_anything(tmp_path):
    with pytest.raises(UsageError) as raised:
        command.simulate(command.SimOptions(pods=tmp_path / "absent.csv", nodes=tmp_path / "absent.csv", seeds=0),
                         cfg.SchedulerConfig())
    assert raised.value.message == "--seeds 0: choose between 1 and 100"


def test_set_changes_scheduler_settings_and_names_what_it_refuses():
    settings = cfg.SchedulerConfig()
    assert command.with_sets(OPTIONS, settings) is settings
    changed = command.with_sets(dataclasses.replace(OPTIONS, sets=["scheduler.fit_weight=4", "name = packer"]),
                                settings)
    assert (changed.fit_weight, changed.name, settings.fit_weight) == (4, "packer", 3)
    # what --set did not name stays unset, so the scheduler's version still picks the rest of the profile
    assert changed.model_fields_set == {"fit_weight", "name"}
    for item, message in (("fit_weight", "--set 'fit_weight': expected KEY=VALUE with KEY a scheduler setting"),
                          ("colour=red", "--set 'colour=red': expected KEY=VALUE with KEY a scheduler setting")):
        with pytest.raises(UsageError) as raised:
            command.with_sets(dataclasses.replace(OPTIONS, sets=[item]), settings)
        assert raised.value.message == message and raised.value.hint.startswith(
            "e.g. --set strategy=RequestedToCapacityRatio; settings: enabled, name, namespace, strategy")
    with pytest.raises(UsageError) as raised:
        command.with_sets(dataclasses.replace(OPTIONS, sets=["fit_weight=lots"]), settings)
    assert raised.value.message.startswith("--set: scheduler.fit_weight: ")


def test_the_profiles_compared_are_the_default_ours_and_each_builtin_once():
    settings = cfg.SchedulerConfig()
    chosen = command.profiles(dataclasses.replace(OPTIONS, policies=["random", "blog-recipe", "random"],
                                                  default_percentage=50), settings, "1.31.0", 40)
    assert [p.name for p in chosen] == ["default", "gpu-binpack-scheduler", "random", "blog-recipe"]
    assert chosen[0] == dataclasses.replace(scoring.DEFAULT_PROFILE, percentage_of_nodes_to_score=50)
    assert chosen[2:] == [scoring.RANDOM_PROFILE, scoring.BLOG_PROFILE]
    with pytest.raises(UsageError) as raised:
        command.profiles(dataclasses.replace(OPTIONS, policies=["fastest"]), settings, "1.31.0", 40)
    assert (raised.value.message, raised.value.hint) == ("--policy 'fastest' is not a built-in policy",
                                                         "choose from random, blog-recipe")


def traces(tmp_path: Path, pods: str) -> command.SimOptions:
    nodes = tmp_path / "n.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn-0,96000,393216,8,G2\nn-1,96000,393216,8,G2\n")
    pod_list = tmp_path / "p.csv"
    pod_list.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + pods)
    return command.SimOptions(pods=pod_list, nodes=nodes, seeds=1, workers=1)


def test_a_run_says_where_its_inputs_came_from_and_which_scheduler_it_measured(tmp_path):
    options = traces(tmp_path, "p-0,4000,16384,1,1000,\np-1,8000,32768,2,1000,\n")
    document = command.simulate(dataclasses.replace(options, sets=["name=packer"]), cfg.SchedulerConfig())
    assert (document["inventory"]["source"], document["population"]["source"], document["scheduler"]) == (
        str(options.nodes), str(options.pods), "packer")
    assert "gap_closed_pct" in document


def test_a_pod_list_without_gpu_pods_for_the_track_is_bad_input(tmp_path):
    options = traces(tmp_path, "p-0,4000,16384,1,500,\n")  # a fractional GPU: not in track A
    with pytest.raises(ConfigError) as raised:
        command.simulate(options, cfg.SchedulerConfig())
    assert (raised.value.message, raised.value.hint) == (
        f"{options.pods}: the pod list has no GPU pods for this track", "track B includes fractional GPU pods")
