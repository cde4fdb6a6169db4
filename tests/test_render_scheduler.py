"""Table tests for the bin-packing scheduler's renderer: config version, plugin args, image tag, and every object
valid for the target Kubernetes version (official schemas through kubernetes-validate)."""
from __future__ import annotations

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpu_bootstrap.core.config import SchedulerConfig
from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.render import scheduler as render

pytestmark = pytest.mark.unit  # host-free: the fast loop (pytest -m unit)

# kubernetes-validate ships schemas from 1.25 on; 1.24's apps/v1, rbac/v1, policy/v1 and core/v1 objects used here
# are unchanged in 1.25, so 1.24 renders are checked against the nearest (1.25) schemas.
SCHEMA_VERSION = {"1.24.17": "1.25.0"}

# The KubeSchedulerConfiguration fields we set, from k8s.io/kube-scheduler/config/v1/types.go (and v1beta3, which
# has the same shape for these fields), with the ranges ValidateKubeSchedulerConfiguration enforces. Unknown keys
# fail, so a typo in the renderer cannot pass.
PLUGIN = {"type": "object", "additionalProperties": False, "required": ["name"],
          "properties": {"name": {"type": "string", "minLength": 1}, "weight": {"type": "integer", "minimum": 1}}}
PLUGIN_SET = {"type": "object", "additionalProperties": False,
              "properties": {"enabled": {"type": "array", "items": PLUGIN},
                             "disabled": {"type": "array", "items": PLUGIN}}}
FIT_ARGS = {"type": "object", "additionalProperties": False, "properties": {
    "ignoredResources": {"type": "array"}, "ignoredResourceGroups": {"type": "array"},
    "scoringStrategy": {"type": "object", "additionalProperties": False, "required": ["type"], "properties": {
        "type": {"enum": ["LeastAllocated", "MostAllocated", "RequestedToCapacityRatio"]},
        "resources": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False, "required": ["name", "weight"],
            "properties": {"name": {"type": "string"}, "weight": {"type": "integer", "minimum": 1, "maximum": 100}}}},
        "requestedToCapacityRatio": {"type": "object", "additionalProperties": False, "properties": {
            "shape": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False, "required": ["utilization", "score"],
                "properties": {"utilization": {"type": "integer", "minimum": 0, "maximum": 100},
                               "score": {"type": "integer", "minimum": 0, "maximum": 10}}}}}}}}}}
BALANCED_ARGS = {"type": "object", "additionalProperties": False, "required": ["resources"], "properties": {
    "resources": {"type": "array", "minItems": 1, "items": {
        "type": "object", "additionalProperties": False, "required": ["name", "weight"],
        "properties": {"name": {"type": "string"}, "weight": {"type": "integer", "minimum": 1, "maximum": 100}}}}}}
SCHEDULER_CONFIG = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "profiles"],
    "properties": {
        "apiVersion": {"enum": ["kubescheduler.config.k8s.io/v1", "kubescheduler.config.k8s.io/v1beta3"]},
        "kind": {"const": "KubeSchedulerConfiguration"},
        "percentageOfNodesToScore": {"type": "integer", "minimum": 0, "maximum": 100},
        "leaderElection": {"type": "object", "additionalProperties": False, "properties": {
            "leaderElect": {"type": "boolean"}, "resourceLock": {"enum": ["leases"]},
            "resourceName": {"type": "string", "minLength": 1}, "resourceNamespace": {"type": "string", "minLength": 1},
            "leaseDuration": {"type": "string"}, "renewDeadline": {"type": "string"},
            "retryPeriod": {"type": "string"}}},
        "profiles": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False, "required": ["schedulerName"],
            "properties": {
                "schedulerName": {"type": "string", "minLength": 1},
                "plugins": {"type": "object", "additionalProperties": False,
                            "properties": {k: PLUGIN_SET for k in ("score", "filter", "preScore", "multiPoint")}},
                "pluginConfig": {"type": "array", "items": {"oneOf": [
                    {"type": "object", "additionalProperties": False, "required": ["name", "args"],
                     "properties": {"name": {"const": "NodeResourcesFit"}, "args": FIT_ARGS}},
                    {"type": "object", "additionalProperties": False, "required": ["name", "args"],
                     "properties": {"name": {"const": "NodeResourcesBalancedAllocation"},
                                    "args": BALANCED_ARGS}}]}}}}}}}

CASES = [
    # kube version, config apiVersion, image
    ("1.24.17", "kubescheduler.config.k8s.io/v1beta3", "registry.k8s.io/kube-scheduler:v1.24.17"),
    ("1.25.0", "kubescheduler.config.k8s.io/v1", "registry.k8s.io/kube-scheduler:v1.25.0"),
    ("1.29.4", "kubescheduler.config.k8s.io/v1", "registry.k8s.io/kube-scheduler:v1.29.4"),
    ("1.31.2", "kubescheduler.config.k8s.io/v1", "registry.k8s.io/kube-scheduler:v1.31.2"),
    ("1.35.0", "kubescheduler.config.k8s.io/v1", "registry.k8s.io/kube-scheduler:v1.35.0"),
]
SETTINGS = {
    "default": SchedulerConfig(),
    "ratio": SchedulerConfig(strategy="RequestedToCapacityRatio", balanced_allocation_weight=1, fit_weight=1,
                             balanced_allocation_resources=["cpu", "memory"], resource_weights={"nvidia.com/gpu": 10},
                             shape=[{"utilization": 0, "score": 0}, {"utilization": 50, "score": 3},
                                    {"utilization": 100, "score": 10}]),
}


def config_of(objects: list[dict]) -> dict:
    cm = next(o for o in objects if o["kind"] == "ConfigMap")
    return yaml.safe_load(cm["data"][render.CONFIG_FILE])


@pytest.mark.parametrize("kube, api_version, image", CASES)
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_object_is_valid_for_the_version(kube, api_version, image, name):
    objects = render.manifests(SETTINGS[name], kube)
    for obj in objects:
        kubernetes_validate.validate(obj, SCHEMA_VERSION.get(kube, kube), strict=True)
    assert [o["kind"] for o in objects] == ["ServiceAccount", "ClusterRoleBinding", "ClusterRoleBinding",
                                            "RoleBinding", "Role", "RoleBinding", "ConfigMap", "Deployment",
                                            "PodDisruptionBudget"]
    deploy = next(o for o in objects if o["kind"] == "Deployment")
    assert deploy["spec"]["template"]["spec"]["containers"][0]["image"] == image
    config = config_of(objects)
    assert config["apiVersion"] == api_version
    jsonschema.validate(config, SCHEDULER_CONFIG)
    assert yaml.safe_load(yaml.safe_dump(config)) == render.scheduler_configuration(SETTINGS[name], kube)


def test_the_default_profile_is_the_one_measured_best_on_the_real_scheduler():
    """The default up to 1.35 (benchmarks/packing_real.py and benchmarks/packing_shapes.py, docs/steps/binpack-
    scheduler.md, "Choosing the scoring"): RequestedToCapacityRatio on the GPU, 0:0 -> 50:1 -> 100:10, weight 3, plus
    BalancedAllocation over cpu, memory and nvidia.com/gpu, weight 1 (at 2 against 1, 1.35's BalancedAllocation
    spread light GPU pods one to a node); every node scored on a cluster of up to 1,500 nodes."""
    config = render.scheduler_configuration(SchedulerConfig(), "1.31.0", node_count=1213)
    profile = config["profiles"][0]
    assert config["percentageOfNodesToScore"] == 100
    assert profile["schedulerName"] == "gpu-binpack-scheduler"
    assert profile["plugins"]["score"] == {"enabled": [{"name": "NodeResourcesFit", "weight": 3},
                                                       {"name": "NodeResourcesBalancedAllocation", "weight": 1}]}
    assert profile["pluginConfig"] == [
        {"name": "NodeResourcesFit", "args": {"scoringStrategy": {
            "type": "RequestedToCapacityRatio", "resources": [{"name": "nvidia.com/gpu", "weight": 100}],
            "requestedToCapacityRatio": {"shape": [{"utilization": 0, "score": 0}, {"utilization": 50, "score": 1},
                                                   {"utilization": 100, "score": 10}]}}}},
        {"name": "NodeResourcesBalancedAllocation", "args": {"resources": [
            {"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}, {"name": "nvidia.com/gpu", "weight": 1}]}}]


@pytest.mark.parametrize("configured, nodes, expected, says", [
    (None, 1, 100, "every node scored (1 node: up to 1,500)"),
    (None, 1500, 100, "every node scored (1,500 nodes: up to 1,500)"),
    (None, 1501, 0, "adaptive share of nodes scored (1,501 nodes: over 1,500)"),
    (None, 15000, 0, "adaptive share of nodes scored (15,000 nodes: over 1,500)"),
    (None, None, 0, "adaptive share of nodes scored (node count unknown)"),  # unknown is not "small"
    (100, 15000, 100, "every node scored"),  # the config's own value wins at any size
    (0, 10, 0, "adaptive share of nodes scored"),
    (30, None, 30, "30 % of nodes scored"),
])
def test_the_share_of_nodes_scored_follows_the_cluster_size_unless_the_config_sets_it(configured, nodes, expected,
                                                                                       says):
    """Scoring every node packs best but costs throughput in proportion to the nodes: at 5,000-15,000 nodes
    kube-scheduler's adaptive share keeps the bin-packing scheduler near the default one's pods per second
    (benchmarks/scheduler_throughput.py). `up` reads the node count; a count it could not read is not taken as
    small."""
    settings = SchedulerConfig(percentage_of_nodes_to_score=configured)
    assert render.scheduler_configuration(settings, "1.37.2", nodes)["percentageOfNodesToScore"] == expected
    assert render.profile_line(settings, "1.37.2", nodes).endswith(", " + says)


def _node(name: str, pool: str | None = None) -> dict:
    return {"metadata": {"name": name, "labels": {"karpenter.sh/nodepool": pool} if pool else {}}}


def _pool(name: str, gpus: str, per_node: int = 1):
    from gpu_bootstrap.core.config.pools import PoolConfig
    return PoolConfig(name=name, cloud="kwok", limits={"nvidia.com/gpu": gpus},
                      requirements={"gpu_count": per_node})


@pytest.mark.parametrize("nodes, pools, expected", [
    ([_node("a"), _node("b")], [], 2),
    # a pool counts at the most its limit allows (16 GPUs / 8 per node), not at the nodes it has now
    ([_node("a"), _node("p1", "gpu"), _node("p2", "gpu")], [("gpu", "16", 8)], 1 + 2),
    ([_node("a")], [("gpu", "16", 8)], 1 + 2),
    ([_node("a"), _node("x", "theirs")], [("gpu", "3", 2)], 2 + 1),  # another NodePool's node is a node like any
    ([_node(f"n{i}") for i in range(10)], [("big", "12k", 8)], 10 + 1500),
])
def test_the_node_count_the_share_is_chosen_for_counts_pools_at_their_limits(nodes, pools, expected):
    assert render.nodes_to_plan_for(nodes, [_pool(*p) for p in pools]) == expected


def test_pools_that_can_grow_the_cluster_past_the_threshold_get_the_adaptive_share_from_the_start():
    small = [_node("a"), _node("b")]
    reach = render.nodes_to_plan_for(small, [_pool("gpu", "12008", 8)])  # 2 + 1501 nodes reachable
    assert render.scheduler_configuration(SchedulerConfig(), "1.37.2", reach)["percentageOfNodesToScore"] == 0
    assert render.scheduler_configuration(SchedulerConfig(), "1.37.2", len(small))["percentageOfNodesToScore"] == 100


@pytest.mark.parametrize("configured, live, nodes, warns", [
    (None, 100, 1501, True),  # rendered for a small cluster, which then grew
    (None, 100, 1500, False),
    (None, 0, 20000, False),  # already the adaptive share
    (100, 100, 20000, False),  # the config chose every node: its call
    (None, None, 20000, False),  # no share in the live config (kube-scheduler's default is adaptive)
])
def test_a_scheduler_rendered_for_a_smaller_cluster_is_named_with_its_fix(configured, live, nodes, warns):
    problem = render.outgrown(SchedulerConfig(percentage_of_nodes_to_score=configured), live, nodes)
    assert (problem is not None) == warns
    if warns:
        assert f"this one has {nodes:,}" in problem and "Fix: run gpu-bootstrap up" in problem


@pytest.mark.parametrize("settings, line", [
    ({}, "RequestedToCapacityRatio on nvidia.com/gpu (0:0, 50:1, 100:10) x3 + BalancedAllocation over cpu, memory, "
         "nvidia.com/gpu x1, every node scored (40 nodes: up to 1,500)"),
    ({"strategy": "MostAllocated", "fit_weight": 1, "balanced_allocation_weight": 0},
     "MostAllocated on nvidia.com/gpu x1, every node scored (40 nodes: up to 1,500)"),
    ({"strategy": "MostAllocated", "resource_weights": {"nvidia.com/gpu": 100, "cpu": 1},
      "balanced_allocation_weight": 3, "balanced_allocation_resources": ["cpu", "memory"],
      "percentage_of_nodes_to_score": 0},
     "MostAllocated on nvidia.com/gpu 100, cpu 1 x3 + BalancedAllocation over cpu, memory x3, adaptive share of "
     "nodes scored"),
    ({"percentage_of_nodes_to_score": 50}, "RequestedToCapacityRatio on nvidia.com/gpu (0:0, 50:1, 100:10) x3 + "
                                           "BalancedAllocation over cpu, memory, nvidia.com/gpu x1, 50 % of nodes scored"),
])
def test_the_plan_explains_the_profile_in_one_line(settings, line):
    assert render.profile_line(SchedulerConfig(**settings), "1.33.0", 40) == line


@pytest.mark.parametrize("kube, line", [
    ("1.35.4", "RequestedToCapacityRatio on nvidia.com/gpu (0:0, 50:1, 100:10) x3 + BalancedAllocation over cpu, "
               "memory, nvidia.com/gpu x1, every node scored (2 nodes: up to 1,500)"),
    ("1.36.0", "RequestedToCapacityRatio on nvidia.com/gpu (0:0, 50:2, 100:10) x1 + BalancedAllocation over cpu, "
               "memory, nvidia.com/gpu x2, every node scored (2 nodes: up to 1,500)"),
    ("1.37.2", "RequestedToCapacityRatio on nvidia.com/gpu (0:0, 50:2, 100:10) x1 + BalancedAllocation over cpu, "
               "memory, nvidia.com/gpu x2, every node scored (2 nodes: up to 1,500)"),
])
def test_the_default_profile_follows_the_schedulers_balanced_allocation(kube, line):
    """kube-scheduler 1.36 changed BalancedAllocation (it scores the change in balance, kubernetes PR #135573); the
    default profile is the one measured best for each (docs/steps/binpack-scheduler.md, "Choosing the scoring")."""
    assert render.profile_line(SchedulerConfig(), kube, 2) == line
    config = render.scheduler_configuration(SchedulerConfig(), kube, 2)
    expected_weights = [{"name": "NodeResourcesFit", "weight": 3 if kube < "1.36" else 1},
                        {"name": "NodeResourcesBalancedAllocation", "weight": 1 if kube < "1.36" else 2}]
    assert config["profiles"][0]["plugins"]["score"]["enabled"] == expected_weights


def test_any_scoring_key_set_makes_the_profile_the_users_on_every_version():
    """Once the config sets a scoring key, the scheduler's version no longer picks the profile: the keys left out
    take the config's documented defaults."""
    settings = SchedulerConfig.model_validate({"fit_weight": 4})
    line = render.profile_line(settings, "1.37.2", 3)
    assert line == ("RequestedToCapacityRatio on nvidia.com/gpu (0:0, 50:1, 100:10) x4 + BalancedAllocation over "
                    "cpu, memory, nvidia.com/gpu x1, every node scored (3 nodes: up to 1,500)")
    untouched = SchedulerConfig.model_validate({"replicas": 1, "name": "packer"})
    config = render.scheduler_configuration(untouched, "1.37.2")
    assert config["profiles"][0]["schedulerName"] == "packer"  # the other settings survive the version's profile
    assert config["profiles"][0]["plugins"]["score"]["enabled"][0] == {"name": "NodeResourcesFit", "weight": 1}


def test_requested_to_capacity_ratio_carries_its_shape_and_balanced_allocation_its_weight():
    config = render.scheduler_configuration(SETTINGS["ratio"], "1.29.0")
    profile = config["profiles"][0]
    strategy = profile["pluginConfig"][0]["args"]["scoringStrategy"]
    assert strategy == {"type": "RequestedToCapacityRatio", "resources": [{"name": "nvidia.com/gpu", "weight": 10}],
                        "requestedToCapacityRatio": {"shape": [{"utilization": 0, "score": 0},
                                                               {"utilization": 50, "score": 3},
                                                               {"utilization": 100, "score": 10}]}}
    assert profile["plugins"]["score"] == {"enabled": [{"name": "NodeResourcesFit", "weight": 1},
                                                       {"name": "NodeResourcesBalancedAllocation", "weight": 1}]}


def test_leader_election_uses_its_own_lease_and_the_role_grants_exactly_it():
    settings = SchedulerConfig(name="packer", lease_name="packer-lock", namespace="gpu-system")
    objects = render.manifests(settings, "1.31.0")
    election = config_of(objects)["leaderElection"]
    assert election == {"leaderElect": True, "resourceLock": "leases", "resourceName": "packer-lock",
                        "resourceNamespace": "gpu-system"}
    role = next(o for o in objects if o["kind"] == "Role")
    assert role["metadata"]["namespace"] == "gpu-system"
    assert role["rules"][1]["resourceNames"] == ["packer-lock"]
    reader = next(o for o in objects if o["metadata"]["name"] == "packer-authentication-reader")
    assert reader["metadata"]["namespace"] == "kube-system"  # the role it binds lives there
    assert reader["subjects"] == [{"kind": "ServiceAccount", "name": "packer", "namespace": "gpu-system"}]


def test_the_deployment_runs_in_cluster_highly_available_and_probed_on_the_secure_port():
    deploy = next(o for o in render.manifests(SchedulerConfig(), "1.31.0") if o["kind"] == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert deploy["spec"]["replicas"] == 2
    assert pod["serviceAccountName"] == "gpu-binpack-scheduler"
    assert all("hostPath" not in volume for volume in pod["volumes"])
    assert not any("kubeconfig" in arg for arg in container["command"])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 10259, "scheme": "HTTPS"}
    assert container["readinessProbe"]["httpGet"]["port"] == 10259
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_one_replica_needs_no_disruption_budget():
    kinds = [o["kind"] for o in render.manifests(SchedulerConfig(replicas=1), "1.31.0")]
    assert "PodDisruptionBudget" not in kinds


def test_a_config_change_changes_the_pod_template():
    """The scheduler reads its configuration only at start: a change to it (a setting, or the cluster growing past
    the size where every node is scored) must roll the pods."""
    def template_hash(settings, nodes=10):
        deploy = next(o for o in render.manifests(settings, "1.31.0", node_count=nodes) if o["kind"] == "Deployment")
        return deploy["spec"]["template"]["metadata"]["annotations"][render.CONFIG_HASH]

    assert template_hash(SchedulerConfig()) != template_hash(SchedulerConfig(fit_weight=4))
    assert template_hash(SchedulerConfig(), 1500) != template_hash(SchedulerConfig(), 1501)
    assert template_hash(SchedulerConfig(), 10) == template_hash(SchedulerConfig(), 1500)


def test_a_mirror_and_a_pinned_tag_override_the_image():
    settings = SchedulerConfig(image="mirror.example.com/k8s/kube-scheduler", image_tag="v1.31.0-custom")
    assert render.image(settings, "1.31.5") == "mirror.example.com/k8s/kube-scheduler:v1.31.0-custom"
    assert render.image(SchedulerConfig(), "1.30") == "registry.k8s.io/kube-scheduler:v1.30.14"


@pytest.mark.parametrize("kube, tag", [
    ("1.31.4", "v1.31.4"), ("v1.25.0", "v1.25.0"), ("1.31.4+k3s1", "v1.31.4"), ("1.30.2-eks-2d5f260", "v1.30.2"),
    ("1.24", "v1.24.17"), ("v1.33", "v1.33.7"), ("1.37", "v1.37.1"), ("1.99", "v1.99.0")])
def test_the_image_follows_the_control_plane_exact_patch_or_newest_known_patch(kube, tag):
    """An exact server version is used as it is; a minor alone gets the newest patch gpu-bootstrap knows, never a
    stale vX.Y.0 (only a minor newer than the table falls back to .0)."""
    assert render.image(SchedulerConfig(), kube) == f"registry.k8s.io/kube-scheduler:{tag}"


@pytest.mark.parametrize("kube", ["1.22.9", "1.19.0"])
def test_clusters_older_than_1_23_are_refused(kube):
    with pytest.raises(ConfigError, match="too old for the bin-packing profile"):
        render.scheduler_configuration(SchedulerConfig(), kube)


@pytest.mark.parametrize("field, value, message", [
    ("resource_weights", {"nvidia.com/gpu": 101}, "between 1 and 100"),
    ("resource_weights", {}, "at least one resource"),
    ("shape", [{"utilization": 50, "score": 1}, {"utilization": 50, "score": 5}], "increase strictly"),
    ("shape", [{"utilization": 0, "score": 11}], "less than or equal to 10"),
    ("name", "default-scheduler", "the cluster's own scheduler"),
    ("name", "Bin_Packer", "lowercase DNS label"),
])
def test_bad_settings_are_refused_with_the_reason(field, value, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**{field: value})


def test_the_example_gpu_pod_asks_for_the_default_scheduler_name_and_is_valid():
    from pathlib import Path
    pod = yaml.safe_load((Path(__file__).resolve().parent.parent / "examples" / "gpu-pod.yaml").read_text())
    kubernetes_validate.validate(pod, "1.31.0", strict=True)
    assert pod["spec"]["schedulerName"] == SchedulerConfig().name


@pytest.mark.unit
def test_balanced_allocation_resources_are_rendered_and_simulated_as_configured():
    """BalancedAllocation with nvidia.com/gpu among its resources (#27's profile search): rendered as the plugin's
    args, read back by the simulator's profile_from_config; the upstream default (cpu, memory) stays implicit."""
    from gpu_bootstrap.sim import scoring
    settings = SchedulerConfig(balanced_allocation_weight=1,
                               balanced_allocation_resources=["cpu", "memory", "nvidia.com/gpu"])
    config = render.scheduler_configuration(settings, "1.33.0")
    assert config["profiles"][0]["pluginConfig"][1] == {"name": "NodeResourcesBalancedAllocation", "args": {
        "resources": [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1},
                      {"name": "nvidia.com/gpu", "weight": 1}]}}
    assert scoring.profile_from_config(config).balanced_resources == ("cpu", "memory", "nvidia.com/gpu")
    upstream = render.scheduler_configuration(SchedulerConfig(balanced_allocation_resources=["cpu", "memory"]),
                                              "1.33.0")
    assert [c["name"] for c in upstream["profiles"][0]["pluginConfig"]] == ["NodeResourcesFit"]


def balanced_resources(config: dict) -> list[str] | None:
    """BalancedAllocation's resources as rendered (None: upstream's implicit cpu and memory)."""
    args = next((c["args"] for c in config["profiles"][0]["pluginConfig"]
                 if c["name"] == "NodeResourcesBalancedAllocation"), None)
    return None if args is None else [r["name"] for r in args["resources"]]


@pytest.mark.parametrize("version, settings, with_dra, without_dra", [
    ("1.37.2", SchedulerConfig(), None, ["cpu", "memory", "nvidia.com/gpu"]),
    ("1.35.4", SchedulerConfig(), None, ["cpu", "memory", "nvidia.com/gpu"]),
    ("1.37.2", SchedulerConfig(fit_weight=4), None, ["cpu", "memory", "nvidia.com/gpu"]),
    ("1.37.2", SchedulerConfig(balanced_allocation_resources=["cpu", "memory"]), None, None),
    ("1.37.2", SchedulerConfig(balanced_allocation_weight=0), "off", "off"),
])
def test_a_dra_served_gpu_is_left_out_of_balanced_allocation_unless_the_config_names_it(version, settings, with_dra,
                                                                                           without_dra):
    def rendered(classes):
        config = render.scheduler_configuration(settings, version, 10, dra_classes=classes)
        if any(p["name"] == "NodeResourcesBalancedAllocation"
               for p in config["profiles"][0]["plugins"]["score"].get("disabled", [])):
            return "off"
        return balanced_resources(config)
    assert rendered(("gpu.nvidia.com",)) == with_dra
    assert rendered(()) == without_dra
    fit = render.scheduler_configuration(settings, version, 10, dra_classes=("gpu.nvidia.com",))
    assert fit["profiles"][0]["pluginConfig"][0]["args"]["scoringStrategy"]["resources"] == [
        {"name": "nvidia.com/gpu", "weight": 100}]  # the fit term still packs the GPU


def test_a_config_that_balances_a_dra_served_gpu_is_refused_naming_the_field_and_the_class():
    settings = SchedulerConfig(balanced_allocation_resources=["cpu", "nvidia.com/gpu"])
    with pytest.raises(ConfigError) as raised:
        render.scheduler_configuration(settings, "1.37.2", 10, dra_classes=("gpu.nvidia.com",))
    assert raised.value.one_line().startswith("scheduler.balanced_allocation_resources: nvidia.com/gpu is served "
                                              "through DRA here (DeviceClass gpu.nvidia.com)")
    assert balanced_resources(render.scheduler_configuration(settings, "1.37.2", 10)) == ["cpu", "nvidia.com/gpu"]


def test_the_plan_line_says_why_the_gpu_is_not_balanced():
    line = render.profile_line(SchedulerConfig(), "1.37.2", 2, ("gpu.nvidia.com",))
    assert "BalancedAllocation over cpu, memory x2 (nvidia.com/gpu left out: served through DRA, DeviceClass " \
           "gpu.nvidia.com)" in line
    assert "left out" not in render.profile_line(SchedulerConfig(), "1.37.2", 2)
