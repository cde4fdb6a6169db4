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

Usage: sudo python benchmarks/incluster_probe.py [--sizes 100,1000] [--runs 3] [--ssh-nodes 100]
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
kube = Kube(Path(sys.argv[1]))
started = time.perf_counter()
reports = ClusterProbedNodes(names, kube, PreflightConfig(via="cluster", timeout=120)).reports()
elapsed = time.perf_counter() - started
known = sum(1 for r in reports.values() if r.check("ssh").status == "pass")
print(json.dumps({"seconds": elapsed, "known": known, "requests": kube.requests, "cpu": time.process_time()}))
"""


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
        raise SystemExit(f"only {outcome['known']} of {len(names)} nodes have facts: the run is not comparable")
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
        nodes = json.loads(result.stdout)["nodes"]
        if sum(1 for n in nodes if n["checks"][0]["status"] == "pass") != len(names):
            raise SystemExit("the SSH fan-out did not read every node")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ssh-nodes", type=int, default=100)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    real = min(sizes)
    folder = Path(tempfile.mkdtemp(prefix="incluster-probe-"))
    farm = NodeFarm()
    try:
        tree_names = [f"gpu-{i:04d}" for i in range(max(real, args.ssh_nodes))]
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
                    canned = capture(farm, names)  # one real result per node type, for the larger sizes
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


if __name__ == "__main__":
    main()
