"""Where the shipped data lives: the catalogues beside this module (core/data/), and the source tree's playbooks/
and values/ (editable installs) or their copies packaged inside the wheel as gpu_bootstrap/_data/."""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # gpu_bootstrap/
DATA = Path(__file__).resolve().parent / "data"  # the version and image catalogues


def data_path(*parts: str) -> Path:
    packaged = PACKAGE / "_data" / Path(*parts)
    if packaged.exists():
        return packaged
    return PACKAGE.parent / Path(*parts)


def state_dir() -> Path:
    """The user's state directory ($XDG_STATE_HOME/gpu-bootstrap, default ~/.local/state/gpu-bootstrap)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "gpu-bootstrap"
