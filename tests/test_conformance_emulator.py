"""`gpu-bootstrap doctor --conformance DIR` through the CLI against the API emulator, with only the engine's first
steps (no monitoring, queues, admission or pools): what the command writes, what it refuses, and that a platform
without those steps is never reported as conforming. The items proved live are tests/test_conformance_real.py's."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.app.conformance import CHECKLIST_FILE, NAMESPACE_PREFIX, OUT_OF_SCOPE
from gpu_bootstrap.cli.commands import app
from tests.test_up_emulator import SPINE, report, write_config

runner = CliRunner()


@pytest.fixture
def config(tmp_path, cluster):
    return write_config(tmp_path / "gpu-bootstrap.yaml", cluster.kubeconfig)


def conformance(config: Path, tmp_path: Path, *extra: str):
    return runner.invoke(app, ["doctor", "-c", str(config), *SPINE, "--preflight-report", str(report(tmp_path)),
                               "--conformance", str(tmp_path / "out"), "--log-file", str(tmp_path / "run.log"),
                               *extra])


def test_a_platform_without_the_steps_is_not_conforming_and_says_why(emu, config, tmp_path):
    result = conformance(config, tmp_path, "-o", "json")
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    items = {i["id"]: i for i in document["items"]}
    assert {i for i, v in items.items() if v["fails_the_run"]} == {
        "gang_scheduling", "pod_autoscaling", "accelerator_metrics", "ai_service_metrics",
        "secure_accelerator_access", "robust_controller"}
    assert items["gang_scheduling"]["notes"].startswith("the queues step is off")
    assert items["cluster_autoscaling"]["status"] == "N/A" and not items["cluster_autoscaling"]["in_scope"]
    for item in OUT_OF_SCOPE:  # never Implemented, never failing the run
        assert items[item]["status"] == "Not Implemented" and not items[item]["in_scope"], item
    assert not [i for i in items.values() if i["status"] == "Implemented" and i["id"] != "driver_runtime_management"]
    folder = tmp_path / "out"
    checklist = yaml.safe_load((folder / CHECKLIST_FILE).read_text())
    assert [e["id"] for s in checklist["spec"].values() for e in s] == list(items)
    assert checklist["metadata"]["platformName"] == "gpu-bootstrap"
    assert checklist["metadata"]["kubernetesVersion"] == "v1.31"
    for entry in (e for s in checklist["spec"].values() for e in s):
        assert entry["evidence"] == [f"{entry['id']}.log", "junit.xml"]
        assert (folder / f"{entry['id']}.log").read_text().startswith(f"{entry['id']} (")
    suite = ElementTree.parse(folder / "junit.xml").getroot()
    assert suite.get("failures") == "6" and suite.get("tests") == "14"
    assert "Requirement 'ai_inference' is MUST level but status is 'Not Implemented'. It must be 'Implemented'." in \
        document["validator_problems"]
    # its own namespace came and went
    assert [n for n in emu.list("namespaces") if n["metadata"]["name"].startswith(NAMESPACE_PREFIX)] == []
    assert emu.requests.matching("POST", "/api/v1/namespaces") != []


def test_read_only_creates_nothing_and_names_what_it_could_not_check(emu, config, tmp_path):
    emu.requests.clear()
    result = conformance(config, tmp_path, "--read-only", "-o", "json")
    assert result.exit_code == 1, result.output
    assert emu.requests.writes() == []
    items = {i["id"]: i for i in json.loads(result.stdout)["items"]}
    assert items["ai_service_metrics"]["notes"].startswith("the monitoring step is off")


def test_the_text_report_names_the_failures_and_the_validator_s_reasons(emu, config, tmp_path):
    result = conformance(config, tmp_path)
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "failed: gang_scheduling" in text and "scripts/validate.go" in text
    assert "Metadata field vendorName is empty" in text


def test_metadata_from_a_file_fills_the_checklist(emu, config, tmp_path):
    given = {"platformName": "Acme GPU", "vendorName": "Acme", "websiteUrl": "https://acme.example",
             "k8sConformanceUrl": "https://github.com/cncf/k8s-conformance/tree/master/v1.31/acme"}
    path = tmp_path / "platform.yaml"
    path.write_text(yaml.safe_dump(given))
    result = conformance(config, tmp_path, "--conformance-metadata", str(path), "-o", "json")
    assert result.exit_code == 1, result.output
    metadata = yaml.safe_load((tmp_path / "out" / CHECKLIST_FILE).read_text())["metadata"]
    assert {k: metadata[k] for k in given} == given
    problems = json.loads(result.stdout)["validator_problems"]
    assert not [p for p in problems if "vendorName" in p or "platformName" in p or "k8sConformanceUrl" in p]


@pytest.mark.parametrize("extra, said", [
    (["--conformance-metadata", "{path}"], "unknown field 'vendor'"),
    (["--read-only"], None),
])
def test_bad_conformance_input_is_exit_2_and_writes_nothing(emu, config, tmp_path, extra, said):
    path = tmp_path / "platform.yaml"
    path.write_text("vendor: Acme\n")
    args = [a.replace("{path}", str(path)) for a in extra]
    if said is None:  # --read-only alone: it goes with --conformance
        result = runner.invoke(app, ["doctor", "-c", str(config), *SPINE, "--read-only",
                                     "--log-file", str(tmp_path / "run.log")])
        assert result.exit_code == 2 and "--conformance" in result.output, result.output
        return
    result = conformance(config, tmp_path, *args)
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("replicas, status", [(None, "Partially Implemented"), ("4", "Implemented")])
def test_gpu_sharing_is_implemented_only_once_a_node_advertises_shared_gpus(emu, cluster, tmp_path, replicas, status):
    """gpu_operator.sharing configured is not enough: a node must advertise it (GPU feature discovery's
    nvidia.com/gpu.replicas label, as the device plugin's time-slicing sets it)."""
    config = write_config(tmp_path / "gpu-bootstrap.yaml", cluster.kubeconfig)
    config.write_text(config.read_text() + "gpu_operator:\n  sharing: {mode: time-slicing, replicas: 4}\n")
    node = next(n for n in emu.list("nodes") if "nvidia.com/gpu" in (n.get("status") or {}).get("capacity", {}))
    if replicas:
        node["metadata"].setdefault("labels", {})["nvidia.com/gpu.replicas"] = replicas
        emu.seed(node)
    result = conformance(config, tmp_path, "--read-only", "-o", "json")
    items = {i["id"]: i for i in json.loads(result.stdout)["items"]}
    assert items["gpu_sharing"]["status"] == status, items["gpu_sharing"]
    if replicas:
        assert node["metadata"]["name"] in items["gpu_sharing"]["notes"]
