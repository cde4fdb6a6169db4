"""From a node's raw sections to the doctor's checks: status, a one-line message that says what to do, and data.

Pure: the same sections always give the same checks, so every scenario is a table test away.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from gpu_bootstrap.core.outcomes import FAIL, PASS, SKIP, WARN
from gpu_bootstrap.probes import parse, script
from gpu_bootstrap.probes.script import COMMAND_TIMEOUT, Section

CHECK_IDS = ("ssh", "nvidia-driver", "nouveau", "container-runtime", "nvidia-container-toolkit")
BLACKLIST_NOUVEAU = ("blacklist it: echo 'blacklist nouveau' | sudo tee /etc/modprobe.d/blacklist-nouveau.conf; "
                     "sudo update-initramfs -u (dracut -f on RHEL); then reboot")


@dataclass
class NodeCheck:
    id: str
    status: str
    message: str
    data: dict = field(default_factory=dict)


@dataclass
class NodeReport:
    name: str
    checks: list[NodeCheck]
    source: str = ""  # how the facts were read from the node: ssh | cluster (empty: not said, e.g. written by hand)
    # when they were read (UTC, ISO 8601) and from which boot of which machine (the Node's status.nodeInfo bootID
    # and machineID then): facts are reused only for the same boot of the same machine (probes/recorded.py)
    read_at: str = ""
    identity: dict = field(default_factory=dict)
    came_from: str = ""  # how this run got them when it did not read the node: report | recorded

    @property
    def ok(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    @property
    def read(self) -> bool:
        """Whether these are facts of the node (its ssh check did not fail), not an unknown node's stand-in."""
        return self.check("ssh").status != FAIL if any(c.id == "ssh" for c in self.checks) else False

    def check(self, check_id: str) -> NodeCheck:
        return next(c for c in self.checks if c.id == check_id)

    def to_json(self) -> dict:
        document = {"name": self.name, "checks": [asdict(c) for c in self.checks]}
        for key in ("source", "read_at", "identity", "came_from"):
            if getattr(self, key):
                document[key] = getattr(self, key)
        return document

    @classmethod
    def from_json(cls, data: dict) -> "NodeReport":
        identity = data.get("identity") or {}
        return cls(data["name"], [NodeCheck(c["id"], c["status"], c.get("message", ""), c.get("data") or {})
                                  for c in data.get("checks", [])], str(data.get("source") or ""),
                   str(data.get("read_at") or ""),
                   {str(k): str(v) for k, v in identity.items()} if isinstance(identity, dict) else {},
                   str(data.get("came_from") or ""))


def unreachable(name: str, message: str, how: str = "no SSH session") -> NodeReport:
    """A node we could not run anything on: ssh fails, everything else is skipped (unknown, never absent)."""
    checks = [NodeCheck("ssh", FAIL, message)]
    checks += [NodeCheck(i, SKIP, f"skipped: {how}") for i in CHECK_IDS[1:]]
    return NodeReport(name, checks)


def evaluate(name: str, sections: dict[str, Section], marker: str, timeout: int = COMMAND_TIMEOUT) -> NodeReport:
    def text(key: str) -> str:
        section = sections.get(key)
        return section.output if section else ""

    ssh = _ssh(sections, text)
    driver = _driver(sections, text, timeout)
    nouveau = _nouveau(sections, text, driver)
    runtime = parse.detect_runtime(
        parse.processes(text("processes")), parse.files(text("runtime-files")),
        # the files the runtime's own --config names, beside the known places (later reports only)
        parse.dumped_files(text("runtime-named-configs"), marker) | parse.dumped_files(text("runtime-configs"), marker),
        _versions(sections, text))
    return NodeReport(name, [ssh, driver, nouveau, _runtime_check(runtime), _toolkit(sections, text, runtime)])


def _ssh(sections, text) -> NodeCheck:
    release = parse.os_release(text("os-release"))
    data = {"os": release.get("PRETTY_NAME", "unknown"), "os_id": release.get("ID", ""),
            "os_version": release.get("VERSION_ID", ""), "kernel": text("kernel").strip(),
            "arch": text("arch").strip(), "uid": text("id").strip()}
    if "processes" not in sections:
        return NodeCheck("ssh", FAIL, "the probe script stopped early (connection lost or timed out); rerun doctor",
                         data)
    return NodeCheck("ssh", PASS, f"{data['os']}, kernel {data['kernel']} ({data['arch']})", data)


def _driver(sections, text, timeout: int) -> NodeCheck:
    query = sections.get("nvidia-smi-query")
    proc = parse.proc_driver_version(text("proc-driver-version"))
    header = parse.nvsmi_header(text("nvidia-smi-q"))
    gpus = parse.gpus_from_query(text("nvidia-smi-query")) if query and query.ok else []
    driver_version = header.get("driver_version") or (gpus[0]["driver_version"] if gpus else None) or \
        (proc or {}).get("driver_version")
    data = {"driver_version": driver_version, "cuda_version": header.get("cuda_version"),
            "gpus": [{k: g[k] for k in ("index", "name", "uuid", "memory_mib", "compute_capability")} for g in gpus],
            "source": "nvidia-smi" if gpus else ("proc" if proc else None),
            "open_kernel_module": (proc or {}).get("open_kernel_module"),
            "device_nodes": parse.nvidia_device_count(text("dev-nvidia"))}
    if query is not None and query.timed_out:
        return NodeCheck("nvidia-driver", FAIL, f"nvidia-smi did not answer within {timeout}s: the GPU or "
                                                "driver is hung; look for Xid errors in `dmesg` and reset the GPU "
                                                "or reboot", data)
    if gpus:
        models = _inventory(gpus)
        cuda = f", CUDA {data['cuda_version']}" if data["cuda_version"] else ""
        return NodeCheck("nvidia-driver", PASS, f"driver {driver_version}{cuda}: {models}", data)
    if query is not None and not query.missing and query.ok:
        return NodeCheck("nvidia-driver", FAIL, f"driver {driver_version} is loaded but nvidia-smi sees no GPU: check "
                                                "the PCI devices (lspci | grep -i nvidia) and `dmesg`", data)
    if query is not None and not query.missing:
        first = (query.output.strip().splitlines() or ["no output"])[0][:160]
        if proc:
            return NodeCheck("nvidia-driver", FAIL, f"driver {driver_version} is loaded but nvidia-smi fails "
                                                    f"({first}): the user-space driver does not match the kernel "
                                                    f"module; reinstall the same driver version", data)
        return NodeCheck("nvidia-driver", FAIL, f"nvidia-smi is installed but the NVIDIA kernel module is not loaded "
                                                f"({first}): run `sudo modprobe nvidia` or reboot, and check `dmesg`",
                         data)
    if proc:
        return NodeCheck("nvidia-driver", WARN, f"driver {driver_version} is loaded but nvidia-smi is missing: "
                                                f"install the NVIDIA utilities matching the driver (e.g. "
                                                f"nvidia-utils-{driver_version.split('.')[0]}-server)", data)
    return NodeCheck("nvidia-driver", WARN, "no NVIDIA driver on this node: the gpu-operator will install it "
                                            "(driver.enabled=true)", data)


def _inventory(gpus: list[dict]) -> str:
    counts: dict[str, int] = {}
    for gpu in gpus:
        counts[gpu["name"]] = counts.get(gpu["name"], 0) + 1
    return ", ".join(f"{count}× {name}" for name, count in counts.items())


def _nouveau(sections, text, driver: NodeCheck) -> NodeCheck:
    modules = sections.get("modules")
    if modules is None or not modules.ok:
        return NodeCheck("nouveau", WARN, "could not read /proc/modules; check by hand: lsmod | grep nouveau",
                         {"loaded": None})
    loaded = "nouveau" in parse.loaded_modules(modules.output)
    if loaded:
        return NodeCheck("nouveau", FAIL, f"the open-source nouveau driver is loaded and blocks the NVIDIA driver; "
                                          f"{BLACKLIST_NOUVEAU}", {"loaded": True})
    return NodeCheck("nouveau", PASS, "not loaded", {"loaded": False})


def _versions(sections, text) -> dict[str, str]:
    versions = parse.binary_versions(text("containerd-version"))
    crio = parse.crio_version(text("crio-version")) if sections.get("crio-version", None) and \
        sections["crio-version"].ok else None
    if crio:
        versions["crio"] = crio
    docker = sections.get("docker-version")
    if docker is not None and docker.ok:
        versions["docker"] = docker.output.strip()
    return versions


def _runtime_check(runtime: parse.Runtime) -> NodeCheck:
    data = {"runtime": runtime.runtime, "version": runtime.version, "config_path": runtime.config_path,
            "socket": runtime.socket, "distribution": runtime.distribution}
    if runtime.runtime is None:
        return NodeCheck("container-runtime", FAIL, "no container runtime found (containerd, CRI-O, or docker with "
                                                    "cri-dockerd): is this node a Kubernetes node?", data)
    flavour = f" ({runtime.distribution})" if runtime.distribution != "standard" else ""
    version = f" {runtime.version}" if runtime.version else ""
    missing = "" if runtime.config_path in runtime.configs else "; the config file does not exist yet (defaults)"
    return NodeCheck("container-runtime", PASS, f"{runtime.runtime}{version}{flavour}, config {runtime.config_path}, "
                                                f"socket {runtime.socket}{missing}", data)


def _toolkit(sections, text, runtime: parse.Runtime) -> NodeCheck:
    version = parse.toolkit_version(text("nvidia-ctk-version")) or \
        parse.toolkit_version(text("nvidia-container-runtime-version"))
    installed = any(s in sections and not sections[s].missing
                    for s in ("nvidia-ctk-version", "nvidia-container-runtime-version"))
    configured, default, detail = parse.nvidia_runtime(runtime) if runtime.runtime else (False, False, "")
    data = {"installed": installed, "version": version, "runtime_configured": configured,
            "default_runtime": default}
    config = runtime.config_path or "the runtime config"
    if not installed:
        if configured:
            return NodeCheck("nvidia-container-toolkit", FAIL, f"{config} names an nvidia runtime but the toolkit is "
                                                               f"not installed: containers will fail to start; install "
                                                               f"nvidia-container-toolkit or remove that runtime", data)
        return NodeCheck("nvidia-container-toolkit", WARN, "not installed: the gpu-operator will install it "
                                                           "(toolkit.enabled=true)", data)
    label = f"{version} installed" if version else "installed"
    if configured and default:
        honours = _honours_envvar(sections, text, data)
        if honours:
            return NodeCheck("nvidia-container-toolkit", WARN, f"{label}; nvidia is the default runtime in {config}; "
                                                               f"{honours}", data)
        return NodeCheck("nvidia-container-toolkit", PASS, f"{label}; nvidia is the default runtime in {config}", data)
    rancher = runtime.distribution in ("k3s", "rke2")
    if configured:
        how = (f"set default-runtime: nvidia in /etc/rancher/{runtime.distribution}/config.yaml (1.28+)" if rancher
               else "make it the default")
        return NodeCheck("nvidia-container-toolkit", WARN, f"{label}; nvidia runtime configured in {config} but not "
                                                           f"the default: GPU pods need runtimeClassName: nvidia, or "
                                                           f"{how}", data)
    if rancher:
        return NodeCheck("nvidia-container-toolkit", WARN, f"{label} but {config} has no nvidia runtime: "
                                                           f"{runtime.distribution} adds it by itself when it finds "
                                                           f"nvidia-container-runtime at start; restart "
                                                           f"{runtime.distribution} (its config.toml is regenerated, "
                                                           f"so do not edit it by hand)", data)
    runtime_name = {"cri-o": "crio"}.get(runtime.runtime or "", runtime.runtime or "containerd")
    return NodeCheck("nvidia-container-toolkit", WARN, f"{label} but {config} has no nvidia runtime (pods would fail "
                                                       f"with 'no runtime for \"nvidia\" is configured'): run "
                                                       f"`nvidia-ctk runtime configure --runtime={runtime_name} "
                                                       f"--config={config}` and restart {runtime_name}, or let the "
                                                       f"gpu-operator's toolkit configure it", data)


def _honours_envvar(sections, text, data: dict) -> str:
    """Where the host's toolkit is the one GPU pods run with (gpu-bootstrap leaves it alone): does it hand an
    unprivileged container the GPUs its NVIDIA_VISIBLE_DEVICES names? What to fix, or "" when it does not. Not read
    (an older probe, a failed section) is unknown, never safe."""
    section = sections.get("toolkit-config")
    if section is None or not section.ok:
        data["envvar_when_unprivileged"] = None
        return (f"whether it hands unprivileged containers the GPUs NVIDIA_VISIBLE_DEVICES names is unknown (its "
                f"config was not read): check {parse.ENVVAR_KEY} in {script.TOOLKIT_CONFIGS[0]}")
    path, honours = parse.envvar_when_unprivileged(text("toolkit-config"))
    data["envvar_when_unprivileged"] = {"file": path, "key": parse.ENVVAR_KEY, "honoured": honours}
    if path is None:
        return (f"whether it hands unprivileged containers the GPUs NVIDIA_VISIBLE_DEVICES names is unknown (no "
                f"toolkit config at {' or '.join(script.TOOLKIT_CONFIGS)}): check {parse.ENVVAR_KEY} where its "
                f"runtime reads its config")
    if not honours:
        return ""
    return (f"it hands any unprivileged container the GPUs its NVIDIA_VISIBLE_DEVICES names, asked for or not: "
            f"{path} has {parse.ENVVAR_KEY} = true (the default when unset); set it false (and the device plugin's "
            f"DEVICE_LIST_STRATEGY to volume-mounts with accept-nvidia-visible-devices-as-volume-mounts = true, or "
            f"use CDI), or let the gpu-operator install the toolkit (docs/security.md)")


AMI_NAMES = {"al2023": "the EKS AL2023 NVIDIA AMI", "bottlerocket": "Bottlerocket's NVIDIA variant"}


def from_pool(name: str, pool: str, ami_family: str) -> NodeReport:
    """A node launched from one of our Karpenter pools, not reachable over SSH: its facts are what its image ships
    (driver, containerd with the NVIDIA runtime as default), taken from the pool's definition, and say so. They are
    known facts of another origin, never "absent"."""
    image = AMI_NAMES[ami_family]
    origin = {"source": f"pool definition ({pool}, {ami_family})", "pool": pool}
    return NodeReport(name, [
        NodeCheck("ssh", SKIP, f"not probed over SSH: launched by Karpenter pool {pool}; facts from the pool "
                               f"definition ({image})", origin),
        NodeCheck("nvidia-driver", PASS, f"driver ships with {image} (pool {pool})",
                  {**origin, "driver_version": f"from {image}", "gpus": []}),
        NodeCheck("nouveau", PASS, f"not loaded ({image})", {**origin, "loaded": False}),
        NodeCheck("container-runtime", PASS, f"containerd ({image})", {
            **origin, "runtime": "containerd", "version": None, "config_path": "/etc/containerd/config.toml",
            "socket": "/run/containerd/containerd.sock", "distribution": "standard"}),
        NodeCheck("nvidia-container-toolkit", PASS, f"NVIDIA runtime is containerd's default ({image})", {
            **origin, "installed": True, "version": None, "runtime_configured": True, "default_runtime": True}),
    ])
