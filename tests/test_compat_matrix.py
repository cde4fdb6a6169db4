"""Compatibility matrix (#12): every Kubernetes minor from 1.24 to 1.35 against every distribution preflight
detects, through the real CLI in-process: `up --dry-run --offline --kube-version X --render-dir D
--preflight-report R -o json` with a default config (two GPU nodes, nothing else).

The node facts are real preflight reports: each distribution's node is built by the scenario builders of
tests/nodes (kubeadm with containerd, k3s, rke2, microk8s, CRI-O, docker with cri-dockerd, plus an EKS-style node
composed here from the same parts), and the real probe script (gpu_bootstrap.probes.script) runs on it under
busybox in a chroot (no sshd), once per distribution; its output is evaluated by the same code as over SSH.
--kube-version is given in the distribution's own style (1.31.4+k3s1, 1.31.4+rke2r1, 1.31.4-eks-2d5f260).

Each case checks:
  - exit 0, every step planned; the gpu-operator and monitoring steps "incomplete" only because their repository
    charts' manifests were not rendered;
  - the versions chosen are the documented ones, written out below (not computed from the table): the gpu-operator
    release line and version, kube-prometheus-stack (72.9.1 on 1.24, 88.5.3 from 1.25), the scheduler's KubeSchedulerConfiguration apiVersion (v1beta3 on 1.24, v1 from 1.25)
    and its image tag (the API server's own version);
  - every manifest written validates against that Kubernetes version's schemas (kubernetes-validate, strict): the
    node-prep patches applied to the fresh Node they patch, the scheduler's nine objects, the validation namespace
    and pods. kubernetes-validate ships schemas from 1.25 on, so 1.24 is validated against the 1.25 schemas.
  - values.yaml holds the values derived from the distribution's facts (driver and toolkit).
Not validated in the matrix: the gpu-operator's own manifests. The default chart comes from NVIDIA's repository,
which an offline run cannot fetch, so helm is pointed at nothing there (no case touches the network) and only
values.yaml and release.yaml are written. test_operator_manifests_from_the_local_chart renders the local 26.7.0
chart on 1.33, 1.34 and 1.35 (where 26.7 is the line chosen) for three distributions whose operator values differ
(toolkit off; toolkit on for k3s's and for rke2's containerd) and validates those manifests too, custom resources
against the chart's own CRDs. The embedded KubeSchedulerConfiguration has no published schema;
its apiVersion and profile are checked instead.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.probes import script
from gpu_bootstrap.probes.checks import NodeReport, evaluate
from gpu_bootstrap.probes.report import document
from tests.conftest import chart
from tests.nodes import recorded as rec
from tests.nodes import scenarios
from tests.nodes.farm import Tree
from tests.tools import missing, tool

kubernetes_validate = pytest.importorskip("kubernetes_validate")
runner = CliRunner()
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: the matrix reads ~1500 files


NODES = ["gpu-1", "gpu-2"]
MINORS = range(24, 36)

def load(path: Path):
    return yaml.load(path.read_text(), Loader=Loader)


# --- the documented rules, written out --------------------------------------------------------------------------------
GPU_OPERATOR = {24: "v24.9.2", 25: "v24.9.2", 26: "v24.9.2", 27: "v24.9.2", 28: "v24.9.2", 29: "v25.3.4",
                30: "v25.10.1", 31: "v25.10.1", 32: "v26.3.3", 33: "v26.7.0", 34: "v26.7.0", 35: "v26.7.0"}
GPU_OPERATOR_RANGE = {"v24.9.2": "1.24-1.31", "v25.3.4": "1.29-1.32", "v25.10.1": "1.30-1.34", "v26.3.3": "1.32-1.35",
                      "v26.7.0": "1.33-1.37"}


def scheduler_api(minor: int) -> str:
    return "kubescheduler.config.k8s.io/" + ("v1beta3" if minor < 25 else "v1")


# --- the distributions ------------------------------------------------------------------------------------------------
OS_RELEASE_AL2023 = """NAME="Amazon Linux"
VERSION="2023"
ID="amzn"
ID_LIKE="fedora"
VERSION_ID="2023"
PLATFORM_ID="platform:al2023"
PRETTY_NAME="Amazon Linux 2023.6.20250218"
ANSI_COLOR="0;33"
CPE_NAME="cpe:2.3:o:amazon:amazon_linux:2023"
HOME_URL="https://aws.amazon.com/linux/amazon-linux-2023/"
SUPPORT_END="2029-06-30"
"""
A10G = ("NVIDIA A10G", 23028, "8.6")


def eks_node(tree: Tree) -> None:
    """An EKS-style node (the accelerated Amazon Linux 2023 image on a g5 instance): driver and toolkit
    pre-installed, containerd with nvidia as its default runtime."""
    tree.file("/etc/os-release", OS_RELEASE_AL2023)
    tree.file("/proc/sys/kernel/osrelease", "6.1.128-136.201.amzn2023.x86_64\n")
    scenarios.driver(tree, A10G, 1)
    scenarios.containerd(tree, rec.CONTAINERD_CONFIG_NVIDIA_DEFAULT)
    scenarios.toolkit(tree)


# name: (scenario, --kube-version suffix, (runtime, distribution) preflight must detect, the toolkit's values:
#        toolkit.enabled and the toolkit.env entries that point it at the distribution's containerd)
DISTRIBUTIONS = {
    "kubeadm-containerd": (scenarios.healthy_h100, "", ("containerd", "standard"), {"enabled": False}),
    "k3s": (scenarios.k3s, "+k3s1", ("containerd", "k3s"), {
        "enabled": True, "CONTAINERD_CONFIG": "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
        "CONTAINERD_SOCKET": "/run/k3s/containerd/containerd.sock"}),
    "rke2": (scenarios.rke2, "+rke2r1", ("containerd", "rke2"), {
        "enabled": True, "CONTAINERD_CONFIG": "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
        "CONTAINERD_SOCKET": "/run/k3s/containerd/containerd.sock"}),
    "microk8s": (scenarios.microk8s, "", ("containerd", "microk8s"), {"enabled": False}),
    "cri-o": (scenarios.crio, "", ("cri-o", "standard"), {"enabled": False}),
    "docker-cri-dockerd": (scenarios.docker_nvidia_default, "", ("docker", "standard"), {"enabled": False}),
    "eks": (eks_node, "-eks-2d5f260", ("containerd", "standard"), {"enabled": False}),
}
CASES = [(minor, name) for minor in MINORS for name in DISTRIBUTIONS]


def kube_version(minor: int, distribution: str) -> str:
    return f"1.{minor}.{minor % 10}{DISTRIBUTIONS[distribution][1]}"


# --- preflight reports from the scenario builders, without sshd -------------------------------------------------------
def _chroot_command(root: Path) -> list[str]:
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    if os.geteuid() == 0:
        return [chroot, str(root), "/bin/sh", "-s"]
    unshare = shutil.which("unshare") or "/usr/bin/unshare"
    if subprocess.run([unshare, "-r", "true"], capture_output=True).returncode != 0:
        missing("running the probe script in a node tree needs root or user namespaces (unshare -r)")
    return [unshare, "-r", chroot, str(root), "/bin/sh", "-s"]


def _memory_dir() -> str | None:
    """/dev/shm when it can hold executables (a node tree is ~300 files; tmpfs makes them 10x faster), else None."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        return None
    return None if os.statvfs(shm).f_flag & os.ST_NOEXEC else str(shm)


_TREES = _memory_dir()


@functools.lru_cache(maxsize=None)
def _applets(busybox: str) -> tuple[str, ...]:
    return tuple(subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split())


def probe(scenario) -> NodeReport:
    """A node built by `scenario`, probed by the real preflight script run in a chroot of its tree."""
    busybox = tool("busybox")
    root = Path(tempfile.mkdtemp(prefix="gb-node-", dir=_TREES))  # short: the tree holds unix sockets
    try:
        for folder in ("bin", "usr/bin", "usr/sbin", "usr/local/bin", "etc", "proc", "dev", "run", "var/run", "tmp"):
            (root / folder).mkdir(parents=True, exist_ok=True)
        try:
            os.link(busybox, root / "bin" / "busybox")
        except OSError:
            shutil.copy2(busybox, root / "bin" / "busybox")
        for applet in _applets(busybox):
            if not (root / "bin" / applet).exists():
                (root / "bin" / applet).symlink_to("busybox")
        scenario(Tree(root))
        marker = script.new_marker()
        done = subprocess.run(_chroot_command(root), input=script.build(marker, 10), capture_output=True, text=True,
                              env={"PATH": "/bin:/usr/bin"}, timeout=60)  # tool_env: a node's busybox shell
        return evaluate("node", script.split(done.stdout, marker), marker)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    """distribution -> a saved preflight report ({"nodes": [...], "ok": ...}) for the config's two nodes."""
    folder = tmp_path_factory.mktemp("reports")
    saved = {}
    with ThreadPoolExecutor(max_workers=4) as pool:  # one probe script per distribution, side by side
        probed = dict(zip(DISTRIBUTIONS, pool.map(probe, [spec[0] for spec in DISTRIBUTIONS.values()])))
    for name, node in probed.items():  # the same facts for both nodes, as `doctor -o json` writes them
        path = folder / f"{name}.json"
        path.write_text(json.dumps(document([NodeReport(n, node.checks) for n in NODES])))
        saved[name] = path
    return saved


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "gpu-bootstrap.yaml"
    path.write_text("nodes:\n" + "".join(f"  - name: {n}\n" for n in NODES))  # everything else at its default
    return path


# --- schema validation ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def validate():
    """validate(doc, minor): kubernetes-validate (strict) against that minor's schemas (1.25's for 1.24). Its schema
    files are read once (it would re-read them for every document) and each distinct document is validated once
    per version: the distributions share most objects."""
    cached = functools.lru_cache(maxsize=None)(kubernetes_validate.utils.schema_contents)
    seen: set[tuple[str, str]] = set()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kubernetes_validate.utils, "schema_contents", cached)

        def run(doc: dict, minor: int) -> None:
            version = f"1.{max(minor, 25)}"
            key = (version, json.dumps(doc, sort_keys=True))
            if key not in seen:
                kubernetes_validate.validate(doc, version, strict=True)
                seen.add(key)
        yield run


def merge_patch(target, patch):
    """RFC 7386."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def fresh_node(name: str) -> dict:
    """The Node the offline plan patches (adapters/offline.py: a fresh GPU node)."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {}}


def plan(config: Path, report: Path, kube: str, out: Path, log: Path):
    """An offline plan; a chart that could not be rendered leaves it incomplete, which these cases accept and name."""
    result = runner.invoke(app, ["up", "--dry-run", "--offline", "--allow-incomplete", "--kube-version", kube,
                                 "-c", str(config),
                                 "--render-dir", str(out), "--preflight-report", str(report), "-o", "json",
                                 "--log-file", str(log)])
    return result, (json.loads(result.stdout) if result.stdout.startswith("{") else None)


# --- the matrix -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("minor, distribution", CASES, ids=[f"1.{m}-{d}" for m, d in CASES])
def test_default_config_plans_every_step_with_the_documented_versions(minor, distribution, reports, config, validate,
                                                                     tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_BOOTSTRAP_HELM", str(tmp_path / "no-helm"))  # the repository chart is not fetched
    kube = kube_version(minor, distribution)
    server = kube.split("+")[0].split("-")[0]
    out = tmp_path / "out"
    result, doc = plan(config, reports[distribution], kube, out, tmp_path / "log")
    assert result.exit_code == 0, result.output
    steps = {s["id"]: s for s in doc["steps"]}
    assert {k: s["status"] for k, s in steps.items()} == {
        "preflight": "unchanged", "node-prep": "planned", "gpu-pools": "skipped", "monitoring": "incomplete",
        "gpu-operator": "incomplete", "binpack-scheduler": "planned", "admission-opa": "planned", "admission": "planned", "queues": "skipped",
        "validate": "planned"}, doc
    assert steps["gpu-operator"]["message"].startswith("planned, but gpu-operator manifests not rendered")
    assert steps["monitoring"]["message"].startswith("planned, but kube-prometheus-stack manifests not rendered")
    monitoring = load(out / "monitoring" / "release.yaml")
    assert monitoring["chart_version"] == ("72.9.1" if minor == 24 else "88.5.3")  # 88.x needs Kubernetes >= 1.25

    # the facts preflight found are the distribution's
    facts = json.loads(reports[distribution].read_text())["nodes"][0]
    runtime = next(c for c in facts["checks"] if c["id"] == "container-runtime")["data"]
    assert (runtime["runtime"], runtime["distribution"]) == DISTRIBUTIONS[distribution][2]

    # gpu-operator: the newest line NVIDIA validated, and the rule in the plan line
    expected = GPU_OPERATOR[minor]
    release = load(out / "gpu-operator" / "release.yaml")
    assert (release["chart"]["version"], release["chart_version"], release["kube_version"]) == (expected, expected,
                                                                                                server)
    line = "v" + ".".join(expected.lstrip("v").split(".")[:2]) + ".x"
    assert (out / "gpu-operator" / "plan.txt").read_text() == "".join(
        f"patch Node {node}: update the gpu-bootstrap record  ← remember which operator labels the node has before "
        f"the first install (teardown keeps those)\n" for node in NODES) + (
        "apply Namespace gpu-operator: create  ← the release's namespace, labelled as ours so that teardown removes "
        "it, and pod-security.kubernetes.io/enforce=privileged: the operator's driver, container-toolkit, "
        "device-plugin and DCGM pods use the host (NVIDIA's advice)\n"
        f"helm-upgrade release gpu-operator/gpu-operator: install: gpu-operator {line} ({expected})  ← newest "
        f"release NVIDIA validated for Kubernetes 1.{minor} ({GPU_OPERATOR_RANGE[expected]})\n")
    assert (out / "gpu-operator" / "manifests-not-rendered.txt").exists()
    values = load(out / "gpu-operator" / "values.yaml")
    assert values["driver"]["enabled"] is False  # pre-installed on every node of every distribution here
    toolkit = {"enabled": values["toolkit"]["enabled"], **{e["name"]: e["value"]
                                                           for e in values["toolkit"].get("env", [])}}
    assert {k: toolkit.get(k) for k in DISTRIBUTIONS[distribution][3]} == DISTRIBUTIONS[distribution][3]

    # binpack-scheduler: config apiVersion and image for this version
    scheduler = [load(p) for p in sorted((out / "binpack-scheduler").glob("*.yaml"))]
    assert len(scheduler) == 9
    configmap = next(d for d in scheduler if d["kind"] == "ConfigMap")
    embedded = yaml.load(configmap["data"]["config.yaml"], Loader=Loader)
    assert embedded["apiVersion"] == scheduler_api(minor) and embedded["kind"] == "KubeSchedulerConfiguration"
    assert embedded["profiles"][0]["schedulerName"] == "gpu-binpack-scheduler"
    deployment = next(d for d in scheduler if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == \
        f"registry.k8s.io/kube-scheduler:v{server}"

    # every manifest validates against this version's schemas
    patches = sorted((out / "node-prep").glob("*-patch-node-*.yaml"))
    assert [p.name.split("-patch-node-")[1][:-5] for p in patches] == NODES
    for path in patches:
        name = path.name.split("-patch-node-")[1][:-5]
        validate(merge_patch(fresh_node(name), load(path)), minor)
    validation = [load(p) for p in sorted((out / "validate").glob("*.yaml"))]
    assert [d["kind"] for d in validation] == ["Namespace", "Pod", "Pod"]
    # admission: OPA and its webhook (the Secret's data is redacted in the render dir, so it is left out here)
    admission = [load(p) for folder in ("admission-opa", "admission")
                 for p in sorted((out / folder).glob("*.yaml"))]
    assert {"Deployment", "Service", "MutatingWebhookConfiguration"} <= {d["kind"] for d in admission}
    for manifest in scheduler + validation + [d for d in admission if d["kind"] != "Secret"]:
        validate(manifest, minor)


# --- the operator's own manifests, from the local chart ---------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def crd_schemas(chart_path: Path) -> dict[tuple[str, str], dict]:
    """The chart's CRDs (crds/ of the archive, read without helm): (apiVersion, kind) -> openAPIV3Schema."""
    schemas = {}
    with tarfile.open(chart_path) as archive:
        for member in archive.getmembers():
            if "/crds/" in member.name and member.name.endswith(".yaml"):
                for crd in yaml.load_all(archive.extractfile(member).read(), Loader=Loader):
                    for version in (crd or {}).get("spec", {}).get("versions", []):
                        schemas[(f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])] = \
                            version["schema"]["openAPIV3Schema"]
    return schemas


# 1.33-1.35 (where 26.7 is the line chosen), each with a distribution whose values differ: the toolkit left to the
# node (nvidia already the default runtime), or installed and pointed at k3s's or rke2's containerd.
LOCAL = [(33, "kubeadm-containerd"), (34, "k3s"), (35, "rke2")]


@pytest.mark.tools
@pytest.mark.parametrize("minor, distribution", LOCAL, ids=[f"1.{m}-{d}" for m, d in LOCAL])
def test_operator_manifests_from_the_local_chart(minor, distribution, reports, validate, tmp_path, monkeypatch):
    """With gpu_operator.chart set to the local 26.7.0 chart (the line chosen on 1.33-1.35), the operator's
    manifests are rendered for the distribution's values and validate too."""
    monkeypatch.setenv("GPU_BOOTSTRAP_HELM", tool("helm"))
    monkeypatch.setenv("HELM_CACHE_HOME", str(tmp_path / "helm-cache"))
    local = chart("gpu-operator-v26.7.0.tgz")
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text("nodes:\n" + "".join(f"  - name: {n}\n" for n in NODES) + f"gpu_operator: {{chart: {local}}}\n"
                      "monitoring: {enabled: false}\n")  # (its repository chart would need the network)
    out = tmp_path / "out"
    result, doc = plan(config, reports[distribution], kube_version(minor, distribution), out, tmp_path / "log")
    assert result.exit_code == 0, result.output
    assert {s["id"]: s["status"] for s in doc["steps"]}["gpu-operator"] == "planned", doc
    assert (out / "gpu-operator" / "plan.txt").read_text().splitlines()[len(NODES) + 1].startswith(
        "helm-upgrade release gpu-operator/gpu-operator: install: gpu-operator v26.7.x (v26.7.0)  ← the local "
        f"chart {local} (gpu_operator.chart); v26.7.x: validated for 1.33-1.37")
    manifests = [d for d in yaml.load_all((out / "gpu-operator" / "manifests.yaml").read_text(), Loader=Loader) if d]
    assert len(manifests) > 20
    custom = crd_schemas(local)
    for manifest in manifests:
        if (manifest["apiVersion"], manifest["kind"]) in custom:
            jsonschema.validate(manifest, custom[(manifest["apiVersion"], manifest["kind"])])
        else:
            validate(manifest, minor)


def test_the_matrix_can_fail(reports, config, tmp_path, monkeypatch):
    """A pinned release outside the cluster's range stops the plan: the matrix would see it (exit 2)."""
    monkeypatch.setenv("GPU_BOOTSTRAP_HELM", str(tmp_path / "no-helm"))
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(config.read_text() + "gpu_operator: {version: v24.9.2}\n")
    result, doc = plan(pinned, reports["k3s"], kube_version(33, "k3s"), tmp_path / "out", tmp_path / "log")
    assert result.exit_code == 2 and doc["ok"] is False
    assert "gpu-operator v24.9.2 is validated for Kubernetes 1.24-1.31, but the cluster runs 1.33.3" in doc["error"]
