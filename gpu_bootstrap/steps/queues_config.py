"""The queues step's config section (`queues:`), which the step brings itself (its declaration's model): teams, not
Kueue objects. render/queues.py turns it, with the node facts, into Kueue's objects and Configuration."""
from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from gpu_bootstrap.core.config.fields import QUANTITY, Section, check_dns_label

__all__ = ["DURATION", "KueueChartConfig", "QueuesConfig", "TeamConfig"]
DURATION = re.compile(r"([0-9]+(\.[0-9]+)?(ms|s|m|h))+")  # a Go duration, as Kueue's Configuration takes it
RESERVED_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")


class TeamConfig(Section):
    """One team: its namespaces share one GPU quota (a Kueue ClusterQueue of the cohort, a LocalQueue in each)."""

    name: str = Field(..., description="the team's name: its ClusterQueue's name (a DNS label)")
    namespaces: list[str] = Field(..., min_length=1, description="the team's namespaces; each gets a LocalQueue "
                                                                 "named `queues.local_queue`")
    gpus: int | dict[str, int] = Field(..., description="the team's GPU quota: a number (any GPU node), or GPUs per "
                                                        "product as preflight names it (e.g. {\"NVIDIA H100 80GB "
                                                        "HBM3\": 8})")
    cpu: str | None = Field(None, description="cpu quota (a quantity); default: all the GPU nodes' allocatable cpu, "
                                              "so GPUs are what is counted")
    memory: str | None = Field(None, description="memory quota (a quantity); default: the GPU nodes' allocatable")
    borrow: bool = Field(True, description="may use GPUs other teams' quotas leave idle (they are reclaimed when "
                                           "those teams submit, with `queues.preemption: reclaim`)")
    borrowing_limit: int | None = Field(None, ge=0, description="at most this many GPUs borrowed (default: no limit)")
    lend: bool = Field(True, description="lends its idle GPUs to the other teams")
    priority: int | None = Field(None, description="a WorkloadPriorityClass `<team>` with this value, which the "
                                                   "team's workloads name by the label kueue.x-k8s.io/priority-class")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_dns_label(value)

    @field_validator("namespaces")
    @classmethod
    def _namespaces(cls, value: list) -> list:
        for namespace in value:
            check_dns_label(namespace)
            if namespace in RESERVED_NAMESPACES:
                raise ValueError(f"{namespace} is Kubernetes' own namespace: a team's workloads do not run there")
        if len(set(value)) != len(value):
            raise ValueError("a namespace is listed twice")
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value):
        counts = value.values() if isinstance(value, dict) else [value]
        if isinstance(value, dict) and not value:
            raise ValueError("name at least one GPU product, or give a number")
        if any(isinstance(n, bool) or n < 0 for n in counts):
            raise ValueError("a GPU count is a whole number of at least 0")
        return value

    @field_validator("cpu", "memory")
    @classmethod
    def _quantity(cls, value):
        if value is not None and not QUANTITY.fullmatch(str(value)):
            raise ValueError(f"{str(value)[:40]!r} is not a quantity (e.g. 64, 500m, 256Gi)")
        return value

    @model_validator(mode="after")
    def _borrowing(self):
        if self.borrowing_limit is not None and not self.borrow:
            raise ValueError("borrowing_limit: set with borrow: false (drop one)")
        return self


class KueueChartConfig(Section):
    """Where Kueue itself comes from: its chart, installed as a release of its own."""

    chart: str = Field("kueue", description="a chart in `repository`, or a local .tgz or directory")
    repository: str = Field("oci://registry.k8s.io/kueue/charts", description="a chart repository or OCI path")
    version: str = Field("0.17.0", description="the chart version (its appVersion is Kueue's)")
    release: str = "kueue"
    namespace: str = "kueue-system"
    wait_timeout: int = Field(300, ge=10, description="seconds to wait for Kueue's controller and webhooks")

    @field_validator("release", "namespace")
    @classmethod
    def _names(cls, value: str) -> str:
        return check_dns_label(value)


class QueuesConfig(Section):
    """GPU quotas per team, borrowing and all-or-nothing admission (Kueue). No teams: nothing is installed, and what
    an earlier run installed is removed."""

    teams: list[TeamConfig] = Field(default_factory=list, description="the teams sharing the GPUs")
    cohort: str = Field("gpu-teams", description="the cohort the teams' ClusterQueues share (borrowing happens "
                                                 "within it)")
    local_queue: str = Field("gpus", description="the LocalQueue in each team namespace: workloads name it with the "
                                                 "label kueue.x-k8s.io/queue-name")
    preemption: str = Field("reclaim", description="reclaim: a team's workloads preempt what other teams borrowed "
                                                   "from its quota; off: borrowed GPUs are returned only when "
                                                   "workloads end")
    all_or_nothing: bool = Field(True, description="a workload's pods start together or not at all: admitted "
                                                   "workloads whose pods are not all ready within `timeout` are "
                                                   "evicted and requeued")
    timeout: str = Field("5m", description="how long an admitted workload's pods may take to be ready")
    sequential_admission: bool = Field(False, description="with all_or_nothing: the next workload is admitted only "
                                                          "once every pod of the last one is ready (Kueue's "
                                                          "blockAdmission), so no two gangs ever hold part of the "
                                                          "free GPUs at once; admissions become one at a time")
    require_queue: bool = Field(False, description="every Job and pod in a team namespace goes through the team's "
                                                   "queue, named or not (Kueue's manageJobsWithoutQueueName)")
    kueue: KueueChartConfig = Field(default_factory=KueueChartConfig)

    @field_validator("cohort", "local_queue")
    @classmethod
    def _names(cls, value: str) -> str:
        return check_dns_label(value)

    @field_validator("preemption")
    @classmethod
    def _preemption(cls, value: str) -> str:
        if value not in ("reclaim", "off"):
            raise ValueError(f"{value!r} is not one of: reclaim, off")
        return value

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: str) -> str:
        if not DURATION.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is not a duration (e.g. 5m, 90s, 1h)")
        return value

    @model_validator(mode="after")
    def _teams(self):
        names, owners = set(), {}
        for index, team in enumerate(self.teams):
            if team.name in names:
                raise ValueError(f"teams[{index}].name: team {team.name!r} is listed twice")
            names.add(team.name)
            for namespace in team.namespaces:
                if namespace in owners:
                    raise ValueError(f"teams[{index}].namespaces: {namespace} is team {owners[namespace]}'s already "
                                     f"(a namespace has one queue)")
                if namespace == self.kueue.namespace:
                    raise ValueError(f"teams[{index}].namespaces: {namespace} is Kueue's own namespace")
                owners[namespace] = team.name
        return self
