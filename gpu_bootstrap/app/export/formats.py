"""A bundle as the files of one engine. Pure: each function returns {relative path: text}.

Every kustomize-based format (argocd, flux, manifests) writes our own objects the same way, one folder per unit
(`<unit>/NN-kind-name.yaml` and a kustomization.yaml listing them, CRDs and namespaces first), so `kubectl apply -k
<unit>` works too. A ConfigMap that holds files (the OPA policy, the dashboards) is kept as those files, in a folder
named after it, and made by the kustomization's configMapGenerator, so a pull request shows the policy as Rego, not
as an escaped string. helmfile gets each unit as a small local chart instead (helm reads the same files with
.Files). They differ in how the charts are carried and how the order is kept:

- manifests: the charts rendered with `helm template` into their unit's folder; the order is the README's list of units.
- argocd: an app-of-apps: argocd/app-of-apps.yaml points at argocd/apps/, one Application per unit, its sync
  wave the unit's place; a chart's Application carries the chart, its pinned version and its values. The waves
  wait for the Applications before them only where Argo CD assesses an Application's health, which it stopped doing
  by default in 1.8: argocd/argocd-cm-application-health.yaml is the patch to argocd-cm that restores it.
- flux: flux/kustomizations.yaml, one Kustomization per unit (dependsOn the one before, wait: true); a chart's
  folder holds its HelmRepository and HelmRelease.
- helmfile: helmfile.yaml with the chart repositories and one release per unit (needs the one before); our own
  objects as local charts (Chart.yaml, the manifests under manifests/ passed through unchanged, so the alert rules'
  own `{{ $labels }}` templates are not read as Helm's).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from gpu_bootstrap.pipeline.render_dir import _BlockDumper, dump
from gpu_bootstrap.app.export.bundle import Bundle, Release, Unit

MANAGED = {"app.kubernetes.io/managed-by": "gpu-bootstrap", "app.kubernetes.io/part-of": "gpu-bootstrap"}
FORMATS = ("argocd", "flux", "helmfile", "manifests")


@dataclass
class Target:
    """Where the export is committed and who reconciles it."""

    repo_url: str | None = None  # argocd: the Git repository holding the export
    revision: str = "HEAD"
    path: str = "."  # the export's folder inside that repository
    argocd_namespace: str = "argocd"  # where Argo CD runs: the Applications go there
    argocd_project: str = "default"
    auto_sync: bool = True  # argocd: automated sync (prune, selfHeal); False: each Application waits for a sync
    flux_namespace: str = "flux-system"
    flux_source: str = "flux-system"  # the GitRepository Flux already syncs (flux bootstrap names it flux-system)


def dump_all(objects: list) -> str:
    return yaml.dump_all(objects, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True)


def render(bundle: Bundle, engine: str, target: Target, rendered: dict[str, str] | None = None) -> dict[str, str]:
    """All files of the export but its README. `rendered`: unit id -> helm template's output (manifests)."""
    files = objects_charts(bundle) if engine == "helmfile" else objects_folders(bundle)
    if engine == "manifests":
        for unit in bundle.units:
            if unit.release is not None:
                files[f"{unit.id}/manifests.yaml"] = values_comment(unit.release) + (rendered or {})[unit.id]
                files[f"{unit.id}/kustomization.yaml"] = _kustomization(["manifests.yaml"])
    elif engine == "argocd":
        files.update(argocd(bundle, target))
    elif engine == "flux":
        files.update(flux(bundle, target))
    elif engine == "helmfile":
        files.update(helmfile(bundle))
    else:
        raise ValueError(engine)
    return files


# A ConfigMap key that names a file (gpu-pods.rego, gpu-nodes.json): such a ConfigMap is kept as its files
FILE_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.[A-Za-z0-9]+$")


def holds_files(obj: dict) -> bool:
    """A ConfigMap whose every key names a file and that has no binary data: its data are written as files."""
    data = obj.get("data") or {}
    return obj.get("kind") == "ConfigMap" and obj.get("apiVersion") == "v1" and bool(data) and \
        not obj.get("binaryData") and all(FILE_KEY.match(key) and isinstance(v, str) for key, v in data.items())


def objects_folders(bundle: Bundle) -> dict[str, str]:
    """Our objects, one folder per unit with a kustomization.yaml; a ConfigMap of files as those files under
    <unit>/<its name>/ and a configMapGenerator entry that makes the same object (name, namespace, labels,
    annotations; no hash suffix: the Deployment that mounts it names it, and our pods roll on its content hash)."""
    files = {}
    for unit in bundle.units:
        if unit.release is not None:
            continue
        names, generators = [], []
        for index, obj in enumerate(unit.objects, 1):
            if holds_files(obj):
                meta = obj["metadata"]
                for key, text in obj["data"].items():
                    files[f"{unit.id}/{meta['name']}/{key}"] = text
                generators.append(_generator(obj))
                continue
            name = f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
            files[f"{unit.id}/{name}"] = dump(obj)
            names.append(name)
        files[f"{unit.id}/kustomization.yaml"] = _kustomization(names, generators)
    return files


def _kustomization(resources: list[str], generators: list[dict] | None = None) -> str:
    document = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": resources}
    if generators:
        document["configMapGenerator"] = generators
    return dump(document)


def _generator(obj: dict) -> dict:
    meta = obj["metadata"]
    entry = {"name": meta["name"]}
    if meta.get("namespace"):
        entry["namespace"] = meta["namespace"]
    entry["files"] = [f"{meta['name']}/{key}" for key in obj["data"]]
    options = {"disableNameSuffixHash": True}
    for field in ("labels", "annotations"):
        if meta.get(field):
            options[field] = dict(meta[field])
    entry["options"] = options
    return entry


# What a helmfile unit's chart renders: each manifest as written (Files.Get is not templated, so `{{` in an alert
# rule stays the alert's), and each ConfigMap of files from its folder (AsConfig keeps the files' bytes)
PASS_THROUGH = """{{- /* each file under manifests/, unchanged: they are not templates */ -}}
{{- range $path, $_ := .Files.Glob "manifests/*.yaml" }}
---
{{ $.Files.Get $path }}
{{- end }}
"""


def objects_charts(bundle: Bundle) -> dict[str, str]:
    """helmfile: our objects, one local chart per unit: manifests/NN-kind-name.yaml passed through, and each
    ConfigMap of files as its files under files/<its name>/ and a template that reads them."""
    from gpu_bootstrap import __version__
    files = {}
    for unit in bundle.units:
        if unit.release is not None:
            continue
        files[f"{unit.id}/Chart.yaml"] = dump({"apiVersion": "v2", "name": f"gpu-bootstrap-{unit.id}",
                                               "description": f"gpu-bootstrap's objects of step {unit.step}",
                                               "type": "application", "version": _chart_version(__version__)})
        files[f"{unit.id}/templates/manifests.yaml"] = PASS_THROUGH
        for index, obj in enumerate(unit.objects, 1):
            name = obj["metadata"]["name"]
            shell = {k: v for k, v in obj.items() if k != "data"}
            if holds_files(obj) and "{{" not in dump(shell):  # its metadata goes into a template: none of Helm's
                for key, text in obj["data"].items():
                    files[f"{unit.id}/files/{name}/{key}"] = text
                files[f"{unit.id}/templates/{index:02d}-configmap-{name}.yaml"] = (
                    f"{{{{- /* the data: the files under files/{name}/ */ -}}}}\n" + dump(shell)
                    + f"data:\n{{{{- (.Files.Glob \"files/{name}/*\").AsConfig | nindent 2 }}}}\n")
                continue
            files[f"{unit.id}/manifests/{index:02d}-{obj['kind'].lower()}-{name}.yaml"] = dump(obj)
    return files


def _chart_version(version: str) -> str:
    """A SemVer 2 version for a unit's chart (helm refuses others): the tool's, or 0.0.0 for a development one."""
    return version if re.fullmatch(r"\d+\.\d+\.\d+([-+][0-9A-Za-z.+-]+)?", version) else "0.0.0"


def values_comment(release: Release) -> str:
    """The derived values with their reasons, and the secret ones left out, as YAML comments."""
    lines = [f"# {release.name}: {release.chart} {release.version or ''} (values derived by gpu-bootstrap from this "
             f"cluster's facts and config)".replace("  ", " ")]
    lines += [f"#   {line}" for line in release.derived]
    if release.secret_paths:
        lines.append("# values left out as they are or may be secret (see README.md, Secrets): "
                     + ", ".join(release.secret_paths))
    return "\n".join(lines) + "\n"


def _with_comment(release: Release, text: str) -> str:
    return values_comment(release) + text


# --- Argo CD ---------------------------------------------------------------------------------------------------------
HEALTH_PATCH = "argocd/argocd-cm-application-health.yaml"
HEALTH_KEY = "resource.customizations.health.argoproj.io_Application"
# Argo CD's documented health check of an Application (the one 1.8 removed from the defaults): its own health, and
# Progressing while it has none yet
APPLICATION_HEALTH_LUA = """hs = {}
hs.status = "Progressing"
hs.message = ""
if obj.status ~= nil then
  if obj.status.health ~= nil then
    hs.status = obj.status.health.status
    if obj.status.health.message ~= nil then
      hs.message = obj.status.health.message
    end
  end
end
return hs
"""


def argocd(bundle: Bundle, target: Target) -> dict[str, str]:
    base = target.path.strip("/") or "."
    files = {"argocd/app-of-apps.yaml": dump(_application(
        "gpu-bootstrap", target, None, {"repoURL": target.repo_url, "targetRevision": target.revision,
                                        "path": _join(base, "argocd/apps")}, target.argocd_namespace)),
             HEALTH_PATCH: health_patch(target)}
    for unit in bundle.units:
        if unit.release is None:
            source = {"repoURL": target.repo_url, "targetRevision": target.revision, "path": _join(base, unit.id)}
        else:
            source = _chart_source(unit.release)
        app = _application(f"gpu-bootstrap-{unit.id}", target, unit.wave, source, unit.namespace or "default")
        text = dump(app)
        files[f"argocd/apps/{unit.id}.yaml"] = _with_comment(unit.release, text) if unit.release else text
    return files


def health_patch(target: Target) -> str:
    """A merge patch for argocd-cm that makes Argo CD assess an Application's health, so that the app-of-apps'
    waves wait (README.md says how to apply it)."""
    return (f"# Merge into argocd-cm (namespace {target.argocd_namespace}) once per Argo CD, before the app-of-apps:\n"
            f"#   kubectl -n {target.argocd_namespace} patch configmap argocd-cm --type merge "
            f"--patch-file {HEALTH_PATCH}\n"
            "# Since Argo CD 1.8 an Application's health is not assessed, so a sync wave of the app-of-apps would\n"
            "# not wait for the Applications of the wave before it to be healthy. This restores Argo CD's documented\n"
            "# check (an Application is as healthy as it says; Progressing until it says). With the argo-cd Helm\n"
            "# chart, set it as configs.cm.\"" + HEALTH_KEY + "\" instead.\n"
            + dump({"data": {HEALTH_KEY: APPLICATION_HEALTH_LUA}}))


def _application(name: str, target: Target, wave: int | None, source: dict, namespace: str) -> dict:
    metadata = {"name": name, "namespace": target.argocd_namespace, "labels": dict(MANAGED),
                # deleting the Application deletes what it synced (Argo CD's cascading delete)
                "finalizers": ["resources-finalizer.argocd.argoproj.io"]}
    if wave is not None:
        metadata["annotations"] = {"argocd.argoproj.io/sync-wave": str(wave)}
    policy = {"syncOptions": ["ServerSideApply=true", "CreateNamespace=true"]}  # SSA: the charts' CRDs exceed
    if target.auto_sync:                                                      # client-side apply's annotation
        policy = {"automated": {"prune": True, "selfHeal": True}, **policy}
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": metadata,
            "spec": {"project": target.argocd_project, "source": source,
                     "destination": {"server": "https://kubernetes.default.svc", "namespace": namespace},
                     "syncPolicy": policy}}


def _chart_source(release: Release) -> dict:
    if release.chart.startswith("oci://"):
        repo, _, chart = release.chart[len("oci://"):].rpartition("/")
        source = {"repoURL": repo, "chart": chart}
    else:
        source = {"repoURL": release.repo, "chart": release.chart}
    source["targetRevision"] = release.version
    source["helm"] = {"releaseName": release.name, "valuesObject": release.values}
    if release.skip_crds:
        source["helm"]["skipCrds"] = True
    return source


def _join(base: str, path: str) -> str:
    return path if base in ("", ".") else f"{base}/{path}"


# --- Flux ------------------------------------------------------------------------------------------------------------
def flux(bundle: Bundle, target: Target) -> dict[str, str]:
    base = target.path.strip("/") or "."
    files, kustomizations, previous = {}, [], None
    for unit in bundle.units:
        name = f"gpu-bootstrap-{unit.id}"
        spec = {"interval": "10m", "path": "./" + _join(base, unit.id).removeprefix("./"), "prune": True,
                "wait": True, "timeout": "15m",
                "sourceRef": {"kind": "GitRepository", "name": target.flux_source,
                              "namespace": target.flux_namespace}}
        if previous:
            spec["dependsOn"] = [{"name": previous}]
        kustomizations.append({"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
                               "metadata": {"name": name, "namespace": target.flux_namespace,
                                            "labels": dict(MANAGED)}, "spec": spec})
        previous = name
        if unit.release is not None:
            files.update(_helm_release_folder(unit, target))
    files["flux/kustomizations.yaml"] = dump_all(kustomizations)
    files["flux/kustomization.yaml"] = dump({"apiVersion": "kustomize.config.k8s.io/v1beta1",
                                             "kind": "Kustomization", "resources": ["kustomizations.yaml"]})
    return files


def _helm_release_folder(unit: Unit, target: Target) -> dict[str, str]:
    release = unit.release
    repo_name = f"gpu-bootstrap-{repo_alias(release)}"
    if release.chart.startswith("oci://"):
        url, _, chart = release.chart.rpartition("/")
        repository = {"interval": "1h", "type": "oci", "url": url}
    else:
        chart, repository = release.chart, {"interval": "1h", "url": release.repo}
    source = {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmRepository",
              "metadata": {"name": repo_name, "namespace": target.flux_namespace, "labels": dict(MANAGED)},
              "spec": repository}
    spec = {"interval": "10m", "releaseName": release.name, "targetNamespace": release.namespace,
            "storageNamespace": release.namespace,
            "chart": {"spec": {"chart": chart, "version": release.version,
                               "sourceRef": {"kind": "HelmRepository", "name": repo_name,
                                             "namespace": target.flux_namespace}}},
            "install": {"crds": "Skip" if release.skip_crds else "CreateReplace", "createNamespace": True,
                        "remediation": {"retries": 3}},
            "upgrade": {"crds": "Skip" if release.skip_crds else "CreateReplace", "remediation": {"retries": 3}},
            "values": release.values}
    if release.secret_paths:
        # one values document (helm merges it as a values file: lists whole), not one targetPath per value: a
        # Secret's keys may not hold `[` or `\`, and a targetPath cannot carry a list
        spec["valuesFrom"] = [{"kind": "Secret", "name": secret_name(release.name), "valuesKey": SECRET_VALUES_KEY}]
    helm_release = {"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
                    "metadata": {"name": release.name, "namespace": target.flux_namespace,
                                 "labels": dict(MANAGED)}, "spec": spec}
    return {f"{unit.id}/helmrepository.yaml": dump(source),
            f"{unit.id}/helmrelease.yaml": _with_comment(release, dump(helm_release)),
            f"{unit.id}/kustomization.yaml": dump({"apiVersion": "kustomize.config.k8s.io/v1beta1",
                                                   "kind": "Kustomization",
                                                   "resources": ["helmrepository.yaml", "helmrelease.yaml"]})}


SECRET_VALUES_KEY = "values.yaml"
HELMFILE_SECRETS = "../gpu-bootstrap-secret-values"  # outside the bundle: next to the export's folder, not in Git


def secret_name(release: str) -> str:
    """The Secret (the user creates it) that holds a release's secret values, as one values document under
    SECRET_VALUES_KEY."""
    return f"{release}-secret-values"


def helmfile_secret_file(release: str) -> str:
    """The values file, outside the bundle, that holds a release's secret values for helmfile."""
    return f"{HELMFILE_SECRETS}/{release}.yaml"


def repo_alias(release: Release) -> str:
    """A short name for a chart's repository: nvidia, prometheus-community, or the host's."""
    url = release.chart if release.chart.startswith("oci://") else release.repo or ""
    known = {"helm.ngc.nvidia.com/nvidia": "nvidia", "prometheus-community.github.io/helm-charts":
             "prometheus-community"}
    bare = re.sub(r"^[a-z]+://", "", url).rstrip("/")
    for where, alias in known.items():
        if bare.startswith(where):
            return alias
    return re.sub(r"[^a-z0-9]+", "-", bare.lower()).strip("-")[:40] or "charts"


# --- helmfile --------------------------------------------------------------------------------------------------------
def helmfile(bundle: Bundle) -> dict[str, str]:
    files, repositories, releases, previous = {}, {}, [], None
    for unit in bundle.units:
        if unit.release is None:
            entry = {"name": f"gpu-bootstrap-{unit.id}", "namespace": unit.namespace or "default",
                     "chart": f"./{unit.id}", "labels": {"gpu-bootstrap/unit": unit.id}}
        else:
            release = unit.release
            if release.repo is None and not release.chart.startswith("oci://"):
                chart = release.chart  # a local chart (air-gapped): helmfile reads it as helm does
            elif release.chart.startswith("oci://"):
                chart = release.chart
            else:
                alias = repo_alias(release)
                repositories[alias] = {"name": alias, "url": release.repo}
                chart = f"{alias}/{release.chart}"
            values = f"values/{release.name}.yaml"
            files[values] = _with_comment(release, dump(release.values))
            # the secret values from a file outside the bundle (helmfile fails when it is missing)
            secret = [helmfile_secret_file(release.name)] if release.secret_paths else []
            entry = {"name": release.name, "namespace": release.namespace, "chart": chart,
                     "version": release.version, "values": [values, *secret],
                     "labels": {"gpu-bootstrap/unit": unit.id}}

        if previous:
            entry["needs"] = [previous]
        previous = f"{entry['namespace']}/{entry['name']}"
        releases.append(entry)
    document = {"helmDefaults": {"wait": True, "timeout": 900, "createNamespace": True}}
    if repositories:
        document["repositories"] = list(repositories.values())
    document["releases"] = releases
    files["helmfile.yaml"] = ("# gpu-bootstrap export: `helmfile apply` installs the platform in order (needs).\n"
                              + dump(document))
    return files
