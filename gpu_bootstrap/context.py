"""The one object every step receives: the config, the adapters, the gate and the reporter.

Adapters are injected here and nowhere else; a step never constructs a client itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import Config
from .pipeline.gate import Gate


@dataclass
class Context:
    config: Config
    gate: Gate
    reporter: Any
    kube: Any  # adapters.kube.Kube, or adapters.offline.OfflineKube for --offline
    offline: bool = False
    kube_version: str | None = None
    render_dir: Path | None = None
    facts: dict = field(default_factory=dict)  # what earlier steps learned, for later ones (e.g. preflight)
    preflight_report: Path | None = None  # node facts from a saved `doctor -o json` instead of SSH
    ssh: Any = None  # adapters.ssh.Ssh
    helm: Any = None  # adapters.helm.Helm

    def server_version(self) -> str:
        """The cluster's Kubernetes version (x.y.z): --kube-version when offline, else the API's /version."""
        if self.kube_version is None:
            info = self.kube.version()
            self.kube_version = info.get("gitVersion", "").lstrip("v").split("-")[0].split("+")[0]
        return self.kube_version
