"""The queues step's pure rendering (render/queues.py) and its config section, table-tested without a cluster."""
from __future__ import annotations

import pytest
import yaml

from gpu_bootstrap import steps as registry
from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.render import queues as render

pytestmark = pytest.mark.unit  # host-free: the fast loop (pytest -m unit)
H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
GPU_LABELS = {"nvidia.com/gpu.present": "true"}


def section(**queues):
    model = registry.config_model()
    return model.model_validate({"nodes": [{"name": "gpu-1"}], "queues": queues}).queues


def by_kind(objects: list[dict], kind: str) -> dict:
    return {o["metadata"]["name"] + (f"@{o['metadata']['namespace']}" if o["metadata"].get("namespace") else ""): o
            for o in objects if o["kind"] == kind}


def gpu_quota(queue: dict) -> dict:
    group = next(g for g in queue["spec"]["resourceGroups"] if g["coveredResources"] == [render.GPU])
    return {f["name"]: f["resources"][0] for f in group["flavors"]}


def test_a_team_with_a_gpu_count_takes_the_flavor_of_every_gpu_node_and_cpu_memory_elsewhere():
    rendered = render.render(section(teams=[{"name": "research", "namespaces": ["r1", "r2"], "gpus": 8}]),
                             [render.GpuNode("gpu-1", (H100,) * 8, 8)], GPU_LABELS)
    flavors = by_kind(rendered.objects, "ResourceFlavor")
    assert flavors[render.ANY_GPU_FLAVOR]["spec"] == {"nodeLabels": GPU_LABELS}
    assert flavors[render.CPU_FLAVOR]["spec"] == {}  # cpu-only workloads are not sent to GPU nodes
    queue = by_kind(rendered.objects, "ClusterQueue")["research"]
    assert queue["spec"]["cohortName"] == "gpu-teams"
    assert queue["spec"]["namespaceSelector"]["matchExpressions"][0]["values"] == ["r1", "r2"]
    assert gpu_quota(queue) == {render.ANY_GPU_FLAVOR: {"name": render.GPU, "nominalQuota": "8"}}
    assert queue["spec"]["resourceGroups"][0]["coveredResources"] == ["cpu", "memory"]
    assert queue["spec"]["preemption"] == {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"}
    assert set(by_kind(rendered.objects, "LocalQueue")) == {"gpus@r1", "gpus@r2"}
    assert all(o["metadata"]["labels"] == render.MANAGED for o in rendered.objects)
    assert rendered.warnings == []


@pytest.mark.parametrize("team, quota", [
    ({"borrow": False}, {"borrowingLimit": "0"}),
    ({"borrowing_limit": 4}, {"borrowingLimit": "4"}),
    ({"lend": False}, {"lendingLimit": "0"}),
    ({"borrow": False, "lend": False}, {"borrowingLimit": "0", "lendingLimit": "0"}),
    ({}, {}),
])
def test_borrowing_and_lending_become_the_quota_limits(team, quota):
    rendered = render.render(section(teams=[{"name": "a", "namespaces": ["a"], "gpus": 4, **team}]), [], GPU_LABELS)
    assert gpu_quota(by_kind(rendered.objects, "ClusterQueue")["a"])[render.ANY_GPU_FLAVOR] == \
        {"name": render.GPU, "nominalQuota": "4", **quota}


def test_per_product_quotas_make_a_flavor_per_product_selecting_gfd_s_label():
    rendered = render.render(section(teams=[{"name": "a", "namespaces": ["a"], "gpus": {H100: 8, L4: 2}}]), [],
                             GPU_LABELS)
    flavors = by_kind(rendered.objects, "ResourceFlavor")
    assert render.ANY_GPU_FLAVOR not in flavors
    assert flavors["gpu-bootstrap-gpu-nvidia-h100-80gb-hbm3"]["spec"]["nodeLabels"] == {
        render.PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"}
    assert set(gpu_quota(by_kind(rendered.objects, "ClusterQueue")["a"])) == {
        "gpu-bootstrap-gpu-nvidia-h100-80gb-hbm3", "gpu-bootstrap-gpu-nvidia-l4"}


@pytest.mark.parametrize("teams, nodes, expected", [
    ([8, 8], [8, 8], []),
    ([8, 12], [8, 8], ["add up to 20 GPUs, but the GPU nodes have 16"]),
    ([{H100: 12}], [8], ["quotas name 12 NVIDIA H100 80GB HBM3 GPU(s), but preflight found 8"]),
    ([{L4: 1}], [8], ["quotas name 1 NVIDIA L4 GPU(s), but preflight found 0 (products found: NVIDIA H100"]),
])
def test_quotas_beyond_the_gpus_found_are_a_warning_with_the_numbers(teams, nodes, expected):
    conf = section(teams=[{"name": f"t{i}", "namespaces": [f"n{i}"], "gpus": gpus} for i, gpus in enumerate(teams)])
    found = render.render(conf, [render.GpuNode(f"gpu-{i}", (H100,) * n, n) for i, n in enumerate(nodes)],
                          GPU_LABELS).warnings
    assert len(found) == len(expected) and all(e in w for e, w in zip(expected, found)), found


def test_unknown_gpus_are_not_taken_for_none():
    conf = section(teams=[{"name": "a", "namespaces": ["a"], "gpus": 64}])
    assert render.render(conf, None, GPU_LABELS).warnings == []
    assert render.warnings(conf, []) != []  # known: no GPU nodes at all


@pytest.mark.parametrize("settings, expected", [
    ({}, {"manageJobsWithoutQueueName": False, "waitForPodsReady": {
        "timeout": "5m", "blockAdmission": False, "requeuingStrategy": {"timestamp": "Eviction"}}}),
    ({"sequential_admission": True}, {"waitForPodsReady": {
        "timeout": "5m", "blockAdmission": True, "requeuingStrategy": {"timestamp": "Eviction"}}}),
    ({"all_or_nothing": False}, {"waitForPodsReady": None}),
    ({"timeout": "90s"}, {"waitForPodsReady": {"timeout": "90s", "blockAdmission": False,
                                                "requeuingStrategy": {"timestamp": "Eviction"}}}),
    ({"require_queue": True}, {"manageJobsWithoutQueueName": True}),
])
def test_kueue_s_configuration_manages_the_team_namespaces_only(settings, expected):
    conf = section(teams=[{"name": "a", "namespaces": ["b-ns", "a-ns"], "gpus": 1}], **settings)
    values = render.chart_values(conf)
    config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    assert config["managedJobsNamespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a-ns", "b-ns"]}]}
    assert config["namespace"] == "kueue-system"
    assert {"batch/job", "pod"} <= set(config["integrations"]["frameworks"])
    for key, value in expected.items():
        assert config.get(key) == value, key
    assert values["controllerManager"]["manager"]["image"] == {
        "repository": render.IMAGE, "tag": "v0.17.0", "pullPolicy": "IfNotPresent"}


@pytest.mark.parametrize("dra", [False, True])
def test_dra_mode_turns_kueue_s_dra_gates_on_and_counts_gpu_claims_as_gpus(dra):
    """DRA mode: both gates (DRAExtendedResources is refused by Kueue without DynamicResourceAllocation) and the
    mapping of NVIDIA's whole-GPU class to nvidia.com/gpu, the resource the quotas name; device-plugin mode: neither."""
    conf = section(teams=[{"name": "a", "namespaces": ["a"], "gpus": 4}])
    rendered = render.render(conf, [render.GpuNode("gpu-1", (H100,) * 4, 4)], GPU_LABELS, dra=dra)
    config = yaml.safe_load(rendered.values["managerConfig"]["controllerManagerConfigYaml"])
    gates = rendered.values["controllerManager"].get("featureGates")
    if dra:
        assert gates == [{"name": "DynamicResourceAllocation", "enabled": True},
                         {"name": "DRAExtendedResources", "enabled": True}]
        assert config["resources"] == {
            "deviceClassMappings": [{"name": "nvidia.com/gpu", "deviceClassNames": ["gpu.nvidia.com"]}],
            "transformations": [{"input": "deviceclass.resource.kubernetes.io/gpu.nvidia.com", "strategy": "Replace",
                                 "outputs": {"nvidia.com/gpu": "1"}}]}
        assert any("DRA" in line for line in rendered.explained)
    else:
        assert gates is None and "resources" not in config
        assert not any("DRA" in line for line in rendered.explained)
    assert gpu_quota(by_kind(rendered.objects, "ClusterQueue")["a"]) == {
        render.ANY_GPU_FLAVOR: {"name": render.GPU, "nominalQuota": "4"}}  # the quotas are the same either way


def test_a_mirrored_image_keeps_its_registry_port():
    conf = section(teams=[{"name": "a", "namespaces": ["a"], "gpus": 1}])
    image = render.chart_values(conf, "mirror.example:5000/kueue/kueue:v0.17.0")["controllerManager"]["manager"]
    assert image["image"]["repository"] == "mirror.example:5000/kueue/kueue" and image["image"]["tag"] == "v0.17.0"


def test_priorities_become_workload_priority_classes():
    rendered = render.render(section(teams=[{"name": "a", "namespaces": ["a"], "gpus": 1, "priority": 100},
                                            {"name": "b", "namespaces": ["b"], "gpus": 1}]), [], GPU_LABELS)
    assert [(o["metadata"]["name"], o["value"]) for o in rendered.objects if o["kind"] == "WorkloadPriorityClass"] \
        == [("a", 100)]


@pytest.mark.parametrize("teams, field, words", [
    ([{"name": "a", "namespaces": ["x"], "gpus": 1}, {"name": "a", "namespaces": ["y"], "gpus": 1}],
     "teams[1].name", "listed twice"),
    ([{"name": "a", "namespaces": ["x"], "gpus": 1}, {"name": "b", "namespaces": ["x"], "gpus": 1}],
     "teams[1].namespaces", "team a's already"),
    ([{"name": "a", "namespaces": ["kube-system"], "gpus": 1}], "namespaces", "Kubernetes' own namespace"),
    ([{"name": "a", "namespaces": ["x"], "gpus": 1, "borrow": False, "borrowing_limit": 2}], "teams.0",
     "borrowing_limit"),
    ([{"name": "a", "namespaces": ["x"], "gpus": -1}], "gpus", "at least 0"),
    ([{"name": "A_b", "namespaces": ["x"], "gpus": 1}], "name", "DNS label"),
    ([{"name": "a", "namespaces": ["x"], "gpus": 1, "cpu": "lots"}], "cpu", "not a quantity"),
])
def test_bad_teams_are_refused_naming_the_field(tmp_path, teams, field, words):
    path = tmp_path / "gpu-bootstrap.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"name": "gpu-1"}], "queues": {"teams": teams}}))
    with pytest.raises(ConfigError) as refused:
        cfg.load(path, environ={}, model=registry.config_model())
    message = str(refused.value)
    assert "queues" in message and field.split(".")[-1] in message and words in message, message


def _pod(name: str, gpus: int = 1, labels: dict | None = None, annotations: dict | None = None,
         phase: str = "Running") -> dict:
    resources = {"limits": {render.GPU: str(gpus)}} if gpus else {}
    return {"metadata": {"name": name, "namespace": "team-a", "labels": labels or {},
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "resources": resources}]}, "status": {"phase": phase}}


@pytest.mark.parametrize("pod, listed", [
    (_pod("plain"), True),  # a GPU pod no queue admitted: what doctor lists with require_queue
    (_pod("cpu-only", gpus=0), False),
    (_pod("named", labels={render.QUEUE_LABEL: "gpus"}), False),  # a pod of the pod integration, in a queue
    (_pod("of-a-job", labels={"kueue.x-k8s.io/podset": "main"}), False),  # Kueue marked it when it admitted the Job
    (_pod("done", phase="Succeeded"), False),  # holds no GPU any more
    (_pod("failed", phase="Failed"), False),
    (_pod("pending", phase="Pending"), True),
])
def test_doctor_lists_the_gpu_pods_that_bypass_the_queues(pod, listed):
    from gpu_bootstrap.steps.queues import bypassing
    assert bypassing([pod]) == ([f"team-a/{pod['metadata']['name']}"] if listed else [])
