"""Karpenter v1 NodePool and its node class per configured GPU pool. Pure: config in, manifests out.

One NodePool rendering for every cloud: the node class (an EC2NodeClass on AWS, a KWOKNodeClass for Karpenter's KWOK
provider) and the instance labels its requirements select on (karpenter.k8s.aws/instance-gpu-* on AWS; on KWOK
kwok.gpu-bootstrap.io/instance-gpu-* and karpenter.kwok.sh/instance-family: CLOUDS) are the only per-cloud parts.

The node template carries exactly the taint and labels node-prep puts on GPU nodes (`node_prep.labels_and_taint`, the one
source of both), so a node Karpenter launches arrives prepared, before any pod can land on it, with no SSH.
Disruption never consolidates a node that runs pods: only empty nodes go (WhenEmpty, after consolidateAfter), and
budgets cap how many go at once.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpu_bootstrap.render import node_prep

NODEPOOL_GROUP = "karpenter.sh"
API_VERSION = "v1"  # the only Karpenter API whose fields these manifests use (Karpenter >= 1.0)


@dataclass(frozen=True)
class Cloud:
    """What differs per Karpenter provider: the node class's API and kind, and the domains of the instance labels a
    NodePool's requirements select on (instance-gpu-count, -gpu-manufacturer, -gpu-name; instance-family)."""
    group: str
    version: str
    kind: str
    gpu_labels: str  # the domain of instance-gpu-count, -gpu-manufacturer, -gpu-name
    family_label: str  # the domain of instance-family

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def resource(self) -> str:
        return self.kind.lower() + "es"


# The KWOK provider labels its nodes with karpenter.kwok.sh/instance-family (-cpu, -memory, -size) but knows no GPU:
# its instance types carry whatever labels their offerings name, and Karpenter's NodePool CRD refuses requirements on
# any other key of karpenter.kwok.sh/. So the GPU labels of KWOK instance types are gpu-bootstrap's own domain, named
# as AWS names them (tests/localcluster/karpenter.py writes such instance types; docs/steps/gpu-pools.md the format).
KWOK_GPU_LABELS = "kwok.gpu-bootstrap.io"
CLOUDS = {
    "aws": Cloud("karpenter.k8s.aws", "v1", "EC2NodeClass", "karpenter.k8s.aws", "karpenter.k8s.aws"),
    "kwok": Cloud("karpenter.kwok.sh", "v1alpha1", "KWOKNodeClass", KWOK_GPU_LABELS, "karpenter.kwok.sh"),
}
NODECLASS_GROUP = CLOUDS["aws"].group  # the documented cloud
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


def kinds(api_version: str = API_VERSION, cloud: str = "aws") -> tuple[tuple[str, str], tuple[str, str]]:
    """(apiVersion, kind) of a cloud's node class and of the node pool, in apply order (`api_version`: Karpenter's
    own, of the NodePool and the EC2NodeClass; the KWOKNodeClass has one of its own)."""
    node_class_api = f"{CLOUDS[cloud].group}/{api_version}" if cloud == "aws" else CLOUDS[cloud].api_version
    return (node_class_api, CLOUDS[cloud].kind), (f"{NODEPOOL_GROUP}/{api_version}", "NodePool")


def clouds_of(config) -> list[str]:
    """The clouds the configured pools use, in CLOUDS' order."""
    used = {pool.cloud for pool in config.pools}
    return [cloud for cloud in CLOUDS if cloud in used]


def template_labels(pool, node_prep_section) -> dict[str, str]:
    """The labels a node launched from `pool` starts with: node-prep's, and the operands its image makes redundant."""
    labels, _ = node_prep.labels_and_taint(node_prep_section)
    return {**labels, **IMAGE_OPERAND_LABELS[pool.ami_family]}


def node_class(pool) -> dict:
    cloud = CLOUDS[pool.cloud]
    if pool.cloud == "kwok":  # the KWOK provider's class has no fields (its instance types come from a file)
        return {"apiVersion": cloud.api_version, "kind": cloud.kind,
                "metadata": {"name": pool.name, "labels": dict(MANAGED)}, "spec": {}}
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
    wanted, cloud = pool.requirements, CLOUDS[pool.cloud]
    domain = cloud.gpu_labels
    found = [
        {"key": f"{domain}/instance-gpu-count", "operator": "Gt", "values": [str(wanted.gpu_count - 1)]},
        {"key": f"{domain}/instance-gpu-manufacturer", "operator": "In", "values": ["nvidia"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": list(wanted.capacity_types)},
        {"key": "kubernetes.io/arch", "operator": "In", "values": list(wanted.architectures)},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
    ]
    if wanted.instance_families:
        found.append({"key": f"{cloud.family_label}/instance-family", "operator": "In",
                      "values": list(wanted.instance_families)})
    if wanted.gpu_names:
        found.append({"key": f"{domain}/instance-gpu-name", "operator": "In", "values": list(wanted.gpu_names)})
    return found


def node_pool(pool, node_prep_section) -> dict:
    _, taint = node_prep.labels_and_taint(node_prep_section)
    template_spec = {
        "nodeClassRef": {"group": CLOUDS[pool.cloud].group, "kind": CLOUDS[pool.cloud].kind, "name": pool.name},
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
    """Every pool's node class then NodePool (a NodePool names its class, which should exist first)."""
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
             f"AMI {pool.ami_family}@{pool.ami_version}  ← its NVIDIA variant on GPU instance types"
             if pool.cloud == "aws" else f"KWOKNodeClass  ← simulated nodes standing for {pool.ami_family}'s NVIDIA "
                                         f"image (Karpenter's KWOK provider)",
             f"{', '.join(f'{k}=false' for k in IMAGE_OPERAND_LABELS[pool.ami_family])}  ← "
             f"{IMAGE_REASON[pool.ami_family]}: the gpu-operator skips those operands on these nodes"]
    return lines
