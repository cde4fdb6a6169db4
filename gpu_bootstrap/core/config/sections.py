"""The config's sections for the cluster, SSH, the nodes, node-prep, validation and preflight (the gpu-operator's
in operator.py, monitoring's in monitoring.py, the scheduler's and admission's in scheduling.py)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator

from gpu_bootstrap.core.config.fields import (
    POSIX_USER, Section, _catalogued, check_address, check_dns_label, check_label_key, check_label_value,
    check_node_name, parse_age)
from gpu_bootstrap.core.config.scheduling import OpaConfig

__all__ = [
    "ClusterConfig", "NodeConfig", "NodePrepConfig", "PreflightConfig", "SshConfig", "TaintConfig", "ValidateConfig"]


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

    # where kubeconfig and context were given (a file's line, a flag, an environment variable), for the errors
    # about them; set by loading.validate
    _origins: dict = PrivateAttr(default_factory=dict)

    @field_validator("kubeconfig")
    @classmethod
    def _expand(cls, value):
        return Path(os.path.expanduser(str(value))) if value else value

    def origin(self, key: str) -> str:
        """' (from environment variable GPU_BOOTSTRAP_CONTEXT)', ' (from gpu-bootstrap.yaml:3)', ... or ''."""
        where = self._origins.get(key)
        return f" (from {where})" if where else ""


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
    max_facts_age: str = Field(
        "7d", description="how old the facts the last successful preflight recorded may be to stand for a node this "
                          "run cannot read (unreachable, probe failed, preflight left out); they are used only for "
                          "the same boot of the same machine. 7d, 36h, 1d12h; 0s never reuses them")

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        return OpaConfig._image(value)

    @field_validator("max_facts_age")
    @classmethod
    def _age(cls, value: str) -> str:
        parse_age(value)
        return value
