"""`gpu-bootstrap simulate` through the CLI: the real openb trace from ../shared/traces, small synthetic traces
written here (same columns), and a live cluster's inventory from the emulator."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from tests.conftest import SHARED

runner = CliRunner()
TRACES = SHARED / "traces"
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time," \
             "scheduled_time\n"


def trace(name: str) -> Path:
    path = TRACES / name
    if not path.exists():
        from tests.tools import missing
        missing(f"the openb trace {path} is not present")
    return path


def simulate(tmp_path: Path, *args: str):
    result = runner.invoke(app, ["simulate", *args, "--log-file", str(tmp_path / "log")], env={"COLUMNS": "160"})
    document = json.loads(result.stdout) if result.stdout.startswith("{") else None
    return result, document


def small_trace(tmp_path: Path, nodes: int = 4, extra_pods: str = "") -> tuple[Path, Path]:
    node_file = tmp_path / "nodes.csv"
    node_file.write_text(NODE_HEADER + "".join(f"n-{i},96000,393216,8,G2\n" for i in range(nodes)) +
                         "cpu-0,32000,262144,0,\n")
    pod_file = tmp_path / "pods.csv"
    rows = ["p-0,4000,16384,1,1000,,LS,Running,0,1,0", "p-1,8000,32768,2,1000,,LS,Running,0,1,0",
            "p-2,16000,65536,8,1000,,LS,Running,0,1,0", "p-3,2000,8192,1,500,,BE,Running,0,1,0",
            "p-4,1000,2048,0,0,,BE,Running,0,1,0"]
    pod_file.write_text(POD_HEADER + "\n".join(rows) + "\n" + extra_pods)
    return node_file, pod_file


@pytest.mark.unit
@pytest.mark.slow
def test_the_openb_trace_default_against_the_tool_profile(tmp_path):
    """The issue's acceptance run. Its figures are deterministic for fixed seeds, so the chosen defaults are
    guarded here: at least 99 % allocated at 100 % arrived and the first fragmentation failure past 75 % (the profile
    that packs light GPU pods too, fit weight 3, meets its first fragmentation failure at about 81 %, where weight 2
    met it at 98 %: the price of not spreading inference pods before 1.36; docs/steps/binpack-scheduler.md)."""
    result, document = simulate(tmp_path, "--nodes", str(trace("openb_node_list_gpu_node.csv")),
                                "--pods", str(trace("openb_pod_list_default.csv")), "--seeds", "3", "-o", "json")
    assert result.exit_code == 0, result.output
    assert (document["track"], document["seeds"], document["inventory"]["gpus"]) == ("A", 3, 6212)
    default, ours = document["policies"]
    assert (default["name"], ours["name"]) == ("default", "gpu-binpack-scheduler")
    for policy in (default, ours):
        assert set(policy) >= {"alloc_pct_at_100", "alloc_pct_at_130", "frag_failures", "first_frag_failure_pct",
                               "stranded_gpus", "free_8gpu_nodes"}
        assert set(policy["frag_failures"]) == {"1", "2", "4", "8"}
    assert ours["alloc_pct_at_100"] >= 99.0 and ours["first_frag_failure_pct"] > 75
    assert default["alloc_pct_at_100"] < 95 and default["first_frag_failure_pct"] < 50
    # The default profile packs at 100 % and, unlike the MostAllocated profile before it, keeps up with
    # kube-scheduler's default at 130 % (within the spread of the seeds;
    # docs/steps/binpack-scheduler.md, "Choosing the scoring").
    assert ours["alloc_pct_at_130"] >= default["alloc_pct_at_130"] - 0.2
    # first-fit decreasing is a reference, not a bound: the default profile ends within a point of it (here above)
    offline = document["bounds"]["offline_ffd"]["alloc_pct_at_100"]
    assert abs(ours["alloc_pct_at_100"] - offline) < 1 and offline <= 100.0
    assert document["gap_closed_pct"] > 90


@pytest.mark.unit
def test_the_text_report_names_every_policy_and_the_reference(tmp_path):
    nodes, pods = small_trace(tmp_path)
    result, _ = simulate(tmp_path, "--nodes", str(nodes), "--pods", str(pods), "--seeds", "2", "--policy",
                         "random", "--workers", "1")
    assert result.exit_code == 0, result.output
    for text in ("default", "gpu-binpack-scheduler", "random", "offline reference", "aggregate bound",
                 "RequestedToCapacityRatio (nvidia.com/gpu=100 shape 0:0,50:1,100:10) x3"):
        assert text in result.output


@pytest.mark.unit
def test_set_tries_a_profile_without_editing_the_config(tmp_path):
    nodes, pods = small_trace(tmp_path)
    result, document = simulate(tmp_path, "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "-o", "json",
                                "--set", "strategy=RequestedToCapacityRatio",
                                "--set", "resource_weights={nvidia.com/gpu: 100, cpu: 1}",
                                "--set", "balanced_allocation_weight=2", "--set", "fit_weight=1",
                                "--set", "shape=[{utilization: 0, score: 0}, {utilization: 100, score: 10}]",
                                "--set", "balanced_allocation_resources=[cpu, memory]")
    assert result.exit_code == 0, result.output
    assert document["policies"][1]["profile"] == ("RequestedToCapacityRatio (nvidia.com/gpu=100 cpu=1 shape "
                                                  "0:0,100:10) x1 + BalancedAllocation x2")


@pytest.mark.unit
def test_the_config_files_scheduler_section_is_what_is_simulated(tmp_path):
    nodes, pods = small_trace(tmp_path)
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text("nodes: [{name: n-0}]\nscheduler:\n  name: packer\n  fit_weight: 4\n")
    result, document = simulate(tmp_path, "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "-o", "json",
                                "-c", str(config))
    assert result.exit_code == 0, result.output
    assert document["policies"][1]["name"] == "packer" and "x4 + BalancedAllocation" in document["policies"][1]["profile"]


@pytest.mark.unit
def test_track_b_rounds_fractions_up_and_keeps_cpu_pods_off_gpu_nodes(tmp_path):
    nodes, pods = small_trace(tmp_path)
    _, track_a = simulate(tmp_path, "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "-o", "json")
    _, track_b = simulate(tmp_path, "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "-o", "json",
                          "--track", "B")
    assert track_a["population"] == {"pods": 3, "gpu_pods": 3, "constrained_pods": 0, "source": str(pods)}
    assert track_b["population"] == {"pods": 5, "gpu_pods": 4, "constrained_pods": 0, "source": str(pods)}
    assert track_b["policies"][0]["unplaced_cpu_pods"] == 0  # the CPU node takes them


def test_plot_draws_every_policy(tmp_path):
    """Not `unit`: matplotlib's first import on a machine without its font cache runs fc-list (a process) to build it,
    so the test would pass or fail by whether an earlier test (or run) built that cache. scripts/install-test-tools
    builds the cache, so this costs no fc-list run in CI either."""
    nodes, pods = small_trace(tmp_path)
    image = tmp_path / "packing.png"
    result, _ = simulate(tmp_path, "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "--plot", str(image))
    assert result.exit_code == 0, result.output
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 10_000


@pytest.mark.unit
@pytest.mark.parametrize("args, message", [
    (["--nodes", "{nodes}"], "give the pods to replay with --pods CSV, or --shapes"),
    (["--pods", "{pods}"], "exactly one of --nodes FILE or --from-cluster"),
    (["--pods", "{pods}", "--nodes", "{nodes}", "--from-cluster"], "exactly one of --nodes FILE or --from-cluster"),
    (["--pods", "{pods}", "--nodes", "{nodes}", "--policy", "fgd"], "--policy 'fgd' is not a built-in policy"),
    (["--pods", "{pods}", "--nodes", "{nodes}", "--set", "fit_weight=0"], "scheduler.fit_weight"),
    (["--pods", "{pods}", "--nodes", "{nodes}", "--set", "colour=blue"], "KEY a scheduler setting"),
    (["--pods", "{pods}", "--nodes", "{nodes}", "--tune", "0.5"], "--tune 0.5"),
    (["--pods", "{bad}", "--nodes", "{nodes}"], "bad.csv:3: column num_gpu is 'two', not a number"),
    (["--pods", "{pods}", "--nodes", "{tmp}/none.csv"], "cannot read the node list"),
])
def test_bad_input_names_the_problem_and_exits_2(tmp_path, args, message):
    nodes, pods = small_trace(tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text(POD_HEADER + "a,1000,1024,1,1000,,LS,Running,0,1,0\nb,1000,1024,two,1000,,LS,Running,0,1,0\n")
    args = [a.format(nodes=nodes, pods=pods, bad=bad, tmp=tmp_path) for a in args]
    result, _ = simulate(tmp_path, *args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.31.0", "gpu_nodes": ["gpu-1", "gpu-2"], "gpus_per_node": 8, "cpu_nodes": ["cpu-1"]}


def test_from_cluster_uses_the_nodes_and_what_their_pods_already_request(cluster, tmp_path):
    cluster.emu.seed({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busy", "namespace": "default"},
                      "spec": {"nodeName": "gpu-1", "containers": [
                          {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 6}}}]}})
    _, pods = small_trace(tmp_path)
    result, document = simulate(tmp_path, "--from-cluster", "--kubeconfig", str(cluster.kubeconfig), "--pods",
                                str(pods), "--seeds", "1", "-o", "json")
    assert result.exit_code == 0, result.output
    assert document["inventory"]["nodes"] == 3 and document["inventory"]["gpus"] == 16
    assert document["inventory"]["source"].startswith("cluster https://127.0.0.1:")
    # 6 of the 16 GPUs are taken before the replay starts, so at most 10 can be allocated
    assert document["policies"][0]["alloc_pct_at_130"] <= 100 * 10 / 16


def test_from_cluster_keeps_running_pods_apart_so_defaults_count_per_container(cluster):
    """Two running pods of three containers, none with cpu or memory requests, and a sidecar: kube-scheduler's
    NodeResourcesFit counts 100m / 200Mi for each of the eight containers, not once for the node."""
    from gpu_bootstrap.adapters.kube import Kube
    from gpu_bootstrap.sim import engine, trace
    for name in ("worker-a", "worker-b"):
        cluster.emu.seed({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                          "spec": {"nodeName": "gpu-1", "containers": [
                              {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 2}}},
                              {"name": "log", "image": "x"}, {"name": "zero", "image": "x", "resources": {
                                  "requests": {"cpu": "0", "memory": "0"}}}],
                              "initContainers": [{"name": "proxy", "image": "x", "restartPolicy": "Always"}]},
                          "status": {"phase": "Running"}})
    cluster.emu.seed({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "done", "namespace": "default"},
                      "spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "image": "x"}]},
                      "status": {"phase": "Succeeded"}})
    nodes, running = trace.cluster_snapshot(Kube(cluster.kubeconfig))
    assert {n.name for n in nodes} == {"gpu-1", "gpu-2", "cpu-1"}
    pods = running["gpu-1"]
    assert len(pods) == 2  # one Pod per running pod; the finished one holds nothing
    # per pod: main, log and the sidecar lack requests (3 x 100m, 3 x 200Mi); "zero" asked for 0 and counts 0
    assert [(p.cpu, p.memory, p.gpus, p.nonzero_cpu, p.nonzero_memory) for p in pods] == [(0, 0, 2, 300, 600)] * 2
    used = engine.Cluster(nodes, running)
    index = [n.name for n in nodes].index("gpu-1")
    assert (used.nz_cpu[index], used.nz_mem[index], used.gpu[index]) == (600, 1200, 4)
    _, merged = trace.cluster_inventory(Kube(cluster.kubeconfig))
    assert (merged["gpu-1"].nonzero_cpu, merged["gpu-1"].gpus) == (600, 4)  # the merged view keeps the sums


@pytest.mark.unit
def test_departures_free_gpus_as_pods_leave(tmp_path):
    nodes, pods = small_trace(tmp_path, nodes=8)
    _, still = simulate(tmp_path, "--nodes", str(nodes), "--pods", str(pods), "--seeds", "3", "-o", "json")
    _, churn = simulate(tmp_path, "--nodes", str(nodes), "--pods", str(pods), "--seeds", "3", "-o", "json",
                        "--departures", "0.5")
    assert churn["departures"] == 0.5
    for before, after in zip(still["policies"], churn["policies"]):
        assert after["alloc_pct_at_130"] < before["alloc_pct_at_130"]


def shape_inventory(tmp_path: Path) -> Path:
    """Ten 8-GPU nodes of the openb G2 kind, one 4-GPU node and a CPU node: --shapes uses the ten."""
    node_file = tmp_path / "shape-nodes.csv"
    node_file.write_text(NODE_HEADER + "".join(f"g-{i},96000,393216,8,G2\n" for i in range(10)) +
                         "small-0,64000,262144,4,T4\ncpu-0,32000,262144,0,\n")
    return node_file


@pytest.mark.unit
@pytest.mark.parametrize("version, default_inference_empty", [("1.35", 0), ("1.37", 0)])
def test_shapes_show_the_bin_packing_profile_keeping_whole_nodes_that_the_default_spreads_over(
        tmp_path, version, default_inference_empty):
    """Inference pods at half the GPUs of ten 8-GPU nodes: five nodes could stay whole. The profile `up` renders keeps
    them whole on both scoring generations; kube-scheduler's default spreads the pods over all ten."""
    result, document = simulate(tmp_path, "--nodes", str(shape_inventory(tmp_path)), "--shapes", "--seeds", "1",
                                "--workers", "1", "--kube-version", version, "-o", "json")
    assert result.exit_code == 0, result.output
    shapes_doc = document["shapes"]
    assert (shapes_doc["nodes"], shapes_doc["gpus_per_node"], shapes_doc["kube_version"]) == (10, 8, version)
    assert [p["name"] for p in shapes_doc["policies"]] == ["default", "gpu-binpack-scheduler"]
    rows = {(r["shape"], r["load_pct"]): r for r in shapes_doc["rows"]}
    assert len(rows) == 12
    inference = rows["inference", 50]
    assert inference["ideal"] == 5
    assert inference["policies"]["gpu-binpack-scheduler"] == {"empty": 5, "share_pct": 100.0, "unplaced": 0}
    assert inference["policies"]["default"]["empty"] == default_inference_empty
    assert all(r["policies"]["gpu-binpack-scheduler"]["share_pct"] >= 95 for r in shapes_doc["rows"])


@pytest.mark.unit
def test_shapes_as_a_table_mark_what_falls_short(tmp_path):
    result, _ = simulate(tmp_path, "--nodes", str(shape_inventory(tmp_path)), "--shapes", "--seeds", "1",
                         "--workers", "1")
    assert result.exit_code == 0, result.output
    assert "Whole 8-GPU nodes left empty, of 10" in result.stdout
    assert "short of 95 % somewhere: default" in result.stdout
    assert "inference: 1 GPU, 500m cpu, 1 Gi" in result.stdout


@pytest.mark.unit
def test_shapes_agree_with_the_benchmarks_model_column(tmp_path):
    """`simulate --shapes --seeds 1` is the model column of benchmarks/packing_shapes.py, cell for cell (the
    benchmark's real column is compared with it in the closing notes and docs/steps/binpack-scheduler.md)."""
    import importlib
    bench = importlib.import_module("benchmarks.packing_shapes")
    from gpu_bootstrap.sim import trace as sim_trace
    nodes = shape_inventory(tmp_path)
    result, document = simulate(tmp_path, "--nodes", str(nodes), "--shapes", "--seeds", "1", "--workers", "1",
                                "--kube-version", "1.35", "--default-nodes-to-score", "0", "-o", "json")
    assert result.exit_code == 0, result.output
    eight = bench.sample(sim_trace.load_nodes(nodes), None)
    for row in document["shapes"]["rows"]:
        for profile, name in (("kube-default", "default"), ("up", "gpu-binpack-scheduler")):
            run = bench.model_run(profile, row["shape"], row["load_pct"], eight, "1.35")
            assert (row["policies"][name]["empty"], row["ideal"]) == (run.empty, run.ideal), (row, profile)


@pytest.mark.unit
@pytest.mark.parametrize("args, message", [
    (["--shapes", "--pods", "P"], "--shapes places its own pods"),
    ([], "give the pods to replay with --pods CSV, or --shapes"),
    (["--shapes", "--plot", "x.png"], "--plot draws a trace's replay"),
])
def test_shapes_refuse_what_they_cannot_use(tmp_path, args, message):
    result, _ = simulate(tmp_path, "--nodes", str(shape_inventory(tmp_path)),
                         *[str(tmp_path / "pods.csv") if a == "P" else a for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "x.png").exists()
