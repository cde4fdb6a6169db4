#!/usr/bin/env python3
"""What 10 % injected API faults cost `gpu-bootstrap up`: median wall time and requests of runs under faults, next to
clean runs measured in the same invocation (alternating, each on a fresh emulator).

The faults are those of tests/test_fault_runs.py: 10 % of all requests, on every path, answered 503 or 429 with
`Retry-After: 1` (a kube-apiserver under load, API priority and fairness) or reset before the server handled them;
seeded, one seed per faulted run. `--playbook full` (the default) runs every step, with helm installing the real
gpu-operator and kube-prometheus-stack charts (the chart's Prometheus Service points at a real local Prometheus);
`--playbook no-helm` every step but gpu-operator and monitoring. A faulted run that does not complete is
counted and left out of the medians. No assertions: this prints figures.

Usage: python benchmarks/up_faults.py [--runs 3] [--playbook full|no-helm] [--rate 0.10]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import reliability as rel  # noqa: E402
from tests.kubeapi import Emulator  # noqa: E402
from tests.monitoring.live import LocalPrometheus  # noqa: E402
from tests.nodes.reports import write_report  # noqa: E402
from tests.tools import TOOLS_BIN, tool_env, shared_dir  # noqa: E402

NODES = ["node5", "node6", "node7"]
NO_HELM = ["preflight", "node-prep", "binpack-scheduler", "admission-opa", "admission", "validate"]


def run_once(folder: Path, full: bool, seed: int | None, rate: float, prometheus: str) -> dict:
    folder.mkdir(parents=True)
    charts = shared_dir() / "charts"
    with Emulator(kube_version="1.33.2", gpu_nodes=NODES, cpu_nodes=["cpu-1"], gpu_operator=full) as emu:
        rel.serve_prometheus(emu, prometheus)
        kubeconfig = emu.write_kubeconfig(folder / "kubeconfig")
        config = folder / "gpu-bootstrap.yaml"
        config.write_text(f"cluster: {{kubeconfig: {kubeconfig}}}\nnodes:\n" +
                          "".join(f"  - name: {n}\n" for n in NODES) +
                          f"gpu_operator:\n  chart: {charts / 'gpu-operator-v26.7.0.tgz'}\n  wait_timeout: 300\n"
                          f"monitoring:\n  chart: {charts / 'kube-prometheus-stack-88.5.3.tgz'}\n"
                          f"  wait_timeout: 300\n")
        args = [sys.executable, "-m", "gpu_bootstrap", "up", "-c", str(config), "--preflight-report",
                str(write_report(folder / "report.json", NODES)), "-o", "json", "--log-file", str(folder / "up.log")]
        if not full:
            playbook = folder / "no-helm.yaml"
            playbook.write_text("name: no-helm\nsteps: [" + ", ".join(NO_HELM) + "]\n")
            args += ["--playbook", str(playbook)]
        rules = rel.random_faults(emu, seed, rate) if seed is not None else []
        started = time.monotonic()
        process = subprocess.Popen(args, cwd=ROOT, env=tool_env(folder / "home"), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        try:
            out, err = process.communicate(timeout=900)
        finally:
            if process.poll() is None:
                process.kill()
            process.communicate()
        seconds = time.monotonic() - started
        try:
            error = json.loads(out).get("error") or ""
        except ValueError:
            error = err.strip()[-300:]
        return {"seconds": seconds, "requests": len(emu.requests.all()), "ok": process.returncode == 0,
                "faults": sum(r.fired for r in rules), "error": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="clean runs and faulted runs each (default 3)")
    parser.add_argument("--playbook", choices=["full", "no-helm"], default="full")
    parser.add_argument("--rate", type=float, default=0.10, help="share of requests that fail (default 0.10)")
    options = parser.parse_args()
    full = options.playbook == "full"
    if full and not (TOOLS_BIN / "helm").exists():
        sys.exit(f"the pinned helm is not in {TOOLS_BIN}: run scripts/install-test-tools")
    clean, faulted = [], []
    with tempfile.TemporaryDirectory(prefix="up-faults-") as folder:
        Path(folder, "prometheus").mkdir()
        prometheus = LocalPrometheus(Path(folder, "prometheus"), "global: {scrape_interval: 15s}\n")
        try:
            measure(Path(folder), full, options, clean, faulted, prometheus.url)
        finally:
            prometheus.stop()
    report(options, clean, faulted)


def measure(folder: Path, full: bool, options, clean: list, faulted: list, prometheus: str) -> None:
    for index in range(options.runs):  # alternate, so load from elsewhere hits both kinds alike
        clean.append(run_once(folder / f"clean-{index}", full, None, options.rate, prometheus))
        faulted.append(run_once(folder / f"faults-{index}", full, index + 1, options.rate, prometheus))
        for kind, result in (("clean", clean[-1]), (f"faults seed {index + 1}", faulted[-1])):
            state = "ok" if result["ok"] else f"FAILED: {result['error'][:160]}"
            print(f"  {kind:>15}: {result['seconds']:6.1f} s, {result['requests']:4d} requests, "
                  f"{result['faults']:3d} faults, {state}", flush=True)


def report(options, clean: list, faulted: list) -> None:
    print(f"\nup, playbook {options.playbook}, {options.runs} run(s) each, {options.rate:.0%} faults "
          f"(503/429 with Retry-After: 1, resets):")
    base = [r for r in clean if r["ok"]]
    done = [r for r in faulted if r["ok"]]
    if not base or not done:
        print("  not enough completed runs for medians")
        return
    rows = [("clean", base, len(clean)), (f"{options.rate:.0%} faults", done, len(faulted))]
    for name, results, total in rows:
        print(f"  {name:>12}: median {statistics.median(r['seconds'] for r in results):6.1f} s, "
              f"{statistics.median(r['requests'] for r in results):6.0f} requests "
              f"({len(results)} of {total} completed)")
    seconds = statistics.median(r["seconds"] for r in done) / statistics.median(r["seconds"] for r in base)
    requests = statistics.median(r["requests"] for r in done) / statistics.median(r["requests"] for r in base)
    print(f"  ratio faults/clean: wall time x{seconds:.2f}, requests x{requests:.2f}")


if __name__ == "__main__":
    main()
