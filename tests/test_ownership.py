"""Only touch what is ours: a release, a namespace or a taint someone else made survives `up` and `teardown`
unless adopted explicitly. The real gpu-operator chart with the real helm, in the emulator."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from tests.conftest import chart
from tests.nodes.reports import write_report

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.usefixtures("helm_on_path")]
runner = CliRunner()
NODES = ["node5", "node6"]
PLAYBOOK = ["--skip", "monitoring,binpack-scheduler,admission-opa,admission,validate"]
USER_TAINT = {"key": "dedicated", "value": "ml", "effect": "PreferNoSchedule"}  # operands still fit


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.33.2", "gpu_nodes": NODES, "cpu_nodes": ["cpu-1"], "gpu_operator": True}


def write_config(tmp_path: Path, cluster, extra: str = "", adopt_namespaces: str = "") -> Path:
    path = tmp_path / "gpu-bootstrap.yaml"
    path.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}{adopt_namespaces}}}\nnodes:\n" +
                    "".join(f"  - name: {n}\n" for n in NODES) +
                    f"gpu_operator:\n  chart: {chart('gpu-operator-v26.7.0.tgz')}\n  wait_timeout: 30\n{extra}")
    return path


def cli(*args: str, tmp_path: Path):
    extra = ["--preflight-report", str(write_report(tmp_path / "report.json", NODES))] if args[0] == "up" else []
    result = runner.invoke(app, [*args, *extra, *PLAYBOOK, "-o", "json", "--log-file", str(tmp_path / "log")])
    return result, json.loads(result.stdout) if result.stdout.startswith("{") else None


def releases(cluster, selector: str = "") -> list[str]:
    args = ["list", "-A", "-o", "json"] + (["-l", selector] if selector else [])
    return [r["name"] for r in json.loads(cluster.helm(*args).stdout)]


def hand_install(cluster) -> None:
    cluster.helm("install", "gpu-operator", str(chart("gpu-operator-v26.7.0.tgz")), "-n", "gpu-operator",
                 "--create-namespace", "--set", "driver.enabled=false")


def step(document: dict, step_id: str) -> dict:
    return next(s for s in document["steps"] if s["id"] == step_id)


def test_teardown_leaves_a_release_it_did_not_install(cluster, tmp_path):
    hand_install(cluster)
    config = write_config(tmp_path, cluster)
    for _ in range(2):
        result, document = cli("teardown", "-c", str(config), "--yes", tmp_path=tmp_path)
        assert result.exit_code == 0, result.output
        assert step(document, "gpu-operator") == {"id": "gpu-operator", "status": "unchanged", "changes": 0,
                                                   "message": "nothing to undo"}
    assert releases(cluster) == ["gpu-operator"]
    assert cluster.emu.get("namespaces", "gpu-operator") is not None  # not ours either


def test_up_refuses_a_release_it_did_not_install_until_it_is_adopted(cluster, tmp_path):
    hand_install(cluster)
    revision = json.loads(cluster.helm("list", "-n", "gpu-operator", "-o", "json").stdout)[0]["revision"]
    result, document = cli("up", "-c", str(write_config(tmp_path, cluster)), tmp_path=tmp_path)
    # its namespace is not ours either: refused before anything (exit 2), naming the ways out
    assert result.exit_code == 2 and "gpu-operator (gpu-operator)" in document["error"] and \
        "cluster.adopt_namespaces" in document["error"], document["error"]
    adopted_namespace = write_config(tmp_path, cluster, adopt_namespaces=", adopt_namespaces: [gpu-operator]")
    result, document = cli("up", "-c", str(adopted_namespace), tmp_path=tmp_path)
    assert result.exit_code == 1 and "gpu_operator.adopt: true" in document["error"]
    assert json.loads(cluster.helm("list", "-n", "gpu-operator", "-o", "json").stdout)[0]["revision"] == revision
    adopted = write_config(tmp_path, cluster, "  adopt: true\n")
    result, document = cli("up", "-c", str(adopted), tmp_path=tmp_path)  # our values would restart its operands
    assert result.exit_code == 1 and "toolkit.enabled: null → false" in document["error"]
    result, document = cli("up", "-c", str(adopted), "--allow-operand-restart", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert releases(cluster, "app.kubernetes.io/managed-by=gpu-bootstrap") == ["gpu-operator"]
    result, document = cli("teardown", "-c", str(adopted), "--yes", tmp_path=tmp_path)
    assert result.exit_code == 0 and releases(cluster) == []


def test_teardown_removes_what_up_made_and_keeps_a_users_taint(cluster, tmp_path):
    node = cluster.emu.get("nodes", "node5")
    node["spec"]["taints"] = [USER_TAINT]
    node["metadata"]["labels"]["nvidia.com/team"] = "ml"  # a user's label under the operator's prefix
    cluster.emu.seed(node)
    config = write_config(tmp_path, cluster)
    result, _ = cli("up", "-c", str(config), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    added = {k for k in cluster.emu.get("nodes", "node5")["metadata"]["labels"]
             if k.startswith(("nvidia.com/gpu.deploy.", "feature.node.kubernetes.io/"))}
    assert added  # the (stand-in) operator and NFD labelled the node
    assert cluster.emu.get("namespaces", "gpu-operator")["metadata"]["labels"][
        "app.kubernetes.io/managed-by"] == "gpu-bootstrap"
    result, document = cli("teardown", "-c", str(config), "--yes", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert releases(cluster) == [] and cluster.emu.get("namespaces", "gpu-operator") is None
    assert cluster.emu.get("nodes", "node5")["spec"].get("taints") == [USER_TAINT]
    labels = cluster.emu.get("nodes", "node5")["metadata"]["labels"]
    assert not added & set(labels) and labels["nvidia.com/team"] == "ml"
    assert not [k for k in labels if k.startswith(("nvidia.com/", "feature.node.kubernetes.io/"))
                and k != "nvidia.com/team"]
    assert "gpu-bootstrap.io/labels-before-gpu-operator" not in (
        cluster.emu.get("nodes", "node5")["metadata"].get("annotations") or {})
    result, document = cli("teardown", "-c", str(config), "--yes", tmp_path=tmp_path)
    assert {s["message"] for s in document["steps"]} == {"nothing to undo"}
