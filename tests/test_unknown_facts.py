"""Unknown is not absent: node facts that cannot be read never turn into "no driver" on a running fleet.

Real sshd nodes (tests/nodes) that are also nodes of the emulated cluster, the real gpu-operator chart installed by
the real helm into the emulator (whose stand-in operator runs the operands). Nodes go down by stopping their sshd.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.probes.report import RECORD_NAME, RECORD_NAMESPACE
from tests.conftest import chart
from tests.nodes import scenarios
from tests.nodes.farm import NodeFarm
from tests.nodes.reports import healthy_node

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.usefixtures("helm_on_path")]
runner = CliRunner()
NODES = ["node5", "node6"]


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.33.2", "gpu_nodes": NODES, "cpu_nodes": ["cpu-1"], "gpu_operator": True}


@pytest.fixture
def farm():
    farm = NodeFarm()
    yield farm
    farm.close()


@pytest.fixture
def config(farm, cluster, tmp_path) -> Path:
    for name in NODES:
        farm.add(name, scenarios.healthy_h100)  # driver and toolkit pre-installed: the operator installs neither
    path = farm.config_yaml(tmp_path / "gpu-bootstrap.yaml", farm.known_hosts(tmp_path / "known_hosts"),
                            kubeconfig=cluster.kubeconfig)
    path.write_text(path.read_text() + "monitoring: {enabled: false}\n"
                    f"gpu_operator:\n  chart: {chart('gpu-operator-v26.7.0.tgz')}\n"
                                       f"  wait_timeout: 30\nvalidate:\n  enabled: false\n")
    return path


def up(config: Path, tmp_path: Path, *extra: str):
    result = runner.invoke(app, ["up", "-c", str(config), "-o", "json", "--skip", "binpack-scheduler", *extra,
                                 "--log-file", str(tmp_path / "log")])
    return result, json.loads(result.stdout)


def release(cluster) -> tuple[int, dict]:
    [row] = json.loads(cluster.helm("list", "-n", "gpu-operator", "-o", "json").stdout)
    values = json.loads(cluster.helm("get", "values", "gpu-operator", "-n", "gpu-operator", "-o", "json").stdout)
    return int(row["revision"]), values


def step(document: dict, step_id: str) -> dict:
    return next(s for s in document["steps"] if s["id"] == step_id)


@pytest.fixture
def installed(config, cluster, tmp_path):
    result, document = up(config, tmp_path)
    assert result.exit_code == 0, result.output
    revision, values = release(cluster)
    assert revision == 1 and values["driver"]["enabled"] is False and values["toolkit"]["enabled"] is False
    return config


def reboot(cluster, name: str) -> None:
    """What a node's kubelet reports after a reboot, or a new machine registering under the same name: a new boot
    ID in its status."""
    import uuid
    from tests.kubeapi.store import WriteOptions
    node = cluster.emu.get("nodes", name)
    node["status"]["nodeInfo"]["bootID"] = str(uuid.uuid4())
    cluster.emu.store.update(cluster.emu.resource("nodes"), None, name, node,
                             WriteOptions(manager="kubelet", subresource="status"))


def test_every_node_down_leaves_the_running_release_alone(installed, farm, cluster, tmp_path):
    for name in NODES:
        farm.stop_node(name)
    result, document = up(installed, tmp_path)  # preflight cannot read the nodes: their recorded facts stand in
    assert result.exit_code == 0, result.output
    message = step(document, "preflight")["message"]
    assert "recorded facts for node5, node6" in message, message
    assert release(cluster) == (1, release(cluster)[1]) and release(cluster)[1]["driver"]["enabled"] is False
    reboot(cluster, "node5")  # rebooted while unreachable: its recorded facts may no longer be its facts
    result, document = up(installed, tmp_path)  # stop before any change
    assert result.exit_code == 1 and "node5: ssh:" in document["error"] and "boot ID changed" in document["error"]
    assert "node6: ssh:" not in document["error"]  # node6 is still the node its facts were read from
    result, document = up(installed, tmp_path, "--skip", "preflight")  # the recorded facts alone: node5 unknown
    assert result.exit_code == 0, result.output
    assert "the facts of node5 are unknown" in step(document, "gpu-operator")["message"]
    assert release(cluster) == (1, release(cluster)[1]) and release(cluster)[1]["driver"]["enabled"] is False
    cluster.emu.delete("configmaps", RECORD_NAME, RECORD_NAMESPACE)  # and with no record at all: unknown
    result, document = up(installed, tmp_path, "--only", "gpu-operator")
    assert result.exit_code == 0, result.output
    message = step(document, "gpu-operator")["message"]
    assert "the facts of node5, node6 are unknown" in message and "values of the running release are kept" in message
    assert release(cluster)[0] == 1 and release(cluster)[1]["driver"]["enabled"] is False


def test_one_node_without_facts_is_unknown_not_driverless(installed, farm, cluster, tmp_path):
    record = cluster.emu.get("configmaps", RECORD_NAME, RECORD_NAMESPACE)
    facts = json.loads(record["data"]["nodes.json"])
    facts["nodes"] = [n for n in facts["nodes"] if n["name"] != "node6"]  # as if node6 joined the config later
    record["data"]["nodes.json"] = json.dumps(facts)
    cluster.emu.seed(record)
    farm.stop_node("node6")
    result, document = up(installed, tmp_path, "--skip", "preflight")
    assert result.exit_code == 0, result.output
    assert "the facts of node6 are unknown" in step(document, "gpu-operator")["message"]
    assert "driver" not in step(document, "gpu-operator")["message"].split("unknown")[0]
    revision, values = release(cluster)
    assert revision == 1 and values["driver"]["enabled"] is False and values["toolkit"]["enabled"] is False


def test_unknown_facts_and_nothing_running_is_refused(config, farm, cluster, tmp_path):
    farm.stop_node("node5")
    result, document = up(config, tmp_path, "--skip", "preflight")
    assert result.exit_code == 1
    assert "the facts of node5, node6 could not be read" in document["error"]
    assert "gpu-bootstrap doctor" in document["error"]
    assert json.loads(cluster.helm("list", "-A", "-o", "json").stdout) == []


def test_a_stale_report_cannot_restart_the_operands_without_the_flag(installed, cluster, tmp_path):
    stale = tmp_path / "stale.json"  # says the nodes have no driver: the release would start installing one
    nodes = [healthy_node(name) for name in NODES]
    for node in nodes:
        driver = next(c for c in node["checks"] if c["id"] == "nvidia-driver")
        driver["data"] = {"driver_version": None, "gpus": [], "source": "none"}
    stale.write_text(json.dumps({"nodes": nodes, "ok": True}))
    result, document = up(installed, tmp_path, "--skip", "preflight", "--preflight-report", str(stale))
    assert result.exit_code == 1
    assert "driver.enabled: false → true" in document["error"] and "--allow-operand-restart" in document["error"]
    assert release(cluster)[0] == 1
    result, document = up(installed, tmp_path, "--skip", "preflight", "--preflight-report", str(stale),
                          "--allow-operand-restart")
    assert result.exit_code == 0, result.output
    revision, values = release(cluster)
    assert revision == 2 and values["driver"]["enabled"] is True


def test_cluster_probes_that_never_run_leave_the_running_release_alone(installed, cluster, tmp_path):
    """Preflight through the cluster (issue 24) whose probe pods never start (no kubelet runs them): every node is
    unknown with its reason within preflight.timeout, `up` stops before any change, nothing of the probe is left.
    Recorded facts are never reused here (max_facts_age 0s), so nothing stands in for the probe."""
    installed.write_text(installed.read_text() + "preflight: {timeout: 3, max_facts_age: 0s}\n")
    cluster.emu.controllers.disable("kubelet")
    result, document = up(installed, tmp_path, "--via", "cluster")
    assert result.exit_code == 1
    assert "node5: ssh: unknown: the probe did not finish within preflight.timeout (3s)" in document["error"]
    assert "node6: ssh: unknown" in document["error"]
    assert "preflight.max_facts_age is 0s" in document["error"]
    assert release(cluster)[0] == 1
    probe = [ns for ns in cluster.emu.list("namespaces") if ns["metadata"]["name"].startswith("gpu-bootstrap-probe")]
    assert probe == [] and not [p for p in cluster.emu.list("pods")
                                if p["metadata"]["namespace"].startswith("gpu-bootstrap-probe")]
