"""Faults on the real control plane (tests/localcluster): what the reliability suite (tests/test_faults_real.py) and
benchmarks/real_faults.py share.

* `RealState`: the cluster as the kill matrix compares it (tests/reliability.py `view`), read from the real API
  server: every listable resource, kept to what a run of ours can touch (our namespaces, objects labelled as ours or
  helm's, every Node). Events, the control plane's own leases and objects in the system namespaces that are not ours
  differ from run to run without anything having gone wrong, so they are not compared.
* `kill`/`restart`: SIGKILL a component of the local cluster and start it again with the same flags (the same ports,
  certificates and data directory), as a process supervisor would after a crash or during a rolling upgrade.
  `kill_pod`: SIGKILL the processes of one pod the agent runs (OPA, the bin-packing scheduler).
* `UpRun`: `gpu-bootstrap up` as a separate process (the way a user or CI runs it), so killing a component of the
  cluster, not the test, is what it meets.
* `wait_for`: poll the API server for the moment a fault is due (a node patched, a helm release pending, the
  admission namespace made).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.kubeapi.emulator import VOLATILE_META
from tests.localcluster import cluster as local
from tests.localcluster.rest import ApiError
from tests.tools import tool_env

OUR_NAMESPACES = ("gpu-bootstrap", "gpu-operator", "gpu-bootstrap-admission")
MANAGERS = ("gpu-bootstrap", "Helm")
# Endpoints: the pods' addresses, new in every run (the EndpointSlices beside them are compared by count)
SKIPPED_KINDS = {"/Event", "events.k8s.io/Event", "coordination.k8s.io/Lease", "/ComponentStatus",
                 "authorization.k8s.io/SelfSubjectReview", "/Endpoints"}


def wait_for(check, timeout: float, what, interval: float = 0.05):
    """Poll `check` (errors count as "not yet": the API server may be restarting) until it returns something true.
    `what`: what is awaited, or a function that says it with the state it ended in."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except (ApiError, OSError) as error:
            last, value = error, None
        if value:
            return value
        time.sleep(interval)
    said = what() if callable(what) else what
    raise AssertionError(f"not within {timeout:g} s: {said}" + (f" (last error: {last})" if last else ""))


class RealState:
    """`snapshot()` and `settle()` of the real cluster, for tests/reliability.py's `view` and `converged`."""

    def __init__(self, cluster: local.LocalCluster):
        self.cluster = cluster
        self.api = cluster.admin()

    def resources(self) -> list[tuple[str, str, str, bool]]:
        """(list path, group, kind, namespaced) of every listable resource the server serves."""
        found = []
        core = self.api.get("/api/v1")
        found += [(f"/api/v1/{r['name']}", "", r["kind"], r["namespaced"]) for r in core["resources"]
                  if "/" not in r["name"] and "list" in r.get("verbs", [])]
        for group in self.api.get("/apis")["groups"]:
            version = group["preferredVersion"]["groupVersion"]
            listing = self.api.get(f"/apis/{version}")
            found += [(f"/apis/{version}/{r['name']}", group["name"], r["kind"], r["namespaced"])
                      for r in listing["resources"] if "/" not in r["name"] and "list" in r.get("verbs", [])]
        return found

    def snapshot(self) -> dict:
        out = {}
        for path, group, kind, namespaced in self.resources():
            key_kind = f"{group}/{kind}"
            if key_kind in SKIPPED_KINDS:
                continue
            items = self._list(path)
            for item in items:
                meta = item["metadata"]
                if not self._compared(kind, namespaced, meta):
                    continue
                clean = json.loads(json.dumps(item))
                for key in VOLATILE_META:
                    clean["metadata"].pop(key, None)
                clean.setdefault("kind", kind)
                out[(key_kind, meta.get("namespace", ""), meta["name"])] = clean
        return out

    def _list(self, path: str) -> list[dict]:
        """The items at `path`; [] for a resource gone meanwhile. A new CRD's storage answers 429 for a moment."""
        deadline = time.monotonic() + 30
        while True:
            try:
                return self.api.get(path)["items"]
            except ApiError as error:
                if error.status in (404, 405):
                    return []  # a CRD removed meanwhile, or a resource that cannot be listed after all
                if error.status not in (429, 500, 503) or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    @staticmethod
    def _compared(kind: str, namespaced: bool, meta: dict) -> bool:
        if kind == "Node":
            return True
        labels = meta.get("labels") or {}
        if labels.get("app.kubernetes.io/managed-by") in MANAGERS or labels.get("owner") == "helm":
            return True
        if namespaced and meta.get("namespace") in OUR_NAMESPACES:
            return True
        return kind == "Namespace" and meta["name"] in OUR_NAMESPACES

    def settle(self, timeout: float = 5) -> None:
        time.sleep(min(timeout, 0.5))  # the real controllers settle on their own; converged() polls


# --- components ----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def local_cluster(folder: Path, *, gpu_nodes: int, cpu_nodes: int, dra: bool = False, karpenter: bool = False,
                  keda: bool = False):
    """A local cluster of its own for a module (skipped when it is not built, a failure when it does not start),
    stopped at the end whatever happened. `dra`: GPUs as DRA ResourceSlices (scripts/local-cluster up --dra);
    `karpenter`: the real Karpenter runs too (--karpenter); `keda`: the real KEDA (--keda)."""
    import pytest
    from tests.conftest import local_cluster_wanted
    if not local_cluster_wanted():
        pytest.skip("the local cluster is not built (scripts/install-test-tools); GPU_BOOTSTRAP_LIVE_TARGET=emulator")
    try:
        cluster = local.up(folder / "cluster", gpu_nodes=gpu_nodes, cpu_nodes=cpu_nodes, die_with_parent=True,
                           dra=dra, karpenter=karpenter, keda=keda)
    except local.ClusterError as error:
        pytest.fail(f"the local cluster did not start: {error}")
    try:
        yield cluster
    finally:
        local.down(folder / "cluster")


def kill(cluster: local.LocalCluster, name: str) -> None:
    """SIGKILL one component (its whole process group) and wait until it is gone."""
    pid, _started = cluster.pids[name]
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except ProcessLookupError:
        return
    wait_for(lambda: local.start_time(pid) is None or _zombie(pid), 10, f"{name} ({pid}) to die")


def kill_pod(cluster: local.LocalCluster, namespace: str, pod: str) -> list[int]:
    """SIGKILL every process the agent runs for a pod's containers (found by the root it chroots them into), as a
    crash or an OOM kill would end them; the agent, like a kubelet, starts them again after its back-off."""
    folder = str(cluster.folder / "pods" / f"{namespace}_{pod}") + "/"
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            root = os.readlink(entry / "root")
        except OSError:
            continue
        if root.startswith(folder):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except ProcessLookupError:
                pass
    assert killed, f"no process of pod {namespace}/{pod} runs under {folder}"
    wait_for(lambda: all(local.start_time(pid) is None or _zombie(pid) for pid in killed), 10,
             f"the processes of {namespace}/{pod} to die")
    return killed


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


def restart(cluster: local.LocalCluster, name: str) -> None:
    """Start a killed component again with its own flags, and wait until it answers."""
    tools = local.binaries()
    if name == "kube-apiserver":
        local._start_apiserver(cluster, tools, True, 120)
    elif name == "etcd":
        local._start_etcd(cluster, tools, True)
    else:
        raise ValueError(name)


# --- gpu-bootstrap as its users run it ------------------------------------------------------------------------------
@dataclass
class Ended:
    code: int
    seconds: float
    output: str
    document: dict | None


class UpRun:
    """One gpu-bootstrap command in its own process (JSON output, a log file), started now."""

    def __init__(self, args: list[str], folder: Path, env: dict | None = None):
        self.log = folder / f"run-{time.monotonic_ns()}.log"
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpu_bootstrap", *args, "-o", "json", "--log-file", str(self.log)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env=tool_env(**(env or {})))

    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float) -> Ended:
        try:
            out, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            out, err = self.process.communicate()
            raise AssertionError(f"the run did not end within {timeout:g} s (log: {self.log}):\n{err[-3000:]}")
        document = json.loads(out) if out.strip().startswith("{") else None
        return Ended(self.process.returncode, time.monotonic() - self.started, out + err, document)

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.communicate()


def helm_releases(cluster: local.LocalCluster) -> dict[str, str]:
    """release -> status of every helm release (the latest revision's), read from helm's own Secrets."""
    api = cluster.admin()
    latest: dict[str, tuple[int, str]] = {}
    for secret in api.get("/api/v1/secrets", labelSelector="owner=helm")["items"]:
        labels = secret["metadata"]["labels"]
        key = f"{secret['metadata']['namespace']}/{labels['name']}"
        version = int(labels.get("version", "0"))
        if version >= latest.get(key, (-1, ""))[0]:
            latest[key] = (version, labels.get("status", ""))
    return {key: status for key, (_version, status) in latest.items()}


REPORT_ENV = "GPU_BOOTSTRAP_FAULTS_REPORT"  # benchmarks/real_faults.py sets it: each case appends its row there


def record(fault: str, where: str, seen: str, converged_after: float) -> None:
    """One row of docs/reliability.md's table (fault, where, what the user sees, seconds from the fault until the
    cluster was as an uninterrupted run leaves it), when a report file is asked for."""
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps({"fault": fault, "where": where, "seen": seen,
                              "converged_after": round(converged_after, 1)}) + "\n")
