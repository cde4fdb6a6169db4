"""The supply-chain catalogue (core/data/images.yaml), image references, registry.mirror's rewriting and the image
list's rules (operands, driver tags per node OS) — host-free."""
from __future__ import annotations

import base64
import json
import re

import pytest

from gpu_bootstrap.app import images as image_list
from gpu_bootstrap.core import catalogue as images
from gpu_bootstrap.adapters import registry
from gpu_bootstrap.core.config import RegistryConfig, validate
from gpu_bootstrap.core.config import Source
from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.probes.report import NodeReport

pytestmark = pytest.mark.unit
MIRROR = "reg.local:5000/mirror"


def config(**sections):
    return validate({"nodes": [{"name": "n1"}], **sections}, Source(None, {}))


@pytest.mark.parametrize("ref, mirrored", [
    ("busybox:1.37.0", "reg.local:5000/mirror/busybox:1.37.0"),
    ("openpolicyagent/opa:1.16.2", "reg.local:5000/mirror/openpolicyagent/opa:1.16.2"),
    ("registry.k8s.io/kube-scheduler:v1.33.1", "reg.local:5000/mirror/kube-scheduler:v1.33.1"),
    ("docker.io/grafana/grafana:13.2.0", "reg.local:5000/mirror/grafana/grafana:13.2.0"),
    ("localhost:5000/a/b@sha256:" + "a" * 64, "reg.local:5000/mirror/a/b@sha256:" + "a" * 64),
    ("nvcr.io/nvidia/k8s", "reg.local:5000/mirror/nvidia/k8s"),  # a chart value holding a repository
    ("reg.local:5000/mirror/x/y:1", "reg.local:5000/mirror/x/y:1"),  # already there
])
def test_relocate_keeps_the_repository_path(ref, mirrored):
    assert images.relocate(ref, MIRROR) == mirrored
    assert images.relocate(ref, None) == ref


def test_the_same_repository_on_docker_hub_in_every_spelling():
    spellings = ["busybox", "library/busybox", "docker.io/library/busybox", "docker.io/busybox"]
    assert {images.parse(s).canonical_repository() for s in spellings} == {"docker.io/library/busybox"}


@pytest.mark.parametrize("text", ["Bad Image", "x:", "a/b@sha256:123", "UPPER/case:1"])
def test_parse_refuses_what_is_not_a_reference(text):
    with pytest.raises(ValueError):
        images.parse(text)


def test_every_default_image_is_pinned_by_digest_or_says_why():
    """The catalogue's rule: a digest (with where it was read), or the tag kept and the reason."""
    for name, entry in images.catalogue()["images"].items():
        digests = [entry.get("digest")] + [t["digest"] for t in (entry.get("tags") or {}).values()]
        for digest in filter(None, digests):
            assert images.DIGEST.fullmatch(digest), (name, digest)
        if entry.get("digest"):
            assert entry.get("source"), name
        else:
            assert entry.get("why"), f"{name} has no digest and does not say why"
        for tag in (entry.get("tags") or {}).values():
            assert tag.get("source"), name
    assert images.default("pause") == "registry.k8s.io/pause:3.10@sha256:" \
                                      "ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a"


def test_the_config_defaults_come_from_the_catalogue():
    loaded = config()
    assert loaded.admission.opa.image == images.default("opa")
    assert loaded.validation.image == images.default("cuda-sample")
    assert loaded.registry == RegistryConfig()


def test_pin_adds_the_catalogued_digest_only_for_a_known_tag():
    digest = images.catalogue()["images"]["kube-scheduler"]["tags"]["v1.33.1"]["digest"]
    assert images.pin("registry.k8s.io/kube-scheduler:v1.33.1") == f"registry.k8s.io/kube-scheduler:v1.33.1@{digest}"
    assert images.pin("registry.k8s.io/kube-scheduler:v1.33.0") == "registry.k8s.io/kube-scheduler:v1.33.0"
    assert images.pin("mirror.example/kube-scheduler:v1.33.1") == "mirror.example/kube-scheduler:v1.33.1"
    assert images.unpinned_reason("registry.k8s.io/kube-scheduler:v1.33.0")  # the catalogue says why
    assert images.unpinned_reason("example.com/unknown:1") is None


def test_every_chart_the_version_tables_can_pick_locally_has_a_sha256_format():
    for chart, entry in images.catalogue()["charts"].items():
        for version, sha in entry["versions"].items():
            assert re.fullmatch(r"[0-9a-f]{64}", sha), (chart, version)
    assert images.chart_sha256("gpu-operator", "26.7.0") == images.chart_sha256("gpu-operator", "v26.7.0")
    assert images.chart_sha256("gpu-operator", "v1.0.0") is None


@pytest.mark.parametrize("mirror, message", [
    ("https://registry.example.com", "without a scheme"), ("registry example.com", "has spaces"),
    ("registry.example.com:99999", "HOST[:PORT][/PREFIX]"), ("registry.example.com/Upper", "HOST[:PORT][/PREFIX]")])
def test_a_bad_mirror_is_bad_input_naming_the_field(mirror, message):
    with pytest.raises(ConfigError) as error:
        config(registry={"mirror": mirror})
    assert error.value.exit_code == 2
    assert "registry.mirror" in error.value.one_line() and message in error.value.one_line()


def test_locate_pods_moves_every_container_and_adds_the_pull_secret():
    pod = {"kind": "Deployment", "spec": {"template": {"spec": {
        "initContainers": [{"name": "i", "image": "busybox:1.37.0"}],
        "containers": [{"name": "c", "image": "quay.io/x/y:1"}]}}}}
    settings = RegistryConfig(mirror=MIRROR, pull_secret="regcred")
    [moved] = images.locate_pods([pod], settings)
    spec = moved["spec"]["template"]["spec"]
    assert spec["initContainers"][0]["image"] == f"{MIRROR}/busybox:1.37.0@{images.digest_of('busybox:1.37.0')}"
    assert spec["containers"][0]["image"] == f"{MIRROR}/x/y:1"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["template"]["spec"]["containers"][0]["image"] == "quay.io/x/y:1"  # a copy: input untouched


def test_chart_values_for_the_mirror():
    settings = RegistryConfig(mirror=MIRROR, pull_secret="regcred")
    values = {path: value for path, value, _why in images.gpu_operator_values(settings)}
    assert values["driver.repository"] == f"{MIRROR}/nvidia"
    assert values["toolkit.repository"] == f"{MIRROR}/nvidia/k8s"
    assert values["node-feature-discovery.image.repository"] == f"{MIRROR}/nfd/node-feature-discovery"
    assert values["driver.imagePullSecrets"] == ["regcred"]
    stack = {path: value for path, value, _why in images.stack_values(settings)}
    assert stack == {"global.imageRegistry": MIRROR, "global.imagePullSecrets": [{"name": "regcred"}]}
    assert images.gpu_operator_values(RegistryConfig()) == [] and images.stack_values(None) == []


# --- the image list -----------------------------------------------------------------------------------------------------
def report(name: str, os_id: str | None, os_version: str = "", driver: str | None = None,
           reachable: bool = True) -> NodeReport:
    ssh = {"id": "ssh", "status": "pass" if reachable else "fail", "message": "ok" if reachable else "timed out",
           "data": {"os_id": os_id, "os_version": os_version} if os_id else {}}
    return NodeReport.from_json({"name": name, "checks": [
        ssh, {"id": "nvidia-driver", "status": "pass", "message": "", "data": {"driver_version": driver}}]})


POLICY = {"kind": "ClusterPolicy", "spec": {
    "driver": {"enabled": True, "repository": "nvcr.io/nvidia", "image": "driver", "version": "595.91.07",
               "manager": {"repository": "nvcr.io/nvidia/cloud-native", "image": "k8s-driver-manager",
                           "version": "v0.12.0"}},
    "toolkit": {"enabled": True, "repository": "nvcr.io/nvidia/k8s", "image": "container-toolkit",
                "version": "v1.20.0"},
    "dcgm": {"enabled": False, "repository": "nvcr.io/nvidia/cloud-native", "image": "dcgm", "version": "4"},
    "devicePlugin": {"repository": "nvcr.io/nvidia", "image": "k8s-device-plugin",
                     "version": "sha256:" + "b" * 64},
    "sandboxWorkloads": {"enabled": False},
    "sandboxDevicePlugin": {"enabled": True, "repository": "nvcr.io/nvidia", "image": "kubevirt-gpu-device-plugin",
                            "version": "v1.6.0"}}}


def listed(reports: dict, mirror: str | None = None, management: str = "auto") -> image_list.ImageList:
    return image_list.collect({"gpu-operator": [("manifests.yaml", POLICY)]}, reports, bool(reports), management,
                              mirror, {})


def test_driver_tags_follow_the_os_of_each_gpu_node():
    found = listed({"a": report("a", "ubuntu", "22.04"), "b": report("b", "rhel", "9.4"),
                    "c": report("c", "ubuntu", "22.04")})
    drivers = sorted(ref for ref in found.images if "/driver:" in ref)
    assert drivers == ["nvcr.io/nvidia/driver:595.91.07-rhel9.4", "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04"]
    assert not found.notes


def test_unknown_os_lists_the_known_variants_and_says_why():
    found = listed({"a": report("a", "ubuntu", "22.04"), "b": report("b", None, reachable=False)})
    drivers = {ref for ref in found.images if "/driver:" in ref}
    variants = images.catalogue()["driver_os_variants"]
    assert drivers == {f"nvcr.io/nvidia/driver:595.91.07-{v}" for v in variants}
    assert "b: timed out" in found.notes[0] and ", ".join(variants) in found.notes[0]
    assert "no node facts" in listed({}).notes[0]


def test_nodes_with_a_host_driver_pull_no_driver_image_unless_the_operator_manages_every_node():
    reports = {"a": report("a", "ubuntu", "22.04", driver="550.54.15"), "b": report("b", "rhel", "9.4")}
    assert sorted(r for r in listed(reports, management="per-node").images if "/driver:" in r) == \
        ["nvcr.io/nvidia/driver:595.91.07-rhel9.4"]
    assert len([r for r in listed(reports, management="operator").images if "/driver:" in r]) == 2


def test_operands_follow_enabled_sandbox_and_digest_versions():
    found = listed({"a": report("a", "ubuntu", "24.04")}, mirror=MIRROR)
    assert sorted(found.images) == sorted([
        f"{MIRROR}/nvidia/driver:595.91.07-ubuntu24.04", f"{MIRROR}/nvidia/cloud-native/k8s-driver-manager:v0.12.0",
        f"{MIRROR}/nvidia/k8s/container-toolkit:v1.20.0", f"{MIRROR}/nvidia/k8s-device-plugin@sha256:" + "b" * 64])
    toolkit = found.images[f"{MIRROR}/nvidia/k8s/container-toolkit:v1.20.0"]
    assert toolkit.source == "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0"
    assert toolkit.pulled_by == {"gpu-operator operand (toolkit)"}
    assert found.per_component() == {"gpu-operator operand": 4}


def test_container_images_include_init_containers_and_the_config_reloader():
    deployment = {"kind": "Deployment", "metadata": {"name": "op"}, "spec": {"template": {"spec": {
        "initContainers": [{"name": "i", "image": "a.io/init:1"}],
        "containers": [{"name": "c", "image": "a.io/op:1", "args": ["--prometheus-config-reloader=a.io/rl:2",
                                                                     "--log-level=info"]}]}}}}
    assert sorted(image_list.container_images(deployment)) == ["a.io/init:1", "a.io/op:1"]
    assert image_list.argument_images(deployment) == [("a.io/rl:2", "")]
    prometheus = {"apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus", "spec": {"image": "a.io/p:3"}}
    assert image_list.custom_resource_images(prometheus) == ["a.io/p:3"]


# --- registry credentials -------------------------------------------------------------------------------------------
def test_credentials_come_from_the_docker_config_file(tmp_path):
    folder = tmp_path / "docker"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"auths": {
        "reg.local:5000": {"auth": base64.b64encode(b"alice:s3cret").decode()},
        "https://index.docker.io/v1/": {"username": "bob", "password": "pw"}}}))
    environ = {"DOCKER_CONFIG": str(folder)}
    assert registry.credentials("reg.local:5000", environ) == ("alice", "s3cret")
    assert registry.credentials("docker.io", environ) == ("bob", "pw")
    assert registry.credentials("other:1", environ) is None
    assert registry.credentials("reg.local:5000", {"DOCKER_CONFIG": str(tmp_path / "none")}) is None


def test_a_broken_docker_config_is_named_without_its_content(tmp_path):
    (tmp_path / "config.json").write_text('{"auths": {"reg": {"auth": "s3cret-not-json')
    with pytest.raises(ConfigError) as error:
        registry.credentials("reg", {"DOCKER_CONFIG": str(tmp_path)})
    assert str(tmp_path / "config.json") in error.value.one_line() and "s3cret" not in error.value.one_line()


@pytest.mark.parametrize("host, loopback", [("127.0.0.1:5000", True), ("localhost", True), ("[::1]:5000", True),
                                            ("reg.local:5000", False), ("10.0.0.1", False)])
def test_loopback_registries_speak_plain_http(host, loopback):
    assert registry.is_loopback(host) is loopback
