"""Where GPU pods go: the bin-packing scheduler's section and admission's (OPA or the API server's policies)."""
from __future__ import annotations

import re
from typing import Literal

from pydantic import AliasChoices, Field, field_validator

from gpu_bootstrap.core.config.fields import SCHEDULER_RESOURCE, Section, _catalogued
from gpu_bootstrap.core.config.operator import GpuOperatorConfig

__all__ = ["AdmissionConfig", "IMAGE_REF", "OPA_IMAGE", "OpaConfig", "SchedulerConfig", "ShapePoint"]


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
