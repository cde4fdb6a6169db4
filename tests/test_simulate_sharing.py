"""`gpu-bootstrap simulate --sharing` through the CLI on a small trace whose GPU counts are worked out by hand, its
bad-input errors, and the device plugin's replica allocation (sim/deployable.py) against the cases the plugin's own
tests pin down (NVIDIA/k8s-device-plugin internal/rm/allocate_test.go)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.sim import deployable
from gpu_bootstrap.sim.sharing import SharePod

pytestmark = pytest.mark.unit
runner = CliRunner()
NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,4,T4\nn1,32000,131072,4,T4\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
# four quarter-GPU pods, two half-GPU pods, one whole GPU and a CPU-only pod: 3 GPU-equivalents, 7 GPUs if whole
PODS = POD_HEADER + "".join(f"q{i},1000,1024,1,250,\n" for i in range(4)) + \
    "h0,1000,1024,1,500,\nh1,1000,1024,1,500,\nw0,1000,1024,1,1000,\nc0,1000,1024,0,0,\n"


def run(tmp_path: Path, pods: str, *args: str):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(pods)
    return runner.invoke(app, ["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods",
                               str(tmp_path / "pods.csv"), "--sharing", "--seeds", "3", *args,
                               "--log-file", str(tmp_path / "log")], env={"COLUMNS": "160"})


def test_sharing_gives_the_hand_computed_gpu_counts(tmp_path):
    # The counts below were worked out for a profile that packs from the first pod on (MostAllocated); the default
    # profile barely scores a node below half full, so at this small load it spreads the replicas over both nodes.
    result = run(tmp_path, PODS, "-o", "json", "--set", "strategy=MostAllocated", "--set",
                 "balanced_allocation_weight=0")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    rows = {row["setup"]: row for row in document["sharing"]}
    assert document["pods"] == {"gpu_pods": 7, "fractional_pods": 6, "gpus_if_whole": 7, "gpu_equivalents": 3.0,
                                "source": str(tmp_path / "pods.csv")}
    assert rows["whole GPUs"]["gpus_in_use"] == 7
    # best fit of 250/500 shares packs them into 2 GPUs whatever the order, the whole GPU takes a third; the packing
    # policies keep every pod on the node they started with
    for policy in ("DotProd", "GpuClustering", "GpuPacking", "BestFit"):
        assert rows[f"shared: {policy}"]["gpus_in_use"] == 3, policy
    # time-slicing x4: 4 x 1 + 2 x 2 + 4 = 12 replicas on one node's 16; packed fills GPUs in turn (3 in use),
    # distributed spreads the first four replicas over all four GPUs
    assert rows["time-slicing x4, packed"]["gpus_in_use"] == 3
    assert rows["time-slicing x4, distributed"]["gpus_in_use"] == 4
    assert rows["time-slicing x4, distributed"]["split_pods"] >= 1  # the whole-GPU pod: 4 replicas, 4 GPUs
    assert all(row["unplaced_pods"] == 0 for row in rows.values())


def test_sharing_table_for_people(tmp_path):
    result = run(tmp_path, PODS, "--replicas", "2")
    assert result.exit_code == 0, result.output
    assert "time-slicing x2, packed" in result.stdout and "GPUs in use" in result.stdout


@pytest.mark.parametrize(("row", "message"), [
    ("p0,1000,1024,1,1250,", "pods.csv:2: column gpu_milli is '1250', more than one GPU (1000)"),
    ("p0,-1000,1024,1,500,", "pods.csv:2: column cpu_milli is negative"),
    ("p0,1000,1024,1,-500,", "pods.csv:2: column gpu_milli is negative"),
])
def test_bad_pod_rows_exit_2_with_file_and_line(tmp_path, row, message):
    result = run(tmp_path, POD_HEADER + row + "\n")
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_sharing_refuses_a_live_cluster_and_bad_replicas(tmp_path):
    result = runner.invoke(app, ["simulate", "--from-cluster", "--pods", "p.csv", "--sharing",
                                 "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 2 and "--sharing needs --nodes FILE" in " ".join(result.output.split())
    assert run(tmp_path, PODS, "--replicas", "1").exit_code == 2


def test_device_plugin_distributed_spreads_and_packed_consolidates():
    # allocate_test.go TestPackedVsDistributedContrast: 4 replicas from 4 GPUs x 4, none allocated yet
    assert deployable.allocate_replicas([0, 0, 0, 0], 4, 4, "distributed") == [0, 1, 2, 3]
    assert deployable.allocate_replicas([0, 0, 0, 0], 4, 4, "packed") == [0, 0, 0, 0]
    # the GPU with the most (packed) or fewest (distributed) replicas in use goes first; full GPUs are skipped
    assert deployable.allocate_replicas([1, 3, 4, 0], 4, 2, "packed") == [1, 0]
    assert deployable.allocate_replicas([1, 3, 4, 0], 4, 2, "distributed") == [3, 0]


def test_replicas_a_pod_asks_for():
    assert deployable.replicas_for(SharePod(1000, 0, 1, 250), 4) == 1
    assert deployable.replicas_for(SharePod(1000, 0, 1, 260), 4) == 2  # a share rounds up to whole replicas
    assert deployable.replicas_for(SharePod(1000, 0, 2, 1000), 4) == 8
