"""`gpu-bootstrap images`: the exact set of images the configured platform pulls on one cluster, read from a render
(`up --dry-run --render-dir`): every container of every object we apply or a chart renders (hooks included), the
images the Prometheus Operator is told to add, and the gpu-operator's operands from its ClusterPolicy (the operator
builds them at run time, so no manifest shows them), with the driver's tag per GPU node OS.

Pure: documents and node facts in, a sorted list out (app/commands.py's images() does the reading and the rendering).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpu_bootstrap.core import catalogue

# Operand sections of the ClusterPolicy that run only with sandbox workloads (VMs, Kata, confidential computing)
SANDBOX_OPERANDS = {"vgpuManager", "vgpuDeviceManager", "vfioManager", "kataManager", "sandboxDevicePlugin",
                    "kataSandboxDevicePlugin", "ccManager"}
CHART_OF_STEP = {"gpu-operator": "gpu-operator", "monitoring": "kube-prometheus-stack"}
# Arguments whose value is an image the Prometheus Operator adds to the pods it makes: the config reloader sidecar
# (always), and Thanos' (only for a Prometheus with a Thanos sidecar)
OPERATOR_IMAGE_ARGS = re.compile(r"--(prometheus-config-reloader|thanos-default-base-image)=(\S+)")
ARG_NOTES = {"thanos-default-base-image": "the Prometheus Operator's image for Thanos sidecars: pulled only when a "
                                          "Prometheus sets spec.thanos"}


@dataclass
class Image:
    """One image: as the cluster pulls it (`reference`), where to copy it from (`source`; the same without a
    mirror), and who pulls it."""

    reference: str
    source: str
    pulled_by: set[str] = field(default_factory=set)
    notes: set[str] = field(default_factory=set)

    def document(self) -> dict:
        return {"image": self.reference, "source": self.source, "pulled_by": sorted(self.pulled_by),
                "notes": sorted(self.notes)}


@dataclass
class ChartUse:
    """A chart the platform installs: where helm pulls it from and the catalogue's sha256 of its archive."""

    release: str  # namespace/name
    name: str  # the chart's name in its repository, an oci:// reference, or a local archive's path
    repo: str | None
    version: str | None
    sha256: str | None = None  # the catalogue's
    verified: bool = False  # the sum was read from the repository's index (else: from our own packaging)

    @property
    def local(self) -> bool:
        return self.repo is None and not self.name.startswith("oci://")

    def document(self) -> dict:
        return {"release": self.release, "chart": self.name, "repository": self.repo, "version": self.version,
                "sha256": self.sha256, "sha256_verified": self.verified}


@dataclass
class ImageList:
    images: dict[str, Image] = field(default_factory=dict)
    charts: list[ChartUse] = field(default_factory=list)  # the charts `up` installs, in playbook order
    notes: list[str] = field(default_factory=list)  # what the list could not be exact about, and why
    incomplete: list[str] = field(default_factory=list)  # charts that could not be rendered
    mirror: str | None = None
    plain_http: bool = False

    def add(self, source: str, mirror: str | None, pulled_by: str, note: str = "") -> None:
        reference = catalogue.relocate(source, mirror)
        entry = self.images.setdefault(reference, Image(reference, source))
        entry.pulled_by.add(pulled_by)
        if note:
            entry.notes.add(note)

    def sorted(self) -> list[Image]:
        return [self.images[key] for key in sorted(self.images)]

    def per_component(self) -> dict[str, int]:
        """Image count per component (a step of ours, a chart, the operator's operands)."""
        counts: dict[str, int] = {}
        for image in self.images.values():
            for who in {who.split(" (")[0] for who in image.pulled_by}:
                counts[who] = counts.get(who, 0) + 1
        return dict(sorted(counts.items()))

    def document(self) -> dict:
        return {"mirror": self.mirror, "images": [i.document() for i in self.sorted()], "count": len(self.images),
                "charts": [c.document() for c in self.charts],
                "per_component": self.per_component(), "notes": list(self.notes), "incomplete": list(self.incomplete)}


def charts_of(submitted: list) -> list[ChartUse]:
    """The charts a plan installs, from its helm-upgrade changes (the gate's record), with the catalogue's sums."""
    from gpu_bootstrap.core.refs import Verb
    found = []
    for _step, change in submitted:
        if Verb(change.verb) != Verb.HELM_UPGRADE:
            continue
        body = change.body
        chart = body["chart"]
        name = chart["ref"]
        version = chart.get("version") or body.get("chart_version")
        short = name.rpartition("/")[2]
        found.append(ChartUse(f"{body['namespace']}/{body['release']}", name, chart.get("repo"), version,
                              catalogue.chart_sha256(short, version) if version else None,
                              catalogue.chart_sha256_verified(short)))
    return found


def container_images(node, found: list[str] | None = None) -> list[str]:
    """Every string `image` of every container list in a document, and the images operator arguments name."""
    found = [] if found is None else found
    if isinstance(node, dict):
        for key in catalogue.CONTAINER_LISTS:
            containers = node.get(key) if isinstance(node.get(key), list) else []
            for container in containers:
                if isinstance(container, dict) and isinstance(container.get("image"), str):
                    found.append(container["image"])
        for value in node.values():
            container_images(value, found)
    elif isinstance(node, list):
        for value in node:
            container_images(value, found)
    return found


def argument_images(node, found: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """(image, note) named by an operator's arguments (--prometheus-config-reloader=…) anywhere in a document."""
    found = [] if found is None else found
    if isinstance(node, dict):
        for value in node.values():
            argument_images(value, found)
    elif isinstance(node, list):
        for value in node:
            argument_images(value, found)
    elif isinstance(node, str):
        found += [(ref, ARG_NOTES.get(name, "")) for name, ref in OPERATOR_IMAGE_ARGS.findall(node)]
    return found


def custom_resource_images(doc: dict) -> list[str]:
    """Prometheus Operator resources name their main image in spec.image (the operator makes the pods)."""
    if str(doc.get("apiVersion", "")).startswith("monitoring.coreos.com/") and \
            isinstance((doc.get("spec") or {}).get("image"), str):
        return [doc["spec"]["image"]]
    return []


def operand_reference(section: dict) -> str | None:
    """repository/image:version of a ClusterPolicy section (a version 'sha256:…' is a digest)."""
    repository, name, version = section.get("repository"), section.get("image"), str(section.get("version") or "")
    if not name or not repository:
        return None
    separator = "@" if version.startswith("sha256:") else ":"
    return f"{repository}/{name}{separator}{version}" if version else f"{repository}/{name}"


def operands(policy: dict) -> list[tuple[str, str]]:
    """(component, reference) for each operand a ClusterPolicy makes the operator run; the driver's tag still lacks
    its OS suffix (see driver_images)."""
    spec = policy.get("spec") or {}
    sandbox = bool((spec.get("sandboxWorkloads") or {}).get("enabled"))
    out = []
    for component, section in spec.items():
        if not isinstance(section, dict) or section.get("enabled") is False:
            continue
        if component in SANDBOX_OPERANDS and not sandbox:
            continue
        if (ref := operand_reference(section)) is not None:
            out.append((component, ref))
        for sub_name, sub in section.items():  # driver.manager, vfioManager.driverManager
            if isinstance(sub, dict) and (ref := operand_reference(sub)) is not None:
                out.append((f"{component}.{sub_name}", ref))
    return out


@dataclass(frozen=True)
class NodeOs:
    node: str
    os_tag: str | None  # 'ubuntu22.04', None when unknown
    why_unknown: str = ""
    installs_driver: bool = True


def node_os(facts_reports: dict, driver_management: str) -> list[NodeOs]:
    """The OS tag of each GPU node the operator would install the driver on (from the preflight facts)."""
    out = []
    for name, report in sorted(facts_reports.items()):
        checks = {c.id: c for c in report.checks}
        ssh = checks.get("ssh")
        data = (ssh.data or {}) if ssh is not None else {}
        if data.get("pool"):
            continue  # a node of our Karpenter pools: its image ships the driver
        if ssh is None or ssh.status == "fail" or not data.get("os_id"):
            out.append(NodeOs(name, None, (ssh.message if ssh is not None else "") or "no facts"))
            continue
        driver = ((checks.get("nvidia-driver").data or {}) if checks.get("nvidia-driver") else {}).get(
            "driver_version")
        installs = driver_management == "operator" or not driver
        out.append(NodeOs(name, f"{data['os_id']}{data.get('os_version', '')}", installs_driver=installs))
    return out


def driver_images(reference: str, nodes: list[NodeOs], known_nodes: bool) -> tuple[list[tuple[str, str]], list[str]]:
    """(reference with its OS suffix, note) for the driver, and notes on what could not be told. The operator tags
    the driver `<version>-<os><version_id>` from each node's /etc/os-release (ubuntu22.04, rhel9.4)."""
    variants = catalogue.catalogue().get("driver_os_variants") or []
    known = [n for n in nodes if n.os_tag and n.installs_driver]
    unknown = [n for n in nodes if not n.os_tag]
    out = [(f"{reference}-{n.os_tag}", f"driver for {n.os_tag} ({n.node})") for n in known]
    notes = []
    if unknown or not known_nodes:
        why = "; ".join(f"{n.node}: {n.why_unknown}" for n in unknown[:3]) if unknown else \
            "no node facts (offline without --preflight-report)"
        notes.append(f"the OS of {'some GPU nodes' if known else 'the GPU nodes'} is unknown ({why}): listed every "
                     f"driver OS variant gpu-bootstrap knows for this release ({', '.join(variants)}); pass "
                     f"--preflight-report FILE (or run online) to list only the ones your nodes need")
        out += [(f"{reference}-{variant}", f"driver for {variant} (OS unknown)") for variant in variants]
    return out, notes


def collect(documents_by_step: dict[str, list[tuple[str, dict]]], facts_reports: dict, known_facts: bool,
            driver_management: str, mirror: str | None, not_rendered: dict[str, str]) -> ImageList:
    """documents_by_step: step id -> [(file name, document)] from a render made WITHOUT the mirror (the sources);
    each image is listed at its mirror reference too (catalogue.relocate), which is what the mirrored render holds."""
    result = ImageList()
    for step, documents in documents_by_step.items():
        chart = CHART_OF_STEP.get(step, step)
        for file_name, doc in documents:
            if not isinstance(doc, dict):
                continue
            from_chart = file_name == "manifests.yaml"
            where = f"{chart} chart ({doc.get('kind')} {((doc.get('metadata') or {}).get('name'))})" if from_chart \
                else f"gpu-bootstrap {step} ({doc.get('kind')} {((doc.get('metadata') or {}).get('name'))})"
            for ref in container_images(doc) + custom_resource_images(doc):
                result.add(ref, mirror, where)
            for ref, note in argument_images(doc):
                result.add(ref, mirror, where, note)
            if doc.get("kind") == "ClusterPolicy":
                _operands(result, doc, facts_reports, known_facts, driver_management, mirror)
    for step, why in sorted(not_rendered.items()):
        result.incomplete.append(f"{CHART_OF_STEP.get(step, step)}: {why}")
    return result


def _operands(result: ImageList, policy: dict, facts_reports: dict, known_facts: bool, driver_management: str,
              mirror: str | None) -> None:
    for component, ref in operands(policy):
        who = f"gpu-operator operand ({component})"
        if component == "driver" and policy["spec"]["driver"].get("usePrecompiled"):
            result.notes.append("driver.usePrecompiled: the operator picks a driver image per node kernel "
                                "(<branch>-<kernel>-<os>); those tags are not listed")
        elif component == "driver":
            tagged, notes = driver_images(ref, node_os(facts_reports, driver_management), known_facts)
            for reference, note in tagged:
                result.add(reference, mirror, who, note)
            result.notes += notes
        else:
            result.add(ref, mirror, who)
