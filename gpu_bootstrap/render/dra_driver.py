"""Values for NVIDIA's DRA driver (the dra-driver-nvidia-gpu chart), which serves the GPUs when
gpu_operator.allocation is dra: derived from the gpu-operator's own values plan (one source for who owns the NVIDIA
driver), the config and the cluster's Kubernetes version, each with its reason, then the user's
gpu_operator.dra_driver.values. Pure.

Why the standalone chart beside the operator's ClusterPolicy, not gpu-operator v26.7's GPUCluster: GPUCluster is
experimental, for new clusters only, cannot coexist with a ClusterPolicy (so a running cluster could not move to it
without removing its operator first), and its gpu.nvidia.com DeviceClass has no extendedResourceName, so pods that
request nvidia.com/gpu, as users write them, would get no GPU. The chart's DeviceClass maps nvidia.com/gpu to DRA
(KEP-5004) wherever resource.k8s.io/v1 is served.
"""
from __future__ import annotations

from gpu_bootstrap.core import catalogue
from gpu_bootstrap.core.objects import deep_merge
from gpu_bootstrap.core.versions import UnsupportedVersion, version_tuple
from gpu_bootstrap.render.gpu_operator_values import NO_FACTS, Refusal
from gpu_bootstrap.render.values import Derived, ValuesPlan, get_path, set_path

PLUGIN_LABEL = "nvidia.com/dra-kubelet-plugin"  # NVIDIA's label for the nodes whose GPUs DRA serves
OPERATOR_DRIVER_ROOT = "/run/nvidia/driver"  # where the operator's driver container puts the driver
HOST_DRIVER_ROOT = "/"
CHART_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}  # the chart's default
MIN_KUBERNETES = (1, 34)  # resource.k8s.io/v1 (GA)
EXTENDED_RESOURCE_GA = (1, 36)  # DRAExtendedResource on by default (beta; GA and locked in 1.37)


class DraUnsupported(UnsupportedVersion):
    """allocation: dra on a cluster without resource.k8s.io/v1: bad input (exit 2), refused before any write."""


def check_kubernetes(kube_version: str) -> None:
    if version_tuple(kube_version)[:2] < MIN_KUBERNETES:
        raise DraUnsupported(
            f"gpu_operator.allocation: dra needs Kubernetes 1.34 or newer (resource.k8s.io/v1); the cluster runs "
            f"{kube_version}",
            "set gpu_operator.allocation: device-plugin (the default), or upgrade the cluster first",
            step="gpu-operator")


def derive(operator_plan: ValuesPlan, config, kube_version: str, playbook_steps: list[str]) -> ValuesPlan:
    """The DRA driver's values. `operator_plan`: the gpu-operator's values plan of the same run (it decided whether
    the operator installs the NVIDIA driver, and where)."""
    check_kubernetes(kube_version)
    section = config.gpu_operator.dra_driver
    derived = [
        Derived("resources.gpus.enabled", True, "gpu_operator.allocation: dra: the driver publishes each GPU node's "
                                                "GPUs as ResourceSlices and prepares them for the pods they go to"),
        Derived("gpuResourcesEnabledOverride", True,
                "the chart refuses GPUs without it, lest a node serve nvidia.com/gpu from the device plugin as well; "
                "the operator's device plugin is off in this mode (devicePlugin.enabled: false)"),
        Derived("resources.computeDomains.enabled", False,
                "ComputeDomains (NVLink across nodes, through IMEX) are not set up by gpu-bootstrap; set "
                "gpu_operator.dra_driver.values.resources.computeDomains.enabled: true to add them"),
        _driver_root(operator_plan),
        Derived("kubeletPlugin.nodeSelector", {PLUGIN_LABEL: "true"},
                f"the configured GPU nodes, which this step labels {PLUGIN_LABEL}=true (NVIDIA's label for the "
                f"nodes whose GPUs DRA serves)"),
    ]
    warnings: list[str] = []
    taint = config.node_prep.taint if config.node_prep.enabled and "node-prep" in playbook_steps else None
    toleration = {"key": taint.key, "operator": "Exists", "effect": taint.effect} if taint else None
    if toleration and toleration != CHART_TOLERATION:
        derived.append(Derived("kubeletPlugin.tolerations", [CHART_TOLERATION, toleration],
                               f"node_prep.taint {taint}: the kubelet plugin must run on the tainted GPU nodes"))
    derived += [Derived(path, value, why) for path, value, why in
                catalogue.dra_driver_values(getattr(config, "registry", None))]
    if version_tuple(kube_version)[:2] < EXTENDED_RESOURCE_GA:
        warnings.append(f"Kubernetes {kube_version}: DRAExtendedResource is alpha and off, so pods that request "
                        f"nvidia.com/gpu get no GPU from DRA unless the cluster turns that feature gate on (on by "
                        f"default from 1.36); until then pods ask through a ResourceClaim for device class "
                        f"gpu.nvidia.com")
    if config.gpu_operator.sharing.mode == "mig":
        warnings.append("sharing: mig: the MIG manager's partitions are published as devices of class "
                        "mig.nvidia.com, whose only extended resource is its implicit name "
                        "deviceclass.resource.kubernetes.io/mig.nvidia.com (KEP-5004): pods ask for them by that "
                        "name or through a ResourceClaim, and admission and `status` count them as GPUs")
    tree: dict = {}
    for item in derived:
        set_path(tree, item.path, item.value)
    merged = deep_merge(tree, section.values)
    labels = {node.name: {PLUGIN_LABEL: "true"} for node in config.nodes}
    return ValuesPlan({}, derived, dict(section.values), merged, labels, warnings,
                      section="gpu_operator.dra_driver.values")


def _driver_root(operator_plan: ValuesPlan) -> Derived:
    operator_installs = bool(get_path(operator_plan.merged, "driver.enabled", True))
    because = next((d.because for d in operator_plan.derived if d.path == "driver.enabled"), "the chart's default")
    if because.startswith(NO_FACTS):  # the same unknown, said the same way (the plan lists it as decided blind)
        where = OPERATOR_DRIVER_ROOT if operator_installs else HOST_DRIVER_ROOT
        return Derived("nvidiaDriverRoot", where, f"{NO_FACTS}: follows the operator's driver.enabled="
                                                  f"{str(operator_installs).lower()}")
    if not operator_installs:
        return Derived("nvidiaDriverRoot", HOST_DRIVER_ROOT, f"the NVIDIA driver is the host's ({because})")
    host_nodes = sorted(name for name, labels in operator_plan.node_labels.items()
                        if labels.get("nvidia.com/gpu.deploy.driver") == "false")
    if host_nodes:
        raise Refusal(f"the DRA driver reads the NVIDIA driver from one root on every node, but it is pre-installed "
                      f"on {', '.join(host_nodes[:4])} and installed by the operator on the others "
                      f"(gpu_operator.driver_management: per-node)",
                      "use one driver management for every GPU node (driver_management: operator or host), or run "
                      "allocation: device-plugin")
    return Derived("nvidiaDriverRoot", OPERATOR_DRIVER_ROOT,
                   f"the operator installs the NVIDIA driver ({because}); its container keeps it there")
