"""A kubelet stand-in that really runs containers' commands, for the emulator.

No container runtime exists here, so for a node with a file tree attached (`emulator.kubelet.attach(node, root)`,
the same chrooted trees the sshd tests serve: tests/nodes) this does what a kubelet does with a pod bound to it:

* the image is "pulled" (every image is busybox here) unless it is listed in `unpullable`: then the pod stays
  Pending with ErrImagePull, as on a node that cannot reach the registry;
* a NotReady node's kubelet runs nothing: the pod stays Pending with no container statuses;
* a pod bound to a node with no room for one more pod (its allocatable `pods`) is refused as the kubelet's admission
  refuses it: phase Failed, reason OutOfpods (a pod bound by name never met the scheduler's check);
* init containers run one after the other, each in its own root (busybox applets, /dev/null, zero, random) in a
  private mount namespace, with the pod's volumes bind-mounted: a hostPath maps to the node's tree (read-only when the
  mount says so), an emptyDir to a folder shared by the pod's containers, a configMap to its keys' files,
  /dev/termination-log to a file per container. Their exit codes and termination messages go into the pod's status
  with the kubelet's limits (the last 4,096 bytes per container, then 12 KiB per pod split evenly over all
  containers, keeping the first bytes);
* long-running main containers (`sleep`) are not executed: once the init containers succeeded they are Running.

`canned[node] = {container: (exit code, message)}` (or a function of the pod giving that) skips the execution for a
node and reports those results (the 1,000-node benchmark). Nodes without a tree and without canned results keep the emulator's default behaviour.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .controllers import node_ready
from .util import jcopy, now

MAX_CONTAINER_MESSAGE = 4096  # kubelet MaxContainerTerminationMessageLength: the last bytes are kept
MAX_POD_MESSAGES = 12 * 1024  # kubelet MaxPodTerminationMessageLogLength: split over containers, first bytes kept
CONTAINER_TIMEOUT = 120.0
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Runs in the private mount namespace: bind each volume ("source target ro" per line on stdin), then chroot.
MOUNT_AND_RUN = r"""
while read -r source target mode; do
  [ -n "$target" ] || continue
  mount --bind "$source" "$target" || exit 125
  if [ "$mode" = ro ]; then mount -o remount,bind,ro "$target" || exit 125; fi
done
root=$1; shift
exec chroot "$root" "$@"
"""


def limit_messages(messages: dict[str, str]) -> dict[str, str]:
    """The kubelet's two cuts: per container the last 4,096 bytes, per pod 12 KiB split evenly (first bytes)."""
    share = MAX_POD_MESSAGES // max(1, len(messages))
    out = {}
    for name, message in messages.items():
        data = message.encode()[-MAX_CONTAINER_MESSAGE:]
        out[name] = data[:share].decode(errors="replace")
    return out


class KubeletSim:
    def __init__(self, manager, busybox: str, workers: int = 4):
        self.manager = manager
        self.store = manager.store if manager is not None else None  # None: a subclass reads and writes elsewhere
        self.busybox = busybox
        self.applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
        self.trees: dict[str, Path] = {}
        self.canned: dict[str, dict[str, tuple[int, str]]] = {}
        self.unpullable: set[str] = set()
        self.executed: list[tuple[str, str, str]] = []  # (node, pod, container) in the order they ran
        self.delay = 0.0  # seconds a pod waits before its containers run (a slow image pull)
        self.workdir = Path(tempfile.mkdtemp(prefix="kubelet-sim-"))
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kubelet-sim")
        self._seen: set[str] = set()  # pod uids handled (started or refused)
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def attach(self, node: str, root: Path) -> None:
        """Pods bound to `node` run against this file tree (its /, as the node sees it)."""
        self.trees[node] = Path(root)

    def close(self) -> None:
        self._stopping.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- called by the controller manager (store lock held) -----------------------------------------------------
    def handle(self, pod: dict, node_name: str) -> bool:
        """True when this kubelet took the pod (the default behaviour must not run it)."""
        node = self._node(node_name)
        if node is None:
            return False
        uid = pod["metadata"]["uid"]
        if not node_ready(node):
            return True  # its kubelet is gone: nothing is started, nothing reported
        if node_name not in self.trees and node_name not in self.canned and not self._unpullable(pod):
            return False
        with self._lock:
            if uid in self._seen:
                return True
            self._seen.add(uid)
        refused = self._admission(node, uid)
        if refused:
            self._write(pod, refused)
            return True
        bad = self._unpullable(pod)
        if bad:
            self._write(pod, self._pull_failure(pod, bad))
            return True
        self._pool.submit(self._execute, jcopy(pod), node_name)
        return True

    def refuse_if_full(self, pod: dict, node_name: str) -> bool:
        """The kubelet's admission alone, for a node this stand-in answers for without a file tree: True when the
        pod was refused (and its status says so)."""
        uid = pod["metadata"]["uid"]
        with self._lock:
            if uid in self._seen:
                return True  # refused already: no API reads on every later sync
        node = self._node(node_name)
        if node is None or not node_ready(node):
            return False
        refused = self._admission(node, uid)
        if refused is None:
            return False
        with self._lock:
            if uid in self._seen:
                return True
            self._seen.add(uid)
        self._write(pod, refused)
        return True

    def _admission(self, node: dict, uid: str) -> dict | None:
        """The kubelet's own check of its pod limit (pkg/kubelet/lifecycle/predicate.go), with its words."""
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        if "pods" not in allocatable:
            return None
        capacity = int(allocatable["pods"])
        used = self._running_pods(node["metadata"]["name"], uid)
        if used + 1 <= capacity:
            return None
        return {"phase": "Failed", "reason": "OutOfpods",
                "message": f"Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: {used}, "
                           f"capacity: {capacity}"}

    def _running_pods(self, node_name: str, uid: str) -> int:
        """Pods bound to the node that are not finished, other than `uid`."""
        pods = self.store.objects.get(("", "pods"), {}).values()
        return sum(1 for p in pods if (p.get("spec") or {}).get("nodeName") == node_name
                   and p["metadata"]["uid"] != uid
                   and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))

    def _unpullable(self, pod: dict) -> str:
        spec = pod["spec"]
        return next((c["image"] for c in (spec.get("initContainers") or []) + spec["containers"]
                     if c.get("image") in self.unpullable), "")

    # --- the API side: the emulator's store here, the real API server in tests/localcluster/agent.py -------------
    def _node(self, name: str) -> dict | None:
        return self.store.objects.get(("", "nodes"), {}).get(("", name))

    def _current(self, pod: dict) -> dict | None:
        """The pod as stored now, if it is still the same pod (same uid)."""
        current = self.store.objects.get(("", "pods"), {}).get((pod["metadata"]["namespace"],
                                                                pod["metadata"]["name"]))
        return current if current is not None and current["metadata"]["uid"] == pod["metadata"]["uid"] else None

    def _exists(self, pod: dict) -> bool:
        with self.store.lock:
            return self._current(pod) is not None

    def _write(self, pod: dict, status: dict) -> None:
        with self.store.lock:
            current = self._current(pod)
            if current is None:
                return  # deleted meanwhile
            merged = {**(current.get("status") or {}), **status}
            self.manager._write_status("", "pods", current, merged, "kubelet")

    def _config_map_data(self, namespace: str, name: str) -> dict:
        with self.store.lock:
            config_map = self.store.objects.get(("", "configmaps"), {}).get((namespace, name)) or {}
            return dict(config_map.get("data") or {})

    # --- statuses ---------------------------------------------------------------------------------------------------
    def _base_status(self, pod: dict, phase: str) -> dict:
        node = self._node(pod["spec"]["nodeName"]) or {}
        host_ip = next((a["address"] for a in node.get("status", {}).get("addresses") or []
                        if a.get("type") == "InternalIP"), "10.0.0.1")
        return {"phase": phase, "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
                "startTime": (pod.get("status") or {}).get("startTime") or now()}

    def _pull_failure(self, pod: dict, image: str) -> dict:
        message = (f'Failed to pull image "{image}": failed to resolve reference "{image}": failed to do request: '
                   f'dial tcp: lookup registry: no such host')
        spec = pod["spec"]

        def waiting(container, reason):
            return {"name": container["name"], "image": container["image"], "imageID": "", "ready": False,
                    "restartCount": 0, "started": False, "state": {"waiting": {"reason": reason, "message": message}
                                                                    if reason != "PodInitializing" else
                                                                    {"reason": reason}}}
        inits = spec.get("initContainers") or []
        status = self._base_status(pod, "Pending")
        status["conditions"] = self._conditions(False, bool(inits))
        if inits:
            status["initContainerStatuses"] = [waiting(c, "ErrImagePull" if i == 0 else "PodInitializing")
                                               for i, c in enumerate(inits)]
            status["containerStatuses"] = [waiting(c, "PodInitializing") for c in spec["containers"]]
        else:
            status["containerStatuses"] = [waiting(c, "ErrImagePull") for c in spec["containers"]]
        return status

    @staticmethod
    def _conditions(initialized: bool, has_inits: bool, ready: bool = False) -> list[dict]:
        stamp = now()

        def condition(kind, value, reason=None):
            out = {"type": kind, "status": "True" if value else "False", "lastProbeTime": None,
                   "lastTransitionTime": stamp}
            if reason and not value:
                out["reason"] = reason
            return out
        return [condition("PodReadyToStartContainers", True),
                condition("Initialized", initialized, "ContainersNotInitialized" if has_inits else None),
                condition("Ready", ready, "ContainersNotReady"),
                condition("ContainersReady", ready, "ContainersNotReady"),
                condition("PodScheduled", True)]

    # --- running containers -----------------------------------------------------------------------------------
    def _execute(self, pod: dict, node_name: str) -> None:
        spec = pod["spec"]
        inits = spec.get("initContainers") or []
        results: dict[str, tuple[int, str]] = {}
        if self.delay and (self._stopping.wait(self.delay) or not self._exists(pod)):
            return  # the emulator stops, or the pod was deleted while it "pulled"
        if node_name in self.canned:
            canned = self.canned[node_name]
            canned = canned(pod) if callable(canned) else canned
            results = {c["name"]: canned.get(c["name"], (0, "")) for c in inits}
        else:
            folder = Path(tempfile.mkdtemp(prefix=pod["metadata"]["name"] + "-", dir=self.workdir))
            try:
                for container in inits:
                    results[container["name"]] = self._run(pod, container, node_name, folder)
                    self.executed.append((node_name, pod["metadata"]["name"], container["name"]))
                    if results[container["name"]][0] != 0:
                        break
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        self._write(pod, self._finished_status(pod, results))

    def _finished_status(self, pod: dict, results: dict[str, tuple[int, str]]) -> dict:
        spec = pod["spec"]
        inits = spec.get("initContainers") or []
        every = [c["name"] for c in inits + spec["containers"]]
        messages = limit_messages({name: results.get(name, (0, ""))[1] for name in every})
        stamp = now()
        failed = next((c["name"] for c in inits if results.get(c["name"], (0, ""))[0] != 0), None)
        statuses = []
        for container in inits:
            name = container["name"]
            base = {"name": name, "image": container["image"], "imageID": f"{container['image']}@sha256:{'0' * 64}",
                    "ready": False, "restartCount": 0, "started": False}
            if name in results:
                code = results[name][0]
                terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                              "startedAt": stamp, "finishedAt": stamp,
                              "containerID": f"containerd://{abs(hash((name, stamp))):064x}"[:77]}
                if messages[name]:
                    terminated["message"] = messages[name]
                if code == 0:
                    statuses.append({**base, "state": {"terminated": terminated}})
                else:  # restartPolicy Always: the kubelet restarts it with back-off
                    statuses.append({**base, "restartCount": 1, "lastState": {"terminated": terminated},
                                     "state": {"waiting": {"reason": "CrashLoopBackOff",
                                                           "message": f"back-off 10s restarting failed container="
                                                                      f"{name} pod={pod['metadata']['name']}"}}})
            else:
                statuses.append({**base, "state": {"waiting": {"reason": "PodInitializing"}}})
        running = failed is None
        status = self._base_status(pod, "Running" if running else "Pending")
        status["conditions"] = self._conditions(running, bool(inits), ready=running)
        if inits:
            status["initContainerStatuses"] = statuses
        status["containerStatuses"] = [
            {"name": c["name"], "image": c["image"], "imageID": f"{c['image']}@sha256:{'0' * 64}",
             "ready": running, "restartCount": 0, "started": running,
             "state": {"running": {"startedAt": stamp}} if running else {"waiting": {"reason": "PodInitializing"}}}
            for c in spec["containers"]]
        return status

    def _root(self, folder: Path) -> Path:
        root = folder / "rootfs"
        for sub in ("bin", "dev", "tmp", "etc", "proc"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        try:
            os.link(self.busybox, root / "bin" / "busybox")
        except OSError:
            shutil.copy2(self.busybox, root / "bin" / "busybox")
        for applet in self.applets:
            link = root / "bin" / applet
            if not link.exists():
                link.symlink_to("busybox")
        for device, minor in (("null", 3), ("zero", 5), ("random", 8), ("urandom", 9)):  # what a runtime gives
            os.mknod(root / "dev" / device, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
            (root / "dev" / device).chmod(0o666)
        return root

    def _mounts(self, pod: dict, container: dict, node_name: str, folder: Path, root: Path) -> list[str]:
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        lines = []
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"]) or {}
            if "hostPath" in volume:
                source = self.trees[node_name] / volume["hostPath"]["path"].lstrip("/")
            elif "emptyDir" in volume:
                source = folder / "volumes" / mount["name"]
                source.mkdir(parents=True, exist_ok=True)
            elif "configMap" in volume:
                source = self._config_map(pod, volume, folder / "volumes" / mount["name"])
            else:
                continue  # secrets, projected tokens: not modelled
            target = root / mount["mountPath"].lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            lines.append(f"{source} {target} {'ro' if mount.get('readOnly') else 'rw'}")
        log = folder / "termination" / container["name"]
        log.parent.mkdir(exist_ok=True)
        log.write_bytes(b"")
        target = root / container.get("terminationMessagePath", "/dev/termination-log").lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
        lines.append(f"{log} {target} rw")
        return lines

    def _config_map(self, pod: dict, volume: dict, folder: Path) -> Path:
        """A configMap volume: one file per key (a missing ConfigMap gives an empty folder here; the kubelet would
        keep the container waiting)."""
        folder.mkdir(parents=True, exist_ok=True)
        data = self._config_map_data(pod["metadata"]["namespace"], volume["configMap"]["name"])
        for key, value in data.items():
            (folder / key).write_text(value)
        return folder

    def _run(self, pod: dict, container: dict, node_name: str, folder: Path) -> tuple[int, str]:
        root = folder / "rootfs" if (folder / "rootfs").exists() else self._root(folder)
        mounts = self._mounts(pod, container, node_name, folder, root)
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        if not argv:
            return 0, ""
        env = {"PATH": PATH, "HOSTNAME": pod["metadata"]["name"], "HOME": "/root"}
        env.update({e["name"]: e.get("value", "") for e in container.get("env") or [] if "name" in e})
        done = None
        try:
            done = subprocess.run(["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", MOUNT_AND_RUN,
                                   "kubelet-sim", str(root), *argv], input="\n".join(mounts) + "\n",
                                  capture_output=True, text=True, env=env, timeout=CONTAINER_TIMEOUT)  # tool_env: a pod's own environment
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = 137
        message = (folder / "termination" / container["name"]).read_bytes().decode(errors="replace")
        if container.get("terminationMessagePolicy") == "FallbackToLogsOnError" and code != 0 and not message and done:
            message = "\n".join((done.stdout + done.stderr).splitlines()[-80:])[-2048:]
        return code, message
