"""The config's sections for the cluster, SSH, nodes and each step (gpu-operator, monitoring, scheduler,
admission, validation, preflight)."""
from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.core.config.fields import *  # noqa: F403
from gpu_bootstrap.core.config.fields import _catalogued


# --- sections ------------------------------------------------------------------------------------------------------------
class ClusterConfig(Section):
    kubeconfig: Path | None = Field(None, description="default: $KUBECONFIG, then ~/.kube/config")
    context: str | None = None
    adopt_namespaces: list[str] = Field(
        default_factory=list, description="namespaces that exist without gpu-bootstrap's label and that up may "
                                          "install into all the same (up refuses any other: whoever created a "
                                          "namespace owns what goes into it); only list ones you control")

    @field_validator("adopt_namespaces")
    @classmethod
    def _adopted(cls, value: list) -> list:
        for name in value:
            check_dns_label(name)
        return value

    @field_validator("kubeconfig")
    @classmethod
    def _expand(cls, value):
        return Path(os.path.expanduser(str(value))) if value else value


class SshConfig(Section):
    user: str = "root"
    port: int = Field(22, ge=1, le=65535)
    # validate_default: the defaults go through _expand too (else '~' stays literal and known_hosts is never found)
    identity_file: Path | None = Field(Path("~/.ssh/id_ed25519"), validate_default=True)
    known_hosts: Path = Field(Path("~/.ssh/known_hosts"), validate_default=True)
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    connect_timeout: float = Field(10.0, gt=0, le=300)
    command_timeout: float = Field(60.0, gt=0, le=3600)
    parallelism: int = Field(32, ge=1, le=512)

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        if not POSIX_USER.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is not a valid user name")
        return value

    @field_validator("identity_file", "known_hosts")
    @classmethod
    def _expand(cls, value):
        return Path(os.path.expanduser(str(value))) if value else value


class NodeConfig(Section):
    name: str
    address: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    user: str | None = None
    identity_file: Path | None = None

    _name = field_validator("name")(classmethod(lambda cls, v: check_node_name(v)))
    _address = field_validator("address")(classmethod(lambda cls, v: check_address(v) if v is not None else v))

    @field_validator("user")
    @classmethod
    def _user(cls, value):
        return SshConfig._user(value) if value is not None else value

    @field_validator("identity_file")
    @classmethod
    def _expand(cls, value):
        return Path(os.path.expanduser(str(value))) if value else value

    @property
    def ssh_address(self) -> str:
        return self.address or self.name


class TaintConfig(Section):
    key: str = "nvidia.com/gpu"
    value: str = "present"
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    _key = field_validator("key")(classmethod(lambda cls, v: check_label_key(v)))
    _value = field_validator("value")(classmethod(lambda cls, v: check_label_value(v)))

    def as_taint(self) -> dict:
        taint = {"key": self.key, "effect": self.effect}
        if self.value:
            taint["value"] = self.value
        return taint

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


class NodePrepConfig(Section):
    enabled: bool = True
    taint: TaintConfig | None = Field(default_factory=TaintConfig, description="null: do not taint GPU nodes")
    gpu_present_label: bool = Field(True, description="label nodes nvidia.com/gpu.present=true")
    labels: dict[str, str] = Field(default_factory=dict, description="extra labels for every GPU node")

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict) -> dict:
        for key, label in value.items():
            check_label_key(key)
            check_label_value(label)
        return value

    def wanted_labels(self) -> dict[str, str]:
        labels = {"nvidia.com/gpu.present": "true"} if self.gpu_present_label else {}
        labels.update(self.labels)
        return labels


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


class StorageConfig(Section):
    """A PersistentVolumeClaim for Prometheus' data (default: an emptyDir, lost when the pod moves)."""

    size: str = Field("50Gi", description="the claim's size, e.g. 50Gi")
    storage_class: str | None = Field(None, description="default: the cluster's default StorageClass")

    @field_validator("size")
    @classmethod
    def _size(cls, value: str) -> str:
        if not QUANTITY.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is not a storage size (e.g. 50Gi, 500G)")
        return value

    @field_validator("storage_class")
    @classmethod
    def _class(cls, value):
        if value is not None and (len(value) > 253 or not DNS1123_SUBDOMAIN.fullmatch(value)):
            raise ValueError(f"{value[:60]!r} is not a StorageClass name")
        return value


class GrafanaConfig(Section):
    enabled: bool = Field(True, description="install mode: deploy the chart's Grafana with our dashboards")


class AlertsConfig(Section):
    """Thresholds of gpu-bootstrap's GPU alerts (the PrometheusRule gpu-bootstrap-gpu)."""

    gpu_pod_pending_for: str = Field("15m", description="how long a GPU pod may wait for the bin-packing scheduler "
                                                        "before GpuPodsPendingOnBinpackScheduler fires")

    @field_validator("gpu_pod_pending_for")
    @classmethod
    def _duration(cls, value: str) -> str:
        if not DURATION.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is not a Prometheus duration (e.g. 15m, 1h)")
        return value


class MonitoringConfig(Section):
    """GPU dashboards and alerts on kube-prometheus-stack, or on the Prometheus Operator already running."""

    enabled: bool = True
    mode: Literal["install", "attach", "auto"] = Field(
        "auto", description="auto: attach when the cluster runs the Prometheus Operator with a Prometheus object "
                            "(not one gpu-bootstrap installed), else install")
    chart: str = Field("kube-prometheus-stack", description="a chart in `repository`, or a local .tgz or directory")
    repository: str = "https://prometheus-community.github.io/helm-charts"
    version: str | None = Field(None, description="default: the newest release whose kubeVersion admits the cluster")
    release: str = "kube-prometheus-stack"
    namespace: str = Field("monitoring", description="install mode: the stack's namespace, and where our dashboards "
                                                     "and alerts go")
    values: dict[str, Any] = Field(default_factory=dict, description="your overrides, applied last (install mode)")
    retention: str = Field("15d", description="how long Prometheus keeps data (install mode)")
    storage: StorageConfig | None = Field(None, description="null: no PVC (data is lost when Prometheus moves)")
    grafana: GrafanaConfig = Field(default_factory=GrafanaConfig)
    prometheus: str | None = Field(None, description="attach mode: <namespace>/<name> of the Prometheus object, "
                                                     "needed when the cluster runs several")
    scrape_interval: str = Field("15s", description="how often Prometheus scrapes the DCGM exporter")
    wait_timeout: int = Field(600, ge=10, le=7200, description="seconds to wait for the stack and the DCGM targets")
    skip_version_check: bool = Field(False, description="install a chart whose kubeVersion does not admit the "
                                                        "cluster")
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    allow_downgrade: bool = Field(False, description="install mode: install a chart older than the one installed "
                                                     "(refused by default)")

    @field_validator("release", "namespace")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        return GpuOperatorConfig._dns_label(value)

    @field_validator("version")
    @classmethod
    def _version(cls, value):
        return GpuOperatorConfig._version(value)

    @field_validator("retention")
    @classmethod
    def _retention(cls, value: str) -> str:
        if not DURATION.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is not a Prometheus duration (e.g. 15d, 12h, 2w)")
        return value

    @field_validator("scrape_interval")
    @classmethod
    def _interval(cls, value: str) -> str:
        if not DURATION.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is not a Prometheus duration (e.g. 15s, 1m)")
        return value

    @field_validator("prometheus")
    @classmethod
    def _prometheus(cls, value):
        if value is None:
            return value
        namespace, _, name = value.partition("/")
        if not name or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", namespace) or \
                len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name):
            raise ValueError(f"{value[:80]!r} is not <namespace>/<name> of a Prometheus object")
        return value


class ShapePoint(Section):
    utilization: int = Field(ge=0, le=100, description="requested / allocatable, in percent")
    score: int = Field(ge=0, le=10)




class SchedulerConfig(Section):
    """The second, bin-packing kube-scheduler. The default profile was measured with the Alibaba openb GPU trace on
    the real kube-scheduler (benchmarks/packing_real.py) and with pods of other shapes (benchmarks/packing_shapes.py;
    docs/steps/binpack-scheduler.md). The defaults below are the profile for Kubernetes up to 1.35:
    RequestedToCapacityRatio on nvidia.com/gpu (0:0, 50:1, 100:10) at weight 3, plus BalancedAllocation over cpu,
    memory and nvidia.com/gpu at weight 1 (at weight 2 against 1, 1.35's BalancedAllocation spread light GPU pods one
    to a node). From 1.36, whose BalancedAllocation scores the change a pod makes to a node's balance, a config that
    sets none of the scoring keys gets 0:0, 50:2, 100:10 at weight 1 with BalancedAllocation at weight 2
    (render/scheduler.py, PROFILE_FROM_1_36). Every node is scored up to 1,500 nodes; above, kube-scheduler's
    adaptive share, which keeps its throughput at 5,000-15,000 nodes (benchmarks/scheduler_throughput.py)."""

    enabled: bool = True
    name: str = Field("gpu-binpack-scheduler", description="the profile's schedulerName; GPU pods set it")
    namespace: str = "kube-system"
    strategy: Literal["MostAllocated", "RequestedToCapacityRatio"] = Field(
        "RequestedToCapacityRatio", description="NodeResourcesFit's scoring strategy")
    resource_weights: dict[str, int] = Field(
        default_factory=lambda: {"nvidia.com/gpu": 100},
        description="NodeResourcesFit scoring resources and their weights (1-100). GPU only by default: even "
                    "cpu: 1, memory: 1 beside it cost packing on the openb trace (see docs/steps/binpack-scheduler.md)")
    shape: list[ShapePoint] = Field(
        default_factory=lambda: [ShapePoint(utilization=0, score=0), ShapePoint(utilization=50, score=1),
                                 ShapePoint(utilization=100, score=10)],
        description="RequestedToCapacityRatio only: score (0-10) by utilization (0-100), increasing utilization; "
                    "the default rises slowly to half full, then steeply, so nearly full nodes are filled first")
    fit_weight: int = Field(3, ge=1, le=100, description="weight of the NodeResourcesFit score plugin")
    balanced_allocation_weight: int = Field(
        1, ge=0, le=100, description="weight of NodeResourcesBalancedAllocation; 0 turns it off")
    balanced_allocation_resources: list[str] = Field(
        default_factory=lambda: ["cpu", "memory", "nvidia.com/gpu"],
        description="resources NodeResourcesBalancedAllocation balances (with nvidia.com/gpu it keeps cpu and memory "
                    "in step with the GPUs, so fewer GPUs are stranded; see docs/steps/binpack-scheduler.md)")
    percentage_of_nodes_to_score: int | None = Field(
        None, ge=0, le=100, description="share of the nodes scored per pod. Unset: every node (100) on clusters of up "
                                        "to 1,500 nodes, kube-scheduler's adaptive share (0) on larger ones, "
                                        "chosen from the node count `up` reads; 100 scores every node (best "
                                        "packing, slowest); 0 is always adaptive")
    replicas: int = Field(2, ge=1, le=10)
    image: str = Field("registry.k8s.io/kube-scheduler", description="repository; point it at a mirror if needed")
    image_tag: str | None = Field(None, description="default: v<the API server's version> (version skew policy)")
    lease_name: str | None = Field(None, description="leader election lease (default: the scheduler's name)")
    wait_timeout: int = Field(300, ge=10, le=3600, description="seconds to wait for the Deployment and a leader")

    @field_validator("name", "lease_name")
    @classmethod
    def _object_name(cls, value):
        if value is None:
            return value
        if len(value) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value):
            raise ValueError(f"{value!r} must be a lowercase DNS label of at most 63 characters")
        if value == "default-scheduler":
            raise ValueError("'default-scheduler' is the cluster's own scheduler; pick another name")
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        return GpuOperatorConfig._dns_label(value)

    @field_validator("resource_weights")
    @classmethod
    def _weights(cls, value: dict) -> dict:
        if not value:
            raise ValueError("list at least one resource (e.g. nvidia.com/gpu: 100)")
        for name, weight in value.items():
            if not SCHEDULER_RESOURCE.fullmatch(name):
                raise ValueError(f"{name!r} is not a resource name (e.g. cpu, memory, nvidia.com/gpu)")
            if not 1 <= weight <= 100:
                raise ValueError(f"{name}: weight {weight} must be between 1 and 100 (kube-scheduler's limit)")
        return value

    @field_validator("balanced_allocation_resources")
    @classmethod
    def _balanced_resources(cls, value: list) -> list:
        if not value:
            raise ValueError("list at least one resource (e.g. [cpu, memory, nvidia.com/gpu])")
        for name in value:
            if not SCHEDULER_RESOURCE.fullmatch(name):
                raise ValueError(f"{name!r} is not a resource name (e.g. cpu, memory, nvidia.com/gpu)")
        if len(set(value)) != len(value):
            raise ValueError("a resource is listed twice")
        return value

    @field_validator("shape")
    @classmethod
    def _shape(cls, value: list) -> list:
        if not value:
            raise ValueError("needs at least one point")
        points = [p.utilization for p in value]
        if any(b <= a for a, b in zip(points, points[1:])):
            raise ValueError(f"utilization must increase strictly from point to point (got {points})")
        return value

    @field_validator("image_tag")
    @classmethod
    def _tag(cls, value):
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", value):
            raise ValueError(f"{value!r} is not an image tag")
        return value

    @property
    def lease(self) -> str:
        return self.lease_name or self.name


IMAGE_REF = re.compile(r"[a-z0-9]([-a-z0-9._/:]*[a-z0-9])?(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?")


OPA_IMAGE = "openpolicyagent/opa:1.16.2"


class OpaConfig(Section):
    image: str = Field(default_factory=lambda: _catalogued("opa"),
                       description="the official OPA image (default: the image catalogue); registry.mirror moves it")
    replicas: int = Field(2, ge=1, le=10)
    namespace: str = Field("gpu-bootstrap-admission", description="OPA's own namespace (always exempt)")

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        if len(value) > 255 or not IMAGE_REF.fullmatch(value):
            raise ValueError(f"{value[:80]!r} is not an image reference (e.g. {OPA_IMAGE})")
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        return GpuOperatorConfig._dns_label(value)


class AdmissionConfig(Section):
    """Keep GPU pods on the bin-packing scheduler: OPA as an admission webhook with a generated CA (engine opa), or
    in-process admission policies (engine vap)."""

    enabled: bool = True
    engine: Literal["opa", "vap"] = Field("opa", description="opa: OPA webhook (+ a ValidatingAdmissionPolicy "
                                                             "backstop from 1.30); vap: admission policies only")
    mode: Literal["mutate", "enforce"] = Field("mutate", description="mutate: set spec.schedulerName on GPU pods; "
                                                                     "enforce: reject them with the field to set")
    exempt_namespaces: list[str] = Field(
        default_factory=list, validation_alias=AliasChoices("exempt_namespaces", "exclude_namespaces"),
        description="namespaces admission leaves alone, besides kube-system, the scheduler's and OPA's own (the "
                    "only opt-out: no namespace label exempts; exclude_namespaces is the old name)")
    override_other_schedulers: bool = Field(False, description="also steer GPU pods that name another scheduler")
    device_access: bool = Field(True, description="GPUs only for pods given them: refuse NVIDIA_VISIBLE_DEVICES "
                                                  "(and the runtime's other device variables) in a pod's spec and "
                                                  "NVIDIA's RuntimeClasses on pods that ask for no GPU; in mode mutate "
                                                  "set NVIDIA_VISIBLE_DEVICES=void on containers given no GPU "
                                                  "(docs/security.md)")
    opa: OpaConfig = Field(default_factory=OpaConfig)
    certificates: Literal["generated", "cert-manager"] = "generated"
    rotate_before_days: int = Field(30, ge=1, le=3650,
                                    description="renew the serving certificate this many days before it expires")
    wait_timeout: int = Field(300, ge=10, le=3600, description="seconds to wait for OPA and the first verdict")

    @field_validator("exempt_namespaces")
    @classmethod
    def _namespaces(cls, value: list) -> list:
        for name in value:
            if len(name) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name):
                raise ValueError(f"{name!r} is not a namespace name (a lowercase DNS label)")
        return value


class ValidateConfig(Section):
    enabled: bool = True
    image: str = Field(default_factory=lambda: _catalogued("cuda-sample"),
                       description="the CUDA vector-add sample (default: the image catalogue); registry.mirror moves it")
    nodes: Literal["all", "sample"] | int = Field("all", description="all GPU nodes, one ('sample'), or N of them")
    namespace: str = "gpu-bootstrap"
    timeout: int = Field(300, ge=10, le=3600)

    _namespace = field_validator("namespace")(classmethod(lambda cls, v: check_dns_label(v)))



class PreflightConfig(Section):
    """Where node facts come from: SSH from this machine, or a short-lived read-only probe the cluster runs on every
    GPU node (docs/steps/preflight.md)."""

    via: Literal["auto", "ssh", "cluster"] = Field(
        "auto", description="ssh | cluster | auto (ssh when the config has an `ssh` section or a node an "
                            "`address`, else cluster)")
    image: str = Field(default_factory=lambda: _catalogued("busybox"),
                       description="the probe's image (default: the image catalogue; busybox, or any with its sh, chroot, "
                                   "gzip, base64, sha256sum); registry.mirror moves it")
    timeout: int = Field(120, ge=2, le=3600, description="seconds to wait for the cluster probe; a node whose probe "
                                                         "did not finish by then is unknown")

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        return OpaConfig._image(value)
