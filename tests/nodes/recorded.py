"""Outputs of the real tools, in the exact formats they print, for the fake nodes and the parser table tests.

Each constant names where its format was taken from. Version numbers and UUIDs are ours; the shape, spacing and
wording are the tools'.
"""

# /proc/driver/nvidia/version, proprietary module. Format: dylanaraps/neofetch#876.
PROC_VERSION_550 = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
                    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n")
# Open kernel module. Format: nix-community/nixGL#186.
PROC_VERSION_OPEN_565 = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01  Release Build  "
                         "(dvs-builder@U16-A24-9-2)  Thu Oct 10 12:15:00 UTC 2024\n"
                         "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n")
# Jetson-style open module with a non-driver version. Format: nix-community/nixGL#139.
PROC_VERSION_JETSON = ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  35.3.1  Release Build  "
                       "(buildbrain@mobile-u64-6289-d7000)  Sun Mar 19 08:09:33 PDT 2023\n"
                       "GCC version:  gcc version 9.3.0 (Buildroot 2020.08) \n")

# `nvidia-smi --query-gpu=... --format=csv` with header (triton-inference-server/server#8070); ours use
# noheader,nounits, so the parser must skip a header line if one appears.
NVSMI_QUERY_WITH_HEADER = ("compute_cap, compute_mode, driver_version, name, index\n"
                           "7.0, Default, 570.86.15, NVIDIA TITAN V, 0\n")

# `nvidia-smi -q` head. Format: bigstack-oss/cubecos#312.
NVSMI_Q_TEMPLATE = ("\n==============NVSMI LOG==============\n\n"
                    "Timestamp                                 : Sat Nov 21 10:00:00 2026\n"
                    "Driver Version                            : {driver}\n"
                    "CUDA Version                              : {cuda}\n\n"
                    "Attached GPUs                             : {count}\n")
NVSMI_Q_NO_CUDA = NVSMI_Q_TEMPLATE.format(driver="580.105.06", cuda="Not Found", count=4)

# nvidia-smi with the kernel module not loaded (exit code 9). Text and code: NVIDIA/gpu-operator#751.
NVSMI_NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
                   "latest NVIDIA driver is installed and running.\n")
NVSMI_NO_DRIVER_RC = 9

# Toolkit. Formats: NVIDIA/nvidia-container-toolkit#50 and OE4T/meta-tegra#1475.
NVIDIA_CTK_VERSION = "NVIDIA Container Toolkit CLI version 1.17.4\ncommit: 9b69590c7428470a72f2ae05f826412976af1395\n"
NVIDIA_CONTAINER_RUNTIME_VERSION = ("NVIDIA Container Runtime version 1.17.4\n"
                                    "commit: 9b69590c7428470a72f2ae05f826412976af1395\nspec: 1.2.0\n")

# Runtimes. crictl: kubernetes-sigs/cri-tools#971; crio: kata-containers/kata-containers#3120;
# containerd prints "containerd <package> <version> <revision>" (cmd/containerd's --version).
CONTAINERD_VERSION = "containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da\n"
CONTAINERD_K3S_VERSION = "containerd github.com/k3s-io/containerd v1.7.23-k3s2 e6ca1cd1f7c45ca5b0a4c12ecdb7d7a9dc3d8b3b\n"
CONTAINERD_RKE2_VERSION = "containerd github.com/k3s-io/containerd v1.7.23-k3s2 e6ca1cd1f7c45ca5b0a4c12ecdb7d7a9dc3d8b3b\n"
CONTAINERD_MICROK8S_VERSION = "containerd github.com/containerd/containerd v1.6.28 ae07eda36dd25f8a1b98dfbf587313b99c0190bb\n"
CRIO_VERSION = ("crio version 1.30.4\nVersion:        1.30.4\nGitCommit:      dd3a8b3a6c0c4f1c5a1d1e8c2e6f3c4b5a6d7e8f\n"
                "GitTreeState:   clean\nBuildDate:      2024-07-23T13:46:45Z\nGoVersion:      go1.22.5\n"
                "Compiler:       gc\nPlatform:       linux/amd64\nLinkmode:       dynamic\n")
K3S_VERSION = "k3s version v1.31.4+k3s1 (a562d090)\ngo version go1.22.9\n"
DOCKER_SERVER_VERSION = "24.0.7\n"

OS_RELEASE_UBUNTU_2204 = """PRETTY_NAME="Ubuntu 22.04.5 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.5 LTS (Jammy Jellyfish)"
VERSION_CODENAME=jammy
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
UBUNTU_CODENAME=jammy
"""
OS_RELEASE_RHEL_94 = """NAME="Red Hat Enterprise Linux"
VERSION="9.4 (Plow)"
ID="rhel"
ID_LIKE="fedora"
VERSION_ID="9.4"
PRETTY_NAME="Red Hat Enterprise Linux 9.4 (Plow)"
"""

# /proc/modules lines (name size refcount deps state address), as the kernel prints them.
MODULES_NVIDIA = (
    "nvidia_uvm 4911104 0 - Live 0x0000000000000000 (POE)\n"
    "nvidia_drm 122880 0 - Live 0x0000000000000000 (POE)\n"
    "nvidia_modeset 1343488 1 nvidia_drm, Live 0x0000000000000000 (POE)\n"
    "nvidia 54423552 2 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (POE)\n"
    "drm_kms_helper 311296 1 nvidia_drm, Live 0x0000000000000000\n"
    "overlay 151552 12 - Live 0x0000000000000000\n"
    "br_netfilter 32768 0 - Live 0x0000000000000000\n")
MODULES_NOUVEAU = (
    "nouveau 2813952 1 - Live 0x0000000000000000\n"
    "mxm_wmi 16384 1 nouveau, Live 0x0000000000000000\n"
    "drm_ttm_helper 16384 1 nouveau, Live 0x0000000000000000\n"
    "overlay 151552 12 - Live 0x0000000000000000\n")
MODULES_PLAIN = "overlay 151552 12 - Live 0x0000000000000000\nbr_netfilter 32768 0 - Live 0x0000000000000000\n"

# GPU inventories: (name, memory.total in MiB, compute capability) as nvidia-smi reports them.
H100 = ("NVIDIA H100 80GB HBM3", 81559, "9.0")
A100 = ("NVIDIA A100-SXM4-40GB", 40960, "8.0")
T4 = ("Tesla T4", 15360, "7.5")
CUDA_FOR_DRIVER = {"550.54.15": "12.4", "535.183.01": "12.2", "570.86.15": "12.8"}


def gpu_query(model: tuple, count: int, driver: str, seed: str = "0") -> str:
    name, memory, capability = model
    lines = []
    for index in range(count):
        uuid = f"GPU-{seed:0>8}-{index:04x}-{count:04x}-a1b2-c3d4e5f6{index:04x}"
        lines.append(f"{index}, {name}, {uuid}, {memory}, {capability}, {driver}")
    return "\n".join(lines) + "\n"


CONTAINERD_CONFIG_NVIDIA_DEFAULT = """version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "nvidia"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
          privileged_without_host_devices = false
          runtime_engine = ""
          runtime_root = ""
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/bin/nvidia-container-runtime"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true
"""
CONTAINERD_CONFIG_PLAIN = """version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true
"""
# containerd 2.x (config version 3) with the toolkit's drop-in, as `nvidia-ctk runtime configure` >= 1.17 writes it.
CONTAINERD_V3_WITH_IMPORTS = """version = 3
imports = ["/etc/containerd/conf.d/*.toml"]
"""
CONTAINERD_V3_NVIDIA_DROP_IN = """version = 3

[plugins]
  [plugins."io.containerd.cri.v1.runtime"]
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "nvidia"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes]
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/bin/nvidia-container-runtime"
"""
# What k3s generates when it finds nvidia-container-runtime at start (k3s does not make it the default).
K3S_CONFIG_WITH_NVIDIA = """# File generated by k3s. DO NOT EDIT. Use config.toml.tmpl instead.
version = 2

[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/rancher/k3s/agent/containerd"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "10010"
  enable_selinux = false
  sandbox_image = "rancher/mirrored-pause:3.6"

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  disable_snapshot_annotations = true

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia"]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia".options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
  SystemdCgroup = true
"""
# microk8s template (with its ${SNAP_DATA}-style placeholders) after `microk8s enable gpu` set the nvidia runtime.
MICROK8S_TEMPLATE_WITH_NVIDIA = """# Use config version 2 to enable new configuration fields.
version = 2
oom_score = 0

[grpc]
  uid = 0
  gid = 0
  max_recv_message_size = 16777216
  max_send_message_size = 16777216

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  sandbox_image = "registry.k8s.io/pause:3.7"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "${SNAPSHOTTER}"
    no_pivot = false
    default_runtime_name = "nvidia-container-runtime"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-container-runtime]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-container-runtime.options]
        BinaryName = "nvidia-container-runtime"
"""
# CRI-O drop-in as `nvidia-ctk runtime configure --runtime=crio` writes it.
CRIO_NVIDIA_DROP_IN = """[crio]

  [crio.runtime]
    default_runtime = "nvidia"

    [crio.runtime.runtimes]

      [crio.runtime.runtimes.nvidia]
        runtime_path = "/usr/bin/nvidia-container-runtime"
        runtime_type = "oci"
"""
CRIO_CONF = """[crio]
  log_dir = "/var/log/crio/pods"
[crio.runtime]
  default_runtime = "crun"
  [crio.runtime.runtimes.crun]
    runtime_path = "/usr/bin/crun"
"""
# /etc/docker/daemon.json of the old nvidia-docker2 recipe.
DOCKER_DAEMON_NVIDIA_DEFAULT = """{
    "default-runtime": "nvidia",
    "runtimes": {
        "nvidia": {
            "path": "nvidia-container-runtime",
            "runtimeArgs": []
        }
    }
}
"""


# Managed-node layouts (issue 24). COS: /etc/os-release of Container-Optimized OS (GKE node images); the GPU driver
# installer puts the driver under /home/kubernetes/bin/nvidia (GKE docs "Install drivers manually"). Bottlerocket:
# os-release of an aws-k8s-*-nvidia variant; its NVIDIA tools live in /usr/libexec/nvidia/tesla/bin/<version>
# (bottlerocket-os/bottlerocket#1799; newer releases add /usr/bin links, bottlerocket-kernel-kit#85) and containerd
# runs them through the nvidia runtime as its default.
OS_RELEASE_COS = """NAME="Container-Optimized OS"
ID=cos
PRETTY_NAME="Container-Optimized OS from Google"
HOME_URL="https://cloud.google.com/container-optimized-os/docs"
BUG_REPORT_URL="https://cloud.google.com/container-optimized-os/docs/resources/support-policy#contact_us"
GOOGLE_METRICS_PRODUCT_ID=26
GOOGLE_CRASH_ID=Lakitu
KERNEL_COMMIT_ID=2b3a2c9c1b8d5a0e7f4d3c2b1a0f9e8d7c6b5a4f
VERSION=117
VERSION_ID=117
BUILD_ID=18613.164.4
"""
OS_RELEASE_BOTTLEROCKET = """NAME=Bottlerocket
ID=bottlerocket
VERSION="1.29.0 (aws-k8s-1.31-nvidia)"
PRETTY_NAME="Bottlerocket OS 1.29.0 (aws-k8s-1.31-nvidia)"
VARIANT_ID=aws-k8s-1.31-nvidia
VERSION_ID=1.29.0
BUILD_ID=c55d099c
HOME_URL="https://github.com/bottlerocket-os/bottlerocket"
SUPPORT_URL="https://github.com/bottlerocket-os/bottlerocket/discussions"
BUG_REPORT_URL="https://github.com/bottlerocket-os/bottlerocket/issues"
DOCUMENTATION_URL="https://bottlerocket.dev"
"""
OS_RELEASE_AL2023 = """NAME="Amazon Linux"
VERSION="2023"
ID="amzn"
ID_LIKE="fedora"
VERSION_ID="2023"
PLATFORM_ID="platform:al2023"
PRETTY_NAME="Amazon Linux 2023.6.20241121"
ANSI_COLOR="0;33"
CPE_NAME="cpe:2.3:o:amazon:amazon_linux:2023"
HOME_URL="https://aws.amazon.com/linux/amazon-linux-2023/"
"""
CONTAINERD_BOTTLEROCKET_NVIDIA = """version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.native", "io.containerd.snapshotter.v1.zfs"]

[grpc]
address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
enable_selinux = true
sandbox_image = "localhost/kubernetes/pause:0.1.0"

[plugins."io.containerd.grpc.v1.cri".containerd]
default_runtime_name = "nvidia"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
runtime_type = "io.containerd.runc.v2"
base_runtime_spec = "/etc/containerd/cri-base.json"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
SystemdCgroup = true
BinaryName = "nvidia-oci"
"""
CONTAINERD_COS_VERSION = "containerd github.com/containerd/containerd v1.7.24 88bf19b2105c8b17560993bee28a01ddc2f97182\n"


# /etc/nvidia-container-runtime/config.toml as nvidia-container-toolkit 1.17's package writes it (`nvidia-ctk config
# default`): the device-access keys commented out, so their defaults hold (envvar-when-unprivileged: true)
TOOLKIT_CONFIG_PACKAGE = """#accept-nvidia-visible-devices-as-volume-mounts = false
#accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"
#swarm-resource = "DOCKER_RESOURCE_GPU"

[nvidia-container-cli]
environment = []
ldconfig = "@/sbin/ldconfig.real"
load-kmods = true

[nvidia-container-runtime]
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]
"""
# the same, hardened as docs/security.md asks: unprivileged containers get GPUs by volume mounts only
TOOLKIT_CONFIG_HARDENED = TOOLKIT_CONFIG_PACKAGE.replace(
    "#accept-nvidia-visible-devices-as-volume-mounts = false", "accept-nvidia-visible-devices-as-volume-mounts = true"
).replace("#accept-nvidia-visible-devices-envvar-when-unprivileged = true",
          "accept-nvidia-visible-devices-envvar-when-unprivileged = false")
