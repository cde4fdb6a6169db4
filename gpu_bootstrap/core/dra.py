"""GPUs served through Dynamic Resource Allocation: what the objects of resource.k8s.io/v1 say about them. Pure.

A DeviceClass with `spec.extendedResourceName: nvidia.com/gpu` (KEP-5004: beta in 1.36, GA in 1.37) lets a pod that
asks for `nvidia.com/gpu` as users write it be served by a DRA driver (NVIDIA's publishes the class `gpu.nvidia.com`
with it) on nodes that advertise no such capacity; kube-scheduler allocates the devices and writes the claim.
"""
from __future__ import annotations

API_VERSION = "resource.k8s.io/v1"
GPU_RESOURCE = "nvidia.com/gpu"


def gpu_classes(device_classes: list[dict]) -> list[str]:
    """The DeviceClasses that serve `nvidia.com/gpu` as an extended resource, by name."""
    return sorted(c["metadata"]["name"] for c in device_classes
                  if (c.get("spec") or {}).get("extendedResourceName") == GPU_RESOURCE)
