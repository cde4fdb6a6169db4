"""DRA objects as NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu v0.5.0) publishes them, for nodes that
have no kubelet: its `gpu.nvidia.com` DeviceClass (deployments/helm/.../templates/deviceclass-gpu.yaml, with
`extendedResourceName: nvidia.com/gpu` as the chart sets it where resource.k8s.io/v1 is served) and one
ResourceSlice per node with the attributes of cmd/gpu-kubelet-plugin/deviceinfo.go (GpuInfo.Attributes, devices
named gpu-<minor>). The device values are a real H200's, as our probe read it (../shared/fixtures/real-nodes/).

Fake by necessity: no GPU and no kubelet plugin can run here, so the slices are written by hand as KWOK's DRA example
does; everything that reads them (the API server, kube-scheduler's DynamicResources plugin, gpu-bootstrap) is real.
"""
from __future__ import annotations

import hashlib

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
EXTENDED_RESOURCE = "nvidia.com/gpu"
H200 = {"productName": "NVIDIA H200", "brand": "Nvidia", "architecture": "Hopper", "cudaComputeCapability": "9.0.0",
        "driverVersion": "580.159.4", "cudaDriverVersion": "13.0.0", "memory_mib": 143771}


def device_class(extended: bool = True) -> dict:
    spec = {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}' && "
                                                 f"device.attributes['{DRIVER}'].type == 'gpu'"}}]}
    if extended:
        spec["extendedResourceName"] = EXTENDED_RESOURCE
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": GPU_CLASS}, "spec": spec}


def gpu_device(node: str, minor: int, gpu: dict = H200) -> dict:
    digest = hashlib.sha256(f"{node}/{minor}".encode()).hexdigest()
    uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    return {"name": f"gpu-{minor}", "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": uuid}, "productName": {"string": gpu["productName"]},
        "brand": {"string": gpu["brand"]}, "architecture": {"string": gpu["architecture"]},
        "cudaComputeCapability": {"version": gpu["cudaComputeCapability"]},
        "driverVersion": {"version": gpu["driverVersion"]}, "cudaDriverVersion": {"version": gpu["cudaDriverVersion"]},
        "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + minor * 0x10:02x}:00.0"}},
        "capacity": {"memory": {"value": f"{gpu['memory_mib']}Mi"}}}


def resource_slice(node: str, gpus: int, gpu: dict = H200) -> dict:
    """The slice the driver's kubelet plugin publishes for `node`: one pool named after the node."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                   "resourceSliceCount": 1},
                     "devices": [gpu_device(node, minor, gpu) for minor in range(gpus)]}}
