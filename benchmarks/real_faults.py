#!/usr/bin/env python3
"""Faults on the real control plane: runs the reliability suite (tests/test_faults_real.py and
tests/test_faults_real_workloads.py, each on a local cluster of its own: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler v1.37, KWOK nodes) and prints its table:
the fault, where it struck, what the user sees, and how long from the fault until the cluster was what an
uninterrupted run leaves (for a failure that is the right outcome, until the run ended with it). `--write-docs` puts the table into docs/reliability.md. No figures are asserted here; the
suite's own assertions decide whether the runs converged, and a failed case fails this command.

Usage: python benchmarks/real_faults.py [--write-docs] [-k EXPRESSION]
Needs the built local cluster and the pinned helm (scripts/install-test-tools; the tests take it from .tools/bin
themselves, whatever PATH holds).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- table: benchmarks/real_faults.py -->", "<!-- end of table -->"
COMMAND = "python benchmarks/real_faults.py --write-docs"


def run_suite(report: Path, expression: str | None) -> int:
    env = {**os.environ, "GPU_BOOTSTRAP_FAULTS_REPORT": str(report), "GPU_BOOTSTRAP_REQUIRE_TOOLS": "1"}
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:xdist", "-m", "faults",
            str(ROOT / "tests" / "test_faults_real.py"), str(ROOT / "tests" / "test_faults_real_workloads.py")]
    if expression:
        args += ["-k", expression]
    return subprocess.run(args, cwd=ROOT, env=env).returncode


def table(rows: list[dict]) -> str:
    lines = ["| fault | where | what the user sees | settled after |", "|---|---|---|---:|"]
    for row in rows:
        lines.append(f"| {row['fault']} | {row['where']} | {row['seen']} | {row['converged_after']:.0f} s |")
    return "\n".join(lines)


def write_docs(text: str) -> None:
    doc = DOC.read_text()
    head, _, rest = doc.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-docs", action="store_true", help=f"write the table into {DOC.relative_to(ROOT)}")
    parser.add_argument("-k", dest="expression", help="only the cases pytest -k selects")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="real-faults-") as folder:
        report = Path(folder) / "rows.jsonl"
        report.touch()
        code = run_suite(report, args.expression)
        rows = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
    text = table(rows)
    print(text)
    if code != 0:
        print(f"the suite failed (exit {code}): the table above holds only the cases that passed", file=sys.stderr)
        return code
    if args.write_docs:
        write_docs(text)
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
