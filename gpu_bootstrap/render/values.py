"""Chart values explained: each value gpu-bootstrap derives (`Derived`, with its reason), a release's layered plan
(`ValuesPlan`: base, derived, the user's overrides, merged) and the dotted-path helpers they share. Pure; the floor
below the charts' value renderers (render/gpu_operator_values.py, render/monitoring.py), which both use it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gpu_bootstrap.core.objects import escape_key, join_path, path_keys  # noqa: F401 - re-exported
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
    section: str = "gpu_operator.values"  # where the user's overrides come from

    def explain(self) -> list[str]:
        lines = [d.line() for d in self.derived]
        for path, value in sorted(leaf_items(self.overrides), key=lambda item: item[0]):
            lines.append(user_value_line(path, value, self.section))
        return lines


def user_value_line(path: str, value: Any, section: str) -> str:
    """A value the user set, for a plan: its path only (a value may be a secret, and no rule can tell every secret
    from a name), except true/false, which carry nothing to hide."""
    shown = f"={json.dumps(value)}" if isinstance(value, bool) else ""
    return f"{path}{shown}  ← your {section}" + ("" if shown else " (value not shown)")


ENV_ENTRY = re.compile(r"^(?P<list>.+)\[(?P<name>[A-Za-z_][A-Za-z0-9_]*)\]$")  # toolkit.env[NAME]: one env entry


def set_path(tree: dict, path: str, value) -> None:
    """Set a value; `list.path[NAME]` sets the entry named NAME of an env-style list ({name, value} items), keeping
    the list's other entries."""
    if path.startswith(("nodes:", "pools:")):
        return  # node labels (on nodes, or on a pool's node template), not chart values
    entry = ENV_ENTRY.match(path)
    if entry:
        keys = path_keys(entry["list"])
        for key in keys[:-1]:
            tree = tree.setdefault(key, {})
        # a new list: the one there may be another Derived's value, which must keep what it says
        items = [item for item in tree.get(keys[-1]) or []
                 if not (isinstance(item, dict) and item.get("name") == entry["name"])]
        tree[keys[-1]] = items + [{"name": entry["name"], "value": value}]
        return
    keys = path_keys(path)
    for key in keys[:-1]:
        tree = tree.setdefault(key, {})
    tree[keys[-1]] = value


def get_path(tree: dict, path: str, default: Any = KeyError):
    """The value at `path`; `default` when a key on the way is missing (KeyError raised when none is given).
    `list.path[NAME]`: the value of the env entry named NAME."""
    entry = ENV_ENTRY.match(path)
    if entry:
        items = get_path(tree, entry["list"], None)
        found = next((item for item in items or [] if isinstance(item, dict) and item.get("name") == entry["name"]),
                     None)
        if found is None:
            if default is KeyError:
                raise KeyError(path)
            return default
        return found.get("value")
    for key in path_keys(path):
        if not isinstance(tree, dict) or key not in tree:
            if default is KeyError:
                raise KeyError(path)
            return default
        tree = tree[key]
    return tree


def leaf_items(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(path, value) of every leaf (a scalar, a list or an empty map), paths escaped as above."""
    out = []
    for key, value in tree.items():
        path = join_path(prefix, key)
        out.extend(leaf_items(value, path) if isinstance(value, dict) and value else [(path, value)])
    return out


def leaf_paths(tree: dict, prefix: str = "") -> list[str]:
    return [path for path, _value in leaf_items(tree, prefix)]
