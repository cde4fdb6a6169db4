"""The local cluster's fake nodes, as KWOK takes them: Node objects with capacity, labels and taints.

GPU nodes look as real ones do before gpu-bootstrap touches them (with `dra`, as nodes whose GPUs NVIDIA's DRA driver
serves: no capacity, a ResourceSlice each, dra.py): `nvidia.com/gpu` capacity and NFD's PCI label
(what the gpu-operator's device plugin and node-feature-discovery would have put there), an A100's product label,
and on the second node the taint a managed GPU pool already carries (GKE, AKS: `nvidia.com/gpu=present:NoSchedule`),
so node-prep meets both a bare and a pre-tainted node. CPU nodes carry nothing of the kind.

Each node gets its own pod CIDR (a /24 of the cluster's network) and a distinct InternalIP in the network's first
/24: KWOK gives pods addresses from the node's range, and since the whole network is routed to this machine's
loopback device (cluster.py), a process here that listens on a pod's address answers for that pod.
"""
from __future__ import annotations

import ipaddress
import uuid

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT = "NVIDIA-A100-SXM4-80GB"
DRA_PRODUCT = "NVIDIA-H200"  # the GPU whose attributes dra.py's slices carry
# Every node's OS, kernel and runtime, as a kubelet reports them (status.nodeInfo) and NFD labels them: NVIDIA's
# gpu-operator controller reads the runtime from nodeInfo.containerRuntimeVersion (KWOK's default, "kwok-<version>",
# names none) and the OS of its driver image from NFD's labels (NFD cannot run on KWOK's nodes)
OS_ID, OS_VERSION, KERNEL, RUNTIME = "ubuntu", "22.04", "5.15.0-131-generic", "containerd://1.7.27"
NFD_OS_LABELS = {"feature.node.kubernetes.io/system-os_release.ID": OS_ID,
                 "feature.node.kubernetes.io/system-os_release.VERSION_ID": OS_VERSION,
                 "feature.node.kubernetes.io/kernel-version.full": KERNEL}
PRE_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
# Names a test may give the nodes it adds with a file tree (probe_kubelet.py runs their pods, not KWOK): fixed,
# because KWOK reads its Stages once, at its start
TREE_NODES = ("tree-1", "tree-2", "tree-3")
# Nodes a benchmark adds by the thousand (benchmarks/incluster_probe.py --real) and whose pods it answers itself with
# canned probe results: KWOK keeps them Ready but leaves their pods alone, as for the tree nodes
FLEET_PREFIX = "fleet-"


def layout(gpu_nodes: int, gpus_per_node: int, cpu_nodes: int, dra: bool = False) -> dict:
    """`dra`: the GPU nodes' GPUs are served by NVIDIA's DRA driver (ResourceSlices, dra.py), not the device plugin:
    no `nvidia.com/gpu` capacity."""
    nodes = {}
    for index in range(gpu_nodes):
        nodes[f"gpu-{index + 1}"] = {"gpus": gpus_per_node, "cpu": "32", "memory": "256Gi",
                                     "tainted": index == 1, **({"dra": True} if dra else {})}
    for index in range(cpu_nodes):
        nodes[f"cpu-{index + 1}"] = {"gpus": 0, "cpu": "16", "memory": "64Gi", "tainted": False}
    return nodes


def addresses(nodes: dict, network: str) -> list[str]:
    base = ipaddress.ip_network(network).network_address
    return [str(base + 10 + index) for index in range(len(nodes))]


def pod_cidr(network: str, index: int) -> str:
    """The node's /24: the network's second, third, ... (the first holds the nodes' own addresses)."""
    return str(list(ipaddress.ip_network(network).subnets(new_prefix=24))[index + 1])


def objects(nodes: dict, network: str) -> list[dict]:
    found = []
    for index, (name, spec) in enumerate(sorted(nodes.items())):
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "type": "kwok", **NFD_OS_LABELS}
        capacity = {"cpu": spec["cpu"], "memory": spec["memory"], "pods": "110", "ephemeral-storage": "500Gi"}
        if spec["gpus"]:
            labels.update({"feature.node.kubernetes.io/pci-10de.present": "true",
                           "nvidia.com/gpu.product": DRA_PRODUCT if spec.get("dra") else GPU_PRODUCT,
                           "nvidia.com/gpu.count": str(spec["gpus"])})
            if not spec.get("dra"):  # a DRA node publishes its GPUs as ResourceSlices instead (dra.py)
                capacity[GPU_RESOURCE] = str(spec["gpus"])
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
                "spec": {"podCIDR": pod_cidr(network, index), "podCIDRs": [pod_cidr(network, index)]},
                "status": {"capacity": capacity, "allocatable": dict(capacity), "nodeInfo": node_info(name),
                           "addresses": [{"type": "InternalIP", "address": addresses(nodes, network)[index]},
                                         {"type": "Hostname", "address": name}]}}
        if spec.get("tainted"):
            node["spec"]["taints"] = [dict(PRE_TAINT)]
        found.append(node)
    return found


def node_info(name: str) -> dict:
    """What a kubelet reports of its machine and boot (KWOK's node-initialize Stage keeps what is there): a machine
    ID per name, a boot ID per start (gpu-bootstrap binds recorded node facts to both)."""
    return {"machineID": uuid.uuid5(uuid.NAMESPACE_DNS, name).hex, "bootID": str(uuid.uuid4()),
            "containerRuntimeVersion": RUNTIME, "kernelVersion": KERNEL, "osImage": "Ubuntu 22.04.5 LTS",
            "operatingSystem": "linux", "architecture": "amd64"}


def tree_node(name: str, gpus: int, address: str, pods: int = 110) -> dict:
    """A GPU node a test adds to a running local cluster, named from TREE_NODES: KWOK keeps it Ready and the
    agent's kubelet stand-in runs its pods against the file tree the test names in node-trees.json."""
    assert name in TREE_NODES, f"{name}: KWOK runs the pods of nodes not in {TREE_NODES}"
    capacity = {"cpu": "32", "memory": "256Gi", "pods": str(pods), "ephemeral-storage": "500Gi",
                GPU_RESOURCE: str(gpus)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {KWOK_ANNOTATION: "fake"},
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                    "kubernetes.io/arch": "amd64", "type": "kwok", **NFD_OS_LABELS,
                                    "feature.node.kubernetes.io/pci-10de.present": "true",
                                    "nvidia.com/gpu.count": str(gpus)}},
            "status": {"capacity": capacity, "allocatable": dict(capacity), "nodeInfo": node_info(name),
                       "addresses": [{"type": "InternalIP", "address": address},
                                     {"type": "Hostname", "address": name}]}}
