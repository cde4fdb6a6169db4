"""Table tests of the preflight parsers and checks on recorded tool outputs (tests/nodes/recorded.py)."""
from __future__ import annotations

import pytest

from gpu_bootstrap.probes import parse, script
from gpu_bootstrap.probes.checks import evaluate
from gpu_bootstrap.probes.script import Section
from tests.nodes import recorded as rec

pytestmark = pytest.mark.unit  # host-free: the fast loop (pytest -m unit)


@pytest.mark.parametrize("text, expected", [
    (rec.PROC_VERSION_550, {"driver_version": "550.54.15", "open_kernel_module": False}),
    (rec.PROC_VERSION_OPEN_565, {"driver_version": "565.57.01", "open_kernel_module": True}),
    (rec.PROC_VERSION_JETSON, {"driver_version": "35.3.1", "open_kernel_module": True}),
    ("", None),
    ("cat: can't open '/proc/driver/nvidia/version': No such file or directory", None),
])
def test_proc_driver_version(text, expected):
    assert parse.proc_driver_version(text) == expected


def test_gpu_query_parses_rows_and_skips_headers_and_noise():
    gpus = parse.gpus_from_query(rec.gpu_query(rec.H100, 2, "550.54.15"))
    assert gpus[1] == {"index": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": gpus[1]["uuid"], "memory_mib": 81559,
                       "compute_capability": "9.0", "driver_version": "550.54.15"}
    assert parse.gpus_from_query(rec.NVSMI_QUERY_WITH_HEADER) == []  # a header or another field order is no GPU
    assert parse.gpus_from_query(rec.NVSMI_NO_DRIVER) == []
    odd = parse.gpus_from_query("0, Tesla T4, GPU-1, [N/A], [N/A], 535.183.01\n")
    assert odd[0]["memory_mib"] is None and odd[0]["compute_capability"] is None


@pytest.mark.parametrize("text, expected", [
    (rec.NVSMI_Q_TEMPLATE.format(driver="550.54.15", cuda="12.4", count=8),
     {"driver_version": "550.54.15", "cuda_version": "12.4"}),
    (rec.NVSMI_Q_NO_CUDA, {"driver_version": "580.105.06"}),
])
def test_nvidia_smi_q_header(text, expected):
    assert parse.nvsmi_header(text) == expected


@pytest.mark.parametrize("text, expected", [
    (rec.NVIDIA_CTK_VERSION, "1.17.4"), (rec.NVIDIA_CONTAINER_RUNTIME_VERSION, "1.17.4"),
    ("NVIDIA Container Toolkit CLI version 1.12.0\ncommit: 62bd015475656ef795cb0d59cc4030a6bd4a9526\n", "1.12.0"),
    ("command not found: nvidia-ctk", None),
])
def test_toolkit_version(text, expected):
    assert parse.toolkit_version(text) == expected


@pytest.mark.parametrize("text, expected", [
    (rec.CRIO_VERSION, "1.30.4"),
    ("crio version 1.19.2\nVersion:       1.19.2\nGitCommit:     ad3dd83b\n", "1.19.2"),
])
def test_crio_version(text, expected):
    assert parse.crio_version(text) == expected


def test_containerd_binary_versions():
    text = ("/usr/bin/containerd: " + rec.CONTAINERD_VERSION +
            "/var/lib/rancher/k3s/data/current/bin/containerd: " + rec.CONTAINERD_K3S_VERSION)
    assert parse.binary_versions(text) == {"/usr/bin/containerd": "1.7.27",
                                           "/var/lib/rancher/k3s/data/current/bin/containerd": "1.7.23-k3s2"}


def test_modules_and_os_release():
    assert "nouveau" in parse.loaded_modules(rec.MODULES_NOUVEAU)
    assert "nvidia" in parse.loaded_modules(rec.MODULES_NVIDIA) and "nouveau" not in parse.loaded_modules(
        rec.MODULES_NVIDIA)
    release = parse.os_release(rec.OS_RELEASE_RHEL_94)
    assert (release["ID"], release["VERSION_ID"], release["PRETTY_NAME"]) == ("rhel", "9.4",
                                                                              "Red Hat Enterprise Linux 9.4 (Plow)")


def runtime(configs: dict, processes=(), present=None, versions=None) -> parse.Runtime:
    files = {path: "file" for path in configs} if present is None else present
    return parse.detect_runtime(list(processes), files, configs, versions or {})


@pytest.mark.parametrize("name, configs, processes, expected", [
    ("containerd, nvidia default", {"/etc/containerd/config.toml": rec.CONTAINERD_CONFIG_NVIDIA_DEFAULT}, [],
     ("containerd", "standard", "/etc/containerd/config.toml", True, True)),
    ("containerd, plain", {"/etc/containerd/config.toml": rec.CONTAINERD_CONFIG_PLAIN}, [],
     ("containerd", "standard", "/etc/containerd/config.toml", False, False)),
    ("containerd 2 with the toolkit's drop-in",
     {"/etc/containerd/config.toml": rec.CONTAINERD_V3_WITH_IMPORTS,
      "/etc/containerd/conf.d/99-nvidia.toml": rec.CONTAINERD_V3_NVIDIA_DROP_IN}, [],
     ("containerd", "standard", "/etc/containerd/config.toml", True, True)),
    ("a drop-in that is not imported does not count",
     {"/etc/containerd/config.toml": rec.CONTAINERD_CONFIG_PLAIN,
      "/etc/containerd/conf.d/99-nvidia.toml": rec.CONTAINERD_V3_NVIDIA_DROP_IN}, [],
     ("containerd", "standard", "/etc/containerd/config.toml", False, False)),
    ("k3s by process", {"/var/lib/rancher/k3s/agent/etc/containerd/config.toml": rec.K3S_CONFIG_WITH_NVIDIA},
     ["/usr/local/bin/k3s agent"], ("containerd", "k3s", "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
                                    True, False)),
    ("rke2 by files only", {"/var/lib/rancher/rke2/agent/etc/containerd/config.toml": rec.CONTAINERD_CONFIG_PLAIN},
     [], ("containerd", "rke2", "/var/lib/rancher/rke2/agent/etc/containerd/config.toml", False, False)),
    ("microk8s template", {"/var/snap/microk8s/current/args/containerd-template.toml":
                           rec.MICROK8S_TEMPLATE_WITH_NVIDIA},
     ["/snap/microk8s/6750/bin/containerd --config /var/snap/microk8s/6750/args/containerd.toml"],
     ("containerd", "microk8s", "/var/snap/microk8s/current/args/containerd-template.toml", True, True)),
    ("containerd --config flag wins", {"/opt/containerd.toml": rec.CONTAINERD_CONFIG_NVIDIA_DEFAULT},
     ["/usr/bin/containerd --config /opt/containerd.toml"],
     ("containerd", "standard", "/opt/containerd.toml", True, True)),
    ("cri-o with drop-in", {"/etc/crio/crio.conf": rec.CRIO_CONF,
                            "/etc/crio/crio.conf.d/99-nvidia.toml": rec.CRIO_NVIDIA_DROP_IN},
     ["/usr/bin/crio"], ("cri-o", "standard", "/etc/crio/crio.conf", True, True)),
    ("docker nvidia-docker2 recipe", {"/etc/docker/daemon.json": rec.DOCKER_DAEMON_NVIDIA_DEFAULT},
     ["/usr/bin/cri-dockerd --container-runtime-endpoint fd://"],
     ("docker", "standard", "/etc/docker/daemon.json", True, True)),
])
def test_runtime_detection_and_nvidia_runtime(name, configs, processes, expected):
    found = runtime(configs, processes)
    configured, default, _detail = parse.nvidia_runtime(found)
    assert (found.runtime, found.distribution, found.config_path, configured, default) == expected


def test_no_runtime_at_all():
    assert runtime({}, [], present={}).runtime is None


def test_broken_daemon_json_is_reported_not_raised():
    found = runtime({"/etc/docker/daemon.json": "{not json"}, ["cri-dockerd"])
    configured, default, detail = parse.nvidia_runtime(found)
    assert (configured, default) == (False, False) and "not valid JSON" in detail


# --- the script's framing ----------------------------------------------------------------------------------------
def test_split_ignores_forged_markers_and_keeps_truncated_sections():
    marker = script.new_marker()
    forged = "@@gpu-bootstrap-0000000000000000@@ end nvidia-smi-query 0\n"
    output = (f"\n{marker} begin nvidia-smi-query\n0, {forged}x\n{marker} end nvidia-smi-query 0\n"
              f"\n{marker} begin modules\nnvidia 1 0 - Live\n")
    sections = script.split(output, marker)
    assert sections["nvidia-smi-query"].rc == 0 and forged in sections["nvidia-smi-query"].output
    assert sections["modules"].rc is None


def test_the_script_is_constant_but_for_the_marker_and_timeout():
    first, second = script.build(script.new_marker()), script.build(script.new_marker())
    strip = lambda text: "\n".join(text.splitlines()[1:])  # noqa: E731
    assert strip(first) == strip(second)
    with pytest.raises(ValueError):
        script.build("'; reboot; '")


def sections(**outputs) -> dict:
    return {name.replace("_", "-"): Section(name.replace("_", "-"), text, rc) for name, (text, rc) in outputs.items()}


def test_evaluate_a_hung_nvidia_smi():
    report = evaluate("n", sections(os_release=(rec.OS_RELEASE_UBUNTU_2204, 0), processes=("", 0),
                                    nvidia_smi_query=("", 137), modules=(rec.MODULES_NVIDIA, 0)), "m", timeout=15)
    check = report.check("nvidia-driver")
    assert check.status == "fail" and "did not answer within 15s" in check.message


def test_evaluate_a_script_cut_short_fails_ssh():
    report = evaluate("n", sections(os_release=(rec.OS_RELEASE_UBUNTU_2204, 0)), "m")
    assert report.check("ssh").status == "fail"
