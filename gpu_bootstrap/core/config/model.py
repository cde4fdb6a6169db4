"""The whole config: every section, and the GPU nodes as a list or a label selector."""
from __future__ import annotations

from functools import lru_cache

from pydantic import ConfigDict, Field, PrivateAttr, create_model, model_validator

from gpu_bootstrap.core.config.fields import Section, selector_problem
from gpu_bootstrap.core.config.monitoring import MonitoringConfig
from gpu_bootstrap.core.config.operator import GpuOperatorConfig
from gpu_bootstrap.core.config.pools import KARPENTER_DOMAINS, POOLS_WITHOUT_DRA, PoolConfig, RegistryConfig
from gpu_bootstrap.core.config.scheduling import AdmissionConfig, SchedulerConfig
from gpu_bootstrap.core.config.sections import (ClusterConfig, NodeConfig, NodePrepConfig, PreflightConfig, SshConfig,
                                               ValidateConfig)

__all__ = ["Config"]


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

    @classmethod
    def keys(cls) -> list[str]:
        """The top-level keys of the file (a field's alias where it has one)."""
        return [field.alias or name for name, field in cls.model_fields.items()]

    @classmethod
    def extended(cls, sections: dict) -> type["Config"]:
        """This model with the sections steps bring themselves (key -> model, each a Section with defaults for
        every field): the step declares it (pipeline/step.py: Declaration.model), steps.config_model() asks."""
        clash = sorted(set(sections) & set(cls.keys()))
        if clash:
            raise ValueError(f"a step's config section is named like a built-in one: {', '.join(clash)}")
        return _extended(cls, tuple(sorted(sections.items(), key=lambda item: item[0])))

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
            if problem := pool.cloud_problem():
                raise ValueError(f"pools[{index}].{problem[0]}: {problem[1]}")
        if self.pools and self.gpu_operator.allocation == "dra":
            raise ValueError(f"pools[0]: {POOLS_WITHOUT_DRA}")
        if self.pools:
            for key in self.node_prep.labels:
                if key.partition("/")[0].endswith(KARPENTER_DOMAINS) or key == "kubernetes.io/hostname":
                    raise ValueError(f"node_prep.labels: {key!r} cannot go on a Karpenter node template (Karpenter "
                                     f"owns that label); pick another key")
        return self

    def node(self, name: str) -> NodeConfig:
        return next(n for n in self.nodes if n.name == name)


@lru_cache(maxsize=None)
def _extended(base: type[Config], sections: tuple) -> type[Config]:
    if not sections:
        return base
    fields = {key: (model, Field(default_factory=model)) for key, model in sections}
    return create_model("Config", __base__=base, __module__=base.__module__, **fields)
