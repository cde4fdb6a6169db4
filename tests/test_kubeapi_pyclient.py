"""The `kubernetes` Python client (typed models are strict pydantic) against the emulator."""
from __future__ import annotations

import pytest

pytest.importorskip("kubernetes")
from kubernetes import client, config, dynamic, watch  # noqa: E402


@pytest.fixture
def api_client(cluster):
    return config.new_client_from_config(str(cluster.kubeconfig))


def test_typed_core_and_apps_apis(api_client, emu):
    core = client.CoreV1Api(api_client)
    node = core.read_node("gpu-1")
    assert node.status.allocatable["nvidia.com/gpu"] == "8" and node.status.node_info.architecture == "amd64"
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
    assert emu.get("nodes", "gpu-1")["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    apps = client.AppsV1Api(api_client)
    apps.create_namespaced_deployment("default", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "py"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
            "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}})
    emu.settle()
    deploy = apps.read_namespaced_deployment("py", "default")
    assert deploy.status.available_replicas == 1
    pods = core.list_namespaced_pod("default").items
    assert pods[0].status.container_statuses[0].ready is True
    assert pods[0].metadata.owner_references[0].kind == "ReplicaSet"
    assert client.VersionApi(api_client).get_code().git_version == "v1.31.0"


def test_typed_errors_carry_the_status(api_client):
    with pytest.raises(client.exceptions.ApiException) as raised:
        client.CoreV1Api(api_client).read_namespaced_config_map("missing", "default")
    assert raised.value.status == 404


def test_typed_rbac_coordination_and_scheduling(api_client):
    rbac = client.RbacAuthorizationV1Api(api_client)
    assert rbac.read_cluster_role("system:kube-scheduler").rules
    lease = client.CoordinationV1Api(api_client).read_namespaced_lease("kube-scheduler", "kube-system")
    assert lease.spec.lease_duration_seconds == 15
    classes = client.SchedulingV1Api(api_client).list_priority_class().items
    assert {c.metadata.name for c in classes} == {"system-cluster-critical", "system-node-critical"}


def test_dynamic_client_on_builtin_and_custom_resources(api_client, emu):
    dyn = dynamic.DynamicClient(api_client)
    crds = dyn.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    crds.create(body={"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                      "metadata": {"name": "widgets.example.com"},
                      "spec": {"group": "example.com", "scope": "Namespaced",
                               "names": {"plural": "widgets", "kind": "Widget"},
                               "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                                   "openAPIV3Schema": {"type": "object",
                                                       "x-kubernetes-preserve-unknown-fields": True}}}]}})
    emu.settle()
    widgets = dynamic.DynamicClient(api_client).resources.get(api_version="example.com/v1", kind="Widget")
    widgets.create(namespace="default", body={"apiVersion": "example.com/v1", "kind": "Widget",
                                              "metadata": {"name": "w1"}, "spec": {"size": 3}})
    assert widgets.get(name="w1", namespace="default").spec.size == 3
    widgets.patch(name="w1", namespace="default", body={"spec": {"size": 4}},
                  content_type="application/merge-patch+json")
    assert emu.get("widgets.example.com", "w1", "default")["spec"]["size"] == 4
    nodes = dyn.resources.get(api_version="v1", kind="Node")
    assert sorted(n.metadata.name for n in nodes.get().items) == ["cpu-1", "gpu-1", "gpu-2"]
    applied = nodes.server_side_apply(body={"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "gpu-1", "labels": {"role": "gpu"}}}, field_manager="gpu-bootstrap")
    assert applied.metadata.labels["role"] == "gpu"


def test_watch_stream_from_the_client(api_client, emu):
    core = client.CoreV1Api(api_client)
    rv = core.list_namespaced_config_map("default").metadata.resource_version
    core.create_namespaced_config_map("default", {"metadata": {"name": "seen"}, "data": {"a": "b"}})
    events = []
    for event in watch.Watch().stream(core.list_namespaced_config_map, "default", resource_version=rv,
                                      timeout_seconds=2):
        events.append((event["type"], event["object"].metadata.name))
        if event["object"].metadata.name == "seen":
            break
    assert ("ADDED", "seen") in events
