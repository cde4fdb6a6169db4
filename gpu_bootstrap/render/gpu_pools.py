"""Karpenter v1 NodePool and EC2NodeClass per configured GPU pool. Pure: config in, manifests out.

The node template carries exactly the taint and labels node-prep puts on GPU nodes (`node_prep.labels_and_taint`, the one
source of both), so a node Karpenter launches arrives prepared, before any pod can land on it, with no SSH.
Disruption never consolidates a node that runs pods: only empty nodes go (WhenEmpty, after consolidateAfter), and
budgets cap how many go at once.
"""
from __future__ import annotations

from gpu_bootstrap.render import node_prep

NODEPOOL_GROUP = "karpenter.sh"
NODECLASS_GROUP = "karpenter.k8s.aws"
API_VERSION = "v1"  # the only Karpenter API whose fields these manifests use (Karpenter >= 1.0)
COMPONENT = "gpu-pools"
MANAGED = {"app.kubernetes.io/managed-by": "gpu-bootstrap", "app.kubernetes.io/component": COMPONENT}
OWNED_SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED.items())
# The EKS AMIs pick their NVIDIA variant for GPU instance types; these are the devices each family mounts.
ROOT_DEVICE = {"al2023": "/dev/xvda", "bottlerocket": "/dev/xvdb"}  # Bottlerocket: its data volume holds images

# Both images ship the NVIDIA driver and containerd set up with the NVIDIA runtime; Bottlerocket's NVIDIA variants
# also run their own device plugin (bottlerocket-os/bottlerocket#4309). The gpu-operator must not deploy its own of
# those there: it skips an operand on every node labelled nvidia.com/gpu.deploy.<operand>=false, so a pool's node
# template carries these labels, whatever the operator's values do on the other GPU nodes.
IMAGE_OPERAND_LABELS = {
    "al2023": {"nvidia.com/gpu.deploy.driver": "false", "nvidia.com/gpu.deploy.container-toolkit": "false"},
    "bottlerocket": {"nvidia.com/gpu.deploy.driver": "false", "nvidia.com/gpu.deploy.container-toolkit": "false",
                     "nvidia.com/gpu.deploy.device-plugin": "false"},
}
IMAGE_REASON = {
    "al2023": "the EKS AL2023 NVIDIA AMI ships the driver and the NVIDIA container runtime",
    "bottlerocket": "Bottlerocket's NVIDIA variant ships its own driver, runtime hook and device plugin "
                    "(bottlerocket #4309)",
}


def kinds(api_version: str = API_VERSION) -> tuple[tuple[str, str], tuple[str, str]]:
    """(apiVersion, kind) of the node class and the node pool, in apply order."""
    return (f"{NODECLASS_GROUP}/{api_version}", "EC2NodeClass"), (f"{NODEPOOL_GROUP}/{api_version}", "NodePool")


def template_labels(pool, node_prep_section) -> dict[str, str]:
    """The labels a node launched from `pool` starts with: node-prep's, and the operands its image makes redundant."""
    labels, _ = node_prep.labels_and_taint(node_prep_section)
    return {**labels, **IMAGE_OPERAND_LABELS[pool.ami_family]}


def node_class(pool) -> dict:
    discovery = [{"tags": {"karpenter.sh/discovery": pool.discovery_tag}}]
    return {
        "apiVersion": f"{NODECLASS_GROUP}/{API_VERSION}", "kind": "EC2NodeClass",
        "metadata": {"name": pool.name, "labels": dict(MANAGED)},
        "spec": {
            "role": pool.role,
            "amiSelectorTerms": [{"alias": f"{pool.ami_family}@{pool.ami_version}"}],
            "subnetSelectorTerms": discovery,
            "securityGroupSelectorTerms": discovery,
            "blockDeviceMappings": [{"deviceName": ROOT_DEVICE[pool.ami_family],
                                     "ebs": {"volumeSize": pool.volume_size, "volumeType": "gp3",
                                             "encrypted": True, "deleteOnTermination": True}}],
            "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1},  # pods cannot reach IMDS
            "tags": {"app.kubernetes.io/managed-by": "gpu-bootstrap"},
        },
    }


def requirements(pool) -> list[dict]:
    wanted = pool.requirements
    found = [
        {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Gt", "values": [str(wanted.gpu_count - 1)]},
        {"key": "karpenter.k8s.aws/instance-gpu-manufacturer", "operator": "In", "values": ["nvidia"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": list(wanted.capacity_types)},
        {"key": "kubernetes.io/arch", "operator": "In", "values": list(wanted.architectures)},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
    ]
    if wanted.instance_families:
        found.append({"key": "karpenter.k8s.aws/instance-family", "operator": "In",
                      "values": list(wanted.instance_families)})
    if wanted.gpu_names:
        found.append({"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": list(wanted.gpu_names)})
    return found


def node_pool(pool, node_prep_section) -> dict:
    _, taint = node_prep.labels_and_taint(node_prep_section)
    template_spec = {
        "nodeClassRef": {"group": NODECLASS_GROUP, "kind": "EC2NodeClass", "name": pool.name},
        "requirements": requirements(pool),
        "expireAfter": pool.expire_after,
    }
    if taint is not None:
        template_spec["taints"] = [dict(taint)]
    spec = {
        "template": {"metadata": {"labels": template_labels(pool, node_prep_section)}, "spec": template_spec},
        "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": pool.disruption.consolidate_after,
                       "budgets": [budget.model_dump(exclude_none=True) for budget in pool.disruption.budgets]},
        "limits": dict(pool.limits),
    }
    if pool.weight is not None:
        spec["weight"] = pool.weight
    return {"apiVersion": f"{NODEPOOL_GROUP}/{API_VERSION}", "kind": "NodePool",
            "metadata": {"name": pool.name, "labels": dict(MANAGED)}, "spec": spec}


def manifests(config) -> list[dict]:
    """Every pool's EC2NodeClass then NodePool (a NodePool names its class, which should exist first)."""
    out = []
    for pool in config.pools:
        out += [node_class(pool), node_pool(pool, config.node_prep)]
    return out


def explain(pool, node_prep_section) -> list[str]:
    """One line per choice the plan shows under a pool's NodePool."""
    labels = template_labels(pool, node_prep_section)
    _, taint = node_prep.labels_and_taint(node_prep_section)
    lines = [f"template labels {', '.join(f'{k}={v}' for k, v in labels.items())}  ← node-prep's labels, and the "
             f"gpu-operator operands the image makes redundant",
             f"template taint {node_prep.describe_taint(taint)}  ← node-prep's taint: ordinary pods stay off",
             f"disruption WhenEmpty after {pool.disruption.consolidate_after}  ← a node running GPU pods is never "
             f"consolidated",
             f"AMI {pool.ami_family}@{pool.ami_version}  ← its NVIDIA variant on GPU instance types",
             f"{', '.join(f'{k}=false' for k in IMAGE_OPERAND_LABELS[pool.ami_family])}  ← "
             f"{IMAGE_REASON[pool.ami_family]}: the gpu-operator skips those operands on these nodes"]
    return lines
