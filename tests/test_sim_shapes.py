"""The workload-shape benchmark's pure parts (gpu_bootstrap/sim/shapes.py) and the two new benchmarks' own choices
(benchmarks/packing_shapes.py, benchmarks/scheduler_throughput.py): what they count, the ideal they count against,
and the scheduler configurations they run."""
from __future__ import annotations

import importlib
import random
from pathlib import Path

import pytest

from gpu_bootstrap.sim import shapes
from gpu_bootstrap.sim.engine import Node, Pod, Scheduler
from gpu_bootstrap.sim.scoring import GPU, Profile

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]


def bench(name: str):
    return importlib.import_module(f"benchmarks.{name}")


def test_arrivals_stop_before_the_load_is_passed_and_draw_every_size_of_a_mix():
    nodes = [Node(f"n{i}", 96_000, 393_216, 8) for i in range(10)]
    pods = shapes.arrivals("light-mix", nodes, 50, seed=42)
    asked = sum(p.gpus for p in pods)
    assert 40 - 4 < asked <= 40  # the next pod (at most 4 GPUs) would pass half of the 80 GPUs
    assert {p.gpus for p in pods} == {1, 2, 4}
    assert shapes.arrivals("light-mix", nodes, 50, seed=42) == pods  # seeded


@pytest.mark.parametrize("shape, per_node", [("inference", 8), ("light-2gpu", 4), ("training", 6)])
def test_the_ideal_fills_each_node_as_far_as_its_gpus_cpu_and_memory_allow(shape, per_node):
    """One node of the openb G2 kind (96 cpu, 384 Gi): 8 inference pods, 4 two-GPU pods, but 6 training pods (their
    64 Gi each fill its memory before its GPUs)."""
    nodes = [Node(f"n{i}", 96_000, 393_216, 8) for i in range(4)]
    gpus, cpu, memory = shapes.SHAPES[shape][1][0]
    pods = [Pod(cpu, memory, gpus)] * (per_node + 1)
    assert shapes.ideal_nodes_used(nodes, pods) == 2
    assert shapes.ideal_nodes_used(nodes, pods[:per_node]) == 1


def test_the_ideal_puts_pods_on_the_roomiest_nodes_first():
    small, large = Node("small", 64_000, 262_144, 8), Node("large", 128_000, 786_432, 8)
    training = [Pod(8000, 65_536, 1)] * 8  # 8 fit the large node (512 Gi of 768), only 4 the small one
    assert shapes.ideal_nodes_used([small, large], training) == 1


def test_measure_counts_empty_nodes_against_the_ideal():
    nodes = [Node(f"n{i}", 96_000, 393_216, 8) for i in range(4)]
    pods = [Pod(500, 1024, 1)] * 8
    spread = Profile("spread", "LeastAllocated", ((GPU, 1),), balanced_weight=0, percentage_of_nodes_to_score=100)
    pack = Profile("pack", "MostAllocated", ((GPU, 1),), balanced_weight=0, percentage_of_nodes_to_score=100)
    packed = shapes.measure("inference", 50, nodes, pods, lambda c: Scheduler(c, pack, random.Random(1)))
    spread_out = shapes.measure("inference", 50, nodes, pods, lambda c: Scheduler(c, spread, random.Random(1)))
    assert (packed.empty, packed.ideal, packed.share, packed.unplaced) == (3, 3, 100.0, 0)
    assert (spread_out.empty, spread_out.share) == (0, 0.0)


def test_the_shape_benchmark_compares_what_up_renders_with_what_it_rendered_before():
    module = bench("packing_shapes")
    assert module.model_of("up", "1.35.4", 617).fit_weight == 3
    assert module.model_of("up-before-shapes", "1.35.4", 617).fit_weight == 2
    assert module.model_of("up-before-shapes", "1.37.2", 617) == module.model_of("up", "1.37.2", 617)
    assert module.model_of("up", "1.37.2", 617).percentage_of_nodes_to_score == 100  # 617 nodes: every one


@pytest.mark.parametrize("profile, nodes, percentage", [
    ("up", 1000, 100), ("up", 5000, 0), ("up", 15000, 0), ("up-every-node", 15000, 100), ("up-adaptive", 1000, 0)])
def test_the_throughput_benchmark_runs_what_up_deploys_for_that_many_nodes(profile, nodes, percentage):
    config = bench("scheduler_throughput").scheduler_config(profile, "1.37.2", nodes, "lifted", Path("/k"))
    assert config["percentageOfNodesToScore"] == percentage
    assert config["profiles"][0]["schedulerName"] == "gpu-binpack-scheduler"
    assert config["leaderElection"] == {"leaderElect": False}


def test_the_throughput_modes_differ_only_in_the_client_rate():
    module = bench("scheduler_throughput")
    lifted = module.scheduler_config("kube-default", "1.37.2", 5000, "lifted", Path("/k"))
    deployed = module.scheduler_config("kube-default", "1.37.2", 5000, "deployed", Path("/k"))
    assert lifted["clientConnection"] == {"kubeconfig": "/k", "qps": 5000, "burst": 5000}
    assert deployed["clientConnection"] == {"kubeconfig": "/k"}  # kube-scheduler's defaults, as `up` deploys it
    assert {k: v for k, v in lifted.items() if k != "clientConnection"} == \
        {k: v for k, v in deployed.items() if k != "clientConnection"}
    assert lifted["profiles"] == [{"schedulerName": "default-scheduler"}]


def test_the_throughput_benchmark_refuses_what_it_cannot_run(capsys):
    module = bench("scheduler_throughput")
    for argv, says in ((["--nodes", "5000,1000"], "ascending"), (["--nodes", "10", "--pods", "100"], "at most 80"),
                       (["--profiles", "fastest"], "unknown fastest")):
        with pytest.raises(SystemExit) as raised:
            module.parse(argv)
        assert raised.value.code == 2 and says in capsys.readouterr().err, says


def test_packing_real_with_dra_renders_each_profile_without_the_gpu_in_balanced_allocation(monkeypatch, tmp_path):
    """`packing_real.py --dra` runs each profile as `up` would render it on a DRA cluster (render.for_cluster): the
    GPU out of BalancedAllocation (kube-scheduler 1.37 crashes balancing it), still packed by NodeResourcesFit."""
    real = bench("packing_real")
    monkeypatch.setattr(real, "scheduler_version", lambda: "1.37.2")
    for dra_mode in (False, True):
        monkeypatch.setattr(real, "dra_mode", dra_mode)
        config = real.scheduler_config("rtcr-50:2-w1:2", tmp_path / "kubeconfig")
        args = {c["name"]: c["args"] for c in config["profiles"][0]["pluginConfig"]}
        balanced = [r["name"] for r in args.get("NodeResourcesBalancedAllocation", {}).get("resources", [])] or \
            ["cpu", "memory"]
        assert ("nvidia.com/gpu" in balanced) is not dra_mode
        assert args["NodeResourcesFit"]["scoringStrategy"]["resources"] == [{"name": "nvidia.com/gpu", "weight": 100}]
        assert real.model_profile("rtcr-50:2-w1:2", "1.37.2").balanced_resources == tuple(balanced)


def test_pods_that_fit_nowhere_are_left_out_of_the_ideal_as_a_scheduler_leaves_them_pending():
    """Training pods (8 cpu, 64 Gi) at 75 % of two 8-GPU nodes with 256 Gi: 12 pods, room for 4 a node. The ideal
    places the 8 that fit on both nodes (none left empty), and the count of what the scheduler could not place is
    the measure's, not an error."""
    nodes = [Node(f"n{i}", 64_000, 256 * 1024, 8) for i in range(2)]
    pods = shapes.arrivals("training", nodes, 75, seed=42)
    assert len(pods) == 12
    assert shapes.ideal_nodes_used(nodes, pods) == 2
    run = shapes.measure("training", 75, nodes, pods, lambda c: Scheduler(c, Profile("p", strategy="MostAllocated",
                                                                                     resources=((GPU, 1),)),
                                                                           random.Random(1)))
    assert (run.empty, run.ideal, run.unplaced) == (0, 0, 4)
