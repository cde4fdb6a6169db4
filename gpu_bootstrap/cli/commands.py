"""The `gpu-bootstrap` command line: flags in, calls to app/ out, results to ui.py; errors are caught once, here.

The options every command shares are declared once (SHARED) and added to each command by @command. Heavy modules
(pydantic, rich, kubernetes, paramiko, cryptography) are imported inside the commands so `--help` starts fast.
"""
import re
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer import Option
from typer.core import TyperGroup

from gpu_bootstrap import __version__
from gpu_bootstrap.cli.common import CLUSTER, PIPELINE, Output, options_from, relative_path, run, unwrapped
from gpu_bootstrap.cli.common import command as _command
from gpu_bootstrap.cli.simulate import register as register_simulate
from gpu_bootstrap.cli.status import register as register_status
from gpu_bootstrap.core.errors import EXIT_FAILED, EXIT_LEFT_WAITING, GpuBootstrapError

class _Group(TyperGroup):
    """`up --dry-run` alone means `--dry-run=server`; `--dry-run=client` is kubectl's other spelling. Click cannot
    give an option a value that may be left out, so the bare flag gets its value here, before parsing."""

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, dry_run_default(list(args)))


def dry_run_default(args: list[str]) -> list[str]:
    """`up ... --dry-run ...` -> `up ... --dry-run=server ...` (only for `up`, only before a `--`)."""
    command = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
    if command is None or args[command] != "up":
        return args
    out = list(args)
    for index in range(command + 1, len(out)):
        if out[index] == "--":
            break
        if out[index] == "--dry-run":
            out[index] = "--dry-run=server"
    return out


app = typer.Typer(
    name="gpu-bootstrap", cls=_Group,
    help="Turn a Kubernetes cluster with NVIDIA GPU nodes into a GPU platform, in one resumable command.\n\n"
         "Start with [bold]gpu-bootstrap init[/] to write a config, [bold]gpu-bootstrap doctor[/] to check the "
         "cluster and nodes, then [bold]gpu-bootstrap up --dry-run[/] to see the plan and [bold]gpu-bootstrap up"
         "[/] to apply it. Interrupted runs resume where they stopped.",
    no_args_is_help=True, rich_markup_mode="rich", pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]})


class DryRun(str, Enum):
    server = "server"
    client = "client"


class Via(str, Enum):
    ssh = "ssh"
    cluster = "cluster"
    auto = "auto"


VIA_HELP = ("How to read the node facts: ssh (from this machine), cluster (a short-lived read-only probe pod on each "
            "node, no SSH keys), or auto (ssh when the config has an `ssh` section or node addresses, else cluster). "
            "Default: the config's preflight.via.")


def command(*shared: str):
    return _command(app, *shared)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpu-bootstrap {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, Option("--version", callback=_version, is_eager=True,
                                        help="Print the version and exit.")] = False) -> None:
    """Turn a Kubernetes cluster with NVIDIA GPU nodes into a GPU platform, in one resumable command."""


@command(*PIPELINE)
def up(common, dry_run: Annotated[Optional[DryRun], Option("--dry-run", metavar="[=server|=client]", help=(
        "Plan every step and apply nothing. --dry-run (=server): the plan reads real state and the API validates "
        "each change (a server-side dry run, authorized like the write: the dry-run role). --dry-run=client: the "
        "plan is made from what can be read with get/list/watch, without Secrets (the plan role), and sends "
        "nothing; what it cannot read it reports as unknown."))] = None,
       offline: Annotated[bool, Option("--offline", help=(
           "With --dry-run: no cluster and no SSH needed; plans against fresh nodes (the CI mode)."))] = False,
       kube_version: Annotated[Optional[str], Option("--kube-version", metavar="X.Y[.Z]", help=(
           "With --offline: the Kubernetes version to plan for (default 1.33.0)."))] = None,
       preflight_report: Annotated[Optional[Path], Option("--preflight-report", metavar="FILE", help=(
           "Node facts from a saved 'gpu-bootstrap doctor -o json' instead of SSH."))] = None,
       render_dir: Annotated[Optional[Path], Option("--render-dir", metavar="DIR", help=(
           "Write each step's exact manifests and patches to DIR/STEP/ (DIR/steps.txt: their order)."))] = None,
       allow_operand_restart: Annotated[bool, Option("--allow-operand-restart", help=(
           "Let a plan change the driver, toolkit or runtime values of a running gpu-operator (it restarts the "
           "operands on every GPU node)."))] = False,
       allow_allocation_change: Annotated[bool, Option("--allow-allocation-change", help=(
           "Let a run move a running cluster between gpu_operator.allocation device-plugin and dra. GPUs are not "
           "advertised while one side goes and the other comes: pods waiting for GPUs then wait, and running "
           "pods keep their GPUs."))] = False,
       via: Annotated[Optional[Via], Option("--via", help=VIA_HELP)] = None,
       allow_incomplete: Annotated[bool, Option("--allow-incomplete", help=(
           "With --dry-run: accept a partial plan (a chart that could not be rendered, values decided without node "
           "facts) and exit 0, naming what is missing. Without it such a plan exits 1."))] = False) -> None:
    """Bring the cluster to the configured state, step by step; resumes where a previous run stopped.

    Who runs `up` is cluster-admin-equivalent: it installs privileged node agents (the gpu-operator's driver and
    toolkit DaemonSets run as root on every GPU node) and binds the charts' roles. Run it as an admin, or from a
    protected job with a short-lived token (`gpu-bootstrap rbac --for up`, then kubectl create token NAME
    --duration=1h). For plans, `--dry-run` with `rbac --for dry-run` (kept dry by an admission policy) and
    `--dry-run=client` with `rbac --for plan` (read-only) need far less.

    [bold]Examples[/]

      gpu-bootstrap up                        # apply
      gpu-bootstrap up --dry-run              # the plan, checked by the API
      gpu-bootstrap up --dry-run=client       # read-only plan (pull requests' CI)
      gpu-bootstrap up --dry-run --offline --render-dir out/
      gpu-bootstrap up --only node-prep -o json
    """
    mode = dry_run.value if dry_run else None
    options = options_from(common, dry_run=mode is not None, dry_run_mode=mode or "server", offline=offline,
                           kube_version=kube_version,
                       preflight_report=preflight_report, render_dir=render_dir,
                       allow_operand_restart=allow_operand_restart, via=via.value if via else None,
                       allow_allocation_change=allow_allocation_change)

    def body():
        from gpu_bootstrap.app import commands as application
        from gpu_bootstrap.cli.ui import JsonReporter, RichReporter, show_results
        reporter = JsonReporter() if options.json else RichReporter(mode is not None)
        results, playbook = application.up(options, reporter)
        note = f"rendered manifests: {render_dir}/" if render_dir else None
        flag = {None: "", "server": " --dry-run", "client": " --dry-run=client"}[mode]
        if not show_results(results, reporter, options.json, f"gpu-bootstrap up{flag} ({playbook.name})", note,
                            plan=mode is not None, allow_incomplete=allow_incomplete):
            raise typer.Exit(EXIT_FAILED)

    run("up", common, body)


@command("playbook", *CLUSTER)
def doctor(common, nodes: Annotated[Optional[str], Option("--nodes", metavar="A,B", help=(
        "Check only these nodes."))] = None,
           no_cluster: Annotated[bool, Option("--no-cluster", help=(
               "Check the nodes only (no Kubernetes API needed), e.g. before they join."))] = False,
           no_nodes: Annotated[bool, Option("--no-nodes", help="Check the cluster and steps only (no SSH).")] = False,
           via: Annotated[Optional[Via], Option("--via", help=VIA_HELP)] = None,
           preflight_report: Annotated[Optional[Path], Option("--preflight-report", metavar="FILE", help=(
               "The GPU nodes' facts from a saved 'gpu-bootstrap doctor -o json' (or one written by hand for nodes "
               "that cannot be read) instead of reading the nodes; the steps' checks use them as `up` "
               "would."))] = None,
           conformance: Annotated[Optional[Path], Option("--conformance", metavar="DIR", help=(
               "Fill in the Kubernetes AI Conformance checklist by proving each item on the cluster (a gang job "
               "admitted whole, a GPU node launched for a pending pod, GPU metrics, the device-access attack "
               "refused, Kueue's webhooks): writes DIR/AIConformance.yaml in the program's shape, DIR/junit.xml "
               "and a log per item. Creates what it needs in a namespace of its own and removes it."))] = None,
           read_only: Annotated[bool, Option("--read-only", help=(
               "With --conformance: only read (and server-side dry runs); items that need a workload say they "
               "were not checked."))] = False,
           conformance_metadata: Annotated[Optional[Path], Option("--conformance-metadata", metavar="FILE", help=(
               "With --conformance: YAML with the checklist's metadata (platformName, vendorName, websiteUrl, "
               "...)."))] = None,
           conformance_wait: Annotated[int, Option("--conformance-wait", metavar="SECONDS", min=10, max=3600, help=(
               "With --conformance: how long a check waits for what it started (a node launched, a gang "
               "admitted, a scrape)."))] = 360,
           ) -> None:
    """Check the cluster, every GPU node (over SSH, or with --via cluster a probe pod per node) and every step,
    without changing anything.

    Exit 0 when no check failed, 1 otherwise. Node checks: ssh, nvidia-driver, nouveau, container-runtime,
    nvidia-container-toolkit — each pass, warn, fail or skip, with what to do about it.

    [bold]Examples[/]

      gpu-bootstrap doctor
      gpu-bootstrap doctor --nodes node5,node6 --no-cluster
      gpu-bootstrap doctor -o json > report.json  # up --preflight-report
      gpu-bootstrap doctor --via cluster      # no SSH: a probe pod per node
      gpu-bootstrap doctor --preflight-report report.json   # nodes that cannot be read: their saved facts
      gpu-bootstrap doctor --conformance ai/ --conformance-metadata p.yaml
    """
    options = options_from(common, no_nodes=no_nodes, no_cluster=no_cluster, via=via.value if via else None,
                           preflight_report=preflight_report)
    if (read_only or conformance_metadata) and conformance is None:
        raise typer.BadParameter("goes with --conformance DIR", param_hint="--read-only/--conformance-metadata")
    if conformance is not None and no_cluster:
        raise typer.BadParameter("the checklist is proved on the cluster", param_hint="--no-cluster")

    def body():
        from gpu_bootstrap.app import commands as application
        from gpu_bootstrap.cli.ui import doctor_document, doctor_tables, print_json
        if conformance is not None:
            from gpu_bootstrap.cli.conformance_view import show_conformance
            said = None if options.json else (lambda item: typer.echo(f"checking {item} ...", err=True))
            report = application.conformance(options, conformance, read_only, conformance_metadata, nodes,
                                             progress=said, wait=conformance_wait)
            if not show_conformance(report, options.json):
                raise typer.Exit(EXIT_FAILED)
            return
        report = application.doctor(options, nodes)
        if options.json:
            print_json(doctor_document(report))
        else:
            doctor_tables(report.rows, report.nodes)
        if not report.ok:
            raise typer.Exit(EXIT_FAILED)

    run("doctor", common, body)


register_status(app)  # `status` (its flags live in cli/status.py), listed after doctor


class Certificates(str, Enum):
    generated = "generated"
    cert_manager = "cert-manager"


class ImagesOutput(str, Enum):
    text = "text"
    json = "json"
    hauler = "hauler"
    zarf = "zarf"
    skopeo = "skopeo"


@command("playbook", "config", "kubeconfig", "context", "verbose", "log_file")
def images(common, offline: Annotated[bool, Option("--offline", help=(
        "No cluster and no SSH: list for --kube-version and the nodes in --preflight-report."))] = False,
           kube_version: Annotated[Optional[str], Option("--kube-version", metavar="X.Y[.Z]", help=(
               "With --offline: the Kubernetes version to list for (default 1.33.0)."))] = None,
           preflight_report: Annotated[Optional[Path], Option("--preflight-report", metavar="FILE", help=(
               "Node facts (the GPU nodes' OS) from a saved 'gpu-bootstrap doctor -o json' instead of SSH."))] = None,
           check: Annotated[bool, Option("--check", help=(
               "Ask registry.mirror for each image (a HEAD on its manifest, OCI distribution API); exit 1 when any "
               "is missing. Credentials come from your docker config file."))] = False,
           output: Annotated[ImagesOutput, Option("-o", "--output", help=(
               "text for people, json for machines, or a mirroring tool's file on stdout: hauler (an Images "
               "manifest), zarf (a package's zarf.yaml), skopeo (a `skopeo sync --src yaml` file)."))
                             ] = ImagesOutput.text,
           allow_incomplete: Annotated[bool, Option("--allow-incomplete", help=(
               "Accept a partial list (a chart that could not be rendered) and exit 0, naming what is missing. "
               "Without it such a list exits 1."))] = False) -> None:
    """List every image the configured platform pulls on this cluster: our own, the charts' (hooks included) and the
    gpu-operator's operands (the driver per GPU node OS), sorted, each once, with who pulls it.

    With registry.mirror set, each line shows the image on the mirror and where to copy it from. Nothing is changed.

    [bold]Examples[/]

      gpu-bootstrap images
      gpu-bootstrap images --offline --kube-version 1.31 --preflight-report report.json -o json
      gpu-bootstrap images --check            # is every image in registry.mirror?
      gpu-bootstrap images -o hauler > images.yaml && hauler store sync -f images.yaml
      gpu-bootstrap images -o skopeo > sync.yaml && skopeo sync --src yaml --dest docker sync.yaml MIRROR
    """
    common["output"] = Output.json if output == ImagesOutput.json else Output.text
    options = options_from(common, offline=offline, kube_version=kube_version, preflight_report=preflight_report)

    def body():
        from gpu_bootstrap.app import commands as application
        found = application.images(options)
        if output.value in ("hauler", "zarf", "skopeo"):
            from gpu_bootstrap.app.export import mirror
            if found.incomplete and not allow_incomplete:
                from gpu_bootstrap.core.errors import GpuBootstrapError
                raise GpuBootstrapError(f"the image list is incomplete: {'; '.join(found.incomplete)}",
                                        "pass --allow-incomplete to accept a partial list")
            text = {"hauler": mirror.hauler, "skopeo": mirror.skopeo,
                    "zarf": lambda f: mirror.zarf(f, __version__)}[output.value](found)
            typer.echo(text, nl=False)
            return
        from gpu_bootstrap.cli.images_view import show_images
        present = application.check_images(found) if check else None
        if not show_images(found, present, options.json, allow_incomplete):
            raise typer.Exit(EXIT_FAILED)

    run("images", common, body)


class ExportFormat(str, Enum):
    argocd = "argocd"
    flux = "flux"
    helmfile = "helmfile"
    manifests = "manifests"


@command("playbook", "only", "skip", "config", "kubeconfig", "context", "verbose", "log_file")
def export(common, format_: Annotated[ExportFormat, Option("--format", help=(
        "argocd: an app-of-apps of Applications in sync waves; flux: Kustomizations (dependsOn) and HelmReleases; "
        "helmfile: a helmfile.yaml with needs; manifests: plain YAML with the charts rendered."))],
           out: Annotated[Path, Option("-o", "--out", metavar="DIR", help=(
               "Where to write (new, empty, or an earlier export, whose files are replaced)."))],
           repo_url: Annotated[Optional[str], Option("--repo-url", metavar="URL", help=(
               "argocd: the Git repository DIR is committed to."))] = None,
           repo_path: Annotated[Optional[str], Option("--repo-path", metavar="PATH", help=(
               "DIR's path inside that repository (default: DIR as given, relative)."))] = None,
           revision: Annotated[str, Option("--revision", metavar="REF", help=(
               "argocd: the branch, tag or commit to sync."))] = "HEAD",
           argocd_namespace: Annotated[str, Option("--argocd-namespace", metavar="NAMESPACE", help=(
               "argocd: where Argo CD runs (its Applications go there)."))] = "argocd",
           argocd_project: Annotated[str, Option("--argocd-project", metavar="PROJECT", help=(
               "argocd: the AppProject of the Applications; it must allow the chart repositories, DIR's "
               "repository and cluster-scoped objects (CRDs, webhooks, ClusterRoles)."))] = "default",
           no_auto_sync: Annotated[bool, Option("--no-auto-sync", help=(
               "argocd: no automated sync (no prune, no selfHeal): you sync each Application, in the README's "
               "order."))] = False,
           flux_source: Annotated[str, Option("--flux-source", metavar="NAMESPACE/NAME", help=(
               "flux: the GitRepository that holds DIR."))] = "flux-system/flux-system",
           offline: Annotated[bool, Option("--offline", help=(
               "No cluster and no SSH: export for --kube-version and the nodes in --preflight-report."))] = False,
           kube_version: Annotated[Optional[str], Option("--kube-version", metavar="X.Y[.Z]", help=(
               "With --offline: the Kubernetes version to export for (default 1.33)."))] = None,
           preflight_report: Annotated[Optional[Path], Option("--preflight-report", metavar="FILE", help=(
               "The GPU nodes' facts from a saved 'gpu-bootstrap doctor -o json'."))] = None,
           via: Annotated[Optional[Via], Option("--via", help=VIA_HELP)] = None,
           chart_repository: Annotated[Optional[list[str]], Option("--chart-repository", metavar="[SECTION=]SOURCE",
                                                                   help=(
               "The bundle's chart source, so the config `up` uses (local chart archives) serves Git too: default "
               "takes every chart given as a local file from its section's own repository, at the archive's "
               "version; SECTION=default or SECTION=URL (https:// or oci://, e.g. your mirror) one section's "
               "(gpu_operator, gpu_operator.dra_driver, monitoring). Repeatable. The README lists each."))] = None,
           certificates: Annotated[Optional[Certificates], Option("--certificates", help=(
               "The bundle's admission.certificates (a generated CA cannot live in Git: cert-manager). The "
               "README says it was overridden."))] = None) -> None:
    """Write what `up` would apply to this cluster as a GitOps engine's objects: the charts with the values derived
    from your GPU nodes' facts (each with its reason), our own objects as plain manifests, in the playbook's order.
    Nothing is changed on the cluster.

    Taints and labels on existing nodes and the validation run stay commands (DIR/README.md names them). A
    generated webhook CA cannot live in Git, and Argo CD and Flux cannot fetch a local chart archive: the same config
    `up` uses serves with --certificates cert-manager and --chart-repository default (DIR/README.md lists what was
    overridden).

    Secrets stay out of DIR: a chart value that is or may be secret is left out and DIR/README.md says which Secret
    (flux), file outside DIR (helmfile) or secret source (argocd) brings it back. Left out: values under keys
    naming a secret (password, passwd, pass, secret, token, apikey, key, credential, auth..., in any case, joined
    by _, - or .; not references such as secretName), env entries whose name names one, --flag=value arguments
    whose flag does, URLs with a user's password or a token in their path or query (webhooks), PEM blocks plain or
    base64, htpasswd lines, user:password strings, docker config JSON and strings that look like generated tokens.
    Secrets the charts render are left out of --format manifests, and DIR refuses links (exit 2).

    [bold]Examples[/]

      gpu-bootstrap export --format flux -o clusters/prod/gpu
      gpu-bootstrap export --format argocd -o gpu --repo-url https://git.example.com/fleet.git
      gpu-bootstrap export --format argocd -o gpu --repo-url URL --argocd-project platform --no-auto-sync
      gpu-bootstrap export --format helmfile -o gpu --offline --kube-version 1.31 --preflight-report report.json
      gpu-bootstrap export --format flux -o gpu --chart-repository default --certificates cert-manager
    """
    options = options_from(common, offline=offline, kube_version=kube_version, preflight_report=preflight_report,
                           via=via.value if via else None)
    namespace, _, name = flux_source.rpartition("/")

    def body():
        from gpu_bootstrap.app.export.command import export as run_export
        from gpu_bootstrap.app.export.formats import Target
        target = Target(repo_url=repo_url, revision=revision, path=repo_path or relative_path(out),
                        argocd_namespace=argocd_namespace, argocd_project=argocd_project,
                        auto_sync=not no_auto_sync, flux_namespace=namespace or "flux-system", flux_source=name)
        done = run_export(options, format_.value, out, target, chart_repository or [],
                          certificates.value if certificates else None)
        for override in done.overridden:
            typer.echo(f"overridden for this export: {override.key}: {override.was} -> {override.now}")
        typer.echo(f"wrote {len(done.files)} files to {out}/ ({format_.value}): {len(done.bundle.units)} units, "
                   f"in order: {', '.join(u.id for u in done.bundle.units)}")
        if done.bundle.imperative:
            typer.echo(f"not declarative (see {out}/README.md): gpu-bootstrap up --only "
                       f"{','.join(done.bundle.imperative)}")
        for release, paths in done.secrets.items():
            typer.echo(f"secret values left out of {release}: {', '.join(paths)} (see {out}/README.md)")
        if done.gone:
            typer.echo(f"warning: units of the export this one replaced are gone: {', '.join(done.gone)}. Your "
                       f"engine prunes them, and with them what they deployed, unless you release them first: see "
                       f"docs/upgrading.md, \"Exports: units renamed once\"", err=True)

    run("export", common, body)


@command(*PIPELINE)
def teardown(common, dry_run: Annotated[bool, Option("--dry-run", help=(
        "Show what would be removed; change nothing."))] = False,
             yes: Annotated[bool, Option("-y", "--yes", help="Do not ask for confirmation.")] = False,
             purge_crds: Annotated[bool, Option("--purge-crds", help=(
                 "Also delete the CRDs of the charts gpu-bootstrap installed (gpu-operator's nvidia.com and NFD "
                 "kinds, the Prometheus Operator's monitoring.coreos.com kinds) and every object of them; kept by "
                 "default."))] = False,
             offline: Annotated[bool, Option("--offline", help=(
                 "With --dry-run, no cluster: what a teardown of a fresh `up` of this config would remove (helm "
                 "renders the charts to name their CRDs where it can)."))] = False,
             kube_version: Annotated[Optional[str], Option("--kube-version", metavar="X.Y[.Z]", help=(
                 "With --offline: the Kubernetes version of that cluster (default 1.33)."))] = None,
             evict_workloads: Annotated[bool, Option("--evict-workloads", help="Remove the team queues and Kueue "
                                                     "even while users' jobs are admitted through them.")] = False,
             ) -> None:
    """Undo what `up` did, last step first: removes exactly what gpu-bootstrap added, keeps what you added.

    Removed: the objects and Helm releases gpu-bootstrap made (labelled app.kubernetes.io/managed-by=gpu-bootstrap,
    or adopted), the taint, labels and records it put on nodes, the namespaces it created, what its components made
    while running (the scheduler's Lease, the Prometheus Operator's kubelet Service), then its own namespace
    gpu-bootstrap. With --only/--skip, that namespace (the checkpoint) goes too once no step left out has a record
    or anything to undo. docs/what-up-changes.md lists it all.

    Pending pods that name the bin-packing scheduler are listed before it is removed (nothing would schedule them
    after); with --yes teardown goes ahead, names them in its summary and exits 3. Team queues are not removed while
    users' jobs are admitted through them (--evict-workloads).

    [bold]Examples[/]

      gpu-bootstrap teardown --dry-run
      gpu-bootstrap teardown --dry-run --offline --kube-version 1.31
      gpu-bootstrap teardown --yes
    """
    options = options_from(common, dry_run=dry_run, purge_crds=purge_crds, offline=offline, kube_version=kube_version,
                           evict_workloads=evict_workloads)

    def body():
        from gpu_bootstrap.app import commands as application
        from gpu_bootstrap.cli.ui import (JsonReporter, RichReporter, confirm_teardown, left_waiting, print_error,
                                          show_results)
        reporter = JsonReporter() if options.json else RichReporter(dry_run)
        results = application.teardown(options, reporter, None if yes else confirm_teardown, interactive())
        waiting = left_waiting(results)
        if not options.json:
            for line in waiting:
                reporter.note(f"{'would leave' if dry_run else 'left'} waiting: {line}")
        ok = show_results(results, reporter, options.json, f"gpu-bootstrap teardown{' --dry-run' if dry_run else ''}"
                                                           f"{' --offline' if offline else ''}")
        if ok and waiting and not dry_run:  # done, but what it left waiting is not a clean success: a script sees it
            print_error(f"teardown is done, but left {len(waiting)} thing(s) waiting: {waiting[0]}", None)
            raise typer.Exit(EXIT_LEFT_WAITING)

    run("teardown", common, body)


register_simulate(app)  # `simulate` (its flags live in cli/simulate.py), listed after teardown


class RbacFor(str, Enum):
    plan = "plan"
    dry_run = "dry-run"
    up = "up"
    status = "status"
    doctor = "doctor"
    probe = "probe"


@command("config", "playbook", "kubeconfig", "context", "verbose", "log_file")
def rbac(common, for_: Annotated[RbacFor, Option("--for", metavar="ROLE", help=(
        "The command to grant. plan: up --dry-run=client, read-only, no Secrets (a pull request's CI). dry-run: up "
        "--dry-run, kept dry by an admission policy (a trusted main-branch job). doctor: reads and dry runs, kept "
        "dry. probe: doctor plus the in-cluster node probe (node-root-equivalent, trusted use). status: reads and "
        "the Prometheus proxy. up: applies everything (cluster-admin-equivalent)."))],
         service_account: Annotated[Optional[str], Option("--service-account", metavar="NAMESPACE/NAME", help=(
             "Bind the roles to this ServiceAccount (needed by dry-run, doctor and probe, whose admission policy "
             "names it)."))] = None,
         kube_version: Annotated[Optional[str], Option("--kube-version", metavar="X.Y", help=(
             "The cluster's Kubernetes version, for dry-run, doctor and probe (default: asked of the cluster): "
             "their policy needs ValidatingAdmissionPolicy, 1.30+."))] = None,
         prometheus: Annotated[Optional[str], Option("--prometheus", metavar="NAMESPACE/SERVICE[:PORT]", help=(
             "The Prometheus Service status and doctor may proxy to (default: the one the monitoring step "
             "installs)."))] = None,
         allow_allocation_change: Annotated[bool, Option("--allow-allocation-change", help=(
             "Also grant what moving a running cluster between gpu_operator.allocation device-plugin and dra needs "
             "(up --allow-allocation-change removes the other mode's release): generate the role with this for "
             "that one run, whichever mode the config names."))] = False) -> None:
    """Print the least-privilege RBAC a command needs for the configured steps: a ClusterRole, a Role in each
    namespace where namespaced access suffices, and for identities that must not write for real an admission
    policy that holds them. No `*` verb or resource; a comment above each rule says which step or check needs it.

    RBAC cannot tell a dry run from a write: the API server authorizes `up --dry-run`'s dryRun=All requests exactly
    like real ones. So --for dry-run and --for doctor also print a ValidatingAdmissionPolicy and binding that deny
    every request of that ServiceAccount that is not a dry run (Kubernetes 1.30+; before that, --for dry-run exits 2:
    use --for plan). --for up is cluster-admin-equivalent (it installs privileged node agents): give it only to a
    protected job, as a short-lived token (kubectl create token NAME --duration=1h). docs/security.md has each
    role's attacks and results.

    [bold]Examples[/]

      gpu-bootstrap rbac --for plan --service-account ci/pr-plan > rbac.yaml
      gpu-bootstrap rbac --for dry-run --service-account ci/main > rbac.yaml
      gpu-bootstrap rbac --for status | kubectl apply -f -
    """
    def body():
        from gpu_bootstrap.app import rbac as application
        typer.echo(application.rbac(options_from(common, kube_version=kube_version,
                                                 allow_allocation_change=allow_allocation_change),
                                    for_.value, service_account, prometheus), nl=False)

    run("rbac", common, body)


@app.command()
def init(path: Annotated[Path, typer.Argument(help="Where to write the example config.")] = Path("gpu-bootstrap.yaml"),
         force: Annotated[bool, Option("--force", help="Overwrite an existing file.")] = False) -> None:
    """Write a commented example config (every section, with its defaults) to start from, and beside it
    gpu-bootstrap.schema.json, which the config's first line names so that editors (the YAML language server)
    complete and check every key."""
    from gpu_bootstrap.app.commands import write_example
    try:
        written = write_example(path, force)
    except GpuBootstrapError as error:
        from gpu_bootstrap.cli.ui import print_error
        print_error(error.one_line(), None)
        raise typer.Exit(error.exit_code)
    typer.echo(f"wrote {written} (and {written.parent / 'gpu-bootstrap.schema.json'} for your editor); edit `nodes`, "
               f"then run: gpu-bootstrap doctor -c {written}")


@app.command()
def version() -> None:
    """Print the gpu-bootstrap version."""
    typer.echo(f"gpu-bootstrap {__version__}")


for _registered in (init, version):  # registered with app.command() directly: their help wraps too
    _registered.__doc__ = unwrapped(_registered.__doc__)


def interactive() -> bool:
    """Can we ask a question? (a terminal on stdin)"""
    return sys.stdin.isatty()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        from gpu_bootstrap.core import interrupts
        sys.exit(interrupts.exit_code())  # 130 for Ctrl-C, 143 for SIGTERM


if __name__ == "__main__":  # pragma: no cover
    main()
