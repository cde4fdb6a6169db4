"""gpu-bootstrap.yaml: the typed config, its loader, and errors that name the field and the file line.

Precedence for the cluster and ssh keys: command-line flag > GPU_BOOTSTRAP_* environment variable > file > default.
"""
from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from .errors import ConfigError

DEFAULT_CONFIG = "gpu-bootstrap.yaml"
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
HOSTNAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*")
POSIX_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+")  # Prometheus' duration syntax
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
ENV_OVERRIDES = {
    "GPU_BOOTSTRAP_KUBECONFIG": ("cluster", "kubeconfig"),
    "GPU_BOOTSTRAP_CONTEXT": ("cluster", "context"),
    "GPU_BOOTSTRAP_SSH_USER": ("ssh", "user"),
    "GPU_BOOTSTRAP_SSH_PORT": ("ssh", "port"),
    "GPU_BOOTSTRAP_SSH_IDENTITY_FILE": ("ssh", "identity_file"),
    "GPU_BOOTSTRAP_SSH_KNOWN_HOSTS": ("ssh", "known_hosts"),
    "GPU_BOOTSTRAP_SSH_HOST_KEY_POLICY": ("ssh", "host_key_policy"),
}


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- validators shared by several fields ---------------------------------------------------------------------------
def check_node_name(name: str) -> str:
    if len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name):
        raise ValueError(f"{name[:60]!r} is not a valid Kubernetes node name (lowercase letters, digits, '-' and '.', "
                         f"starting and ending with a letter or digit, at most 253 characters)")
    return name


def check_address(address: str) -> str:
    try:
        ipaddress.ip_address(address)
        return address
    except ValueError:
        pass
    if len(address) > 253 or not HOSTNAME.fullmatch(address):
        raise ValueError(f"{address[:60]!r} is neither an IP address nor a host name")
    return address


def check_label_key(key: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if (slash and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.fullmatch(prefix))) or \
            not name or len(name) > 63 or not LABEL_NAME.fullmatch(name):
        raise ValueError(f"{key[:80]!r} is not a valid label or taint key (optional DNS prefix '/', then up to 63 "
                         f"letters, digits, '-', '_' or '.')")
    return key


def check_label_value(value: str) -> str:
    if len(value) > 63 or not LABEL_VALUE.fullmatch(value):
        raise ValueError(f"{value[:80]!r} is not a valid label or taint value (up to 63 letters, digits, '-', '_' or "
                         f"'.', starting and ending with a letter or digit)")
    return value


SELECTOR_TERM = re.compile(r"\s*(!?)\s*([^\s=!,()]+)(?:\s*(==|=|!=)\s*([^\s,()]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*")


def selector_problem(selector: str) -> str | None:
    """What is wrong with a Kubernetes label selector (kubectl -l syntax), or None."""
    if not selector:
        return "the label selector is empty"
    rest = selector
    while rest:
        term = SELECTOR_TERM.match(rest)
        if not term or not term.group(2):
            return f"{selector[:80]!r} is not a label selector (e.g. karpenter.sh/nodepool=gpu, or gpu in (a,b))"
        try:
            check_label_key(term.group(2))
            for value in [term.group(4)] if term.group(4) else (term.group(6) or "").split(","):
                check_label_value(value.strip())
        except ValueError as error:
            return f"in the label selector: {error}"
        rest = rest[term.end():]
        if rest and not rest.startswith(","):
            return f"{selector[:80]!r} is not a label selector (terms are separated by ',')"
        rest = rest[1:]
    return None


def selector_equalities(selector: str) -> dict[str, str]:
    """The key=value terms of a valid label selector (what a nodeSelector can express), {} when it has others."""
    found, rest = {}, selector
    while rest:
        term = SELECTOR_TERM.match(rest)
        if term.group(1) or term.group(3) not in ("=", "=="):
            return {}
        found[term.group(2)] = term.group(4)
        rest = rest[term.end():].removeprefix(",")
    return found


# --- sections ------------------------------------------------------------------------------------------------------------
class ClusterConfig(Section):
    kubeconfig: Path | None = Field(None, description="default: $KUBECONFIG, then ~/.kube/config")
    context: str | None = None

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


class GpuOperatorConfig(Section):
    enabled: bool = True
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
        if len(value) > 53 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value):
            raise ValueError(f"{value!r} must be a lowercase DNS label of at most 53 characters")
        return value

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


SCHEDULER_RESOURCE = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


class SchedulerConfig(Section):
    """The second, bin-packing kube-scheduler. The default profile was measured with the Alibaba openb GPU trace on
    the real kube-scheduler (benchmarks/packing_real.py; README, "Choosing the scoring"). The defaults below are the
    profile for Kubernetes up to 1.35: RequestedToCapacityRatio on nvidia.com/gpu (0:0, 50:1, 100:10) at weight 2,
    plus BalancedAllocation over cpu, memory and nvidia.com/gpu at weight 1. From 1.36, whose BalancedAllocation
    scores the change a pod makes to a node's balance, a config that sets none of the scoring keys gets 0:0, 50:2,
    100:10 at weight 1 with BalancedAllocation at weight 2 (render/scheduler.py, PROFILE_FROM_1_36)."""

    enabled: bool = True
    name: str = Field("gpu-binpack-scheduler", description="the profile's schedulerName; GPU pods set it")
    namespace: str = "kube-system"
    strategy: Literal["MostAllocated", "RequestedToCapacityRatio"] = Field(
        "RequestedToCapacityRatio", description="NodeResourcesFit's scoring strategy")
    resource_weights: dict[str, int] = Field(
        default_factory=lambda: {"nvidia.com/gpu": 100},
        description="NodeResourcesFit scoring resources and their weights (1-100). GPU only by default: even "
                    "cpu: 1, memory: 1 beside it cost packing on the openb trace (see README)")
    shape: list[ShapePoint] = Field(
        default_factory=lambda: [ShapePoint(utilization=0, score=0), ShapePoint(utilization=50, score=1),
                                 ShapePoint(utilization=100, score=10)],
        description="RequestedToCapacityRatio only: score (0-10) by utilization (0-100), increasing utilization; "
                    "the default rises slowly to half full, then steeply, so nearly full nodes are filled first")
    fit_weight: int = Field(2, ge=1, le=100, description="weight of the NodeResourcesFit score plugin")
    balanced_allocation_weight: int = Field(
        1, ge=0, le=100, description="weight of NodeResourcesBalancedAllocation; 0 turns it off")
    balanced_allocation_resources: list[str] = Field(
        default_factory=lambda: ["cpu", "memory", "nvidia.com/gpu"],
        description="resources NodeResourcesBalancedAllocation balances (with nvidia.com/gpu it keeps cpu and memory "
                    "in step with the GPUs, so fewer GPUs are stranded; see README, 'Choosing the scoring')")
    percentage_of_nodes_to_score: int = Field(
        100, ge=0, le=100, description="100: score every feasible node (best packing); 0: kube-scheduler's adaptive "
                                        "default")
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
                       description="the official OPA image (default: data/images.yaml); registry.mirror moves it")
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
                       description="the CUDA vector-add sample (default: data/images.yaml); registry.mirror moves it")
    nodes: Literal["all", "sample"] | int = Field("all", description="all GPU nodes, one ('sample'), or N of them")
    namespace: str = "gpu-bootstrap"
    timeout: int = Field(300, ge=10, le=3600)



class PreflightConfig(Section):
    """Where node facts come from: SSH from this machine, or a short-lived read-only probe the cluster runs on every
    GPU node (README: "Preflight without SSH")."""

    via: Literal["auto", "ssh", "cluster"] = Field(
        "auto", description="ssh | cluster | auto (ssh when the config has an `ssh` section or a node an "
                            "`address`, else cluster)")
    image: str = Field(default_factory=lambda: _catalogued("busybox"),
                       description="the probe's image (default: data/images.yaml; busybox, or any with its sh, chroot, "
                                   "gzip, base64, sha256sum); registry.mirror moves it")
    timeout: int = Field(120, ge=2, le=3600, description="seconds to wait for the cluster probe; a node whose probe "
                                                         "did not finish by then is unknown")

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        return OpaConfig._image(value)


KARPENTER_DURATION = re.compile(r"([0-9]+(s|m|h))+|Never")  # Karpenter's own pattern for expireAfter/consolidateAfter
BUDGET_NODES = re.compile(r"(100|[0-9]{1,2})%|[0-9]+")
BUDGET_DURATION = re.compile(r"(([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?")
AWS_NAME = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.+=,@/]{0,127}")  # an IAM role name, a tag value
KARPENTER_DOMAINS = ("karpenter.sh", "karpenter.k8s.aws")  # label domains a NodePool template may not set


def check_karpenter_duration(value: str) -> str:
    if not KARPENTER_DURATION.fullmatch(value):
        raise ValueError(f"{value[:40]!r} is not a Karpenter duration (e.g. 10m, 720h, 1h30m, or Never)")
    return value


class PoolRequirements(Section):
    """Which EC2 instances the pool may launch (Karpenter requirements on well-known labels)."""

    gpu_count: int = Field(1, ge=1, le=16, description="at least this many GPUs per instance")
    instance_families: list[str] = Field(default_factory=list, description="e.g. [g6, p5]; empty: any GPU family")
    gpu_names: list[str] = Field(default_factory=list, description="karpenter.k8s.aws/instance-gpu-name, e.g. "
                                                                   "[l4, a100, h100]")
    capacity_types: list[Literal["on-demand", "spot", "reserved"]] = Field(
        default_factory=lambda: ["on-demand"], min_length=1, description="karpenter.sh/capacity-type")
    architectures: list[Literal["amd64", "arm64"]] = Field(default_factory=lambda: ["amd64"], min_length=1)

    @field_validator("instance_families", "gpu_names")
    @classmethod
    def _values(cls, value: list) -> list:
        for item in value:
            if not re.fullmatch(r"[a-z0-9][-a-z0-9.]{0,62}", item):
                raise ValueError(f"{item[:40]!r} is not an instance family or GPU name (lowercase, e.g. g6, a100)")
        return value


class PoolBudget(Section):
    nodes: str = Field("10%", description="how many of the pool's nodes may be disrupted at once (a count or N%)")
    schedule: str | None = Field(None, description="cron schedule when this budget applies (with duration)")
    duration: str | None = Field(None, description="how long it applies after each schedule hit, e.g. 8h")
    reasons: list[Literal["Underutilized", "Empty", "Drifted"]] | None = None

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: str) -> str:
        if not BUDGET_NODES.fullmatch(str(value)):
            raise ValueError(f"{str(value)[:40]!r} must be a node count (e.g. 1) or a percentage (e.g. 10%)")
        return str(value)

    @field_validator("duration")
    @classmethod
    def _duration(cls, value):
        if value is not None and not BUDGET_DURATION.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is not a budget duration (minutes and hours only, e.g. 30m, 8h, 1h30m)")
        return value

    @model_validator(mode="after")
    def _pair(self):
        if (self.schedule is None) != (self.duration is None):
            raise ValueError("schedule and duration go together: set both or neither")
        return self


class PoolDisruption(Section):
    """Never consolidate a node that runs GPU pods: only empty nodes are removed, after `consolidate_after`."""

    consolidate_after: str = Field("10m", description="how long a node stays empty before Karpenter removes it")
    budgets: list[PoolBudget] = Field(default_factory=lambda: [PoolBudget()], min_length=1)

    _after = field_validator("consolidate_after")(classmethod(lambda cls, v: check_karpenter_duration(v)))


class PoolConfig(Section):
    """An autoscaled GPU pool: a Karpenter NodePool and its EC2NodeClass, whose nodes arrive with node-prep's taint
    and labels."""

    name: str = Field(description="the NodePool's and EC2NodeClass's name")
    provider: Literal["karpenter"] = "karpenter"
    role: str = Field(description="the IAM role of the nodes (EC2NodeClass spec.role)")
    discovery_tag: str = Field(description="subnets and security groups tagged karpenter.sh/discovery=<this> (usually "
                                           "the EKS cluster's name)")
    ami_family: Literal["al2023", "bottlerocket"] = Field(
        "al2023", description="al2023: the EKS-optimized NVIDIA AMI; bottlerocket: Bottlerocket's NVIDIA variant")
    ami_version: str = Field("latest", description="the AMI alias version, e.g. latest or v20250301")
    requirements: PoolRequirements = Field(default_factory=PoolRequirements)
    limits: dict[str, str | int] = Field(default_factory=lambda: {"nvidia.com/gpu": "8"},
                                         description="most the pool may hold in total (nvidia.com/gpu, cpu, memory)")
    disruption: PoolDisruption = Field(default_factory=PoolDisruption)
    expire_after: str = Field("720h", description="replace nodes this old (Never: keep them)")
    volume_size: str = Field("200Gi", description="root volume (al2023) or data volume (bottlerocket): CUDA images "
                                                  "are large")
    weight: int | None = Field(None, ge=1, le=100, description="priority among NodePools")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if len(value) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value):
            raise ValueError(f"{value!r} must be a lowercase DNS label of at most 63 characters")
        return value

    @field_validator("role", "discovery_tag")
    @classmethod
    def _aws_name(cls, value: str) -> str:
        if not AWS_NAME.fullmatch(value):
            raise ValueError(f"{value[:60]!r} is not an IAM role name or tag value")
        return value

    @field_validator("ami_version")
    @classmethod
    def _ami_version(cls, value: str) -> str:
        if not re.fullmatch(r"latest|v?[0-9][0-9A-Za-z.-]*", value):
            raise ValueError(f"{value[:40]!r} is not an AMI alias version (latest, or e.g. v20250301)")
        return value

    @field_validator("limits")
    @classmethod
    def _limits(cls, value: dict) -> dict:
        if "nvidia.com/gpu" not in value:
            raise ValueError("must cap nvidia.com/gpu (e.g. nvidia.com/gpu: 8): an unbounded GPU pool can launch "
                             "GPU instances without end")
        for name, amount in value.items():
            if not SCHEDULER_RESOURCE.fullmatch(name):
                raise ValueError(f"{name!r} is not a resource name (e.g. cpu, memory, nvidia.com/gpu)")
            if not QUANTITY.fullmatch(str(amount)):
                raise ValueError(f"{name}: {str(amount)[:40]!r} is not a quantity (e.g. 8, 1000Gi)")
        return {name: str(amount) for name, amount in value.items()}

    _expire = field_validator("expire_after")(classmethod(lambda cls, v: check_karpenter_duration(v)))

    @field_validator("volume_size")
    @classmethod
    def _volume(cls, value: str) -> str:
        if not re.fullmatch(r"[1-9][0-9]*(Gi|Ti|G|T)", value):
            raise ValueError(f"{value[:40]!r} is not a volume size (e.g. 200Gi)")
        return value


def _catalogued(name: str) -> str:
    """A default image from the supply-chain catalogue (data/images.yaml), by digest where it records one."""
    from .images import default
    return default(name)


class RegistryConfig(Section):
    """Air-gapped and mirrored clusters: every image gpu-bootstrap causes to be pulled comes from `mirror`, repository
    paths kept (`gpu-bootstrap images` lists them; `images --check` asks the mirror for each)."""

    mirror: str | None = Field(None, description="HOST[:PORT][/PREFIX], e.g. registry.example.com:5000/mirror (no "
                                                 "scheme): quay.io/prometheus/prometheus becomes "
                                                 "<mirror>/prometheus/prometheus")
    pull_secret: str | None = Field(None, description="a kubernetes.io/dockerconfigjson Secret, in each namespace we "
                                                      "deploy to, that pods pull with (you create it)")
    plain_http: bool = Field(False, description="images --check talks plain HTTP to the mirror (always for "
                                                "localhost/127.0.0.1)")

    @field_validator("mirror")
    @classmethod
    def _mirror(cls, value):
        if value is None:
            return value
        from .images import check_mirror
        return check_mirror(value)

    @field_validator("pull_secret")
    @classmethod
    def _secret(cls, value):
        if value is not None and (len(value) > 253 or not DNS1123_SUBDOMAIN.fullmatch(value)):
            raise ValueError(f"{value[:60]!r} is not a Secret name (a lowercase DNS subdomain)")
        return value


class Config(Section):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    ssh: SshConfig = Field(default_factory=SshConfig)
    nodes: list[NodeConfig] = Field(description="the GPU nodes: a list, or a label selector "
                                                                      "(e.g. karpenter.sh/nodepool=gpu)")
    node_prep: NodePrepConfig = Field(default_factory=NodePrepConfig)
    gpu_operator: GpuOperatorConfig = Field(default_factory=GpuOperatorConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)
    validation: ValidateConfig = Field(default_factory=ValidateConfig, alias="validate")  # BaseModel owns .validate
    preflight: PreflightConfig = Field(default_factory=PreflightConfig)
    pools: list[PoolConfig] = Field(default_factory=list, description="autoscaled GPU pools (Karpenter)")
    registry: RegistryConfig = Field(default_factory=RegistryConfig)

    # `nodes: <label selector>`: the GPU nodes are the cluster's nodes that match, resolved when a run starts
    # (with_selected_nodes); the ones it matched are not probed over SSH (their facts come from their pool).
    _selector: str | None = PrivateAttr(default=None)
    _selected: dict = PrivateAttr(default_factory=dict)  # node name -> the pool it came from (None: no pool of ours)

    @model_validator(mode="wrap")
    @classmethod
    def _nodes_selector(cls, data, handler):
        selector = None
        if isinstance(data, dict) and isinstance(data.get("nodes"), str):
            selector = data["nodes"].strip()
            problem = selector_problem(selector)
            if problem:
                raise ValueError(f"nodes: {problem}")
            data = {**data, "nodes": []}
        elif isinstance(data, dict) and "nodes" in data and not data["nodes"]:
            raise ValueError("nodes: list at least one GPU node, or give a label selector (e.g. nodes: "
                             "karpenter.sh/nodepool=gpu)")
        config = handler(data)
        if selector is not None:
            config._selector = selector
        return config

    @property
    def node_selector(self) -> str | None:
        return self._selector

    @property
    def selected_nodes(self) -> dict:
        """Nodes the selector matched that `nodes` does not list: name -> the configured pool it came from, or None."""
        return dict(self._selected)

    def with_selected_nodes(self, found: dict) -> "Config":
        """A copy whose `nodes` adds the nodes the selector matched (`found`: name -> pool name or None)."""
        listed = {n.name for n in self.nodes}
        extra = {name: pool for name, pool in sorted(found.items()) if name not in listed}
        copy = self.model_copy(update={"nodes": [*self.nodes, *(NodeConfig(name=n) for n in extra)]})
        copy._selector, copy._selected = self._selector, extra
        return copy

    def pool(self, name: str | None):
        return next((p for p in self.pools if p.name == name), None)

    @model_validator(mode="after")
    def _unique_nodes(self):
        seen = set()
        for index, node in enumerate(self.nodes):
            if node.name in seen:
                raise ValueError(f"nodes[{index}].name: node {node.name!r} is listed twice")
            seen.add(node.name)
        names = set()
        for index, pool in enumerate(self.pools):
            if pool.name in names:
                raise ValueError(f"pools[{index}].name: pool {pool.name!r} is listed twice")
            names.add(pool.name)
        if self.pools:
            for key in self.node_prep.labels:
                if key.partition("/")[0].endswith(KARPENTER_DOMAINS) or key == "kubernetes.io/hostname":
                    raise ValueError(f"node_prep.labels: {key!r} cannot go on a Karpenter node template (Karpenter "
                                     f"owns that label); pick another key")
        return self

    def node(self, name: str) -> NodeConfig:
        return next(n for n in self.nodes if n.name == name)


# --- loading --------------------------------------------------------------------------------------------------------
class Source:
    """Where a config came from, and the line of every key in it (for error messages)."""

    def __init__(self, path: Path | None, lines: dict[tuple, int | str]):
        self.path = path
        self.lines = lines

    def locate(self, loc: tuple) -> str:
        loc = tuple(loc)
        while loc and loc not in self.lines:
            loc = loc[:-1]
        line = self.lines.get(loc)
        if isinstance(line, str):
            return f"flag {line}" if line.startswith("--") else f"environment variable {line}"
        name = str(self.path) if self.path else "<config>"
        return f"{name}:{line}" if line else name


def _line_map(node, path: tuple = (), out: dict | None = None, seen: set | None = None) -> dict[tuple, int]:
    out = {} if out is None else out
    seen = set() if seen is None else seen
    out.setdefault(path, node.start_mark.line + 1)
    if id(node) in seen:  # an alias: walked once already (an alias to a node containing it: see _cycle)
        return out
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = path + (key.value,)
            out[child] = key.start_mark.line + 1
            _line_map(value, child, out, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            out[path + (index,)] = item.start_mark.line + 1
            _line_map(item, path + (index,), out, seen)
    return out


def _cycle(node, path: tuple = (), ancestors: tuple = (), done: set | None = None) -> tuple | None:
    """The path of the first alias that refers to a node containing it (recursive data), if any."""
    done = set() if done is None else done
    if id(node) in ancestors:
        return path
    if id(node) in done:
        return None
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        children = ([(path + (key.value,), value) for key, value in node.value] if isinstance(node, yaml.MappingNode)
                    else [(path + (index,), item) for index, item in enumerate(node.value)])
        for child_path, child in children:
            found = _cycle(child, child_path, ancestors + (id(node),), done)
            if found is not None:
                return found
    done.add(id(node))
    return None


def parse_yaml(text: str, path: Path | None) -> tuple[Any, Source]:
    name = str(path) if path else "<config>"
    loader = None
    try:  # what yaml.compose and yaml.safe_load do, with one parse for both the nodes (lines) and the data
        loader = yaml.SafeLoader(text)  # its reader already refuses control characters
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark else name
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(f"{where}: YAML syntax error: {problem}", "fix the YAML syntax at that line")
    except RecursionError:
        raise ConfigError(f"{name}: the YAML is nested too deeply", "a config needs a few levels, not hundreds") \
            from None
    finally:
        if loader is not None:
            loader.dispose()
    lines = _line_map(node) if node is not None else {}
    loop = _cycle(node) if node is not None else None
    if loop is not None:
        source = Source(path, lines)
        raise ConfigError(f"{source.locate(loop)}: {describe_loc(loop)}: a YAML alias refers to a node that "
                          f"contains it (recursive data)", "replace the alias (*name) with the value itself")
    return data, Source(path, lines)


def describe_loc(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _friendly(error: dict) -> str:
    kind, message = error["type"], error["msg"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return message.replace("Input should be", "must be")
    if kind.startswith(("int_", "float_", "bool_", "string_", "dict_", "list_", "model_")):
        got = type(error.get("input")).__name__
        return f"{message.replace('Input should be', 'must be')} (got {got})"
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    return message.replace("Input should be", "must be")


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        args = getattr(annotation, "__args__", ()) or (annotation,)
        current = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if current is None:
            return []
    return sorted(field.alias or name for name, field in getattr(current, "model_fields", {}).items())


def validate(data: Any, source: Source, model: type[BaseModel] = None) -> Config:
    model = model or Config
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source.locate(())}: the config must be a mapping of sections (cluster, ssh, nodes, ...)")
    data = {key: value for key, value in data.items() if value is not None}  # `cluster:` alone means defaults
    try:
        return model.model_validate(data)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            loc = tuple(item["loc"])
            message = _friendly(item)
            if message.startswith(("nodes[", "nodes:", "pools[", "node_prep.")) and ":" in message:  # model-level errors carry their own path
                field, message = message.split(": ", 1)
                loc = _parse_path(field)
            if item["type"] == "extra_forbidden":
                allowed = _allowed_keys(model, loc)
                if allowed:
                    message += f" (allowed here: {', '.join(allowed)})"
            problems.append(f"{source.locate(loc)}: {describe_loc(loc) or '<top>'}: {message}")
        # from None: the ValidationError (chained, it would print with the traceback in the log) quotes the input
        # values, secrets among them (monitoring.values given as a string, a misspelled values block)
        raise ConfigError("\n".join(problems), "fix the config file and run again (nothing was changed)") from None


def _parse_path(text: str) -> tuple:
    parts: list = []
    for name, index in re.findall(r"([A-Za-z_]+)|\[(\d+)\]", text):
        parts.append(int(index) if index else name)
    return tuple(parts)


def apply_env(data: dict, environ: dict, source: Source) -> dict:
    for variable, (section, key) in ENV_OVERRIDES.items():
        if variable in environ:
            data.setdefault(section, {})
            if not isinstance(data[section], dict):
                continue
            data[section][key] = environ[variable]
            source.lines[(section, key)] = variable
    return data


def load(path: Path | None, environ: dict | None = None, overrides: dict | None = None) -> Config:
    """Read, merge environment and flag overrides, validate. Raises ConfigError naming file:line and field."""
    path = Path(path) if path else Path(DEFAULT_CONFIG)
    if not path.exists():
        raise ConfigError(f"config file {path} not found",
                          "pass -c/--config, or run 'gpu-bootstrap init' to write a commented example")
    data, source = _read(path, environ, overrides)
    return validate(data, source)


class _Sections(BaseModel):
    """The sections a command without nodes needs (simulate, status); the others are not read."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    node_prep: NodePrepConfig = Field(default_factory=NodePrepConfig)


def load_sections(path: Path | None, environ: dict | None = None,
                  overrides: dict | None = None) -> tuple[SchedulerConfig, ClusterConfig]:
    """The scheduler and cluster sections, with the same precedence as load(); the default file is optional."""
    sections = load_node_free_sections(path, environ, overrides)
    return sections.scheduler, sections.cluster


def load_node_free_sections(path: Path | None, environ: dict | None = None, overrides: dict | None = None):
    """The cluster, scheduler and node_prep sections (no nodes needed), as load() reads them; the default file is
    optional."""
    if path is not None and Path(path) != Path(DEFAULT_CONFIG) and not Path(path).exists():
        raise ConfigError(f"config file {path} not found")
    path = Path(path) if path else Path(DEFAULT_CONFIG)
    data, source = _read(path, environ, overrides) if path.exists() else _read(None, environ, overrides)
    return validate(data, source, _Sections)


def _read(path: Path | None, environ: dict | None, overrides: dict | None) -> tuple[Any, Source]:
    """A config file (or none) with the environment and the flags merged in, and where each key came from."""
    environ = os.environ if environ is None else environ
    if path is None:
        data, source = {}, Source(None, {})
    else:
        if path.is_dir():
            raise ConfigError(f"config path {path} is a directory, not a YAML file")
        try:
            raw = path.read_bytes()
        except OSError as error:
            raise ConfigError(f"cannot read config file {path}: {error}")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            line = raw.count(b"\n", 0, error.start) + 1
            raise ConfigError(f"{path}:{line}: the config file is not UTF-8 text (byte 0x{raw[error.start]:02x} at "
                              f"offset {error.start})", "save it as UTF-8") from None
        data, source = parse_yaml(text, path)
    if isinstance(data, dict):
        data = apply_env(data, environ, source)
        for (section, key), value in (overrides or {}).items():
            if value is not None:
                if data.get(section) is None:
                    data[section] = {}  # `cluster:` with nothing under it
                if isinstance(data[section], dict):
                    data[section][key] = value
                    source.lines[(section, key)] = f"--{key}"
    return data, source


SCHEMA_FILE = "gpu-bootstrap.schema.json"
SCHEMA_ID = "urn:gpu-bootstrap:config"  # an identifier, never fetched


def json_schema() -> dict:
    """The JSON Schema of gpu-bootstrap.yaml, generated from the models (every key, type, default and description),
    for editors (`# yaml-language-server: $schema=...`, which `init` writes) and docs/. `nodes` is also a label
    selector (a string), which the model takes before validation."""
    schema = Config.model_json_schema(by_alias=True)
    nodes = schema["properties"]["nodes"]
    schema["properties"]["nodes"] = {"description": nodes.get("description", ""), "title": "Nodes",
                                     "anyOf": [{k: v for k, v in nodes.items() if k not in ("description", "title")},
                                               {"type": "string", "description": "a label selector"}]}
    for name, prop in schema["properties"].items():  # a top-level section left empty (all commented out) is null
        if "$ref" in prop:
            prop = dict(prop)
            schema["properties"][name] = {"anyOf": [{"$ref": prop.pop("$ref")}, {"type": "null"}], **prop}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


EXAMPLE = """\
# gpu-bootstrap configuration. Every section except `nodes` is optional; the values shown are the defaults.
# Environment variables GPU_BOOTSTRAP_KUBECONFIG, GPU_BOOTSTRAP_CONTEXT and GPU_BOOTSTRAP_SSH_{USER,PORT,
# IDENTITY_FILE,KNOWN_HOSTS,HOST_KEY_POLICY} override the matching keys; command-line flags override both.

cluster:
  # kubeconfig: ~/.kube/config      # default: $KUBECONFIG, then ~/.kube/config
  # context: prod                   # default: the kubeconfig's current context

ssh:                                # how to reach the GPU nodes (preflight checks)
  user: root                        # not root? gpu-bootstrap uses `sudo -n`
  port: 22
  identity_file: ~/.ssh/id_ed25519
  known_hosts: ~/.ssh/known_hosts
  host_key_policy: strict           # strict | accept-new (records unknown keys, never accepts a changed one)

nodes:                              # the GPU nodes, by Kubernetes node name
  - name: node5
    address: 10.0.0.15              # SSH address (default: the name); port, user, identity_file may be overridden
  - name: node6
    address: 10.0.0.16

node_prep:                          # taint and label the GPU nodes so that ordinary pods stay off them
  taint: {key: nvidia.com/gpu, value: present, effect: NoSchedule}   # null: no taint
  gpu_present_label: true           # nvidia.com/gpu.present=true
  labels: {}                        # extra labels, e.g. {team: ml}

scheduler:                          # a second kube-scheduler that packs GPU pods onto as few nodes as possible
  name: gpu-binpack-scheduler       # GPU pods set spec.schedulerName to this
  # Scoring: left out, the profile measured best for your cluster's kube-scheduler (README, "Choosing the
  # scoring"); setting any of these makes the profile yours (the others then take the values shown, 1.35's).
  # strategy: RequestedToCapacityRatio   # or MostAllocated
  # resource_weights: {nvidia.com/gpu: 100}   # GPU only: cpu/memory weights cost packing (README)
  # shape: [{utilization: 0, score: 0}, {utilization: 50, score: 1}, {utilization: 100, score: 10}]
  # fit_weight: 2
  # balanced_allocation_weight: 1   # 0: NodeResourcesBalancedAllocation off
  # balanced_allocation_resources: [cpu, memory, nvidia.com/gpu]   # keeps cpu/memory in step with the GPUs
  replicas: 2                       # leader-elected; `gpu-bootstrap simulate` shows what a profile buys

gpu_operator:                       # the NVIDIA gpu-operator, with values derived from what preflight found
  enabled: true
  chart: gpu-operator               # or a local .tgz / directory for air-gapped clusters
  repository: https://helm.ngc.nvidia.com/nvidia
  # version: v26.7.0                # default: the newest release NVIDIA validated for the cluster's version
  release: gpu-operator
  namespace: gpu-operator
  driver_management: auto           # auto | operator | host | per-node
  runtime_integration: auto         # auto | toolkit-env | nri
  sharing:
    mode: none                      # none | time-slicing | mig
  wait_timeout: 900                 # seconds to wait for the operands on every GPU node
  skip_version_check: false         # true: install outside NVIDIA's validated Kubernetes range
  adopt: false                      # true: take over a release of this name that gpu-bootstrap did not install
  values: {}                        # your helm values, applied last

validate:                           # run NVIDIA's CUDA vector-add sample on the GPU nodes, then clean up
  enabled: true
  # image: nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0   # default: data/images.yaml (by digest where known)
  nodes: all                        # all | sample | a number
  namespace: gpu-bootstrap
  timeout: 300

admission:                          # keep GPU pods on the bin-packing scheduler (README: "The admission steps")
  enabled: true
  engine: opa                       # opa: OPA webhook + (>= 1.30) an in-process backstop policy | vap: policies only
  mode: mutate                      # mutate: set spec.schedulerName on GPU pods | enforce: reject them, naming the field
  exempt_namespaces: []             # left alone besides kube-system, the scheduler's and OPA's own (the only opt-out)
  override_other_schedulers: false  # false: a GPU pod naming another scheduler (e.g. volcano) is left alone
  opa:
    # image: openpolicyagent/opa:1.16.2   # default: data/images.yaml, by digest (1.16.2: the patch release after kube-mgmt's 1.16.1 pin)
    replicas: 2
    namespace: gpu-bootstrap-admission
  certificates: generated           # generated (a CA of our own, kept only in a Secret) | cert-manager
  rotate_before_days: 30

monitoring:                         # who uses which GPU: Prometheus, the DCGM exporter's metrics, dashboards, alerts
  enabled: true
  mode: auto                        # install | attach | auto (attach to a Prometheus Operator you already run)
  chart: kube-prometheus-stack      # install mode; or a local .tgz / directory for air-gapped clusters
  repository: https://prometheus-community.github.io/helm-charts
  # version: 88.5.3                 # default: the newest release whose kubeVersion admits the cluster
  release: kube-prometheus-stack
  namespace: monitoring             # the stack's namespace, and where the dashboards and alerts go
  retention: 15d                    # how long Prometheus keeps data
  storage: null                     # e.g. {size: 50Gi, storage_class: fast}; null keeps data in an emptyDir
  grafana:
    enabled: true
  # prometheus: monitoring/k8s      # attach mode: which Prometheus object, when the cluster runs several
  scrape_interval: 15s              # how often the DCGM exporter is scraped
  wait_timeout: 600
  skip_version_check: false
  values: {}                        # your helm values for kube-prometheus-stack, applied last

registry:                           # air-gapped clusters (README: "Air-gapped clusters"); `gpu-bootstrap images` lists
  mirror: null                      # what to copy. e.g. registry.example.com:5000/mirror: every image comes from there
  pull_secret: null                 # a docker-registry Secret (you create it in each namespace) pods pull with
preflight:                          # where node facts come from (README: "Preflight without SSH")
  via: auto                         # ssh | cluster (a read-only probe pod per node, no keys) | auto: ssh when the
                                    # config has an `ssh` section or a node an `address`, else cluster
  # image: busybox:1.37.0           # the cluster probe's image (default: data/images.yaml, by digest)
  timeout: 120                      # seconds; a node whose probe did not finish by then is unknown

pools: []                           # autoscaled GPU pools (Karpenter >= 1.0 on EKS; README: "Autoscaled GPU pools")
# - name: gpu                       # a NodePool and an EC2NodeClass of this name; nodes get node_prep's taint/labels
#   role: KarpenterNodeRole-my-cluster   # the nodes' IAM role
#   discovery_tag: my-cluster       # subnets and security groups tagged karpenter.sh/discovery=<this>
#   ami_family: al2023              # al2023 (EKS NVIDIA AMI) | bottlerocket (its NVIDIA variant)
#   requirements: {gpu_count: 1, instance_families: [g6], gpu_names: [], capacity_types: [on-demand]}
#   limits: {nvidia.com/gpu: 8}     # required: the most GPUs the pool may hold
#   disruption: {consolidate_after: 10m, budgets: [{nodes: "10%"}]}   # only empty nodes are removed
#   expire_after: 720h
"""
