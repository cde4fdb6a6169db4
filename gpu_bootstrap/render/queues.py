"""Pure rendering for the queues step: teams (the config's `queues` section) and the GPU nodes preflight found ->
Kueue's objects (ResourceFlavors, one ClusterQueue per team in one cohort, LocalQueues, WorkloadPriorityClasses) and
the values of Kueue's chart (its Configuration).

The resources are split in two groups, as Kueue's own examples for accelerators do: cpu and memory in a flavor that
selects no node, nvidia.com/gpu in GPU flavors that select GPU nodes. So a team's CPU-only workload is counted in
its queue without being sent to GPU nodes, and a GPU workload is sent to the GPU nodes its flavor names (Kueue adds
the flavor's node labels to the pods it admits).
* A team whose quota is a number takes the flavor of every GPU node (node-prep's GPU label).
* A team whose quota is per product takes one flavor per product, selecting GFD's nvidia.com/gpu.product label.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import yaml

from gpu_bootstrap.core.dra import GPU_CLASS, IMPLICIT_PREFIX

API = "kueue.x-k8s.io/v1beta2"
CONFIG_API = "config.kueue.x-k8s.io/v1beta2"
KINDS = ("ResourceFlavor", "WorkloadPriorityClass", "ClusterQueue", "LocalQueue")  # the order they are applied in
GPU = "nvidia.com/gpu"
MANAGED = {"app.kubernetes.io/managed-by": "gpu-bootstrap", "app.kubernetes.io/component": "queues"}
OWNED_SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED.items())
PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU feature discovery's (the gpu-operator runs it)
ANY_GPU_FLAVOR = "gpu-bootstrap-gpu"
CPU_FLAVOR = "gpu-bootstrap-cpu"
# cpu and memory are covered (Kueue admits only what a queue covers) but not limited unless a team sets them
UNLIMITED = {"cpu": "100k", "memory": "1Ei"}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# The workloads Kueue manages: Jobs and plain pods first; the others are used where their CRDs are installed
FRAMEWORKS = ("batch/job", "pod", "jobset.x-k8s.io/jobset", "kubeflow.org/pytorchjob", "kubeflow.org/mpijob",
              "trainer.kubeflow.org/trainjob", "ray.io/rayjob", "ray.io/raycluster",
              "leaderworkerset.x-k8s.io/leaderworkerset")
IMAGE = "registry.k8s.io/kueue/kueue"
# gpu_operator.allocation: dra. Kueue counts DRA devices only with its DynamicResourceAllocation gate (alpha in 0.17,
# off by default): a claim from a ResourceClaimTemplate of a mapped DeviceClass counts as the mapping's resource. With
# DRAExtendedResources too (alpha in 0.17; it needs the first), a pod asking for nvidia.com/gpu that a DeviceClass's
# spec.extendedResourceName serves (KEP-5004) is resolved through that class, so both ways count against the same
# nvidia.com/gpu quota.
DRA_GATES = ("DynamicResourceAllocation", "DRAExtendedResources")
DRA_GPU_CLASSES = (GPU_CLASS,)  # whole GPUs; MIG slices and VFIO GPUs are not one nvidia.com/gpu each
# DRAExtendedResources resolves a class's spec.extendedResourceName only, not the name every class has implicitly
# (KEP-5004's deviceclass.resource.kubernetes.io/<class>): a resource transformation counts that one as GPUs too,
# where it would otherwise be a resource no queue covers (and its workloads never admitted)
DRA_IMPLICIT_GPU = tuple(IMPLICIT_PREFIX + name for name in DRA_GPU_CLASSES)


@dataclass(frozen=True)
class GpuNode:
    name: str
    products: tuple[str, ...]  # as preflight read them (nvidia-smi's names), one per GPU
    gpus: int | None  # what the node offers (allocatable nvidia.com/gpu), None: not read


@dataclass
class Rendered:
    objects: list[dict]
    values: dict
    warnings: list[str] = field(default_factory=list)
    explained: list[str] = field(default_factory=list)  # what each team setting became, one line each


def product_flavor(product: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'gpu-bootstrap-nvidia-h100-80gb-hbm3' (a ResourceFlavor name)."""
    slug = re.sub(r"[^a-z0-9]+", "-", product.lower()).strip("-")
    return f"{ANY_GPU_FLAVOR}-{slug}"[:63].rstrip("-")


def product_label(product: str) -> str:
    """The value GPU feature discovery gives nvidia.com/gpu.product: the name with its spaces as dashes."""
    return product.strip().replace(" ", "-")


def _meta(name: str, namespace: str | None = None) -> dict:
    meta = {"name": name, "labels": dict(MANAGED)}
    if namespace:
        meta["namespace"] = namespace
    return meta


def flavors(section, gpu_labels: dict[str, str]) -> list[dict]:
    """The ResourceFlavors the teams' quotas use."""
    out = [{"apiVersion": API, "kind": "ResourceFlavor", "metadata": _meta(CPU_FLAVOR), "spec": {}}]
    if any(not isinstance(team.gpus, dict) for team in section.teams):
        out.append({"apiVersion": API, "kind": "ResourceFlavor", "metadata": _meta(ANY_GPU_FLAVOR),
                    "spec": {"nodeLabels": dict(sorted(gpu_labels.items()))}})
    products = sorted({p for team in section.teams if isinstance(team.gpus, dict) for p in team.gpus})
    for product in products:
        out.append({"apiVersion": API, "kind": "ResourceFlavor", "metadata": _meta(product_flavor(product)),
                    "spec": {"nodeLabels": {PRODUCT_LABEL: product_label(product)}}})
    return out


def _gpu_quota(section, team, flavor: str, count: int) -> dict:
    quota = {"name": GPU, "nominalQuota": str(count)}
    if not team.borrow:
        quota["borrowingLimit"] = "0"
    elif team.borrowing_limit is not None:
        quota["borrowingLimit"] = str(team.borrowing_limit)
    if not team.lend:
        quota["lendingLimit"] = "0"
    return {"name": flavor, "resources": [quota]}


def cluster_queue(section, team) -> dict:
    if isinstance(team.gpus, dict):
        gpu_flavors = [_gpu_quota(section, team, product_flavor(p), n) for p, n in sorted(team.gpus.items())]
    else:
        gpu_flavors = [_gpu_quota(section, team, ANY_GPU_FLAVOR, team.gpus)]
    cpu = {"name": CPU_FLAVOR, "resources": [
        {"name": "cpu", "nominalQuota": str(team.cpu or UNLIMITED["cpu"])},
        {"name": "memory", "nominalQuota": str(team.memory or UNLIMITED["memory"])}]}
    spec = {
        "cohortName": section.cohort,
        "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                                    "values": sorted(team.namespaces)}]},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [cpu]},
                           {"coveredResources": [GPU], "flavors": gpu_flavors}],
        "preemption": {"reclaimWithinCohort": "Any" if section.preemption == "reclaim" else "Never",
                       "withinClusterQueue": "LowerPriority"},
    }
    return {"apiVersion": API, "kind": "ClusterQueue", "metadata": _meta(team.name), "spec": spec}


def local_queues(section, team) -> list[dict]:
    return [{"apiVersion": API, "kind": "LocalQueue", "metadata": _meta(section.local_queue, namespace),
             "spec": {"clusterQueue": team.name}} for namespace in sorted(team.namespaces)]


def priority_classes(section) -> list[dict]:
    return [{"apiVersion": API, "kind": "WorkloadPriorityClass", "metadata": _meta(team.name),
             "value": team.priority, "description": f"team {team.name}'s workloads (gpu-bootstrap queues)"}
            for team in section.teams if team.priority is not None]


def namespaces_of(section) -> list[str]:
    return sorted(n for team in section.teams for n in team.namespaces)


def configuration(section, dra: bool = False) -> dict:
    """Kueue's Configuration: the chart's defaults, with the workloads it manages limited to the team namespaces (its
    pod webhook then asks nothing of pods elsewhere), and all-or-nothing admission. `dra`: claims of NVIDIA's GPU
    DeviceClass count as nvidia.com/gpu."""
    config = {
        "apiVersion": CONFIG_API, "kind": "Configuration", "namespace": section.kueue.namespace,
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "controller": {"groupKindConcurrency": {"Job.batch": 5, "Pod": 5, "Workload.kueue.x-k8s.io": 5,
                                                "LocalQueue.kueue.x-k8s.io": 1, "ClusterQueue.kueue.x-k8s.io": 1,
                                                "ResourceFlavor.kueue.x-k8s.io": 1}},
        "clientConnection": {"qps": 50, "burst": 100},
        "manageJobsWithoutQueueName": bool(section.require_queue),
        "managedJobsNamespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces_of(section)}]},
        "integrations": {"frameworks": list(FRAMEWORKS)},
    }
    if section.all_or_nothing:
        # A workload's quota is reserved whole and its pods made at once; one whose pods are not all ready in time is
        # evicted and requeued, releasing its GPUs. blockAdmission (sequential_admission) also keeps the next one out
        # until then, so two gangs never split the free GPUs even where quotas exceed what is free (GPUs used outside
        # the queues, or scattered); it admits one workload at a time cluster-wide (benchmarks/queue_admission.py).
        config["waitForPodsReady"] = {"timeout": section.timeout, "blockAdmission": section.sequential_admission,
                                      "requeuingStrategy": {"timestamp": "Eviction"}}
    if dra:
        config["resources"] = {
            "deviceClassMappings": [{"name": GPU, "deviceClassNames": list(DRA_GPU_CLASSES)}],
            "transformations": [{"input": name, "strategy": "Replace", "outputs": {GPU: "1"}}
                                for name in DRA_IMPLICIT_GPU]}
    return config


def chart_values(section, image: str | None = None, dra: bool = False) -> dict:
    """The values for Kueue's chart: our Configuration, the image (pinned where the catalogue knows its digest), the
    DRA gates in DRA mode, and nothing of the optional parts (visibility API priority, KueueViz, cert-manager,
    Prometheus)."""
    repository, _, tag = (image or f"{IMAGE}:v{section.kueue.version.lstrip('v')}").rpartition(":")
    if "/" in tag:  # a registry port, no tag
        repository, tag = image, f"v{section.kueue.version.lstrip('v')}"
    manager = {"manager": {"image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"}}}
    if dra:
        manager["featureGates"] = [{"name": gate, "enabled": True} for gate in DRA_GATES]
    return {
        "controllerManager": manager,
        "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(configuration(section, dra),
                                                                        sort_keys=False)},
    }


def gpu_supply(nodes: list[GpuNode]) -> tuple[int | None, dict[str, int]]:
    """(GPUs on all GPU nodes, GPUs per product); the total is None when a node's count could not be read."""
    total, per_product = 0, {}
    for node in nodes:
        if node.gpus is None:
            total = None
        elif total is not None:
            total += node.gpus
        for product in set(node.products):
            per_product[product] = per_product.get(product, 0) + (node.gpus or 0)
    return total, per_product


def warnings(section, nodes: list[GpuNode] | None) -> list[str]:
    """Quotas larger than the GPUs found (they can never all be used at once), named with the numbers. None: the GPU
    nodes' facts are not all known, so there is nothing to compare with (unknown is not "no GPUs")."""
    if nodes is None:
        return []
    total, per_product = gpu_supply(nodes)
    out = []
    for product in sorted({p for t in section.teams if isinstance(t.gpus, dict) for p in t.gpus}):
        wanted = sum(t.gpus.get(product, 0) for t in section.teams if isinstance(t.gpus, dict))
        have = per_product.get(product, 0)
        if wanted > have:
            known = ", ".join(f"{p} ({n})" for p, n in sorted(per_product.items())) or "none"
            out.append(f"quotas name {wanted} {product} GPU(s), but preflight found {have} (products found: "
                       f"{known})")
    asked = sum(t.gpus for t in section.teams if not isinstance(t.gpus, dict))
    asked += sum(n for t in section.teams if isinstance(t.gpus, dict) for n in t.gpus.values())
    if total is not None and asked > total and not out:  # (a product's excess is the same story, told already)
        out.append(f"the teams' GPU quotas add up to {asked} GPUs, but the GPU nodes have {total}: queues admit more "
                   f"than the cluster can run at once, and admitted workloads wait for GPUs")
    return out


def explain(section, dra: bool = False) -> list[str]:
    lines = []
    for team in section.teams:
        quota = ", ".join(f"{n} {p}" for p, n in sorted(team.gpus.items())) if isinstance(team.gpus, dict) else \
            f"{team.gpus} GPU(s) on any GPU node"
        borrow = "no borrowing" if not team.borrow else (
            f"borrows up to {team.borrowing_limit}" if team.borrowing_limit is not None else "borrows idle GPUs")
        lend = "lends idle GPUs" if team.lend else "lends nothing"
        lines.append(f"team {team.name}: ClusterQueue {team.name} ({quota}; {borrow}; {lend}), LocalQueue "
                     f"{section.local_queue} in {', '.join(sorted(team.namespaces))}")
    if section.all_or_nothing:
        lines.append(f"all-or-nothing: a workload's pods are admitted together; not all ready within "
                     f"{section.timeout}: evicted and requeued"
                     + ("; the next is admitted once they are (sequential)" if section.sequential_admission else ""))
    if dra:
        lines.append(f"DRA: GPUs asked as nvidia.com/gpu or {', '.join(DRA_IMPLICIT_GPU)}, or claimed from "
                     f"DeviceClass {', '.join(DRA_GPU_CLASSES)}, count against the GPU quotas (Kueue gates "
                     f"{' and '.join(DRA_GATES)}, alpha)")
    return lines


def render(section, nodes: list[GpuNode] | None, gpu_labels: dict[str, str], image: str | None = None,
           dra: bool = False) -> Rendered:
    """`dra`: the GPUs are served through DRA (gpu_operator.allocation: dra)."""
    objects = flavors(section, gpu_labels) + priority_classes(section)
    for team in section.teams:
        objects.append(cluster_queue(section, team))
    for team in section.teams:
        objects += local_queues(section, team)
    return Rendered(objects, chart_values(section, image, dra), warnings(section, nodes), explain(section, dra))
