"""GPUs served through Dynamic Resource Allocation: what the objects of resource.k8s.io/v1 say about them. Pure.

A DeviceClass with `spec.extendedResourceName: nvidia.com/gpu` (KEP-5004: beta in 1.36, GA in 1.37) lets a pod that
asks for `nvidia.com/gpu` as users write it be served by a DRA driver (NVIDIA's publishes the class `gpu.nvidia.com`
with it) on nodes that advertise no such capacity; kube-scheduler allocates the devices and writes the claim.

Pure, but for `counted`, which lists the DRA objects through the Kubernetes adapter it is given.
"""
from __future__ import annotations

API_VERSION = "resource.k8s.io/v1"
GPU_RESOURCE = "nvidia.com/gpu"
# NVIDIA's DRA driver's DeviceClasses of devices of its driver gpu.nvidia.com (whole GPUs, MIG slices, GPUs passed
# through with VFIO); its ComputeDomain classes are channels and daemons, not GPUs.
GPU_CLAIM_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com")
# KEP-5004: every DeviceClass is also an extended resource by this implicit name, whether or not the class sets
# spec.extendedResourceName (k8s.io/kubernetes pkg/apis/resource ResourceDeviceClassPrefix): a pod asking for
# `deviceclass.resource.kubernetes.io/gpu.nvidia.com: 1` gets a GPU from DRA like one asking for nvidia.com/gpu.
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
IMPLICIT_GPU_RESOURCES = tuple(IMPLICIT_PREFIX + name for name in GPU_CLAIM_CLASSES)


def gpu_classes(device_classes: list[dict]) -> list[str]:
    """The DeviceClasses that serve `nvidia.com/gpu` as an extended resource, by name."""
    return sorted(c["metadata"]["name"] for c in device_classes
                  if (c.get("spec") or {}).get("extendedResourceName") == GPU_RESOURCE)

GPU_DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver: its ResourceSlices and claim results name it
GPU_CLASS = "gpu.nvidia.com"  # the DeviceClass the driver's chart installs for whole GPUs


def gpu_claim_template(name: str, namespace: str, labels: dict, gpus: int = 1) -> dict:
    """A ResourceClaimTemplate for `gpus` whole GPUs of NVIDIA's DRA driver, as a user writes one."""
    request = {"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS, "allocationMode": "ExactCount",
                                          "count": gpus}}
    return {"apiVersion": API_VERSION, "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": {"spec": {"devices": {"requests": [request]}}}}


def _count(value) -> int:
    """A whole-number quantity such as nvidia.com/gpu's ('8'); absent is 0."""
    return int(float(str(value))) if value not in (None, "") else 0


def gpu_devices_by_node(slices: list[dict]) -> dict[str, int]:
    """Whole GPUs (devices of type gpu) NVIDIA's DRA driver publishes per node. A pool may span several slices; its
    newest generation counts (older slices are being replaced)."""
    newest: dict[tuple[str, str], int] = {}
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") == GPU_DRIVER and spec.get("nodeName"):
            key = (spec["nodeName"], (spec.get("pool") or {}).get("name", ""))
            newest[key] = max(newest.get(key, 0), int((spec.get("pool") or {}).get("generation", 0)))
    counts: dict[str, int] = {}
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != GPU_DRIVER or not spec.get("nodeName"):
            continue
        pool = spec.get("pool") or {}
        if int(pool.get("generation", 0)) != newest[(spec["nodeName"], pool.get("name", ""))]:
            continue
        gpus = sum(1 for device in spec.get("devices") or []
                   if ((device.get("attributes") or {}).get("type") or {}).get("string", "gpu") == "gpu")
        counts[spec["nodeName"]] = counts.get(spec["nodeName"], 0) + gpus
    return counts


def claim_gpus(claim: dict) -> int:
    """Devices of NVIDIA's DRA driver allocated to a claim (a MIG device counts as one)."""
    results = ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")) or []
    return sum(1 for result in results if result.get("driver") == GPU_DRIVER)


def served_twice(nodes: list[dict], slices: list[dict]) -> list[str]:
    """Nodes whose GPUs both the device plugin (nvidia.com/gpu capacity) and NVIDIA's DRA driver (ResourceSlices)
    serve: neither knows what the other handed out, so the same GPU can go to two pods."""
    published = gpu_devices_by_node(slices)
    return sorted(n["metadata"]["name"] for n in nodes if published.get(n["metadata"]["name"])
                  and _count(((n.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)))


def claim_names(pod: dict) -> set[str]:
    """The ResourceClaims a pod uses: named in spec.resourceClaims, or made from a template (status names those)."""
    named = {entry["resourceClaimName"] for entry in (pod.get("spec") or {}).get("resourceClaims") or []
             if entry.get("resourceClaimName")}
    made = {entry["resourceClaimName"] for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or []
            if entry.get("resourceClaimName")}
    return named | made


def as_device_plugin(nodes: list[dict], pods: list[dict], slices: list[dict], claims: list[dict]
                     ) -> tuple[list[dict], list[dict]]:
    """Nodes and pods as if the DRA-served GPUs were device-plugin capacity, so that `status` and `simulate` count
    both kinds of node alike: a node that advertises no nvidia.com/gpu gets its published GPUs as capacity, and a
    pod's own claims (claim_names) add their allocated GPUs to its first container's request. A pod that
    asks nvidia.com/gpu as an extended resource already says so in its requests (its claim, named in
    status.extendedResourceClaimStatus, is not counted again). Copies: the inputs are not changed."""
    import copy
    published = gpu_devices_by_node(slices)
    by_name = {(c["metadata"].get("namespace"), c["metadata"]["name"]): c for c in claims}
    viewed_nodes = []
    for node in nodes:
        count = published.get(node["metadata"]["name"])
        status = node.get("status") or {}
        if count and not _count((status.get("allocatable") or {}).get(GPU_RESOURCE)):
            node = copy.deepcopy(node)
            for field in ("capacity", "allocatable"):
                node.setdefault("status", {}).setdefault(field, {})[GPU_RESOURCE] = str(count)
        viewed_nodes.append(node)
    viewed_pods = []
    for pod in pods:
        pod = as_gpu_requests(pod)
        namespace = pod["metadata"].get("namespace")
        gpus = sum(claim_gpus(by_name[(namespace, name)]) for name in claim_names(pod) if (namespace, name) in by_name)
        containers = (pod.get("spec") or {}).get("containers") or []
        if gpus and containers:
            pod = copy.deepcopy(pod)
            resources = pod["spec"]["containers"][0].setdefault("resources", {})
            for field in ("requests", "limits"):
                have = _count((resources.get(field) or {}).get(GPU_RESOURCE))
                resources.setdefault(field, {})[GPU_RESOURCE] = str(have + gpus)
        viewed_pods.append(pod)
    return viewed_nodes, viewed_pods


def as_gpu_requests(pod: dict) -> dict:
    """A pod asking for GPUs by a class's implicit extended resource name (IMPLICIT_GPU_RESOURCES) as one asking
    for that many nvidia.com/gpu (a MIG device counts as one, as claim_gpus counts it): a copy when it changes."""
    spec = pod.get("spec") or {}
    lists = [c for kind in ("containers", "initContainers") for c in spec.get(kind) or []]
    if not any(name in IMPLICIT_GPU_RESOURCES for c in lists for section in ("limits", "requests")
               for name in ((c.get("resources") or {}).get(section) or {})):
        return pod
    import copy
    pod = copy.deepcopy(pod)
    for kind in ("containers", "initContainers"):
        for container in pod["spec"].get(kind) or []:
            for section in ("limits", "requests"):
                asked = (container.get("resources") or {}).get(section) or {}
                implicit = sum(_count(asked.pop(name)) for name in IMPLICIT_GPU_RESOURCES if name in asked)
                if implicit:
                    asked[GPU_RESOURCE] = str(_count(asked.get(GPU_RESOURCE)) + implicit)
    return pod


def counted(kube, nodes: list[dict], pods: list[dict], notes: list[str]) -> tuple[list[dict], list[dict]]:
    """GPUs that NVIDIA's DRA driver serves, counted like device-plugin GPUs (as_device_plugin): two more
    lists where the cluster serves resource.k8s.io/v1. Unreadable, they are a note, never "no DRA GPUs"."""
    from gpu_bootstrap.core.errors import ClusterError, Unreachable
    from gpu_bootstrap.core.objects import served
    try:
        if not served(kube, API_VERSION, "ResourceSlice"):
            return nodes, pods
        slices = kube.list(API_VERSION, "ResourceSlice")
        claims = kube.list(API_VERSION, "ResourceClaim")
    except Unreachable:
        raise
    except ClusterError as error:
        notes.append(f"DRA ResourceSlices and ResourceClaims could not be read ({error.message}): GPUs served through "
                     f"DRA are not counted, and nodes that have only those show none")
        return nodes, pods
    if twice := served_twice(nodes, slices):
        notes.append(f"{len(twice)} node(s) serve their GPUs through the device plugin and NVIDIA's DRA driver at once "
                     f"({', '.join(twice[:5])}{', ...' if len(twice) > 5 else ''}): neither knows what the other "
                     f"handed out, so one GPU can go to two pods; turn one off on those nodes (the figures count the "
                     f"device plugin's)")
    return as_device_plugin(nodes, pods, slices, claims)
