"""Realistic GPU "nodes" for tests: one real OpenSSH sshd per node on 127.0.0.1, each chrooted (ChrootDirectory)
into its own file tree built from busybox-static plus the files and tools a scenario puts there.

sshd insists that every component of a chroot path is root-owned and not writable by others, so the trees live
under /var/lib/gpu-bootstrap-test-nodes (or $GPU_BOOTSTRAP_NODE_ROOT) and this needs root.
"""
from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.tools import missing, tool

DEFAULT_BASE = Path(os.environ.get("GPU_BOOTSTRAP_NODE_ROOT", "/var/lib/gpu-bootstrap-test-nodes"))
SSHD_CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
PidFile {folder}/sshd.pid
AuthorizedKeysFile {authorized_keys}
AllowUsers root nobody
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
ChrootDirectory {chroot}
LogLevel INFO
MaxStartups 200:30:400
MaxSessions 50
"""
# The login shell: logs every session (so tests can see whether anything ran), then is busybox sh.
SHELL_WRAPPER = "#!/bin/sh\necho \"session $*\" >> /tmp/sessions.log\nexec /bin/busybox sh \"$@\"\n"


class Tree:
    """Writes a node's file tree. Paths are absolute as seen on the node."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, node_path: str) -> Path:
        return self.root / node_path.lstrip("/")

    def file(self, node_path: str, text: str, mode: int = 0o644) -> None:
        target = self.path(node_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)

    def exe(self, node_path: str, body: str) -> None:
        self.file(node_path, "#!/bin/sh\n" + body, 0o755)

    def fake_tool(self, node_path: str, responses: dict) -> None:
        """A stand-in tool printing recorded outputs. responses: {argument substring or None (any): (output, rc)};
        the outputs are files, so nothing in them is ever shell syntax."""
        data = f"/usr/share/gb-fake{node_path}"
        cases = []
        ordered = sorted(responses.items(), key=lambda item: item[0] is None)  # the catch-all goes last
        for index, (pattern, (output, rc)) in enumerate(ordered):
            self.file(f"{data}/{index}", output)
            match = f"*{pattern}*" if pattern is not None else "*"
            cases.append(f"  {match}) cat {data}/{index}; exit {rc};;")
        if None not in responses:
            cases.append('  *) echo "unexpected arguments: $*" >&2; exit 2;;')
        self.exe(node_path, 'case "$*" in\n' + "\n".join(cases) + "\nesac\n")

    def socket(self, node_path: str) -> None:
        target = self.path(node_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            target.unlink()
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(target))

    def process(self, pid: int, argv: list[str], comm: str | None = None) -> None:
        """/proc/PID as the kernel shows it: cmdline (NUL-separated) and comm (the executable's name, 15 bytes at
        most, unless the process renamed itself: `comm`)."""
        self.file(f"/proc/{pid}/cmdline", "\0".join(argv) + "\0")
        self.file(f"/proc/{pid}/comm", (comm or argv[0].rsplit("/", 1)[-1])[:15] + "\n")

    def device(self, node_path: str) -> None:
        target = self.path(node_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()


@dataclass
class FakeNode:
    name: str
    port: int
    root: Path
    host_public_key: str  # "ssh-ed25519 AAAA..."
    process: subprocess.Popen
    folder: Path

    @property
    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_public_key}"

    def sessions(self) -> list[str]:
        """Every login-shell start on this node (what ran, as the shell saw it)."""
        log = self.root / "tmp" / "sessions.log"
        return log.read_text().splitlines() if log.exists() else []

    def connections(self) -> int:
        """Accepted SSH connections, from sshd's own log."""
        return (self.folder / "sshd.log").read_text(errors="replace").count("Accepted publickey")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class NodeFarm:
    def __init__(self, base: Path = DEFAULT_BASE):
        if os.geteuid() != 0:
            missing("the SSH node harness needs root (sshd ChrootDirectory)")
        self.sshd = tool("sshd")
        self.busybox = tool("busybox")
        self.keygen = tool("ssh-keygen")
        base.mkdir(parents=True, exist_ok=True, mode=0o755)
        base.chmod(0o755)
        self.base = base / uuid.uuid4().hex[:10]
        self.base.mkdir(mode=0o755)
        self.keys = Path(tempfile.mkdtemp(prefix="gb-ssh-keys-"))
        self.client_key = self.keys / "id_ed25519"
        self._keygen(self.client_key)
        self.authorized_keys = self.base / "authorized_keys"
        self.authorized_keys.write_text(self.client_key.with_suffix(".pub").read_text())
        self.authorized_keys.chmod(0o644)
        self.applets = subprocess.run([self.busybox, "--list"], capture_output=True, text=True,
                                      check=True).stdout.split()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self.nodes: dict[str, FakeNode] = {}

    def _keygen(self, path: Path) -> None:
        subprocess.run([self.keygen, "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True)

    # --- trees -------------------------------------------------------------------------------------------------------
    def _base_tree(self, root: Path) -> Tree:
        tree = Tree(root)
        for folder in ("bin", "usr/bin", "usr/sbin", "usr/local/bin", "etc", "proc", "dev", "run", "var/run", "root"):
            (root / folder).mkdir(parents=True, exist_ok=True, mode=0o755)
        busybox = root / "bin" / "busybox"
        try:
            os.link(self.busybox, busybox)
        except OSError:
            shutil.copy2(self.busybox, busybox)
        for applet in self.applets:
            link = root / "bin" / applet
            if not link.exists():
                link.symlink_to("busybox")
        tree.file("/bin/bash", SHELL_WRAPPER, 0o755)  # root's login shell
        tree.file("/usr/sbin/nologin", SHELL_WRAPPER, 0o755)  # nobody's login shell
        tree.file("/etc/passwd", "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/:/usr/sbin/nologin\n")
        tree.file("/etc/group", "root:x:0:\nnogroup:x:65534:\n")
        (root / "tmp").mkdir(mode=0o1777, exist_ok=True)
        (root / "tmp").chmod(0o1777)
        null = root / "dev" / "null"
        if not null.exists():
            os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        null.chmod(0o666)
        return tree

    # --- nodes ---------------------------------------------------------------------------------------------------------
    def add(self, name: str, scenario) -> FakeNode:
        folder = self.base / name
        chroot = folder / "root"
        chroot.mkdir(parents=True, mode=0o755)
        folder.chmod(0o755)
        scenario(self._base_tree(chroot))
        host_key = folder / "ssh_host_ed25519_key"
        self._keygen(host_key)
        public = " ".join(host_key.with_suffix(".pub").read_text().split()[:2])
        for _attempt in range(5):
            port = _free_port()
            config = folder / "sshd_config"
            config.write_text(SSHD_CONFIG.format(port=port, host_key=host_key, folder=folder, chroot=chroot,
                                                 authorized_keys=self.authorized_keys))
            log = (folder / "sshd.log").open("wb")
            process = subprocess.Popen([self.sshd, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL,
                                       stderr=log)
            if self._wait_ready(port, process):
                node = FakeNode(name, port, chroot, public, process, folder)
                self.nodes[name] = node
                return node
            process.kill()
        raise RuntimeError(f"sshd for {name} did not start: {(folder / 'sshd.log').read_text()[:500]}")

    @staticmethod
    def _wait_ready(port: int, process: subprocess.Popen, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                    if sock.recv(64).startswith(b"SSH-2.0"):
                        return True
            except OSError:
                time.sleep(0.02)
        return False

    def stop_node(self, name: str) -> None:
        node = self.nodes[name]
        node.process.terminate()
        node.process.wait(timeout=5)

    def known_hosts(self, path: Path, names: list[str] | None = None) -> Path:
        lines = [self.nodes[n].known_hosts_line for n in (names or list(self.nodes))]
        path.write_text("\n".join(lines) + "\n")
        return path

    def config_yaml(self, path: Path, known_hosts: Path, names: list[str] | None = None, user: str = "root",
                    extra: str = "", kubeconfig: Path | None = None, policy: str = "strict",
                    command_timeout: float = 20, connect_timeout: float = 5) -> Path:
        """A gpu-bootstrap.yaml pointing at these nodes."""
        lines = []
        if kubeconfig:
            lines += ["cluster:", f"  kubeconfig: {kubeconfig}"]
        lines += ["ssh:", f"  user: {user}", f"  identity_file: {self.client_key}", f"  known_hosts: {known_hosts}",
                  f"  host_key_policy: {policy}", f"  command_timeout: {command_timeout}",
                  f"  connect_timeout: {connect_timeout}", "nodes:"]
        for name in names or list(self.nodes):
            lines += [f"  - name: {name}", "    address: 127.0.0.1", f"    port: {self.nodes[name].port}"]
        path.write_text("\n".join(lines) + "\n" + extra)
        return path

    def close(self) -> None:
        for node in self.nodes.values():
            if node.process.poll() is None:
                node.process.terminate()
        for node in self.nodes.values():
            try:
                node.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                node.process.kill()
        shutil.rmtree(self.base, ignore_errors=True)
        shutil.rmtree(self.keys, ignore_errors=True)
