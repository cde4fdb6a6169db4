"""Table tests of the gpu-operator values derivation over the preflight scenarios, and of the version table."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.render import gpu_operator_values as gov
from gpu_bootstrap.core import versions
from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.render.gpu_operator_values import NodeFacts, Refusal

pytestmark = pytest.mark.unit  # host-free: the fast loop (pytest -m unit)

PLAYBOOK = ["preflight", "node-prep", "gpu-operator", "validate"]
H100 = ("NVIDIA H100 80GB HBM3",) * 8


def node(name: str, **changes) -> NodeFacts:
    """A healthy node: driver 550, containerd with nvidia as default runtime (the healthy-h100 scenario)."""
    base = NodeFacts(name, "550.54.15", H100, False, "containerd", "standard", "1.7.27", "/etc/containerd/config.toml",
                     "/run/containerd/containerd.sock", True, "1.17.4", True, True)
    return dataclasses.replace(base, **changes)


FRESH = dict(driver=None, gpus=(), toolkit_installed=False, toolkit_version=None, toolkit_configured=False,
             toolkit_default=False)
K3S = dict(distribution="k3s", runtime_version="1.7.23-k3s2",
           config_path="/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
           socket="/run/k3s/containerd/containerd.sock", toolkit_default=False)
RKE2 = dict(distribution="rke2", config_path="/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
            socket="/run/k3s/containerd/containerd.sock", toolkit_installed=False, toolkit_configured=False,
            toolkit_default=False)
MICROK8S = dict(distribution="microk8s", config_path="/var/snap/microk8s/current/args/containerd-template.toml",
                socket="/var/snap/microk8s/common/run/containerd.sock", toolkit_configured=False,
                toolkit_default=False)
CRIO = dict(runtime="cri-o", config_path="/etc/crio/crio.conf", socket="/var/run/crio/crio.sock",
            toolkit_configured=False, toolkit_default=False)
DOCKER = dict(runtime="docker", config_path="/etc/docker/daemon.json", socket="/var/run/cri-dockerd.sock")


def config(**gpu_operator) -> cfg.Config:
    return cfg.validate({"nodes": [{"name": "node5"}, {"name": "node6"}, {"name": "node7"}],
                         "gpu_operator": gpu_operator}, cfg.Source(None, {}))


def derive(facts, conf=None, version="v26.7.0", playbook=PLAYBOOK) -> gov.ValuesPlan:
    return gov.derive(facts, conf or config(), version, playbook)


def env(plan) -> dict:
    return {e["name"]: e["value"] for e in plan.merged["toolkit"].get("env") or []}


OURS = {"ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED": "false"}  # device access, where the toolkit is ours


SCENARIOS = [
    # (scenario, facts, driver.enabled, toolkit.enabled, toolkit env)
    ("healthy containerd, everything on the host", [node("node5"), node("node6"), node("node7")], False, False, {}),
    ("driver missing everywhere", [node(n, **FRESH) for n in ("node5", "node6", "node7")], True, True,
     {"CONTAINERD_CONFIG": "/etc/containerd/config.toml", "CONTAINERD_SOCKET": "/run/containerd/containerd.sock", **OURS}),
    ("k3s containerd", [node(n, **K3S) for n in ("node5", "node6")], False, True,
     {"CONTAINERD_CONFIG": "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
      "CONTAINERD_SOCKET": "/run/k3s/containerd/containerd.sock", "RUNTIME_CONFIG_SOURCE": "file", **OURS}),
    ("rke2 containerd", [node(n, **RKE2) for n in ("node5", "node6")], False, True,
     {"CONTAINERD_CONFIG": "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
      "CONTAINERD_SOCKET": "/run/k3s/containerd/containerd.sock", "RUNTIME_CONFIG_SOURCE": "file", **OURS}),
    ("microk8s containerd", [node("node5", **MICROK8S)], False, True,
     {"CONTAINERD_CONFIG": "/var/snap/microk8s/current/args/containerd-template.toml",
      "CONTAINERD_SOCKET": "/var/snap/microk8s/common/run/containerd.sock", "RUNTIME_CONFIG_SOURCE": "file", **OURS}),
    ("CRI-O", [node("node5", **CRIO)], False, True, OURS),
    ("docker with nvidia as default runtime", [node(n, **DOCKER) for n in ("node5", "node6")], False, False, {}),
]


@pytest.mark.parametrize("name, facts, driver, toolkit, toolkit_env", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_values_derived_from_each_scenario(name, facts, driver, toolkit, toolkit_env):
    plan = derive(facts)
    assert plan.merged["driver"]["enabled"] is driver
    assert plan.merged["toolkit"]["enabled"] is toolkit
    assert env(plan) == toolkit_env
    reasons = {d.path: d.because for d in plan.derived}
    assert "driver.enabled" in reasons and "toolkit.enabled" in reasons
    if not driver:
        assert "driver 550.54.15 pre-installed" in reasons["driver.enabled"]


def test_every_derived_value_names_its_fact():
    plan = derive([node("node5"), node("node6"), node("node7")])
    lines = plan.explain()
    assert "driver.enabled=false  ← node5, node6, node7: driver 550.54.15 pre-installed" in lines
    assert all("  ← " in line for line in lines)


def test_a_mixed_fleet_is_refused_with_the_nodes_and_the_choices():
    with pytest.raises(Refusal) as refused:
        derive([node("node5"), node("node6", **FRESH), node("node7", **FRESH)])
    assert "pre-installed on node5 but missing on node6, node7" in refused.value.message
    assert "driver_management: per-node" in refused.value.fix


def test_per_node_driver_management_labels_the_nodes_with_a_driver():
    plan = derive([node("node5"), node("node6", **FRESH)], config(driver_management="per-node"))
    assert plan.merged["driver"]["enabled"] is True
    assert plan.node_labels == {"node5": {"nvidia.com/gpu.deploy.driver": "false"}}


def test_nouveau_where_the_operator_installs_the_driver_is_refused():
    with pytest.raises(Refusal) as refused:
        derive([node("node5", **FRESH), node("node6", **FRESH, nouveau=True)])
    assert "nouveau is loaded on node6" in refused.value.message and "blacklist nouveau" in refused.value.fix


def test_different_runtime_setups_are_refused_unless_the_user_sets_the_paths():
    facts = [node("node5", **K3S), node("node6", toolkit_default=False)]
    with pytest.raises(Refusal) as refused:
        derive(facts)
    assert "different container runtime setups" in refused.value.message
    plan = derive(facts, config(values={"toolkit": {"env": [{"name": "CONTAINERD_CONFIG", "value": "/x"}]}}))
    assert env(plan) == {"CONTAINERD_CONFIG": "/x"}


def test_nri_needs_new_enough_operator_and_containerd():
    new = [node("node5", toolkit_default=False, runtime_version="1.7.30")]
    plan = derive(new, config(runtime_integration="nri"))
    assert plan.merged["cdi"] == {"enabled": True, "nriPluginEnabled": True} and env(plan) == OURS  # no runtime paths
    with pytest.raises(Refusal):
        derive([node("node5", toolkit_default=False, runtime_version="1.7.27")], config(runtime_integration="nri"))
    with pytest.raises(Refusal):
        derive(new, config(runtime_integration="nri"), version="v24.6.2")


def test_no_facts_offline_keeps_the_chart_defaults_and_says_so():
    plan = derive([])
    assert plan.merged["driver"]["enabled"] is True and plan.merged["toolkit"]["enabled"] is True
    assert all("offline" in d.because for d in plan.derived if d.path in ("driver.enabled", "toolkit.enabled"))


def test_user_overrides_come_last_and_are_listed():
    plan = derive([node("node5")], config(values={"driver": {"enabled": True}, "dcgmExporter": {"enabled": False}}))
    assert plan.merged["driver"]["enabled"] is True and plan.merged["dcgmExporter"]["enabled"] is False
    assert "driver.enabled=true  ← your gpu_operator.values" in plan.explain()
    assert plan.merged["dcgmExporter"]["serviceMonitor"]["enabled"] is False  # deep merge kept the sibling


def test_a_custom_taint_is_tolerated_by_the_operands_and_nfd():
    conf = cfg.validate({"nodes": [{"name": "node5"}], "node_prep": {"taint": {"key": "dedicated", "value": "gpu",
                                                                               "effect": "NoExecute"}}},
                        cfg.Source(None, {}))
    plan = gov.derive([node("node5")], conf, "v26.7.0", PLAYBOOK)
    toleration = {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}
    assert toleration in plan.merged["daemonsets"]["tolerations"]
    assert toleration in plan.merged["node-feature-discovery"]["worker"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        plan.merged["daemonsets"]["tolerations"]


def test_without_node_prep_nfd_runs_everywhere():
    plan = derive([node("node5")], playbook=["preflight", "gpu-operator"])
    assert "nodeSelector" not in plan.merged.get("node-feature-discovery", {}).get("worker", {})


def test_time_slicing_config_is_named_by_content_and_labels_profiles():
    conf = config(sharing={"mode": "time-slicing", "replicas": 4, "profiles": {"heavy": 2},
                           "node_profiles": {"node6": "heavy"}})
    plan = derive([node("node5"), node("node6")], conf)
    device = plan.merged["devicePlugin"]["config"]
    assert device["create"] is True and device["default"] == "default" and device["name"].startswith("time-slicing-")
    assert yaml.safe_load(device["data"]["default"])["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 4}]
    assert plan.node_labels == {"node6": {"nvidia.com/device-plugin.config": "heavy"}}
    other = derive([node("node5"), node("node6")], config(sharing={"mode": "time-slicing", "replicas": 8}))
    assert other.merged["devicePlugin"]["config"]["name"] != device["name"]
    with pytest.raises(Refusal):
        derive([node("node5")], config(sharing={"mode": "time-slicing", "node_profiles": {"node5": "nope"}}))


def test_mig_labels_every_node_and_warns_about_gpus_that_cannot():
    conf = config(sharing={"mode": "mig", "mig_strategy": "mixed", "mig_node_configs": {"node6": "all-3g.40gb"}})
    plan = derive([node("node5"), node("node6", gpus=("Tesla T4",))], conf)
    assert plan.merged["mig"]["strategy"] == "mixed"
    assert plan.node_labels["node5"] == {"nvidia.com/mig.config": "all-1g.10gb"}
    assert plan.node_labels["node6"] == {"nvidia.com/mig.config": "all-3g.40gb"}
    assert plan.warnings == ["node6: Tesla T4 cannot be partitioned with MIG; the MIG manager will leave it whole"]


# --- versions ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kube, expected", [
    ("1.22.9", []), ("1.23.0", ["v24.6.2"]), ("1.24.17", ["v24.9.2", "v24.6.2"]),
    ("1.29.3", ["v25.3.4", "v24.9.2", "v24.6.2"]), ("1.31.4", ["v25.10.1", "v25.3.4", "v24.9.2"]),
    ("1.32.2", ["v26.3.3", "v25.10.1", "v25.3.4"]), ("1.33.2", ["v26.7.0", "v26.3.3", "v25.10.1"]),
    ("1.36.0", ["v26.7.0"]), ("1.37.0", ["v26.7.0"]), ("1.38.1", []),
])
def test_fitting_releases(kube, expected):
    assert [release.version for release in versions.catalogue("gpu-operator").fitting(kube)] == expected


@pytest.mark.parametrize("constraint, kube, allowed", [
    (">= 1.16.0-0", "1.33.0", True), (">=1.25.0-0", "1.24.4", False), (">=1.25.0-0 <1.32.0", "1.31.9", True),
    (">=1.25.0-0 <1.32.0", "1.32.0", False), ("", "1.20.0", True),
])
def test_chart_kube_version_constraints(constraint, kube, allowed):
    assert versions.constraint_allows(constraint, kube) is allowed


def test_every_table_row_has_a_source():
    assert all(release.source for release in versions.catalogue("gpu-operator").releases)


def upgrade_policy(plan) -> dict:
    return plan.merged["driver"].get("upgradePolicy", {})


def test_driver_upgrades_default_to_one_node_at_a_time_evicting_gpu_pods_without_a_drain_and_say_why():
    plan = derive([node("node5", **FRESH), node("node6", **FRESH)])
    policy = upgrade_policy(plan)
    assert policy["autoUpgrade"] is True and policy["maxParallelUpgrades"] == 1 and policy["maxUnavailable"] == "25%"
    assert policy["gpuPodDeletion"] == {"force": False, "timeoutSeconds": 300, "deleteEmptyDir": False}
    assert policy["drain"]["enable"] is False and policy["drain"]["timeoutSeconds"] == 300
    lines = "\n".join(plan.explain())
    assert "driver.upgradePolicy.maxParallelUpgrades=1  ← gpu_operator.driver_upgrade.max_parallel: one node at a " \
           "time" in lines
    assert "GPU pods are evicted and get 300s to exit" in lines and "the node is not drained" in lines


def test_driver_upgrade_settings_map_to_the_chart_policy():
    conf = config(driver_upgrade={"max_parallel": 0, "max_unavailable": "2", "drain": True, "drain_timeout": 600,
                                  "force_gpu_pod_deletion": True, "wait_for_jobs_selector": "app=train",
                                  "wait_for_jobs_timeout": 3600})
    policy = upgrade_policy(derive([node("node5", **FRESH)], conf))
    assert policy["maxParallelUpgrades"] == 0 and policy["maxUnavailable"] == 2  # a bare number is an int
    assert policy["drain"]["enable"] is True and policy["drain"]["timeoutSeconds"] == 600
    assert policy["gpuPodDeletion"]["force"] is True
    assert policy["waitForCompletion"] == {"timeoutSeconds": 3600, "podSelector": "app=train"}
    manual = upgrade_policy(derive([node("node5", **FRESH)], config(driver_upgrade={"auto": False})))
    assert manual == {"autoUpgrade": False}


def test_a_pre_installed_driver_gets_no_upgrade_policy():
    """The host's driver is the host's to upgrade: the operator's policy is left at the chart's default."""
    plan = derive([node("node5"), node("node6")])
    assert not [d for d in plan.derived if d.path.startswith("driver.upgradePolicy")]


@pytest.mark.parametrize("value", ["25", "10%", "100%"])
def test_max_unavailable_is_a_number_or_a_percentage(value):
    config(driver_upgrade={"max_unavailable": value})


@pytest.mark.parametrize("value", ["a quarter", "101%", "-1"])
def test_a_max_unavailable_that_is_neither_is_refused_naming_the_field(value):
    with pytest.raises(ConfigError, match="max_unavailable"):
        config(driver_upgrade={"max_unavailable": value})


# --- device access: the runtime ignores NVIDIA_VISIBLE_DEVICES in unprivileged containers ------------------------------
@pytest.mark.parametrize("allocation", ["device-plugin", "dra"])
@pytest.mark.parametrize("version", [r.version for r in versions.catalogue("gpu-operator").releases])
def test_every_catalogued_line_gets_the_device_access_settings_with_their_reasons(version, allocation):
    """Every gpu-operator line the catalogue installs, in both allocation modes, where the operator installs the
    toolkit: the toolkit ignores the variable for unprivileged containers, and GPUs go by CDI (25.10+, the operator's
    default) or volume mounts (before), each value with the source behind it. A dropped setting fails here."""
    plan = derive([node(n, **FRESH) for n in ("node5", "node6", "node7")], config(allocation=allocation),
                  version=version)
    wanted = gov.device_access_paths(version)
    for path, value in wanted.items():
        assert gov.get_path(plan.merged, path) == value, (version, path)
        because = next(d.because for d in plan.derived if d.path == path)
        assert f"gpu-operator {'.'.join(version.lstrip('v').split('.')[:2])}" in because, because
    assert ("cdi.enabled" in wanted) and (gov.version_tuple(version) >= (25, 10, 0)) == wanted["cdi.enabled"]
    assert ("devicePlugin.env[DEVICE_LIST_STRATEGY]" in wanted) == (gov.version_tuple(version) < (25, 10, 0))
    assert env(plan)["CONTAINERD_CONFIG"] == "/etc/containerd/config.toml"  # the runtime paths stay beside them


def test_a_pre_installed_toolkit_is_the_hosts_and_a_user_env_list_is_warned_about():
    host = derive([node("node5"), node("node6"), node("node7")])
    assert "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED" not in env(host)  # not ours: doctor reads it
    mine = derive([node("node5", **FRESH)], config(values={"toolkit": {"env": [{"name": "X", "value": "1"}]}}),
                  version="v25.3.4")
    assert env(mine) == {"X": "1"}
    assert any("gpu_operator.values sets toolkit.env" in w and "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED"
               in w and "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS" in w for w in mine.warnings), mine.warnings


@pytest.mark.parametrize("playbook, served, enabled", [
    (["preflight", "node-prep", "monitoring", "gpu-operator"], True, True),
    (["preflight", "node-prep", "monitoring", "gpu-operator"], False, False),
    (["preflight", "node-prep", "gpu-operator"], True, False),
])
def test_the_dcgm_service_monitor_is_on_only_where_something_serves_service_monitors(playbook, served, enabled):
    """Off without a CRD to serve it: NVIDIA's controller keeps the ClusterPolicy notReady when it is wanted and the
    CRD is missing (seen on the real controller, tests/test_gpu_operator_real.py)."""
    conf = cfg.validate({"nodes": [{"name": "node5"}], "monitoring": {"enabled": True}}, cfg.Source(None, {}))
    plan = gov.derive([node("node5")], conf, "v25.3.4", playbook, service_monitors=served)
    assert bool(plan.merged["dcgmExporter"]["serviceMonitor"].get("enabled")) is enabled
    reasons = " ".join(plan.explain())
    assert ("serves no ServiceMonitor CRD" in reasons) is (not served and "monitoring" in playbook)
