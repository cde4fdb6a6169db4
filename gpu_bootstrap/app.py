"""What each command does, without the command-line parsing: build the context once, run the pipeline, report.

cli.py turns flags into calls here; tests can call these directly too.
"""
from __future__ import annotations

import logging
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from . import config as config_module
from .context import Context
from .errors import ConfigError, GpuBootstrapError, UsageError
from .pipeline import gate as gate_module
from .pipeline.playbook import load_playbook, select
from .pipeline.step import FAIL, PASS, Check
from .steps import load_step

log = logging.getLogger("gpu_bootstrap.app")
DEFAULT_KUBE_VERSION = "1.33.0"  # inside the default gpu-operator release's validated range
KUBE_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass
class Options:
    config: Path | None = None
    kubeconfig: Path | None = None
    context: str | None = None
    playbook: str = "default"
    only: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    dry_run: bool = False
    offline: bool = False
    kube_version: str | None = None
    render_dir: Path | None = None
    preflight_report: Path | None = None
    force_unlock: bool = False
    json: bool = False
    purge_crds: bool = False


def normalize_kube_version(text: str) -> str:
    match = KUBE_VERSION.fullmatch(text.strip())
    if not match:
        raise UsageError(f"--kube-version {text!r} is not a Kubernetes version", "use e.g. 1.31 or 1.31.2")
    major, minor, patch = match.groups()
    return f"{major}.{minor}.{patch or 0}"


def build(options: Options, reporter, mode_for_dry_run: str | None = None):
    """Load config and playbook, choose adapters and gate mode. Raises ConfigError before touching anything."""
    if options.offline and not options.dry_run:
        raise UsageError("--offline only makes sense with --dry-run", "add --dry-run")
    if options.kube_version and not options.offline:
        raise UsageError("--kube-version is for --offline dry runs; online, the cluster's version is used")
    overrides = {("cluster", "kubeconfig"): str(options.kubeconfig) if options.kubeconfig else None,
                 ("cluster", "context"): options.context}
    config = config_module.load(options.config, overrides=overrides)
    playbook = load_playbook(options.playbook)
    selected, skipped = select(playbook, options.only, options.skip)
    steps = [load_step(step_id) for step_id in selected]
    renderer = None
    if options.render_dir is not None:
        prepare_render_dir(options.render_dir)
        renderer = gate_module.Renderer(options.render_dir, list(playbook.steps))
    if options.offline:
        from .adapters.offline import OfflineKube
        kube_version = normalize_kube_version(options.kube_version or DEFAULT_KUBE_VERSION)
        kube = OfflineKube([n.name for n in config.nodes], kube_version)
        mode = gate_module.RECORD
    else:
        from .adapters.kube import Kube
        kube = Kube(config.cluster.kubeconfig, config.cluster.context)
        kube_version = None
        mode = (mode_for_dry_run or gate_module.SERVER_DRY_RUN) if options.dry_run else gate_module.APPLY
    from .adapters.helm import Helm
    from .adapters.ssh import Ssh
    helm = Helm(config.cluster.kubeconfig, config.cluster.context)
    gate = gate_module.Gate(mode, lambda: kube, renderer, lambda: helm)
    ctx = Context(config=config, gate=gate, reporter=reporter, kube=kube, offline=options.offline,
                  kube_version=kube_version, render_dir=options.render_dir,
                  preflight_report=options.preflight_report, ssh=Ssh(config.ssh, config.nodes), helm=helm,
                  facts={"playbook": list(playbook.steps), "purge_crds": options.purge_crds})
    from .pipeline.runner import Runner
    return ctx, Runner(ctx, steps, skipped, list(playbook.steps)), playbook


def prepare_render_dir(folder: Path) -> None:
    """Start from a clean render: remove the NN-step folders a previous render left, keep anything else."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--render-dir {folder} exists and is not a directory")
    folder.mkdir(parents=True, exist_ok=True)
    for child in folder.iterdir():
        if child.is_dir() and re.fullmatch(r"\d\d-[a-z0-9-]+", child.name):
            shutil.rmtree(child)


# --- doctor: the cluster itself ------------------------------------------------------------------------------------------
NEEDED_ACCESS = (
    ("patch", "", "nodes"), ("get", "", "nodes"), ("create", "", "namespaces"),
    ("create", "coordination.k8s.io", "leases"), ("update", "coordination.k8s.io", "leases"),
    ("create", "", "configmaps"), ("patch", "", "configmaps"),
)


def cluster_checks(ctx: Context) -> list[Check]:
    """Can we reach the API, which version is it, and may we do what `up` needs?"""
    try:
        version = ctx.server_version()
    except GpuBootstrapError as error:
        return [Check(FAIL, error.one_line(), facts={"id": "api"})]
    checks = [Check(PASS, f"Kubernetes v{version} at {ctx.kube.host}", facts={"id": "api", "version": version})]
    denied = []
    for verb, group, resource in NEEDED_ACCESS:
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                                  "namespace": "gpu-bootstrap" if resource in ("leases", "configmaps")
                                                  else ""}}}
        try:
            answer = ctx.kube.create(review)
        except GpuBootstrapError as error:
            return checks + [Check("warn", f"could not check permissions: {error.message}", facts={"id": "rbac"})]
        if not (answer.get("status") or {}).get("allowed"):
            denied.append(f"{verb} {resource}{'.' + group if group else ''}")
    if denied:
        checks.append(Check(FAIL, f"missing permissions: {', '.join(denied)}; run as a cluster admin",
                            facts={"id": "rbac"}))
    else:
        checks.append(Check(PASS, "permissions for every change `up` makes", facts={"id": "rbac"}))
    return checks


def select_nodes(config, text: str | None) -> list[str]:
    """--nodes a,b: the configured nodes to check (all when not given); unknown names are an error."""
    names = [n.name for n in config.nodes]
    if not text:
        return names
    wanted = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise UsageError(f"--nodes: {', '.join(unknown)} not in the config", f"configured: {', '.join(names)}")
    return wanted


def write_example(path: Path, force: bool) -> Path:
    if path.exists() and not force:
        raise ConfigError(f"{path} already exists", "pass --force to overwrite it")
    path.write_text(config_module.EXAMPLE)
    return path
