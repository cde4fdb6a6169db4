"""The real Karpenter on the local cluster: its core controllers with the KWOK cloud provider (sigs.k8s.io/karpenter
v1.14.1, built by scripts/install-test-tools), run out of cluster against the local API server.

What a cloud would be comes from INSTANCE_TYPES, written to the file the provider reads (INSTANCE_TYPES_FILE_PATH):
GPU instance types with `nvidia.com/gpu` capacity whose offerings carry the labels a GPU node arrives with on a cloud
(the provider copies an offering's single-valued requirements onto the node it makes):

* the instance's GPU count, name and maker under kwok.gpu-bootstrap.io/ (as karpenter.k8s.aws/instance-gpu-* on
  AWS: what a NodePool's requirements select on; render/gpu_pools.py's KWOK requirements name them; Karpenter's
  NodePool CRD refuses requirements on other keys of the provider's own karpenter.kwok.sh/);
* what NFD and NVIDIA's GPU feature discovery would write once the node runs (nvidia.com/gpu.product and .count,
  the PCI vendor label), which no process can write on a KWOK node.

Every type carries the GPU keys (a CPU type with a count of 0): a requirement on a key that a type does not define
would match it. The provider makes each node with the annotation KWOK manages (kwok.x-k8s.io/node=fake), so the
local cluster's KWOK makes it Ready and plays its pods; its allocatable is the type's, its capacity what the
NodeClaim asked for (the provider's own choice), so schedulers see the type's GPUs.

Karpenter's CRDs (NodePool, NodeClaim, NodeOverlay, CapacityBuffer, and the KWOKNodeClass the chart lacks) are
applied as the platform team's install would; gpu-bootstrap's gpu-pools step then finds Karpenter's API served.
"""
from __future__ import annotations

import json
from pathlib import Path

ZONES = ("zone-a", "zone-b")
GPU_DOMAIN = "kwok.gpu-bootstrap.io"  # render/gpu_pools.py KWOK_GPU_LABELS: what a KWOK pool's requirements name
GPU_KEYS = (f"{GPU_DOMAIN}/instance-gpu-count", f"{GPU_DOMAIN}/instance-gpu-name",
            f"{GPU_DOMAIN}/instance-gpu-manufacturer")
# name, vCPUs, memory, GPUs, Karpenter's GPU name, the product label NVIDIA's feature discovery writes, on-demand price
TYPES = (
    ("gpu-h100-8x", "192", "2048Gi", 8, "h100", "NVIDIA-H100-80GB-HBM3", 98.32),
    ("gpu-l4-4x", "48", "192Gi", 4, "l4", "NVIDIA-L4", 4.60),
    ("gpu-l4-1x", "8", "32Gi", 1, "l4", "NVIDIA-L4", 0.98),
    ("cpu-16x", "16", "64Gi", 0, "none", None, 0.68),
)


def _requirement(key: str, value: str) -> dict:
    return {"key": key, "operator": "In", "values": [value]}


def instance_type(name: str, cpu: str, memory: str, gpus: int, gpu_name: str, product: str | None,
                  price: float) -> dict:
    labels = {GPU_KEYS[0]: str(gpus), GPU_KEYS[1]: gpu_name, GPU_KEYS[2]: "nvidia" if gpus else "none"}
    if gpus:
        labels.update({"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus),
                       "feature.node.kubernetes.io/pci-10de.present": "true"})
    offerings = []
    for zone in ZONES:
        for capacity_type, share in (("on-demand", 1.0), ("spot", 0.4)):
            requirements = [_requirement("karpenter.sh/capacity-type", capacity_type),
                            _requirement("topology.kubernetes.io/zone", zone)]
            requirements += [_requirement(key, value) for key, value in labels.items()]
            offerings.append({"Price": round(price * share, 4), "Available": True, "Requirements": requirements})
    resources = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "500Gi"}
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)
    return {"name": name, "offerings": offerings, "architecture": "amd64", "operatingSystems": ["linux"],
            "resources": resources}


def instance_types() -> list[dict]:
    return [instance_type(*row) for row in TYPES]


def write_instance_types(folder: Path) -> Path:
    path = folder / "karpenter-instance-types.json"
    path.write_text(json.dumps(instance_types(), indent=1))
    return path


def crd_documents(crds: Path) -> list[dict]:
    import yaml
    documents = []
    for path in sorted(crds.glob("*.yaml")):
        documents += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return documents


def command(binary: Path, ports: dict) -> list[str]:
    """Karpenter's flags out of cluster: its own ports (8080 and 8081 by default, which other components take), no
    leader election (one replica; in cluster it would take a Lease in its pod's namespace), short batches so that
    a test's burst of pods is one decision, and the debug log (which says why a pod fits no instance type)."""
    return [str(binary), f"--metrics-port={ports['karpenter-metrics']}",
            f"--health-probe-port={ports['karpenter-health']}", "--disable-leader-election",
            "--batch-idle-duration=1s", "--batch-max-duration=5s", "--log-level=debug"]


def environment(base: dict, kubeconfig: Path, types: Path) -> dict:
    return {**base, "KUBECONFIG": str(kubeconfig), "INSTANCE_TYPES_FILE_PATH": str(types),
            "SYSTEM_NAMESPACE": "kube-system"}
