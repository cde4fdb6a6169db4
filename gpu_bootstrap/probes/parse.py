"""Pure parsers: the text a node printed -> facts. No I/O, no shell; every value stays data."""
from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from dataclasses import dataclass, field

from gpu_bootstrap.core.objects import deep_merge
from gpu_bootstrap.probes.script import ENVVAR_KEY

VERSION = re.compile(r"v?(\d+\.\d+(?:\.\d+)?(?:[-+.~][0-9A-Za-z.+-]*)?)")


def os_release(text: str) -> dict:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[A-Z_]+", key):
            values[key] = value.strip().strip('"').strip("'")
    return values


def gpus_from_query(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=index,name,uuid,memory.total,compute_cap,driver_version --format=csv,noheader,nounits`"""
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 6 or not fields[0].isdigit():
            continue
        index, name, uuid, memory, capability, driver = fields[:6]
        gpus.append({"index": int(index), "name": name, "uuid": uuid,
                     "memory_mib": int(memory) if memory.isdigit() else None,
                     "compute_capability": capability if re.fullmatch(r"\d+\.\d+", capability) else None,
                     "driver_version": driver})
    return gpus


def nvsmi_header(text: str) -> dict:
    """`nvidia-smi -q` header: Driver Version and CUDA Version."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if sep and key == "Driver Version":
            out["driver_version"] = value
        elif sep and key == "CUDA Version" and re.fullmatch(r"\d+\.\d+", value):
            out["cuda_version"] = value
    return out


def proc_driver_version(text: str) -> dict | None:
    """/proc/driver/nvidia/version, proprietary ("Kernel Module  550.54.15  ...") or open
    ("Open Kernel Module for x86_64  565.57.01  Release Build ...")."""
    match = re.search(r"NVRM version: NVIDIA UNIX (Open )?(?:.*?)Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)",
                      text)
    if not match:
        return None
    return {"driver_version": match.group(2), "open_kernel_module": bool(match.group(1))}


def loaded_modules(text: str) -> set[str]:
    return {line.split()[0] for line in text.splitlines() if line.strip()}


def nvidia_device_count(text: str) -> int:
    return sum(1 for name in text.split() if re.fullmatch(r"nvidia\d+", name))


def first_version(text: str) -> str | None:
    match = VERSION.search(text or "")
    return match.group(1) if match else None


def toolkit_version(text: str) -> str | None:
    """'NVIDIA Container Toolkit CLI version 1.17.4' / 'NVIDIA Container Runtime version 1.11.0'."""
    match = re.search(r"NVIDIA Container (?:Toolkit CLI|Runtime) version (\S+)", text or "")
    return match.group(1) if match else None


def crio_version(text: str) -> str | None:
    match = re.search(r"crio version (\S+)", text or "") or re.search(r"^Version:\s+(\S+)", text or "", re.M)
    return match.group(1) if match else None


def files(text: str) -> dict[str, str]:
    """`gb_files` output: path -> 'file' | 'socket'."""
    out = {}
    for line in text.splitlines():
        kind, _, path = line.partition(" ")
        if kind in ("file", "socket") and path:
            out[path] = kind
    return out


def dumped_files(text: str, marker: str) -> dict[str, str]:
    """`gb_dump` output: path -> content."""
    out: dict[str, str] = {}
    current = None
    lines: list[str] = []
    prefix = f"{marker} file "
    for line in text.split("\n"):
        if line.startswith(prefix):
            if current is not None:
                out[current] = "\n".join(lines).rstrip("\n")
            current, lines = line[len(prefix):], []
        elif current is not None:
            lines.append(line)
    if current is not None:
        out[current] = "\n".join(lines).rstrip("\n")
    return out


def binary_versions(text: str) -> dict[str, str]:
    """`gb_versions` output: 'path: first line of --version' -> path -> version."""
    out = {}
    for line in text.splitlines():
        path, sep, rest = line.partition(": ")
        if sep and path.startswith("/"):
            version = first_version(rest.split(" ", 2)[-1] if rest.startswith("containerd ") else rest)
            if version:
                out[path] = version
    return out


# --- container runtimes --------------------------------------------------------------------------------------------
DISTRIBUTIONS = {
    # distribution: (containerd config, socket, containerd binary)
    "k3s": ("/var/lib/rancher/k3s/agent/etc/containerd/config.toml", "/run/k3s/containerd/containerd.sock",
            "/var/lib/rancher/k3s/data/current/bin/containerd"),
    "rke2": ("/var/lib/rancher/rke2/agent/etc/containerd/config.toml", "/run/k3s/containerd/containerd.sock",
             "/var/lib/rancher/rke2/bin/containerd"),
    "microk8s": ("/var/snap/microk8s/current/args/containerd-template.toml",
                 "/var/snap/microk8s/common/run/containerd.sock", "/snap/microk8s/current/bin/containerd"),
    "k0s": ("/etc/k0s/containerd.toml", "/run/k0s/containerd.sock", "/var/lib/k0s/bin/containerd"),
    "standard": ("/etc/containerd/config.toml", "/run/containerd/containerd.sock", "/usr/bin/containerd"),
}
CRIO_SOCKETS = ("/var/run/crio/crio.sock", "/run/crio/crio.sock")
CRI_DOCKERD_SOCKETS = ("/var/run/cri-dockerd.sock", "/run/cri-dockerd.sock")


@dataclass
class Runtime:
    runtime: str | None  # containerd | cri-o | docker
    distribution: str = "standard"
    version: str | None = None
    config_path: str | None = None
    socket: str | None = None
    evidence: str = ""
    configs: dict[str, str] = field(default_factory=dict)  # the config and its drop-ins, as dumped


def processes(text: str) -> list[str]:
    """`grep -H` over /proc/*/cmdline: '/proc/N/cmdline:arg arg ...' -> the command lines."""
    out = []
    for line in text.splitlines():
        _path, sep, args = line.partition("/cmdline:")
        command = (args if sep else line).strip()
        if command:
            out.append(command)
    return out


def _flag(cmdline: str, *names: str) -> str | None:
    for name in names:
        match = re.search(rf"(?:^|\s){re.escape(name)}(?:=|\s+)(\S+)", cmdline)
        if match:
            return match.group(1)
    return None


def detect_runtime(processes: list[str], present: dict[str, str], configs: dict[str, str],
                   versions: dict[str, str]) -> Runtime:
    """Which runtime the kubelet uses and the config file it actually reads: running processes first (the kubelet's
    --container-runtime-endpoint, containerd's --config), then the files each distribution puts in known places."""
    joined = "\n".join(processes)
    endpoint = next((_flag(p, "--container-runtime-endpoint") for p in processes if "kubelet" in p
                     and _flag(p, "--container-runtime-endpoint")), None)
    endpoint = endpoint.removeprefix("unix://") if endpoint else None
    distribution = _distribution(joined, present)
    if (endpoint and "crio" in endpoint) or re.search(r"(^|/)crio(\s|$)", joined, re.M) or (
            not endpoint and any(s in present for s in CRIO_SOCKETS) and distribution == "standard"):
        return _crio(endpoint, present, configs, versions)
    if (endpoint and "dockerd" in endpoint) or "cri-dockerd" in joined:
        return _docker(endpoint, present, configs, versions)
    config_default, socket_default, binary = DISTRIBUTIONS[distribution]
    containerd = next((p for p in processes if re.search(r"(^|/)containerd(\s|$)", p)), "")
    config_path = _flag(containerd, "--config", "-c") or config_default
    if distribution == "microk8s" and config_path.endswith("/containerd.toml"):
        config_path = config_default  # microk8s renders containerd.toml from the template; edits go to the template
    socket = endpoint or (socket_default if socket_default in present else _first(present, "containerd.sock"))
    if not (containerd or socket or config_path in present):
        return Runtime(None, distribution, evidence="no runtime process, socket or config found")
    version = versions.get(binary) or next(iter(versions.values()), None)
    return Runtime("containerd", distribution, version, config_path, socket or socket_default,
                   "process" if containerd else "files", _with_drop_ins(config_path, configs))


def _distribution(joined: str, present: dict[str, str]) -> str:
    for name, pattern in (("k3s", r"(^|/)k3s (server|agent)"), ("rke2", r"(^|/)rke2 (server|agent)"),
                          ("microk8s", r"/snap/microk8s/"), ("k0s", r"(^|/)k0s (worker|controller)")):
        if re.search(pattern, joined, re.M):
            return name
    for name in ("k3s", "rke2", "microk8s", "k0s"):
        if DISTRIBUTIONS[name][0] in present:
            return name
    return "standard"


def _first(present: dict[str, str], suffix: str) -> str | None:
    return next((p for p, kind in present.items() if kind == "socket" and p.endswith(suffix)), None)


def _with_drop_ins(config_path: str, configs: dict[str, str]) -> dict[str, str]:
    selected = {config_path: configs[config_path]} if config_path in configs else {}
    patterns = []
    if config_path in configs:
        try:
            patterns = list(tomllib.loads(configs[config_path]).get("imports") or [])
        except tomllib.TOMLDecodeError:
            patterns = re.findall(r'"([^"]+\*[^"]*)"', configs[config_path])
    if config_path == DISTRIBUTIONS["k0s"][0]:
        patterns.append("/etc/k0s/containerd.d/*.toml")
    for path in sorted(configs):
        if path != config_path and any(fnmatch.fnmatch(path, pattern) for pattern in patterns):
            selected[path] = configs[path]
    return selected


def _crio(endpoint, present, configs, versions) -> Runtime:
    selected = {p: t for p, t in sorted(configs.items()) if p == "/etc/crio/crio.conf" or
                p.startswith("/etc/crio/crio.conf.d/")}
    socket = endpoint or next((s for s in CRIO_SOCKETS if s in present), CRIO_SOCKETS[0])
    return Runtime("cri-o", "standard", versions.get("crio"), "/etc/crio/crio.conf", socket, "crio", selected)


def _docker(endpoint, present, configs, versions) -> Runtime:
    socket = endpoint or next((s for s in CRI_DOCKERD_SOCKETS if s in present), CRI_DOCKERD_SOCKETS[0])
    selected = {p: t for p, t in configs.items() if p == "/etc/docker/daemon.json"}
    return Runtime("docker", "standard", versions.get("docker"), "/etc/docker/daemon.json", socket, "cri-dockerd",
                   selected)


# --- is the NVIDIA runtime configured, and is it the default? ---------------------------------------------------
def nvidia_runtime(runtime: Runtime) -> tuple[bool, bool, str]:
    """(configured, default, detail) for the runtime's merged config."""
    if runtime.runtime == "docker":
        return _docker_nvidia(runtime.configs.get("/etc/docker/daemon.json", ""))
    merged, errors = _merge_toml(runtime.configs)
    if runtime.runtime == "cri-o":
        section = (merged.get("crio") or {}).get("runtime") or {}
        names = [n for n, c in (section.get("runtimes") or {}).items() if _is_nvidia(n, c)]
        default = section.get("default_runtime")
    else:
        section = _containerd_cri(merged)
        names = [n for n, c in (section.get("runtimes") or {}).items() if _is_nvidia(n, c)]
        default = section.get("default_runtime_name")
    if errors and not names:
        return _regex_fallback(runtime.configs, errors)
    detail = f"runtimes: {', '.join(names)}" if names else "no nvidia runtime"
    return bool(names), default in names, detail


def _containerd_cri(merged: dict) -> dict:
    plugins = merged.get("plugins") or {}
    for key in ("io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"):  # containerd 2.x, then 1.x
        section = (plugins.get(key) or {}).get("containerd")
        if section:
            return section
    return {}


def _is_nvidia(name: str, config) -> bool:
    if "nvidia" in name:
        return True
    if not isinstance(config, dict):
        return False
    options = config.get("options") or {}
    return "nvidia" in str(options.get("BinaryName", "")) or "nvidia" in str(config.get("runtime_path", ""))


def _merge_toml(configs: dict[str, str]) -> tuple[dict, list[str]]:
    merged: dict = {}
    errors = []
    for path, text in configs.items():
        try:
            merged = deep_merge(merged, tomllib.loads(text))
        except tomllib.TOMLDecodeError as error:
            errors.append(f"{path}: {error}")
    return merged, errors


def _regex_fallback(configs: dict[str, str], errors: list[str]) -> tuple[bool, bool, str]:
    """Templates (microk8s) may not be valid TOML; look for the table and the default by pattern."""
    text = "\n".join(configs.values())
    names = re.findall(r'runtimes\.["\']?([\w.-]*nvidia[\w.-]*)["\']?\]', text)
    default = re.search(r'default_runtime(?:_name)?\s*=\s*["\']([^"\']+)["\']', text)
    return bool(names), bool(default and default.group(1) in names), f"parsed by pattern ({errors[0]})"


def _docker_nvidia(text: str) -> tuple[bool, bool, str]:
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError as error:
        return False, False, f"daemon.json is not valid JSON: {error}"
    runtimes = data.get("runtimes") or {}
    names = [n for n, c in runtimes.items() if _is_nvidia(n, {"runtime_path": (c or {}).get("path", "")})]
    return bool(names), data.get("default-runtime") in names, f"runtimes: {', '.join(names) or 'none'}"


def envvar_when_unprivileged(text: str) -> tuple[str | None, bool | None]:
    """(the toolkit config the runtime reads, whether it honours NVIDIA_VISIBLE_DEVICES in unprivileged containers)
    from the probe's toolkit-config section: the first config found (a package's /etc one before the operator's),
    its uncommented accept-nvidia-visible-devices-envvar-when-unprivileged, else the toolkit's default, true. No
    config at the known paths: (None, None), unknown (the runtime may read one elsewhere, XDG_CONFIG_HOME)."""
    found: str | None = None
    value: bool | None = None
    for line in text.splitlines():
        if line.startswith("file "):
            if found is not None:
                break  # the first config found is the one that counts
            found = line[5:].strip()
            continue
        setting = re.match(r"^\d+:\s*" + re.escape(ENVVAR_KEY) + r"\s*=\s*(true|false)\b", line)
        if found is not None and setting:
            value = setting[1] == "true"
    if found is None:
        return None, None
    return found, True if value is None else value
