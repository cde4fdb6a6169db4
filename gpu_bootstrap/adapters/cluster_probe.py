"""Node facts through the cluster: the probe pods' life, from creating their namespace to removing it.

One namespace, one ConfigMap (the script) and one pod per node created (CREATE_WORKERS at a time; each the same size
whatever the fleet's), one label-selected LIST of pods and a watch from it, one LIST of nodes, one namespace deleted.
Everything lives in a namespace of its own, removed on every exit path (a `finally`, which Ctrl-C and SIGTERM reach as
KeyboardInterrupt); a namespace left by a run that was killed with -9 is removed by the next run (or teardown) once
its creator is gone or it expired. The manifests and the decoding are pure (probes/incluster.py).
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing

from gpu_bootstrap.core.errors import ClusterError, GpuBootstrapError
from gpu_bootstrap.probes import incluster
from gpu_bootstrap.core.refs import Ref

log = logging.getLogger("gpu_bootstrap.cluster_probe")
POLL_FIRST, POLL_MAX = 0.2, 2.0  # seconds between LISTs where pods may not be watched: quick, then bounded
WATCH_SECONDS = 60  # one watch's length; the server ends it, and the probe watches on from where it stopped
CREATE_WORKERS = 16  # probe pods created at once: a 1,000-node fleet's in about a second, well inside APF's shares
ALTERNATIVES = ("use SSH instead (preflight.via: ssh, with an `ssh` section), or pass --preflight-report FILE (a "
                "saved 'gpu-bootstrap doctor -o json')")


class ProbeRefused(GpuBootstrapError):
    """The cluster will not run the probe (RBAC, Pod Security, a policy engine, GKE Autopilot)."""


def pid_namespace() -> str:
    """This process's PID namespace (the inode number of /proc/self/ns/pid); '' where it cannot be read."""
    try:
        return os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]")
    except OSError:
        return ""


def owner_id() -> str:
    """host:pid-namespace:pid of this run: a pid means something only inside its own PID namespace."""
    return f"{socket.gethostname()}:{pid_namespace()}:{os.getpid()}"


def _owner_gone(owner: str) -> bool:
    """True when `owner` (host:pid-namespace:pid) is a process of this host and PID namespace that no longer runs.
    Another host's or namespace's run (a container beside us), or an owner in an older format: not known to be gone,
    so its namespace waits for its expiry."""
    host, namespace, pid = (owner.split(":") + ["", "", ""])[:3]
    ours = pid_namespace()
    if host != socket.gethostname() or not ours or namespace != ours or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def remove_leftovers(kube) -> list[str]:
    """Delete probe namespaces of runs that are gone (same host, process ended) or expired (teardown removes them
    all: preflight's undo). Returns their names."""
    removed = []
    for namespace in kube.list("v1", "Namespace", label_selector=incluster.SELECTOR):
        meta = namespace["metadata"]
        annotations = meta.get("annotations") or {}
        expires = annotations.get(incluster.EXPIRES_ANNOTATION, "0")
        stale = _owner_gone(annotations.get(incluster.OWNER_ANNOTATION, "")) or (
            expires.isdigit() and int(expires) < time.time())
        if stale and not meta.get("deletionTimestamp"):
            kube.delete(Ref("v1", "Namespace", meta["name"]))
            removed.append(meta["name"])
    if removed:
        log.info("removed probe namespaces left by earlier runs: %s", ", ".join(removed))
    return removed


class ClusterProbe:
    """run(names, script) -> {node: Outcome}: the script run on every named node through one DaemonSet."""

    def __init__(self, kube, image: str, timeout: float, registry=None):
        from gpu_bootstrap.core.catalogue import locate
        self.kube = kube
        self.registry = registry
        self.image = locate(image, registry)  # as pulled: pinned by the catalogue's digest, moved to the mirror
        self.timeout = float(timeout)

    def _located(self, pod: dict) -> dict:
        """The pod with registry.pull_secret added (the image is already located)."""
        from gpu_bootstrap.core.catalogue import locate_pods
        return locate_pods([pod], self.registry)[0]

    def run(self, names: list[str], script: str) -> dict[str, incluster.Outcome]:
        remove_leftovers(self.kube)
        run_id = secrets.token_hex(4)
        namespace = incluster.namespace_name(run_id)
        expires = int(time.time() + self.timeout + 300)
        created = False
        try:
            self._create(incluster.namespace_manifest(run_id, owner_id(), expires), "namespace")
            created = True
            self._create(incluster.script_manifest(run_id, script), "ConfigMap")
            self._create_pods(run_id, names)
            return self._outcomes(names, self._wait(namespace, run_id, names))
        finally:
            if created:
                self._remove(namespace)

    # --- steps ----------------------------------------------------------------------------------------------------
    def _create(self, manifest: dict, what: str) -> None:
        try:
            self.kube.create(manifest)
        except ClusterError as error:
            if error.status in (401, 403, 400, 422) or "denied" in error.message or "admission" in error.message:
                raise ProbeRefused(f"the cluster refused the node probe's {what}: {error.message}",
                                   f"the probe needs a privileged namespace with a read-only hostPath (RBAC to create "
                                   f"namespaces and DaemonSets, no policy rejecting hostPath; GKE Autopilot refuses "
                                   f"it); {ALTERNATIVES}") from None
            raise

    def _create_pods(self, run_id: str, names: list[str]) -> None:
        """One pod per node, CREATE_WORKERS at a time; the first refusal (RBAC, Pod Security, a policy engine) stops
        them all and is the one error given."""
        pods = [self._located(incluster.pod_manifest(run_id, name, index, self.image))
                for index, name in enumerate(names)]
        pool = ThreadPoolExecutor(max_workers=max(1, min(CREATE_WORKERS, len(pods))),
                                  thread_name_prefix="node-probe")
        try:
            for _done in pool.map(lambda pod: self._create(pod, "pod"), pods):
                pass
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # after a refusal or Ctrl-C: nothing more is sent

    def _wait(self, namespace: str, run_id: str, names: list[str]) -> dict[str, dict]:
        """The probe pods by node, once every named node's pod finished or the timeout ran out: one LIST, then a
        watch from its resourceVersion (listed again when the watch expires or the server does not answer). A fleet's
        pods each carry up to 9 KiB of results, so LISTing them again and again cost the API server and us far more
        than their one change each (benchmarks/incluster_probe.py --real). An identity that may list but not watch
        pods (a role from before the probe watched) is polled with LISTs."""
        deadline = time.monotonic() + self.timeout
        selector = f"{incluster.RUN_LABEL}={run_id}"
        watching, interval = True, POLL_FIRST
        while True:
            items, version = self.kube.list_at("v1", "Pod", namespace=namespace, label_selector=selector)
            pods = ProbePods(names)
            for pod in items:
                pods.take("ADDED", pod)
            if watching and version:
                try:
                    version = self._follow(pods, namespace, selector, version, deadline)
                except ClusterError as error:  # no answer: list again (list() retries an outage); 403: poll
                    if error.status in (401, 403):
                        log.info("cluster probe: may not watch pods (%s); polling with LISTs", error.message)
                        watching = False
                    else:
                        log.info("cluster probe: watch not answered (%s); listing again", error.message)
                    version = ""
            if pods.all_settled or time.monotonic() >= deadline:
                log.info("cluster probe: %d of %d node(s) finished", len(pods.settled), len(pods.wanted))
                return pods.by_node
            if not (watching and version):  # polling, or the watch failed: wait a little longer each time
                time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
                interval = min(interval * 1.5, POLL_MAX)

    def _follow(self, pods: "ProbePods", namespace: str, selector: str, version: str, deadline: float) -> str:
        """Apply watch events to `pods` until every wanted node's pod settled, the deadline, or an expired
        resourceVersion (returned empty: list again). A watch the server ended is opened again from the last
        resourceVersion seen."""
        while not pods.all_settled and time.monotonic() < deadline and version:
            events = self.kube.watch("v1", "Pod", namespace, selector, version,
                                     min(WATCH_SECONDS, deadline - time.monotonic()))
            with closing(events):  # leaving early closes the stream at once
                for kind, obj in events:
                    if kind == "ERROR":  # 410 Gone: the resourceVersion is too old to watch from
                        return ""
                    version = obj.get("metadata", {}).get("resourceVersion") or version
                    if kind != "BOOKMARK":
                        pods.take(kind, obj)
                    if pods.all_settled or time.monotonic() >= deadline:
                        break
        return version

    def _outcomes(self, names: list[str], pods: dict[str, dict]) -> dict[str, incluster.Outcome]:
        outcomes = {}
        unfinished = [n for n in names if n not in pods or not incluster.finished(pods[n])]
        nodes = {}
        if unfinished:
            nodes = {n["metadata"]["name"]: n for n in self.kube.list("v1", "Node")}
        for name in names:
            pod = pods.get(name)
            if name in unfinished:
                outcomes[name] = incluster.Outcome(reason=incluster.why_unfinished(pod, nodes.get(name), self.image,
                                                                                   int(self.timeout)))
            else:
                outcomes[name] = incluster.decode(pod)
        return outcomes

    def _remove(self, namespace: str) -> None:
        """Delete the run's namespace; the namespace controller removes its pods. Not waited for: on a 1,000-node
        fleet that takes longer than the probe itself (measured on the real control plane: benchmarks/
        incluster_probe.py --real), and nothing after the probe needs it gone (the next run removes a namespace of
        ours that is still there)."""
        try:
            self.kube.delete(Ref("v1", "Namespace", namespace))
        except GpuBootstrapError as error:
            log.warning("could not remove the probe namespace %s (the next run removes it): %s", namespace,
                        error.one_line())


class ProbePods:
    """The probe pods by node as a LIST and watch events show them, and which have settled: kept up to date event by
    event, since counting anew after each of a fleet's events would cost the square of its size."""

    def __init__(self, names: list[str]):
        self.wanted = set(names)
        self.by_node: dict[str, dict] = {}
        self.settled: set[str] = set()

    @property
    def all_settled(self) -> bool:
        return len(self.settled) == len(self.wanted)

    def take(self, kind: str, pod: dict) -> None:
        """One pod's event: a pod being deleted (or gone) no longer stands for its node."""
        node = incluster.pod_node(pod)
        if node not in self.wanted:
            return
        if kind == "DELETED" or pod["metadata"].get("deletionTimestamp"):
            if self.by_node.get(node, {}).get("metadata", {}).get("uid") == pod["metadata"].get("uid"):
                del self.by_node[node]
                self.settled.discard(node)
            return
        self.by_node[node] = pod
        if incluster.settled(pod):
            self.settled.add(node)
        else:
            self.settled.discard(node)
