"""The preflight step inside `up`: real sshd nodes that are also nodes of the emulated cluster."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.pipeline.checkpoint import NAME as STATE, NAMESPACE
from tests.nodes import scenarios
from tests.nodes.farm import NodeFarm

pytestmark = pytest.mark.tools
runner = CliRunner()
NODES = ["gpu-a", "gpu-b"]
SPINE = ["--playbook", str(Path(__file__).resolve().parent / "playbooks" / "spine.yaml")]


@pytest.fixture
def emulator_options():
    return {"gpu_nodes": NODES, "cpu_nodes": ["cpu-1"]}


@pytest.fixture
def farm():
    farm = NodeFarm()
    yield farm
    farm.close()


def setup(farm: NodeFarm, cluster, tmp_path: Path, scenario=scenarios.healthy_h100) -> Path:
    for name in NODES:
        farm.add(name, scenario)
    return farm.config_yaml(tmp_path / "gpu-bootstrap.yaml", farm.known_hosts(tmp_path / "known_hosts"),
                            kubeconfig=cluster.kubeconfig)


def run(*args: str, tmp_path: Path):
    result = runner.invoke(app, [*args, *SPINE, "--log-file", str(tmp_path / "log")])
    document = json.loads(result.stdout) if result.stdout.startswith("{") else None
    return result, document


def statuses(document: dict) -> dict:
    return {s["id"]: s["status"] for s in document["steps"]}


def test_up_reads_the_nodes_then_prepares_them(farm, cluster, tmp_path):
    config = setup(farm, cluster, tmp_path)
    result, document = run("up", "-c", str(config), "-o", "json", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert statuses(document) == {"preflight": "probed", "node-prep": "applied"}
    assert "2 GPU node(s) checked (ssh)" in document["steps"][0]["message"]
    record = json.loads(cluster.emu.get("configmaps", STATE, NAMESPACE)["data"]["preflight"])
    assert record["status"] == "probed" and record["fingerprint"]
    cluster.emu.requests.clear()
    again, document = run("up", "-c", str(config), "-o", "json", tmp_path=tmp_path)
    assert statuses(document) == {"preflight": "unchanged", "node-prep": "unchanged"}
    assert cluster.emu.requests.writes() == []
    assert farm.nodes["gpu-a"].sessions() == ["session -c sh -s"] * 2


def test_a_failing_node_stops_up_before_any_change(farm, cluster, tmp_path):
    config = setup(farm, cluster, tmp_path, scenarios.nouveau)
    cluster.emu.requests.clear()
    result, document = run("up", "-c", str(config), "-o", "json", tmp_path=tmp_path)
    assert result.exit_code == 1
    assert "gpu-a: nouveau:" in document["error"] and "blacklist" in document["error"]
    assert cluster.emu.requests.writes() == []
    assert not cluster.emu.get("nodes", "gpu-a")["spec"].get("taints")


def test_changed_node_facts_change_the_preflight_record(farm, cluster, tmp_path):
    config = setup(farm, cluster, tmp_path)
    run("up", "-c", str(config), tmp_path=tmp_path)
    before = json.loads(cluster.emu.get("configmaps", STATE, NAMESPACE)["data"]["preflight"])["fingerprint"]
    from tests.nodes.farm import Tree
    scenarios.nvidia_smi(Tree(farm.nodes["gpu-b"].root), ("NVIDIA H100 80GB HBM3", 81559, "9.0"), 8,
                         driver="570.86.15")  # the driver on gpu-b was upgraded
    result, document = run("up", "-c", str(config), "-o", "json", tmp_path=tmp_path)
    after = json.loads(cluster.emu.get("configmaps", STATE, NAMESPACE)["data"]["preflight"])["fingerprint"]
    assert result.exit_code == 0 and after != before
    assert statuses(document)["node-prep"] == "unchanged"


def test_a_saved_report_replaces_ssh_online_and_offline(farm, cluster, tmp_path):
    config = setup(farm, cluster, tmp_path)
    result, report = run("doctor", "-c", str(config), "-o", "json", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    (tmp_path / "report.json").write_text(json.dumps(report))
    for name in NODES:
        farm.stop_node(name)  # from here on, SSH would fail
    online, document = run("up", "-c", str(config), "--preflight-report", str(tmp_path / "report.json"), "-o",
                           "json", tmp_path=tmp_path)
    assert online.exit_code == 0, online.output
    assert statuses(document) == {"preflight": "probed", "node-prep": "applied"}
    assert f"({tmp_path / 'report.json'})" in document["steps"][0]["message"]
    offline, document = run("up", "--dry-run", "--offline", "-c", str(config), "--preflight-report",
                            str(tmp_path / "report.json"), "-o", "json", tmp_path=tmp_path)
    assert offline.exit_code == 0 and statuses(document)["preflight"] == "unchanged"
    # without the report: SSH is refused, and the facts the run with the report recorded stand in (issue 56)
    without, document = run("up", "-c", str(config), "-o", "json", tmp_path=tmp_path)
    assert without.exit_code == 0, without.output
    assert statuses(document) == {"preflight": "unchanged", "node-prep": "unchanged"}
    assert "recorded facts for " in document["steps"][0]["message"], document["steps"][0]
    doctor, report = run("doctor", "-c", str(config), "-o", "json", tmp_path=tmp_path)
    assert doctor.exit_code == 0, doctor.output
    for node in report["nodes"]:  # each says it was not read now, and why
        ssh = next(c for c in node["checks"] if c["id"] == "ssh")
        assert node["came_from"] == "recorded" and ssh["status"] == "warn", node
        assert ssh["message"].startswith("not read now (connection refused") and "using its facts read" in \
            ssh["message"], ssh


def test_a_bad_report_is_bad_input(farm, cluster, tmp_path):
    config = setup(farm, cluster, tmp_path)
    (tmp_path / "bad.json").write_text('{"nodes": [{"name": "gpu-a", "checks": []}]}')
    result, _ = run("up", "-c", str(config), "--preflight-report", str(tmp_path / "bad.json"), tmp_path=tmp_path)
    # the report's schema is checked first: an empty check list is named by its field
    assert result.exit_code == 2 and "bad.json: nodes[0].checks" in result.output, result.output
    (tmp_path / "worse.json").write_text("not json")
    result, _ = run("up", "-c", str(config), "--preflight-report", str(tmp_path / "worse.json"), tmp_path=tmp_path)
    assert result.exit_code == 2 and "not valid JSON" in result.output
