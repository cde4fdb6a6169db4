"""The application layer: what each command does, without the command-line parsing. `build` makes the one context
(config, adapters, gate, reporter) and the runner; the command functions below run them and return data that cli/ui.py
shows. cli/commands.py turns flags into Options and calls here; tests can call these directly too.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from gpu_bootstrap.core import config as config_module
from gpu_bootstrap.pipeline.context import Context, LogReporter, RunOptions
from gpu_bootstrap.core.errors import ConfigError, GpuBootstrapError, UsageError
from gpu_bootstrap.pipeline import gate as gate_module
from gpu_bootstrap.app.playbook import load_playbook, select
from gpu_bootstrap.core.outcomes import FAIL, PASS, WARN
from gpu_bootstrap import steps as step_registry
from gpu_bootstrap.steps import load_step
from gpu_bootstrap.core.versions import DEFAULT_KUBE_VERSION, control_plane_version, normalize_kube_version

log = logging.getLogger("gpu_bootstrap.app")


@dataclass
class Options:
    """Everything a command was asked, whichever command: flags override the environment, which overrides the file."""

    config: Path | None = None
    kubeconfig: Path | None = None
    context: str | None = None
    playbook: str = "default"
    only: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    dry_run: bool = False
    dry_run_mode: str = "server"  # with dry_run: server (dryRun=All requests) or client (nothing sent)
    offline: bool = False
    kube_version: str | None = None
    render_dir: Path | None = None
    preflight_report: Path | None = None
    force_unlock: bool = False
    json: bool = False
    purge_crds: bool = False
    evict_workloads: bool = False  # teardown --evict-workloads
    no_nodes: bool = False  # doctor --no-nodes: no SSH
    no_cluster: bool = False  # doctor --no-cluster: no Kubernetes API
    allow_operand_restart: bool = False
    allow_allocation_change: bool = False  # up --allow-allocation-change
    via: str | None = None  # doctor/up --via ssh|cluster|auto (None: the config's preflight.via)


def load_config(options: Options):
    overrides = {("cluster", "kubeconfig"): str(options.kubeconfig) if options.kubeconfig else None,
                 ("cluster", "context"): options.context}
    # the model with the sections steps bring themselves (core/config cannot know them)
    return config_module.load(options.config, overrides=overrides, model=step_registry.config_model())


def build(options: Options, reporter, mode_for_dry_run: str | None = None, config=None, world=None,
          secretless: bool = False):
    """Load config and playbook, choose the adapters and the gate's mode, build the context and the runner.
    Raises ConfigError (exit 2) before anything is touched. `config`: an already loaded config (images); `world`:
    (kube, helm) of an offline run that stand for a cluster (teardown --offline: the one a fresh up leaves)."""
    if options.offline and not options.dry_run:
        raise UsageError("--offline only makes sense with --dry-run", "add --dry-run")
    if options.kube_version and not options.offline:
        raise UsageError("--kube-version is for --offline dry runs; online, the cluster's version is used")
    config = config if config is not None else load_config(options)
    playbook = load_playbook(options.playbook)
    selected, skipped = select(playbook, options.only, options.skip)
    kube, helm, mode, kube_version = _cluster_adapters(options, config, secretless)
    if world is not None:
        kube, helm = world
    if not options.offline and not options.no_cluster:
        config = resolve_selected_nodes(config, kube)
    node_facts = _node_facts(options, config, kube, probe="preflight" in selected)
    render_dir = None
    if options.render_dir is not None:
        from gpu_bootstrap.pipeline.render_dir import RenderDir, prepare
        prepare(options.render_dir, list(playbook.steps))
        render_dir = RenderDir(options.render_dir, list(playbook.steps), helm)
    ctx = Context(config=config, kube=kube, helm=helm, node_facts=node_facts,
                  gate=gate_module.Gate(mode, kube, helm, render_dir), reporter=reporter,
                  options=RunOptions(playbook=tuple(playbook.steps), purge_crds=options.purge_crds,
                                     evict_workloads=options.evict_workloads,
                                     allow_operand_restart=options.allow_operand_restart, selected=tuple(selected),
                                     allow_allocation_change=options.allow_allocation_change),
                  ssh=getattr(node_facts, "ssh", None), kube_version=kube_version)
    from gpu_bootstrap.pipeline.runner import Runner
    shown = [s for s in skipped if s in options.skip]  # --only hides what it leaves out; --skip shows it
    runner = Runner(ctx, [load_step(step_id) for step_id in selected], skipped, list(playbook.steps), shown,
                    unselected_steps=[load_step(step_id) for step_id in skipped])
    return ctx, runner, playbook


RELAY_POOL = 64  # connections helm's relay keeps to the API server: helm's watches and writes run in parallel


def _cluster_adapters(options: Options, config, secretless: bool = False):
    """(kube, helm, gate mode, known Kubernetes version): the offline pair, or the real cluster's. `secretless`
    (dry runs, doctor): no Secret of ours is read, but the state record's key (adapters/secretless.py)."""
    if options.offline:
        from gpu_bootstrap.adapters.offline import OfflineHelm, OfflineKube
        try:
            # a minor alone ('1.24', or the default's) plans for its newest known patch, as a maintained cluster runs
            given = options.kube_version or ".".join(DEFAULT_KUBE_VERSION.split(".")[:2])
            version = normalize_kube_version(control_plane_version(given))
        except ValueError as error:
            raise UsageError(f"--kube-version: {error}", "use e.g. 1.31 or 1.31.2") from None
        return OfflineKube([n.name for n in config.nodes], version), OfflineHelm(), gate_module.RECORD_ONLY, version
    from gpu_bootstrap.adapters.helm import Helm
    from gpu_bootstrap.adapters.kube import Kube
    kubeconfig = config.cluster.kubeconfig
    if not options.no_cluster:
        kubeconfig = check_kubeconfig(config.cluster)
    mode = gate_module.APPLY
    if options.dry_run:
        mode = gate_module.RECORD_ONLY if options.dry_run_mode == "client" else gate_module.SERVER_DRY_RUN
    from gpu_bootstrap.adapters.relay import Relay
    kube = Kube(kubeconfig, config.cluster.context)
    relayed = Kube(kubeconfig, config.cluster.context, pool_size=RELAY_POOL)  # helm's own, many at once
    helm = Helm(kubeconfig, config.cluster.context, relay=Relay(relayed), kube=kube)
    if mode == gate_module.RECORD_ONLY or secretless:  # the plan, dry-run and doctor roles read no Secret of ours, so
        # no helm release record either (docs/security.md: what they cannot show)
        from gpu_bootstrap.adapters.secretless import SecretlessHelm, SecretlessKube
        from gpu_bootstrap.pipeline import checkpoint
        helm = SecretlessHelm(helm, kube)
        if secretless:
            kube = SecretlessKube(kube, ((checkpoint.KEY_SECRET, checkpoint.NAMESPACE),))
    return kube, helm, mode, None


def resolve_selected_nodes(config, kube):
    """`nodes: <label selector>`: the cluster's nodes that match it join the configured ones, each with the pool of
    ours that launched it (karpenter.sh/nodepool), so that every step treats them as GPU nodes."""
    if config.node_selector is None:
        return config
    found = {}
    for node in kube.list("v1", "Node", label_selector=config.node_selector):
        pool = ((node.get("metadata") or {}).get("labels") or {}).get("karpenter.sh/nodepool")
        found[node["metadata"]["name"]] = pool if config.pool(pool) else None
    return config.with_selected_nodes(found)


def _node_facts(options: Options, config, kube, probe: bool):
    """Where this run's node facts come from; nodes the `nodes` selector matched have their pool's facts."""
    source = _reachable_facts(options, config, kube, probe)
    if not config.selected_nodes:
        return source
    from gpu_bootstrap.adapters.nodefacts import WithPoolNodes
    return WithPoolNodes(source, config)


def _reachable_facts(options: Options, config, kube, probe: bool):
    """Where the listed nodes' facts come from: --preflight-report, else a probe (SSH or the cluster) when preflight
    is part of the run. Online, a node that cannot be read gets the facts the last successful preflight recorded,
    when they may stand for it (young enough, same boot of the same machine), so neither leaving preflight out nor
    an unreachable node turns facts into "absent"."""
    from gpu_bootstrap.adapters.nodefacts import NoNodeFacts, ProbedNodes, ReportedNodes, WithRecordedFacts, \
        recorded_only
    from gpu_bootstrap.core.config.fields import parse_age
    names = [n.name for n in config.nodes if n.name not in config.selected_nodes]
    if options.offline:
        if options.preflight_report is not None:
            return ReportedNodes(names, options.preflight_report)
        return NoNodeFacts(names, "none (offline)", "no node facts in an offline run; pass --preflight-report FILE "
                                                    "(a saved 'gpu-bootstrap doctor -o json') to plan with them")
    if options.no_nodes:
        return NoNodeFacts(names, "none (--no-nodes)", "nodes not checked (--no-nodes)")
    max_age = parse_age(config.preflight.max_facts_age)
    if options.preflight_report is not None:
        source = ReportedNodes(names, options.preflight_report)
    elif not probe:
        return recorded_only(names, kube, max_age)
    elif probe_via(options, config) == "cluster":
        from gpu_bootstrap.adapters.nodefacts import ClusterProbedNodes
        source = ClusterProbedNodes(names, kube, config.preflight, getattr(config, "registry", None))
    else:
        from gpu_bootstrap.adapters.ssh import Ssh
        source = ProbedNodes(names, Ssh(config.ssh, [n for n in config.nodes if n.name in names]))
    return source if options.no_cluster else WithRecordedFacts(source, kube, max_age)


def probe_via(options: Options, config) -> str:
    """ssh or cluster: --via, else preflight.via; `auto` is SSH when the config can reach the nodes over SSH (it has
    an `ssh` section, or a node has an `address`) or there is no cluster to ask (--no-cluster), else the cluster."""
    via = options.via or config.preflight.via
    if via not in ("auto", "ssh", "cluster"):
        raise UsageError(f"--via: {via!r} is not one of ssh, cluster, auto")
    if via == "cluster" and options.no_cluster:
        raise UsageError("--via cluster probes the nodes through the cluster, which --no-cluster leaves out",
                         "drop --no-cluster, or use --via ssh")
    if via == "auto":
        reachable = "ssh" in config.model_fields_set or any(n.address for n in config.nodes)
        via = "ssh" if reachable or options.no_cluster else "cluster"
    return via


def check_kubeconfig(cluster) -> Path | None:
    """Bad input before any connection: a kubeconfig that does not exist, or a context it does not have, is exit 2
    naming the file (and the contexts it has), and where the setting came from (a flag, an environment variable, a
    config file's line). `cluster`: the config's cluster section. Returns the path to use (None: the client's
    default)."""
    path, context = cluster.kubeconfig, cluster.context
    candidates = [Path(path)] if path else [Path(p) for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    candidates = candidates or [Path("~/.kube/config").expanduser()]
    existing = [p for p in candidates if p.is_file()]
    if not existing:
        given = cluster.origin("kubeconfig") if path else " (from environment variable KUBECONFIG)" \
            if os.environ.get("KUBECONFIG") else ""
        raise ConfigError(f"kubeconfig {', '.join(map(str, candidates))} not found{given}",
                          "pass --kubeconfig FILE, set cluster.kubeconfig or KUBECONFIG, or work without a cluster: "
                          "up --dry-run --offline (the plan), doctor --no-cluster (the nodes only)")
    if context:
        import yaml
        names = []
        for candidate in existing:
            try:
                document = yaml.safe_load(candidate.read_text()) or {}
            except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
                raise ConfigError(f"kubeconfig {candidate} cannot be read: {error}") from None
            names += [c.get("name") for c in (document.get("contexts") or []) if isinstance(c, dict)]
        if context not in names:
            raise ConfigError(f"kubeconfig {', '.join(map(str, existing))} has no context {context!r}"
                              f"{cluster.origin('context')}", f"its contexts: {', '.join(n for n in names if n) or 'none'}")
    return Path(path) if path else None


# --- the commands ----------------------------------------------------------------------------------------------------
def kubernetes_source(options: Options) -> str:
    """Where the Kubernetes version a run plans for came from, said on its first line."""
    if not options.offline:
        return "the cluster's"
    if options.kube_version:
        return f"--kube-version {options.kube_version}"
    return "offline default; --kube-version X.Y plans for yours"


def up(options: Options, reporter):
    """Returns (results, playbook). A failure carries the results so far (error.results). A dry run reads no
    Secret of ours, as its role may not (adapters/secretless.py)."""
    ctx, runner, playbook = build(options, reporter, secretless=bool(options.dry_run))
    try:
        if options.offline or options.dry_run:
            reporter.kubernetes(ctx.server_version(), kubernetes_source(options))
        return runner.up(force_unlock=options.force_unlock), playbook
    except GpuBootstrapError as error:
        error.results = runner.ordered_results()
        raise
    finally:
        ctx.close()


def teardown(options: Options, reporter, confirm=None, interactive: bool = False):
    """confirm(plans, left_waiting) -> bool is asked before a real teardown (None: no question, as with --yes),
    which needs a terminal to ask on (`interactive`); left_waiting: step id -> what its undo leaves waiting (pods
    naming a scheduler it removes), which every result of such a step also carries. --offline: the teardown of the cluster a fresh `up` leaves."""
    if options.offline:
        if not options.dry_run:
            raise UsageError("teardown --offline only previews a teardown", "add --dry-run")
        return teardown_after_fresh_up(options, reporter)
    if confirm is not None and not options.dry_run and not interactive:
        raise UsageError("teardown needs confirmation", "pass --yes to run it non-interactively (or --dry-run to see "
                                                        "the plan)")
    ctx, runner, _playbook = build(options, reporter)
    try:
        plans = None
        if confirm is not None and not options.dry_run:
            plans = runner.undo_plans()
            if not confirm(plans, runner.left_waiting(plans)):
                raise Aborted()
        return runner.teardown(force_unlock=options.force_unlock, plans=plans)
    finally:
        ctx.close()


def teardown_after_fresh_up(options: Options, reporter):
    """`teardown --dry-run --offline`: the steps' own teardown plan, as a dry run, on the cluster a fresh `up` of
    this config leaves (app/inventory.py)."""
    from gpu_bootstrap.app import inventory
    config = load_config(options)
    fresh = inventory.fresh_up(options, config, build, LogReporter())
    ctx, runner, _playbook = build(options, reporter, config=config, world=(fresh.kube, fresh.helm))
    try:
        inventory.add_running_and_state(fresh.kube, runner.steps, ctx)
        reporter.kubernetes(fresh.version, kubernetes_source(options))
        reporter.note("the teardown of the cluster a fresh `up` of this config leaves (no cluster was read)")
        for note in fresh.notes:
            reporter.note(note)
        if any(step.id == "gpu-operator" for step in runner.steps):
            reporter.note("not listed, as only a cluster knows them: the labels the gpu-operator and NFD put on "
                          "each node for its hardware (teardown removes those that came with the operator)")
        return runner.teardown()
    finally:
        ctx.close()


class Aborted(GpuBootstrapError):
    def __init__(self):
        super().__init__("aborted", "nothing was changed")


@dataclass
class DoctorReport:
    rows: list  # (check id, Check) for the cluster and every step
    nodes: list  # NodeReport per node
    ok: bool


def doctor(options: Options, node_names: str | None) -> DoctorReport:
    if options.preflight_report is not None and (options.via or options.no_nodes):
        flag = "--via" if options.via else "--no-nodes"
        raise UsageError(f"--preflight-report gives the nodes' facts, so {flag} has nothing to do",
                         f"drop {flag}, or drop --preflight-report to read the nodes")
    ctx, runner, _playbook = build(options, LogReporter(), secretless=True)
    try:
        ctx.node_facts.select(select_nodes(ctx.config, node_names))  # the steps' checks see the same nodes
        reports = list(ctx.node_facts.reports().values())
        rows = []
        if not options.no_cluster:
            rows = [("cluster", check) for check in cluster_checks(ctx)]
            if all(check.status != FAIL for _name, check in rows):
                rows += [(step.id, check) for step, check in runner.doctor()]
                from gpu_bootstrap.render import admission as opa
                from gpu_bootstrap.security import hardening
                rows += hardening.checks(ctx, {step.id for step in runner.steps},  # admission; OPA reachable
                                         (opa.labels(opa.selector()), opa.PORT))
            if ctx.config.registry.mirror and rows and rows[0][1].status != FAIL:
                rows.append(("registry", mirror_check(options, ctx.server_version(), ctx.node_facts.reports())))
    finally:
        ctx.close()
    ok = all(check.status != FAIL for _name, check in rows) and all(r.ok for r in reports)
    return DoctorReport(rows, reports, ok)


def conformance(options: Options, folder: Path, read_only: bool, metadata_file: Path | None, node_names=None,
                progress=None, wait: float = 360):
    """`doctor --conformance DIR`: the AI Conformance checklist proved item by item (app/conformance.py)."""
    from gpu_bootstrap.app import conformance as checks
    metadata = conformance_metadata(metadata_file)  # a bad file is refused before anything is asked
    ctx, runner, _playbook = build(options, LogReporter(), secretless=True)
    try:
        ctx.node_facts.select(select_nodes(ctx.config, node_names))
        return checks.run(ctx, {step.id for step in runner.steps}, folder, read_only, metadata, progress, wait)
    finally:
        ctx.close()


def conformance_metadata(path: Path | None) -> dict:
    """The checklist's metadata from a YAML file (platformName, vendorName, ...), over gpu-bootstrap's defaults."""
    import yaml
    from gpu_bootstrap import __version__
    from gpu_bootstrap.render.conformance import METADATA_FIELDS
    metadata = {"platformName": "gpu-bootstrap", "platformVersion": __version__}
    if path is None:
        return metadata
    try:
        given = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"--conformance-metadata {path}: {error}") from None
    if not isinstance(given, dict):
        raise ConfigError(f"--conformance-metadata {path}: expected a mapping of the checklist's metadata fields",
                          f"fields: {', '.join(METADATA_FIELDS)}")
    for key, value in given.items():
        if key not in METADATA_FIELDS or key == "kubernetesVersion":
            raise ConfigError(f"--conformance-metadata {path}: unknown field {key!r}",
                              f"fields: {', '.join(k for k in METADATA_FIELDS if k != 'kubernetesVersion')} (the "
                              f"Kubernetes version is the cluster's)")
        if not isinstance(value, str):
            raise ConfigError(f"--conformance-metadata {path}: {key} must be a string")
    return metadata | given


def images(options: Options, cluster_facts: tuple[str, dict] | None = None):
    """`images`: the ImageList (app/images.py) of what the configured platform pulls on this cluster. It is read from a
    fresh-install plan (an offline render, as `up --dry-run --offline --render-dir` makes) for the cluster's
    Kubernetes version and its GPU nodes' facts: offline, --kube-version and --preflight-report give them; online,
    the API server and preflight over SSH do. The render is made without the mirror, so each image's source is known;
    its mirror reference is the same path on registry.mirror (what the mirrored render holds). `cluster_facts`:
    (Kubernetes version, node reports) already read (doctor), so nothing is read twice."""
    import dataclasses
    import tempfile
    from gpu_bootstrap.app import images as image_list
    from gpu_bootstrap.security.tempfiles import run_folder_or_none
    config = load_config(options)
    plain = config.model_copy(update={"registry": config.registry.model_copy(update={"mirror": None})})
    # inside the run folder: a run killed with -9 leaves it to the next run's sweep (security/tempfiles.py)
    with tempfile.TemporaryDirectory(prefix="gpu-bootstrap-images-", dir=run_folder_or_none()) as folder:
        render = Path(folder) / "render"
        offline = dataclasses.replace(options, dry_run=True, offline=True, render_dir=render, only=[], skip=[])
        if cluster_facts is not None:
            offline = dataclasses.replace(offline, **_saved_facts(*cluster_facts, Path(folder) / "facts.json"))
        elif not options.offline:
            offline = dataclasses.replace(offline, **_cluster_facts(options, config, Path(folder) / "facts.json"))
        ctx, runner, _playbook = build(offline, LogReporter(), config=plain)
        try:
            results = runner.up()
            reports = ctx.node_facts.reports()
            charts = image_list.charts_of(ctx.gate.submitted)
        finally:
            ctx.close()
        failed = [r for r in results if r.status == "failed"]
        if failed:
            raise GpuBootstrapError(f"the plan the image list is read from failed at {failed[0].id}: "
                                    f"{failed[0].message}", "gpu-bootstrap up --dry-run shows the same plan")
        documents, not_rendered = _rendered_documents(render)
    found = image_list.collect(documents, reports, bool(reports), config.gpu_operator.driver_management,
                               config.registry.mirror, not_rendered)
    found.charts = charts
    if probe_via(options, config) == "cluster":  # the probe runs at preflight time, so no render holds it
        from gpu_bootstrap.core.catalogue import pin
        found.add(pin(config.preflight.image), config.registry.mirror,
                  "gpu-bootstrap preflight (pods of the in-cluster probe: preflight.via cluster)")
    found.mirror, found.plain_http = config.registry.mirror, config.registry.plain_http
    return found


def _cluster_facts(options: Options, config, report_path: Path) -> dict:
    """Online `images`: the API server's version and the GPU nodes' facts (preflight over SSH, or the
    --preflight-report), saved for the offline render. Reads only."""
    import dataclasses
    ctx, _runner, _playbook = build(dataclasses.replace(options, dry_run=True, only=[], skip=[]), LogReporter(),
                                    config=config)
    try:
        version = ctx.server_version()
        reports = ctx.node_facts.reports()
    finally:
        ctx.close()
    return _saved_facts(version, reports, report_path)


def _saved_facts(version: str, reports: dict, report_path: Path) -> dict:
    """The options that plan offline with these facts: a 0600 preflight report written for the offline render."""
    import json
    from gpu_bootstrap.probes.report import document
    if not reports:  # no node facts (doctor --no-nodes): the driver's OS is unknown, and the list says so
        return {"kube_version": version}
    report_path.touch(mode=0o600)
    report_path.write_text(json.dumps(document(list(reports.values()))))
    return {"kube_version": version, "preflight_report": report_path}


def _rendered_documents(render: Path) -> tuple[dict, dict]:
    """step id -> [(file name, document)] of a render dir, and step id -> why its chart was not rendered."""
    import yaml
    from gpu_bootstrap.pipeline.render_dir import step_folders
    documents: dict[str, list] = {}
    not_rendered: dict[str, str] = {}
    for step, folder in step_folders(render):
        for path in sorted(folder.glob("*.yaml")):
            if path.name in ("values.yaml", "release.yaml"):
                continue
            documents.setdefault(step, []).extend((path.name, doc) for doc in yaml.safe_load_all(path.read_text()))
        missing = folder / "manifests-not-rendered.txt"
        if missing.exists():
            not_rendered[step] = missing.read_text().splitlines()[0]
    return documents, not_rendered


def mirror_check(options: Options, version: str, reports: dict):
    """doctor with registry.mirror set: is every image of `images` in the mirror? (the same check as --check)"""
    from gpu_bootstrap.pipeline.step import Check
    try:
        found = images(options, (version, reports))
        present = check_images(found)
    except GpuBootstrapError as error:
        return Check(FAIL, error.one_line(), facts={"id": "registry"})
    missing = sorted(ref for ref, there in present.items() if not there)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        return Check(FAIL, f"{len(missing)} of {len(present)} images missing from {found.mirror}: {shown}; "
                           f"gpu-bootstrap images --check lists them", facts={"id": "registry", "missing": missing})
    if found.incomplete:
        return Check(WARN, f"all {len(present)} listed images are in {found.mirror}, but the list is incomplete: "
                           f"{'; '.join(found.incomplete)}", facts={"id": "registry"})
    return Check(PASS, f"all {len(present)} images are in {found.mirror}", facts={"id": "registry"})


def check_images(found, environ: dict | None = None) -> dict[str, bool]:
    """`images --check` and doctor: reference -> present in registry.mirror (the OCI distribution API)."""
    from gpu_bootstrap.adapters.registry import check
    if not found.mirror:
        raise UsageError("images --check asks registry.mirror, and none is set",
                         "set registry.mirror: HOST[:PORT][/PREFIX] in the config")
    return check([image.reference for image in found.sorted()], found.plain_http, environ)


def simulate(sim_options, options: Options, progress=None) -> dict:
    """`simulate` with the config, environment and flags taken as `up` takes them (one precedence)."""
    from gpu_bootstrap.sim.command import simulate as run, validate
    validate(sim_options)  # flag mistakes first: a bad --track needs no cluster to be refused
    settings, cluster = config_module.load_sections(options.config, overrides={
        ("cluster", "kubeconfig"): str(options.kubeconfig) if options.kubeconfig else None,
        ("cluster", "context"): options.context})
    kube = None
    if sim_options.from_cluster:
        from gpu_bootstrap.adapters.kube import Kube
        kube = Kube(check_kubeconfig(cluster), cluster.context)
    return run(sim_options, settings, kube, progress)


# --- doctor: the cluster itself ----------------------------------------------------------------------------------------
NEEDED_ACCESS = (
    ("patch", "", "nodes"), ("get", "", "nodes"), ("create", "", "namespaces"),
    ("create", "coordination.k8s.io", "leases"), ("update", "coordination.k8s.io", "leases"),
    ("create", "", "configmaps"), ("patch", "", "configmaps"),
)


def cluster_checks(ctx: Context) -> list:
    """Can we reach the API, which version is it, and may we do what `up` needs?"""
    from gpu_bootstrap.pipeline.step import Check
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
            return checks + [Check(WARN, f"could not check permissions: {error.message}", facts={"id": "rbac"})]
        if not (answer.get("status") or {}).get("allowed"):
            denied.append(f"{verb} {resource}{'.' + group if group else ''}")
    if denied:  # a warning: an identity made for doctor or dry runs (gpu-bootstrap rbac) may rightly lack them
        checks.append(Check(WARN, f"missing permissions: {', '.join(denied)}: this identity can check and plan but "
                                  f"not run `up`; run up as a cluster admin, or grant what `gpu-bootstrap rbac --for "
                                  f"up` prints", facts={"id": "rbac"}))
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
    """The commented example config, its first line pointing editors at the JSON Schema written beside it (so they
    complete and check every key, offline too)."""
    if path.exists() and not force:
        raise ConfigError(f"{path} already exists", "pass --force to overwrite it")
    import json
    schema = path.parent / config_module.SCHEMA_FILE
    schema.write_text(json.dumps(config_module.json_schema(step_registry.config_model()), indent=1) + "\n")
    path.write_text(f"# yaml-language-server: $schema=./{config_module.SCHEMA_FILE}\n" + example_config())
    return path


def example_config() -> str:
    """`init`'s example: the built-in sections, then each section a step brings itself (as its declaration says)."""
    return config_module.example([d.example or config_module.section_example(d.section, d.model, d.title)
                                  for d in step_registry.declarations() if d.model is not None])


def status(options: Options, status_options):
    """`status`: a function that reads the cluster once more each time it is called (--watch calls it again)."""
    from gpu_bootstrap.app import status as cluster_status
    cluster_status.validate(status_options)
    sections = config_module.load_node_free_sections(options.config, overrides={
        ("cluster", "kubeconfig"): str(options.kubeconfig) if options.kubeconfig else None,
        ("cluster", "context"): options.context})
    from gpu_bootstrap.adapters.kube import Kube
    kube = Kube(check_kubeconfig(sections.cluster), sections.cluster.context)
    return lambda: cluster_status.collect(kube, status_options, sections)
