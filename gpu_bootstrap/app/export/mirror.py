"""`images -o hauler|zarf|skopeo`: exactly the images `images` lists, in the file each mirroring tool reads. Pure.

Each list holds the source of every image (where to copy it from); with registry.mirror set, a comment gives the
command that copies them to the mirror with their repository path kept, which is where the platform pulls them
(core/catalogue.py's relocate): `hauler store copy registry://MIRROR`, `skopeo sync --dest docker ... MIRROR`. A Zarf
package carries its images into Zarf's own registry, so no destination applies there.
"""
from __future__ import annotations

from gpu_bootstrap.core.catalogue import parse
from gpu_bootstrap.app.export.formats import dump

MIRROR_FORMATS = ("hauler", "zarf", "skopeo")


def sources(found) -> list[str]:
    """Each image's source reference (where to copy from), sorted, once."""
    return sorted({image.source for image in found.images.values()})


def hauler(found, name: str = "gpu-bootstrap") -> str:
    head = ["# Hauler images manifest: hauler store sync --filename images.yaml"]
    if found.mirror:
        head.append(f"# then: hauler store copy registry://{found.mirror}   (repository paths kept, as the platform "
                    f"pulls them)")
    document = {"apiVersion": "content.hauler.cattle.io/v1", "kind": "Images", "metadata": {"name": name},
                "spec": {"images": [{"name": ref} for ref in sources(found)]}}
    return "\n".join(head) + "\n" + dump(document)


def zarf(found, version: str, name: str = "gpu-bootstrap-images") -> str:
    head = ["# Zarf package of the platform's images: zarf package create . ; zarf package deploy zarf-package-*.zst",
            "# (Zarf pushes them to its own registry and rewrites pulls to it: registry.mirror does not apply)"]
    document = {"kind": "ZarfPackageConfig",
                "metadata": {"name": name, "version": version,
                             "description": "the images gpu-bootstrap's platform pulls on this cluster"},
                "components": [{"name": "images", "required": True, "images": sources(found)}]}
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
            + (found.mirror or "REGISTRY[/PREFIX]")]
    if found.mirror:
        head.append("# (registry.mirror: the repository paths are kept, as the platform pulls them)")
    document = {registry: {"images": {path: tags for path, tags in sorted(repos.items())}}
                for registry, repos in sorted(registries.items())}
    return "\n".join(head) + "\n" + dump(document)
