"""The local cluster's agent: real processes for the pods whose image it knows, and the gpu-operator stand-in.

KWOK plays every pod's lifecycle on the fake nodes (bound, Running, Ready, an address from the node's pod CIDR, routed to this machine's loopback device)
but runs nothing. For a pod whose container image is one of RUNNABLE this agent runs the real binary built by
scripts/install-test-tools, as a kubelet would run the container:

* in a private mount and UTS namespace, chrooted into a folder of its own, with the pod's volumes bind-mounted at
  their mount paths (Secrets, ConfigMaps, emptyDirs, and the projected service-account token, requested from the
  TokenRequest API for the pod's ServiceAccount and bound to the pod), the hostname set to the pod's name (so a
  kube-scheduler takes its leader Lease under the pod's identity), as the runAsUser/runAsGroup the pod asks for;
* with the container's command, args and env (literal values and fieldRefs), KUBERNETES_SERVICE_HOST/PORT pointing at
  the API server (the `kubernetes` Service has no endpoint here), and its listening address moved from 0.0.0.0 to the
  pod's own address, so two replicas do not fight over a port and the API server, which calls webhooks at the
  Service's endpoint addresses (--enable-aggregator-routing), reaches the pod it chose;
* restarted (after a back-off) when it exits, stopped when the pod goes away or is being deleted.

Differences from a kubelet, on purpose: readiness is KWOK's (a pod is Ready at once, not when its probe answers), and
the process runs as root's child on the host network. Processes' output: <cluster>/pods/<namespace>_<pod>/out.log.

Kueue's controller manager runs for the pod of its chart's Deployment; its Configuration (a ConfigMap it mounts) is
bound from a copy whose listening addresses are the pod's (CONFIG_LISTEN), as its flags' would be.

NVIDIA's gpu-operator controller is real for the one chart built beside it (the 25.3 line: the only commit of the
operator's module the Go module proxy serves; OWN_TAG_ONLY): the agent runs it for that chart's operator pod, with
the commit's state manifests bound at /opt/gpu-operator. For any other chart (v25.10, v26.x: release versions the
proxy refuses) the gpu-operator stand-in plays it: tests/kubeapi/gpu_operator_sim.py's controller (the same code the
emulator runs) over a snapshot of the real API and writing through it: it labels GPU nodes, turns the ClusterPolicy
into operand DaemonSets (which KWOK then runs), the DCGM exporter's Service and ServiceMonitor, and the
ClusterPolicy's status. It stands aside where the real controller serves, so that two never fight.
"""
from __future__ import annotations

import base64
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.localcluster.cluster import LocalCluster, binaries, pdeathsig_hook
from tests.localcluster.rest import ApiError, Rest

AGENT = "local-cluster-agent"
# image repository (its last path parts, so a mirror's prefix does not matter) -> how to run it: a binary built by
# scripts/install-test-tools (with the paths the image has it at), or a Python stand-in (standins.py) where nothing
# can be built (the module proxy refuses the module, or the real thing needs GPUs)
RUNNABLE = {
    "openpolicyagent/opa": ("opa", ["/opa", "/usr/local/bin/opa"]),
    "kube-scheduler": ("kube-scheduler", ["/usr/local/bin/kube-scheduler"]),
    "prometheus-operator/prometheus-operator": ("prometheus-operator", ["/bin/operator"]),
    "prometheus-operator/prometheus-config-reloader": ("prometheus-config-reloader",
                                                       ["/bin/prometheus-config-reloader"]),
    "prometheus/prometheus": ("prometheus", ["/bin/prometheus"]),
    # NVIDIA's controller, for the operator image of the chart built beside it only (OWN_TAG_ONLY)
    "nvidia/gpu-operator": ("gpu-operator", ["/usr/bin/gpu-operator"]),
    "kueue/kueue": ("kueue", ["/manager"]),  # Kueue's controller manager (the chart's staging or release image)
    "kube-webhook-certgen": ("standin:certgen", []),
    "k8s/dcgm-exporter": ("standin:dcgm-exporter", []),
    "k8s/cuda-sample": ("standin:cuda-sample", []),
}
# Repositories whose binary stands for one release only: a pod runs it when its image's tag is that release's (the
# gpu-operator controller of the one commit built, whose chart install-test-tools labels with the commit's line);
# any other tag is left to KWOK (and, for the gpu-operator, to the stand-in)
OWN_TAG_ONLY = {"nvidia/gpu-operator": "gpu-operator-chart"}
# Folders an image holds, beside its binary: binds made read-only into the container's root
IMAGE_FOLDERS = {"gpu-operator": [("gpu-operator-assets", "/opt/gpu-operator")]}  # its state manifests
# hostPath files a container may read from this machine (others are an empty folder, as on a fresh node)
HOST_FILES = {"/etc/os-release"}  # the gpu-operator reads the host's through a hostPath volume
# The images' ENTRYPOINT and CMD: a container's command replaces both, its args replace CMD only (as a runtime does)
IMAGE_DEFAULTS = {"opa": (["/opa"], []), "kube-scheduler": ([], ["/usr/local/bin/kube-scheduler"]),
                  "prometheus-operator": (["/bin/operator"], []),
                  "prometheus-config-reloader": (["/bin/prometheus-config-reloader"], []),
                  "prometheus": (["/bin/prometheus"], ["--config.file=/etc/prometheus/prometheus.yml",
                                                       "--storage.tsdb.path=/prometheus"]),
                  "gpu-operator": (["gpu-operator"], []), "kueue": (["/manager"], [])}
# Listening flags whose default is every address: made explicit so that the process takes only the pod's address
DEFAULT_LISTEN = {"opa": [("--addr", 8181)], "prometheus": [("--web.listen-address", 9090)],
                  "gpu-operator": [("--metrics-bind-address", 8080), ("--health-probe-bind-address", 8081)]}
# Config files (as the container mounts them) whose listening addresses are moved to the pod's address, as its flags
# are (rewrite_listen): Kueue takes its health, metrics, webhook and visibility addresses from its Configuration
CONFIG_LISTEN = {"kueue": "/controller_manager_config.yaml"}
BACKOFF = 5.0
SYNC_EVERY = 1.0  # seconds between two looks at the pods (a kubelet's sync loop is 1 s too)
OPERATOR_EVERY = 2.0  # between two rounds of the gpu-operator stand-in
REFRESH = 5.0  # a kubelet brings Secret and ConfigMap volumes up to date within a minute or so; this, every 5 s
# Dynamically linked binaries (none of ours are, but a Debian-built one would be) find the host's libraries
HOST_LIBRARIES = ("/lib", "/lib64", "/usr/lib")
RUN_IN_ROOT = r"""
set -e
root=$1; host=$2; user=$3; binds=$4; shift 4
mount --make-rprivate /
while read -r source target mode; do
  [ -n "$target" ] || continue
  mount --bind "$source" "$root$target"
  if [ "$mode" = ro ]; then mount -o remount,bind,ro "$root$target"; fi
done < "$binds"
hostname "$host"
exec chroot --userspec="$user" "$root" "$@"
"""
LISTEN = re.compile(r"^(--?[\w.-]+=)?(?:0\.0\.0\.0|\[::\]|)?:(\d+)$")
LOOPBACK_URL = re.compile(r"(https?://)(?:localhost|127\.0\.0\.1)(:\d+)")


def repository(image: str) -> str:
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    return name


def runnable(image: str) -> str | None:
    repo = repository(image)
    for suffix in RUNNABLE:
        if repo == suffix or repo.endswith("/" + suffix):
            return suffix if suffix not in OWN_TAG_ONLY or tag(image) == own_tag(suffix) else None
    return None


def tag(image: str) -> str:
    last = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else "latest"


@functools.cache
def own_tag(suffix: str) -> str | None:
    """The image tag the built binary stands for: the appVersion of the chart built beside it (None: not built)."""
    chart = binaries()[OWN_TAG_ONLY[suffix]] / "Chart.yaml"
    if not chart.exists():
        return None
    found = re.search(r"^appVersion:\s*[\"']?([^\"'\s]+)", chart.read_text(), re.M)
    return found.group(1) if found else None


def listen_in_config(binary: str, text: str, ip: str) -> str:
    """A config file's listening addresses (CONFIG_LISTEN) moved from every address to the pod's own."""
    import yaml
    config = yaml.safe_load(text) or {}
    if binary == "kueue":
        for section, key, port in (("health", "healthProbeBindAddress", 8081), ("metrics", "bindAddress", 8443)):
            address = (config.get(section) or {}).get(key) or f":{port}"
            config.setdefault(section, {})[key] = f"{ip}:{address.rpartition(':')[2]}"
        config.setdefault("webhook", {})["host"] = ip
        config.setdefault("visibilityServer", {})["bindAddress"] = ip
        if config.get("pprofBindAddress"):
            config["pprofBindAddress"] = f"{ip}:{config['pprofBindAddress'].rpartition(':')[2]}"
    return yaml.safe_dump(config, sort_keys=False)


def rewrite_listen(binary: str, args: list[str], ip: str) -> list[str]:
    """A container listens on every address or a bare port, and reaches its pod's other containers at localhost;
    here each process shares the host's network, so both become the pod's own address."""
    out = []
    for arg in args:
        match = LISTEN.match(arg)
        if match:
            arg = f"{match.group(1) or ''}{ip}:{match.group(2)}"
        out.append(LOOPBACK_URL.sub(lambda m: f"{m.group(1)}{ip}{m.group(2)}", arg))
    for flag, port in DEFAULT_LISTEN.get(binary, []):
        if not any(a == flag or a.startswith(flag + "=") for a in out) and not (binary == "opa" and "-a" in out):
            out.insert(1 if binary == "opa" and out[:1] == ["run"] else 0, f"{flag}={ip}:{port}")
    if binary == "kube-scheduler":
        out = [a for a in out if not a.startswith("--bind-address")] + [f"--bind-address={ip}"]
    return out


@dataclass
class Container:
    name: str
    image_kind: str
    init: bool
    process: subprocess.Popen | None = None
    next_start: float = 0.0
    starts: int = 0
    done: bool = False  # an init container (or a run-to-completion pod's container) that exited 0


@dataclass
class PodEntry:
    uid: str
    name: str
    namespace: str
    folder: Path
    containers: dict = field(default_factory=dict)  # name -> Container
    volumes_ready: bool = False
    refreshed: float = 0.0  # when the Secret and ConfigMap volumes were last brought up to date
    reported: bool = False  # a run-to-completion pod whose end the agent wrote into its status


@dataclass
class Agent:
    cluster: LocalCluster
    api: Rest = None
    pods: dict = field(default_factory=dict)  # pod uid -> PodEntry
    finished: dict = field(default_factory=dict)  # pod uid -> PodEntry of pods that ended: their logs stay readable
    tools: dict = field(default_factory=binaries)
    stopping: bool = False
    probe: object = None  # probe_kubelet.ProbeKubelet: the kubelet stand-in for nodes with a file tree

    def __post_init__(self):
        self.api = self.cluster.admin(agent=AGENT)
        (self.cluster.folder / "pods").mkdir(exist_ok=True)

    # --- the pods ---------------------------------------------------------------------------------------------------
    def sync_pods(self) -> None:
        pods = self.api.get("/api/v1/pods")["items"]
        if self.probe is not None:
            self.probe.sync(pods)
        wanted = {}
        for pod in pods:
            meta, status = pod["metadata"], pod.get("status") or {}
            if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not status.get("podIP"):
                continue
            if not any(runnable(c.get("image", "")) for c in self._all_containers(pod)):
                continue
            wanted[meta["uid"]] = pod
        for uid in [u for u in self.pods if u not in wanted]:
            entry = self.pods.pop(uid)
            self.stop(entry, "the pod is gone, being deleted or no longer running")
            self.finished[uid] = entry
        live = {p["metadata"]["uid"] for p in pods}
        for uid in [u for u in self.finished if u not in live]:
            del self.finished[uid]
        for uid, pod in wanted.items():
            entry = self.pods.get(uid)
            if entry is None:
                meta = pod["metadata"]
                folder = self.cluster.folder / "pods" / f"{meta['namespace']}_{meta['name']}"
                entry = self.pods[uid] = PodEntry(uid, meta["name"], meta["namespace"], folder)
                for init, container in [(True, c) for c in pod["spec"].get("initContainers") or []] + \
                                       [(False, c) for c in pod["spec"]["containers"]]:
                    kind = runnable(container.get("image", ""))
                    if kind:
                        entry.containers[container["name"]] = Container(container["name"], kind, init)
            try:
                self.step(entry, pod)
            except (ApiError, OSError) as error:
                self.note(entry, f"could not start: {error}")

    @staticmethod
    def _all_containers(pod: dict) -> list[dict]:
        spec = pod.get("spec") or {}
        return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])

    def step(self, entry: PodEntry, pod: dict) -> None:
        if not entry.volumes_ready:
            if entry.folder.exists():
                subprocess.run(["rm", "-rf", str(entry.folder)], check=False)
            entry.folder.mkdir(parents=True)
            self.prepare_volumes(entry, pod)
            entry.volumes_ready = True
            entry.refreshed = time.monotonic()
        elif time.monotonic() - entry.refreshed > REFRESH:
            self.refresh_volumes(entry, pod)
            entry.refreshed = time.monotonic()
        specs = {c["name"]: c for c in self._all_containers(pod)}
        for container in entry.containers.values():  # init containers first, one at a time, each to its end
            if not container.init or container.done:
                continue
            self.keep_running(entry, container, pod, specs[container.name], once=True)
            return
        completes = self._runs_to_completion(pod)
        for container in entry.containers.values():
            if not container.init:
                self.keep_running(entry, container, pod, specs[container.name], once=completes)
        if completes and not entry.reported and all(c.done for c in entry.containers.values()):
            self.report_completed(entry, pod)

    @staticmethod
    def _runs_to_completion(pod: dict) -> bool:
        return pod["spec"].get("restartPolicy", "Always") != "Always" or \
            any(o.get("kind") == "Job" for o in pod["metadata"].get("ownerReferences") or [])

    def keep_running(self, entry: PodEntry, container: Container, pod: dict, spec: dict, once: bool) -> None:
        if container.done or (container.process is not None and container.process.poll() is None):
            return
        if container.process is not None:
            code = container.process.returncode
            container.process = None
            if once and code == 0:
                container.done = True
                self.note(entry, f"{container.name} completed")
                return
            self.note(entry, f"{container.name} exited with {code}; again in {BACKOFF:.0f}s")
            container.next_start = time.monotonic() + BACKOFF
        if time.monotonic() < container.next_start:
            return
        container.process = self.start(entry, container, pod, spec)
        container.starts += 1

    def report_completed(self, entry: PodEntry, pod: dict) -> None:
        """What KWOK's pod-complete Stage does for other Job pods, once the containers really ended (cluster.py
        keeps KWOK off these pods)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        statuses = [{"name": c["name"], "image": c["image"], "ready": False, "restartCount": 0, "started": False,
                     "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now,
                                              "finishedAt": now}}} for c in pod["spec"]["containers"]]
        path = f"/api/v1/namespaces/{entry.namespace}/pods/{entry.name}/status"
        self.api.patch(path, {"status": {"phase": "Succeeded", "containerStatuses": statuses}}, kind="strategic")
        entry.reported = True
        self.note(entry, "reported Succeeded")

    def start(self, entry: PodEntry, container: Container, pod: dict, spec: dict) -> subprocess.Popen:
        binary, paths = RUNNABLE[container.image_kind]
        ip = pod["status"]["podIP"]
        env = self.environment(pod, spec)
        log = (entry.folder / f"{container.name}.log").open("ab")
        if binary.startswith("standin:"):
            node = pod["spec"].get("nodeName", "")
            gpus = ((self.api.get(f"/api/v1/nodes/{node}").get("status") or {}).get("capacity") or {}).get(
                "nvidia.com/gpu", "0")
            argv = [sys.executable, "-m", "tests.localcluster.standins", binary.split(":", 1)[1], "--pod-ip", ip,
                    "--node", node, "--gpus", str(gpus), "--volumes", str(entry.folder / "volumes"), "--",
                    *spec.get("command", []), *spec.get("args", [])]
            env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
            env.update(self.api_env(pod))
            popen_args = argv
        else:
            root = entry.folder / container.name / "root"
            binds = self.root(root, paths, binary)
            binds += self.mounts(entry, spec, root)
            binds = self.config_listen(entry, container, binary, binds, ip)
            (entry.folder / container.name / "binds").write_text("".join(f"{s} {t} {m}\n" for s, t, m in binds))
            entrypoint, cmd = IMAGE_DEFAULTS[binary]
            if spec.get("command"):
                command = list(spec["command"]) + list(spec.get("args") or [])
            else:
                command = entrypoint + list(spec.get("args") or cmd)
            argv = [command[0], *rewrite_listen(binary, command[1:], ip)]
            context = {**(pod["spec"].get("securityContext") or {}), **(spec.get("securityContext") or {})}
            user = f"{context.get('runAsUser', 0)}:{context.get('runAsGroup', context.get('runAsUser', 0))}"
            popen_args = ["unshare", "--mount", "--uts", "--fork", "--kill-child", "/bin/sh", "-c", RUN_IN_ROOT, "sh",
                          str(root), entry.name, user, str(entry.folder / container.name / "binds"), *argv]
        log.write(f"--- start {time.strftime('%H:%M:%S')}: {shlex.join(argv)}\n".encode())
        log.flush()
        process = subprocess.Popen(popen_args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, cwd=entry.folder, preexec_fn=pdeathsig_hook())  # tool_env: a pod's own
        log.close()
        self.note(entry, f"started {container.name} ({binary}, pid {process.pid}) on {ip}")
        return process

    @staticmethod
    def config_listen(entry: PodEntry, container: Container, binary: str, binds: list, ip: str) -> list:
        """The container's config file (CONFIG_LISTEN) bound from a copy listening on the pod's address."""
        wanted = CONFIG_LISTEN.get(binary)
        out = []
        for source, target, mode in binds:
            if target == wanted and Path(source).is_file():
                copy = entry.folder / container.name / Path(target).name
                copy.write_text(listen_in_config(binary, Path(source).read_text(), ip))
                source = str(copy)
            out.append((source, target, mode))
        return out

    def root(self, root: Path, paths: list[str], binary: str) -> list[tuple[str, str, str]]:
        for path in ("proc", "dev", "tmp", "etc"):
            (root / path).mkdir(parents=True, exist_ok=True)
        (root / "tmp").chmod(0o1777)
        binds = [("/proc", "/proc", "rw")]
        for device in ("null", "zero", "random", "urandom"):
            (root / "dev" / device).touch()
            binds.append((f"/dev/{device}", f"/dev/{device}", "rw"))
        for library in HOST_LIBRARIES:
            if Path(library).is_dir() and not Path(library).is_symlink():
                (root / library.lstrip("/")).mkdir(parents=True, exist_ok=True)
                binds.append((library, library, "ro"))
        for path in paths:
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
            binds.append((str(self.tools[binary]), path, "ro"))
        for name, path in IMAGE_FOLDERS.get(binary, []):
            (root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
            binds.append((str(self.tools[name]), path, "ro"))
        return binds

    def api_env(self, pod: dict) -> dict:
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.cluster.ports["apiserver"])}

    def environment(self, pod: dict, container: dict) -> dict:
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/",
               "HOSTNAME": pod["metadata"]["name"], **self.api_env(pod)}
        fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
                  "metadata.uid": pod["metadata"]["uid"], "spec.nodeName": pod["spec"].get("nodeName", ""),
                  "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
                  "status.podIP": pod["status"].get("podIP", ""), "status.hostIP": pod["status"].get("hostIP", "")}
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
            elif ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") in fields:
                env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        return env

    # --- volumes: made once per pod, shared by its containers (an emptyDir one writes, another reads) ---------------
    def prepare_volumes(self, entry: PodEntry, pod: dict) -> None:
        for volume in pod["spec"].get("volumes") or []:
            folder = entry.folder / "volumes" / volume["name"]
            if (volume.get("hostPath") or {}).get("path") in HOST_FILES:
                folder.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(volume["hostPath"]["path"], folder)  # a file: mounts() binds it onto a file
                continue
            folder.mkdir(parents=True)
            self.materialize(pod, volume, folder)

    def refresh_volumes(self, entry: PodEntry, pod: dict) -> None:
        """Secret and ConfigMap contents as they are now (the token and downward API files stay as made): files
        that changed are replaced by a rename, files whose key is gone are removed, unchanged ones are left alone,
        so a watcher (the config reloader) sees a change only when there is one."""
        for volume in pod["spec"].get("volumes") or []:
            if not ({"secret", "configMap"} & set(volume) or ("projected" in volume and not any(
                    "serviceAccountToken" in source or "downwardAPI" in source
                    for source in volume["projected"].get("sources") or []))):
                continue
            folder = entry.folder / "volumes" / volume["name"]
            staging = entry.folder / "volumes" / f".{volume['name']}.new"
            subprocess.run(["rm", "-rf", str(staging)], check=False)
            staging.mkdir()
            try:
                self.materialize(pod, volume, staging)
            except ApiError as error:
                if error.status != 404:
                    raise
                continue  # deleted meanwhile: a kubelet keeps the last contents too
            fresh = {p.relative_to(staging): p for p in staging.rglob("*") if p.is_file()}
            for path in [p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder) not in fresh]:
                path.unlink()
            for relative, source in fresh.items():
                target = folder / relative
                if target.exists() and target.read_bytes() == source.read_bytes():
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
            subprocess.run(["rm", "-rf", str(staging)], check=False)

    def mounts(self, entry: PodEntry, container: dict, root: Path) -> list[tuple[str, str, str]]:
        binds = []
        for mount in container.get("volumeMounts") or []:
            source = entry.folder / "volumes" / mount["name"]
            if not source.exists():
                continue
            if mount.get("subPath"):
                source = source / mount["subPath"]
                if not source.exists():
                    source.mkdir(parents=True, mode=0o777)
            target = root / mount["mountPath"].lstrip("/")
            if source.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.touch()
            binds.append((str(source), mount["mountPath"], "ro" if mount.get("readOnly") else "rw"))
        return binds

    def materialize(self, pod: dict, volume: dict, folder: Path) -> None:
        namespace = pod["metadata"]["namespace"]
        if "secret" in volume:
            source = volume["secret"]
            self._files(folder, self._secret(namespace, source["secretName"], source.get("optional")),
                        source.get("items"), source.get("defaultMode", 0o644))
        elif "configMap" in volume:
            source = volume["configMap"]
            self._files(folder, self._configmap(namespace, source["name"], source.get("optional")),
                        source.get("items"), source.get("defaultMode", 0o644))
        elif "projected" in volume:
            for source in volume["projected"].get("sources") or []:
                self._projected(pod, source, folder)
        else:  # emptyDir (and anything else): an empty folder any of the pod's users may write
            folder.chmod(0o777)
            return
        folder.chmod(0o755)

    def _secret(self, namespace: str, name: str, optional: bool | None) -> dict:
        try:
            secret = self.api.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except ApiError as error:
            if error.status == 404 and optional:
                return {}
            raise
        return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}

    def _configmap(self, namespace: str, name: str, optional: bool | None = None) -> dict:
        try:
            config = self.api.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        except ApiError as error:
            if error.status == 404 and optional:
                return {}
            raise
        data = {k: v.encode() for k, v in (config.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (config.get("binaryData") or {}).items()})
        return data

    def _projected(self, pod: dict, source: dict, folder: Path) -> None:
        meta = pod["metadata"]
        if "serviceAccountToken" in source:
            request = source["serviceAccountToken"]
            account = pod["spec"].get("serviceAccountName") or "default"
            spec = {"expirationSeconds": request.get("expirationSeconds", 3607),
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}}
            if request.get("audience"):
                spec["audiences"] = [request["audience"]]
            answer = self.api.create(f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token",
                                     {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                      "spec": spec})
            self._files(folder, {request["path"]: answer["status"]["token"].encode()}, None, 0o644)
        elif "configMap" in source:
            config = source["configMap"]
            self._files(folder, self._configmap(meta["namespace"], config["name"], config.get("optional")),
                        config.get("items"), 0o644)
        elif "secret" in source:
            secret = source["secret"]
            self._files(folder, self._secret(meta["namespace"], secret["name"], secret.get("optional")),
                        secret.get("items"), 0o644)
        elif "downwardAPI" in source:
            values = {"metadata.namespace": meta["namespace"], "metadata.name": meta["name"]}
            data = {item["path"]: values.get(item.get("fieldRef", {}).get("fieldPath"), "").encode()
                    for item in source["downwardAPI"].get("items") or []}
            self._files(folder, data, None, 0o644)

    @staticmethod
    def _files(folder: Path, data: dict, items: list | None, mode: int) -> None:
        chosen = {i["path"]: data[i["key"]] for i in items if i["key"] in data} if items else data
        for path, content in chosen.items():
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            target.chmod(mode & 0o777)

    # --- stopping ---------------------------------------------------------------------------------------------------
    def stop(self, entry: PodEntry, why: str) -> None:
        for container in entry.containers.values():
            process = container.process
            if process is None or process.poll() is not None:
                continue
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            except ProcessLookupError:
                pass
        self.note(entry, f"stopped: {why}")

    def stop_all(self) -> None:
        for entry in list(self.pods.values()):
            self.stop(entry, "the agent stops")
        self.pods.clear()

    def container_log(self, namespace: str, name: str, container: str) -> bytes | None:
        """A container's output, as a kubelet's containerLogs answers it (the agent's own start lines left out)."""
        for entry in list(self.pods.values()) + list(self.finished.values()):
            if (entry.namespace, entry.name) == (namespace, name):
                path = entry.folder / f"{container}.log"
                if path.exists():
                    return b"".join(line for line in path.read_bytes().splitlines(keepends=True)
                                    if not line.startswith(b"--- start "))
        return None

    @staticmethod
    def note(entry: PodEntry, message: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {entry.namespace}/{entry.name}: {message}", flush=True)


class KubeletLogs:
    """The nodes' kubelet endpoint, for logs only: the API server answers `kubectl logs` (pods/log) by calling
    https://<node InternalIP>:<daemonEndpoints.kubeletEndpoint.Port>/containerLogs/<ns>/<pod>/<container> with its
    kubelet client certificate. This serves the output of the containers the agent ran, on every node's address, to
    callers with a certificate of the cluster's CA only; other pods' logs are a 404 that says why."""

    def __init__(self, agent: Agent, addresses: list[str], port: int):
        import ssl
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        pki_dir = agent.cluster.pki
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki_dir / "kubelet.crt", pki_dir / "kubelet.key")
        context.load_verify_locations(pki_dir / "ca.crt")
        context.verify_mode = ssl.CERT_REQUIRED

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the http.server API
                parts = self.path.split("?", 1)[0].strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self._answer(404, b"the local cluster's kubelet endpoint serves containerLogs only\n")
                    return
                data = agent.container_log(*parts[1:])
                if data is None:
                    self._answer(404, f"no log: the local cluster ran no process for {parts[1]}/{parts[2]} "
                                      f"container {parts[3]} (KWOK plays its lifecycle)\n".encode())
                    return
                self._answer(200, data)

            def _answer(self, code: int, body: bytes):
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.servers = []
        for address in addresses:
            server = ThreadingHTTPServer((address, port), Handler)
            server.socket = context.wrap_socket(server.socket, server_side=True)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.servers.append(server)


def main(folder: str) -> int:
    cluster = LocalCluster.load(Path(folder))
    if cluster is None:
        print(f"agent: no cluster in {folder}", file=sys.stderr)
        return 2
    agent = Agent(cluster)
    from tests.localcluster.probe_kubelet import ProbeKubelet
    from tests.tools import SYSTEM_TOOLS
    if Path(SYSTEM_TOOLS["busybox"]).exists():
        agent.probe = ProbeKubelet(agent.api, cluster.folder, SYSTEM_TOOLS["busybox"])
    nodes = agent.api.get("/api/v1/nodes")["items"]
    addresses = sorted({a["address"] for n in nodes for a in n["status"].get("addresses") or []
                        if a["type"] == "InternalIP"})
    KubeletLogs(agent, addresses, cluster.ports["kubelet"])
    from tests.localcluster.operator import OperatorStandIn
    operator = OperatorStandIn(agent.api, served_by_real=lambda deployment: any(
        runnable(c.get("image", "")) == "nvidia/gpu-operator"
        for c in deployment["spec"]["template"]["spec"].get("containers") or []))

    def stop(signum, frame):
        agent.stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    last_operator = 0.0
    try:
        while not agent.stopping:
            try:
                agent.sync_pods()
                if time.monotonic() - last_operator > OPERATOR_EVERY:
                    operator.reconcile()
                    last_operator = time.monotonic()
            except (ApiError, OSError, json.JSONDecodeError) as error:
                print(f"{time.strftime('%H:%M:%S')} agent: {error}", flush=True)
            time.sleep(SYNC_EVERY)
    finally:
        agent.stop_all()
        if agent.probe is not None:
            agent.probe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
