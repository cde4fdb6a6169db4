#!/usr/bin/env python3
"""How fast `gpu-bootstrap status -o json` answers on a large cluster: the Kubernetes API emulator holding 1,000 GPU
nodes of 8 GPUs and 10,000 pods (GPU pods of 1-8 GPUs bound across the nodes, some pending, CPU pods).

Prints, per run: wall seconds of the whole command (a new process, Python start included), the API requests it made
(they must stay a handful of paginated lists: no request per node or pod), and, as the peer measured in the same run
against the same emulator, `kubectl get nodes -o json` + `kubectl get pods -A -o json` (what an admin would run to
read the same objects, with kubectl's own pagination), with the ratio between the two. Target on this 2-core
machine: under 2 s.

Usage: python benchmarks/status_scale.py [--nodes 1000] [--pods 10000] [--runs 3]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.kubeapi import Emulator  # noqa: E402
from tests.tools import TOOLS_BIN, tool_env  # noqa: E402

TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def populate(emu: Emulator, node_count: int, pod_count: int) -> None:
    """GPU pods fill the nodes first-fit in a seeded random order (fragmented, as a busy cluster is); what does not
    fit stays pending; one pod in ten is a CPU-only pod on the CPU node."""
    rng = random.Random(7)
    for index in range(node_count):
        emu.add_node(f"gpu-{index:04d}", gpus=8, taints=[TAINT],
                     labels={"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    for name in ("ml", "vision", "web", "batch"):
        emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    free = [8] * node_count
    for index in range(pod_count):
        cpu_only = index % 10 == 9
        gpus = 0 if cpu_only else rng.choice((1, 1, 1, 2, 2, 4, 8))
        node = "cpu-1" if cpu_only else None
        if gpus:
            start = rng.randrange(node_count)
            for offset in range(node_count):
                candidate = (start + offset) % node_count
                if free[candidate] >= gpus:
                    free[candidate] -= gpus
                    node = f"gpu-{candidate:04d}"
                    break
        limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"p-{index:05d}", "namespace": ("ml", "vision", "web", "batch")[index % 4]},
                "spec": {"schedulerName": "gpu-binpack-scheduler" if gpus and index % 2 else "default-scheduler",
                         "containers": [{"name": "main", "image": "cuda", "resources": {
                             "requests": {"cpu": "2", "memory": "8Gi", **limits}, "limits": limits}}]}}
        if node:
            body["spec"]["nodeName"] = node
            body["status"] = {"phase": "Running"}
        emu.seed(body)


def timed(command: list[str], env: dict) -> float:
    started = time.monotonic()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    kubectl = TOOLS_BIN / "kubectl"
    if not kubectl.exists():
        sys.exit("kubectl is not installed in .tools/bin; run scripts/install-test-tools")
    with tempfile.TemporaryDirectory() as folder, Emulator(cpu_nodes=["cpu-1"], controllers=False) as emu:
        started = time.monotonic()
        populate(emu, args.nodes, args.pods)
        print(f"seeded {args.nodes} GPU nodes and {args.pods} pods in {time.monotonic() - started:.1f} s")
        home = Path(folder)
        kubeconfig = emu.write_kubeconfig(home / "kubeconfig")
        env = {**tool_env(home), "PYTHONPATH": str(ROOT)}
        ours, peers, counts, served = [], [], [], []
        for _ in range(args.runs):
            emu.requests.clear()
            ours.append(timed([sys.executable, "-m", "gpu_bootstrap", "status", "-o", "json", "--kubeconfig",
                               str(kubeconfig), "--log-file", os.devnull], {**env, "HOME": str(home)}))
            counts.append(len(emu.requests.all()))
            served.append(sum(r.duration for r in emu.requests.all()))
            emu.requests.clear()
            peers.append(timed([str(kubectl), "--kubeconfig", str(kubeconfig), "get", "nodes", "-o", "json"], env) +
                         timed([str(kubectl), "--kubeconfig", str(kubeconfig), "get", "pods", "-A", "-o", "json"], env))
            peer_requests = len(emu.requests.all())
        status_s, peer_s = statistics.median(ours), statistics.median(peers)
        print(f"gpu-bootstrap status -o json: {status_s:.2f} s median of {args.runs} (runs: "
              f"{', '.join(f'{s:.2f}' for s in ours)}), {counts[-1]} API requests, of which the emulator spent "
              f"{statistics.median(served):.2f} s serving")
        print(f"peer kubectl get nodes -o json + kubectl get pods -A -o json: {peer_s:.2f} s median "
              f"({', '.join(f'{s:.2f}' for s in peers)}), {peer_requests} API requests")
        print(f"ratio status / peer: {status_s / peer_s:.2f}")
        read_s, document_s = in_process(kubeconfig)
        print(f"in one process (no start-up): reading {read_s:.2f} s (the emulator serving and JSON decoding), "
              f"building the document {document_s:.2f} s")


def in_process(kubeconfig: Path) -> tuple[float, float]:
    """Where the time goes: the list calls, then everything status computes from them (fragmentation included)."""
    from gpu_bootstrap.app import status as cluster_status
    from gpu_bootstrap.adapters.kube import Kube
    kube = Kube(kubeconfig)
    kube.version()  # connect first: the client's set-up is start-up, not reading
    with cluster_status._without_cycle_collection():  # as `status` reads
        started = time.monotonic()
        snapshot = cluster_status.read(kube)
        read_done = time.monotonic()
        cluster_status.document(snapshot, cluster_status.Settings("gpu-binpack-scheduler", "nvidia.com/gpu"))
        return read_done - started, time.monotonic() - read_done


if __name__ == "__main__":
    main()
