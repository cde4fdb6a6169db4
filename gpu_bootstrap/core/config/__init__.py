"""gpu-bootstrap.yaml: the typed config, its loader, and errors that name the field and the file line.

Precedence for the cluster and ssh keys: command-line flag > GPU_BOOTSTRAP_* environment variable > file > default.

- fields.py: the base Section, shared patterns and validators, label selectors, the catalogue's default images;
- sections.py: the cluster, SSH, nodes, node-prep, validation and preflight; operator.py: the gpu-operator's;
  monitoring.py: monitoring's; scheduling.py: the scheduler's and admission's; pools.py: Karpenter pools and the
  registry mirror;
- model.py: Config, the whole file; loading.py: reading, environment overrides, errors with lines;
- example.py: the JSON Schema and the example `init` writes.

Pure but for reading the file (loading.py). Everything public is imported from here
(`from gpu_bootstrap.core.config import X`): each module's __all__, named below one by one.
"""
from gpu_bootstrap.core.config.fields import (
    DEFAULT_CONFIG, DNS1123_LABEL, DNS1123_SUBDOMAIN, DURATION, ENV_OVERRIDES, HOSTNAME,
    LABEL_NAME, LABEL_VALUE, POSIX_USER, QUANTITY, SCHEDULER_RESOURCE, SELECTOR_TERM, Section, check_address,
    check_dns_label, check_dns_subdomain, check_label_key, check_label_value, check_node_name,
    selector_equalities, selector_problem)
from gpu_bootstrap.core.config.sections import (
    ClusterConfig, NodeConfig, NodePrepConfig, PreflightConfig, SshConfig, TaintConfig, ValidateConfig)
from gpu_bootstrap.core.config.operator import (
    DraDriverConfig, DriverUpgradeConfig, GpuOperatorConfig, SharingConfig)
from gpu_bootstrap.core.config.monitoring import (
    AlertsConfig, GrafanaConfig, MonitoringConfig, StorageConfig)
from gpu_bootstrap.core.config.scheduling import (
    AdmissionConfig, IMAGE_REF, OPA_IMAGE, OpaConfig, SchedulerConfig, ShapePoint)
from gpu_bootstrap.core.config.pools import (
    AWS_NAME, BUDGET_DURATION, BUDGET_NODES, KARPENTER_DOMAINS, KARPENTER_DURATION, PoolBudget, PoolConfig,
    PoolDisruption, PoolRequirements, RegistryConfig, check_karpenter_duration)
from gpu_bootstrap.core.config.model import Config
from gpu_bootstrap.core.config.loading import (
    Source, apply_env, describe_loc, load, load_node_free_sections, load_sections, parse_yaml, validate)
from gpu_bootstrap.core.config.example import (
    EXAMPLE, SCHEMA_FILE, SCHEMA_ID, example, json_schema, section_example)

__all__ = [
    "DEFAULT_CONFIG", "DNS1123_LABEL", "DNS1123_SUBDOMAIN", "DURATION", "ENV_OVERRIDES",
    "HOSTNAME", "LABEL_NAME", "LABEL_VALUE", "POSIX_USER", "QUANTITY", "SCHEDULER_RESOURCE", "SELECTOR_TERM",
    "Section", "check_address", "check_dns_label", "check_dns_subdomain", "check_label_key",
    "check_label_value", "check_node_name", "selector_equalities", "selector_problem", "ClusterConfig",
    "NodeConfig", "NodePrepConfig", "PreflightConfig", "SshConfig", "TaintConfig", "ValidateConfig",
    "DraDriverConfig", "DriverUpgradeConfig", "GpuOperatorConfig", "SharingConfig", "AlertsConfig",
    "GrafanaConfig", "MonitoringConfig", "StorageConfig", "AdmissionConfig", "IMAGE_REF", "OPA_IMAGE",
    "OpaConfig", "SchedulerConfig", "ShapePoint", "AWS_NAME", "BUDGET_DURATION", "BUDGET_NODES",
    "KARPENTER_DOMAINS", "KARPENTER_DURATION", "PoolBudget", "PoolConfig", "PoolDisruption", "PoolRequirements",
    "RegistryConfig", "check_karpenter_duration", "Config", "Source", "apply_env", "describe_loc", "load",
    "load_node_free_sections", "load_sections", "parse_yaml", "validate", "EXAMPLE", "SCHEMA_FILE", "SCHEMA_ID",
    "example", "json_schema", "section_example"]
