"""The bin-packing scheduler: its KubeSchedulerConfiguration for the cluster's version, and the objects that run it.

Pure functions of (scheduler settings, Kubernetes version). The simulator reads the same rendered configuration,
so what `gpu-bootstrap simulate` measures is what `up` deploys.
"""
from __future__ import annotations

import hashlib

import yaml

from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.core.versions import control_plane_version, minor_of

GROUP = "kubescheduler.config.k8s.io"
CONFIG_FILE = "config.yaml"
CONFIG_DIR = "/etc/gpu-binpack-scheduler"
SECURE_PORT = 10259
MANAGED = {"app.kubernetes.io/managed-by": "gpu-bootstrap", "app.kubernetes.io/component": "scheduler"}
CONFIG_HASH = "gpu-bootstrap.io/config-hash"
FIT, BALANCED = "NodeResourcesFit", "NodeResourcesBalancedAllocation"


def config_api_version(kube_version: str) -> str:
    """v1 from 1.25 (GA); v1beta3 on 1.23-1.24. Older clusters only have v1beta2/v1beta1, whose profile differs."""
    version = minor_of(kube_version)
    if version >= (1, 25):
        return f"{GROUP}/v1"
    if version >= (1, 23):
        return f"{GROUP}/v1beta3"
    raise ConfigError(f"scheduler: Kubernetes {version[0]}.{version[1]} is too old for the bin-packing profile "
                      f"(needs 1.23 or newer: kubescheduler.config.k8s.io/v1beta3)",
                      "upgrade the cluster, or set scheduler.enabled: false")


def image(settings, kube_version: str) -> str:
    """The scheduler's image, the one place that says so (`up`, plans and the image list all call it).
    kube-scheduler must not be newer than the API server nor more than one minor older (skew policy), so it follows
    the control plane: the server's exact patch ('1.31.4' -> v1.31.4), or, given only a minor ('1.24'), the newest
    patch of that minor gpu-bootstrap knows (v1.24.17), never a stale vX.Y.0. `scheduler.image_tag` overrides."""
    tag = settings.image_tag or "v" + control_plane_version(kube_version)
    return f"{settings.image}:{tag}"


# The scoring settings. Left all unset, the default profile follows the cluster's kube-scheduler: from 1.36 its
# BalancedAllocation scores the change a pod makes to a node's balance (kubernetes PR #135573), and a profile that
# leans more on it packs best there (measured on the real 1.37 scheduler, docs/steps/binpack-scheduler.md); before 1.36
# the config's own defaults (SchedulerConfig) are the best measured.
SCORING_KEYS = ("strategy", "resource_weights", "shape", "fit_weight", "balanced_allocation_weight",
                "balanced_allocation_resources")
PROFILE_FROM_1_36 = {"strategy": "RequestedToCapacityRatio", "resource_weights": {"nvidia.com/gpu": 100},
                     "shape": [{"utilization": 0, "score": 0}, {"utilization": 50, "score": 2},
                               {"utilization": 100, "score": 10}],
                     "fit_weight": 1, "balanced_allocation_weight": 2,
                     "balanced_allocation_resources": ["cpu", "memory", "nvidia.com/gpu"]}


# Unset percentage_of_nodes_to_score: every node is scored up to this many nodes (best packing, and the scoring cost
# is small there); above it, or when the count is unknown, kube-scheduler's adaptive share, which keeps throughput
# at 5,000-15,000 nodes near kube-scheduler's own (benchmarks/scheduler_throughput.py) at a cost of about 0.1 point
# of packing (docs/steps/binpack-scheduler.md).
EVERY_NODE_UP_TO = 1500


def nodes_to_score(settings, node_count: int | None) -> int:
    """percentageOfNodesToScore: the config's, or chosen from the cluster's node count (100 or 0: adaptive)."""
    if settings.percentage_of_nodes_to_score is not None:
        return settings.percentage_of_nodes_to_score
    return 100 if node_count is not None and node_count <= EVERY_NODE_UP_TO else 0


POOL_LABEL = "karpenter.sh/nodepool"


def pool_reach(pool) -> int:
    """The most nodes a pool can hold: its GPU limit over the fewest GPUs a node of it has."""
    from gpu_bootstrap.render.live_diff import quantity
    return int(quantity(pool.limits["nvidia.com/gpu"]) // pool.requirements.gpu_count)


def nodes_to_plan_for(nodes: list[dict], pools) -> int:
    """The node count percentageOfNodesToScore is chosen for: the cluster's nodes, with each of our autoscaled pools
    counted at the most its limits allow instead of the nodes it has now. A cluster that will grow past
    EVERY_NODE_UP_TO gets the adaptive share from the start, and the choice does not flip as pool nodes come and go."""
    names = {pool.name for pool in pools}
    fixed = [n for n in nodes if ((n.get("metadata") or {}).get("labels") or {}).get(POOL_LABEL) not in names]
    return len(fixed) + sum(pool_reach(pool) for pool in pools)


def outgrown(settings, live_percentage, node_count: int) -> str | None:
    """Why the running scheduler scores more nodes than a cluster of `node_count` should (its config was rendered
    for a smaller cluster: every node scored, now over EVERY_NODE_UP_TO), with the fix; None when it fits or the
    config sets the share itself."""
    if settings.percentage_of_nodes_to_score is not None or live_percentage != 100:
        return None
    if node_count <= EVERY_NODE_UP_TO:
        return None
    return (f"the scheduler scores every node (rendered for a cluster of at most {EVERY_NODE_UP_TO:,} nodes), and "
            f"this one has {node_count:,}: each placement scores them all, which slows binding several-fold at this "
            f"size. Fix: run gpu-bootstrap up (it renders kube-scheduler's adaptive share), or set "
            f"scheduler.percentage_of_nodes_to_score; with pools, their limits count from the start")


def for_version(settings, kube_version: str):
    """`settings` with the default profile of `kube_version`'s scheduler when the config sets no scoring key."""
    if set(SCORING_KEYS) & settings.model_fields_set or minor_of(kube_version) < (1, 36):
        return settings
    return type(settings).model_validate({**settings.model_dump(exclude_unset=True), **PROFILE_FROM_1_36})


# kube-scheduler v1.37.2's BalancedAllocation crashes (a nil CEL cache: its scorer is built without the one
# NodeResourcesFit gets, pkg/scheduler/framework/plugins/noderesources/balanced_allocation.go) when it scores an
# extended resource that a DRA DeviceClass serves, and the pod is never scheduled; seen on the real scheduler
# (tests/test_dra_scheduling.py). NodeResourcesFit scores such a resource correctly, so where the cluster serves the
# GPU through DRA the default profile balances cpu and memory only, and the GPU is packed by the fit term alone.
GPU_RESOURCE = "nvidia.com/gpu"


def for_cluster(settings, kube_version: str, dra_classes: tuple[str, ...] = ()):
    """for_version, then, where DeviceClasses `dra_classes` serve nvidia.com/gpu, the GPU left out of
    BalancedAllocation (a config that names it there is refused: the scheduler would crash on every GPU pod)."""
    chosen = for_version(settings, kube_version)
    if not dra_classes or GPU_RESOURCE not in chosen.balanced_allocation_resources or \
            not chosen.balanced_allocation_weight:
        return chosen
    if "balanced_allocation_resources" in settings.model_fields_set:
        raise ConfigError(
            f"scheduler.balanced_allocation_resources: {GPU_RESOURCE} is served through DRA here (DeviceClass "
            f"{', '.join(dra_classes)}), and kube-scheduler's BalancedAllocation crashes scoring a DRA-backed "
            f"resource, so GPU pods would never be scheduled",
            f"leave {GPU_RESOURCE} out of scheduler.balanced_allocation_resources (NodeResourcesFit still packs it)")
    return chosen.model_copy(update={"balanced_allocation_resources": [
        r for r in chosen.balanced_allocation_resources if r != GPU_RESOURCE]})


def scheduler_configuration(settings, kube_version: str, node_count: int | None = None,
                            dra_classes: tuple[str, ...] = ()) -> dict:
    """The KubeSchedulerConfiguration: one profile, NodeResourcesFit packing, leader election on its own lease.
    `node_count`: the cluster's nodes, which choose percentageOfNodesToScore when the config leaves it unset.
    `dra_classes`: the DeviceClasses that serve nvidia.com/gpu through DRA (for_cluster)."""
    settings = for_cluster(settings, kube_version, dra_classes)
    fit_args: dict = {"scoringStrategy": {
        "type": settings.strategy,
        "resources": [{"name": name, "weight": weight} for name, weight in settings.resource_weights.items()]}}
    if settings.strategy == "RequestedToCapacityRatio":
        fit_args["scoringStrategy"]["requestedToCapacityRatio"] = {
            "shape": [{"utilization": p.utilization, "score": p.score} for p in settings.shape]}
    score: dict = {"enabled": [{"name": FIT, "weight": settings.fit_weight}]}
    plugin_config = [{"name": FIT, "args": fit_args}]
    if settings.balanced_allocation_weight:
        score["enabled"].append({"name": BALANCED, "weight": settings.balanced_allocation_weight})
        if list(settings.balanced_allocation_resources) != ["cpu", "memory"]:  # upstream's default stays implicit
            plugin_config.append({"name": BALANCED, "args": {"resources": [
                {"name": name, "weight": 1} for name in settings.balanced_allocation_resources]}})
    else:
        score["disabled"] = [{"name": BALANCED}]
    return {
        "apiVersion": config_api_version(kube_version),
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": True, "resourceLock": "leases", "resourceName": settings.lease,
                           "resourceNamespace": settings.namespace},
        "percentageOfNodesToScore": nodes_to_score(settings, node_count),
        "profiles": [{"schedulerName": settings.name, "plugins": {"score": score},
                      "pluginConfig": plugin_config}],
    }


def profile_line(settings, kube_version: str, node_count: int | None = None,
                 dra_classes: tuple[str, ...] = ()) -> str:
    """The scoring in one line, for plans: 'RequestedToCapacityRatio on nvidia.com/gpu (0:0, 50:1, 100:10) x2 +
    BalancedAllocation over cpu, memory, nvidia.com/gpu x1, every node scored'."""
    balanced_gpu = GPU_RESOURCE in for_version(settings, kube_version).balanced_allocation_resources
    settings = for_cluster(settings, kube_version, dra_classes)
    weights = ", ".join(name if len(settings.resource_weights) == 1 else f"{name} {weight}"
                        for name, weight in settings.resource_weights.items())
    fit = f"{settings.strategy} on {weights}"
    if settings.strategy == "RequestedToCapacityRatio":
        fit += " (" + ", ".join(f"{p.utilization}:{p.score}" for p in settings.shape) + ")"
    fit += f" x{settings.fit_weight}"
    if settings.balanced_allocation_weight:
        fit += (f" + BalancedAllocation over {', '.join(settings.balanced_allocation_resources)}"
                f" x{settings.balanced_allocation_weight}")
        if balanced_gpu and GPU_RESOURCE not in settings.balanced_allocation_resources:
            fit += f" ({GPU_RESOURCE} left out: served through DRA, DeviceClass {', '.join(dra_classes)})"
    percentage = nodes_to_score(settings, node_count)
    why = ""
    if settings.percentage_of_nodes_to_score is None:
        why = (" (node count unknown)" if node_count is None else
               f" ({node_count:,} node{'s' if node_count != 1 else ''}: "
               f"{'up to' if node_count <= EVERY_NODE_UP_TO else 'over'} {EVERY_NODE_UP_TO:,})")
    return fit + (", every node scored" if percentage == 100 else
                  ", adaptive share of nodes scored" if percentage == 0 else
                  f", {percentage} % of nodes scored") + why


def config_text(settings, kube_version: str, node_count: int | None = None, dra_classes: tuple[str, ...] = ()) -> str:
    return yaml.safe_dump(scheduler_configuration(settings, kube_version, node_count, dra_classes), sort_keys=False)


def labels(settings) -> dict:
    return {"app.kubernetes.io/name": settings.name, **MANAGED}


def manifests(settings, kube_version: str, tolerations: list[dict] = (), node_count: int | None = None,
              dra_classes: tuple[str, ...] = ()) -> list[dict]:
    """Everything the scheduler needs, in the order to apply it (the reverse is the order to remove it).
    `tolerations`: for a cluster whose every node is a tainted GPU node, so the scheduler can run at all.
    `node_count`: the cluster's nodes (percentageOfNodesToScore, when the config leaves it unset).
    `dra_classes`: the DeviceClasses that serve nvidia.com/gpu through DRA (for_cluster)."""
    name, namespace = settings.name, settings.namespace
    text = config_text(settings, kube_version, node_count, dra_classes)
    objects = [
        _object("v1", "ServiceAccount", name, namespace, settings),
        _cluster_binding(f"{name}-as-kube-scheduler", "system:kube-scheduler", settings),
        _cluster_binding(f"{name}-as-volume-scheduler", "system:volume-scheduler", settings),
        # The scheduler reads the client CA for delegated authentication of its secure port.
        _role_binding(f"{name}-authentication-reader", "kube-system", "extension-apiserver-authentication-reader",
                      settings),
        # system:kube-scheduler may only get/update the leases it lists by name, so ours gets its own Role.
        {**_object("rbac.authorization.k8s.io/v1", "Role", f"{name}-leader-election", namespace, settings),
         "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
                   {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                    "resourceNames": [settings.lease], "verbs": ["get", "update", "patch", "watch"]}]},
        _role_binding(f"{name}-leader-election", namespace, f"{name}-leader-election", settings),
        {**_object("v1", "ConfigMap", f"{name}-config", namespace, settings), "data": {CONFIG_FILE: text}},
        deployment(settings, kube_version, text, list(tolerations)),
    ]
    if settings.replicas > 1:
        objects.append({**_object("policy/v1", "PodDisruptionBudget", name, namespace, settings),
                        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(settings)}}})
    return objects


def selector(settings) -> dict:
    return {"app.kubernetes.io/name": settings.name}


def deployment(settings, kube_version: str, text: str, tolerations: list[dict] = ()) -> dict:
    probe = {"httpGet": {"path": "/healthz", "port": SECURE_PORT, "scheme": "HTTPS"}}
    container = {
        "name": "kube-scheduler",
        "image": image(settings, kube_version),
        "command": ["/usr/local/bin/kube-scheduler", f"--config={CONFIG_DIR}/{CONFIG_FILE}", "--v=2"],
        "ports": [{"name": "https", "containerPort": SECURE_PORT, "protocol": "TCP"}],
        "livenessProbe": {**probe, "initialDelaySeconds": 15, "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {**probe, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }
    anti_affinity = {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                          "labelSelector": {"matchLabels": selector(settings)}}}]}
    template = {
        "metadata": {"labels": labels(settings),
                     # A new config changes the hash, so the pods restart and load it.
                     "annotations": {CONFIG_HASH: hashlib.sha256(text.encode()).hexdigest()[:16]}},
        "spec": {
            "serviceAccountName": settings.name,
            "priorityClassName": "system-cluster-critical",
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "affinity": {"podAntiAffinity": anti_affinity},
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
            "volumes": [{"name": "config", "configMap": {"name": f"{settings.name}-config"}}],
        },
    }
    if tolerations:
        template["spec"]["tolerations"] = list(tolerations)
    return {**_object("apps/v1", "Deployment", settings.name, settings.namespace, settings),
            "spec": {"replicas": settings.replicas, "selector": {"matchLabels": selector(settings)},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                     "template": template}}


def _object(api_version: str, kind: str, name: str, namespace: str | None, settings) -> dict:
    metadata = {"name": name, "labels": labels(settings)}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata}


def _subject(settings) -> list[dict]:
    return [{"kind": "ServiceAccount", "name": settings.name, "namespace": settings.namespace}]


def _cluster_binding(name: str, role: str, settings) -> dict:
    return {**_object("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", name, None, settings),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": _subject(settings)}


def _role_binding(name: str, namespace: str, role: str, settings) -> dict:
    return {**_object("rbac.authorization.k8s.io/v1", "RoleBinding", name, namespace, settings),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": _subject(settings)}
