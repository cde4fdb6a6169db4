"""Comparing what we want with what the cluster has, for steps that manage plain Kubernetes objects."""
from __future__ import annotations


def differences(desired, live, path: str = "") -> list[str]:
    """Paths where `live` does not hold what `desired` says. Fields only in `live` (defaults, status) are fine."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return [path or "."]
        found = []
        for key, value in desired.items():
            found += differences(value, live.get(key), f"{path}.{key}" if path else key)
        return found
    if isinstance(desired, list):
        if not isinstance(live, list) or len(live) != len(desired):
            return [path]
        found = []
        for index, (want, have) in enumerate(zip(desired, live)):
            found += differences(want, have, f"{path}[{index}]")
        return found
    return [] if desired == live or str(desired) == str(live) and live is not None else [path]

