"""`images -o hauler|zarf|skopeo`: exactly the images `images` lists, and the charts `up` installs, in the file each
mirroring tool reads. Pure.

The charts: Hauler's `Charts` (a chart from a repository or an OCI registry) and `Files` (a local archive); Zarf's
optional `charts` component (not deployed by default: Zarf would install them with the chart's defaults, and `up`
installs them with the values it derives from the nodes); skopeo copies images only, so its file names the charts in
a comment. Each chart's line says the catalogue's sha256 of its archive and whether it was read from the repository's
index (core/data/images.yaml says where it could not be).

Each list holds the source of every image (where to copy it from); with registry.mirror set, a comment gives the
command that copies them to the mirror with their repository path kept, which is where the platform pulls them
(core/catalogue.py's relocate): `hauler store copy registry://MIRROR`, `skopeo sync --dest docker ... MIRROR`. A Zarf
package carries its images into Zarf's own registry, so no destination applies there.
"""
from __future__ import annotations

from gpu_bootstrap.core.catalogue import parse
from gpu_bootstrap.app.export.formats import dump, dump_all

MIRROR_FORMATS = ("hauler", "zarf", "skopeo")


def sources(found) -> list[str]:
    """Each image's source reference (where to copy from), sorted, once."""
    return sorted({image.source for image in found.images.values()})


def chart_comments(found) -> list[str]:
    """One comment line per chart: what it is, and what its archive's sha256 is known as."""
    lines = []
    for chart in found.charts:
        where = chart.name if chart.local or chart.name.startswith("oci://") else f"{chart.repo} {chart.name}"
        if chart.local:
            known = "a local archive: yours to check"
        elif chart.sha256 and chart.verified:
            known = f"sha256 {chart.sha256} (read from the repository's index: helm pull is checked against it)"
        elif chart.sha256:
            known = (f"sha256 {chart.sha256} of gpu-bootstrap's own packaging of the release, not read from the "
                     f"repository's index: a different archive is used with a warning")
        else:
            known = "no sha256 in gpu-bootstrap's catalogue for this version"
        lines.append(f"# chart {chart.release}: {where} {chart.version or ''}: {known}".replace("  ", " "))
    return lines


def _split(url: str) -> tuple[str, str]:
    """oci://host/path/chart -> (oci://host/path, chart)."""
    base, _, name = url.rpartition("/")
    return base, name


def hauler(found, name: str = "gpu-bootstrap") -> str:
    head = ["# Hauler manifest of the platform's images and charts: hauler store sync --filename hauler.yaml"]
    if found.mirror:
        head.append(f"# then: hauler store copy registry://{found.mirror}   (repository paths kept, as the platform "
                    f"pulls them; the charts go there as OCI artifacts, for gpu_operator.chart / monitoring.chart)")
    head += chart_comments(found)
    documents = [{"apiVersion": "content.hauler.cattle.io/v1", "kind": "Images", "metadata": {"name": name},
                  "spec": {"images": [{"name": ref} for ref in sources(found)]}}]
    remote = [c for c in found.charts if not c.local]
    if remote:
        entries = []
        for chart in remote:
            repo, chart_name = _split(chart.name) if chart.name.startswith("oci://") else (chart.repo, chart.name)
            entries.append({"name": chart_name, "repoURL": repo, "version": chart.version})
        documents.append({"apiVersion": "content.hauler.cattle.io/v1", "kind": "Charts",
                          "metadata": {"name": f"{name}-charts"}, "spec": {"charts": entries}})
    local = [c for c in found.charts if c.local]
    if local:
        documents.append({"apiVersion": "content.hauler.cattle.io/v1", "kind": "Files",
                          "metadata": {"name": f"{name}-chart-archives"},
                          "spec": {"files": [{"path": c.name} for c in local]}})
    return "\n".join(head) + "\n" + dump_all(documents)


def zarf(found, version: str, name: str = "gpu-bootstrap-images") -> str:
    head = ["# Zarf package of the platform's images and charts: zarf package create . ; zarf package deploy "
            "zarf-package-*.zst --components images",
            "# (Zarf pushes the images to its own registry and rewrites pulls to it: registry.mirror does not apply.",
            "# The charts component is optional and not deployed by default: Zarf would install the charts with their",
            "# defaults, and gpu-bootstrap installs them with the values it derives from your nodes.)"]
    head += chart_comments(found)
    components = [{"name": "images", "required": True, "images": sources(found)}]
    charts = []
    for chart in found.charts:
        namespace, _, release = chart.release.partition("/")
        entry = {"name": release, "namespace": namespace, "releaseName": release}
        if chart.local:
            entry["localPath"] = chart.name
        elif chart.name.startswith("oci://"):
            entry.update(url=chart.name, version=chart.version)
        else:
            entry.update(url=chart.repo, repoName=chart.name, version=chart.version)
        charts.append(entry)
    if charts:
        components.append({"name": "charts", "required": False, "default": False,
                           "description": "the charts gpu-bootstrap installs, carried into the air gap",
                           "charts": charts})
    document = {"kind": "ZarfPackageConfig",
                "metadata": {"name": name, "version": version,
                             "description": "the images and charts of gpu-bootstrap's platform on this cluster"},
                "components": components}
    return "\n".join(head) + "\n" + dump(document)


def skopeo(found) -> str:
    """skopeo sync's YAML source: registry -> images: repository -> [tag or digest]. A reference pinned by digest
    is copied by its digest (what the platform pulls); one with a tag only, by its tag."""
    registries: dict[str, dict[str, list[str]]] = {}
    for ref in sources(found):
        parsed = parse(ref)
        wanted = parsed.digest or parsed.tag or "latest"
        path = parsed.path if parsed.registry or "/" in parsed.path else f"library/{parsed.path}"
        repos = registries.setdefault(parsed.host, {})
        if wanted not in repos.setdefault(path, []):
            repos[path].append(wanted)
    head = ["# skopeo sync source: skopeo sync --src yaml --dest docker skopeo-sync.yaml "
            + (found.mirror or "REGISTRY[/PREFIX]"), "# (images only: the charts below travel another way, e.g. "
            "`helm pull` and `helm push` to an OCI registry)"]
    head += chart_comments(found)
    if found.mirror:
        head.append("# (registry.mirror: the repository paths are kept, as the platform pulls them)")
    document = {registry: {"images": {path: tags for path, tags in sorted(repos.items())}}
                for registry, repos in sorted(registries.items())}
    return "\n".join(head) + "\n" + dump(document)
