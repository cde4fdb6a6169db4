"""Table tests of the DRA driver's values (gpu_operator.allocation: dra), derived from the gpu-operator's own values
plan, the config and the Kubernetes version; and of the operator's operand check in that mode."""
from __future__ import annotations

import dataclasses

import pytest

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.render import dra_driver
from gpu_bootstrap.render import gpu_operator_values as gov
from gpu_bootstrap.steps.gpu_operator import operand_problems
from tests.test_render_gpu_operator import FRESH, PLAYBOOK, node

pytestmark = pytest.mark.unit  # host-free: the fast loop (pytest -m unit)

NAMES = ("node5", "node6", "node7")


def config(**gpu_operator) -> cfg.Config:
    return cfg.validate({"nodes": [{"name": n} for n in NAMES], "gpu_operator": {"allocation": "dra", **gpu_operator}},
                        cfg.Source(None, {}))


def plans(facts, conf=None, kube="1.37.2", playbook=PLAYBOOK):
    conf = conf or config()
    operator = gov.derive(facts, conf, "v26.7.0", playbook)
    return operator, dra_driver.derive(operator, conf, kube, playbook)


def reasons(plan) -> dict:
    return {d.path: d.because for d in plan.derived}


@pytest.mark.parametrize("facts, mode, root, because", [
    ([node(n) for n in NAMES], "auto", "/", "the NVIDIA driver is the host's (node5, node6, node7: driver 550.54.15 "
                                            "pre-installed)"),
    ([node(n, **FRESH) for n in NAMES], "auto", "/run/nvidia/driver", "the operator installs the NVIDIA driver (no "
                                                                      "NVIDIA driver on node5, node6, node7)"),
    ([node(n) for n in NAMES], "operator", "/run/nvidia/driver", "the operator installs the NVIDIA driver "
                                                                 "(gpu_operator.driver_management: operator)"),
    ([], "auto", "/run/nvidia/driver", "no node facts: follows the operator's driver.enabled=true"),
    ([], "host", "/", "no node facts: follows the operator's driver.enabled=false"),
])
def test_the_driver_root_follows_who_owns_the_driver(facts, mode, root, because):
    _operator, plan = plans(facts, config(driver_management=mode))
    assert plan.merged["nvidiaDriverRoot"] == root
    assert reasons(plan)["nvidiaDriverRoot"].startswith(because)


def test_a_fleet_whose_driver_is_partly_the_hosts_is_refused_naming_the_nodes():
    facts = [node("node5"), node("node6", **FRESH), node("node7", **FRESH)]
    with pytest.raises(gov.Refusal) as refusal:
        plans(facts, config(driver_management="per-node"))
    assert "pre-installed on node5 and installed by the operator on the others" in refusal.value.message
    assert "driver_management: operator or host" in refusal.value.fix


def test_every_value_has_its_reason_and_the_device_plugin_is_off():
    operator, plan = plans([node(n) for n in NAMES])
    assert operator.merged["devicePlugin"]["enabled"] is False
    assert "a node must never serve nvidia.com/gpu from a device plugin as well" in reasons(operator)[
        "devicePlugin.enabled"]
    # the default taint (nvidia.com/gpu) is one the chart's kubelet plugin tolerates already: no toleration derived
    assert plan.merged == {"resources": {"gpus": {"enabled": True}, "computeDomains": {"enabled": False}},
                           "gpuResourcesEnabledOverride": True, "nvidiaDriverRoot": "/",
                           "kubeletPlugin": {"nodeSelector": {"nvidia.com/dra-kubelet-plugin": "true"}}}
    assert all(d.because for d in plan.derived)
    assert plan.node_labels == {n: {"nvidia.com/dra-kubelet-plugin": "true"} for n in NAMES}
    assert plan.warnings == []


def test_another_taint_is_tolerated_and_the_users_values_come_last():
    conf = cfg.validate({"nodes": [{"name": n} for n in NAMES],
                         "node_prep": {"taint": {"key": "gpu", "value": "yes", "effect": "NoExecute"}},
                         "gpu_operator": {"allocation": "dra", "dra_driver": {"values": {
                             "nvidiaDriverRoot": "/opt/nvidia", "logVerbosity": "6"}}}}, cfg.Source(None, {}))
    _operator, plan = plans([node(n) for n in NAMES], conf)
    assert plan.merged["kubeletPlugin"]["tolerations"] == [dra_driver.CHART_TOLERATION, {
        "key": "gpu", "operator": "Exists", "effect": "NoExecute"}]
    assert plan.merged["nvidiaDriverRoot"] == "/opt/nvidia" and plan.merged["logVerbosity"] == "6"
    assert "nvidiaDriverRoot  ← your gpu_operator.dra_driver.values (value not shown)" in plan.explain()


def test_a_mirror_moves_the_one_image():
    conf = cfg.validate({"nodes": [{"name": n} for n in NAMES], "gpu_operator": {"allocation": "dra"},
                         "registry": {"mirror": "mirror.example/k8s", "pull_secret": "pull"}}, cfg.Source(None, {}))
    _operator, plan = plans([node(n) for n in NAMES], conf)
    assert plan.merged["image"]["repository"] == "mirror.example/k8s/dra-driver-nvidia/dra-driver-nvidia-gpu"
    assert plan.merged["imagePullSecrets"] == [{"name": "pull"}]


@pytest.mark.parametrize("kube, warned", [("1.34.1", True), ("1.35.0", True), ("1.36.0", False), ("1.37.2", False)])
def test_before_1_36_the_plan_says_that_pods_must_ask_through_claims(kube, warned):
    _operator, plan = plans([node(n) for n in NAMES], kube=kube)
    assert any("DRAExtendedResource is alpha" in w for w in plan.warnings) is warned


@pytest.mark.parametrize("kube", ["1.33.7", "1.30.0"])
def test_dra_before_1_34_is_bad_input_naming_the_field(kube):
    with pytest.raises(ConfigError) as error:
        plans([node(n) for n in NAMES], kube=kube)
    assert error.value.exit_code == 2
    assert error.value.one_line().startswith("[gpu-operator] gpu_operator.allocation: dra needs Kubernetes 1.34")


def test_mig_partitions_are_said_to_need_claims():
    _operator, plan = plans([node(n) for n in NAMES], config(sharing={"mode": "mig"}))
    assert any("mig.nvidia.com" in w and "ResourceClaim" in w for w in plan.warnings)


@pytest.mark.parametrize("gpu_operator, field", [
    ({"allocation": "dra", "sharing": {"mode": "time-slicing"}}, "gpu_operator.sharing"),
    ({"allocation": "dra", "dra_driver": {"release": "gpu-operator", "namespace": "gpu-operator"}}, "dra_driver.release"),
    ({"allocation": "both"}, "gpu_operator.allocation"),
])
def test_configs_dra_cannot_serve_are_refused_naming_the_field(gpu_operator, field):
    with pytest.raises(ConfigError) as error:
        cfg.validate({"nodes": [{"name": "a"}], "gpu_operator": gpu_operator}, cfg.Source(None, {}))
    assert error.value.exit_code == 2 and field in error.value.one_line()


def daemonset(name: str, desired: int = 3, ready: int = 3) -> dict:
    return {"metadata": {"name": name}, "status": {"desiredNumberScheduled": desired, "numberReady": ready,
                                                   "currentNumberScheduled": desired}}


def test_in_dra_mode_the_operands_are_ready_without_a_device_plugin_or_gpu_capacity():
    nodes = {n: {"metadata": {"name": n}, "status": {"allocatable": {"cpu": "64"}}} for n in NAMES}
    operands = [daemonset("nvidia-operator-validator"), daemonset("nvidia-container-toolkit-daemonset")]
    assert operand_problems(operands, [], nodes, "gpu-operator", dra=True) == []
    device_plugin_mode = operand_problems(operands, [], nodes, "gpu-operator")
    assert any("no nvidia-device-plugin DaemonSet" in p for p in device_plugin_mode)
    assert any("node5 advertises no nvidia.com/gpu" in p for p in device_plugin_mode)
    assert any("no nvidia-operator-validator DaemonSet" in p
               for p in operand_problems([], [], nodes, "gpu-operator", dra=True))


def test_dra_mode_changes_the_operators_device_plugin_and_exporter_only():
    facts = [node(n) for n in NAMES]
    device_plugin = gov.derive(facts, cfg.validate({"nodes": [{"name": n} for n in NAMES]}, cfg.Source(None, {})),
                               "v26.7.0", PLAYBOOK)
    dra, _plan = plans(facts)
    assert {k: v for k, v in dra.merged.items() if k != "devicePlugin"} == \
        {**device_plugin.merged, "dcgmExporter": {**device_plugin.merged["dcgmExporter"], "env": [
            {"name": "KUBERNETES_ENABLE_DRA", "value": "true"}]}}
    assert [dataclasses.asdict(d)["path"] for d in dra.derived[-2:]] == ["devicePlugin.enabled", "dcgmExporter.env"]
    assert "gpu-bootstrap-dcgm-exporter-dra" in reasons(dra)["dcgmExporter.env"]
