"""GPUs served through DRA, counted like device-plugin GPUs (gpu_bootstrap/core/dra.py): the slices NVIDIA's DRA
driver publishes, the claims that hold devices, and the view `status` and `simulate --from-cluster` read. Objects as
the real API server returns them (tests/localcluster/dra.py builds the slices as the driver v0.5.0 does)."""
from __future__ import annotations

import copy

import pytest

from gpu_bootstrap.core import dra
from tests.localcluster import dra as objects

pytestmark = pytest.mark.unit


def node(name: str, gpus: str | None = None) -> dict:
    capacity = {"cpu": "64", "memory": "256Gi", **({"nvidia.com/gpu": gpus} if gpus is not None else {})}
    return {"metadata": {"name": name}, "status": {"capacity": dict(capacity), "allocatable": dict(capacity)}}


def claim(name: str, devices: list[tuple[str, str]], namespace: str = "team") -> dict:
    return {"metadata": {"name": name, "namespace": namespace}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": driver, "pool": "n1", "device": device} for driver, device in devices]}}}}


def pod(name: str, gpus: int = 0, claims: tuple[str, ...] = (), made: tuple[str, ...] = (),
        extended_claim: str | None = None) -> dict:
    resources = {"requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    status = {"phase": "Running"}
    if made:
        status["resourceClaimStatuses"] = [{"name": f"r{i}", "resourceClaimName": c} for i, c in enumerate(made)]
    if extended_claim:
        status["extendedResourceClaimStatus"] = {"resourceClaimName": extended_claim, "requestMappings": []}
    return {"metadata": {"name": name, "namespace": "team"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": resources}],
                     "resourceClaims": [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]},
            "status": status}


def test_the_driver_s_whole_gpus_are_counted_per_node_newest_pool_generation_only():
    old = objects.resource_slice("n1", 4)
    new = objects.resource_slice("n1", 8) | {"metadata": {"name": "n1-new"}}
    new["spec"] = dict(new["spec"], pool={"name": "n1", "generation": 2, "resourceSliceCount": 1})
    mig = objects.resource_slice("n2", 2)
    mig["spec"]["devices"][1]["attributes"]["type"] = {"string": "mig"}
    other = objects.resource_slice("n3", 4)
    other["spec"]["driver"] = "gpu.example.com"
    assert dra.gpu_devices_by_node([old, new, mig, other]) == {"n1": 8, "n2": 1}


def test_a_claim_counts_the_nvidia_driver_s_devices_only():
    assert dra.claim_gpus(claim("c", [("gpu.nvidia.com", "gpu-0"), ("gpu.nvidia.com", "gpu-1"),
                                      ("nic.example.com", "eth1")])) == 2
    assert dra.claim_gpus({"metadata": {"name": "pending"}}) == 0  # not allocated yet


def test_dra_only_nodes_get_their_published_gpus_and_device_plugin_nodes_keep_theirs():
    nodes = [node("n1"), node("n2", "4"), node("n3")]
    before = copy.deepcopy(nodes)
    viewed, _ = dra.as_device_plugin(nodes, [], [objects.resource_slice("n1", 8), objects.resource_slice("n2", 8)], [])
    assert [n["status"]["allocatable"].get("nvidia.com/gpu") for n in viewed] == ["8", "4", None]
    assert nodes == before  # copies


def test_explicit_and_template_claims_add_their_gpus_and_extended_resource_claims_are_not_counted_twice():
    claims = [claim("mine", [("gpu.nvidia.com", "gpu-0"), ("gpu.nvidia.com", "gpu-1")]),
              claim("from-template", [("gpu.nvidia.com", "gpu-2")]),
              claim("extended", [("gpu.nvidia.com", "gpu-3"), ("gpu.nvidia.com", "gpu-4")]),
              claim("mine", [("gpu.nvidia.com", "gpu-5")], namespace="other")]
    pods = [pod("explicit", claims=("mine",)), pod("templated", made=("from-template",)),
            pod("extended", gpus=2, extended_claim="extended"), pod("plain", gpus=1), pod("cpu")]
    before = copy.deepcopy(pods)
    _, viewed = dra.as_device_plugin([], pods, [], claims)
    gpus = {p["metadata"]["name"]: p["spec"]["containers"][0]["resources"].get("requests", {}).get("nvidia.com/gpu")
            for p in viewed}
    assert gpus == {"explicit": "2", "templated": "1", "extended": "2", "plain": "1", "cpu": None}
    assert pods == before


def test_unreadable_dra_objects_are_a_note_not_no_gpus():
    """A 403 on ResourceSlices leaves the lists as they were and says so: the DRA GPUs are unknown, not absent."""
    from gpu_bootstrap.core.errors import ClusterError

    class Refusing:
        def resource(self, api_version, kind):
            return ("resourceslices", False)

        def list(self, api_version, kind, *args, **kwargs):
            raise ClusterError("GET /apis/resource.k8s.io/v1/resourceslices failed: forbidden", status=403)

    notes: list[str] = []
    nodes = [node("n1")]
    assert dra.counted(Refusing(), nodes, [], notes) == (nodes, [])
    assert notes and notes[0].startswith("DRA ResourceSlices and ResourceClaims could not be read (GET /apis/resource")


def test_a_node_served_by_the_device_plugin_and_dra_at_once_is_named():
    nodes = [node("both", "8"), node("dra-only"), node("plugin-only", "8")]
    slices = [objects.resource_slice("both", 8), objects.resource_slice("dra-only", 8)]
    assert dra.served_twice(nodes, slices) == ["both"]


def test_gpus_asked_by_a_classs_implicit_extended_resource_name_count_as_nvidia_gpu():
    """KEP-5004: `deviceclass.resource.kubernetes.io/<class>` is every DeviceClass's extended resource; a pod asking
    for gpu.nvidia.com (or a MIG slice of mig.nvidia.com) by that name holds GPUs, which `status` counts like
    nvidia.com/gpu. Another class's implicit name is not a GPU."""
    asked = pod("by-implicit-name")
    asked["spec"]["containers"][0]["resources"] = {
        "limits": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "2"},
        "requests": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "2"}}
    asked["spec"]["containers"].append({"name": "mig", "resources": {
        "limits": {"deviceclass.resource.kubernetes.io/mig.nvidia.com": "1"}}})
    other = pod("nic")
    other["spec"]["containers"][0]["resources"] = {"limits": {"deviceclass.resource.kubernetes.io/nic.example.com": "1"}}
    before = copy.deepcopy([asked, other])
    _nodes, pods = dra.as_device_plugin([node("n1")], [asked, other], [], [])
    assert [asked, other] == before  # copies: the inputs are not changed
    assert pods[0]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert pods[0]["spec"]["containers"][1]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert pods[1] == other
