#!/usr/bin/env python3
"""How fast preflight reads node facts through the cluster (issue 24), and with how many API requests, next to the
SSH fan-out on the same nodes in the same run.

The cluster: the emulator (tests/kubeapi) with N GPU nodes; its kubelet stand-in runs the probe pods (one per node).
At 100 nodes every probe really runs: the stand-in executes the containers' commands against each node's chrooted
tree (tests/nodes; the same trees real sshd serves for the SSH row). At 1,000 nodes the stand-in returns a canned
result per node type (the termination messages a real run of that type produced), so the row measures the tool and
the API round trips, not 1,000 busybox runs on 2 cores. The client is a separate process (the real Kube adapter
over HTTPS), started cold; requests are the adapter's own count.

Targets: 1,000 nodes <= 10 s wall; one pod create per node and otherwise requests that do not grow with the node
count beyond list pagination (500 per page), each the same size whatever the fleet's. The wall time includes the emulator's own work (it stores and serves every pod and status write on the same
cores; about 4 ms of CPU per probe pod: create, bind, status, delete); the client's CPU is printed beside it.

`--real 1000,5000` measures the same client on the real control plane (tests/localcluster: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler v1.37, KWOK) with that many fake GPU nodes (named nodes.FLEET_PREFIX*):
KWOK keeps them Ready, and this script plays their kubelet for the probe pods, answering each with one status write
holding the canned result of its node's type (as at 1,000 nodes above). The wall time then includes the real API
server, etcd and KWOK (which heartbeats every node) on the same cores, and this script's status writes.

Usage: sudo python benchmarks/incluster_probe.py [--sizes 100,1000] [--runs 3] [--ssh-nodes 100] [--real 1000,5000]
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.kubeapi import Emulator  # noqa: E402
from tests.nodes import scenarios  # noqa: E402
from tests.nodes.farm import NodeFarm  # noqa: E402

TYPES = list(scenarios.SCENARIOS)
CLIENT = """
import json, sys, time
from pathlib import Path
from gpu_bootstrap.adapters.kube import Kube
from gpu_bootstrap.adapters.nodefacts import ClusterProbedNodes
from gpu_bootstrap.core.config import PreflightConfig
names = Path(sys.argv[2]).read_text().split()
from gpu_bootstrap.adapters import cluster_probe
phases = {}
def timed(name, method):
    def run(*args, **kwargs):
        began = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - began
    return run
for name, what in (("_create_pods", "create"), ("_wait", "wait"), ("_remove", "remove")):
    setattr(cluster_probe.ClusterProbe, name, timed(what, getattr(cluster_probe.ClusterProbe, name)))
kube = Kube(Path(sys.argv[1]))
started = time.perf_counter()
reports = ClusterProbedNodes(names, kube, PreflightConfig(via="cluster", timeout=120)).reports()
elapsed = time.perf_counter() - started
known = sum(1 for r in reports.values() if r.check("ssh").status == "pass")
print(json.dumps({"seconds": elapsed, "known": known, "requests": kube.requests, "cpu": time.process_time(),
                  "phases": phases}))
"""


FAILED: list = []  # real_plane puts here a function that says what its stand-in kubelet could not answer


def node_type(index: int) -> str:
    return TYPES[index % len(TYPES)]


def probe(kubeconfig: Path, names: list[str], folder: Path) -> dict:
    listing = folder / f"names-{len(names)}.txt"
    listing.write_text("\n".join(names))
    result = subprocess.run([sys.executable, "-c", CLIENT, str(kubeconfig), str(listing)], capture_output=True,
                            text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    if result.returncode != 0:
        raise SystemExit(f"the probe client failed: {result.stderr[-1500:]}")
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    if outcome["known"] != len(names):
        raise SystemExit(f"only {outcome['known']} of {len(names)} nodes have facts: the run is not comparable"
                         + (f" ({FAILED[0]()})" if FAILED else ""))
    return outcome


def wait_clean(emu: Emulator) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(
            ns["metadata"]["name"].startswith("gpu-bootstrap-probe") for ns in emu.list("namespaces")):
        time.sleep(0.1)


def measure(emu: Emulator, kubeconfig: Path, names: list[str], runs: int, folder: Path) -> tuple[float, int, float]:
    """Median wall seconds, API requests and the client's own CPU seconds (start-up included)."""
    seconds, requests, cpu = [], [], []
    for _ in range(runs):
        outcome = probe(kubeconfig, names, folder)
        seconds.append(outcome["seconds"])
        requests.append(outcome["requests"])
        cpu.append(outcome["cpu"])
        wait_clean(emu)
    return statistics.median(seconds), int(statistics.median(requests)), statistics.median(cpu)


def ssh_fanout(farm: NodeFarm, folder: Path, names: list[str], runs: int) -> float:
    config = farm.config_yaml(folder / "ssh.yaml", farm.known_hosts(folder / "known_hosts", names), names)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "gpu_bootstrap", "doctor", "-c", str(config), "--no-cluster",
                                 "--via", "ssh", "-o", "json"], capture_output=True, text=True,
                                env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        times.append(time.perf_counter() - started)
        if not result.stdout.startswith("{"):
            raise SystemExit(f"doctor over SSH ended {result.returncode}: {result.stderr[-2000:]}")
        nodes = json.loads(result.stdout)["nodes"]
        if sum(1 for n in nodes if n["checks"][0]["status"] == "pass") != len(names):
            raise SystemExit("the SSH fan-out did not read every node")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ssh-nodes", type=int, default=100)
    parser.add_argument("--real", default="", metavar="SIZES",
                        help="also on the real control plane (the local cluster), with this many fleet nodes")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    real = min(sizes)
    folder = Path(tempfile.mkdtemp(prefix="incluster-probe-"))
    farm = NodeFarm()
    try:
        tree_names = [f"gpu-{i:04d}" for i in range(max(real, args.ssh_nodes, len(TYPES)))]
        for index, name in enumerate(tree_names):
            farm.add(name, scenarios.SCENARIOS[node_type(index)])
        canned: dict[str, dict] = {}
        for size in sizes:
            names = [f"gpu-{i:04d}" for i in range(size)]
            emu = Emulator(gpu_nodes=names, history_limit=200000).start()
            try:
                kubelet = emu.kubelet(workers=32)  # pods run at once (as many as the SSH fan-out's parallelism)
                kubeconfig = emu.write_kubeconfig(folder / f"kubeconfig-{size}")
                if size == real:
                    for name in names:
                        kubelet.attach(name, farm.nodes[name].root)
                    kubelet.executed.clear()
                    median, requests, cpu = measure(emu, kubeconfig, names, args.runs, folder)
                    canned = capture(farm, tree_names)  # one real result per node type, for the larger sizes
                    how = "every probe executed on its node tree"
                else:
                    for index, name in enumerate(names):
                        kubelet.canned[name] = replay(emu, *canned[node_type(index)])
                    median, requests, cpu = measure(emu, kubeconfig, names, args.runs, folder)
                    how = f"canned result per node type ({len(canned)} types, each from a real run)"
                print(f"cluster probe, {size} nodes: median {median:.2f} s, {requests} requests  [{how}; the "
                      f"client's own CPU {cpu:.2f} s, the rest is the emulator's work on this machine]", flush=True)
            finally:
                emu.stop()
        if args.real:
            real_plane([int(n) for n in args.real.split(",")], args.runs, folder,
                       canned or capture(farm, tree_names))
        ssh_names = tree_names[:args.ssh_nodes]
        print(f"ssh fan-out (doctor --via ssh --no-cluster, cold CLI), {len(ssh_names)} nodes: median "
              f"{ssh_fanout(farm, folder, ssh_names, args.runs):.2f} s", flush=True)
    finally:
        farm.close()
        shutil.rmtree(folder, ignore_errors=True)


def capture(farm: NodeFarm, names: list[str]) -> dict:
    """Per node type, the real probe script's output on a node tree of that type (run once, chrooted into the tree)
    and the marker it ran with."""
    from gpu_bootstrap.probes import script
    marker = script.new_marker()
    canned = {}
    for index, name in enumerate(names[:len(TYPES)]):
        done = subprocess.run([shutil.which("chroot"), str(farm.nodes[name].root), "/bin/sh", "-s"],
                              capture_output=True, text=True, input=script.build(marker), env={"PATH": "/bin:/usr/bin"})
        canned[node_type(index)] = (done.stdout, marker)
    return canned


def replay(emu: Emulator, output: str, marker: str):
    """The canned probe result for a pod: `output` re-marked with the pod's run marker (from the run's script)."""
    from gpu_bootstrap.probes import incluster

    def results(pod: dict) -> dict:
        script = emu.get("configmaps", incluster.NAME, pod["metadata"]["namespace"])["data"]["probe.sh"]
        current = re.search(r"GB_MARK='(@@gpu-bootstrap-[0-9a-f]{16}@@)'", script).group(1)
        messages = incluster.encode(output.replace(marker, current))
        return {("probe" if i == 0 else f"result-{i}"): (0, m) for i, m in enumerate(messages)}
    return results


# --- the real control plane ------------------------------------------------------------------------------------
def real_plane(sizes: list[int], runs: int, folder: Path, canned: dict) -> None:
    from tests.localcluster import cluster as local
    cluster = local.up(folder / "cluster", gpu_nodes=1, cpu_nodes=1, die_with_parent=True)
    kubelet = FleetKubelet(cluster, canned, folder)
    FLEET_FAILED = lambda: f"{len(kubelet.failed)} pods not answered: {kubelet.failed[:3]}"  # noqa: E731
    FAILED.append(FLEET_FAILED)
    try:
        made: list[str] = []
        for size in sorted(sizes):
            started = time.perf_counter()
            made += add_fleet(cluster, len(made), size)
            print(f"  ({size} fleet nodes Ready after {time.perf_counter() - started:.0f} s)", flush=True)
            seconds, requests, cpu, answered, phases = [], [], [], [], []
            for _ in range(runs):
                before = kubelet.answered
                outcome = probe(cluster.kubeconfig, made[:size], folder)
                seconds.append(outcome["seconds"])
                requests.append(outcome["requests"])
                cpu.append(outcome["cpu"])
                phases.append(outcome["phases"])
                answered.append(kubelet.answered - before)
                wait_clean_real(cluster)
            print(f"cluster probe on the real control plane, {size} nodes: median {statistics.median(seconds):.2f} s, "
                  f"{int(statistics.median(requests))} requests  [canned result per node type; the client's own CPU "
                  f"{statistics.median(cpu):.2f} s; {int(statistics.median(answered))} pods answered by this "
                  f"script's {kubelet.writes_per_pod} status write per pod; of the wall: "
                  + ", ".join(f"{name} {statistics.median(p[name] for p in phases):.1f} s" for name in phases[0])
                  + "]", flush=True)
    finally:
        kubelet.stop()
        local.down(folder / "cluster")


def add_fleet(cluster, start: int, size: int) -> list[str]:
    """Fake GPU nodes fleet-NNNNN (8 GPUs each) from `start` up to `size`, created 16 at a time; waits until KWOK
    has them all Ready."""
    from concurrent.futures import ThreadPoolExecutor
    from tests.localcluster.nodes import FLEET_PREFIX, GPU_RESOURCE, KWOK_ANNOTATION
    api = cluster.admin()
    names = [f"{FLEET_PREFIX}{index:05d}" for index in range(start, size)]

    def create(name: str) -> None:
        capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU_RESOURCE: "8"}
        api.create("/api/v1/nodes", {
            "metadata": {"name": name, "annotations": {KWOK_ANNOTATION: "fake"},
                         "labels": {"kubernetes.io/hostname": name, "type": "kwok",
                                    "feature.node.kubernetes.io/pci-10de.present": "true"}},
            "status": {"capacity": capacity, "allocatable": dict(capacity)}})
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, names))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        nodes = api.get("/api/v1/nodes")["items"]
        ready = sum(1 for n in nodes if n["metadata"]["name"].startswith(FLEET_PREFIX) and any(
            c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions") or []))
        if ready == size:
            return names
        time.sleep(1)
    raise SystemExit(f"KWOK did not make {size} fleet nodes Ready within 600 s")


def wait_clean_real(cluster) -> None:
    api = cluster.admin()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and any(ns["metadata"]["name"].startswith("gpu-bootstrap-probe")
                                              for ns in api.get("/api/v1/namespaces")["items"]):
        time.sleep(0.5)


class FleetKubelet:
    """The fleet nodes' kubelet for the probe pods: watches them (the probe's label) and gives each, in one PUT of its
    status, the canned result of its node's type re-marked with the run's marker (tests/kubeapi/kubelet_sim.py's
    status, as for the emulator's 1,000 nodes). Pods bound elsewhere are KWOK's or the agent's."""

    writes_per_pod = 1

    def __init__(self, cluster, canned: dict, folder: Path):
        import threading
        from concurrent.futures import ThreadPoolExecutor
        from tests.localcluster.probe_kubelet import ProbeKubelet
        from tests.tools import tool
        self.api = cluster.admin(agent="fleet-kubelet")
        self.canned = canned
        self.status = ProbeKubelet(self.api, folder, tool("busybox"))
        self.status._node = lambda name: {"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}
        self.markers: dict[str, str] = {}
        self.answered = 0
        self.failed: list[str] = []
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(8)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _watch(self) -> None:
        from gpu_bootstrap.probes import incluster
        from tests.localcluster.nodes import FLEET_PREFIX
        from tests.localcluster.rest import ApiError
        selector = ",".join(f"{k}={v}" for k, v in incluster.COMPONENT.items())
        def take(pod: dict) -> None:
            node = pod["spec"].get("nodeName") or ""
            uid = pod["metadata"]["uid"]
            if node.startswith(FLEET_PREFIX) and uid not in self._seen and not pod["metadata"].get("deletionTimestamp"):
                self._seen.add(uid)
                self._pool.submit(self._answer, pod, node)
        while not self._stop.is_set():
            try:
                listed = self.api.get("/api/v1/pods", labelSelector=selector)
                for pod in listed["items"]:  # made while no watch was open
                    take(pod)
                for kind, pod in self.api.watch("/api/v1/pods", listed["metadata"]["resourceVersion"], timeout=30,
                                                labelSelector=selector):
                    if kind in ("ADDED", "MODIFIED"):
                        take(pod)
            except (ApiError, OSError):
                time.sleep(0.2)

    def _marker(self, namespace: str) -> str:
        from gpu_bootstrap.probes import incluster
        if namespace not in self.markers:
            script = self.api.get(f"/api/v1/namespaces/{namespace}/configmaps/{incluster.NAME}")["data"]["probe.sh"]
            self.markers[namespace] = re.search(r"GB_MARK='(@@gpu-bootstrap-[0-9a-f]{16}@@)'", script).group(1)
        return self.markers[namespace]

    def _answer(self, pod: dict, node: str) -> None:
        try:
            self._put_result(pod, node)
        except Exception as error:  # noqa: BLE001 - counted and printed: a benchmark with silent losses lies
            with self._lock:
                self.failed.append(f"{pod['metadata']['name']}: {error}")

    def _put_result(self, pod: dict, node: str) -> None:
        from gpu_bootstrap.probes import incluster
        from tests.localcluster.rest import ApiError
        output, marker = self.canned[node_type(int(node.rsplit("-", 1)[1]))]
        meta = pod["metadata"]
        messages = incluster.encode(output.replace(marker, self._marker(meta["namespace"])))
        results = {("probe" if i == 0 else f"result-{i}"): (0, m) for i, m in enumerate(messages)}
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        for _ in range(5):
            pod["status"] = {**(pod.get("status") or {}), **self.status._finished_status(pod, results)}
            try:
                self.api.request("PUT", path, pod)
                with self._lock:
                    self.answered += 1
                return
            except ApiError as error:
                if error.status == 404:
                    return
                if error.status != 409:
                    raise
                pod = self.api.get(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")


if __name__ == "__main__":
    main()
