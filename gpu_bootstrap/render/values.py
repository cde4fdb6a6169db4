"""Chart values explained: each value gpu-bootstrap derives (`Derived`, with its reason), a release's layered plan
(`ValuesPlan`: base, derived, the user's overrides, merged) and the dotted-path helpers they share. Pure; the floor
below the charts' value renderers (render/gpu_operator_values.py, render/monitoring.py), which both use it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpu_bootstrap.security import redact


@dataclass
class Derived:
    path: str
    value: Any
    because: str

    def line(self) -> str:
        """path=value  ← why; a secret-looking part of the value (one kept from a running release) is redacted."""
        return f"{self.path}={json.dumps(redact.tree(self.value, self.path), separators=(',', ':'))}  ← {self.because}"


@dataclass
class ValuesPlan:
    base: dict
    derived: list[Derived]
    overrides: dict
    merged: dict
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def explain(self) -> list[str]:
        lines = [d.line() for d in self.derived]
        for path in sorted(leaf_paths(self.overrides)):
            lines.append(user_value_line(path, get_path(self.overrides, path), "gpu_operator.values"))
        return lines


def user_value_line(path: str, value: Any, section: str) -> str:
    """A value the user set, for a plan: its path only (a value may be a secret, and no rule can tell every secret
    from a name), except true/false, which carry nothing to hide."""
    shown = f"={json.dumps(value)}" if isinstance(value, bool) else ""
    return f"{path}{shown}  ← your {section}" + ("" if shown else " (value not shown)")


def set_path(tree: dict, path: str, value) -> None:
    if path.startswith(("nodes:", "pools:")):
        return  # node labels (on nodes, or on a pool's node template), not chart values
    parts = path.split(".")
    for part in parts[:-1]:
        tree = tree.setdefault(part, {})
    tree[parts[-1]] = value


def get_path(tree: dict, path: str):
    for part in path.split("."):
        tree = tree[part]
    return tree


def leaf_paths(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        out.extend(leaf_paths(value, path) if isinstance(value, dict) and value else [path])
    return out
