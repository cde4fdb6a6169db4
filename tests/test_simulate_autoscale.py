"""`gpu-bootstrap simulate --autoscale` (gpu_bootstrap/sim/autoscale.py): a trace's pods at their own times on nodes
an autoscaler adds and removes, node-hours per profile. Through the CLI, with small traces written here whose
node-seconds are worked out by hand, and the real openb trace from ../shared/traces."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.sim import autoscale
from gpu_bootstrap.sim.engine import Node, Pod
from tests.test_simulate_cli import NODE_HEADER, POD_HEADER, trace

pytestmark = pytest.mark.unit
runner = CliRunner()


def simulate(tmp_path: Path, *args: str):
    return runner.invoke(app, ["simulate", *args, "--log-file", str(tmp_path / "log")], env={"COLUMNS": "160"})


def files(tmp_path: Path, pods: list[tuple], gpus: int = 4) -> list[str]:
    """A one-node inventory (the instance type) and a pod list: (name, cpu, MiB, GPUs, start, end) per pod."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODE_HEADER + f"n0,32000,131072,{gpus},A100\n")
    listed = tmp_path / "pods.csv"
    listed.write_text(POD_HEADER + "".join(f"{name},{cpu},{memory},{count},1000,,LS,Running,{start},{end},{start}\n"
                                           for name, cpu, memory, count, start, end in pods))
    return ["--nodes", str(nodes), "--pods", str(listed)]


# t=0 a 4-GPU pod fills node 1 and a 1-GPU pod brings node 2; at t=100 node 1 empties; at t=120 a 1-GPU pod comes.
# kube-scheduler's default puts it on the emptiest node, node 1, so both live until 1000 and go at 1050: 2100 node-s.
# Packing puts it beside the other on node 2, and node 1 goes at 150: 150 + 1050 = 1200 node-seconds.
HAND_WORKED = [("whole", 4000, 8192, 4, 0, 100), ("long", 1000, 1024, 1, 0, 1000), ("late", 1000, 1024, 1, 120, 1000)]


def test_a_pod_on_the_emptiest_node_keeps_it_alive_and_packing_lets_it_go(tmp_path):
    result = simulate(tmp_path, *files(tmp_path, HAND_WORKED), "--autoscale", "--consolidate-after", "50s",
                      "--seeds", "1", "-o", "json")
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)["autoscale"]
    by_name = {p["name"]: p for p in run["policies"]}
    assert by_name["default"]["node_seconds"] == 2100
    assert by_name["gpu-binpack-scheduler"]["node_seconds"] == 1200
    assert by_name["gpu-binpack-scheduler"]["vs_baseline_pct"] == round(100 * (1200 - 2100) / 2100, 1)
    assert [by_name[n]["nodes_launched"] for n in ("default", "gpu-binpack-scheduler")] == [2, 2]
    assert run["floor_node_hours"] == round((4 * 100 + 1000 + 880) / 4 / 3600, 1)
    assert run["instance"] == {"gpus": 4, "cpu_milli": 32000, "memory_mib": 131072, "model": "A100"}


def test_a_node_empty_for_less_than_the_consolidation_time_takes_the_next_pod_instead_of_a_new_node(tmp_path):
    """One pod leaves at 100 and the next comes at 130: with 60 s the node is still there (one launch, up from 0
    to 260); with 20 s it is gone at 120 and a second node is launched at 130 (0-120 and 130-260)."""
    pods = [("first", 1000, 1024, 1, 0, 100), ("second", 1000, 1024, 1, 130, 200)]
    for after, launched, seconds in (("60s", 1, 260), ("20s", 2, 120 + 90)):
        result = simulate(tmp_path, *files(tmp_path, pods), "--autoscale", "--consolidate-after", after, "--seeds",
                          "1", "-o", "json")
        assert result.exit_code == 0, result.output
        [default, ours] = json.loads(result.stdout)["autoscale"]["policies"]
        assert (default["nodes_launched"], default["node_seconds"]) == (launched, seconds), after
        assert (ours["nodes_launched"], ours["node_seconds"]) == (launched, seconds), after


def test_pods_no_node_of_the_shape_can_take_are_left_out_and_counted(tmp_path):
    pods = [("fits", 1000, 1024, 1, 0, 100), ("too-many-gpus", 1000, 1024, 8, 0, 100),
            ("too-much-memory", 1000, 262144, 1, 0, 100)]
    result = simulate(tmp_path, *files(tmp_path, pods), "--autoscale", "--seeds", "1")
    assert result.exit_code == 0, result.output
    assert "2 pod(s) fit no node of this shape" in result.output
    assert "no scheduler can go below" in result.output and "vs default" in result.output


def test_the_openb_trace_costs_fewer_node_hours_packed_than_spread(tmp_path):
    """The whole default trace (3,981 GPU pods over 149 days, at most 41 at once), nodes of its commonest 8-GPU
    shape, removed after 10 minutes empty: packing must cost less than kube-scheduler's default, and neither may go
    below the GPU-hours / 8 floor."""
    result = simulate(tmp_path, "--nodes", str(trace("openb_node_list_gpu_node.csv")), "--pods",
                      str(trace("openb_pod_list_default.csv")), "--autoscale", "--seeds", "2", "-o", "json")
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)["autoscale"]
    default, ours = run["policies"]
    assert ours["node_hours"] < default["node_hours"], run
    assert min(default["node_hours"], ours["node_hours"]) >= run["floor_node_hours"] > 0
    assert run["pods"] - run["unplaceable"] > 3900 and run["most_pods_at_once"] >= 1


@pytest.mark.parametrize("args, said", [
    (["--shapes"], "leave out --shapes"),
    (["--consolidate-after", "ten minutes"], "--consolidate-after: 'ten minutes' is not an age"),
    (["--consolidate-after", "0s"], "--consolidate-after:"),
])
def test_a_bad_autoscale_option_is_exit_2_naming_it(tmp_path, args, said):
    pods = [("one", 1000, 1024, 1, 0, 100)]
    given = files(tmp_path, pods)
    if "--shapes" in args:
        given = given[:2]  # --shapes places its own pods
    result = simulate(tmp_path, *given, "--autoscale", *args)
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.split()), result.output


def test_a_pod_list_without_times_is_refused_naming_the_columns(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODE_HEADER + "n0,32000,131072,4,A100\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,1024,1,1000,\n")
    result = simulate(tmp_path, "--nodes", str(nodes), "--pods", str(pods), "--autoscale")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "no GPU pod has both creation_time and deletion_time" in text and "creation_time, deletion_time" in text


def test_a_bad_time_is_refused_naming_the_file_line_and_column(tmp_path):
    given = files(tmp_path, [("one", 1000, 1024, 1, 0, 100)])
    pods = Path(given[3])
    pods.write_text(pods.read_text().replace(",0,100,0", ",-5,100,0"))
    result = simulate(tmp_path, *given, "--autoscale")
    assert result.exit_code == 2, result.output
    assert f"{pods}:2: column creation_time is negative" in " ".join(result.output.split()), result.output


def test_never_more_nodes_are_up_than_pods_run_at_once():
    """The model's slots are sized by that bound (a node is only added when no node, an empty one included, can
    take the pod): a burst of 9 one-GPU pods on 1-GPU nodes, some leaving and others coming."""
    template = Node("t", 8000, 32768, 1)
    pods = [autoscale.TimedPod(Pod(1000, 1024, 1), start, start + 50) for start in (0, 0, 0, 10, 10, 60, 60, 60, 70)]
    assert autoscale.most_at_once(pods) == 5
    from gpu_bootstrap.sim.scoring import DEFAULT_PROFILE
    run = autoscale.replay(pods, template, DEFAULT_PROFILE, 42, consolidate_after=5)
    assert run.peak_nodes == 5 and run.unplaceable == 0
    # three nodes 0-55; two 10-115 (at 60 their pods leave and two of the three new ones take them at once); one
    # launched at 60 and one at 70, each up for its pod and 5 s empty
    assert (run.nodes_launched, run.node_seconds) == (7, 3 * 55 + 2 * 105 + 55 + 55)


def test_the_real_benchmark_s_pods_ask_for_cpu_and_memory_and_its_model_peer_predicts_a_saving():
    """benchmarks/autoscale_real.py: pods as users write them ask for cpu and memory with their GPUs (12 cores and
    48 GiB a GPU by default), and the model of the same arrivals, printed beside the measured ratio, predicts that
    packing costs fewer node-seconds; GPU-only pods predict less of a difference."""
    import importlib
    bench = importlib.import_module("benchmarks.autoscale_real")
    args = bench.parse([])
    arrivals = bench.workload(args.pods, args.span, args.seed, args.runs_for, args.per_gpu)
    pod = bench.pod(arrivals[0], "binpack", {"key": "nvidia.com/gpu", "effect": "NoSchedule"})
    requests = pod["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {"cpu": f"{12000 * arrivals[0].gpus}m", "memory": f"{48 * arrivals[0].gpus}Gi"}
    with_requests = bench.model(arrivals, args.consolidate_after)["ratio"]
    gpus_only = bench.model(bench.workload(args.pods, args.span, args.seed, args.runs_for, (0.0, 0)),
                            args.consolidate_after)["ratio"]
    assert with_requests < 0.85 and with_requests < gpus_only < 1.0
