"""The monitoring step's section: Prometheus (installed or attached), its storage, Grafana and the alerts."""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from gpu_bootstrap.core.config.fields import DNS1123_SUBDOMAIN, DURATION, QUANTITY, Section
from gpu_bootstrap.core.config.operator import GpuOperatorConfig

__all__ = ["AlertsConfig", "GrafanaConfig", "MonitoringConfig", "StorageConfig"]


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
    workload_gpu_rules: bool = Field(True, description="record each pod's and each workload's GPU utilization and "
                                                       "framebuffer use (namespace_workload:dcgm_gpu_utilization:avg"
                                                       ", ...): the series a KEDA ScaledObject scales GPU pods on")
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
