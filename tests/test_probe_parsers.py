"""The node-output parsers the recorded scenarios never reached: a kubelet's --container-runtime-endpoint (CRI-O,
cri-dockerd, containerd), the line readers (files, dumps, processes, device nodes) and the pattern fallback for a
containerd config that is not valid TOML."""
from __future__ import annotations

import pytest

from gpu_bootstrap.probes import parse
from gpu_bootstrap.probes.parse import Runtime

pytestmark = pytest.mark.unit

KUBELET = "/usr/bin/kubelet --config=/var/lib/kubelet/config.yaml --container-runtime-endpoint={}"
CONTAINERD = "/etc/containerd/config.toml"
CONTAINERD_NVIDIA = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
"""


def detect(processes=(), present=None, configs=None, versions=None) -> Runtime:
    configs = configs or {}
    present = {path: "file" for path in configs} if present is None else present
    return parse.detect_runtime(list(processes), present, configs, versions or {})


@pytest.mark.parametrize("endpoint, runtime, socket", [
    ("unix:///var/run/crio/crio.sock", "cri-o", "/var/run/crio/crio.sock"),
    ("unix:///run/cri-dockerd.sock", "docker", "/run/cri-dockerd.sock"),
    ("unix:///run/containerd/containerd.sock", "containerd", "/run/containerd/containerd.sock"),
    ("/custom/containerd.sock", "containerd", "/custom/containerd.sock"),
])
def test_the_kubelets_runtime_endpoint_decides(endpoint, runtime, socket):
    # containerd's socket and config are present too: only the kubelet's flag tells CRI-O or cri-dockerd apart
    found = detect([KUBELET.format(endpoint)], configs={CONTAINERD: CONTAINERD_NVIDIA},
                   present={CONTAINERD: "file", "/run/containerd/containerd.sock": "socket"})
    assert (found.runtime, found.socket) == (runtime, socket)


def test_an_endpoint_flag_on_another_process_is_not_the_kubelets():
    found = detect(["/usr/bin/some-agent --container-runtime-endpoint=unix:///var/run/crio/crio.sock"],
                   configs={CONTAINERD: CONTAINERD_NVIDIA},
                   present={CONTAINERD: "file", "/run/containerd/containerd.sock": "socket"})
    assert (found.runtime, found.socket) == ("containerd", "/run/containerd/containerd.sock")


def test_a_kubelet_with_a_space_separated_endpoint():
    found = detect(["kubelet --container-runtime-endpoint unix:///run/crio/crio.sock"], present={})
    assert found == Runtime("cri-o", "standard", None, "/etc/crio/crio.conf", "/run/crio/crio.sock", "crio", {})


def test_crio_found_by_its_socket_alone_uses_the_socket_present():
    found = detect(present={"/run/crio/crio.sock": "socket"}, versions={"crio": "1.30.2"})
    assert found == Runtime("cri-o", "standard", "1.30.2", "/etc/crio/crio.conf", "/run/crio/crio.sock", "crio", {})


def test_a_crio_socket_on_a_k3s_node_does_not_make_it_cri_o():
    found = detect(["/usr/local/bin/k3s agent"], present={"/run/crio/crio.sock": "socket",
                                                         "/run/k3s/containerd/containerd.sock": "socket"})
    assert (found.runtime, found.distribution, found.socket) == ("containerd", "k3s",
                                                                "/run/k3s/containerd/containerd.sock")


def test_containerd_by_its_process_with_the_standard_socket_and_version():
    found = detect(["/usr/bin/containerd"], present={"/run/containerd/containerd.sock": "socket"},
                   configs={}, versions={"/usr/bin/containerd": "1.7.22", "/other": "9"})
    assert found == Runtime("containerd", "standard", "1.7.22", CONTAINERD, "/run/containerd/containerd.sock",
                            "process", {})


def test_containerd_by_files_finds_a_socket_elsewhere_and_any_version():
    found = detect(present={"/var/run/x/containerd.sock": "socket", CONTAINERD: "file"},
                   configs={CONTAINERD: CONTAINERD_NVIDIA}, versions={"/opt/bin/containerd": "2.0.0"})
    assert (found.runtime, found.version, found.socket, found.evidence) == (
        "containerd", "2.0.0", "/var/run/x/containerd.sock", "files")
    assert found.configs == {CONTAINERD: CONTAINERD_NVIDIA}


def test_no_runtime_says_why():
    assert detect(present={}) == Runtime(None, "standard", evidence="no runtime process, socket or config found")


@pytest.mark.parametrize("processes, present, distribution", [
    (["/usr/local/bin/k3s server"], {}, "k3s"),
    (["/opt/rke2/bin/rke2 agent"], {}, "rke2"),
    (["/snap/microk8s/1/bin/kubelite"], {}, "microk8s"),
    (["/usr/local/bin/k0s worker --token-file x"], {}, "k0s"),
    ([], {"/etc/k0s/containerd.toml": "file"}, "k0s"),
    ([], {"/var/snap/microk8s/current/args/containerd-template.toml": "file"}, "microk8s"),
    (["/usr/bin/k3s-helper server"], {CONTAINERD: "file"}, "standard"),
])
def test_the_distribution_from_processes_then_files(processes, present, distribution):
    assert detect(processes, present=present).distribution == distribution


def test_k0s_reads_its_drop_in_folder():
    configs = {"/etc/k0s/containerd.toml": "version = 2\n", "/etc/k0s/containerd.d/nvidia.toml": CONTAINERD_NVIDIA,
               "/etc/k0s/other.toml": "x = 1\n"}
    found = detect(["/usr/local/bin/k0s worker"], configs=configs)
    assert found.configs == {"/etc/k0s/containerd.toml": "version = 2\n",
                             "/etc/k0s/containerd.d/nvidia.toml": CONTAINERD_NVIDIA}
    assert parse.nvidia_runtime(found) == (True, True, "runtimes: nvidia")


def test_imports_of_a_config_that_is_not_toml_are_found_by_pattern():
    configs = {CONTAINERD: 'imports = ["/etc/containerd/conf.d/*.toml"]\n{{ template }}\n',
               "/etc/containerd/conf.d/nvidia.toml": CONTAINERD_NVIDIA}
    assert detect(configs=configs).configs == configs


def test_an_invalid_toml_config_falls_back_to_patterns():
    template = CONTAINERD_NVIDIA + "{{ if .x }}\n"
    found = detect(configs={CONTAINERD: template})
    configured, default, detail = parse.nvidia_runtime(found)
    assert (configured, default) == (True, True)
    assert detail.startswith(f"parsed by pattern ({CONTAINERD}: ")


def test_the_pattern_fallback_without_nvidia_as_default():
    template = CONTAINERD_NVIDIA.replace('default_runtime_name = "nvidia"', 'default_runtime_name = "runc"') + "{{\n"
    assert parse.nvidia_runtime(detect(configs={CONTAINERD: template}))[:2] == (True, False)


def test_an_invalid_config_beside_a_valid_one_that_has_nvidia_is_not_a_fallback():
    configs = {CONTAINERD: 'imports = ["/etc/containerd/conf.d/*.toml"]\n',
               "/etc/containerd/conf.d/a.toml": CONTAINERD_NVIDIA, "/etc/containerd/conf.d/b.toml": "{{ broken"}
    assert parse.nvidia_runtime(detect(configs=configs)) == (True, True, "runtimes: nvidia")


@pytest.mark.parametrize("runtimes, default, expected", [
    ('[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.gpu.options]\n  BinaryName = '
     '"/usr/bin/nvidia-container-runtime"\n', "gpu", (True, True, "runtimes: gpu")),
    ('[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]\n  runtime_type = "x"\n', "runc",
     (False, False, "no nvidia runtime")),
    ('[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia-cdi]\n  runtime_type = "x"\n', "runc",
     (True, False, "runtimes: nvidia-cdi")),
])
def test_containerd_2_runtimes_by_name_or_binary(runtimes, default, expected):
    text = f'version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd]\n  default_runtime_name = "{default}"\n' \
           + runtimes
    assert parse.nvidia_runtime(detect(configs={CONTAINERD: text})) == expected


def test_cri_o_runtimes_and_default():
    conf = '[crio.runtime]\ndefault_runtime = "crun"\n[crio.runtime.runtimes.crun]\nruntime_path = "/usr/bin/crun"\n' \
           '[crio.runtime.runtimes.gpu]\nruntime_path = "/usr/bin/nvidia-container-runtime"\n'
    found = detect(["/usr/bin/crio"], configs={"/etc/crio/crio.conf": conf, "/etc/other.conf": "x"})
    assert found.configs == {"/etc/crio/crio.conf": conf}
    assert parse.nvidia_runtime(found) == (True, False, "runtimes: gpu")


@pytest.mark.parametrize("daemon, expected", [
    ('{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}', (True, False, "runtimes: nvidia")),
    ('{"default-runtime": "gpu", "runtimes": {"gpu": {"path": "/usr/bin/nvidia-container-runtime"}}}',
     (True, True, "runtimes: gpu")),
    ('{"runtimes": {"runc": null}}', (False, False, "runtimes: none")),
    ("", (False, False, "runtimes: none")),
])
def test_docker_daemon_json(daemon, expected):
    found = detect(["/usr/bin/cri-dockerd"], configs={"/etc/docker/daemon.json": daemon})
    assert parse.nvidia_runtime(found) == expected


def test_files_reads_kind_and_path_and_skips_anything_else():
    text = "file /etc/containerd/config.toml\nsocket /run/containerd/containerd.sock\nfile\nother /x\n" \
           "file /path with spaces\n"
    assert parse.files(text) == {"/etc/containerd/config.toml": "file", "/run/containerd/containerd.sock": "socket",
                                 "/path with spaces": "file"}


def test_dumped_files_split_on_the_marker_and_keep_inner_lines():
    text = "noise before\nM file /a\nline 1\n\nline 3\n\nM file /b\nM other\nM file /empty\n"
    assert parse.dumped_files(text, "M") == {"/a": "line 1\n\nline 3", "/b": "M other", "/empty": ""}
    assert parse.dumped_files("no files here\n", "M") == {}


def test_processes_from_grep_output():
    text = "/proc/1/cmdline:/sbin/init splash\n/proc/22/cmdline:\nplain command line\n\n"
    assert parse.processes(text) == ["/sbin/init splash", "plain command line"]


@pytest.mark.parametrize("text, count", [
    ("nvidia0 nvidia1 nvidiactl nvidia-uvm nvidia10", 3), ("", 0), ("nvidia nvidia0x", 0),
])
def test_nvidia_device_count(text, count):
    assert parse.nvidia_device_count(text) == count


@pytest.mark.parametrize("text, expected", [
    ("containerd github.com/containerd/containerd v1.7.22 7f7fdf5\n", None),
    ("crio version 1.30.2\n", "1.30.2"),
    ("Version:        1.29.1\nGitCommit: abc\n", "1.29.1"),
    ("", None),
])
def test_crio_version_both_forms(text, expected):
    assert parse.crio_version(text) == expected


def test_binary_versions_skips_lines_without_a_path_or_a_version():
    text = ("/usr/bin/containerd: containerd github.com/containerd/containerd v1.7.22 7f7fdf5\n"
            "/usr/bin/runc: runc version 1.1.12\nrelative: 1.0\n/usr/bin/none: no version here\n")
    assert parse.binary_versions(text) == {"/usr/bin/containerd": "1.7.22", "/usr/bin/runc": "1.1.12"}


@pytest.mark.parametrize("text, expected", [
    ('NAME="Ubuntu"\nVERSION_ID=\'22.04\'\nlower=x\n# comment\nID=ubuntu\n',
     {"NAME": "Ubuntu", "VERSION_ID": "22.04", "ID": "ubuntu"}),
    ("", {}),
])
def test_os_release(text, expected):
    assert parse.os_release(text) == expected


def test_gpu_query_values_that_are_not_numbers_become_none():
    row = "0, NVIDIA A100, GPU-1, [N/A], N/A, 550.54.15\n"
    assert parse.gpus_from_query(row) == [{"index": 0, "name": "NVIDIA A100", "uuid": "GPU-1", "memory_mib": None,
                                           "compute_capability": None, "driver_version": "550.54.15"}]


@pytest.mark.parametrize("text, expected", [
    ("Driver Version : 550.54.15\nCUDA Version : 12.4\n", {"driver_version": "550.54.15", "cuda_version": "12.4"}),
    ("CUDA Version : Not Found\n", {}), ("Driver Version 550\n", {}),
])
def test_nvidia_smi_header_values(text, expected):
    assert parse.nvsmi_header(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("v1.2.3 and more", "1.2.3"), ("version 2.0", "2.0"), ("none", None), (None, None),
    ("1.17.4-rc.1 x", "1.17.4-rc.1"),
])
def test_first_version(text, expected):
    assert parse.first_version(text) == expected


def test_loaded_modules():
    assert parse.loaded_modules("nvidia 1 0\n\nnouveau 2 1\n  \n") == {"nvidia", "nouveau"}


def test_gpu_query_rows_with_too_few_or_extra_fields():
    text = "0, NVIDIA A100\n1, NVIDIA A100, GPU-1, 40960, 8.0, 550.54.15, extra\n"
    assert parse.gpus_from_query(text) == [{"index": 1, "name": "NVIDIA A100", "uuid": "GPU-1", "memory_mib": 40960,
                                            "compute_capability": "8.0", "driver_version": "550.54.15"}]


def test_a_runtime_entry_that_is_not_a_table_is_not_nvidia():
    text = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "odd"\n' \
           '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes]\n  odd = "a string"\n'
    assert parse.nvidia_runtime(detect(configs={CONTAINERD: text})) == (False, False, "no nvidia runtime")


def test_only_a_socket_counts_as_a_containerd_socket():
    found = detect(present={"/var/run/x/containerd.sock": "file", CONTAINERD: "file"}, configs={CONTAINERD: ""})
    assert found.socket == "/run/containerd/containerd.sock"  # the standard default, not the plain file


@pytest.mark.parametrize("processes, present, runtime, socket", [
    (["/usr/bin/crio"], {}, "cri-o", "/var/run/crio/crio.sock"),
    (["/usr/bin/cri-dockerd"], {}, "docker", "/var/run/cri-dockerd.sock"),
    (["/usr/bin/cri-dockerd"], {"/run/cri-dockerd.sock": "socket"}, "docker", "/run/cri-dockerd.sock"),
])
def test_the_default_socket_of_cri_o_and_cri_dockerd(processes, present, runtime, socket):
    found = detect(processes, present=present)
    assert (found.runtime, found.socket) == (runtime, socket)
