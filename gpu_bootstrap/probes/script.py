"""The commands preflight runs on a node, as one POSIX shell script fed to `sh -s` over a single SSH channel.

Each probe contributes named sections. Nothing from the config or from any node is ever interpolated into the
script: it is a constant apart from a random per-run marker, which also keeps a node's output from forging a
section boundary. Each command runs under a timeout, so one hung tool (nvidia-smi on a wedged GPU, typically)
costs one section, not the node.
"""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

COMMAND_TIMEOUT = 15  # seconds per command on the node, at most (a quarter of ssh.command_timeout when smaller)
MAX_SECTION_BYTES = 65536

CONTAINERD_CONFIGS = (
    "/etc/containerd/config.toml",
    "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
    "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
    "/var/snap/microk8s/current/args/containerd-template.toml",
    "/etc/k0s/containerd.toml",
)
OTHER_CONFIGS = ("/etc/crio/crio.conf", "/etc/docker/daemon.json")
DROP_IN_DIRS = ("/etc/containerd/conf.d", "/etc/crio/crio.conf.d", "/etc/k0s/containerd.d")
SOCKETS = (
    "/run/containerd/containerd.sock", "/run/k3s/containerd/containerd.sock",
    "/var/snap/microk8s/common/run/containerd.sock", "/run/k0s/containerd.sock", "/var/run/crio/crio.sock",
    "/run/crio/crio.sock", "/var/run/cri-dockerd.sock", "/run/cri-dockerd.sock", "/var/run/docker.sock",
)
CONTAINERD_BINARIES = (
    "/usr/bin/containerd", "/usr/local/bin/containerd", "/var/lib/rancher/rke2/bin/containerd",
    "/var/lib/rancher/k3s/data/current/bin/containerd", "/snap/microk8s/current/bin/containerd",
    "/var/lib/k0s/bin/containerd",
)
GPU_QUERY = "index,name,uuid,memory.total,compute_cap,driver_version"
# The NVIDIA container toolkit's config: a package's, then the gpu-operator's own install (its toolkit DaemonSet)
TOOLKIT_CONFIGS = ("/etc/nvidia-container-runtime/config.toml",
                   "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml")
ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"

PRELUDE = r"""
PATH="$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/home/kubernetes/bin/nvidia/bin"
# Bottlerocket's NVIDIA variants keep the driver's tools in a versioned folder (GKE COS: the path above)
for gb_d in /usr/libexec/nvidia/tesla/bin/*/; do [ -d "$gb_d" ] && PATH="$PATH:${gb_d%%/}"; done
export LC_ALL=C
exec 4>&1
# A portable per-command timeout (no coreutils needed; busybox's `timeout` polls once a second). The background
# jobs must not hold fds 3/4 (gb_tool's status pipe), or a straggler would stall the section.
gb_t() {
  "$@" 3>&- 4>&- &
  gb_pid=$!
  ( trap 'kill $gb_sleep 2>/dev/null; exit 0' TERM
    sleep %(timeout)s & gb_sleep=$!; wait $gb_sleep; kill -9 $gb_pid 2>/dev/null ) >/dev/null 2>&1 3>&- 4>&- &
  gb_watch=$!
  wait $gb_pid; gb_status=$?
  kill $gb_watch 2>/dev/null
  return $gb_status
}
gb_begin() { printf '\n%%s begin %%s\n' "$GB_MARK" "$1"; }
gb_end() { printf '\n%%s end %%s %%s\n' "$GB_MARK" "$1" "$2"; }
# gb_read: commands that cannot hang (reading a file, uname): run directly.
gb_read() { gb_name=$1; shift; gb_begin "$gb_name"; "$@" 2>&1; gb_rc=$?; gb_end "$gb_name" "$gb_rc"; }
# gb_tool: tools that can hang or print a lot: under the timeout, output capped, exit status kept.
gb_tool() {
  gb_name=$1; shift
  gb_begin "$gb_name"
  if command -v "$1" >/dev/null 2>&1 || [ -x "$1" ]; then
    gb_rc=$( { { gb_t "$@" 2>&1; echo $? >&3; } | head -c %(limit)s >&4; } 3>&1 )
  else
    echo "command not found: $1"; gb_rc=127
  fi
  gb_end "$gb_name" "$gb_rc"
}
gb_files() {
  for gb_f in "$@"; do
    if [ -S "$gb_f" ]; then echo "socket $gb_f"; elif [ -e "$gb_f" ]; then echo "file $gb_f"; fi
  done
}
gb_dump() {
  for gb_f in "$@"; do
    [ -f "$gb_f" ] || continue
    printf '%%s file %%s\n' "$GB_MARK" "$gb_f"; head -c %(limit)s "$gb_f"; echo
  done
}
# gb_ps: the command lines of the kubelet's and the runtime's processes only, picked by name (comm, which the kernel
# keeps short) in a loop of shell builtins. A node runs thousands of processes (per-CPU kernel threads, a shim for
# each of 110 pods): one process started per pid would be slow, and a grep over /proc/*/cmdline names every path in
# its own command line and matches itself, which outgrew the in-cluster probe's output budget. At most 32 lines of
# 4 KiB each.
gb_ps() {
  gb_n=0
  for gb_p in /proc/[0-9]*; do
    gb_c=
    read -r gb_c < "$gb_p/comm" || continue
    case $gb_c in
      kubelet|kubelite|containerd|crio|dockerd|cri-dockerd|k3s|k3s-*|rke2|rke2-*|k0s) ;;
      *) continue ;;
    esac
    gb_n=$((gb_n + 1)); [ "$gb_n" -gt 32 ] && break
    printf '%%s/cmdline:' "$gb_p"; tr '\0' ' ' < "$gb_p/cmdline" | head -c 4096; echo
  done 2>/dev/null
}
# gb_named_configs: the config files running containerd and CRI-O processes name (--config PATH, --config=PATH,
# -c PATH), dumped like the known ones, so a runtime started with a config of its own is read, not taken for one
# without the nvidia runtime. A path read from /proc is data: it is only read, never run (set -f: no globbing).
gb_named_configs() {
  for gb_p in /proc/[0-9]*; do
    gb_c=
    read -r gb_c < "$gb_p/comm" || continue
    case $gb_c in containerd|crio) ;; *) continue ;; esac
    gb_next=
    set -f
    for gb_a in $(tr '\0' ' ' < "$gb_p/cmdline" | head -c 4096); do
      if [ -n "$gb_next" ]; then gb_dump "$gb_a"; gb_next=; continue; fi
      case $gb_a in
        --config|-c) gb_next=1 ;;
        --config=*) gb_dump "${gb_a#--config=}" ;;
      esac
    done
    set +f
  done 2>/dev/null
}
gb_nvsmi_q() { nvidia-smi -q | head -n 12; }
# gb_toolkit_config: of each toolkit config that exists, its name and the lines naming the device-access keys only
# (the whole file would cost the in-cluster probe's output budget)
gb_toolkit_config() {
  for gb_f in "$@"; do
    [ -f "$gb_f" ] || continue
    printf 'file %%s\n' "$gb_f"; grep -n 'accept-nvidia-visible-devices' "$gb_f" | head -n 8
  done
}
gb_versions() {
  for gb_f in "$@"; do [ -x "$gb_f" ] && printf '%%s: ' "$gb_f" && gb_t "$gb_f" --version 2>&1 | head -n 1; done
}
"""

# (section name, command line) in the order they run. Each command is a fixed string.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("os-release", "gb_read os-release head -c %(limit)s /etc/os-release"),
    ("kernel", "gb_read kernel cat /proc/sys/kernel/osrelease"),
    ("arch", "gb_read arch uname -m"),
    ("id", "gb_read id id -u"),
    ("nvidia-smi-query", f"gb_tool nvidia-smi-query nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits"),
    # after a hung query, asking nvidia-smi again would only wait out another timeout
    ("nvidia-smi-q", 'if [ "${gb_rc:-0}" -ne 137 ]; then gb_tool nvidia-smi-q gb_nvsmi_q; fi'),
    ("proc-driver-version", "gb_read proc-driver-version cat /proc/driver/nvidia/version"),
    ("dev-nvidia", "gb_read dev-nvidia ls /dev"),
    ("modules", "gb_read modules cat /proc/modules"),
    ("processes", "gb_read processes gb_ps"),
    ("runtime-files", "gb_read runtime-files gb_files " + " ".join(CONTAINERD_CONFIGS + OTHER_CONFIGS + SOCKETS)),
    ("runtime-configs", "gb_read runtime-configs gb_dump " + " ".join(
        CONTAINERD_CONFIGS + OTHER_CONFIGS + tuple(f"{d}/*" for d in DROP_IN_DIRS))),
    ("runtime-named-configs", "gb_read runtime-named-configs gb_named_configs"),
    ("containerd-version", "gb_read containerd-version gb_versions " + " ".join(CONTAINERD_BINARIES)),
    ("crio-version", "gb_tool crio-version crio --version"),
    ("docker-version", "gb_tool docker-version docker version --format '{{.Server.Version}}'"),
    ("k3s-version", "gb_tool k3s-version k3s --version"),
    ("rke2-version", "gb_tool rke2-version rke2 --version"),
    ("k0s-version", "gb_tool k0s-version k0s version"),
    ("nvidia-ctk-version", "gb_tool nvidia-ctk-version nvidia-ctk --version"),
    ("nvidia-container-runtime-version", "gb_tool nvidia-container-runtime-version nvidia-container-runtime --version"),
    ("toolkit-config", "gb_read toolkit-config gb_toolkit_config " + " ".join(TOOLKIT_CONFIGS)),
)


@dataclass(frozen=True)
class Section:
    name: str
    output: str
    rc: int | None  # None: the section never finished (the node or connection died mid-script)

    @property
    def missing(self) -> bool:
        return self.rc == 127 and self.output.startswith("command not found")

    @property
    def timed_out(self) -> bool:
        return self.rc in (124, 137, 143)

    @property
    def ok(self) -> bool:
        return self.rc == 0


def new_marker() -> str:
    return f"@@gpu-bootstrap-{secrets.token_hex(8)}@@"


def command_timeout(session_timeout: float) -> int:
    return int(max(2, min(COMMAND_TIMEOUT, session_timeout / 4)))


def build(marker: str, timeout: int = COMMAND_TIMEOUT) -> str:
    """The complete script: the marker and the timeout are its only variable parts, both generated here."""
    if not re.fullmatch(r"@@gpu-bootstrap-[0-9a-f]{16}@@", marker) or not isinstance(timeout, int):
        raise ValueError("invalid marker or timeout")
    values = {"timeout": timeout, "limit": MAX_SECTION_BYTES}
    prelude = PRELUDE % values
    body = "\n".join(command.replace("%(limit)s", str(MAX_SECTION_BYTES)) for _name, command in SECTIONS)
    return f"GB_MARK='{marker}'\n{prelude}\n{body}\nexit 0\n"


def split(output: str, marker: str) -> dict[str, Section]:
    """Cut the script's output into sections by the marker; text outside sections is ignored."""
    sections: dict[str, Section] = {}
    begin = re.compile(re.escape(marker) + r" begin ([a-z0-9-]+)\n")
    end_template = re.escape(marker) + r" end {name} (\d+)\n?"
    position = 0
    while True:
        match = begin.search(output, position)
        if match is None:
            return sections
        name = match.group(1)
        end = re.compile("\n" + end_template.format(name=re.escape(name))).search(output, match.end() - 1)
        if end is None:
            sections[name] = Section(name, output[match.end():].rstrip("\n"), None)
            return sections
        sections[name] = Section(name, output[match.end():end.start()], int(end.group(1)))
        position = end.end()
