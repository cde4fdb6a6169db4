"""The config's autoscaled GPU pools (Karpenter NodePools) and the registry mirror."""
from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gpu_bootstrap.core.config.fields import DNS1123_SUBDOMAIN, QUANTITY, SCHEDULER_RESOURCE, Section

__all__ = [
    "AWS_NAME", "BUDGET_DURATION", "BUDGET_NODES", "KARPENTER_DOMAINS", "KARPENTER_DURATION", "POOLS_WITHOUT_DRA",
    "PoolBudget", "PoolConfig", "PoolDisruption", "PoolRequirements", "RegistryConfig", "check_karpenter_duration"]


KARPENTER_DURATION = re.compile(r"([0-9]+(s|m|h))+|Never")  # Karpenter's own pattern for expireAfter/consolidateAfter
BUDGET_NODES = re.compile(r"(100|[0-9]{1,2})%|[0-9]+")
BUDGET_DURATION = re.compile(r"(([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?")
AWS_NAME = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.+=,@/]{0,127}")  # an IAM role name, a tag value
KARPENTER_DOMAINS = ("karpenter.sh", "karpenter.k8s.aws")  # label domains a NodePool template may not set


# Read in sigs.k8s.io/karpenter v1.14.1 (pkg/controllers/provisioning/scheduling/scheduler.go, pkg/operator/options):
# by default (--ignore-dra-requests) Karpenter refuses to provision for a pod with ResourceClaims ("not yet supported
# by Karpenter"); with the flag off it places claims only on instance types that declare their devices
# (InstanceType.DynamicResources), which its KWOK provider's instance types cannot. And in DRA mode a GPU node has no
# nvidia.com/gpu capacity, so a pod's extended-resource request served through a DeviceClass (KEP-5004) matches no
# instance type as Karpenter simulates them. Nothing here proves a GPU node launched for a DRA pod: refused.
POOLS_WITHOUT_DRA = (
    "autoscaled pools cannot serve gpu_operator.allocation: dra: Karpenter 1.14 does not provision for pods whose GPUs "
    "come through DRA (it refuses pods with ResourceClaims by default, and its simulation knows no devices of nodes "
    "not yet launched); use allocation: device-plugin with pools, or DRA on the cluster's own nodes without pools "
    "(docs/steps/gpu-pools.md)")
AWS_ONLY_REQUIRED = ("role", "discovery_tag")
AWS_ONLY = (*AWS_ONLY_REQUIRED, "ami_version", "volume_size")  # the EC2NodeClass's own fields


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
    """An autoscaled GPU pool: a Karpenter NodePool and its node class (an EC2NodeClass on AWS, a KWOKNodeClass on
    Karpenter's KWOK provider), whose nodes arrive with node-prep's taint and labels."""

    name: str = Field(description="the NodePool's and its node class's name")
    provider: Literal["karpenter"] = "karpenter"
    cloud: Literal["aws", "kwok"] = Field(
        "aws", description="aws: an EC2NodeClass (Karpenter's AWS provider); kwok: a KWOKNodeClass (Karpenter's KWOK "
                           "provider: simulated nodes, for the local control plane and tests). Only the node class "
                           "and the instance GPU labels the NodePool selects on differ")
    role: str | None = Field(None, description="the IAM role of the nodes (EC2NodeClass spec.role); required with "
                                               "cloud aws")
    discovery_tag: str | None = Field(
        None, description="subnets and security groups tagged karpenter.sh/discovery=<this> (usually the EKS "
                          "cluster's name); required with cloud aws")
    ami_family: Literal["al2023", "bottlerocket"] = Field(
        "al2023", description="al2023: the EKS-optimized NVIDIA AMI; bottlerocket: Bottlerocket's NVIDIA variant "
                              "(with cloud kwok: the image the simulated nodes stand for)")
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
    def _aws_name(cls, value: str | None) -> str | None:
        if value is not None and not AWS_NAME.fullmatch(value):
            raise ValueError(f"{value[:60]!r} is not an IAM role name or tag value")
        return value

    def cloud_problem(self) -> tuple[str, str] | None:
        """(field, why) when a field does not fit the pool's cloud: the EC2NodeClass's fields are required on AWS
        and mean nothing to a KWOKNodeClass (refused there, so that a config copied between the two says what it
        lost). Checked by the Config, which knows the pool's index for the error's path."""
        if self.cloud == "aws":
            absent = next((name for name in AWS_ONLY_REQUIRED if getattr(self, name) is None), None)
            if absent:
                return absent, (f"required key is missing (cloud aws: the EC2NodeClass's {absent.replace('_', ' ')}"
                                f"; or set cloud: kwok for simulated nodes)")
            return None
        given = next((name for name in AWS_ONLY if name in self.model_fields_set), None)
        if given:
            return given, (f"an EC2NodeClass field, not used with cloud {self.cloud} (its KWOKNodeClass has no "
                           f"fields): remove it, or set cloud: aws")
        return None

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
        from gpu_bootstrap.core.catalogue import check_mirror
        return check_mirror(value)

    @field_validator("pull_secret")
    @classmethod
    def _secret(cls, value):
        if value is not None and (len(value) > 253 or not DNS1123_SUBDOMAIN.fullmatch(value)):
            raise ValueError(f"{value[:60]!r} is not a Secret name (a lowercase DNS subdomain)")
        return value
