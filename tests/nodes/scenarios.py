"""Node scenarios: each is a function that writes a realistic node into a Tree.

They are composed from small parts (OS, driver, runtime, toolkit) so a scenario reads like the node it stands for.
"""
from __future__ import annotations

from . import recorded as rec
from .farm import Tree

DRIVER = "550.54.15"


# --- parts ---------------------------------------------------------------------------------------------------------------
def os_ubuntu(tree: Tree) -> None:
    tree.file("/etc/os-release", rec.OS_RELEASE_UBUNTU_2204)
    tree.file("/proc/sys/kernel/osrelease", "5.15.0-131-generic\n")


def os_rhel(tree: Tree) -> None:
    tree.file("/etc/os-release", rec.OS_RELEASE_RHEL_94)
    tree.file("/proc/sys/kernel/osrelease", "5.14.0-427.13.1.el9_4.x86_64\n")


def kernel_module(tree: Tree, modules: str = rec.MODULES_NVIDIA, proc_version: str = rec.PROC_VERSION_550) -> None:
    tree.file("/proc/modules", modules)
    if proc_version:
        tree.file("/proc/driver/nvidia/version", proc_version)


def devices(tree: Tree, count: int) -> None:
    for index in range(count):
        tree.device(f"/dev/nvidia{index}")
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        tree.device(f"/dev/{name}")


def nvidia_smi(tree: Tree, model: tuple, count: int, driver: str = DRIVER, query: str | None = None) -> None:
    cuda = rec.CUDA_FOR_DRIVER.get(driver, "12.4")
    tree.fake_tool("/usr/bin/nvidia-smi", {
        "--query-gpu": (query if query is not None else rec.gpu_query(model, count, driver), 0),
        "-q": (rec.NVSMI_Q_TEMPLATE.format(driver=driver, cuda=cuda, count=count), 0),
        None: (f"NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: {cuda}\n", 0)})


def driver(tree: Tree, model: tuple, count: int) -> None:
    kernel_module(tree)
    devices(tree, count)
    nvidia_smi(tree, model, count)


def containerd(tree: Tree, config: str | None, version: str = rec.CONTAINERD_VERSION) -> None:
    if config is not None:
        tree.file("/etc/containerd/config.toml", config)
    tree.fake_tool("/usr/bin/containerd", {"--version": (version, 0)})
    tree.socket("/run/containerd/containerd.sock")
    tree.process(812, ["/usr/bin/containerd"])
    tree.process(1021, ["/usr/bin/kubelet", "--config=/var/lib/kubelet/config.yaml",
                        "--container-runtime-endpoint=unix:///run/containerd/containerd.sock"])


def toolkit(tree: Tree, config: str = rec.TOOLKIT_CONFIG_HARDENED) -> None:
    tree.fake_tool("/usr/bin/nvidia-ctk", {"--version": (rec.NVIDIA_CTK_VERSION, 0)})
    tree.fake_tool("/usr/bin/nvidia-container-runtime", {"--version": (rec.NVIDIA_CONTAINER_RUNTIME_VERSION, 0)})
    tree.file("/etc/nvidia-container-runtime/config.toml", config)


# --- the scenarios the issue lists ---------------------------------------------------------------------------------------
def healthy_h100(tree: Tree) -> None:
    """8×H100, driver pre-installed, containerd with the nvidia runtime as default, toolkit installed."""
    os_ubuntu(tree)
    driver(tree, rec.H100, 8)
    containerd(tree, rec.CONTAINERD_CONFIG_NVIDIA_DEFAULT)
    toolkit(tree)


def busy_h100(tree: Tree) -> None:
    """healthy-h100 on a node as busy as a DGX-class server at its pod limit: 2,600 processes (per-CPU kernel
    threads, system daemons), 110 pods' containerd shims, the kubelet among them (whose flags the runtime facts come
    from), and the process scan's own earlier form as a real
    /proc showed it: a grep whose command line names every /proc/<pid>/cmdline path. The kubelet talks to containerd
    on a socket of its own, so the runtime's socket is known only from the kubelet's command line."""
    import hashlib
    healthy_h100(tree)
    # containerd reads a config of its own (--config), the only one with the nvidia runtime: the toolkit check passes
    # only if the probe reads the file the process names, not just the known places
    tree.file("/etc/containerd/config.toml", rec.CONTAINERD_CONFIG_PLAIN)
    tree.file("/etc/containerd/gpu-node.toml", rec.CONTAINERD_CONFIG_NVIDIA_DEFAULT)
    tree.process(812, ["/usr/bin/containerd", "--config", "/etc/containerd/gpu-node.toml"])
    tree.socket("/run/containerd/gpu-node.sock")
    tree.process(1021, ["/usr/bin/kubelet", "--config=/var/lib/kubelet/config.yaml",
                        "--container-runtime-endpoint=unix:///run/containerd/gpu-node.sock"])
    pid = 2000
    for cpu in range(224):  # kernel threads: an empty command line, a name in comm
        for name in ("cpuhp", "migration", "ksoftirqd", "kworker"):
            tree.process(pid, [], comm=f"{name}/{cpu}")
            pid += 1
    for index in range(1_700):
        tree.process(pid, [f"/usr/lib/daemon-{index % 40}", "--foreground"])
        pid += 1
    for pod in range(110):
        digest = hashlib.sha256(str(pod).encode()).hexdigest()
        tree.process(pid, ["/usr/bin/containerd-shim-runc-v2", "-namespace", "k8s.io", "-id", digest, "-address",
                           "/run/containerd/containerd.sock"])
        pid += 1
    listed = " ".join(f"/proc/{p}/cmdline" for p in range(1, pid + 1))
    tree.process(pid, ["grep", "-a", "-H", "-E", "containerd|crio|dockerd|kubelet|k3s|rke2|k0s", *listed.split()])


def driver_missing(tree: Tree) -> None:
    """A fresh GPU node: no driver, no toolkit, plain containerd."""
    os_ubuntu(tree)
    kernel_module(tree, rec.MODULES_PLAIN, proc_version="")
    containerd(tree, rec.CONTAINERD_CONFIG_PLAIN)


def driver_without_smi(tree: Tree) -> None:
    """The kernel module is loaded but the user-space tools (nvidia-smi) are not installed."""
    os_ubuntu(tree)
    kernel_module(tree)
    devices(tree, 8)
    containerd(tree, rec.CONTAINERD_CONFIG_PLAIN)


def smi_without_driver(tree: Tree) -> None:
    """nvidia-smi is installed but the kernel module is not loaded (a kernel upgrade without DKMS rebuild)."""
    os_ubuntu(tree)
    kernel_module(tree, rec.MODULES_PLAIN, proc_version="")
    tree.fake_tool("/usr/bin/nvidia-smi", {None: (rec.NVSMI_NO_DRIVER, rec.NVSMI_NO_DRIVER_RC)})
    containerd(tree, rec.CONTAINERD_CONFIG_PLAIN)


def nouveau(tree: Tree) -> None:
    """The open-source nouveau driver holds the GPU."""
    os_ubuntu(tree)
    kernel_module(tree, rec.MODULES_NOUVEAU, proc_version="")
    containerd(tree, rec.CONTAINERD_CONFIG_PLAIN)


def k3s(tree: Tree) -> None:
    """k3s agent with its embedded containerd; k3s found nvidia-container-runtime and added (not defaulted) it."""
    os_ubuntu(tree)
    driver(tree, rec.A100, 4)
    toolkit(tree)
    tree.file("/var/lib/rancher/k3s/agent/etc/containerd/config.toml", rec.K3S_CONFIG_WITH_NVIDIA)
    tree.fake_tool("/var/lib/rancher/k3s/data/current/bin/containerd", {"--version": (rec.CONTAINERD_K3S_VERSION, 0)})
    tree.fake_tool("/usr/local/bin/k3s", {"--version": (rec.K3S_VERSION, 0)})
    tree.socket("/run/k3s/containerd/containerd.sock")
    tree.process(901, ["/usr/local/bin/k3s", "agent"])
    tree.process(955, ["containerd", "-c", "/var/lib/rancher/k3s/agent/etc/containerd/config.toml", "-a",
                       "/run/k3s/containerd/containerd.sock", "--state", "/run/k3s/containerd", "--root",
                       "/var/lib/rancher/k3s/agent/containerd"])


def rke2(tree: Tree) -> None:
    """rke2 agent: containerd config under /var/lib/rancher/rke2, socket shared with k3s's path; no toolkit."""
    os_rhel(tree)
    driver(tree, rec.H100, 8)
    tree.file("/var/lib/rancher/rke2/agent/etc/containerd/config.toml", rec.CONTAINERD_CONFIG_PLAIN)
    tree.fake_tool("/var/lib/rancher/rke2/bin/containerd", {"--version": (rec.CONTAINERD_RKE2_VERSION, 0)})
    tree.socket("/run/k3s/containerd/containerd.sock")
    tree.process(1201, ["/usr/local/bin/rke2", "agent"])
    tree.process(1250, ["containerd", "-c", "/var/lib/rancher/rke2/agent/etc/containerd/config.toml", "-a",
                        "/run/k3s/containerd/containerd.sock"])


def microk8s(tree: Tree) -> None:
    """microk8s (snap): containerd configured from a template; `microk8s enable gpu` made nvidia the default."""
    os_ubuntu(tree)
    driver(tree, rec.T4, 1)
    toolkit(tree)
    tree.file("/var/snap/microk8s/current/args/containerd-template.toml", rec.MICROK8S_TEMPLATE_WITH_NVIDIA)
    tree.fake_tool("/snap/microk8s/current/bin/containerd", {"--version": (rec.CONTAINERD_MICROK8S_VERSION, 0)})
    tree.socket("/var/snap/microk8s/common/run/containerd.sock")
    tree.process(3001, ["/snap/microk8s/6750/bin/containerd", "--config",
                        "/var/snap/microk8s/6750/args/containerd.toml", "--root",
                        "/var/snap/microk8s/common/var/lib/containerd", "--state",
                        "/var/snap/microk8s/common/run/containerd", "--address",
                        "/var/snap/microk8s/common/run/containerd.sock"])
    tree.process(3050, ["/snap/microk8s/6750/kubelite", "--scheduler-args-file=/var/snap/microk8s/6750/args/kube-scheduler"])


def crio(tree: Tree) -> None:
    """CRI-O with the toolkit's drop-in making nvidia the default."""
    os_rhel(tree)
    driver(tree, rec.A100, 4)
    toolkit(tree)
    tree.file("/etc/crio/crio.conf", rec.CRIO_CONF)
    tree.file("/etc/crio/crio.conf.d/99-nvidia.toml", rec.CRIO_NVIDIA_DROP_IN)
    tree.fake_tool("/usr/bin/crio", {"--version": (rec.CRIO_VERSION, 0)})
    tree.socket("/var/run/crio/crio.sock")
    tree.process(700, ["/usr/bin/crio"])
    tree.process(760, ["/usr/bin/kubelet", "--container-runtime-endpoint=unix:///var/run/crio/crio.sock"])


def docker_nvidia_default(tree: Tree) -> None:
    """The old nvidia-docker2 recipe: docker with nvidia as default-runtime, kubelet through cri-dockerd."""
    os_ubuntu(tree)
    driver(tree, rec.H100, 8)
    toolkit(tree)
    tree.file("/etc/docker/daemon.json", rec.DOCKER_DAEMON_NVIDIA_DEFAULT)
    tree.fake_tool("/usr/bin/docker", {"version": (rec.DOCKER_SERVER_VERSION, 0)})
    tree.socket("/var/run/docker.sock")
    tree.socket("/var/run/cri-dockerd.sock")
    tree.process(600, ["/usr/bin/dockerd", "-H", "fd://", "--containerd=/run/containerd/containerd.sock"])
    tree.process(650, ["/usr/bin/cri-dockerd", "--container-runtime-endpoint", "fd://"])
    tree.process(690, ["/usr/bin/kubelet", "--container-runtime-endpoint=unix:///var/run/cri-dockerd.sock"])


def toolkit_not_configured(tree: Tree) -> None:
    """The toolkit package is installed but nobody ran `nvidia-ctk runtime configure`."""
    os_ubuntu(tree)
    driver(tree, rec.H100, 8)
    toolkit(tree)
    containerd(tree, rec.CONTAINERD_CONFIG_PLAIN)


def t4(tree: Tree) -> None:
    """1×T4 on an older driver."""
    os_ubuntu(tree)
    kernel_module(tree)
    devices(tree, 1)
    nvidia_smi(tree, rec.T4, 1, driver="535.183.01")
    containerd(tree, rec.CONTAINERD_CONFIG_NVIDIA_DEFAULT)
    toolkit(tree)


def a100x4(tree: Tree) -> None:
    """4×A100 with containerd 2.x and the toolkit's drop-in config."""
    os_ubuntu(tree)
    driver(tree, rec.A100, 4)
    containerd(tree, rec.CONTAINERD_V3_WITH_IMPORTS,
               version="containerd containerd.io 2.0.4 1a43cb6a1035441f9aca8f5666a9b3ef9e70ab20\n")
    tree.file("/etc/containerd/conf.d/99-nvidia.toml", rec.CONTAINERD_V3_NVIDIA_DROP_IN)
    toolkit(tree)


def gke_cos(tree: Tree) -> None:
    """A GKE node on Container-Optimized OS with a T4: the driver installer put the driver under
    /home/kubernetes/bin/nvidia; containerd without an nvidia runtime (GKE's device plugin mounts the driver)."""
    tree.file("/etc/os-release", rec.OS_RELEASE_COS)
    tree.file("/proc/sys/kernel/osrelease", "6.1.112+\n")
    kernel_module(tree, proc_version=rec.PROC_VERSION_550)
    devices(tree, 1)
    cuda = rec.CUDA_FOR_DRIVER[DRIVER]
    tree.fake_tool("/home/kubernetes/bin/nvidia/bin/nvidia-smi", {
        "--query-gpu": (rec.gpu_query(rec.T4, 1, DRIVER), 0),
        "-q": (rec.NVSMI_Q_TEMPLATE.format(driver=DRIVER, cuda=cuda, count=1), 0)})
    tree.file("/etc/containerd/config.toml", rec.CONTAINERD_CONFIG_PLAIN)
    tree.fake_tool("/usr/bin/containerd", {"--version": (rec.CONTAINERD_COS_VERSION, 0)})
    tree.socket("/run/containerd/containerd.sock")
    tree.process(640, ["/usr/bin/containerd", "--config", "/etc/containerd/config.toml"])
    tree.process(702, ["/home/kubernetes/bin/kubelet", "--v=2", "--cloud-provider=external",
                       "--container-runtime-endpoint=unix:///run/containerd/containerd.sock"])


def bottlerocket(tree: Tree) -> None:
    """Bottlerocket's aws-k8s-nvidia variant, A10G-class: NVIDIA tools under /usr/libexec/nvidia/tesla/bin/<ver>,
    containerd's default runtime is nvidia (nvidia-oci), the toolkit's nvidia-ctk in /usr/bin."""
    driver_version = "535.183.01"
    tree.file("/etc/os-release", rec.OS_RELEASE_BOTTLEROCKET)
    tree.file("/proc/sys/kernel/osrelease", "6.1.119\n")
    kernel_module(tree, proc_version=rec.PROC_VERSION_550.replace(DRIVER, driver_version))
    devices(tree, 4)
    tree.fake_tool(f"/usr/libexec/nvidia/tesla/bin/{driver_version}/nvidia-smi", {
        "--query-gpu": (rec.gpu_query(rec.A100, 4, driver_version), 0),
        "-q": (rec.NVSMI_Q_TEMPLATE.format(driver=driver_version, cuda="12.2", count=4), 0)})
    tree.file("/etc/containerd/config.toml", rec.CONTAINERD_BOTTLEROCKET_NVIDIA)
    tree.fake_tool("/usr/bin/containerd", {"--version": (rec.CONTAINERD_VERSION, 0)})
    tree.socket("/run/containerd/containerd.sock")
    tree.process(810, ["/usr/bin/containerd"])
    tree.process(905, ["/usr/bin/kubelet", "--container-runtime-endpoint=unix:///run/containerd/containerd.sock"])
    tree.fake_tool("/usr/bin/nvidia-ctk", {"--version": (rec.NVIDIA_CTK_VERSION, 0)})


def al2023_nvidia(tree: Tree) -> None:
    """The EKS AL2023 NVIDIA AMI: driver, toolkit and containerd with nvidia as the default runtime."""
    tree.file("/etc/os-release", rec.OS_RELEASE_AL2023)
    tree.file("/proc/sys/kernel/osrelease", "6.1.115-126.197.amzn2023.x86_64\n")
    driver(tree, rec.H100, 8)
    containerd(tree, rec.CONTAINERD_CONFIG_NVIDIA_DEFAULT)
    toolkit(tree)


# --- failure and hostile scenarios ------------------------------------------------------------------------------------
def smi_hangs(tree: Tree) -> None:
    """nvidia-smi never returns (a wedged GPU)."""
    healthy_h100(tree)
    tree.exe("/usr/bin/nvidia-smi", "exec sleep 3600\n")


def shell_hangs(tree: Tree) -> None:
    """The whole session hangs (e.g. a login script waiting on a dead NFS mount)."""
    healthy_h100(tree)
    tree.file("/bin/bash", "#!/bin/sh\nexec /bin/busybox sleep 3600\n", 0o755)


HOSTILE_NAME = "$(touch /tmp/pwned); `touch /tmp/pwned2`; rm -rf / #"


def hostile_output(tree: Tree) -> None:
    """A node whose tools print shell syntax: it must stay data, never be executed."""
    healthy_h100(tree)
    nvidia_smi(tree, (HOSTILE_NAME, 81559, "9.0"), 2)


def sudo_user(tree: Tree, allow: bool = True) -> None:
    """A healthy node reached as a non-root user; `sudo -n` either works or wants a password."""
    healthy_h100(tree)
    if allow:
        tree.exe("/usr/bin/sudo", 'echo "$*" >> /tmp/sudo.log\n[ "$1" = "-n" ] && shift\n[ "$1" = "--" ] && shift\n'
                                  'exec "$@"\n')
    else:
        tree.exe("/usr/bin/sudo", 'echo "$*" >> /tmp/sudo.log\necho "sudo: a password is required" >&2\nexit 1\n')


def sudo_refused(tree: Tree) -> None:
    sudo_user(tree, allow=False)


def toolkit_honours_envvar(tree: Tree) -> None:
    """healthy-h100, but the toolkit's config as its package writes it: an unprivileged container that sets
    NVIDIA_VISIBLE_DEVICES gets the GPUs it names (accept-nvidia-visible-devices-envvar-when-unprivileged's default)."""
    healthy_h100(tree)
    toolkit(tree, rec.TOOLKIT_CONFIG_PACKAGE)


SCENARIOS = {
    "healthy-h100": healthy_h100, "busy-h100": busy_h100, "driver-missing": driver_missing, "driver-without-smi": driver_without_smi,
    "smi-without-driver": smi_without_driver, "nouveau": nouveau, "k3s": k3s, "rke2": rke2, "microk8s": microk8s,
    "crio": crio, "docker-nvidia-default": docker_nvidia_default, "toolkit-not-configured": toolkit_not_configured,
    "t4": t4, "a100x4": a100x4, "gke-cos": gke_cos, "bottlerocket": bottlerocket, "al2023-nvidia": al2023_nvidia,
    "toolkit-honours-envvar": toolkit_honours_envvar,
}
