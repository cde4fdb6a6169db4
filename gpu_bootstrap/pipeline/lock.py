"""One run at a time: a coordination.k8s.io/v1 Lease held while a run changes the cluster.

A second run refuses, naming the holder and since when. A holder that stopped renewing for longer than the lease
duration is gone and its lease is taken over; so is one from this host whose process no longer exists (a run
killed with SIGKILL). `--force-unlock` takes the lease whatever its state.
"""
from __future__ import annotations

import getpass
import logging
import os
import socket
import threading
import uuid

from gpu_bootstrap.core.errors import Conflict, LockHeld, LockLost
from gpu_bootstrap.core.objects import lease_fresh, micro_time, pin_resource_version
from gpu_bootstrap.pipeline.checkpoint import NAMESPACE

log = logging.getLogger("gpu_bootstrap.lock")
LEASE = "gpu-bootstrap-lock"
DURATION = 60


def identity() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()} pid={os.getpid()} run={uuid.uuid4().hex[:8]}"


def _holder_process_gone(holder: str) -> bool:
    """True when the holder ran on this host and its process no longer exists."""
    try:
        who, rest = holder.split("@", 1)
        host, pid_part = rest.split(" pid=", 1)
        pid = int(pid_part.split()[0])
    except (ValueError, IndexError):
        return False
    if host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Lock:
    def __init__(self, kube, duration: int = DURATION, holder: str | None = None):
        self.kube = kube
        self.duration = duration
        self.holder = holder or identity()
        self._lease: dict | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.lost: str | None = None
        self.took_over: str | None = None

    # --- acquire / release ---------------------------------------------------------------------------------------
    def acquire(self, force: bool = False) -> None:
        for _attempt in range(5):
            current = self.kube.get("coordination.k8s.io/v1", "Lease", LEASE, NAMESPACE)
            try:
                if current is None:
                    self._lease = self.kube.create(self._manifest(None))
                else:
                    self._take(current, force)
                break
            except Conflict:
                continue  # someone raced us between read and write; look again
        else:
            raise LockHeld("another run (racing)", "now", f"{NAMESPACE}/{LEASE}")
        self._renewer = threading.Thread(target=self._renew_loop, name="lease-renewer", daemon=True)
        self._renewer.start()

    def inspect(self, force: bool = False) -> str:
        """Read-only look at the lease: "free", or "stale" (a holder that is gone). Raises LockHeld when a live
        run holds it, unless forced."""
        current = self.kube.get("coordination.k8s.io/v1", "Lease", LEASE, NAMESPACE)
        spec = (current or {}).get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if not holder:
            return "free"
        if force or self._expired(spec) or _holder_process_gone(holder):
            return "stale"
        raise LockHeld(holder, spec.get("acquireTime") or spec.get("renewTime") or "unknown", f"{NAMESPACE}/{LEASE}")

    def _take(self, current: dict, force: bool) -> None:
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if holder and not force and not self._expired(spec) and not _holder_process_gone(holder):
            raise LockHeld(holder, spec.get("acquireTime") or spec.get("renewTime") or "unknown",
                           f"{NAMESPACE}/{LEASE}")
        if holder:
            self.took_over = holder
            log.warning("taking over the lock from %s", holder)
        self._lease = self.kube.update(self._manifest(current))

    def _expired(self, spec: dict) -> bool:
        return not lease_fresh(spec, self.duration)

    def _manifest(self, current: dict | None) -> dict:
        stamp = micro_time()
        spec = {"holderIdentity": self.holder, "leaseDurationSeconds": self.duration, "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": ((current or {}).get("spec") or {}).get("leaseTransitions", 0) + (1 if current else 0)}
        metadata = {"name": LEASE, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/managed-by": "gpu-bootstrap"}}
        return pin_resource_version({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
                                     "spec": spec}, current)

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        if self._lease is None or self.lost:
            return
        body = dict(self._lease)
        body["spec"] = {**body["spec"], "holderIdentity": None, "renewTime": micro_time()}
        try:
            self.kube.update(body)
        except Conflict:
            pass  # someone took it over meanwhile; nothing of ours to release
        self._lease = None

    # --- renewal ------------------------------------------------------------------------------------------------------
    def _renew_loop(self) -> None:
        while not self._stop.wait(self.duration / 3):
            try:
                self.renew()
            except Exception as error:  # noqa: BLE001 - renewal problems surface through `lost` or the next call
                log.warning("could not renew the lock: %s", error)

    def renew(self) -> None:
        body = dict(self._lease)
        body["spec"] = {**body["spec"], "renewTime": micro_time()}
        try:
            self._lease = self.kube.update(body)
        except Conflict:
            current = self.kube.get("coordination.k8s.io/v1", "Lease", LEASE, NAMESPACE) or {}
            holder = (current.get("spec") or {}).get("holderIdentity") or "nobody"
            if holder != self.holder:
                self.lost = holder
                return
            self._lease = current

    def check(self) -> None:
        """Raise if another run took the lock over while we worked (called between changes)."""
        if self.lost:
            raise LockLost(self.lost)
