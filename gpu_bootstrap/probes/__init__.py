"""Node preflight, pure: what runs on a GPU node (script.py), how its output is parsed (parse.py) and judged
(checks.py), and saved reports (report.py). The SSH fan-out that runs it lives in adapters/nodefacts.py.

May import: core.
"""
from __future__ import annotations

from gpu_bootstrap.probes.checks import NodeCheck, NodeReport

__all__ = ["NodeCheck", "NodeReport"]
