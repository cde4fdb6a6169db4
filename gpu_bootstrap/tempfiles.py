"""No key left behind: the one private temp folder of a run, and the sweep of those that runs killed left.

The kubernetes client writes the kubeconfig's `client-key-data` (and certificate data) to temp files, and the helm
relay keeps its kubeconfig (with its token) in a temp folder. Both go into this process's run folder,
`$TMPDIR/gpu-bootstrap-run-<pid>-<random>/` (0700, made on first use). It is removed on every way out: a normal exit
or a signal (atexit), and the `os._exit` paths of gpu_bootstrap.interrupts (`remove()` first). Only `kill -9` or a
crash of the machine leaves it, and the next run's `sweep()` removes it: a run folder whose process is gone, a run
folder older than MAX_RUN_AGE whatever its pid says, and a relay folder that an older version left at the top of
$TMPDIR once it is older than STALE_RELAY_AGE. The sweep matches our own name patterns only, skips what another
user owns and never follows a link: other programs' files are never touched.
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger("gpu_bootstrap.tempfiles")

RUN_PREFIX = "gpu-bootstrap-run-"
RUN_NAME = re.compile(r"gpu-bootstrap-run-(\d+)-[0-9a-f]{8}")
LEGACY_RELAY_NAME = re.compile(r"gpu-bootstrap-relay-[A-Za-z0-9_]{8}")  # tempfile.mkdtemp's suffix
MAX_RUN_AGE = 7 * 24 * 3600.0  # seconds: no run lasts a week; an older folder's pid was reused by another process
STALE_RELAY_AGE = 6 * 3600.0  # seconds: an older version's relay folder (it holds a token that died with its relay)

_lock = threading.Lock()
_folder: Path | None = None


def run_folder() -> Path:
    """This process's private temp folder (0700), made on first use and removed when the process ends."""
    global _folder
    with _lock:
        if _folder is None or not _folder.is_dir():
            path = Path(tempfile.gettempdir()) / f"{RUN_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
            path.mkdir(mode=0o700)
            path.chmod(0o700)  # whatever the umask
            if _folder is None:
                atexit.register(remove)
            _folder = path
        return _folder


def run_folder_or_none() -> Path | None:
    """The run folder, or None (the system's temp folder) when it cannot be made."""
    try:
        return run_folder()
    except OSError as error:
        log.warning("cannot make a private temp folder in %s: %s", tempfile.gettempdir(), error)
        return None


def remove() -> None:
    """Remove the run folder now (atexit, and before os._exit). The kubernetes client's memory of the files it
    wrote there is dropped too, so a later client in this process writes them anew."""
    global _folder
    folder, _folder = _folder, None
    if folder is None:
        return
    shutil.rmtree(folder, ignore_errors=True)
    _forget_client_files(folder)


def _forget_client_files(folder: Path) -> None:
    """kubernetes.config.kube_config caches content -> temp file path, and would hand out a removed path."""
    import sys
    module = sys.modules.get("kubernetes.config.kube_config")
    cache = getattr(module, "_temp_files", None)
    if not isinstance(cache, dict):
        return
    for key, name in list(cache.items()):
        if str(name).startswith(str(folder) + os.sep):
            cache.pop(key, None)


def sweep(root: Path | None = None, now: float | None = None) -> list[Path]:
    """Remove the run folders of runs that are gone and old relay folders (see the module docstring). Returns what
    was removed; never raises (a folder that cannot be read or removed is left for the next run)."""
    root = Path(root or tempfile.gettempdir())
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError as error:
        log.debug("sweep of %s: %s", root, error)
        return removed
    current = _folder.name if _folder is not None else None
    for entry in entries:
        if entry.name == current or not _stale(entry, now):
            continue
        try:
            shutil.rmtree(entry.path)
            removed.append(Path(entry.path))
            log.info("removed %s, left by a run that ended without cleaning up", entry.path)
        except OSError as error:
            log.debug("could not remove %s: %s", entry.path, error)
    return removed


def _stale(entry: os.DirEntry, now: float) -> bool:
    run = RUN_NAME.fullmatch(entry.name)
    if run is None and not LEGACY_RELAY_NAME.fullmatch(entry.name):
        return False  # not ours
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return False  # a link, a file, or another user's: not ours to remove
    age = now - info.st_mtime
    if run is None:
        return age > STALE_RELAY_AGE
    return age > MAX_RUN_AGE or not _alive(int(run.group(1)))


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another folder of this very process: still in use
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a process of another user has that pid now: leave the folder to the age rule
    return True
