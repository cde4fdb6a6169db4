"""Local charts (a .tgz or a directory, for air-gapped clusters): is a chart reference local, and its Chart.yaml,
read without helm."""
from __future__ import annotations

import tarfile
from pathlib import Path

import yaml


def is_local(ref: str) -> bool:
    return ref.startswith((".", "/", "~")) or ref.endswith((".tgz", ".tar.gz")) or Path(ref).expanduser().exists()


def local_chart_values(ref: str) -> dict | None:
    """values.yaml of a local chart (.tgz or directory): its defaults; None when `ref` is neither or has none."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return yaml.safe_load((path / "values.yaml").read_text()) if (path / "values.yaml").exists() else None
    if path.is_file() and path.name.endswith((".tgz", ".tar.gz")):
        with tarfile.open(path, "r:gz") as archive:
            member = next((m for m in archive.getmembers() if m.name.count("/") == 1
                           and m.name.endswith("/values.yaml")), None)
            if member is not None:
                return yaml.safe_load(archive.extractfile(member).read())
    return None


def local_chart_metadata(ref: str) -> dict | None:
    """Chart.yaml of a local chart (.tgz or directory); None when `ref` is neither."""
    path = Path(ref).expanduser()
    if path.is_dir() and (path / "Chart.yaml").exists():
        return yaml.safe_load((path / "Chart.yaml").read_text())
    if path.is_file() and path.name.endswith((".tgz", ".tar.gz")):
        with tarfile.open(path, "r:gz") as archive:
            member = next((m for m in archive.getmembers() if m.name.count("/") == 1
                           and m.name.endswith("/Chart.yaml")), None)
            if member is not None:
                return yaml.safe_load(archive.extractfile(member).read())
    return None
