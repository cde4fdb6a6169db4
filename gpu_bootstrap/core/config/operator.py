"""The gpu-operator's section: GPU sharing, driver upgrades, the DRA driver beside the operator."""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gpu_bootstrap.core.config.fields import Section, check_dns_label, check_label_value, check_node_name

__all__ = ["DraDriverConfig", "DriverUpgradeConfig", "GpuOperatorConfig", "SharingConfig"]


class SharingConfig(Section):
    """GPU sharing through the device plugin: time-slicing replicas, or MIG partitions."""

    mode: Literal["none", "time-slicing", "mig"] = "none"
    replicas: int = Field(4, ge=2, le=256, description="time-slicing: pods per physical GPU")
    rename_by_default: bool = Field(False, description="time-slicing: advertise nvidia.com/gpu.shared")
    fail_requests_greater_than_one: bool = False
    profiles: dict[str, int] = Field(default_factory=dict, description="time-slicing: profile name -> replicas")
    node_profiles: dict[str, str] = Field(default_factory=dict, description="node -> time-slicing profile")
    mig_strategy: Literal["single", "mixed"] = "single"
    mig_config: str = Field("all-1g.10gb", description="MIG: nvidia.com/mig.config for every GPU node")
    mig_node_configs: dict[str, str] = Field(default_factory=dict, description="MIG: node -> its own config")

    @field_validator("profiles")
    @classmethod
    def _profiles(cls, value: dict) -> dict:
        for name, replicas in value.items():
            check_label_value(name)
            if not 2 <= replicas <= 256:
                raise ValueError(f"profile {name!r}: replicas must be between 2 and 256")
        return value

    @field_validator("node_profiles", "mig_node_configs")
    @classmethod
    def _node_map(cls, value: dict) -> dict:
        for node, profile in value.items():
            check_node_name(node)
            check_label_value(profile)
        return value

    @field_validator("mig_config")
    @classmethod
    def _mig_config(cls, value: str) -> str:
        return check_label_value(value)


class DriverUpgradeConfig(Section):
    """How the gpu-operator rolls a new driver onto GPU nodes (the chart's driver.upgradePolicy), used when the
    operator manages the driver. The defaults upgrade one node at a time, evict its GPU pods (not forced, 5 minutes
    to go) and do not drain the node: GPU work stops on one node at a time, other pods stay."""

    auto: bool = Field(True, description="let the operator upgrade nodes when the driver version changes (false: "
                                         "you label nodes nvidia.com/gpu-driver-upgrade-state=upgrade-required)")
    max_parallel: int = Field(1, ge=0, le=1000, description="nodes upgraded at once (0: all at once)")
    max_unavailable: str = Field("25%", description="GPU nodes that may be unavailable at once: a number or a "
                                                    "percentage of the GPU nodes")
    gpu_pod_deletion_timeout: int = Field(300, ge=0, le=86400, description="seconds GPU pods get to exit when "
                                                                            "evicted (0: wait forever)")
    force_gpu_pod_deletion: bool = Field(False, description="also delete GPU pods no controller owns (their work "
                                                            "is lost)")
    delete_empty_dir: bool = Field(False, description="also evict GPU pods with emptyDir volumes (their data is "
                                                      "lost)")
    wait_for_jobs_timeout: int = Field(0, ge=0, le=604800, description="seconds to wait for the pods of "
                                                                       "wait_for_jobs_selector to finish (0: no "
                                                                       "limit)")
    wait_for_jobs_selector: str = Field("", description="label selector of pods (jobs) to let finish before the "
                                                        "upgrade ('' : none)")
    drain: bool = Field(False, description="drain the whole node (all pods), not only its GPU pods")
    drain_timeout: int = Field(300, ge=0, le=86400, description="seconds the drain may take (0: no limit)")

    @field_validator("max_unavailable")
    @classmethod
    def _number_or_percent(cls, value: str) -> str:
        if not re.fullmatch(r"\d+%?", value) or (value.endswith("%") and int(value[:-1]) > 100):
            raise ValueError(f"{value[:40]!r} is neither a number of nodes nor a percentage (e.g. 1, 25%)")
        return value


class DraDriverConfig(Section):
    """NVIDIA's DRA driver (the dra-driver-nvidia-gpu chart), installed by the gpu-operator step when
    gpu_operator.allocation is dra."""

    chart: str = Field("dra-driver-nvidia-gpu", description="a chart in `repository`, or a local .tgz or directory")
    repository: str = Field("oci://registry.k8s.io/dra-driver-nvidia/charts",
                            description="a chart repository or an OCI registry path")
    version: str | None = Field(None, description="default: the release the gpu-operator release pairs with")
    release: str = "dra-driver-nvidia-gpu"
    namespace: str = "dra-driver-nvidia-gpu"
    values: dict[str, Any] = Field(default_factory=dict, description="your overrides, applied last")

    @field_validator("release", "namespace")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        return check_dns_label(value, 53)

    @field_validator("version")
    @classmethod
    def _version(cls, value):
        if value is not None and not re.fullmatch(r"v?\d+\.\d+(\.\d+)?([-+][0-9A-Za-z.-]+)?", value):
            raise ValueError(f"{value!r} is not a chart version (e.g. 0.5.0)")
        return value


class GpuOperatorConfig(Section):
    enabled: bool = True
    allocation: Literal["device-plugin", "dra"] = Field(
        "device-plugin", description="how pods get GPUs: the operator's device plugin (nvidia.com/gpu node capacity), "
                                     "or NVIDIA's DRA driver (ResourceSlices; Kubernetes 1.34 or newer)")
    dra_driver: DraDriverConfig = Field(default_factory=DraDriverConfig)
    chart: str = Field("gpu-operator", description="a chart in `repository`, or a local .tgz or directory")
    repository: str = "https://helm.ngc.nvidia.com/nvidia"
    version: str | None = Field(None, description="default: the newest release validated for the cluster")
    release: str = "gpu-operator"
    namespace: str = "gpu-operator"
    values: dict[str, Any] = Field(default_factory=dict, description="your overrides, applied last")
    driver_management: Literal["auto", "operator", "host", "per-node"] = "auto"
    runtime_integration: Literal["auto", "toolkit-env", "nri"] = "auto"
    sharing: SharingConfig = Field(default_factory=SharingConfig)
    wait_timeout: int = Field(900, ge=10, le=7200, description="seconds to wait for the operands to be ready")
    skip_version_check: bool = Field(False, description="install even outside NVIDIA's validated Kubernetes range")
    adopt: bool = Field(False, description="manage a release of this name that gpu-bootstrap did not install (it "
                                           "is upgraded with our values, and teardown uninstalls it)")
    driver_upgrade: DriverUpgradeConfig = Field(default_factory=DriverUpgradeConfig)
    allow_downgrade: bool = Field(False, description="install a release older than the one installed (refused by "
                                                     "default: CRDs and stored objects do not go back)")

    @field_validator("release", "namespace")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        return check_dns_label(value, 53)  # helm's limit on a release name

    @field_validator("sharing")
    @classmethod
    def _dra_sharing(cls, value, info):
        if info.data.get("allocation") == "dra" and value.mode == "time-slicing":
            raise ValueError("mode: time-slicing is set in the device plugin, which gpu_operator.allocation: dra "
                             "turns off (with DRA, time-slicing is a setting of a ResourceClaim, not of the node); "
                             "use allocation: device-plugin, or sharing.mode: none or mig")
        return value

    @model_validator(mode="after")
    def _dra_release(self):
        if self.allocation == "dra" and (self.dra_driver.release, self.dra_driver.namespace) == \
                (self.release, self.namespace):
            raise ValueError("dra_driver.release: the DRA driver needs a release of its own, not the operator's")
        return self

    @field_validator("version")
    @classmethod
    def _version(cls, value):
        if value is not None and not re.fullmatch(r"v?\d+\.\d+(\.\d+)?([-+][0-9A-Za-z.-]+)?", value):
            raise ValueError(f"{value!r} is not a chart version (e.g. v26.7.0)")
        return value
