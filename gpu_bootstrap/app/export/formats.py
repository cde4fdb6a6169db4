"""A bundle as the files of one engine. Pure: each function returns {relative path: text}.

Every format writes our own objects the same way, one folder per unit (`<unit>/NN-kind-name.yaml` and a
kustomization.yaml listing them, CRDs and namespaces first), so `kubectl apply -k <unit>` works too; they differ in
how the charts are carried and how the order is kept:

- manifests: the charts rendered with `helm template` into their unit's folder; the order is the folders' order.
- argocd: an app-of-apps: argocd/app-of-apps.yaml points at argocd/apps/, one Application per unit, its sync
  wave the unit's place; a chart's Application carries the chart, its pinned version and its values.
- flux: flux/kustomizations.yaml, one Kustomization per unit (dependsOn the one before, wait: true); a chart's
  folder holds its HelmRepository and HelmRelease.
- helmfile: helmfile.yaml with the chart repositories and one release per unit (needs the one before); our own
  objects as local charts of plain manifests (helmfile turns a folder of manifests into a chart).
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
    argocd_namespace: str = "argocd"
    argocd_project: str = "default"
    flux_namespace: str = "flux-system"
    flux_source: str = "flux-system"  # the GitRepository Flux already syncs (flux bootstrap names it flux-system)


def dump_all(objects: list) -> str:
    return yaml.dump_all(objects, Dumper=_BlockDumper, sort_keys=False)


def render(bundle: Bundle, engine: str, target: Target, rendered: dict[str, str] | None = None) -> dict[str, str]:
    """All files of the export but its README. `rendered`: unit id -> helm template's output (manifests)."""
    files = objects_folders(bundle, kustomize=engine != "helmfile")
    if engine == "manifests":
        for unit in bundle.units:
            if unit.release is not None:
                files[f"{unit.id}/manifests.yaml"] = values_comment(unit.release) + (rendered or {})[unit.id]
                files[f"{unit.id}/kustomization.yaml"] = dump({"apiVersion": "kustomize.config.k8s.io/v1beta1",
                                                                "kind": "Kustomization",
                                                                "resources": ["manifests.yaml"]})
    elif engine == "argocd":
        files.update(argocd(bundle, target))
    elif engine == "flux":
        files.update(flux(bundle, target))
    elif engine == "helmfile":
        files.update(helmfile(bundle))
    else:
        raise ValueError(engine)
    return files


def objects_folders(bundle: Bundle, kustomize: bool = True) -> dict[str, str]:
    """Our objects, one folder per unit; `kustomize`: with a kustomization.yaml (helmfile reads a folder with one
    as a kustomization, which needs kustomize; without, as plain manifests)."""
    files = {}
    for unit in bundle.units:
        if unit.release is not None:
            continue
        names = []
        for index, obj in enumerate(unit.objects, 1):
            name = f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
            files[f"{unit.id}/{name}"] = dump(obj)
            names.append(name)
        if kustomize:
            files[f"{unit.id}/kustomization.yaml"] = dump({"apiVersion": "kustomize.config.k8s.io/v1beta1",
                                                            "kind": "Kustomization", "resources": names})
    return files


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
def argocd(bundle: Bundle, target: Target) -> dict[str, str]:
    base = target.path.strip("/") or "."
    files = {"argocd/app-of-apps.yaml": dump(_application(
        "gpu-bootstrap", target, None, {"repoURL": target.repo_url, "targetRevision": target.revision,
                                        "path": _join(base, "argocd/apps")}, target.argocd_namespace))}
    for unit in bundle.units:
        if unit.release is None:
            source = {"repoURL": target.repo_url, "targetRevision": target.revision, "path": _join(base, unit.id)}
        else:
            source = _chart_source(unit.release)
        app = _application(f"gpu-bootstrap-{unit.id}", target, unit.wave, source, unit.namespace or "default")
        text = dump(app)
        files[f"argocd/apps/{unit.id}.yaml"] = _with_comment(unit.release, text) if unit.release else text
    return files


def _application(name: str, target: Target, wave: int | None, source: dict, namespace: str) -> dict:
    metadata = {"name": name, "namespace": target.argocd_namespace, "labels": dict(MANAGED),
                "finalizers": ["resources-finalizer.argocd.argoproj.io"]}
    if wave is not None:
        metadata["annotations"] = {"argocd.argoproj.io/sync-wave": str(wave)}
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": metadata,
            "spec": {"project": target.argocd_project, "source": source,
                     "destination": {"server": "https://kubernetes.default.svc", "namespace": namespace},
                     "syncPolicy": {"automated": {"prune": True, "selfHeal": True},
                                    # ServerSideApply: the charts' CRDs exceed client-side apply's annotation
                                    "syncOptions": ["ServerSideApply=true", "CreateNamespace=true"]}}}


def _chart_source(release: Release) -> dict:
    if release.chart.startswith("oci://"):
        repo, _, chart = release.chart[len("oci://"):].rpartition("/")
        source = {"repoURL": repo, "chart": chart}
    else:
        source = {"repoURL": release.repo, "chart": release.chart}
    source["targetRevision"] = release.version
    source["helm"] = {"releaseName": release.name, "valuesObject": release.values}
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
            "install": {"crds": "CreateReplace", "createNamespace": True, "remediation": {"retries": 3}},
            "upgrade": {"crds": "CreateReplace", "remediation": {"retries": 3}},
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
