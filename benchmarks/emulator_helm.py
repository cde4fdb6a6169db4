#!/usr/bin/env python3
"""How fast the Kubernetes API emulator serves a real `helm upgrade --install --wait` of kube-prometheus-stack.

Prints wall seconds, requests served, the emulator's own share of the time, and, as a peer measured in the same
run, `helm template` of the same chart (helm's client-side floor). Target on a 2-core machine: under 20 s.

Usage: python benchmarks/emulator_helm.py [--runs 3] [--chart PATH]
"""
from __future__ import annotations

import argparse
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

DEFAULT_CHART = ROOT.parent / "shared" / "charts" / "kube-prometheus-stack-88.5.3.tgz"


def install_once(chart: Path) -> dict:
    with tempfile.TemporaryDirectory() as folder, Emulator(gpu_nodes=["gpu-1", "gpu-2"], cpu_nodes=["cpu-1"]) as emu:
        home = Path(folder)
        kubeconfig = emu.write_kubeconfig(home / "kubeconfig")
        env = tool_env(home)
        started = time.monotonic()
        subprocess.run([str(TOOLS_BIN / "helm"), "--kubeconfig", str(kubeconfig), "upgrade", "--install", "kps",
                        str(chart), "-n", "mon", "--create-namespace", "--wait", "--timeout", "300s"],
                       env=env, check=True, capture_output=True)
        seconds = time.monotonic() - started
        requests = emu.requests.all()
        served = sum(r.duration for r in requests if r.verb != "watch")
        return {"seconds": seconds, "requests": len(requests),
                "writes": len(emu.requests.writes()), "emulator_seconds": served}


def template_once(chart: Path) -> float:
    with tempfile.TemporaryDirectory() as folder:
        started = time.monotonic()
        subprocess.run([str(TOOLS_BIN / "helm"), "template", "kps", str(chart), "-n", "mon"],
                       env=tool_env(Path(folder)), check=True, capture_output=True)
        return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chart", type=Path, default=DEFAULT_CHART)
    args = parser.parse_args()
    if not (TOOLS_BIN / "helm").exists():
        sys.exit("helm is not installed in .tools/bin; run scripts/install-test-tools")
    installs = [install_once(args.chart) for _ in range(args.runs)]
    templates = [template_once(args.chart) for _ in range(args.runs)]
    seconds = statistics.median(r["seconds"] for r in installs)
    template = statistics.median(templates)
    print(f"chart: {args.chart.name}, runs: {args.runs}")
    each = ", ".join(f"{r['seconds']:.2f}" for r in installs)
    print(f"helm upgrade --install --wait: median {seconds:.2f} s (runs: {each})")
    print(f"requests served: {installs[0]['requests']} ({installs[0]['writes']} writes); "
          f"emulator busy {statistics.median(r['emulator_seconds'] for r in installs):.2f} s of that")
    print(f"peer, helm template (client-side floor): median {template:.2f} s; install/template = {seconds / template:.1f}x")
    print(f"target < 20 s: {'met' if seconds < 20 else 'MISSED'}")


if __name__ == "__main__":
    main()
