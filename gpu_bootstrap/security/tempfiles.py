"""No key left behind: the one private temp folder of a run, and the sweep of those that runs killed left.

The kubernetes client writes the kubeconfig's `client-key-data` (and certificate data) to temp files, and the helm
relay keeps its kubeconfig (with its token) in a temp folder. Both go into this process's run folder,
`$TMPDIR/gpu-bootstrap-run-<pid>-<random>/` (0700, made on first use). It is removed on every way out: a normal exit
or a signal (atexit), and the `os._exit` paths of gpu_bootstrap.core.interrupts (`remove()` first). Only `kill -9` or a
crash of the machine leaves it, and the next run's `sweep()` removes it: a run folder whose process is gone, and a
relay folder that an older version left at the top of $TMPDIR once it is older than STALE_RELAY_AGE. Helm's chart
downloads and `images`' scratch render live inside the run folder too, so they go with it.

"Gone" is decided by a lock, not by the pid in the folder's name: the process holds an exclusive flock on the folder's
LOCK_FILE for its whole life, and the kernel drops it when the process dies, however it dies. A pid says nothing
across PID namespaces (a container sharing /tmp with the host: its run's pid 57 is another process, or none, here),
while a lock on the same file is the same lock in every namespace. A run folder without the lock file (made by a
version before it, or by a run killed between making the folder and locking it) is removed once older than
UNLOCKED_RUN_AGE. The sweep matches our own name patterns only, skips what another user owns and never follows a
link: other programs' files are never touched. A folder is made and locked under a PREP_PREFIX name and only
then renamed to its run name, so no sweep can take a live run's folder for a dead one's.
"""
from __future__ import annotations

import atexit
import fcntl
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

from gpu_bootstrap.core import interrupts

log = logging.getLogger("gpu_bootstrap.tempfiles")

RUN_PREFIX = "gpu-bootstrap-run-"
RUN_NAME = re.compile(r"gpu-bootstrap-run-(\d+)-[0-9a-f]{8}")
PREP_PREFIX = ".gpu-bootstrap-prep-"  # a run folder being made (renamed once locked); empty but for its lock
PREP_NAME = re.compile(r"\.gpu-bootstrap-prep-[0-9a-f]{8}")
LEGACY_RELAY_NAME = re.compile(r"gpu-bootstrap-relay-[A-Za-z0-9_]{8}")  # tempfile.mkdtemp's suffix
STALE_RELAY_AGE = 6 * 3600.0  # seconds: an older version's relay folder (it holds a token that died with its relay)
UNLOCKED_RUN_AGE = STALE_RELAY_AGE  # seconds: a run folder without a lock file (an older version's)
LOCK_FILE = ".lock"  # flocked by the folder's process for its whole life

_lock = threading.Lock()
_folder: Path | None = None
# each run folder this process made -> the descriptor holding its lock. A lock is let go only with its own folder
# (removed by us, or found gone): making a second folder in one process (the first one removed under us) never
# drops a lock whose folder still holds a live relay's kubeconfig, which another run's sweep would then take.
_locks: dict[Path, int] = {}


def run_folder() -> Path:
    """This process's private temp folder (0700), made on first use and removed when the process ends."""
    global _folder
    with _lock:
        if _folder is None or not _folder.is_dir():
            # made and locked under a name the sweep leaves alone for a while, then renamed (atomically): a
            # sweep never sees a run folder whose lock is not held yet
            root = Path(tempfile.gettempdir())
            prep = root / f"{PREP_PREFIX}{secrets.token_hex(4)}"
            prep.mkdir(mode=0o700)
            prep.chmod(0o700)  # whatever the umask
            _release_gone()
            held = _hold(prep)
            path = root / f"{RUN_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
            prep.rename(path)
            _locks[path] = held
            if _folder is None:
                atexit.register(remove)
                interrupts.before_exit(remove)
            _folder = path
        return _folder


def _hold(path: Path) -> int:
    """Lock the folder's LOCK_FILE for this process's life (O_CLOEXEC: a child such as helm holds nothing); returns
    the descriptor that holds it."""
    fd = os.open(path / LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else can hold it
    return fd


def _release_gone() -> None:
    """Let go of the locks of run folders that are no longer there (removed by something else)."""
    for path in list(_locks):
        if not path.is_dir():
            os.close(_locks.pop(path))


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
    held = _locks.pop(folder, None)
    if held is not None:
        os.close(held)
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
    mine = {path.name for path in _locks} | ({_folder.name} if _folder is not None else set())
    for entry in entries:
        if entry.name in mine or not _stale(entry, now):
            continue
        try:
            shutil.rmtree(entry.path)
            removed.append(Path(entry.path))
            log.info("removed %s, left by a run that ended without cleaning up", entry.path)
        except OSError as error:
            log.debug("could not remove %s: %s", entry.path, error)
    return removed


def _stale(entry: os.DirEntry, now: float) -> bool:
    run = RUN_NAME.fullmatch(entry.name) or PREP_NAME.fullmatch(entry.name)
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
    held = _lock_held(Path(entry.path) / LOCK_FILE)
    if held is None or entry.name.startswith(PREP_PREFIX):  # an older version's folder, or one left half-made
        return age > UNLOCKED_RUN_AGE and not held
    return not held


def _lock_held(path: Path) -> bool | None:
    """Whether a live process holds the folder's lock; None when there is no lock file to ask."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:
        return True  # cannot tell (a link, no permission): keep the folder
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False  # nobody holds it: its process is gone (our lock goes with the descriptor, closed below)
    except OSError as error:
        return True  # EWOULDBLOCK: held; anything else: cannot tell, so keep the folder
    finally:
        os.close(fd)
