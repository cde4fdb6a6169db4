"""Images and charts, in one place: the supply-chain catalogue (data/images.yaml: each default image by digest beside
its tag, each chart archive's sha256), image references (parse, pin, move to a mirror), and the rewriting that points
every pod we render, and every chart's values, at `registry.mirror`.

Pure: no cluster, no registry, no helm.
"""
from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass

import yaml

from gpu_bootstrap.core.paths import DATA

DOCKER_HUB = "docker.io"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# HOST[:PORT][/PREFIX]: a registry host name or IPv4/IPv6 address, an optional port, optional path components
MIRROR = re.compile(r"(?P<host>[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
                    r"|\[[0-9A-Fa-f:]+\])(?P<port>:[0-9]{1,5})?(?P<prefix>(/[a-z0-9]+([._-][a-z0-9]+)*)*)")


# --- references -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reference:
    """An image reference as written: registry ('' for Docker Hub's implicit one), path, tag, digest."""

    registry: str
    path: str
    tag: str = ""
    digest: str = ""

    @property
    def repository(self) -> str:
        return f"{self.registry}/{self.path}" if self.registry else self.path

    @property
    def host(self) -> str:
        """The registry the reference is pulled from (docker.io when it names none)."""
        return self.registry or DOCKER_HUB

    def canonical_repository(self) -> str:
        """docker.io/library/busybox for 'busybox': one spelling to compare repositories by."""
        path = self.path if self.host != DOCKER_HUB or "/" in self.path else f"library/{self.path}"
        return f"{self.host}/{path}"

    def __str__(self) -> str:
        return self.repository + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def parse(text: str) -> Reference:
    """'registry.k8s.io/pause:3.10@sha256:…' -> Reference. Raises ValueError for text that is not a reference."""
    text = str(text).strip()
    name, _, digest = text.partition("@")
    if digest and not DIGEST.fullmatch(digest):
        raise ValueError(f"{text!r}: {digest!r} is not a sha256 digest")
    head, slash, last = name.rpartition("/")
    tag = ""
    if ":" in last:
        last, tag = last.split(":", 1)
        if not tag:
            raise ValueError(f"{text!r} has an empty tag")
    name = f"{head}{slash}{last}"
    first, _, rest = name.partition("/")
    registry, path = (first, rest) if rest and ("." in first or ":" in first or first == "localhost") else ("", name)
    if not path or not re.fullmatch(r"[a-z0-9]+([._/-]+[a-z0-9]+)*", path) or \
            (tag and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag)):
        raise ValueError(f"{text!r} is not an image reference")
    return Reference(registry, path, tag, digest)


def relocate(ref: str, mirror: str | None) -> str:
    """The reference on the mirror, repository path kept: quay.io/prometheus/prometheus:v3 with mirror
    reg.local:5000/m -> reg.local:5000/m/prometheus/prometheus:v3. None: unchanged."""
    if not mirror:
        return ref
    parsed = parse(ref)
    if str(parsed).startswith(f"{mirror}/"):
        return ref  # already there
    return str(Reference(mirror.split("/", 1)[0], "/".join(filter(None, [*mirror.split("/")[1:], parsed.path])),
                         parsed.tag, parsed.digest))


def mirror_path(repository: str, mirror: str) -> str:
    """A chart value holding a repository (nvcr.io/nvidia/k8s) on the mirror (reg.local/m/nvidia/k8s)."""
    return relocate(repository, mirror)


def check_mirror(text: str) -> str:
    """registry.mirror: HOST[:PORT][/PREFIX], or a ValueError that says what is wrong."""
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", text):
        raise ValueError(f"{text!r}: give HOST[:PORT][/PREFIX] without a scheme (e.g. {text.split('://', 1)[1]})")
    if any(c.isspace() for c in text):
        raise ValueError(f"{text!r} has spaces; give HOST[:PORT][/PREFIX], e.g. registry.example.com:5000/mirror")
    text = text.rstrip("/")
    match = MIRROR.fullmatch(text)
    if not match or (match.group("port") and not 0 < int(match.group("port")[1:]) < 65536):
        raise ValueError(f"{text!r} is not HOST[:PORT][/PREFIX] (lowercase path components), e.g. "
                         f"registry.example.com:5000/mirror")
    return text


# --- the catalogue ----------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def catalogue() -> dict:
    return yaml.safe_load((DATA / "images.yaml").read_text())


def default(name: str) -> str:
    """A default image of ours, by digest when the catalogue has one: 'busybox:1.37.0@sha256:…'."""
    entry = catalogue()["images"][name]
    return f"{entry['repository']}:{entry['tag']}" + (f"@{entry['digest']}" if entry.get("digest") else "")


def digest_of(ref: str) -> str | None:
    """The digest the catalogue records for a reference's repository and tag, or None."""
    parsed = parse(ref)
    repository = parsed.canonical_repository()
    for entry in catalogue()["images"].values():
        if parse(entry["repository"]).canonical_repository() != repository:
            continue
        if entry.get("tag") == parsed.tag and entry.get("digest"):
            return entry["digest"]
        found = (entry.get("tags") or {}).get(parsed.tag)
        if found:
            return found["digest"]
    return None


def pin(ref: str) -> str:
    """The reference with the catalogue's digest added when it records one for this repository and tag."""
    parsed = parse(ref)
    if parsed.digest or not parsed.tag:
        return ref
    digest = digest_of(ref)
    return f"{ref}@{digest}" if digest else ref


def unpinned_reason(ref: str) -> str | None:
    """Why the catalogue lets this reference go without a digest (None: it does not, or the reference has one).
    A mirrored reference is looked up by its path on the mirror."""
    parsed = parse(ref)
    if parsed.digest:
        return None
    data = catalogue()
    for entry in data["images"].values():
        if _same_repository(parsed, parse(entry["repository"])) and entry.get("why"):
            return entry["why"]
    for chart in data["chart_images"].values():
        if any(_same_repository(parsed, parse(repository)) for repository in chart["repositories"]):
            return chart["why"]
    return None


def _same_repository(ref: Reference, known: Reference) -> bool:
    """Same repository, or the same path on a mirror (the mirror keeps the path after the registry host)."""
    return ref.canonical_repository() == known.canonical_repository() or ref.path.endswith(f"/{known.path}") or \
        ref.path == known.path


def chart_sha256(chart: str, version: str) -> str | None:
    """The catalogue's sha256 of a chart archive (None when the catalogue has no entry for this version)."""
    entry = catalogue()["charts"].get(chart) or {}
    versions = entry.get("versions") or {}
    return versions.get(version) or versions.get(version.lstrip("v")) or versions.get(f"v{version.lstrip('v')}")


def chart_default(chart: str) -> str | None:
    """The version of a chart the catalogue installs when the config pins none (charts without a version table)."""
    return (catalogue()["charts"].get(chart) or {}).get("default")


def chart_sha256_verified(chart: str) -> bool:
    """Whether the catalogue's sums for a chart were read from its repository's index (a mismatch is then refused),
    rather than from our own reproducible packaging of the release tag (a mismatch is then only warned about)."""
    return bool((catalogue()["charts"].get(chart) or {}).get("verified"))


def registry_inputs(config) -> dict:
    """The registry section for a step's inputs fingerprint: empty by default, so fingerprints recorded before the
    section existed still match."""
    registry = getattr(config, "registry", None)
    if registry is None or (not registry.mirror and not registry.pull_secret):
        return {}
    return {"registry": {"mirror": registry.mirror, "pull_secret": registry.pull_secret}}


# --- rewriting what we render -----------------------------------------------------------------------------------------
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def locate(ref: str, registry=None) -> str:
    """A reference as we deploy it: pinned to the catalogue's digest, then moved to the mirror (registry.mirror)."""
    return relocate(pin(ref), getattr(registry, "mirror", None))


def locate_pods(objects: list[dict], registry=None) -> list[dict]:
    """Copies of `objects` whose every pod spec pulls from the mirror, by digest where the catalogue has one, with the
    registry's pull secret (registry.pull_secret) added."""
    return [_rewrite(copy.deepcopy(obj), registry) for obj in objects]


def _rewrite(node, registry):
    if isinstance(node, dict):
        if any(isinstance(node.get(key), list) for key in CONTAINER_LISTS) and "containers" in node:
            for key in CONTAINER_LISTS:
                for container in node.get(key) or []:
                    if isinstance(container, dict) and isinstance(container.get("image"), str):
                        container["image"] = locate(container["image"], registry)
            secret = getattr(registry, "pull_secret", None)
            if secret and {"name": secret} not in (node.get("imagePullSecrets") or []):
                node["imagePullSecrets"] = [*(node.get("imagePullSecrets") or []), {"name": secret}]
        for value in node.values():
            _rewrite(value, registry)
    elif isinstance(node, list):
        for value in node:
            _rewrite(value, registry)
    return node


# The gpu-operator's image-bearing values (chart v25.10-v26.7): the values path of each `repository` and the chart's
# default. With a mirror, each is set to the same path on the mirror (the operator builds every operand's image from
# them at run time, so helm template alone does not show them: the ClusterPolicy does).
GPU_OPERATOR_REPOSITORIES = {
    "operator": "nvcr.io/nvidia", "validator": "nvcr.io/nvidia", "driver": "nvcr.io/nvidia",
    "driver.manager": "nvcr.io/nvidia/cloud-native", "toolkit": "nvcr.io/nvidia/k8s",
    "devicePlugin": "nvcr.io/nvidia", "dcgm": "nvcr.io/nvidia/cloud-native", "dcgmExporter": "nvcr.io/nvidia/k8s",
    "gfd": "nvcr.io/nvidia", "migManager": "nvcr.io/nvidia/cloud-native", "nodeStatusExporter": "nvcr.io/nvidia",
    "gds": "nvcr.io/nvidia/cloud-native", "gdrcopy": "nvcr.io/nvidia/cloud-native",
    "vgpuManager.driverManager": "nvcr.io/nvidia/cloud-native", "vgpuDeviceManager": "nvcr.io/nvidia/cloud-native",
    "vfioManager": "nvcr.io/nvidia/cloud-native", "vfioManager.driverManager": "nvcr.io/nvidia/cloud-native",
    "ccManager": "nvcr.io/nvidia/cloud-native", "sandboxDevicePlugin": "nvcr.io/nvidia",
    "kataSandboxDevicePlugin": "nvcr.io/nvidia/cloud-native", "draDriver": "nvcr.io/nvidia",
}
NFD_REPOSITORY = "registry.k8s.io/nfd/node-feature-discovery"
GPU_OPERATOR_SECRET_LISTS = ("operator", "validator", "driver", "toolkit", "devicePlugin", "dcgm", "dcgmExporter",
                             "gfd", "migManager", "nodeStatusExporter", "gds", "gdrcopy", "vgpuManager",
                             "vgpuDeviceManager", "vfioManager", "kataManager", "sandboxDevicePlugin",
                             "kataSandboxDevicePlugin", "ccManager", "draDriver")


def image_repositories(values, prefix: str = "") -> dict[str, str]:
    """values path -> repository of every {repository, image} pair in a chart's values (its image-bearing values)."""
    found = {}
    if isinstance(values, dict):
        if isinstance(values.get("repository"), str) and values["repository"] and "image" in values:
            found[prefix] = values["repository"]
        for key, value in values.items():
            found.update(image_repositories(value, f"{prefix}.{key}" if prefix else str(key)))
    return found


def gpu_operator_values(registry, chart_values: dict | None = None) -> list[tuple[str, object, str]]:
    """(values path, value, why) that point the gpu-operator, its operands and NFD at the mirror. `chart_values`: the
    chart's own defaults (a local chart), whose {repository, image} pairs are moved; else the table above."""
    out = []
    if registry is None:
        return out
    if registry.mirror:
        why = f"registry.mirror: the operand images come from {registry.mirror}"
        table = image_repositories(chart_values) if chart_values else GPU_OPERATOR_REPOSITORIES
        out += [(f"{path}.repository", mirror_path(default, registry.mirror), why)
                for path, default in sorted(table.items())]
        out.append(("node-feature-discovery.image.repository", mirror_path(NFD_REPOSITORY, registry.mirror),
                    f"registry.mirror: NFD's image comes from {registry.mirror}"))
    if registry.pull_secret:
        why = f"registry.pull_secret: the operands pull with Secret {registry.pull_secret}"
        out += [(f"{path}.imagePullSecrets", [registry.pull_secret], why) for path in GPU_OPERATOR_SECRET_LISTS]
        out.append(("node-feature-discovery.imagePullSecrets", [{"name": registry.pull_secret}], why))
    return out


DRA_DRIVER_REPOSITORY = "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu"  # the chart's only image


def dra_driver_values(registry) -> list[tuple[str, object, str]]:
    """(values path, value, why) for NVIDIA's DRA driver chart: its one image (every container of the chart, and the
    workloads the driver itself creates, which it is told about in IMAGE_NAME) from the mirror."""
    out = []
    if registry is None:
        return out
    if registry.mirror:
        out.append(("image.repository", mirror_path(DRA_DRIVER_REPOSITORY, registry.mirror),
                    f"registry.mirror: the DRA driver's image comes from {registry.mirror}"))
    if registry.pull_secret:
        out.append(("imagePullSecrets", [{"name": registry.pull_secret}],
                    f"registry.pull_secret: the DRA driver pulls with Secret {registry.pull_secret}"))
    return out


def stack_values(registry) -> list[tuple[str, object, str]]:
    """(values path, value, why) for kube-prometheus-stack: its global registry setting moves every image of the
    stack and its subcharts (hooks included) to the mirror, repository paths kept (tests/test_registry_mirror.py
    checks the rendered result rather than trusting it)."""
    out = []
    if registry is None:
        return out
    if registry.mirror:
        out.append(("global.imageRegistry", registry.mirror, f"registry.mirror: every image of the stack (and its "
                                                               f"subcharts and hooks) comes from {registry.mirror}"))
    if registry.pull_secret:
        out.append(("global.imagePullSecrets", [{"name": registry.pull_secret}],
                    f"registry.pull_secret: the stack pulls with Secret {registry.pull_secret}"))
    return out
