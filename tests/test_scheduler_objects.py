"""The bin-packing scheduler's objects, field by field where schema validation cannot tell: selectors equal to the
template labels, the security context, probe timings, the rollout strategy, the disruption budget, and the oldest
supported Kubernetes (1.23)."""
from __future__ import annotations

import hashlib

import pytest
import yaml

from gpu_bootstrap.core.config import SchedulerConfig
from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.render import scheduler as render

pytestmark = pytest.mark.unit

NAME = "gpu-binpack-scheduler"
LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "gpu-bootstrap",
          "app.kubernetes.io/component": "scheduler"}


def by_kind(objects: list[dict], kind: str) -> dict:
    return next(o for o in objects if o["kind"] == kind)


@pytest.mark.parametrize("kube, api_version", [
    ("1.23.0", "kubescheduler.config.k8s.io/v1beta3"),
    ("1.23.17", "kubescheduler.config.k8s.io/v1beta3"),
    ("1.24.0", "kubescheduler.config.k8s.io/v1beta3"),
    ("1.25.0", "kubescheduler.config.k8s.io/v1"),
])
def test_the_config_api_version_on_each_side_of_its_boundaries(kube, api_version):
    assert render.config_api_version(kube) == api_version
    assert render.scheduler_configuration(SchedulerConfig(), kube)["apiVersion"] == api_version


def test_1_22_is_refused_naming_the_version_and_the_way_out():
    with pytest.raises(ConfigError) as refused:
        render.config_api_version("1.22.17")
    assert str(refused.value).startswith("scheduler: Kubernetes 1.22 is too old for the bin-packing profile "
                                         "(needs 1.23 or newer: kubescheduler.config.k8s.io/v1beta3)")
    assert "scheduler.enabled: false" in str(refused.value) + str(getattr(refused.value, "hint", ""))


def test_every_object_carries_the_managed_labels():
    for obj in render.manifests(SchedulerConfig(), "1.31.0"):
        assert obj["metadata"]["labels"] == LABELS, obj["kind"]


def test_the_deployment_and_the_budget_select_exactly_the_pods_of_the_template():
    objects = render.manifests(SchedulerConfig(), "1.31.0")
    deploy, budget = by_kind(objects, "Deployment"), by_kind(objects, "PodDisruptionBudget")
    template_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert template_labels == LABELS
    for selector in (deploy["spec"]["selector"]["matchLabels"], budget["spec"]["selector"]["matchLabels"]):
        assert selector == {"app.kubernetes.io/name": NAME}
        assert selector.items() <= template_labels.items()
    term = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term == {"weight": 100, "podAffinityTerm": {
        "topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app.kubernetes.io/name": NAME}}}}


def test_the_budget_allows_one_pod_down_and_the_rollout_never_surges():
    objects = render.manifests(SchedulerConfig(replicas=3), "1.31.0")
    assert by_kind(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    deploy = by_kind(objects, "Deployment")
    assert deploy["spec"]["replicas"] == 3
    assert deploy["spec"]["strategy"] == {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}


def test_the_pod_runs_unprivileged_with_a_read_only_config():
    deploy = by_kind(render.manifests(SchedulerConfig(), "1.31.0"), "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert container["volumeMounts"] == [{"name": "config", "mountPath": render.CONFIG_DIR, "readOnly": True}]
    assert pod["volumes"] == [{"name": "config", "configMap": {"name": f"{NAME}-config"}}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert "tolerations" not in pod


def test_the_probes_and_the_requests():
    container = by_kind(render.manifests(SchedulerConfig(), "1.31.0"), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]
    probe = {"httpGet": {"path": "/healthz", "port": 10259, "scheme": "HTTPS"}}
    assert container["livenessProbe"] == {**probe, "initialDelaySeconds": 15, "periodSeconds": 10,
                                          "failureThreshold": 3}
    assert container["readinessProbe"] == {**probe, "periodSeconds": 10}
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"}}
    assert container["command"] == ["/usr/local/bin/kube-scheduler",
                                    f"--config={render.CONFIG_DIR}/{render.CONFIG_FILE}", "--v=2"]
    assert container["ports"] == [{"name": "https", "containerPort": 10259, "protocol": "TCP"}]


def test_tolerations_are_carried_onto_the_pod_as_given():
    wanted = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    deploy = by_kind(render.manifests(SchedulerConfig(), "1.31.0", wanted), "Deployment")
    assert deploy["spec"]["template"]["spec"]["tolerations"] == wanted


def test_the_config_hash_is_the_first_16_hex_digits_of_the_configmaps_text():
    objects = render.manifests(SchedulerConfig(), "1.31.0")
    text = by_kind(objects, "ConfigMap")["data"][render.CONFIG_FILE]
    annotation = by_kind(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"][render.CONFIG_HASH]
    assert annotation == hashlib.sha256(text.encode()).hexdigest()[:16]


def test_the_config_text_keeps_the_documents_order():
    text = render.config_text(SchedulerConfig(), "1.31.0")
    assert list(yaml.safe_load(text)) == ["apiVersion", "kind", "leaderElection", "percentageOfNodesToScore",
                                          "profiles"]
    assert text.startswith("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n")
    # written in the document's own order, not sorted: a re-ordering would change the config hash and restart the
    # scheduler's pods on an upgrade that changed nothing
    assert "profiles:\n- schedulerName: gpu-binpack-scheduler\n  plugins:\n" in text


def test_the_default_configuration_in_full():
    assert render.scheduler_configuration(SchedulerConfig(), "1.31.0", 1500) == {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": True, "resourceLock": "leases", "resourceName": NAME,
                           "resourceNamespace": "kube-system"},
        "percentageOfNodesToScore": 100,
        "profiles": [{"schedulerName": NAME, "plugins": {"score": {
            "enabled": [{"name": "NodeResourcesFit", "weight": 3},
                        {"name": "NodeResourcesBalancedAllocation", "weight": 1}]}},
            "pluginConfig": [
                {"name": "NodeResourcesFit", "args": {"scoringStrategy": {
                    "type": "RequestedToCapacityRatio", "resources": [{"name": "nvidia.com/gpu", "weight": 100}],
                    "requestedToCapacityRatio": {"shape": [{"utilization": 0, "score": 0},
                                                           {"utilization": 50, "score": 1},
                                                           {"utilization": 100, "score": 10}]}}}},
                {"name": "NodeResourcesBalancedAllocation", "args": {"resources": [
                    {"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1},
                    {"name": "nvidia.com/gpu", "weight": 1}]}}]}]}
