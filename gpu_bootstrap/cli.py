"""The `gpu-bootstrap` command line. Flags in, calls to app.py out; errors are caught once, here.

Heavy modules (pydantic, rich, kubernetes, paramiko, cryptography) are imported inside the commands so that
`gpu-bootstrap --help` starts fast.
"""
from __future__ import annotations

import signal
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import __version__
from .errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, GpuBootstrapError

app = typer.Typer(
    name="gpu-bootstrap",
    help="Turn a Kubernetes cluster with NVIDIA GPU nodes into a GPU platform, in one resumable command.\n\n"
         "Start with [bold]gpu-bootstrap init[/] to write a config, [bold]gpu-bootstrap doctor[/] to check the "
         "cluster and nodes, then [bold]gpu-bootstrap up --dry-run[/] to see the plan and [bold]gpu-bootstrap up"
         "[/] to apply it. Interrupted runs resume where they stopped.",
    no_args_is_help=True, rich_markup_mode="rich", pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]})


class Output(str, Enum):
    text = "text"
    json = "json"


ConfigOpt = Annotated[Optional[Path], typer.Option("-c", "--config", help="Config file.",
                                                   show_default="./gpu-bootstrap.yaml", metavar="FILE")]
KubeconfigOpt = Annotated[Optional[Path], typer.Option("--kubeconfig", metavar="FILE", help=(
    "Kubeconfig to use (overrides the config file and GPU_BOOTSTRAP_KUBECONFIG; default $KUBECONFIG, "
    "then ~/.kube/config)."))]
ContextOpt = Annotated[Optional[str], typer.Option("--context", help="Kubeconfig context to use.")]
VerboseOpt = Annotated[int, typer.Option("-v", "--verbose", count=True, help="More detail on stderr (-vv: debug).")]
LogFileOpt = Annotated[Optional[Path], typer.Option("--log-file", metavar="FILE", help=(
    "Write the full log here (default: a new file under ~/.local/state/gpu-bootstrap/logs)."))]
OutputOpt = Annotated[Output, typer.Option("-o", "--output", help="text for people, json for machines.")]
PlaybookOpt = Annotated[str, typer.Option("--playbook", metavar="NAME|PATH",
                                          help="Which ordered step list to run (playbooks/NAME.yaml or a path).")]
OnlyOpt = Annotated[Optional[list[str]], typer.Option("--only", metavar="STEP[,STEP]",
                                                      help="Run only these steps (repeatable).")]
SkipOpt = Annotated[Optional[list[str]], typer.Option("--skip", metavar="STEP[,STEP]",
                                                      help="Leave out these steps (repeatable).")]
ForceUnlockOpt = Annotated[bool, typer.Option("--force-unlock", help=(
    "Take the run lock even if another run seems to hold it. Only when you know that run is gone."))]


def _interrupt_on_sigterm() -> None:
    def handler(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def _fail(error: GpuBootstrapError, log_file) -> None:
    from .ui import print_error
    import logging
    logging.getLogger("gpu_bootstrap").error("%s", error.one_line(), exc_info=True)
    print_error(error.one_line(), log_file)
    raise typer.Exit(error.exit_code)


def _session(command: str, log_file: Optional[Path], verbose: int):
    from .ui import setup_logging
    return setup_logging(command, log_file, verbose)


def _unexpected(error: BaseException, log_file) -> None:
    import logging
    from .ui import print_error
    logging.getLogger("gpu_bootstrap").exception("internal error")
    print_error(f"internal error: {error!r} — this is a bug in gpu-bootstrap; please report it with the log file",
                log_file)
    raise typer.Exit(EXIT_FAILED)


def _run(command: str, log_file: Optional[Path], verbose: int, body) -> None:
    """Run a command body with logging, typed-error handling and signal handling in one place."""
    path = _session(command, log_file, verbose)
    _interrupt_on_sigterm()
    try:
        body(path)
    except typer.Exit:
        raise
    except GpuBootstrapError as error:
        _fail(error, path)
    except KeyboardInterrupt:
        from .errors import Interrupted
        _fail(Interrupted(), path)
    except Exception as error:  # noqa: BLE001 - the one place a bug becomes a message instead of a traceback
        _unexpected(error, path)


def _split(values) -> list[str]:
    from .pipeline.playbook import split_ids
    return split_ids(values)


# --- up ------------------------------------------------------------------------------------------------------------------
@app.command()
def up(
    config: ConfigOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help=(
        "Plan every step and apply nothing. With a reachable cluster the plan reads real state and the API "
        "validates each change (server-side dry run)."))] = False,
    offline: Annotated[bool, typer.Option("--offline", help=(
        "With --dry-run: no cluster and no SSH needed; plans against fresh nodes (the CI mode)."))] = False,
    kube_version: Annotated[Optional[str], typer.Option("--kube-version", metavar="X.Y[.Z]", help=(
        "With --offline: the Kubernetes version to plan for (default 1.33.0)."))] = None,
    preflight_report: Annotated[Optional[Path], typer.Option("--preflight-report", metavar="FILE", help=(
        "Node facts from a saved 'gpu-bootstrap doctor -o json' instead of SSH."))] = None,
    render_dir: Annotated[Optional[Path], typer.Option("--render-dir", metavar="DIR", help=(
        "Write each step's exact manifests and patches to DIR/NN-STEP/."))] = None,
    playbook: PlaybookOpt = "default",
    only: OnlyOpt = None,
    skip: SkipOpt = None,
    force_unlock: ForceUnlockOpt = False,
    output: OutputOpt = Output.text,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    verbose: VerboseOpt = 0,
    log_file: LogFileOpt = None,
) -> None:
    """Bring the cluster to the configured state, step by step; resumes where a previous run stopped.

    [bold]Examples[/]

      gpu-bootstrap up                                  # apply
      gpu-bootstrap up --dry-run                        # what would change, checked by the API server
      gpu-bootstrap up --dry-run --offline --render-dir out/   # CI: no cluster, manifests in out/
      gpu-bootstrap up --only node-prep -o json
    """
    from .app import Options

    options = Options(config, kubeconfig, context, playbook, _split(only), _split(skip), dry_run, offline,
                      kube_version, render_dir, preflight_report, force_unlock, output == Output.json)

    def body(log_path):
        from .app import build
        from .ui import JsonReporter, RichReporter, print_json
        reporter = JsonReporter() if options.json else RichReporter(dry_run)
        ctx, runner, playbook_used = build(options, reporter)
        try:
            results = runner.up(force_unlock=options.force_unlock)
        except GpuBootstrapError as error:
            if options.json:
                print_json({"steps": [r.to_json() for r in runner._ordered()], "ok": False,
                            "error": error.one_line()})
            raise
        ok = all(r.status not in ("failed", "interrupted") for r in results)
        if options.json:
            print_json({"steps": [r.to_json() for r in results], "ok": ok})
        else:
            title = f"gpu-bootstrap up{' --dry-run' if dry_run else ''} ({playbook_used.name})"
            reporter.summary(results, title)
            if options.render_dir:
                reporter.note(f"rendered manifests: {options.render_dir}/")
        if not ok:
            raise typer.Exit(EXIT_FAILED)

    _run("up", log_file, verbose, body)


# --- doctor --------------------------------------------------------------------------------------------------------------
@app.command()
def doctor(
    config: ConfigOpt = None,
    nodes: Annotated[Optional[str], typer.Option("--nodes", metavar="A,B", help="Check only these nodes.")] = None,
    no_cluster: Annotated[bool, typer.Option("--no-cluster", help=(
        "Check the nodes only (no Kubernetes API needed), e.g. before they join."))] = False,
    no_nodes: Annotated[bool, typer.Option("--no-nodes", help="Check the cluster and steps only (no SSH).")] = False,
    playbook: PlaybookOpt = "default",
    output: OutputOpt = Output.text,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    verbose: VerboseOpt = 0,
    log_file: LogFileOpt = None,
) -> None:
    """Check the cluster, every GPU node (over SSH, all at once) and every step, without changing anything.

    Exit 0 when no check failed, 1 otherwise. Node checks: ssh, nvidia-driver, nouveau, container-runtime,
    nvidia-container-toolkit — each pass, warn, fail or skip, with what to do about it.

    [bold]Examples[/]

      gpu-bootstrap doctor
      gpu-bootstrap doctor --nodes node5,node6 --no-cluster
      gpu-bootstrap doctor -o json > report.json      # reusable: up --preflight-report report.json
    """
    from .app import Options

    options = Options(config, kubeconfig, context, playbook)

    def body(log_path):
        from .app import build, cluster_checks, select_nodes
        from .probes import probe_nodes
        from .ui import Reporter, doctor_tables, print_json
        ctx, runner, _playbook = build(options, Reporter())
        try:
            names = select_nodes(ctx.config, nodes)
            reports = [] if no_nodes else probe_nodes(ctx.ssh, names)
            # the steps' checks read the same facts (no second round of SSH)
            ctx.facts["preflight"] = {r.name: r for r in reports if r.name in names}
            ctx.facts["preflight_source"] = "none (--no-nodes)" if no_nodes else "ssh"
            rows = []
            if not no_cluster:
                rows = [("cluster", check) for check in cluster_checks(ctx)]
                if all(check.status != "fail" for _name, check in rows):
                    rows += [(step.id, check) for step, check in runner.doctor()]
        finally:
            ctx.ssh.close()
        ok = all(check.status != "fail" for _name, check in rows) and all(r.ok for r in reports)
        if output == Output.json:
            print_json({"checks": [{"id": name, "status": c.status, "message": c.message} for name, c in rows],
                        "nodes": [r.to_json() for r in reports], "ok": ok})
        else:
            doctor_tables(rows, reports)
        if not ok:
            raise typer.Exit(EXIT_FAILED)

    _run("doctor", log_file, verbose, body)


# --- teardown ---------------------------------------------------------------------------------------------------------
@app.command()
def teardown(
    config: ConfigOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would be removed; change nothing.")] = False,
    yes: Annotated[bool, typer.Option("-y", "--yes", help="Do not ask for confirmation.")] = False,
    purge_crds: Annotated[bool, typer.Option("--purge-crds", help=(
        "Also delete the gpu-operator's CRDs (and every object of them); kept by default."))] = False,
    playbook: PlaybookOpt = "default",
    only: OnlyOpt = None,
    skip: SkipOpt = None,
    force_unlock: ForceUnlockOpt = False,
    output: OutputOpt = Output.text,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    verbose: VerboseOpt = 0,
    log_file: LogFileOpt = None,
) -> None:
    """Undo what `up` did, last step first: removes exactly what gpu-bootstrap added, keeps what you added.

    [bold]Examples[/]

      gpu-bootstrap teardown --dry-run
      gpu-bootstrap teardown --yes
    """
    from .app import Options

    options = Options(config, kubeconfig, context, playbook, _split(only), _split(skip), dry_run,
                      force_unlock=force_unlock, json=output == Output.json, purge_crds=purge_crds)

    def body(log_path):
        from .app import build
        from .ui import JsonReporter, RichReporter, print_json
        reporter = JsonReporter() if options.json else RichReporter(dry_run)
        ctx, runner, _playbook = build(options, reporter)
        if not dry_run and not yes:
            _confirm_teardown(runner, options.json)
        results = runner.teardown(force_unlock=force_unlock)
        if options.json:
            print_json({"steps": [r.to_json() for r in results], "ok": True})
        else:
            reporter.summary(results, f"gpu-bootstrap teardown{' --dry-run' if dry_run else ''}")

    _run("teardown", log_file, verbose, body)


def _confirm_teardown(runner, json_output: bool) -> None:
    from .errors import UsageError
    plans = runner.undo_plans()
    if not sys.stdin.isatty():
        raise UsageError("teardown needs confirmation", "pass --yes to run it non-interactively "
                                                        "(or --dry-run to see the plan)")
    from .ui import console
    out = console()
    total = sum(len(changes) for _step, changes in plans)
    out.print(f"teardown will make {total} change(s):")
    for step, changes in plans:
        for change in changes:
            out.print(f"  {step.id}: {change.describe()}", markup=False)
    if not typer.confirm("Proceed?", default=False):
        raise typer.Exit(EXIT_FAILED)


# --- simulate --------------------------------------------------------------------------------------------------------
class Track(str, Enum):
    A = "A"
    B = "B"


@app.command()
def simulate(
    pods: Annotated[Path, typer.Option("--pods", metavar="CSV", help=(
        "Pod list in the Alibaba openb format (name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...)."))],
    nodes: Annotated[Optional[Path], typer.Option("--nodes", metavar="CSV", help=(
        "Node inventory in the openb format (sn,cpu_milli,memory_mib,gpu,model)."))] = None,
    from_cluster: Annotated[bool, typer.Option("--from-cluster", help=(
        "Use the live cluster's schedulable nodes (allocatable, GPU model label) and what their pods already "
        "request, instead of --nodes."))] = False,
    config: ConfigOpt = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", metavar="KEY=VALUE", help=(
        "Try a scheduler setting without editing the config, e.g. --set strategy=RequestedToCapacityRatio "
        "--set 'resource_weights={nvidia.com/gpu: 100, cpu: 1}' (repeatable)."))] = None,
    track: Annotated[Track, typer.Option("--track", help=(
        "A: whole-GPU pods only (what kube-scheduler sees exactly). B: every pod, fractional GPUs rounded up to "
        "one (a stock device-plugin cluster)."))] = Track.A,
    seeds: Annotated[int, typer.Option("--seeds", min=1, max=100, help="Random seeds (42, 43, ...); medians are "
                                                                        "reported.")] = 5,
    tune: Annotated[float, typer.Option("--tune", help="Arrivals stop at this multiple of the GPU "
                                                       "capacity.")] = 1.3,
    policy: Annotated[Optional[list[str]], typer.Option("--policy", metavar="NAME", help=(
        "Also compare a built-in policy: random, blog-recipe (repeatable)."))] = None,
    default_nodes_to_score: Annotated[int, typer.Option("--default-nodes-to-score", metavar="PCT", help=(
        "percentageOfNodesToScore for the default profile: 100 scores every node (the benchmark's protocol), "
        "0 is kube-scheduler's adaptive default (slower to simulate)."))] = 100,
    departures: Annotated[float, typer.Option("--departures", metavar="P", help=(
        "Churn: after each arrival a random running pod leaves with this probability (0: none, as in the "
        "paper)."))] = 0.0,
    workers: Annotated[Optional[int], typer.Option("--workers", min=1, help="Processes (default: one per "
                                                                             "core).")] = None,
    plot_file: Annotated[Optional[Path], typer.Option("--plot", metavar="FILE.png", help=(
        "Draw GPU allocation against arrived demand for each policy (needs matplotlib)."))] = None,
    output: OutputOpt = Output.text,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    verbose: VerboseOpt = 0,
    log_file: LogFileOpt = None,
) -> None:
    """Replay a GPU workload trace onto nodes with kube-scheduler's scoring: the default profile against the
    bin-packing profile `up` deploys (from your config's `scheduler` section), before you deploy it.

    Pods are drawn at random from --pods until their GPU requests reach --tune x the GPUs, then placed one by one.
    Reported per policy (medians over seeds): GPUs allocated at 100% and 130% arrived, fragmentation failures
    (a pod rejected although enough GPUs were free in total), when the first one came, stranded GPUs, and free
    8-GPU nodes; with an offline first-fit-decreasing reference.

    [bold]Examples[/]

      gpu-bootstrap simulate --nodes openb_node_list_gpu_node.csv --pods openb_pod_list_default.csv
      gpu-bootstrap simulate --nodes N.csv --pods P.csv --track B --policy random --plot packing.png
      gpu-bootstrap simulate --from-cluster --pods P.csv --set 'resource_weights={nvidia.com/gpu: 100, cpu: 1}'
    """
    def body(log_path):
        from .sim.command import SimOptions, notes, plot, simulate as run_simulation, table
        from .ui import console, escape, print_json
        options = SimOptions(pods, nodes, from_cluster, config, list(set_ or []), track.value, seeds, tune,
                             list(policy or []), default_nodes_to_score, departures, workers, kubeconfig, context)
        if output == Output.json:
            document = run_simulation(options)
        else:
            from rich.progress import Progress
            with Progress(transient=True, console=console(stderr=True)) as bar:
                task = bar.add_task("simulating", total=None)
                document = run_simulation(options, progress=lambda: bar.advance(task))
        if plot_file:
            plot(document, plot_file)
        if output == Output.json:
            print_json({k: v for k, v in document.items()} | {"policies": [
                {k: v for k, v in p.items() if k != "curve"} for p in document["policies"]]})
            return
        out = console()
        out.print(table(document))
        for line in notes(document):
            out.print(escape(line))
        if plot_file:
            out.print(f"plot: {escape(str(plot_file))}")

    _run("simulate", log_file, verbose, body)


# --- init / version ---------------------------------------------------------------------------------------------------
@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the example config.")] = Path("gpu-bootstrap.yaml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented example config to start from."""
    from .app import write_example

    try:
        written = write_example(path, force)
    except GpuBootstrapError as error:
        from .ui import print_error
        print_error(error.one_line(), None)
        raise typer.Exit(error.exit_code)
    typer.echo(f"wrote {written}; edit `nodes`, then run: gpu-bootstrap doctor -c {written}")


@app.command()
def version() -> None:
    """Print the gpu-bootstrap version."""
    typer.echo(f"gpu-bootstrap {__version__}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":  # pragma: no cover
    main()


__all__ = ["app", "main", "EXIT_USAGE"]
