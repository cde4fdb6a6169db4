#!/usr/bin/env python3
"""How fast `gpu-bootstrap --help` starts, next to the interpreter's own start-up measured in the same run.

Also shows what importing the heavy modules eagerly would cost, which is why cli/commands.py imports them inside
commands.

Usage: python benchmarks/cli_startup.py [--runs 15] [--against DIR]

--against DIR also times `python -m gpu_bootstrap --help` from another checkout (e.g. a worktree of an older
commit: git worktree add /tmp/before REV), interleaved with this one, so a change in start-up shows as a ratio
measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time


def median_seconds(command: list[str], runs: int, cwd: str | None = None) -> float:
    samples = []
    env = dict(os.environ, NO_COLOR="1")
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env, cwd=cwd)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def compare(other: str, runs: int) -> None:
    """This checkout against another, alternating so that load on the machine hits both alike."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for args in (["--help"], ["up", "--help"]):
        command = [sys.executable, "-m", "gpu_bootstrap", *args]
        ours, theirs = [], []
        for _ in range(runs):
            ours.append(median_seconds(command, 1, here))
            theirs.append(median_seconds(command, 1, other))
        mine, peer = statistics.median(ours), statistics.median(theirs)
        print(f"  gpu-bootstrap {' '.join(args):<12} this checkout {mine * 1000:5.0f} ms, {other} {peer * 1000:5.0f} ms "
              f"({mine / peer:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--against", metavar="DIR", help="another checkout to compare with")
    args = parser.parse_args()
    entry = shutil.which("gpu-bootstrap")
    cli = [entry, "--help"] if entry else [sys.executable, "-m", "gpu_bootstrap", "--help"]
    rows = [
        ("python3 -c pass", [sys.executable, "-c", "pass"]),
        ("gpu-bootstrap --help", cli),
        ("gpu-bootstrap version", cli[:-1] + ["version"]),
        ("(eager) import kubernetes, paramiko, cryptography, pydantic",
         [sys.executable, "-c", "import kubernetes.client, paramiko, cryptography.x509, pydantic"]),
    ]
    baseline = None
    print(f"median of {args.runs} runs")
    for label, command in rows:
        seconds = median_seconds(command, args.runs)
        baseline = baseline or seconds
        print(f"  {label:<62} {seconds * 1000:7.0f} ms  ({seconds / baseline:.1f}x python3 -c pass)")
    if args.against:
        compare(args.against, args.runs)


if __name__ == "__main__":
    main()
