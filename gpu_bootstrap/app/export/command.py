"""The application layer of `gpu-bootstrap export`: plan a fresh install offline, with this cluster's Kubernetes
version and its GPU nodes' facts (read as `up` reads them: --preflight-report, SSH or the in-cluster probe), group
what the gate recorded into units (bundle.py), refuse what cannot live in Git, and write the engine's files
(formats.py) into DIR. Nothing is changed on the cluster; online, only reads are made.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpu_bootstrap.security import outdir, redact
from gpu_bootstrap.core.errors import ConfigError, GpuBootstrapError, UsageError
from gpu_bootstrap.app.export import bundle as bundle_module
from gpu_bootstrap.app.export import formats
from gpu_bootstrap.app.export.formats import Target

MARKER = ".gpu-bootstrap-export.json"  # in DIR: the files the last export wrote (removed before the next one)


@dataclass
class Exported:
    folder: Path
    engine: str
    files: list[str]
    bundle: bundle_module.Bundle
    secrets: dict[str, list[str]]  # release -> secret value paths left out
    gone: list[str] = dataclasses.field(default_factory=list)  # units the export before had and this one has not
    overridden: list = dataclasses.field(default_factory=list)  # overrides.Override: settings changed for the bundle


def export(options, engine: str, folder: Path, target: Target, chart_repositories: list[str] = (),
           certificates: str | None = None) -> Exported:
    """`chart_repositories`, `certificates`: the bundle's own chart sources and certificate mode (overrides.py),
    so that the config `up` runs with serves Git as well."""
    from gpu_bootstrap.app import commands as app
    if engine not in formats.FORMATS:
        raise UsageError(f"--format {engine!r} is not one of {', '.join(formats.FORMATS)}")
    if engine == "argocd" and not target.repo_url:
        raise UsageError("--format argocd needs --repo-url: the Git repository the export is committed to (Argo CD's "
                         "Applications point at its folders)", "add --repo-url https://git.example.com/fleet.git")
    check_target(engine, target)
    check_folder(folder)
    from gpu_bootstrap.app.export import overrides
    repositories = overrides.parse_chart_repositories(list(chart_repositories))
    config, overridden = overrides.apply(app.load_config(options), repositories, certificates)
    _refuse_generated_certificates(config, options)
    from gpu_bootstrap.security.tempfiles import run_folder_or_none
    # inside the run folder: a run killed with -9 leaves it (and the facts in it) to the next run's sweep
    with tempfile.TemporaryDirectory(prefix="gpu-bootstrap-export-", dir=run_folder_or_none()) as scratch:
        offline = dataclasses.replace(options, dry_run=True, offline=True, render_dir=None)
        if not options.offline:  # the cluster's version and its nodes' facts, read once; the plan itself is offline
            facts, config = cluster_facts(options, config, Path(scratch) / "facts.json")
            offline = dataclasses.replace(offline, **facts)
        ctx, runner, _playbook = app.build(offline, app.LogReporter(), config=config)
        try:
            results = runner.up()
            failed = [r for r in results if r.status == "failed"]
            if failed:
                raise GpuBootstrapError(f"the plan the export is made from failed at {failed[0].id}: "
                                        f"{failed[0].message}", "gpu-bootstrap up --dry-run shows the same plan")
            made = bundle_module.build(ctx.gate.submitted, ctx.server_version(), engine,
                                       run_steps={step.id for step in runner.steps if step.stateless})
            _refuse_unknown_facts(made)
            _refuse_local_charts(made, engine)
            rendered = _render_charts(ctx, made) if engine == "manifests" else None
        finally:
            ctx.close()
    files = formats.render(made, engine, target, rendered)
    secrets = {u.release.name: u.release.secret_paths for u in made.units if u.release and u.release.secret_paths}
    files["README.md"] = readme(made, engine, target, options, overridden)
    before = _units_of(_previous_files(folder))
    written = write(folder, files)
    return Exported(folder, engine, written, made, secrets, sorted(before - _units_of(written)), overridden)


NOT_UNITS = {"argocd", "flux", "values"}  # the folders of an export that are not units


def _previous_files(folder: Path) -> list[str]:
    """The files the export in `folder` wrote, as its marker lists them (none when there is no readable marker)."""
    marker = folder / MARKER
    if not marker.is_file():
        return []
    try:
        return list(json.loads(marker.read_text()).get("files", []))
    except (ValueError, AttributeError):
        return []


def _units_of(files: list[str]) -> set[str]:
    """The unit names an export's files make: its unit folders, and argocd's Applications (a chart's has no
    folder)."""
    units = set()
    for name in files:
        parts = Path(name).parts
        if len(parts) > 1 and parts[0] not in NOT_UNITS:
            units.add(parts[0])
        elif parts[:2] == ("argocd", "apps") and len(parts) == 3:
            units.add(Path(parts[2]).stem)
    return units


def check_target(engine: str, target: Target) -> None:
    """The engine's own settings: names Kubernetes accepts, and none given for another engine."""
    from gpu_bootstrap.core.config.fields import check_dns_label, check_dns_subdomain
    defaults = Target()
    argocd_only = {"--argocd-namespace": target.argocd_namespace != defaults.argocd_namespace,
                   "--argocd-project": target.argocd_project != defaults.argocd_project,
                   "--no-auto-sync": target.auto_sync != defaults.auto_sync}
    given = [flag for flag, set_ in argocd_only.items() if set_]
    if engine != "argocd" and given:
        raise UsageError(f"{', '.join(given)}: only for --format argocd, not {engine}", "leave it out")
    names = (("--argocd-namespace", target.argocd_namespace, True), ("--argocd-project", target.argocd_project, False),
             ("--flux-source", target.flux_namespace, True), ("--flux-source", target.flux_source, False))
    for flag, value, namespace in names:
        try:
            check_dns_label(value) if namespace else check_dns_subdomain(value)
        except ValueError as error:
            raise UsageError(f"{flag}: {error}") from None


def cluster_facts(options, config, report_path: Path) -> tuple[dict, object]:
    """Online: the API server's version, the listed GPU nodes' facts (SSH, the in-cluster probe or the report) saved
    for the offline plan, and the config with the nodes its `nodes` selector matches (Karpenter's), whose facts
    come from their pool. Reads only."""
    from gpu_bootstrap.app import commands as app
    ctx, _runner, _playbook = app.build(dataclasses.replace(options, dry_run=True, only=[], skip=[]),
                                        app.LogReporter(), config=config)
    try:
        version = ctx.server_version()
        pooled = set(ctx.config.selected_nodes)
        reports = {name: r for name, r in ctx.node_facts.reports().items() if name not in pooled}
        resolved = ctx.config
    finally:
        ctx.close()
    return app._saved_facts(version, reports, report_path), resolved


# --- refusals --------------------------------------------------------------------------------------------------------
def _refuse_generated_certificates(config, options) -> None:
    """A generated CA's private key is a secret: it cannot be committed, and a CA made anew on each export would
    not be the one the webhook's clients trust."""
    admission = config.admission
    skipped = set(options.skip)
    steps = set(options.only) if options.only else {"admission-opa", "admission"} - skipped
    if admission.enabled and admission.engine == "opa" and admission.certificates == "generated" and \
            steps & {"admission-opa", "admission"}:
        raise ConfigError("admission.certificates: generated: the webhook's CA is generated by `up` and its private "
                          "key lives only in a Secret of the cluster, so it cannot live in Git",
                          "export with --certificates cert-manager (or set admission.certificates: cert-manager; the "
                          "export then carries the Issuer, the Certificate and the CA-injector annotation, and no "
                          "key), or admission.engine: vap (no webhook), or leave the webhook out: --skip "
                          "admission-opa,admission")


def _refuse_unknown_facts(made) -> None:
    unknown = bundle_module.values_without_facts(made)
    if unknown:
        raise UsageError(f"the GPU nodes' facts were not read, and they decide {', '.join(unknown)} (unknown is not "
                         f"absent: the export does not guess them)",
                         "pass --preflight-report FILE (a saved `gpu-bootstrap doctor -o json`), or export online so "
                         "the facts are read over SSH or by the in-cluster probe (--via)")


def _refuse_local_charts(made, engine: str) -> None:
    if engine not in ("argocd", "flux"):
        return
    for unit in made.units:
        release = unit.release
        if release is not None and release.repo is None and not release.chart.startswith("oci://"):
            key = release.chart_field or f"{unit.step.replace('-', '_')}.chart"
            raise UsageError(f"{release.name}: the chart is a local file ({release.chart}), which {engine} cannot "
                             f"fetch", f"export with --chart-repository default (every local chart from its own "
                                       f"repository, at the same version) or --chart-repository "
                                       f"{key.removesuffix('.chart')}=URL (your mirror), or set {key}, or use "
                                       f"--format helmfile|manifests")


def _render_charts(ctx, made) -> dict[str, str]:
    from gpu_bootstrap.core.refs import Chart
    rendered = {}
    for unit in made.units:
        release = unit.release
        if release is None:
            continue
        try:
            text = ctx.helm.template(release.name, Chart(release.chart, release.repo, release.version),
                                     release.values, release.namespace, made.kube_version,
                                     include_crds=not release.skip_crds)
        except GpuBootstrapError as error:
            raise GpuBootstrapError(f"{release.name}: helm template could not render {release.chart}: "
                                    f"{error.one_line()}", "--format manifests renders the charts here: set the "
                                                           "chart to a local .tgz (helm pull) for an offline "
                                                           "export") from None
        kept, secrets = without_secrets(text)
        made.withheld += [f"Secret {release.namespace}/{name} (chart {release.chart})" for name in secrets]
        rendered[unit.id] = redact.manifests(kept)
    return rendered


def without_secrets(stream: str) -> tuple[str, list[str]]:
    """A chart's rendered documents without its Secrets (their values do not go to Git), and their names."""
    import re

    import yaml
    from gpu_bootstrap.adapters.helm import _CrdLoader
    kept, names = [], []
    for document in re.split(r"(?m)^---[ \t]*$", stream):
        try:
            loaded = yaml.load(document, Loader=_CrdLoader)
        except yaml.YAMLError:
            loaded = None
        if isinstance(loaded, dict) and loaded.get("kind") == "Secret" and loaded.get("apiVersion") == "v1":
            names.append((loaded.get("metadata") or {}).get("name", ""))
            continue
        kept.append(document)
    return "---".join(kept), names


# --- the folder ------------------------------------------------------------------------------------------------------
def check_folder(folder: Path) -> None:
    """DIR is new, empty, or a previous export (its marker lists what it wrote); anything else is refused, so an
    export never mixes with or removes files it did not write; one holding a link is refused (security/outdir.py)."""
    outdir.refuse_planted(folder, "-o")
    if folder.is_dir() and not (folder / MARKER).is_file():
        others = [p.name for p in folder.iterdir() if p.name not in (".git",)]
        if others:
            raise UsageError(f"-o {folder} is not empty and holds no earlier export ({', '.join(sorted(others)[:4])})",
                             "give a new or empty folder")


def write(folder: Path, files: dict[str, str]) -> list[str]:
    """Remove what the last export wrote, then write these files: folders 0700, files 0600, never through a link
    (as --render-dir)."""
    outdir.refuse_planted(folder, "-o")  # again: the plan took a while, and the folder may have changed since
    if (folder / MARKER).is_file():
        for name in _previous_files(folder):
            path = (folder / name).resolve()
            if folder.resolve() in path.parents and path.is_file():
                path.unlink()
        for path in sorted(folder.rglob("*"), reverse=True):  # folders the last export left empty
            if path.is_dir() and path.name != ".git" and ".git" not in path.parts and not any(path.iterdir()):
                shutil.rmtree(path)
    outdir.make_folder(folder)
    for name, text in sorted(files.items()):
        exact = not name.endswith((".yaml", ".md"))  # a ConfigMap's file: its bytes are the object's data
        outdir.write(folder, name, text if exact or text.endswith("\n") else text + "\n")
    outdir.write(folder, MARKER, json.dumps({"files": sorted(files)}, indent=1) + "\n")
    return sorted(files)


# --- README ----------------------------------------------------------------------------------------------------------
HOW = {
    "argocd": "Commit this folder. Once per Argo CD, merge `{path}/{health}` into argocd-cm (the command is in the "
              "file): without it Argo CD does not assess an Application's health (it stopped in 1.8), and the sync "
              "waves below would not wait for each other. Then `kubectl apply -n {ns} -f {path}/argocd/"
              "app-of-apps.yaml` once: the app-of-apps creates one Application per unit below, each in its sync "
              "wave, and starts a wave once every Application of the one before is Healthy.",
    "flux": "Commit this folder to the repository Flux syncs (GitRepository {source}), and add `{path}/flux` to "
            "what it reconciles (or `kubectl apply -k {path}/flux`): one Kustomization per unit below, each "
            "dependsOn the one before, with wait: true.",
    "helmfile": "`helmfile apply` in this folder installs the units below in order (`needs`); our own objects are "
                "local charts (each unit's folder: its manifests under manifests/, passed through unchanged).",
    "manifests": "`kubectl apply --server-side -k <unit>` for each unit below, in order (wait for each to be ready); "
                 "the charts are rendered here with `helm template` (CRDs included).",
}
MANUAL_SYNC = ("Exported with --no-auto-sync: nothing syncs by itself. Sync the app-of-apps (`argocd app sync "
               "gpu-bootstrap`), then each Application in the order of the table below (`argocd app sync "
               "gpu-bootstrap-<unit>`, then `argocd app wait gpu-bootstrap-<unit> --health`).")
ENGINE_NEEDS = {
    "argocd": "Argo CD 2.8 or later (Applications with `helm.valuesObject`, server-side apply) and the patch to "
              "argocd-cm above. The AppProject `{project}` must allow the source repositories {repos}, the "
              "destination namespaces {namespaces} and these cluster-scoped kinds: {cluster}.",
    "flux": "Flux 2.3 or later: source-controller, kustomize-controller and helm-controller, with their CRDs "
            "(Kustomization, HelmRepository, HelmRelease v2), and the GitRepository `{source}` syncing this "
            "repository.",
    "helmfile": "helmfile, helm 3.8 or later (or helm 4) and the helm-diff plugin (`helmfile apply` uses it).",
    "manifests": "kubectl 1.21 or later (`-k` with configMapGenerator options).",
}


def prerequisites(made, engine: str, target: Target) -> list[str]:
    """What must exist before the engine syncs this folder: the engine itself, cert-manager when a unit carries
    its objects, and a Secret (or file) for each secret value."""
    objects = [o for u in made.units for o in u.objects]
    repos = sorted({u.release.repo or u.release.chart.rpartition("/")[0] for u in made.units if u.release}
                   | ({target.repo_url} if target.repo_url else set()))
    namespaces = sorted({u.namespace for u in made.units if u.namespace})
    cluster = sorted({o["kind"] for o in objects if not o["metadata"].get("namespace")} | {
        "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"} if any(u.release for u in made.units) else
        {o["kind"] for o in objects if not o["metadata"].get("namespace")})
    needs = [ENGINE_NEEDS[engine].format(project=target.argocd_project, repos=", ".join(f"`{r}`" for r in repos),
                                         namespaces=", ".join(f"`{n}`" for n in namespaces),
                                         cluster=", ".join(cluster) or "none",
                                         source=f"{target.flux_namespace}/{target.flux_source}")]
    users = [u.id for u in made.units if any(o["apiVersion"].startswith("cert-manager.io/") for o in u.objects)]
    if users:
        needs.append(f"cert-manager (its CRDs and its CA injector), before unit {users[0]}: it issues the admission "
                     f"webhook's serving certificate and injects its CA into the webhook configuration "
                     f"(admission.certificates: cert-manager).")
    secret = [u.release.name for u in made.units if u.release and u.release.secret_paths]
    if secret:
        needs.append("The secret values of " + ", ".join(f"`{r}`" for r in secret) + ", as the Secrets section "
                     "below says.")
    return [f"- {line}" for line in needs]


SECRET_HOW = {
    "flux": "Create the Secret `{secret}` in namespace `{ns}` with one key, `{key}`, holding the values document "
            "below (the HelmRelease reads it with valuesFrom before its own values): `kubectl create secret generic "
            "{secret} -n {ns} --from-file={key}=FILE`, or the same Secret from SOPS, Sealed Secrets or External "
            "Secrets.",
    "helmfile": "Write the values document below to `{file}` (relative to this folder: outside it, so it stays out "
                "of Git; helmfile stops when the file is missing), or point that entry of helmfile.yaml at your "
                "secret store (helm-secrets, SOPS).",
    "argocd": "Argo CD takes values only from Git or the Application, so bring these with what your Argo CD uses for "
              "secrets: a second source from a private repository (`sources` with a `$values` ref), "
              "argocd-vault-plugin placeholders, or the chart's own `existingSecret`-style settings with a Secret "
              "you create.",
    "manifests": "The chart was rendered without these values, so its objects hold the chart's defaults there: "
                 "set them with the chart's own `existingSecret`-style settings (a Secret you create), or render "
                 "the chart yourself with the values document below.",
}


def secret_instructions(release, engine: str, target: Target) -> list[str]:
    """What to create for one release's secret values: where, which keys, and the values document's skeleton (each
    secret a placeholder naming its path; never a value)."""
    how = SECRET_HOW[engine].format(secret=formats.secret_name(release.name), ns=target.flux_namespace,
                                    key=formats.SECRET_VALUES_KEY, file=formats.helmfile_secret_file(release.name))
    return [f"### `{release.name}`: {len(release.secret_paths)} value(s) left out", "",
            "Left out because they are or may be secret: " + ", ".join(f"`{p}`" for p in release.secret_paths)
            + ".", "", how, "", "```yaml", formats.dump(release.secret_skeleton).rstrip("\n"), "```", ""]


def readme(made, engine: str, target: Target, options, overridden: list = ()) -> str:
    lines = [f"# gpu-bootstrap export ({engine})", "",
             f"What `gpu-bootstrap up` would apply to a fresh cluster of Kubernetes {made.kube_version} with these "
             f"GPU nodes, for {engine}. Written by `gpu-bootstrap export`; export again to update it (the files of "
             f"the last export are replaced, others kept).", "",
             HOW[engine].format(ns=target.argocd_namespace, path=target.path.strip("/") or ".",
                                health=formats.HEALTH_PATCH, source=f"{target.flux_namespace}/{target.flux_source}"),
             ""]
    if engine == "argocd" and not target.auto_sync:
        lines += [MANUAL_SYNC, ""]
    lines += ["## Overridden for this export", ""]
    if overridden:
        lines += ["These settings differ from the config (`up` uses the config's):", "",
                  "| setting | in the config | in this bundle | by |", "|---|---|---|---|",
                  *[o.line() for o in overridden], ""]
    else:
        lines += ["Nothing: the bundle uses the config's settings as they are.", ""]
    lines += ["## Before you sync", "", *prerequisites(made, engine, target), "",
              "## Units, in order", "", "| unit | step | what |", "|---|---|---|"]
    for unit in made.units:
        if unit.release:
            what = f"chart {unit.release.chart} {unit.release.version or ''} as release " \
                   f"{unit.release.namespace}/{unit.release.name}"
        else:
            what = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in unit.objects[:4]) + \
                (f" and {len(unit.objects) - 4} more" if len(unit.objects) > 4 else "")
        lines.append(f"| {unit.id} | {unit.step} | {what} |")
    config = f" -c {options.config}" if options.config else ""
    lines += ["", "## What stays imperative", ""]
    if made.imperative:
        lines.append("These are not objects a GitOps engine can own; run them once per cluster (and when nodes "
                     "join), after the engine synced:")
        lines += ["", "```", f"gpu-bootstrap up --only {','.join(made.imperative)}{config}", "```", ""]
        for step, planned in made.imperative.items():
            lines += [f"- {step}:"] + [f"  - {line}" for line in planned[:6]] + \
                ([f"  - ... and {len(planned) - 6} more"] if len(planned) > 6 else [])
        lines += ["", "Karpenter pools (`pools` in the config) carry the taint and labels for the nodes they "
                      "launch, so those need no command."]
    else:
        lines.append("Nothing: every change of the plan is an object here.")
    lines += ["", "## Secrets", ""]
    releases = [u.release for u in made.units if u.release and u.release.secret_paths]
    for release in releases:
        lines += secret_instructions(release, engine, target)
    if not releases and not made.withheld:
        lines.append("No secret value is in this folder, and none was left out.")
    if made.withheld:
        lines.append("Secrets the charts render were left out (their values do not go to Git): "
                     + ", ".join(made.withheld) + ". Create them in the cluster (sealed-secrets, SOPS or your secret "
                     "manager) before the units that use them, or let the chart make them: --format flux|argocd|"
                     "helmfile install the chart itself.")
    if made.redacted:
        lines.append("Objects with a secret-looking value replaced by `<redacted>` (keep it in a Secret): "
                     + ", ".join(made.redacted))
    lines += ["", "## Ownership and teardown", "",
              f"Every object of ours here carries the label app.kubernetes.io/managed-by=gpu-bootstrap (so "
              f"`gpu-bootstrap status` and `doctor` keep working) and the annotation "
              f"gpu-bootstrap.io/exported-to={engine}. `gpu-bootstrap teardown` refuses to delete what a GitOps "
              f"engine owns: remove the unit from Git and let the engine prune it."]
    return "\n".join(lines) + "\n"
