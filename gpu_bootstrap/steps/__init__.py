"""The step registry, derived from the steps' declarations: step id -> its module, imported only when needed.

A step is one module, `gpu_bootstrap/steps/<id, with _ for ->.py`, that ends with `DECLARATION = declare(TheStep,
...)` (pipeline/step.py: its switch, its config section, its RBAC needs, its line in README's table). Nothing lists
the steps a second time: the shipped steps are the ones the shipped playbooks name (the order lives there), the
rest (rbac's roles, the config sections a step adds, init's example, README's table, the docs' navigation and the
config reference) is derived from the declarations here and in scripts/generate-docs. A test checks that the
derived lists agree (tests/test_step_declarations.py).

One file per step, each a pipeline.step.Step: check (read real state), plan (pure), verify, undo_plan.

May import: core, security, render, probes, adapters, pipeline.
"""
from __future__ import annotations

import importlib
from functools import lru_cache

from gpu_bootstrap.core.paths import data_path

# Steps that live outside this package, id -> module (tests register a toy step here for one test or session).
ELSEWHERE: dict[str, str] = {}


def module_name(step_id: str) -> str:
    return ELSEWHERE.get(step_id) or f"{__name__}.{step_id.replace('-', '_')}"


@lru_cache(maxsize=None)
def shipped() -> tuple[str, ...]:
    """The steps this version ships: every step a shipped playbook names, in the default playbook's order first."""
    import yaml
    found: list[str] = []
    folder = data_path("playbooks")
    for path in [folder / "default.yaml", *sorted(p for p in folder.glob("*.yaml") if p.name != "default.yaml")]:
        for step_id in (yaml.safe_load(path.read_text()) or {}).get("steps", []):
            if step_id not in found:
                found.append(step_id)
    return tuple(found)


def known() -> list[str]:
    return [*shipped(), *(s for s in ELSEWHERE if s not in shipped())]


def declaration(step_id: str):
    """The step's Declaration; KeyError when no step module declares that id."""
    if not step_id or not all(c.islower() or c.isdigit() or c == "-" for c in step_id):
        raise KeyError(step_id)
    try:
        module = importlib.import_module(module_name(step_id))
    except ModuleNotFoundError as error:
        if error.name and module_name(step_id).startswith(error.name):
            raise KeyError(step_id) from None
        raise
    found = getattr(module, "DECLARATION", None)
    if found is None or found.id != step_id:
        raise KeyError(step_id)
    return found


def is_step(step_id: str) -> bool:
    try:
        declaration(step_id)
    except KeyError:
        return False
    return True


def declarations(step_ids=None) -> list:
    """The declarations of `step_ids` (default: every known step), in that order."""
    return [declaration(s) for s in (known() if step_ids is None else step_ids)]


def enabled(config, playbook) -> list:
    """The declarations of the playbook's steps that the config turns on (each step's declared switch)."""
    return [d for d in declarations(list(playbook)) if d.enabled(config)]


def load_step(step_id: str):
    return declaration(step_id).step()


def added_sections(step_ids=None) -> dict:
    """Config sections that steps bring themselves (key -> model), beyond the built-in ones."""
    return {d.section: d.model for d in declarations(step_ids) if d.model is not None}


def config_model(step_ids=None):
    """The config's model: the built-in sections, extended by the sections the steps bring (core/config/model.py
    cannot know them: core imports nothing above it)."""
    from gpu_bootstrap.core.config import Config
    return Config.extended(added_sections(step_ids))
