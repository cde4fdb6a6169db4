"""Playbooks: the ordered list of steps (playbooks/*.yaml), and --only / --skip selection."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.core.paths import data_path
from gpu_bootstrap import steps as registry


@dataclass(frozen=True)
class Playbook:
    name: str
    steps: tuple[str, ...]
    source: str


def load_playbook(name_or_path: str = "default") -> Playbook:
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") or "/" in name_or_path):
        path = data_path("playbooks", f"{name_or_path}.yaml")
        if not path.exists():
            available = sorted(p.stem for p in data_path("playbooks").glob("*.yaml"))
            raise ConfigError(f"no playbook named {name_or_path!r}", f"available: {', '.join(available)}, "
                                                                    f"or pass a path to a YAML file")
    if not path.exists():
        raise ConfigError(f"playbook file {path} not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: YAML syntax error: {error}")
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, list) or not steps or not all(isinstance(s, str) for s in steps):
        raise ConfigError(f"{path}: 'steps' must be a non-empty list of step ids")
    for step in steps:
        if not registry.is_step(step):
            raise ConfigError(f"{path}: unknown step {step!r}", f"known steps: {', '.join(registry.known())}")
    if len(set(steps)) != len(steps):
        raise ConfigError(f"{path}: a step is listed twice")
    return Playbook(str(data.get("name", path.stem)), tuple(steps), str(path))


def select(playbook: Playbook, only: list[str], skip: list[str]) -> tuple[list[str], list[str]]:
    """Returns (selected, skipped) step ids in playbook order. Unknown ids are errors."""
    for flag, ids in (("--only", only), ("--skip", skip)):
        for step in ids:
            if not registry.is_step(step):
                raise ConfigError(f"{flag}: unknown step {step!r}", f"known steps: {', '.join(registry.known())}")
            if step not in playbook.steps:
                raise ConfigError(f"{flag}: step {step!r} is not in playbook {playbook.name!r}",
                                  f"its steps: {', '.join(playbook.steps)}")
    selected = [s for s in playbook.steps if (not only or s in only) and s not in skip]
    return selected, [s for s in playbook.steps if s not in selected]


def split_ids(values: list[str] | None) -> list[str]:
    """--only a,b --only c -> [a, b, c]"""
    out = []
    for value in values or []:
        out.extend(v.strip() for v in value.split(",") if v.strip())
    return out
