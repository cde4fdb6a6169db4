"""One vocabulary for what a change acts on: `Ref` names a Kubernetes object, a Helm release or a node, `Verb` says
which adapter call makes a change real, and `Chart` names a chart to install.
Pure: imported by the engine, the steps and the adapters alike."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

RELEASE_API = "helm"  # not served by any API server: it marks a Helm release (not Flux's HelmRelease)
RELEASE_KIND = "release"  # lowercase, as no Kubernetes kind is


class Verb(StrEnum):
    APPLY = "apply"  # server-side apply of a whole object
    PATCH = "patch"
    CREATE = "create"
    DELETE = "delete"
    HELM_UPGRADE = "helm-upgrade"  # upgrade --install
    HELM_RECOVER = "helm-recover"  # clear a release left pending by an interrupted helm run
    HELM_UNINSTALL = "helm-uninstall"


@dataclass(frozen=True)
class Ref:
    api_version: str
    kind: str
    name: str
    namespace: str | None = None

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"

    @classmethod
    def of(cls, obj: dict) -> "Ref":
        meta = obj.get("metadata", {})
        return cls(obj["apiVersion"], obj["kind"], meta.get("name", ""), meta.get("namespace"))

    @classmethod
    def node(cls, name: str) -> "Ref":
        return cls("v1", "Node", name)

    @classmethod
    def release(cls, name: str, namespace: str) -> "Ref":
        return cls(RELEASE_API, RELEASE_KIND, name, namespace)


@dataclass(frozen=True)
class Chart:
    """A Helm chart: a chart name in `repo`, or a local .tgz or directory (repo None)."""

    ref: str
    repo: str | None
    version: str | None

    def describe(self) -> str:
        where = f" from {self.repo}" if self.repo else ""
        return f"{self.ref}{'@' + self.version if self.version else ''}{where}"
