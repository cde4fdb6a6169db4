"""The one object every step receives: the config, the adapters, the gate, the reporter and the run's options.

Built once per command (app/commands.py's build()) and handed to every step. Adapters are chosen here and nowhere
else: an offline dry run gets the offline Kubernetes and Helm adapters and a node-facts source that has none, so no
step ever asks whether it is offline.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gpu_bootstrap.core.versions import server_version

if TYPE_CHECKING:
    from gpu_bootstrap.adapters.helm import Helm
    from gpu_bootstrap.adapters.kube import Kube
    from gpu_bootstrap.adapters.nodefacts import NodeFactsSource
    from gpu_bootstrap.adapters.ssh import Ssh
    from gpu_bootstrap.core.config import Config


class Gate(Protocol):
    """The one gate every change passes (pipeline/gate.py implements it). A Protocol here, so that this module needs
    nothing from the pipeline, whose step interface names Context: no import circle, not even for type checking."""

    mode: str
    submitted: list
    problems: dict

    @property
    def dry_run(self) -> bool: ...
    def submit(self, step_id: str, change): ...
    def notes_for(self, step_id: str) -> list[str]: ...


class Reporter(Protocol):
    """How the engine and the steps tell people what happens (cli/ui.py implements it; the engine knows no screen)."""

    def step_started(self, step) -> None: ...
    def step_finished(self, result) -> None: ...
    def change(self, step_id: str, change, applied: bool) -> None: ...
    def warn(self, message: str) -> None: ...
    def note(self, message: str) -> None: ...


class LogReporter:
    """A reporter that only logs (doctor, tests); cli/ui.py's reporters add the screen on top."""

    log = logging.getLogger("gpu_bootstrap.run")

    def step_started(self, step) -> None:
        self.log.info("step %s: %s", step.id, step.title)

    def step_finished(self, result) -> None:
        self.log.info("step %s: %s (%d changes) %s", result.id, result.status, result.changes, result.message)

    def change(self, step_id: str, change, applied: bool) -> None:
        self.log.info("%s: %s %s", step_id, "applied" if applied else "planned", change.describe())

    def warn(self, message: str) -> None:
        self.log.warning(message)

    def note(self, message: str) -> None:
        self.log.info(message)

    def kubernetes(self, version: str, source: str) -> None:
        """The Kubernetes version a plan is made for, and where it came from (said first)."""
        self.planned_for = (version, source)
        self.log.info("Kubernetes %s (%s)", version, source)


@dataclass(frozen=True)
class RunOptions:
    """What the command asked for that steps may read."""

    playbook: tuple[str, ...] = ()  # every step of the playbook, selected or not
    purge_crds: bool = False  # teardown --purge-crds
    allow_operand_restart: bool = False  # up --allow-operand-restart: driver/toolkit changes on a running release
    selected: tuple[str, ...] = ()  # the steps this run runs (--only/--skip applied); () when not known
    allow_allocation_change: bool = False  # up --allow-allocation-change: device plugin <-> DRA on a running cluster
    evict_workloads: bool = False  # teardown --evict-workloads: remove the queues while users' workloads are admitted


@dataclass
class Context:
    config: "Config"
    kube: "Kube"  # adapters.kube.Kube, or adapters.offline.OfflineKube
    helm: "Helm"  # adapters.helm.Helm, or adapters.offline.OfflineHelm
    node_facts: "NodeFactsSource"  # probed over SSH, read from a report, or none
    gate: Gate
    reporter: Reporter
    options: RunOptions = field(default_factory=RunOptions)
    ssh: "Ssh | None" = None
    kube_version: str | None = None  # known up front offline (--kube-version); read from the API otherwise
    fingerprint_key: bytes | None = None  # the cluster's key for step fingerprints (checkpoint.Checkpoint.key)

    def server_version(self) -> str:
        """The cluster's Kubernetes version (x.y.z), read once."""
        if self.kube_version is None:
            self.kube_version = server_version(self.kube.version())
        return self.kube_version

    def close(self) -> None:
        self.node_facts.close()
