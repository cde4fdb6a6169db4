"""The SSH adapter (paramiko): key authentication, verified host keys, timeouts, and bounded parallel fan-out.

Host keys: `strict` (default) refuses a node whose key is not in known_hosts; `accept-new` records an unknown key
(the first time only) but, like OpenSSH, never accepts a key that differs from the recorded one. Commands are
argument lists joined with shlex.quote; scripts travel on stdin, so no value ever becomes remote shell syntax.
"""
from __future__ import annotations

import base64
import hashlib
import logging
import shlex
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gpu_bootstrap.ssh")
READ_CHUNK = 65536


class SshFailure(Exception):
    """Why we could not run a command on a node, in one line that says what to do."""


@dataclass(frozen=True)
class Host:
    """Where and as whom to reach one node over SSH."""

    name: str
    host: str
    port: int
    user: str
    identity_file: Path | None

    @property
    def known_hosts_name(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str


def fingerprint(key) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class Ssh:
    def __init__(self, ssh_config, nodes):
        self.config = ssh_config
        self.targets = {n.name: Host(n.name, n.ssh_address, n.port or ssh_config.port, n.user or ssh_config.user,
                                       n.identity_file or ssh_config.identity_file) for n in nodes}
        self._clients: dict[str, object] = {}
        self._lock = threading.Lock()
        self._known_hosts_lock = threading.Lock()
        self._known: object | None = None  # known_hosts, parsed once for every connection

    # --- connections -------------------------------------------------------------------------------------------------
    def _client(self, target: Host):
        with self._lock:
            client = self._clients.get(target.name)
        if client is not None and client.get_transport() is not None and client.get_transport().is_active():
            return client
        client = self._connect(target)
        with self._lock:
            self._clients[target.name] = client
        return client

    def _known_hosts(self):
        """known_hosts parsed once per run: with many nodes, parsing the whole file for every connection costs more
        CPU than the connections themselves."""
        paramiko = import_paramiko()
        with self._known_hosts_lock:
            if self._known is None:
                known_hosts, keys = Path(self.config.known_hosts), paramiko.HostKeys()
                if known_hosts.exists():
                    try:
                        keys.load(str(known_hosts))
                    except (OSError, paramiko.SSHException) as error:
                        raise SshFailure(f"cannot read known_hosts {known_hosts}: {error}") from None
                self._known = keys
            return self._known

    def _connect(self, target: Host):
        paramiko = import_paramiko()

        client = paramiko.SSHClient()
        known_hosts = Path(self.config.known_hosts)
        for key_type, key in (self._known_hosts().lookup(target.known_hosts_name) or {}).items():
            client.get_host_keys().add(target.known_hosts_name, key_type, key)
        client.set_missing_host_key_policy(self._policy(target))
        key_file = Path(target.identity_file) if target.identity_file else None
        timeout = self.config.connect_timeout
        try:
            client.connect(target.host, target.port, username=target.user,
                           key_filename=str(key_file) if key_file and key_file.exists() else None,
                           timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
                           allow_agent=True, look_for_keys=False)
        except paramiko.BadHostKeyException as error:
            client.close()
            raise SshFailure(self._changed_key_message(target, error)) from None
        except paramiko.AuthenticationException:
            client.close()
            where = f"{key_file}" if key_file and key_file.exists() else f"{key_file} (missing) or the ssh agent"
            raise SshFailure(f"authentication refused for {target.user}@{target.known_hosts_name} with {where}: check "
                             f"ssh.identity_file / the node's identity_file and the node's authorized_keys") from None
        except paramiko.SSHException as error:
            client.close()
            raise SshFailure(self._ssh_error(target, error, known_hosts)) from None
        except (socket.timeout, TimeoutError):
            client.close()
            raise SshFailure(f"connection to {target.known_hosts_name} timed out after {timeout:g}s: is the address "
                             f"right and port {target.port} reachable from here?") from None
        except (ConnectionRefusedError, paramiko.ssh_exception.NoValidConnectionsError):
            client.close()
            raise SshFailure(f"connection refused by {target.known_hosts_name}: is sshd running and listening on port "
                             f"{target.port}?") from None
        except socket.gaierror:
            client.close()
            raise SshFailure(f"cannot resolve host {target.host!r}: set nodes[].address for {target.name}") from None
        except OSError as error:
            client.close()
            raise SshFailure(f"cannot connect to {target.known_hosts_name}: {error}") from None
        return client

    def _policy(self, target: Host):
        paramiko = import_paramiko()

        adapter = self

        class Strict(paramiko.MissingHostKeyPolicy):
            def missing_host_key(self, client, hostname, key):
                raise paramiko.SSHException(f"unknown host key {key.get_name()} {fingerprint(key)}")

        class AcceptNew(paramiko.MissingHostKeyPolicy):
            def missing_host_key(self, client, hostname, key):
                adapter._record_host_key(hostname, key)

        return AcceptNew() if self.config.host_key_policy == "accept-new" else Strict()

    def _record_host_key(self, hostname: str, key) -> None:
        path = Path(self.config.known_hosts)
        with self._known_hosts_lock:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with path.open("a") as handle:
                handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        log.warning("recorded the host key of %s (%s) in %s (host_key_policy: accept-new)", hostname,
                    fingerprint(key), path)

    def _changed_key_message(self, target: Host, error) -> str:
        name = target.known_hosts_name
        return (f"HOST KEY CHANGED for {name}: {self.config.known_hosts} has {fingerprint(error.expected_key)}, the "
                f"node offers {fingerprint(error.key)}; nothing was run. If the node was reinstalled, confirm the new "
                f"key out of band, then: ssh-keygen -R '{name}' -f {self.config.known_hosts}")

    def _ssh_error(self, target: Host, error, known_hosts: Path) -> str:
        text = str(error)
        if text.startswith("unknown host key"):
            return (f"{target.known_hosts_name} is not in {known_hosts} ({text.split(' ', 3)[-1]}): check the "
                    f"fingerprint on the node, then add it (ssh-keyscan -p {target.port} {target.host} >> "
                    f"{known_hosts}), or set ssh.host_key_policy: accept-new")
        if "No authentication methods available" in text:
            return (f"no SSH key for {target.user}@{target.known_hosts_name}: {target.identity_file} does not exist "
                    f"and no ssh agent is running; set ssh.identity_file")
        return f"SSH to {target.known_hosts_name} failed: {text}"

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    # --- commands -----------------------------------------------------------------------------------------------------
    def run(self, target: Host, argv: list[str], stdin: str | None = None, timeout: float | None = None) -> Result:
        """Run an argument list (each argument quoted) and return its exit code and output."""
        command = " ".join(shlex.quote(arg) for arg in argv)
        timeout = timeout or self.config.command_timeout
        client = self._client(target)
        try:
            channel = client.get_transport().open_session(timeout=self.config.connect_timeout)
        except Exception as error:  # noqa: BLE001 - paramiko raises several types for a dead transport
            raise SshFailure(f"cannot open a session on {target.known_hosts_name}: {error}") from None
        try:
            channel.exec_command(command)
            try:
                if stdin is not None:
                    channel.sendall(stdin.encode())
                channel.shutdown_write()
            except OSError:
                # The command ended without reading all its input (sudo -n refusing at once): the channel closed
                # under the write. Its output and exit status are what count, and they are still to be read.
                if not channel.closed:
                    raise
            return self._collect(channel, target, timeout)
        finally:
            channel.close()

    def _collect(self, channel, target: Host, timeout: float) -> Result:
        """Read until EOF and the exit status, blocking on the channel (no polling), within the deadline."""
        deadline = time.monotonic() + timeout
        out, err = bytearray(), bytearray()

        def expired():
            return SshFailure(f"the command on {target.known_hosts_name} did not finish within {timeout:g}s "
                              f"(ssh.command_timeout); it was abandoned")

        while True:
            channel.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                chunk = channel.recv(READ_CHUNK)
            except socket.timeout:
                raise expired() from None
            if not chunk:
                break
            out += chunk
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(READ_CHUNK)
        if not channel.status_event.wait(max(deadline - time.monotonic(), 0.001)):
            raise expired()
        while channel.recv_stderr_ready():
            err += channel.recv_stderr(READ_CHUNK)
        return Result(channel.recv_exit_status(), out.decode(errors="replace"), err.decode(errors="replace"))

    def run_script(self, target: Host, script: str) -> tuple[Result, str]:
        """Run a POSIX shell script as root (sudo -n for other users). Returns the result and a note when it had
        to run without root."""
        if target.user == "root":
            return self.run(target, ["sh", "-s"], script), ""
        result = self.run(target, ["sudo", "-n", "--", "sh", "-s"], script)
        if result.rc != 0 and "password is required" in result.stderr + result.stdout:
            note = (f"sudo -n needs a password for {target.user}, so the checks ran without root and may miss files; "
                    f"allow passwordless sudo for {target.user} or use root")
            return self.run(target, ["sh", "-s"], script), note
        return result, ""

    def fan_out(self, work, names: list[str] | None = None) -> dict[str, object]:
        """work(target) for every target, at most ssh.parallelism at once; returns name -> result or SshFailure."""
        targets = [self.targets[n] for n in (names or list(self.targets))]
        results: dict[str, object] = {}

        def one(target: Host):
            try:
                return target.name, work(target)
            except SshFailure as failure:
                return target.name, failure

        workers = max(1, min(self.config.parallelism, len(targets)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ssh") as pool:
            for name, outcome in pool.map(one, targets):
                results[name] = outcome
        return results


def import_paramiko():
    """paramiko, without its optional `invoke` (used only for ssh_config `Match exec`, which we never read): importing
    invoke costs about a third of paramiko's start-up."""
    import sys
    if "paramiko" not in sys.modules:
        sys.modules.setdefault("invoke", None)  # None in sys.modules: `import invoke` raises ImportError
    import paramiko
    return paramiko


def quiet_paramiko() -> None:
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
