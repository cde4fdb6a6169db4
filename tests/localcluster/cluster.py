"""A real Kubernetes control plane on 127.0.0.1, with KWOK's fake kubelets: what `scripts/local-cluster` starts.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler are the upstream binaries built by
scripts/install-test-tools; KWOK's controller keeps the fake nodes (GPU nodes with nvidia.com/gpu capacity, CPU
nodes) Ready and plays their pods' lifecycle; the agent (tests/localcluster/agent.py) runs a real process for the pods
whose image it knows (OPA, kube-scheduler) and plays the gpu-operator's controller.

Everything lives in one folder (certificates, etcd's data, logs, the audit log, kubeconfigs, cluster.json with the
ports and the processes' PIDs). `down` stops exactly the processes `up` recorded (a PID whose start time no longer
matches is someone else's and is left alone), then removes the folder.
"""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.localcluster import nodes as node_specs
from tests.localcluster import pki
from tests.localcluster.rest import ApiError, Rest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools"
STATE = "cluster.json"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
# Pods and nodes get addresses from a /20 of 198.18.0.0/15 (RFC 2544's benchmarking range, never a real network's),
# routed as `local` to the loopback device, so that a process here answers on any address of it (agent.py). Not
# 127.0.0.0/8: the API server refuses loopback addresses in Endpoints and EndpointSlices, so Services would have no
# endpoints. Each cluster takes a /20 no other local route overlaps and `down` removes exactly that route.
NETWORKS = "198.18.0.0/15"
NETWORK_PREFIX = 20
ADMIN_AGENT = "local-cluster"
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  # Who wrote what, with its user agent (no bodies: Secrets' data never reaches the log). Reads are left out: the
  # tests count writes, and reads are most requests (a log of every one grew by about 3 MB a minute).
  - level: None
    verbs: [get, list, watch]
  # A DELETE's body is its DeleteOptions (never a Secret's data): logged, as the server reads dryRun from it and
  # ignores the query when there is a body, so only the body says whether a delete was a dry run
  - level: Request
    verbs: [delete, deletecollection]
  - level: Metadata
"""


class ClusterError(Exception):
    """The local cluster could not be started or stopped; the message says which component and where its log is."""


def gomod_version(component: str, module: str) -> str:
    for line in (ROOT / "scripts" / "gomod" / component / "go.mod").read_text().splitlines():
        words = line.split()
        if module in words:
            return words[words.index(module) + 1]
    raise ClusterError(f"scripts/gomod/{component}/go.mod does not require {module}")


def binaries() -> dict[str, Path]:
    """Where scripts/install-test-tools put each component (.tools/<component>/<version>/)."""
    kube = TOOLS / "kubernetes" / gomod_version("kubernetes", "k8s.io/kubernetes")
    kwok = TOOLS / "kwok" / gomod_version("kwok", "sigs.k8s.io/kwok")
    promop = TOOLS / "prometheus-operator" / gomod_version("prometheus-operator",
                                                            "github.com/prometheus-operator/prometheus-operator")
    gpu_operator = TOOLS / "gpu-operator" / gomod_version("gpu-operator", "github.com/NVIDIA/gpu-operator")
    kueue = TOOLS / "kueue" / gomod_version("kueue", "sigs.k8s.io/kueue")
    karpenter = TOOLS / "karpenter" / gomod_version("karpenter", "sigs.k8s.io/karpenter")
    keda = TOOLS / "keda" / gomod_version("keda", "github.com/kedacore/keda/v2")
    return {"etcd": TOOLS / "etcd" / gomod_version("etcd", "go.etcd.io/etcd/server/v3") / "etcd",
            "kube-apiserver": kube / "kube-apiserver", "kube-controller-manager": kube / "kube-controller-manager",
            "kube-scheduler": kube / "kube-scheduler",
            # the last minor whose BalancedAllocation scores the balance after placement (1.36 scores the change)
            "kube-scheduler-1.35": TOOLS / "kube-scheduler-1.35" / gomod_version("kube-scheduler-1.35",
                                                                               "k8s.io/kubernetes") / "kube-scheduler",
            "kwok": kwok / "kwok", "kwok-stages": kwok / "stages.yaml",
            "opa": TOOLS / "opa" / gomod_version("opa", "github.com/open-policy-agent/opa") / "opa",
            "prometheus": TOOLS / "prometheus" / gomod_version("prometheus", "github.com/prometheus/prometheus") /
            "prometheus",
            "prometheus-operator": promop / "prometheus-operator",
            "prometheus-config-reloader": promop / "prometheus-config-reloader",
            # NVIDIA's controller of the 25.3 line, its state manifests and the chart of its commit (labelled v25.3.4)
            "gpu-operator": gpu_operator / "gpu-operator", "gpu-operator-assets": gpu_operator / "assets",
            "gpu-operator-chart": gpu_operator / "chart",
            "kueue": kueue / "kueue", "kueue-chart": kueue / "chart",  # Kueue's controller manager and its chart
            # Karpenter's core with its KWOK cloud provider, and its CRDs (with the KWOKNodeClass)
            "karpenter": karpenter / "karpenter-kwok", "karpenter-crds": karpenter / "crds",
            # KEDA's operator and metrics adapter, and its CRDs
            "keda-operator": keda / "keda-operator", "keda-adapter": keda / "keda-adapter", "keda-crds": keda / "crds",
            "kubectl": TOOLS / "bin" / "kubectl"}


KARPENTER_PARTS = ("karpenter", "karpenter-crds")  # needed only by a cluster started with karpenter=True
KEDA_PARTS = ("keda-operator", "keda-adapter", "keda-crds")  # needed only by a cluster started with keda=True


def missing_binaries(karpenter: bool = False, keda: bool = False) -> list[str]:
    return [f"{name} ({path})" for name, path in binaries().items()
            if not path.exists() and (karpenter or name not in KARPENTER_PARTS) and (keda or name not in KEDA_PARTS)]


def require(*names: str) -> None:
    """Skip (or, under GPU_BOOTSTRAP_REQUIRE_TOOLS, fail) a test whose binaries `names` are not built."""
    from tests.tools import missing
    absent = [f"{name} ({path})" for name, path in binaries().items() if name in names and not path.exists()]
    if absent:
        missing("not built: " + ", ".join(absent))


def kubernetes_version() -> str:
    return gomod_version("kubernetes", "k8s.io/kubernetes")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_time(pid: int) -> str | None:
    """The process' start time in clock ticks since boot (/proc/PID/stat field 22): with the PID, it names one
    process, so a recycled PID is never mistaken for ours."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]  # a zombie has exited: it is not running


def pdeathsig_hook():
    """preexec_fn: SIGKILL when the process that started us dies (a test session's cluster dies with pytest)."""
    import ctypes
    import ctypes.util
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    parent = os.getpid()

    def hook():
        os.setsid()
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    return hook


@dataclass
class LocalCluster:
    folder: Path
    ports: dict = field(default_factory=dict)
    pids: dict = field(default_factory=dict)  # name -> [pid, start time]
    version: str = ""
    nodes: dict = field(default_factory=dict)  # name -> {"gpus": N, ...}
    network: str = ""  # the /20 routed to loopback for this cluster's pods and nodes
    route_added: bool = False

    # --- paths ---
    @property
    def kubeconfig(self) -> Path:
        return self.folder / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.folder / "audit.log"

    @property
    def pki(self) -> Path:
        return self.folder / "pki"

    @property
    def ca(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def log(self, name: str) -> Path:
        return self.folder / "logs" / f"{name}.log"

    def admin(self, agent: str = ADMIN_AGENT) -> Rest:
        return Rest("127.0.0.1", self.ports["apiserver"], self.ca, self.pki / "admin.crt", self.pki / "admin.key",
                    agent=agent)

    # --- state ---
    def save(self) -> None:
        state = {"ports": self.ports, "pids": self.pids, "version": self.version, "nodes": self.nodes,
                 "network": self.network, "route_added": self.route_added, "kubeconfig": str(self.kubeconfig)}
        partial = self.folder / f".{STATE}.partial"
        partial.write_text(json.dumps(state, indent=2) + "\n")
        partial.replace(self.folder / STATE)

    @classmethod
    def load(cls, folder: Path) -> "LocalCluster | None":
        path = folder / STATE
        if not path.exists():
            return None
        state = json.loads(path.read_text())
        return cls(folder, state["ports"], state["pids"], state["version"], state.get("nodes") or {},
                   state.get("network", ""), state.get("route_added", False))

    def running(self) -> dict[str, int]:
        """Our processes that still run (same PID and start time as recorded)."""
        return {name: pid for name, (pid, started) in self.pids.items() if start_time(pid) == started}

    # --- processes ---
    def spawn(self, name: str, args: list[str], die_with_parent: bool, env: dict | None = None) -> None:
        self.log(name).parent.mkdir(parents=True, exist_ok=True)
        with self.log(name).open("ab") as log:
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       cwd=self.folder, env=env or _clean_env(),  # tool_env: a component's own
                                       preexec_fn=pdeathsig_hook() if die_with_parent else os.setsid)
        started = None
        for _ in range(100):
            started = start_time(process.pid)
            if started is not None:
                break
            time.sleep(0.01)
        self.pids[name] = [process.pid, started]
        self.save()

    def check_alive(self, name: str) -> None:
        pid, started = self.pids[name]
        if start_time(pid) != started:
            tail = self.log(name).read_text(errors="replace")[-3000:] if self.log(name).exists() else ""
            raise ClusterError(f"{name} exited during start-up; its log ({self.log(name)}) ends with:\n{tail}")

    def wait(self, name: str, probe, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            self.check_alive(name)
            try:
                if probe():
                    return
            except Exception as error:  # noqa: BLE001 - not up yet; the last error is reported on timeout
                last = error
            time.sleep(0.2)
        raise ClusterError(f"{name} was not ready within {timeout:.0f}s (last error: {last}); see {self.log(name)}")


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "GOFLAGS"))}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return env


def kubeconfig_text(server: str, ca: Path, cert: Path, key: Path, user: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "local-cluster", "preferences": {},
        "clusters": [{"name": "local-cluster", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "local-cluster", "context": {"cluster": "local-cluster", "user": user}}]}, indent=2)


def _write_private(path: Path, text: str) -> Path:
    path.touch(mode=0o600)
    path.write_text(text)
    return path


def up(folder: Path, *, gpu_nodes: int = 2, gpus_per_node: int = 4, cpu_nodes: int = 2,
       die_with_parent: bool = False, agent: bool = True, timeout: float = 180, progress=None,
       dra: bool = False, karpenter: bool = False, keda: bool = False) -> LocalCluster:
    """Start the cluster in `folder` (made 0700; it must not hold a running cluster) and return it when every
    component answers, the nodes are Ready and the default service account exists. `dra`: the GPU nodes' GPUs are
    ResourceSlices of NVIDIA's DRA driver (its DeviceClasses come with its chart), no `nvidia.com/gpu` capacity.
    `karpenter`: the real Karpenter with its KWOK provider and GPU instance types runs too (karpenter.py).
    `keda`: the real KEDA operator and metrics adapter run too, serving external.metrics.k8s.io (keda.py), and the
    HPA controller syncs every HPA_SYNC instead of 15 s."""
    say = progress or (lambda message: None)
    absent = missing_binaries(karpenter, keda)
    if absent:
        raise ClusterError("not built: " + ", ".join(absent) + "; run scripts/install-test-tools")
    existing = LocalCluster.load(folder)
    if existing is not None and existing.running():
        raise ClusterError(f"a cluster already runs from {folder} (PIDs {existing.running()}); "
                           f"scripts/local-cluster down --dir {folder} stops it")
    # A port free_port() found can be taken before the component binds it (the kernel hands the same range out to
    # other processes' outgoing connections): KWOK once exited with "address already in use", and the whole live
    # suite with it. Such a start is repeated from scratch with new ports.
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return _up_once(folder, gpu_nodes, gpus_per_node, cpu_nodes, die_with_parent, agent, timeout, say, dra,
                            karpenter, keda)
        except ClusterError as error:
            if "address already in use" not in str(error) or attempt == PORT_ATTEMPTS:
                raise
            say(f"a port was taken before its component bound it; starting again with new ports ({error})")
    raise AssertionError("unreachable")


PORT_ATTEMPTS = 3


def _up_once(folder: Path, gpu_nodes: int, gpus_per_node: int, cpu_nodes: int, die_with_parent: bool, agent: bool,
             timeout: float, say, dra: bool = False, karpenter: bool = False, keda: bool = False) -> LocalCluster:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, mode=0o700)
    (folder / "pki").mkdir(mode=0o700)
    tools = binaries()
    cluster = LocalCluster(folder.resolve(), version=kubernetes_version())
    cluster.ports = {"etcd": free_port(), "etcd-peer": free_port(), "apiserver": free_port(),
                     "kubelet": free_port(), "kwok": free_port()}
    if karpenter:
        cluster.ports.update({"karpenter-metrics": free_port(), "karpenter-health": free_port()})
    if keda:
        from tests.localcluster.keda import PORTS as KEDA_PORTS
        cluster.ports.update({name: free_port() for name in KEDA_PORTS})
    cluster.nodes = node_specs.layout(gpu_nodes, gpus_per_node, cpu_nodes, dra)
    cluster.save()
    try:
        _route_network(cluster)
        _certificates(cluster)
        say("etcd")
        _start_etcd(cluster, tools, die_with_parent)
        say("kube-apiserver")
        _start_apiserver(cluster, tools, die_with_parent, timeout)
        say("kube-controller-manager, kube-scheduler")
        _start_controllers(cluster, tools, die_with_parent, keda)
        say(f"nodes ({gpu_nodes} GPU, {cpu_nodes} CPU) and KWOK")
        api = cluster.admin()
        for node in node_specs.objects(cluster.nodes, cluster.network):
            api.create("/api/v1/nodes", node)
        if dra:
            _publish_dra_gpus(cluster, api)
        _start_kwok(cluster, tools, die_with_parent)
        if karpenter:
            say("Karpenter (its KWOK provider, GPU instance types)")
            _start_karpenter(cluster, tools, api, die_with_parent, timeout)
        if keda:
            say("KEDA (its operator and metrics adapter, external.metrics.k8s.io)")
            _start_keda(cluster, tools, api, die_with_parent, timeout)
        if agent:
            say("agent (OPA and kube-scheduler pods; the gpu-operator controller, real for the chart built beside it)")
            _start_agent(cluster, die_with_parent)
        _wait_usable(cluster, timeout)
    except BaseException:
        stop_processes(cluster)
        _unroute_network(cluster)
        raise
    return cluster


def _publish_dra_gpus(cluster: LocalCluster, api) -> None:
    """What NVIDIA's DRA driver's kubelet plugin publishes for the DRA nodes: one ResourceSlice per node. No plugin
    runs here, so the slices are written once, as the admin. The driver's DeviceClasses are not made: they come with
    its chart, which `up` installs in dra mode (a class made beside the chart is a driver installed another way, which
    `up` names and leaves alone)."""
    from tests.localcluster import dra
    for name, spec in sorted(cluster.nodes.items()):
        if spec.get("dra"):
            api.create("/apis/resource.k8s.io/v1/resourceslices", dra.resource_slice(name, spec["gpus"]))


def control_plane(folder: Path, *, die_with_parent: bool = False, timeout: float = 180) -> LocalCluster:
    """etcd and kube-apiserver only, configured as `up` configures them: no nodes, KWOK, controllers or agent, and
    no route (nothing runs in a pod). For benchmarks that bring their own nodes and kube-scheduler
    (benchmarks/packing_real.py); the caller creates what the controller-manager would (service accounts)."""
    absent = [f"{name} ({path})" for name, path in binaries().items()
              if name in ("etcd", "kube-apiserver") and not path.exists()]
    if absent:
        raise ClusterError("not built: " + ", ".join(absent) + "; run scripts/install-test-tools")
    for attempt in range(1, PORT_ATTEMPTS + 1):  # as up(): a port taken before its component bound it
        try:
            return _control_plane_once(folder, die_with_parent, timeout)
        except ClusterError as error:
            if "address already in use" not in str(error) or attempt == PORT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _control_plane_once(folder: Path, die_with_parent: bool, timeout: float) -> LocalCluster:
    if folder.exists():
        existing = LocalCluster.load(folder)
        if existing is not None and existing.running():
            raise ClusterError(f"a cluster already runs from {folder} (PIDs {existing.running()})")
        shutil.rmtree(folder)
    folder.mkdir(parents=True, mode=0o700)
    (folder / "pki").mkdir(mode=0o700)
    tools = binaries()
    cluster = LocalCluster(folder.resolve(), version=kubernetes_version())
    cluster.ports = {"etcd": free_port(), "etcd-peer": free_port(), "apiserver": free_port()}
    cluster.network = str(next(ipaddress.ip_network(NETWORKS).subnets(new_prefix=NETWORK_PREFIX)))
    cluster.save()
    try:
        _certificates(cluster)
        _start_etcd(cluster, tools, die_with_parent)
        _start_apiserver(cluster, tools, die_with_parent, timeout)
    except BaseException:
        stop_processes(cluster)
        raise
    return cluster


def _local_routes() -> list:
    out = subprocess.run(["ip", "-4", "route", "show", "table", "local"], capture_output=True, text=True,
                         check=True).stdout
    found = []
    for line in out.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "local":
            try:
                found.append(ipaddress.ip_network(words[1], strict=False))
            except ValueError:
                continue
    return found


def _listening_addresses() -> list:
    """IPv4 addresses some process listens on (/proc/net/tcp, state LISTEN). A pod process of an earlier cluster
    that outlived it (its agent killed with SIGKILL, a user-switched child that no parent-death signal reaches) keeps
    its pod's address: a new cluster on that /20 would find its webhook's address taken, or reach the old server."""
    found = []
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A":
            address = fields[1].split(":")[0]
            found.append(ipaddress.ip_address(bytes(reversed(bytes.fromhex(address)))))
    return found


def _route_network(cluster: LocalCluster) -> None:
    """Route a free /20 of NETWORKS to loopback (needs root: CAP_NET_ADMIN). Two clusters starting at once (the
    suite's two xdist groups) may both find the same /20 free: `ip route add` is the arbiter, and the one that loses
    takes the next."""
    if shutil.which("ip") is None:
        raise ClusterError("the ip command (Debian package iproute2) is needed to route the pods' addresses")
    taken = _local_routes()
    listening = _listening_addresses()
    for network in ipaddress.ip_network(NETWORKS).subnets(new_prefix=NETWORK_PREFIX):
        if any(network.overlaps(other) for other in taken) or any(address in network for address in listening):
            continue
        result = subprocess.run(["ip", "route", "add", "local", str(network), "dev", "lo"], capture_output=True,
                                text=True)
        if result.returncode != 0 and "File exists" in result.stderr:
            continue  # another cluster starting at the same moment took it between our look and our add
        if result.returncode != 0:
            raise ClusterError(f"could not route {network} to loopback for the pods' addresses "
                               f"(`ip route add local {network} dev lo`: {result.stderr.strip()}); this needs root")
        cluster.network, cluster.route_added = str(network), True
        cluster.save()
        return
    raise ClusterError(f"every /{NETWORK_PREFIX} of {NETWORKS} is routed already (other local clusters?)")


def _unroute_network(cluster: LocalCluster) -> None:
    if cluster.route_added and cluster.network:
        subprocess.run(["ip", "route", "del", "local", cluster.network, "dev", "lo"], capture_output=True)
        cluster.route_added = False


def _certificates(cluster: LocalCluster) -> None:
    ca = pki.Authority(cluster.pki, "ca")
    ca.issue("apiserver", "kube-apiserver", hosts=("127.0.0.1", "localhost", SERVICE_IP, "kubernetes",
                                                   "kubernetes.default", "kubernetes.default.svc",
                                                   "kubernetes.default.svc.cluster.local"), server=True)
    ca.issue("admin", "kubernetes-admin", organizations=("system:masters",), client=True)
    ca.issue("controller-manager", "system:kube-controller-manager", client=True)
    ca.issue("scheduler", "system:kube-scheduler", client=True)
    ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", organizations=("kubeadm:cluster-admins",),
             client=True)
    ca.issue("kubelet", "local-cluster-kubelet", hosts=("127.0.0.1", *node_specs.addresses(cluster.nodes,
                                                                                       cluster.network)),
             server=True)
    # The front proxy's own CA, as kubeadm makes it: the API server proxies requests to aggregated APIs (Kueue's
    # visibility server) with this client certificate, and they trust the user it names by this CA
    front = pki.Authority(cluster.pki, "front-proxy-ca")
    front.issue("front-proxy-client", "front-proxy-client", client=True)
    pki.service_account_key(cluster.pki)
    for user in ("admin", "controller-manager", "scheduler"):
        text = kubeconfig_text(f"https://127.0.0.1:{cluster.ports['apiserver']}", cluster.ca,
                               cluster.pki / f"{user}.crt", cluster.pki / f"{user}.key", user)
        _write_private(cluster.folder / f"{user}.kubeconfig", text)
    _write_private(cluster.folder / "audit-policy.yaml", AUDIT_POLICY)


def _start_etcd(cluster: LocalCluster, tools: dict, die_with_parent: bool) -> None:
    client = f"http://127.0.0.1:{cluster.ports['etcd']}"
    peer = f"http://127.0.0.1:{cluster.ports['etcd-peer']}"
    cluster.spawn("etcd", [str(tools["etcd"]), "--name=local", f"--data-dir={cluster.folder / 'etcd'}",
                           f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                           f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                           f"--initial-cluster=local={peer}", "--unsafe-no-fsync=true",
                           "--listen-metrics-urls=", "--log-level=warn"], die_with_parent)

    def healthy() -> bool:
        import urllib.request
        with urllib.request.urlopen(f"{client}/health", timeout=2) as response:
            return b'"true"' in response.read()
    cluster.wait("etcd", healthy, 60)


def _start_apiserver(cluster: LocalCluster, tools: dict, die_with_parent: bool, timeout: float) -> None:
    pki_dir = cluster.pki
    args = [str(tools["kube-apiserver"]),
            f"--etcd-servers=http://127.0.0.1:{cluster.ports['etcd']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            # The endpoint reconciler refuses a loopback address for the `kubernetes` Service; in-cluster clients
            # here (the agent's processes) are given the server's address directly.
            "--endpoint-reconciler-type=none", f"--secure-port={cluster.ports['apiserver']}",
            f"--cert-dir={pki_dir}", f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
            f"--tls-private-key-file={pki_dir / 'apiserver.key'}", f"--client-ca-file={cluster.ca}",
            f"--kubelet-client-certificate={pki_dir / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki_dir / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={cluster.ca}",
            "--kubelet-preferred-address-types=InternalIP",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki_dir / 'sa.pub'}",
            f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            # The default plugins (ServiceAccount, PodSecurity, the webhook and CEL policy plugins among them) plus
            # NodeRestriction, as kubeadm enables it.
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            # Webhooks and service proxies go to the Service's endpoints (pods' 127.x addresses), not its ClusterIP,
            # which nothing routes here.
            "--enable-aggregator-routing=true",
            # Aggregated APIs authenticate the API server's proxied requests by the front proxy's certificate
            # (kubeadm's flags)
            f"--requestheader-client-ca-file={pki_dir / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client", "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group", "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki_dir / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki_dir / 'front-proxy-client.key'}",
            f"--audit-policy-file={cluster.folder / 'audit-policy.yaml'}", f"--audit-log-path={cluster.audit_log}",
            "--audit-log-format=json", "--audit-log-maxsize=0",
            "--profiling=false", "--v=1"]
    cluster.spawn("kube-apiserver", args, die_with_parent)
    api = cluster.admin()
    cluster.wait("kube-apiserver", lambda: api.request("GET", "/readyz") == "ok", timeout)


# The HPA controller's sync period on a cluster with KEDA (the default is 15 s): a test sees each scaling step sooner
HPA_SYNC = "5s"


def _start_controllers(cluster: LocalCluster, tools: dict, die_with_parent: bool, keda: bool = False) -> None:
    pki_dir = cluster.pki
    cm = cluster.folder / "controller-manager.kubeconfig"
    hpa = [f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC}"] if keda else []
    cluster.spawn("kube-controller-manager", [
        str(tools["kube-controller-manager"]), f"--kubeconfig={cm}", f"--authentication-kubeconfig={cm}",
        f"--authorization-kubeconfig={cm}", "--bind-address=127.0.0.1", "--secure-port=0",
        "--leader-elect=false", "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki_dir / 'sa.key'}", f"--root-ca-file={cluster.ca}",
        f"--cluster-signing-cert-file={pki_dir / 'ca.crt'}", f"--cluster-signing-key-file={pki_dir / 'ca.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}", *hpa, "--profiling=false", "--v=1"], die_with_parent)
    sched = cluster.folder / "scheduler.kubeconfig"
    cluster.spawn("kube-scheduler", [
        str(tools["kube-scheduler"]), f"--kubeconfig={sched}", f"--authentication-kubeconfig={sched}",
        f"--authorization-kubeconfig={sched}", "--bind-address=127.0.0.1", "--secure-port=0",
        "--leader-elect=false", "--profiling=false", "--v=1"], die_with_parent)


# Pods KWOK must not complete by itself: the agent runs their container and reports how it ended (agent.py).
AGENT_COMPLETES = ("kube-webhook-certgen",)
# A Job pod with this label runs until a test ends it (as its container would, by exiting): KWOK completes other Job
# pods as soon as they run, which leaves no time to see a training job hold its GPUs
HOLD_LABEL = "local-cluster.gpu-bootstrap.test/hold"


def kwok_stages(tools: dict, folder: Path) -> Path:
    """KWOK's standard Stages, except that pod-complete leaves the Job pods the agent runs to the agent, and
    pod-ready leaves the pods bound to the nodes with a file tree to the agent's kubelet stand-in
    (probe_kubelet.py), and those bound to fleet nodes (nodes.FLEET_PREFIX) to the benchmark that made them."""
    import yaml
    stages = [s for s in yaml.safe_load_all(tools["kwok-stages"].read_text()) if s]
    for stage in stages:
        if stage["metadata"]["name"] == "pod-ready":
            stage["spec"]["selector"]["matchExpressions"].append({
                "key": ".spec.nodeName", "operator": "NotIn", "values": list(node_specs.TREE_NODES)})
            stage["spec"]["selector"]["matchExpressions"].append({
                "key": f'.spec.nodeName // "" | select(startswith("{node_specs.FLEET_PREFIX}"))',
                "operator": "DoesNotExist"})
        if stage["metadata"]["name"] == "pod-complete":
            stage["spec"]["selector"]["matchExpressions"].append({
                "key": f'.metadata.labels["{HOLD_LABEL}"]', "operator": "DoesNotExist"})
            for image in AGENT_COMPLETES:
                stage["spec"]["selector"]["matchExpressions"].append({
                    "key": f'.spec.containers.[] | select(.image | contains("{image}")) | .image',
                    "operator": "DoesNotExist"})
    path = folder / "kwok-stages.yaml"
    path.write_text(yaml.safe_dump_all(stages, sort_keys=False))
    return path


def _start_kwok(cluster: LocalCluster, tools: dict, die_with_parent: bool) -> None:
    stages = kwok_stages(tools, cluster.folder)
    cluster.spawn("kwok", [
        str(tools["kwok"]), f"--kubeconfig={cluster.folder / 'admin.kubeconfig'}", f"--config={stages}",
        f"--manage-nodes-with-annotation-selector={node_specs.KWOK_ANNOTATION}=fake",
        f"--cidr={node_specs.pod_cidr(cluster.network, len(cluster.nodes))}",
        f"--node-ip={node_specs.addresses(cluster.nodes, cluster.network)[0]}", "--node-lease-duration-seconds=40",
        # the nodes' kubelet endpoint: the agent serves containers' logs there (agent.KubeletLogs); KWOK's own
        # server would take that port on every address unless given one of its own
        f"--node-port={cluster.ports['kubelet']}", f"--server-address=127.0.0.1:{cluster.ports['kwok']}"],
        die_with_parent)


def _start_karpenter(cluster: LocalCluster, tools: dict, api, die_with_parent: bool, timeout: float) -> None:
    """Karpenter's CRDs, applied as its chart would (and established), then Karpenter itself, ready when its health
    endpoint answers."""
    import urllib.request
    from tests.localcluster import karpenter
    for crd in karpenter.crd_documents(tools["karpenter-crds"]):
        api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

    def established() -> bool:
        items = api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]
        found = {c["metadata"]["name"] for c in items for cond in (c.get("status") or {}).get("conditions") or []
                 if cond["type"] == "Established" and cond["status"] == "True"}
        return {"nodepools.karpenter.sh", "nodeclaims.karpenter.sh", "kwoknodeclasses.karpenter.kwok.sh"} <= found
    cluster.wait("kube-apiserver", established, timeout)
    types = karpenter.write_instance_types(cluster.folder)
    cluster.spawn("karpenter", karpenter.command(tools["karpenter"], cluster.ports), die_with_parent,
                  env=karpenter.environment(_clean_env(), cluster.folder / "admin.kubeconfig", types))

    def healthy() -> bool:
        url = f"http://127.0.0.1:{cluster.ports['karpenter-health']}/readyz"
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - our own loopback endpoint
            return response.status == 200
    cluster.wait("karpenter", healthy, timeout)


def _start_keda(cluster: LocalCluster, tools: dict, api, die_with_parent: bool, timeout: float) -> None:
    """KEDA's CRDs (established), its certificates, the adapter's Service, endpoint and APIService, then the operator
    (ready when its health endpoint answers) and the adapter (ready when the aggregator finds its API available)."""
    import urllib.request
    from tests.localcluster import keda
    from tests.localcluster.karpenter import crd_documents
    for crd in crd_documents(tools["keda-crds"]):
        api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

    def established() -> bool:
        items = api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]
        found = {c["metadata"]["name"] for c in items for cond in (c.get("status") or {}).get("conditions") or []
                 if cond["type"] == "Established" and cond["status"] == "True"}
        return set(keda.CRDS) <= found
    cluster.wait("kube-apiserver", established, timeout)
    address = keda.adapter_address(cluster.network)
    certs = keda.certificates(cluster.folder / "keda", address)
    for path, document in keda.api_objects(address, cluster.ports["keda-adapter"], (certs / "ca.crt").read_bytes()):
        api.create(path, document)
    env = keda.environment(_clean_env(), cluster.kubeconfig)
    cluster.spawn("keda-operator", keda.operator_command(tools["keda-operator"], cluster.ports, certs),
                  die_with_parent, env=env)

    def healthy() -> bool:
        url = f"http://127.0.0.1:{cluster.ports['keda-health']}/readyz"
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - our own loopback endpoint
            return response.status == 200
    cluster.wait("keda-operator", healthy, timeout)
    cluster.spawn("keda-adapter", keda.adapter_command(tools["keda-adapter"], cluster.ports, certs,
                                                       cluster.kubeconfig, address), die_with_parent, env=env)
    cluster.wait("keda-adapter", lambda: keda.api_service_available(api), timeout)


def _start_agent(cluster: LocalCluster, die_with_parent: bool) -> None:
    env = _clean_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cluster.spawn("agent", [sys.executable, "-m", "tests.localcluster.agent", str(cluster.folder)], die_with_parent,
                  env=env)


def _wait_usable(cluster: LocalCluster, timeout: float) -> None:
    api = cluster.admin()

    def nodes_ready() -> bool:
        items = api.get("/api/v1/nodes")["items"]
        ready = [n for n in items for c in n.get("status", {}).get("conditions", [])
                 if c["type"] == "Ready" and c["status"] == "True"]
        return len(ready) == len(cluster.nodes)
    cluster.wait("kwok", nodes_ready, timeout)

    def default_account() -> bool:
        return bool(api.get("/api/v1/namespaces/default/serviceaccounts/default"))
    cluster.wait("kube-controller-manager", default_account, timeout)


def stop_processes(cluster: LocalCluster, grace: float = 10) -> list[str]:
    """SIGTERM to each recorded process that is still ours, then SIGKILL after `grace`; returns what was stopped."""
    alive = cluster.running()
    order = ["agent", "keda-adapter", "keda-operator", "karpenter", "kwok", "kube-scheduler",
             "kube-controller-manager", "kube-apiserver", "etcd"]
    names = [n for n in order if n in alive] + [n for n in alive if n not in order]
    for name in names:
        _signal_group(alive[name], signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and cluster.running():
        time.sleep(0.1)
    for name, pid in cluster.running().items():
        _signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and cluster.running():
        time.sleep(0.05)
    return names


def _signal_group(pid: int, sig: int) -> None:
    """Our processes lead their own session (setsid): the group holds what they started (the agent's children)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def down(folder: Path) -> list[str]:
    cluster = LocalCluster.load(folder)
    stopped = stop_processes(cluster) if cluster is not None else []
    if cluster is not None and cluster.running():
        raise ClusterError(f"still running after SIGKILL: {cluster.running()}")
    if cluster is not None:
        _unroute_network(cluster)
    if folder.exists():
        shutil.rmtree(folder)
    return stopped


def retry_api(call, attempts: int = 30, delay: float = 0.5):
    """The API server may answer 429/5xx while it starts; retry those, raise anything else."""
    for attempt in range(attempts):
        try:
            return call()
        except ApiError as error:
            if error.status < 429 or attempt == attempts - 1:
                raise
            time.sleep(delay)
