"""registry.mirror end to end, against the real parts: the real charts rendered by the real `helm template`, and
Debian's docker-registry (the CNCF distribution registry server) on 127.0.0.1 for `images --check`, with small
artefacts pushed over its plain-HTTP API (a config blob and an OCI manifest per image)."""
from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.app import images as image_list
from gpu_bootstrap.core import catalogue as images
from gpu_bootstrap.adapters.registry import Registry, RegistryError
from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.core.config import RegistryConfig
from tests.conftest import chart
from tests.nodes.reports import healthy_node
from tests.tools import tool

runner = CliRunner()
NODES = ["gpu-a", "gpu-b"]
PUBLIC = ("docker.io", "quay.io", "registry.k8s.io", "nvcr.io", "ghcr.io", "gcr.io", "k8s.gcr.io", "public.ecr.aws")


# --- the real registry ------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OciRegistry:
    """docker-registry serving a temp folder on 127.0.0.1:port (optionally with htpasswd users)."""

    def __init__(self, folder: Path, users: dict[str, str] | None = None):
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        config = {"version": 0.1, "log": {"level": "error"},
                  "storage": {"filesystem": {"rootdirectory": str(folder / "data")}},
                  "http": {"addr": self.host}}
        self.auth = None
        if users:
            import bcrypt  # paramiko's dependency: htpasswd needs bcrypt hashes
            (folder / "htpasswd").write_text("".join(
                f"{u}:{bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode()}\n" for u, p in users.items()))
            config["auth"] = {"htpasswd": {"realm": "test", "path": str(folder / "htpasswd")}}
            user, password = next(iter(users.items()))
            self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        (folder / "config.yml").write_text(yaml.safe_dump(config))
        self.log = (folder / "registry.log").open("wb")
        self.process = subprocess.Popen([tool("docker-registry"), "serve", str(folder / "config.yml")],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1)
                break
            except urllib.error.HTTPError:
                break  # 401: up, and asking for credentials
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise AssertionError(f"docker-registry did not start: {(folder / 'registry.log').read_text()}")
                time.sleep(0.1)

    def _call(self, method: str, url: str, data: bytes = b"", headers: dict | None = None):
        headers = dict(headers or {})
        if self.auth:
            headers["Authorization"] = self.auth
        request = urllib.request.Request(url if url.startswith("http") else f"http://{self.host}{url}", data=data,
                                         method=method, headers=headers)
        return urllib.request.urlopen(request, timeout=10)

    def _blob(self, name: str, content: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(content).hexdigest()
        location = self._call("POST", f"/v2/{name}/blobs/uploads/").headers["Location"]
        self._call("PUT", f"{location}{'&' if '?' in location else '?'}digest={digest}", content,
                   {"Content-Type": "application/octet-stream"})
        return digest

    def push(self, reference: str) -> str:
        """Push a tiny image (a config blob and an OCI manifest) at reference's path and tag; returns its digest."""
        parsed = images.parse(reference)
        config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []},
                             "ref": reference}).encode()
        manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                          "digest": self._blob(parsed.path, config), "size": len(config)},
                               "layers": []}).encode()
        answer = self._call("PUT", f"/v2/{parsed.path}/manifests/{parsed.tag or 'latest'}", manifest,
                            {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        return answer.headers["Docker-Content-Digest"]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture
def oci_registry(tmp_path):
    registry = OciRegistry(tmp_path / "registry-open")
    yield registry
    registry.stop()


@pytest.fixture
def locked_registry(tmp_path):
    registry = OciRegistry(tmp_path / "registry-locked", {"alice": "s3cret-Pa55"})
    yield registry
    registry.stop()


def test_check_tells_present_from_missing_on_the_real_registry(oci_registry):
    digest = oci_registry.push(f"{oci_registry.host}/mirror/prometheus/prometheus:v3.14.0")
    client = Registry(oci_registry.host)
    assert client.scheme == "http"  # loopback: plain HTTP, as docker does
    assert client.has(f"{oci_registry.host}/mirror/prometheus/prometheus:v3.14.0")
    assert client.has(f"{oci_registry.host}/mirror/prometheus/prometheus:v3.14.0@{digest}")  # the digest wins
    assert not client.has(f"{oci_registry.host}/mirror/prometheus/prometheus:v3.15.0")  # another tag
    assert not client.has(f"{oci_registry.host}/mirror/prometheus/alertmanager:v0.34.0")  # another repository
    assert not client.has(f"{oci_registry.host}/mirror/prometheus/prometheus@sha256:" + "0" * 64)


def test_credentials_from_the_docker_config_and_a_refusal_that_names_the_registry(locked_registry, tmp_path):
    reference = f"{locked_registry.host}/mirror/busybox:1.37.0"
    locked_registry.push(reference)
    with pytest.raises(RegistryError) as refused:
        Registry(locked_registry.host, environ={"DOCKER_CONFIG": str(tmp_path / "nowhere")}).has(reference)
    assert f"registry {locked_registry.host} refuses mirror/busybox (401)" in refused.value.one_line()
    assert "docker login" in refused.value.one_line()
    folder = tmp_path / "docker"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"auths": {locked_registry.host: {
        "auth": base64.b64encode(b"alice:s3cret-Pa55").decode()}}}))
    assert Registry(locked_registry.host, environ={"DOCKER_CONFIG": str(folder)}).has(reference)
    (folder / "config.json").write_text(json.dumps({"auths": {locked_registry.host: {
        "auth": base64.b64encode(b"alice:wrong-Pa55").decode()}}}))
    with pytest.raises(RegistryError) as wrong:
        Registry(locked_registry.host, environ={"DOCKER_CONFIG": str(folder)}).has(reference)
    assert "with the credentials of your docker config" in wrong.value.one_line()
    assert "Pa55" not in wrong.value.one_line()  # never printed


def test_a_registry_that_is_down_is_named():
    host = f"127.0.0.1:{free_port()}"
    with pytest.raises(RegistryError) as error:
        Registry(host).has(f"{host}/mirror/x:1")
    assert f"registry {host} is unreachable" in error.value.one_line()


# --- the rendered platform --------------------------------------------------------------------------------------------
def report_file(path: Path, os_facts: dict[str, tuple[str, str]]) -> Path:
    """A saved preflight report: GPU nodes with no NVIDIA driver (the operator installs it) on the given OS."""
    nodes = []
    for name, (os_id, version) in os_facts.items():
        node = healthy_node(name)
        for check in node["checks"]:
            if check["id"] == "ssh":
                check["data"].update(os_id=os_id, os_version=version, os=f"{os_id} {version}")
            if check["id"] == "nvidia-driver":
                check.update(status="warn", message="no driver", data={"driver_version": None, "gpus": []})
        nodes.append(node)
    path.write_text(json.dumps({"nodes": nodes, "ok": True}))
    return path


def write_config(path: Path, mirror: str | None, kube: str, extra: str = "") -> Path:
    text = "nodes:\n" + "".join(f"  - name: {n}\n" for n in NODES)
    if mirror:
        text += f"registry:\n  mirror: {mirror}\n  pull_secret: regcred\n"
    if kube == "1.33":
        text += (f"gpu_operator:\n  chart: {chart('gpu-operator-v26.7.0.tgz')}\n"
                 f"monitoring:\n  chart: {chart('kube-prometheus-stack-88.5.3.tgz')}\n")
    elif kube == "1.29":  # the newest local operator chart is validated from 1.30: rendered anyway, at our own risk
        text += (f"gpu_operator:\n  chart: {chart('gpu-operator-v25.10.1.tgz')}\n  skip_version_check: true\n"
                 f"monitoring:\n  chart: {chart('kube-prometheus-stack-88.5.3.tgz')}\n")
    path.write_text(text + extra)
    return path


def render(tmp_path: Path, config: Path, kube: str, report: Path | None = None) -> Path:
    out = tmp_path / f"render-{kube}"
    # --allow-incomplete: a repository chart (1.24's kube-prometheus-stack, the default config's) cannot be pulled
    # offline; what was rendered is still checked
    args = ["up", "--dry-run", "--offline", "--allow-incomplete", "--kube-version", kube, "-c", str(config),
            "--render-dir", str(out), "--log-file", str(tmp_path / "log")]
    result = runner.invoke(app, args + (["--preflight-report", str(report)] if report else []))
    assert result.exit_code == 0, result.output
    return out


def rendered_references(out: Path, enabled_operands_only: bool = False) -> list[tuple[str, str]]:
    """(file, reference) for every image reference anywhere in a render: each container's image, every string under
    an `image` key, every `--…image=`/`--…config-reloader=` argument, every ClusterPolicy operand (repository/image:version)
    and every `repository` value in the merged chart values. `enabled_operands_only`: leave out the ClusterPolicy's
    sections the operator does not run (enabled: false; the sandbox operands without sandboxWorkloads.enabled)."""
    found = []

    def walk(node, where, policy=False):
        if isinstance(node, dict):
            if policy and isinstance(node.get("image"), str):  # a ClusterPolicy operand: repository/image:version
                if node.get("repository"):  # none: nothing to pull (vgpuManager until you name your registry)
                    found.append((where, image_list.operand_reference(node)))
            elif isinstance(node.get("image"), str):
                found.append((where, node["image"]))
            for value in node.values():
                walk(value, where, policy or node.get("kind") == "ClusterPolicy")
        elif isinstance(node, list):
            for value in node:
                walk(value, where, policy)
        elif isinstance(node, str):
            found.extend((where, m) for m in re.findall(r"--[a-z-]*(?:image|config-reloader)=(\S+)", node))

    for path in sorted(out.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if enabled_operands_only and isinstance(doc, dict) and doc.get("kind") == "ClusterPolicy":
                sandbox = (doc["spec"].get("sandboxWorkloads") or {}).get("enabled")
                doc = {**doc, "spec": {key: section for key, section in doc["spec"].items()
                                       if not (isinstance(section, dict) and section.get("enabled") is False)
                                       and (sandbox or key not in image_list.SANDBOX_OPERANDS)}}
            walk(doc, str(path.relative_to(out)))
            if path.name == "values.yaml":
                found += [(str(path.relative_to(out)), repo) for repo in _repositories(doc)]
    return found


def pod_specs(node) -> list[dict]:
    """Every pod spec in a document (a dict with containers), and the Prometheus Operator's resources' specs."""
    found = []
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list) or node.get("kind") in ("Prometheus", "Alertmanager"):
            found.append(node if "containers" in node else node.get("spec") or {})
        for value in node.values():
            found += pod_specs(value)
    elif isinstance(node, list):
        for value in node:
            found += pod_specs(value)
    return found


def _repositories(values) -> list[str]:
    out = []
    if isinstance(values, dict):
        for key, value in values.items():
            if key == "repository" and isinstance(value, str) and value:
                out.append(value)
            out += _repositories(value)
    elif isinstance(values, list):
        for value in values:
            out += _repositories(value)
    return out


@pytest.mark.parametrize("kube", ["1.24", "1.29", "1.33"])
def test_with_a_mirror_no_image_reference_leaves_it(kube, tmp_path, helm_on_path):
    mirror = "registry.example.com:5000/mirror"
    out = render(tmp_path, write_config(tmp_path / "config.yaml", mirror, kube), kube)
    found = rendered_references(out)
    outside = [(where, ref) for where, ref in found if not ref.startswith(f"{mirror}/")]
    assert outside == []
    files = {where.split("/")[0] for where, _ref in found}
    assert {"binpack-scheduler", "admission-opa", "validate"} <= files
    if kube != "1.24":  # the charts were rendered: their hooks and the operator's operands are in the walk
        assert any("manifests.yaml" in w and "kube-webhook-certgen" in r for w, r in found)
        assert any("manifests.yaml" in w and "/nvidia/driver:" in r for w, r in found)  # ClusterPolicy
        assert any("prometheus-config-reloader" in r for _w, r in found)
    # the pull secret reaches every pod spec we apply or a chart renders (operands: the ClusterPolicy's lists)
    without = [(path.name, doc.get("kind")) for path in out.rglob("*.yaml") if path.name != "values.yaml"
               for doc in yaml.safe_load_all(path.read_text()) for spec in pod_specs(doc)
               if {"name": "regcred"} not in (spec.get("imagePullSecrets") or [])]
    assert without == []
    policies = [doc for path in out.rglob("manifests.yaml") for doc in yaml.safe_load_all(path.read_text())
                if isinstance(doc, dict) and doc.get("kind") == "ClusterPolicy"]
    assert [key for policy in policies for key, section in policy["spec"].items()
            if isinstance(section, dict) and section.get("repository") and section.get("image")
            and "regcred" not in (section.get("imagePullSecrets") or [])] == []


def test_images_is_exactly_what_the_render_pulls_and_names_the_driver_per_os(tmp_path, helm_on_path):
    """Both ways: every listed image is in the mirrored render (the driver with its OS suffix), and every image the
    render holds is listed (no hidden images)."""
    mirror = "registry.example.com:5000/mirror"
    config = write_config(tmp_path / "config.yaml", mirror, "1.33")
    report = report_file(tmp_path / "report.json", {"gpu-a": ("ubuntu", "22.04"), "gpu-b": ("rhel", "9.4")})
    result = runner.invoke(app, ["images", "--offline", "--kube-version", "1.33", "-c", str(config),
                                 "--preflight-report", str(report), "-o", "json", "--log-file", str(tmp_path / "l")])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    references = {entry["image"] for entry in listed["images"]}
    drivers = sorted(ref for ref in references if "/nvidia/driver:" in ref)
    assert drivers == [f"{mirror}/nvidia/driver:595.91.07-rhel9.4", f"{mirror}/nvidia/driver:595.91.07-ubuntu22.04"]
    assert not listed["notes"] and not listed["incomplete"] and listed["ok"]
    rendered = {ref for _where, ref in rendered_references(render(tmp_path, config, "1.33", report), True)
                if not _where.endswith("values.yaml")}
    # The config names no SSH route, so `up` probes the nodes through the cluster (preflight.via auto): the probe's
    # DaemonSet runs at preflight time, so no render holds it, and the list names it as preflight's.
    probe = images.locate(images.default("busybox"), RegistryConfig(mirror=mirror))
    assert [e["pulled_by"] for e in listed["images"] if e["image"] == probe] == [
        ["gpu-bootstrap preflight (pods of the in-cluster probe: preflight.via cluster)"]]
    references.discard(probe)
    # the render holds the driver without its OS suffix (the operator adds it per node)
    assert {re.sub(r"(/nvidia/driver:[0-9.]+)-\w+[0-9.]+$", r"\1", ref) for ref in references} == rendered
    sources = {entry["source"] for entry in listed["images"]}
    assert all(not s.startswith(mirror) for s in sources) and f"{mirror}/openpolicyagent/opa:1.16.2@sha256:" \
        "a915d8b59ddb09a9badecd8e061d43cf3111283494c4cf1d38a675bdb4e81a13" in references
    per = listed["per_component"]
    assert per["kube-prometheus-stack chart"] >= 9 and per["gpu-operator operand"] >= 6


def test_images_check_against_the_real_registry(oci_registry, tmp_path, helm_on_path):
    mirror = f"{oci_registry.host}/mirror"
    config = write_config(tmp_path / "config.yaml", mirror, "1.33")
    report = report_file(tmp_path / "report.json", {"gpu-a": ("ubuntu", "22.04"), "gpu-b": ("ubuntu", "22.04")})
    args = ["images", "--offline", "--kube-version", "1.33", "-c", str(config), "--preflight-report", str(report),
            "--log-file", str(tmp_path / "log")]
    listed = json.loads(runner.invoke(app, [*args, "-o", "json"]).stdout)["images"]
    references = sorted(entry["image"] for entry in listed)
    left_out = [r for r in references if "/driver:" in r or "/grafana/grafana:" in r]
    assert len(left_out) == 2
    for reference in references:
        if reference not in left_out:
            oci_registry.push(reference.split("@")[0])  # pushed by tag: the digest of our tiny artefact differs
    result = runner.invoke(app, [*args, "--check"])
    pinned = [r for r in references if "@" in r]  # pinned by a digest our tiny artefacts cannot have
    assert result.exit_code == 1
    missing = [line.strip() for line in result.stderr.splitlines() if line.startswith("  ")]
    assert sorted(missing) == sorted(left_out + pinned)
    assert f"missing from {mirror}" in result.stderr
    for reference in left_out:
        oci_registry.push(reference.split("@")[0])
    if not pinned:
        assert runner.invoke(app, [*args, "--check"]).exit_code == 0


def test_check_with_the_mirror_down_or_unset(tmp_path):
    host = f"127.0.0.1:{free_port()}"
    config = write_config(tmp_path / "config.yaml", f"{host}/mirror", "1.24")
    args = ["images", "--check", "--offline", "--kube-version", "1.24", "-c", str(config),
            "--log-file", str(tmp_path / "log")]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and f"registry {host} is unreachable" in result.output
    unset = runner.invoke(app, [*args[:-4], "-c", str(write_config(tmp_path / "plain.yaml", None, "1.24")),
                                "--log-file", str(tmp_path / "log")])
    assert unset.exit_code == 2 and "registry.mirror" in unset.output


@pytest.mark.parametrize("mirror, says", [("https://registry.example.com", "without a scheme"),
                                          ("'registry example.com'", "has spaces")])
def test_a_bad_mirror_changes_nothing(mirror, says, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"nodes:\n  - name: a\nregistry:\n  mirror: {mirror}\n")
    out = tmp_path / "render"
    result = runner.invoke(app, ["up", "--dry-run", "--offline", "-c", str(config), "--render-dir", str(out),
                                 "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 2 and "registry.mirror" in result.output and says in result.output
    assert not out.exists()


# --- issue 22: what we pull is pinned ---------------------------------------------------------------------------------
@pytest.mark.parametrize("local_charts", [False, True])
def test_the_default_config_pulls_nothing_unpinned_that_the_catalogue_does_not_explain(local_charts, tmp_path,
                                                                                      helm_on_path):
    """An offline render of the default config: every image reference has a digest, or the catalogue says why not
    (core/data/images.yaml). With the local charts, the charts' own images and the operator's operands count too."""
    config = write_config(tmp_path / "config.yaml", None, "1.33" if local_charts else "default")
    found = rendered_references(render(tmp_path, config, "1.33"))
    refs = {ref for where, ref in found if not where.endswith("values.yaml")}
    assert refs and (not local_charts or len(refs) > 15)
    unexplained = sorted(ref for ref in refs if "@sha256:" not in ref and images.unpinned_reason(ref) is None)
    assert unexplained == []
    assert not any(host in ref for ref in refs if "@" not in ref for host in ("pause",))


# --- doctor -------------------------------------------------------------------------------------------------------------
@pytest.fixture
def emulator_options() -> dict:
    return {"kube_version": "1.33.2", "gpu_nodes": ["gpu-1", "gpu-2"], "cpu_nodes": ["cpu-1"]}


def test_doctor_checks_the_mirror_when_one_is_set(cluster, oci_registry, tmp_path, helm_on_path):
    """doctor (emulated cluster, no SSH) runs the same check as `images --check` (whose present/missing answers are
    tested above): the cluster's version, the real charts, the real registry, here still empty."""
    mirror = f"{oci_registry.host}/mirror"
    config = tmp_path / "config.yaml"
    config.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}}}\nnodes:\n  - name: gpu-1\n  - name: gpu-2\n"
                      f"registry: {{mirror: '{mirror}'}}\n"
                      f"gpu_operator:\n  chart: {chart('gpu-operator-v26.7.0.tgz')}\n"
                      f"monitoring:\n  chart: {chart('kube-prometheus-stack-88.5.3.tgz')}\n")
    args = ["doctor", "-c", str(config), "--no-nodes", "-o", "json", "--log-file", str(tmp_path / "log")]
    result = runner.invoke(app, args)
    row = {c["id"]: c for c in json.loads(result.stdout)["checks"]}["registry"]
    assert result.exit_code == 1 and row["status"] == "fail"
    assert f"missing from {mirror}" in row["message"] and "images --check" in row["message"]
    assert re.match(r"(\d+) of \1 images missing", row["message"])  # an empty registry: every image is missing
    assert "/nvidia/driver:" in row["message"] or "more" in row["message"]
