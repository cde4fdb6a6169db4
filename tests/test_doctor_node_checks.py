"""The doctor's node checks from a node's sections, as tables: one healthy containerd node, and each check's other
outcomes by changing the few sections that decide it (exact status, message and data), on containerd, CRI-O,
docker and k3s; the report's JSON round trip, an unreachable node and a node launched from a Karpenter pool."""
from __future__ import annotations

import pytest

from gpu_bootstrap.probes.checks import NodeCheck, NodeReport, evaluate, from_pool, unreachable
from gpu_bootstrap.probes.script import Section
from tests.nodes import recorded as rec

pytestmark = pytest.mark.unit

MARK = "@@gpu-bootstrap-0123456789abcdef@@"
NOT_FOUND = ("command not found: the tool", 127)
QUERY = ("0, NVIDIA H100 80GB HBM3, GPU-a, 81559, 9.0, 550.54.15\n"
         "1, NVIDIA A100-SXM4-40GB, GPU-b, 40960, 8.0, 550.54.15\n"
         "2, NVIDIA H100 80GB HBM3, GPU-c, 81559, 9.0, 550.54.15\n")
KUBELET = "/usr/bin/kubelet --container-runtime-endpoint=unix://"
HEALTHY = {
    "os-release": (rec.OS_RELEASE_UBUNTU_2204, 0), "kernel": ("5.15.0-125-generic\n", 0), "arch": ("x86_64\n", 0),
    "id": ("0\n", 0), "nvidia-smi-query": (QUERY, 0),
    "nvidia-smi-q": (rec.NVSMI_Q_TEMPLATE.format(driver="550.54.15", cuda="12.4", count=3), 0),
    "proc-driver-version": (rec.PROC_VERSION_550, 0), "dev-nvidia": ("nvidia0 nvidia1 nvidia2 nvidiactl\n", 0),
    "modules": (rec.MODULES_NVIDIA, 0),
    "processes": ("/proc/1/cmdline:/usr/bin/containerd\n"
                  f"/proc/2/cmdline:{KUBELET}/run/containerd/containerd.sock\n", 0),
    "runtime-files": ("file /etc/containerd/config.toml\nsocket /run/containerd/containerd.sock\n", 0),
    "runtime-configs": (f"{MARK} file /etc/containerd/config.toml\n{rec.CONTAINERD_CONFIG_NVIDIA_DEFAULT}\n", 0),
    "containerd-version": ("/usr/bin/containerd: " + rec.CONTAINERD_VERSION, 0),
    "nvidia-ctk-version": (rec.NVIDIA_CTK_VERSION, 0),
    "nvidia-container-runtime-version": (rec.NVIDIA_CONTAINER_RUNTIME_VERSION, 0),
    "crio-version": NOT_FOUND, "docker-version": NOT_FOUND,
    "toolkit-config": ("file /etc/nvidia-container-runtime/config.toml\n"
                       "2:accept-nvidia-visible-devices-envvar-when-unprivileged = false\n", 0),
}
ENVVAR = {"file": "/etc/nvidia-container-runtime/config.toml",
          "key": "accept-nvidia-visible-devices-envvar-when-unprivileged", "honoured": False}


def check(check_id: str, **changed) -> NodeCheck:
    """The check of a node whose sections are HEALTHY's with `changed` (None: the section never ran)."""
    outputs = dict(HEALTHY)
    for key, value in changed.items():
        outputs[key.replace("_", "-")] = value
    sections = {name: Section(name, *value) for name, value in outputs.items() if value is not None}
    return evaluate("node5", sections, MARK, timeout=15).check(check_id)


def outcome(found: NodeCheck) -> tuple:
    return found.status, found.message


# --- ssh -------------------------------------------------------------------------------------------------------------
def test_ssh_reports_the_system_and_fails_when_the_script_stopped_early():
    facts = {"os": "Ubuntu 22.04.5 LTS", "os_id": "ubuntu", "os_version": "22.04", "kernel": "5.15.0-125-generic",
             "arch": "x86_64", "uid": "0"}
    found = check("ssh")
    assert (found.status, found.message, found.data) == ("pass", "Ubuntu 22.04.5 LTS, kernel 5.15.0-125-generic "
                                                                 "(x86_64)", facts)
    cut = check("ssh", processes=None)
    assert (cut.status, cut.message, cut.data) == (
        "fail", "the probe script stopped early (connection lost or timed out); rerun doctor", facts)


# --- nvidia-driver ----------------------------------------------------------------------------------------------------
def test_a_healthy_driver_lists_the_gpus_by_model_with_their_facts():
    found = check("nvidia-driver")
    assert outcome(found) == ("pass",
                              "driver 550.54.15, CUDA 12.4: 2× NVIDIA H100 80GB HBM3, 1× NVIDIA A100-SXM4-40GB")
    h100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "compute_capability": "9.0"}
    assert found.data == {
        "driver_version": "550.54.15", "cuda_version": "12.4",
        "gpus": [{"index": 0, "uuid": "GPU-a", **h100},
                 {"index": 1, "name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-b", "memory_mib": 40960,
                  "compute_capability": "8.0"},
                 {"index": 2, "uuid": "GPU-c", **h100}],
        "source": "nvidia-smi", "open_kernel_module": False, "device_nodes": 3}


MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"


@pytest.mark.parametrize("changed, status, message, driver, source", [
    ({"nvidia_smi_q": None, "nvidia_smi_query": ("0, Tesla T4, GPU-a, 15360, 7.5, 535.183.01\n", 0)},
     "pass", "driver 535.183.01: 1× Tesla T4", "535.183.01", "nvidia-smi"),
    ({"nvidia_smi_query": ("", 0), "proc_driver_version": None},
     "fail", "driver 550.54.15 is loaded but nvidia-smi sees no GPU: check the PCI devices (lspci | grep -i nvidia) "
             "and `dmesg`", "550.54.15", None),
    ({"nvidia_smi_query": (f"{MISMATCH}\nsecond line\n", 18), "nvidia_smi_q": None},
     "fail", f"driver 550.54.15 is loaded but nvidia-smi fails ({MISMATCH}): the user-space driver does not match the "
             f"kernel module; reinstall the same driver version", "550.54.15", "proc"),
    ({"nvidia_smi_query": ("x" * 170 + "\n", 18), "nvidia_smi_q": None},
     "fail", f"driver 550.54.15 is loaded but nvidia-smi fails ({'x' * 160}): the user-space driver does not match the "
             f"kernel module; reinstall the same driver version", "550.54.15", "proc"),
    ({"nvidia_smi_query": ("\n", 18), "nvidia_smi_q": None},
     "fail", "driver 550.54.15 is loaded but nvidia-smi fails (no output): the user-space driver does not match the "
             "kernel module; reinstall the same driver version", "550.54.15", "proc"),
    ({"nvidia_smi_query": (rec.NVSMI_NO_DRIVER, rec.NVSMI_NO_DRIVER_RC), "nvidia_smi_q": None,
      "proc_driver_version": None},
     "fail", f"nvidia-smi is installed but the NVIDIA kernel module is not loaded ({rec.NVSMI_NO_DRIVER.strip()}): "
             f"run `sudo modprobe nvidia` or reboot, and check `dmesg`", None, None),
    ({"nvidia_smi_query": NOT_FOUND, "nvidia_smi_q": NOT_FOUND},
     "warn", "driver 550.54.15 is loaded but nvidia-smi is missing: install the NVIDIA utilities matching the driver "
             "(e.g. nvidia-utils-550-server)", "550.54.15", "proc"),
    ({"nvidia_smi_query": NOT_FOUND, "nvidia_smi_q": NOT_FOUND, "proc_driver_version": None},
     "warn", "no NVIDIA driver on this node: the gpu-operator will install it (driver.enabled=true)", None, None),
    ({"nvidia_smi_query": None, "nvidia_smi_q": None, "proc_driver_version": None},
     "warn", "no NVIDIA driver on this node: the gpu-operator will install it (driver.enabled=true)", None, None),
    ({"nvidia_smi_query": ("", 137)},
     "fail", "nvidia-smi did not answer within 15s: the GPU or driver is hung; look for Xid errors in `dmesg` and "
             "reset the GPU or reboot", "550.54.15", "proc"),
])
def test_every_driver_outcome(changed, status, message, driver, source):
    found = check("nvidia-driver", **changed)
    assert (found.status, found.message, found.data["driver_version"], found.data["source"]) == (
        status, message, driver, source)


# --- nouveau ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("modules, status, message, loaded", [
    ((rec.MODULES_NVIDIA, 0), "pass", "not loaded", False),
    ((rec.MODULES_NOUVEAU, 0), "fail", "the open-source nouveau driver is loaded and blocks the NVIDIA driver; "
                                       "blacklist it: echo 'blacklist nouveau' | sudo tee "
                                       "/etc/modprobe.d/blacklist-nouveau.conf; sudo update-initramfs -u (dracut -f "
                                       "on RHEL); then reboot", True),
    (("cat: /proc/modules: Permission denied", 1), "warn", "could not read /proc/modules; check by hand: lsmod | "
                                                           "grep nouveau", None),
    (None, "warn", "could not read /proc/modules; check by hand: lsmod | grep nouveau", None),
])
def test_nouveau_loaded_or_not_or_unknown(modules, status, message, loaded):
    found = check("nouveau", modules=modules)
    assert (found.status, found.message, found.data) == (status, message, {"loaded": loaded})


# --- container-runtime and nvidia-container-toolkit -------------------------------------------------------------------
CRIO = {"processes": (f"/proc/1/cmdline:/usr/bin/crio\n/proc/2/cmdline:{KUBELET}/var/run/crio/crio.sock\n", 0),
        "runtime_files": ("file /etc/crio/crio.conf\nsocket /var/run/crio/crio.sock\n", 0),
        "runtime_configs": (f"{MARK} file /etc/crio/crio.conf\n{rec.CRIO_CONF}\n", 0), "containerd_version": ("", 0),
        "crio_version": (rec.CRIO_VERSION, 0)}
DOCKER = {"processes": ("/proc/1/cmdline:/usr/bin/dockerd\n/proc/2/cmdline:/usr/bin/cri-dockerd\n", 0),
          "runtime_files": ("file /etc/docker/daemon.json\nsocket /var/run/cri-dockerd.sock\n", 0),
          "runtime_configs": (f"{MARK} file /etc/docker/daemon.json\n{{}}\n", 0), "containerd_version": ("", 0),
          "docker_version": ("24.0.7\n", 0)}
K3S_CONFIG = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
K3S = {"processes": ("/proc/1/cmdline:/usr/local/bin/k3s server\n", 0),
       "runtime_files": ("socket /run/k3s/containerd/containerd.sock\n", 0), "runtime_configs": ("", 0),
       "containerd_version": ("", 0)}
K3S_WITH_NVIDIA = {**K3S, "runtime_files": (f"file {K3S_CONFIG}\nsocket /run/k3s/containerd/containerd.sock\n", 0),
                   "runtime_configs": (f"{MARK} file {K3S_CONFIG}\n{rec.K3S_CONFIG_WITH_NVIDIA}\n", 0)}
NOTHING = {"processes": ("", 0), "runtime_files": ("", 0), "runtime_configs": ("", 0), "containerd_version": ("", 0)}
PLAIN = {"runtime_configs": (f"{MARK} file /etc/containerd/config.toml\n{rec.CONTAINERD_CONFIG_PLAIN}\n", 0)}
RUNC_DEFAULT = rec.CONTAINERD_CONFIG_NVIDIA_DEFAULT.replace('default_runtime_name = "nvidia"',
                                                            'default_runtime_name = "runc"')
NVIDIA_NOT_DEFAULT = {"runtime_configs": (f"{MARK} file /etc/containerd/config.toml\n{RUNC_DEFAULT}", 0)}


@pytest.mark.parametrize("changed, status, message, data", [
    ({}, "pass", "containerd 1.7.27, config /etc/containerd/config.toml, socket /run/containerd/containerd.sock",
     ("containerd", "1.7.27", "/etc/containerd/config.toml", "/run/containerd/containerd.sock", "standard")),
    (CRIO, "pass", "cri-o 1.30.4, config /etc/crio/crio.conf, socket /var/run/crio/crio.sock",
     ("cri-o", "1.30.4", "/etc/crio/crio.conf", "/var/run/crio/crio.sock", "standard")),
    ({**CRIO, "crio_version": ("", 1)}, "pass", "cri-o, config /etc/crio/crio.conf, socket /var/run/crio/crio.sock",
     ("cri-o", None, "/etc/crio/crio.conf", "/var/run/crio/crio.sock", "standard")),
    (DOCKER, "pass", "docker 24.0.7, config /etc/docker/daemon.json, socket /var/run/cri-dockerd.sock",
     ("docker", "24.0.7", "/etc/docker/daemon.json", "/var/run/cri-dockerd.sock", "standard")),
    (K3S, "pass", f"containerd (k3s), config {K3S_CONFIG}, socket /run/k3s/containerd/containerd.sock; the config "
                  f"file does not exist yet (defaults)",
     ("containerd", None, K3S_CONFIG, "/run/k3s/containerd/containerd.sock", "k3s")),
    (NOTHING, "fail", "no container runtime found (containerd, CRI-O, or docker with cri-dockerd): is this node a "
                      "Kubernetes node?", (None, None, None, None, "standard")),
])
def test_the_container_runtime_found(changed, status, message, data):
    found = check("container-runtime", **changed)
    assert (found.status, found.message) == (status, message)
    assert found.data == dict(zip(("runtime", "version", "config_path", "socket", "distribution"), data))


def advice(runtime: str, config: str) -> str:
    return (f"1.17.4 installed but {config} has no nvidia runtime (pods would fail with 'no runtime for \"nvidia\" is "
            f"configured'): run `nvidia-ctk runtime configure --runtime={runtime} --config={config}` and restart "
            f"{runtime}, or let the gpu-operator's toolkit configure it")


@pytest.mark.parametrize("changed, status, message, data", [
    ({}, "pass", "1.17.4 installed; nvidia is the default runtime in /etc/containerd/config.toml",
     (True, "1.17.4", True, True)),
    ({"nvidia_ctk_version": NOT_FOUND}, "pass",
     "1.17.4 installed; nvidia is the default runtime in /etc/containerd/config.toml", (True, "1.17.4", True, True)),
    ({"nvidia_ctk_version": ("unexpected\n", 0), "nvidia_container_runtime_version": ("unexpected\n", 0)}, "pass",
     "installed; nvidia is the default runtime in /etc/containerd/config.toml", (True, None, True, True)),
    ({"nvidia_ctk_version": NOT_FOUND, "nvidia_container_runtime_version": NOT_FOUND}, "fail",
     "/etc/containerd/config.toml names an nvidia runtime but the toolkit is not installed: containers will fail to "
     "start; install nvidia-container-toolkit or remove that runtime", (False, None, True, True)),
    ({**PLAIN, "nvidia_ctk_version": NOT_FOUND, "nvidia_container_runtime_version": NOT_FOUND}, "warn",
     "not installed: the gpu-operator will install it (toolkit.enabled=true)", (False, None, False, False)),
    ({**PLAIN, "nvidia_ctk_version": None, "nvidia_container_runtime_version": None}, "warn",
     "not installed: the gpu-operator will install it (toolkit.enabled=true)", (False, None, False, False)),
    (NVIDIA_NOT_DEFAULT, "warn", "1.17.4 installed; nvidia runtime configured in /etc/containerd/config.toml but not "
                                 "the default: GPU pods need runtimeClassName: nvidia, or make it the default",
     (True, "1.17.4", True, False)),
    (K3S_WITH_NVIDIA, "warn", f"1.17.4 installed; nvidia runtime configured in {K3S_CONFIG} but not the default: GPU "
                              f"pods need runtimeClassName: nvidia, or set default-runtime: nvidia in "
                              f"/etc/rancher/k3s/config.yaml (1.28+)", (True, "1.17.4", True, False)),
    (K3S, "warn", f"1.17.4 installed but {K3S_CONFIG} has no nvidia runtime: k3s adds it by itself when it finds "
                  f"nvidia-container-runtime at start; restart k3s (its config.toml is regenerated, so do not edit it "
                  f"by hand)", (True, "1.17.4", False, False)),
    (PLAIN, "warn", advice("containerd", "/etc/containerd/config.toml"), (True, "1.17.4", False, False)),
    (CRIO, "warn", advice("crio", "/etc/crio/crio.conf"), (True, "1.17.4", False, False)),
    (DOCKER, "warn", advice("docker", "/etc/docker/daemon.json"), (True, "1.17.4", False, False)),
    (NOTHING, "warn", advice("containerd", "the runtime config"), (True, "1.17.4", False, False)),
])
def test_the_toolkit_installed_configured_and_default(changed, status, message, data):
    found = check("nvidia-container-toolkit", **changed)
    assert (found.status, found.message) == (status, message)
    expected = dict(zip(("installed", "version", "runtime_configured", "default_runtime"), data))
    if status == "pass":  # the host's toolkit is the one GPU pods run with: what it does with the variable is read
        expected["envvar_when_unprivileged"] = ENVVAR
    assert found.data == expected


HONOURS = "1.17.4 installed; nvidia is the default runtime in /etc/containerd/config.toml; "


@pytest.mark.parametrize("toolkit_config, message, honoured", [
    (("file /etc/nvidia-container-runtime/config.toml\n"
      "2:#accept-nvidia-visible-devices-envvar-when-unprivileged = true\n", 0),
     HONOURS + "it hands any unprivileged container the GPUs its NVIDIA_VISIBLE_DEVICES names, asked for or not: "
               "/etc/nvidia-container-runtime/config.toml has accept-nvidia-visible-devices-envvar-when-unprivileged = "
               "true (the default when unset); set it false", {"file": "/etc/nvidia-container-runtime/config.toml",
                                                              "key": ENVVAR["key"], "honoured": True}),
    (("file /etc/nvidia-container-runtime/config.toml\n"
      "2:accept-nvidia-visible-devices-envvar-when-unprivileged = true\n"
      "file /usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml\n"
      "3:accept-nvidia-visible-devices-envvar-when-unprivileged = false\n", 0),
     HONOURS + "it hands any unprivileged container", {"file": "/etc/nvidia-container-runtime/config.toml",
                                                        "key": ENVVAR["key"], "honoured": True}),
    (("", 0), HONOURS + "whether it hands unprivileged containers the GPUs NVIDIA_VISIBLE_DEVICES names is unknown (no "
                        "toolkit config at", {"file": None, "key": ENVVAR["key"], "honoured": None}),
    (None, HONOURS + "whether it hands unprivileged containers the GPUs NVIDIA_VISIBLE_DEVICES names is unknown (its "
                     "config was not read)", None),
])
def test_a_host_toolkit_that_honours_the_variable_or_cannot_be_read_warns(toolkit_config, message, honoured):
    """Unknown is not safe: an unread config (an older probe's report) warns as one that honours the variable does;
    the config the runtime reads first (/etc's) decides."""
    found = check("nvidia-container-toolkit", toolkit_config=toolkit_config)
    assert found.status == "warn" and found.message.startswith(message), found.message
    assert found.data["envvar_when_unprivileged"] == honoured


# --- the report -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("statuses, ok", [(("pass", "warn", "skip"), True), (("pass", "fail"), False), ((), True)])
def test_a_report_is_ok_unless_a_check_failed(statuses, ok):
    assert NodeReport("n", [NodeCheck(f"c{i}", s, "") for i, s in enumerate(statuses)]).ok is ok


def test_a_report_round_trips_through_json_and_fills_what_is_left_out():
    report = NodeReport("n", [NodeCheck("ssh", "pass", "ok", {"os": "x"}), NodeCheck("nouveau", "warn", "hm")])
    document = report.to_json()
    assert document == {"name": "n", "checks": [{"id": "ssh", "status": "pass", "message": "ok", "data": {"os": "x"}},
                                                {"id": "nouveau", "status": "warn", "message": "hm", "data": {}}]}
    assert NodeReport.from_json(document) == report
    sparse = NodeReport.from_json({"name": "m", "checks": [{"id": "ssh", "status": "fail", "data": None}]})
    assert sparse == NodeReport("m", [NodeCheck("ssh", "fail", "", {})])
    assert NodeReport.from_json({"name": "m"}) == NodeReport("m", [])


def test_an_unreachable_node_fails_ssh_and_skips_the_rest():
    assert unreachable("node5", "connection refused").to_json() == {"name": "node5", "checks": [
        {"id": "ssh", "status": "fail", "message": "connection refused", "data": {}},
        *[{"id": i, "status": "skip", "message": "skipped: no SSH session", "data": {}}
          for i in ("nvidia-driver", "nouveau", "container-runtime", "nvidia-container-toolkit")]]}


@pytest.mark.parametrize("family, image", [("al2023", "the EKS AL2023 NVIDIA AMI"),
                                           ("bottlerocket", "Bottlerocket's NVIDIA variant")])
def test_a_pool_node_has_the_facts_its_image_ships(family, image):
    origin = {"source": f"pool definition (gpu, {family})", "pool": "gpu"}
    assert from_pool("ip-10-0-0-1", "gpu", family).to_json() == {"name": "ip-10-0-0-1", "checks": [
        {"id": "ssh", "status": "skip", "message": f"not probed over SSH: launched by Karpenter pool gpu; facts from "
                                                   f"the pool definition ({image})", "data": origin},
        {"id": "nvidia-driver", "status": "pass", "message": f"driver ships with {image} (pool gpu)",
         "data": {**origin, "driver_version": f"from {image}", "gpus": []}},
        {"id": "nouveau", "status": "pass", "message": f"not loaded ({image})", "data": {**origin, "loaded": False}},
        {"id": "container-runtime", "status": "pass", "message": f"containerd ({image})", "data": {
            **origin, "runtime": "containerd", "version": None, "config_path": "/etc/containerd/config.toml",
            "socket": "/run/containerd/containerd.sock", "distribution": "standard"}},
        {"id": "nvidia-container-toolkit", "status": "pass", "message": f"NVIDIA runtime is containerd's default "
                                                                       f"({image})", "data": {
            **origin, "installed": True, "version": None, "runtime_configured": True, "default_runtime": True}}]}
