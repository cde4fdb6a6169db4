"""benchmarks/packing_real.py: its node sample and pods (pure), and a small run on the real kube-scheduler."""
from __future__ import annotations

import collections
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_bootstrap.sim import trace
from gpu_bootstrap.sim.engine import Node, Pod
from tests.tools import shared_dir, tool_env

ROOT = Path(__file__).resolve().parents[1]
TRACES = shared_dir() / "traces"  # ../shared beside the checkout, or beside the clone it came from (CI)


def bench():
    """The benchmark script as a module (loaded once; dataclasses need it in sys.modules)."""
    if "packing_real" not in sys.modules:
        spec = importlib.util.spec_from_file_location("packing_real", ROOT / "benchmarks" / "packing_real.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["packing_real"] = module
        spec.loader.exec_module(module)
    return sys.modules["packing_real"]


def test_the_node_sample_keeps_each_strata_share_and_every_stratum():
    nodes = [Node(f"a{i:03d}", 64000, 262144, 8, "G2") for i in range(90)] + \
            [Node(f"b{i:03d}", 32000, 131072, 2, "T4") for i in range(9)] + [Node("c000", 96000, 786432, 8, "G3")]
    chosen = bench().stratified_sample(nodes, 20)
    assert len(chosen) == 20
    kinds = collections.Counter(n.model for n in chosen)
    assert kinds == {"G2": 18, "T4": 1, "G3": 1}  # 18 / 1.8 / 0.2 of 20, the last raised to one
    assert len({n.name for n in chosen}) == 20
    assert bench().stratified_sample(nodes, None) == nodes and bench().stratified_sample(nodes, 500) == nodes


@pytest.mark.skipif(not (TRACES / "openb_node_list_gpu_node.csv").exists(), reason="no openb trace here")
def test_the_openb_sample_has_the_size_asked_and_its_gpu_share():
    nodes = trace.load_nodes(TRACES / "openb_node_list_gpu_node.csv")
    chosen = bench().stratified_sample(nodes, 150)
    assert len(chosen) == 150
    share = sum(n.gpus for n in chosen) / len(chosen)
    assert abs(share - sum(n.gpus for n in nodes) / len(nodes)) < 0.3  # 5.12 GPUs a node in the whole list


def test_a_pod_asks_for_what_the_trace_says_and_leaves_an_unset_request_out():
    pod = bench().pod_object("p1", Pod(cpu=0, memory=16384, gpus=2, models=frozenset({"T4", "P100"})), "s")
    container = pod["spec"]["containers"][0]
    assert container["resources"] == {"requests": {"nvidia.com/gpu": "2", "memory": "16384Mi"},
                                      "limits": {"nvidia.com/gpu": "2"}}
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["P100", "T4"]
    assert pod["spec"]["schedulerName"] == "s"


def test_each_profile_is_rendered_by_our_renderer_and_read_back_by_the_model():
    module = bench()
    for name, settings in module.PROFILES.items():
        config = module.scheduler_config(name, Path("/k"))
        assert config["clientConnection"]["kubeconfig"] == "/k"
        profile = module.model_profile(name, "1.37.2")
        assert profile.balanced_by_change  # kube-scheduler 1.36+ scores BalancedAllocation by change
        if settings is None:
            assert "pluginConfig" not in config["profiles"][0] and profile.percentage_of_nodes_to_score == 0
        else:
            assert config["profiles"][0]["schedulerName"] == "gpu-binpack-scheduler"
            assert profile.strategy == settings["strategy"] and profile.percentage_of_nodes_to_score == 100


@pytest.mark.skipif(not (TRACES / "openb_node_list_gpu_node.csv").exists(), reason="no openb trace here")
def test_a_small_run_on_the_real_scheduler_reports_every_profile_and_the_model_beside_it(tmp_path):
    """The benchmark end to end on the real etcd, kube-apiserver and kube-scheduler (tests/localcluster builds),
    shrunk to 12 nodes and two profiles. Fewer than 100 nodes are all scored (percentageOfNodesToScore), so only
    random tie-breaks can part the real scheduler from the model: their figures must be close."""
    from tests.localcluster.cluster import binaries
    from tests.tools import missing
    absent = [name for name, path in binaries().items()
              if name in ("etcd", "kube-apiserver", "kube-scheduler") and not path.exists()]
    if absent:
        missing("not built: " + ", ".join(absent))
    out = tmp_path / "runs.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "packing_real.py"), "--seeds", "1",
                             "--nodes-sample", "12", "--profiles", "kube-default,rtcr-50:1-w2:1",
                             "--traces", str(TRACES), "--json", str(out)],
                            capture_output=True, text=True, timeout=600, cwd=ROOT, env=tool_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "nodes: 12 of 1213 (stratified sample" in result.stdout
    runs = json.loads(out.read_text())["runs"]
    assert [(r["profile"], r["seed"]) for r in runs] == [("kube-default", 42), ("rtcr-50:1-w2:1", 42)]
    for run in runs:
        assert run["pods"] > 40
        for side in ("real", "model"):
            assert 50 < run[side]["alloc_pct_at_100"] <= 100 and 50 < run[side]["alloc_pct_at_130"] <= 100
        assert abs(run["real"]["alloc_pct_at_130"] - run["model"]["alloc_pct_at_130"]) < 10
    assert "median of seeds" in result.stdout
