"""gpu-operator values the scenario tables left open: NFD's nodeSelector, the DCGM ServiceMonitor, when tolerations are
added, nouveau in per-node mode, the docker path, and node facts read from preflight reports."""
from __future__ import annotations

import dataclasses

import pytest

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.probes.checks import NodeCheck, NodeReport
from gpu_bootstrap.render import gpu_operator_values as gov
from gpu_bootstrap.render.gpu_operator_values import NodeFacts, Refusal
from gpu_bootstrap.render.monitoring import dcgm_service_monitor

pytestmark = pytest.mark.unit

PLAYBOOK = ["preflight", "node-prep", "gpu-operator", "validate"]
WITH_MONITORING = PLAYBOOK[:-1] + ["monitoring", "validate"]
HEALTHY = NodeFacts("n1", "550.54.15", ("NVIDIA H100 80GB HBM3",), False, "containerd", "standard", "1.7.27",
                    "/etc/containerd/config.toml", "/run/containerd/containerd.sock", True, "1.17.4", True, True)
FRESH = dict(driver=None, gpus=(), toolkit_installed=False, toolkit_version=None, toolkit_configured=False,
             toolkit_default=False)


def node(name: str, **changes) -> NodeFacts:
    return dataclasses.replace(HEALTHY, name=name, **changes)


def config(**document) -> cfg.Config:
    return cfg.validate({"nodes": [{"name": "n1"}, {"name": "n2"}], **document}, cfg.Source(None, {}))


def derived(plan) -> dict:
    return {d.path: d.value for d in plan.derived}


@pytest.mark.parametrize("node_prep, playbook, selector", [
    ({}, PLAYBOOK, {"nvidia.com/gpu.present": "true"}),
    ({"gpu_present_label": False}, PLAYBOOK, None),
    ({"enabled": False}, PLAYBOOK, None),
    ({}, ["preflight", "gpu-operator"], None),
])
def test_nfd_runs_only_on_the_gpu_nodes_when_node_prep_labels_them(node_prep, playbook, selector):
    plan = gov.derive([node("n1")], config(node_prep=node_prep), "v26.7.0", playbook)
    assert derived(plan).get("node-feature-discovery.worker.nodeSelector") == selector
    assert plan.merged.get("node-feature-discovery", {}).get("worker", {}).get("nodeSelector") == selector


def test_the_default_taint_needs_no_extra_toleration_a_custom_one_does():
    default = gov.derive([node("n1")], config(), "v26.7.0", PLAYBOOK)
    assert "daemonsets.tolerations" not in derived(default)
    assert "node-feature-discovery.worker.tolerations" not in derived(default)
    custom = gov.derive([node("n1")], config(node_prep={"taint": {"key": "gpu", "effect": "NoExecute"}}), "v26.7.0",
                        PLAYBOOK)
    toleration = {"key": "gpu", "operator": "Exists", "effect": "NoExecute"}
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert derived(custom)["daemonsets.tolerations"] == [gpu, toleration]
    assert derived(custom)["node-feature-discovery.worker.tolerations"] == [gov.CONTROL_PLANE_TOLERATION, gpu,
                                                                          toleration]
    untainted = gov.derive([node("n1")], config(node_prep={"taint": None}), "v26.7.0", PLAYBOOK)
    assert not any("tolerations" in path for path in derived(untainted))


def test_with_no_room_the_operators_own_pods_tolerate_the_taint():
    plan = gov.derive([node("n1")], config(), "v26.7.0", PLAYBOOK, no_room=True)
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    values = derived(plan)
    assert values["operator.tolerations"] == [gov.CONTROL_PLANE_TOLERATION, toleration]
    assert values["node-feature-discovery.master.tolerations"] == [gov.CONTROL_PLANE_TOLERATION, toleration]
    assert values["node-feature-discovery.gc.tolerations"] == [toleration]
    assert "operator.tolerations" not in derived(gov.derive([node("n1")], config(), "v26.7.0", PLAYBOOK))
    assert "operator.tolerations" not in derived(gov.derive([node("n1")], config(node_prep={"enabled": False}),
                                                            "v26.7.0", PLAYBOOK, no_room=True))


def test_the_dcgm_service_monitor_follows_the_monitoring_step():
    plan = gov.derive([node("n1")], config(), "v26.7.0", WITH_MONITORING)
    expected = dcgm_service_monitor("15s", {"release": "kube-prometheus-stack"})
    assert derived(plan)["dcgmExporter.serviceMonitor"] == expected
    assert plan.merged["dcgmExporter"]["serviceMonitor"] == expected
    reason = next(d.because for d in plan.derived if d.path == "dcgmExporter.serviceMonitor")
    assert "scraped every 15s, labels release=kube-prometheus-stack" in reason


def test_the_scrape_values_the_monitoring_step_decided_win():
    scrape = dcgm_service_monitor("30s", {})
    plan = gov.derive([node("n1")], config(), "v26.7.0", WITH_MONITORING, scrape=scrape)
    assert derived(plan)["dcgmExporter.serviceMonitor"] == scrape
    assert "labels none" in next(d.because for d in plan.derived if d.path == "dcgmExporter.serviceMonitor")


@pytest.mark.parametrize("playbook, monitoring", [(PLAYBOOK, {}), (WITH_MONITORING, {"enabled": False})])
def test_without_a_monitoring_step_the_service_monitor_is_off(playbook, monitoring):
    plan = gov.derive([node("n1")], config(monitoring=monitoring), "v26.7.0", playbook)
    assert derived(plan)["dcgmExporter.serviceMonitor.enabled"] is False
    assert "dcgmExporter.serviceMonitor" not in derived(plan)


def test_per_node_mode_refuses_nouveau_only_where_the_operator_installs_the_driver():
    with_driver = node("n1", nouveau=True)  # keeps its own driver: nouveau there is not our problem
    plan = gov.derive([with_driver, node("n2", **FRESH)], config(gpu_operator={"driver_management": "per-node"}),
                      "v26.7.0", PLAYBOOK)
    assert plan.node_labels == {"n1": {"nvidia.com/gpu.deploy.driver": "false"}}
    assert derived(plan)["nodes:nvidia.com/gpu.deploy.driver"] == "false"
    with pytest.raises(Refusal) as refused:
        gov.derive([with_driver, node("n2", **FRESH, nouveau=True)],
                   config(gpu_operator={"driver_management": "per-node"}), "v26.7.0", PLAYBOOK)
    assert refused.value.message == ("nouveau is loaded on n2, where the operator would install the NVIDIA "
                                     "driver")


def test_operator_mode_refuses_nouveau_on_any_node_and_warns_about_preinstalled_drivers():
    with pytest.raises(Refusal) as refused:
        gov.derive([node("n1", nouveau=True), node("n2", **FRESH)],
                   config(gpu_operator={"driver_management": "operator"}), "v26.7.0", PLAYBOOK)
    assert "nouveau is loaded on n1," in refused.value.message
    plan = gov.derive([node("n1"), node("n2", **FRESH)], config(gpu_operator={"driver_management": "operator"}),
                      "v26.7.0", PLAYBOOK)
    assert plan.node_labels == {}
    assert plan.warnings == ["n1 already have driver 550.54.15: the operator's driver container will not start there "
                             "until it is removed"]


def test_host_mode_warns_about_nodes_without_a_driver():
    plan = gov.derive([node("n1"), node("n2", **FRESH)], config(gpu_operator={"driver_management": "host"}),
                      "v26.7.0", PLAYBOOK)
    assert derived(plan)["driver.enabled"] is False
    assert "no NVIDIA driver on n2: GPU pods cannot run there until you install one" in plan.warnings


def test_docker_without_nvidia_as_default_points_the_toolkit_at_daemon_json_and_warns():
    docker = dict(runtime="docker", config_path="/etc/docker/daemon.json", socket="/var/run/cri-dockerd.sock",
                  toolkit_default=False)
    plan = gov.derive([node("n1", **docker)], config(), "v26.7.0", PLAYBOOK)
    assert derived(plan)["toolkit.env"] == [{"name": "DOCKER_CONFIG", "value": "/etc/docker/daemon.json"}]
    assert plan.warnings == ["docker (cri-dockerd) nodes: current gpu-operator releases support containerd and CRI-O; "
                             "plan a move to containerd"]
    unknown_path = gov.derive([node("n1", **{**docker, "config_path": None})], config(), "v26.7.0", PLAYBOOK)
    assert derived(unknown_path)["toolkit.env"] == [{"name": "DOCKER_CONFIG", "value": "/etc/docker/daemon.json"}]


def test_a_distribution_gets_the_file_config_source():
    k3s = dict(distribution="k3s", config_path="/k3s/config.toml", socket="/k3s/containerd.sock",
               toolkit_default=False)
    plan = gov.derive([node("n1", **k3s)], config(), "v26.7.0", PLAYBOOK)
    assert derived(plan)["toolkit.env"] == [{"name": "CONTAINERD_CONFIG", "value": "/k3s/config.toml"},
                                            {"name": "CONTAINERD_SOCKET", "value": "/k3s/containerd.sock"},
                                            {"name": "RUNTIME_CONFIG_SOURCE", "value": "file"}]
    assert next(d.because for d in plan.derived if d.path == "toolkit.enabled") == "n1: no nvidia default runtime"


def report(name: str, *checks: NodeCheck) -> NodeReport:
    return NodeReport(name, list(checks))


def test_facts_are_read_from_preflight_reports():
    reports = {
        "b": report("b", NodeCheck("ssh", "pass", "ok"),
                    NodeCheck("nvidia-driver", "pass", "", {"driver_version": "550.54.15",
                                                            "gpus": [{"name": "H100"}, {"name": "H100"}]}),
                    NodeCheck("nouveau", "fail", "", {"loaded": True}),
                    NodeCheck("container-runtime", "pass", "", {"runtime": "containerd", "distribution": "k3s",
                                                                "version": "1.7.23", "config_path": "/c.toml",
                                                                "socket": "/c.sock"}),
                    NodeCheck("nvidia-container-toolkit", "pass", "", {"installed": True, "version": "1.17.4",
                                                                       "runtime_configured": True,
                                                                       "default_runtime": False})),
        "a": report("a", NodeCheck("ssh", "pass", "ok"), NodeCheck("container-runtime", "warn", "", {})),
        "c": report("c", NodeCheck("ssh", "fail", "connection refused")),
        "d": report("d", NodeCheck("nvidia-driver", "pass", "", {"driver_version": "1"})),
        "e": report("e", NodeCheck("ssh", "fail", "")),
    }
    assert gov.facts_from_reports(reports) == [
        NodeFacts("a", None, (), False, None, "standard", None, None, None, False, None, False, False),
        NodeFacts("b", "550.54.15", ("H100", "H100"), True, "containerd", "k3s", "1.7.23", "/c.toml", "/c.sock", True,
                  "1.17.4", True, False),
        NodeFacts("c", None, (), False, None, "standard", None, None, None, False, None, False, False,
                  unknown="connection refused"),
        NodeFacts("d", None, (), False, None, "standard", None, None, None, False, None, False, False,
                  unknown="no facts"),
        NodeFacts("e", None, (), False, None, "standard", None, None, None, False, None, False, False,
                  unknown="no facts"),
    ]


def test_unknown_facts_keep_the_running_releases_values_or_refuse():
    unknown = node("n2", unknown="timed out")
    deployed = {"driver": {"enabled": False}, "toolkit": {"enabled": True}}
    with pytest.raises(gov.Unknown):
        gov.derive([node("n1"), unknown], config(), "v26.7.0", PLAYBOOK)
    plan = gov.derive([node("n1"), unknown], config(), "v26.7.0", PLAYBOOK, deployed=deployed)
    assert {path: value for path, value in derived(plan).items() if path in gov.FACT_DEPENDENT} == deployed
    assert plan.merged["driver"]["enabled"] is False
    assert plan.warnings[0] == ("the facts of n2 are unknown (n2: timed out): the driver and toolkit values of the "
                                "running release are kept")


@pytest.mark.parametrize("names, text", [
    (["c", "a", "b", "d"], "a, b, c, d"), (["e", "a", "b", "c", "d"], "a, b, c and 2 more"), ([], ""),
])
def test_node_lists_are_sorted_and_cut_after_four(names, text):
    assert gov._nodes(names) == text


def test_restarts_name_each_changed_value():
    deployed = {"driver": {"enabled": False}, "toolkit": {"enabled": True}}
    merged = {"driver": {"enabled": True}, "toolkit": {"enabled": True}, "cdi": {"enabled": False}}
    assert gov.restarts(deployed, merged) == ["driver.enabled: false → true", "cdi.enabled: null → false"]


@pytest.mark.parametrize("version, accepted", [("v26.3.0", True), ("v26.2.9", False), ("v26.2.0", False),
                                               ("v25.10.1", False), ("v26.3.1", True)])
def test_nri_needs_gpu_operator_26_3_0_exactly(version, accepted):
    facts = [node("n1", toolkit_default=False, runtime_version="1.7.30")]
    conf = config(gpu_operator={"runtime_integration": "nri"})
    if accepted:
        assert derived(gov.derive(facts, conf, version, PLAYBOOK))["cdi.nriPluginEnabled"] is True
    else:
        with pytest.raises(Refusal) as refused:
            gov.derive(facts, conf, version, PLAYBOOK)
        assert str(refused.value) == refused.value.message == \
            f"runtime_integration: nri needs gpu-operator v26.3.0 or newer (this is {version})"


def test_node_facts_cannot_be_changed_in_place():
    with pytest.raises(dataclasses.FrozenInstanceError):
        HEALTHY.driver = None


@pytest.mark.parametrize("count, ending", [(4, "n4: lost"), (5, "n4: lost …")])
def test_unknown_nodes_are_named_up_to_four_then_elided(count, ending):
    facts = [node(f"n{i}", unknown="lost") for i in range(1, count + 1)]
    plan = gov.derive(facts, config(), "v26.7.0", PLAYBOOK, deployed={})
    named = "; ".join(f"n{i}: lost" for i in range(1, 4))
    assert plan.warnings[0].split(": the driver and toolkit")[0].endswith(f"({named}; {ending})")


def test_unknown_nodes_are_left_out_of_the_mig_checks():
    plan = gov.derive([node("n1", gpus=("Tesla T4",)), node("n2", gpus=("Tesla T4",), unknown="lost")],
                      config(gpu_operator={"sharing": {"mode": "mig"}}), "v26.7.0", PLAYBOOK, deployed={})
    assert [w for w in plan.warnings if "MIG" in w] == [
        "n1: Tesla T4 cannot be partitioned with MIG; the MIG manager will leave it whole"]
    assert derived(plan)["nodes:nvidia.com/mig.config"] == "all-1g.10gb"
    assert plan.node_labels == {"n1": {"nvidia.com/mig.config": "all-1g.10gb"},
                                "n2": {"nvidia.com/mig.config": "all-1g.10gb"}}


def test_a_ready_toolkit_without_a_version_reads_as_a_question_mark():
    plan = gov.derive([node("n1", toolkit_version=None), node("n2")], config(), "v26.7.0", PLAYBOOK)
    assert next(d.because for d in plan.derived if d.path == "toolkit.enabled") == \
        "n1, n2: toolkit 1.17.4, ? with nvidia as the default runtime"


def test_different_runtime_setups_are_named_by_group():
    k3s = dict(distribution="k3s", config_path="/k3s.toml", socket="/k3s.sock", toolkit_default=False)
    with pytest.raises(Refusal) as refused:
        gov.derive([node("n1", **k3s), node("n2", toolkit_default=False)], config(), "v26.7.0", PLAYBOOK)
    assert refused.value.message == (
        "the GPU nodes use different container runtime setups (containerd (k3s) /k3s.toml: n1; containerd (standard) "
        "/etc/containerd/config.toml: n2), but the toolkit's paths (toolkit.env) apply to every node")


def test_the_reason_names_the_runtime_and_its_distribution():
    k3s = dict(distribution="k3s", config_path="/k3s.toml", socket="/k3s.sock", toolkit_default=False)
    plan = gov.derive([node("n1", **k3s)], config(), "v26.7.0", PLAYBOOK)
    assert next(d.because for d in plan.derived if d.path == "toolkit.env") == \
        "n1: containerd (k3s), config /k3s.toml, socket /k3s.sock"
    plain = gov.derive([node("n1", toolkit_default=False)], config(), "v26.7.0", PLAYBOOK)
    assert next(d.because for d in plain.derived if d.path == "toolkit.env") == \
        "n1: containerd, config /etc/containerd/config.toml, socket /run/containerd/containerd.sock"


def test_cri_o_gets_an_empty_toolkit_env():
    crio = dict(runtime="cri-o", config_path="/etc/crio/crio.conf", socket="/var/run/crio/crio.sock",
                toolkit_configured=False, toolkit_default=False)
    plan = gov.derive([node("n1", **crio)], config(), "v26.7.0", PLAYBOOK)
    assert derived(plan)["toolkit.env"] == []
    assert next(d.because for d in plan.derived if d.path == "toolkit.env") == \
        "n1: cri-o: the toolkit configures CRI-O through drop-in files"


def test_time_slicing_config_text_and_name():
    plan = gov.derive([node("n1")], config(gpu_operator={"sharing": {"mode": "time-slicing", "replicas": 2}}),
                      "v26.7.0", PLAYBOOK)
    value = derived(plan)["devicePlugin.config"]
    assert value["data"]["default"] == (
        "version: v1\nflags:\n  migStrategy: none\nsharing:\n  timeSlicing:\n    renameByDefault: false\n"
        "    failRequestsGreaterThanOne: false\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n")
    import hashlib
    import json
    assert value["name"] == "time-slicing-" + hashlib.sha256(json.dumps(value["data"], sort_keys=True).encode()) \
        .hexdigest()[:8]


def test_a_node_profile_for_an_unknown_node_is_refused():
    sharing = {"mode": "time-slicing", "profiles": {"big": 8}, "node_profiles": {"zz": "big"}}
    with pytest.raises(Refusal) as refused:
        gov.derive([node("n1")], config(gpu_operator={"sharing": sharing}), "v26.7.0", PLAYBOOK)
    assert refused.value.message == "sharing.node_profiles names 'zz', which is not a configured GPU node"
    assert refused.value.fix == "use one of: n1, n2"


# --- driver upgrades: doctor's view of nvidia.com/gpu-driver-upgrade-state -------------------------------------------
def _upgrade_node(name: str, state: str | None, annotations: dict | None = None) -> dict:
    labels = {"nvidia.com/gpu-driver-upgrade-state": state} if state else {}
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations or {}}}


def _upgrade_event(node: str, state: str, stamp: str) -> dict:
    return {"involvedObject": {"kind": "Node", "name": node}, "reason": "GPUDriverUpgrade", "lastTimestamp": stamp,
            "message": f"Successfully updated node state label to [{state}]"}


NOW = 1767229200.0  # 2026-01-01T01:00:00Z


@pytest.mark.unit
def test_doctor_names_a_failed_driver_upgrade_with_what_to_look_at():
    from gpu_bootstrap.core.config import DriverUpgradeConfig
    from gpu_bootstrap.steps.gpu_operator import driver_upgrade_problems
    nodes = {"gpu-1": _upgrade_node("gpu-1", "upgrade-failed"), "gpu-2": _upgrade_node("gpu-2", "upgrade-done")}
    problems = driver_upgrade_problems(nodes, [], DriverUpgradeConfig(), "gpu-operator", NOW)
    assert len(problems) == 1 and problems[0].startswith("the driver upgrade failed on gpu-1")
    assert "nvidia-operator-validator" in problems[0] and "=upgrade-required to retry" in problems[0]


@pytest.mark.unit
def test_doctor_calls_a_state_stuck_only_past_its_timeout_and_never_when_its_start_is_unknown():
    from gpu_bootstrap.core.config import DriverUpgradeConfig
    from gpu_bootstrap.steps.gpu_operator import driver_upgrade_problems
    policy = DriverUpgradeConfig()  # pod deletion 300 s
    validating = str(int(NOW - 3600))  # an hour in validation-required (the controller gives it 600 s)
    nodes = {
        "gpu-1": _upgrade_node("gpu-1", "validation-required",
                               {"nvidia.com/gpu-driver-upgrade-validation-start-time": validating}),
        "gpu-2": _upgrade_node("gpu-2", "pod-deletion-required"),  # event: 50 minutes ago -> stuck
        "gpu-3": _upgrade_node("gpu-3", "pod-deletion-required"),  # event: 2 minutes ago -> fine
        "gpu-4": _upgrade_node("gpu-4", "pod-deletion-required"),  # no event left: unknown, not stuck
        "gpu-5": _upgrade_node("gpu-5", "drain-required"),  # drain off: no drain timeout to exceed
    }
    events = [_upgrade_event("gpu-2", "pod-deletion-required", "2026-01-01T00:10:00Z"),
              _upgrade_event("gpu-3", "pod-deletion-required", "2026-01-01T00:58:00Z"),
              _upgrade_event("gpu-5", "drain-required", "2026-01-01T00:00:00Z")]
    problems = driver_upgrade_problems(nodes, events, policy, "gpu-operator", NOW)
    assert [p.split(" has been")[0] for p in problems] == ["gpu-1", "gpu-2"]
    assert "validation-required for 60 min, longer than its 600s timeout" in problems[0]
    assert "pod-deletion-required for 50 min, longer than its 300s timeout" in problems[1]


@pytest.mark.unit
def test_a_downgrade_is_refused_naming_both_versions_unless_allowed():
    from gpu_bootstrap.steps.gpu_operator import downgrade_refusal
    release = {"up_to_date": False, "reason": "downgrade 88.5.3 → 72.9.1", "installed": "88.5.3", "downgrade": True}
    section = cfg.MonitoringConfig()
    refused = downgrade_refusal(section, "monitoring", release, "72.9.1")
    assert "kube-prometheus-stack 88.5.3 is installed, newer than the 72.9.1 the config asks for" in refused
    assert "pin monitoring.version to 88.5.3, or set monitoring.allow_downgrade: true" in refused
    assert downgrade_refusal(cfg.MonitoringConfig(allow_downgrade=True), "monitoring", release, "72.9.1") == ""
    upgrade = {**release, "reason": "upgrade 72.9.1 → 88.5.3", "downgrade": False}
    assert downgrade_refusal(section, "monitoring", upgrade, "88.5.3") == ""
