"""Node preflight, pure: what runs on a GPU node (script.py), how its output is parsed (parse.py) and judged
(checks.py), saved reports (report.py), and the in-cluster probe's objects and the decoding of its answers
(incluster.py). The SSH fan-out and the probe pods' runner live in adapters/ (nodefacts.py, cluster_probe.py).

May import: core.
"""
from __future__ import annotations

from gpu_bootstrap.probes.checks import NodeCheck, NodeReport

__all__ = ["NodeCheck", "NodeReport"]
