"""Output folders (`--render-dir`, `export -o`): written so that nothing planted in them can redirect a write.

A folder someone else can write into may hold a symbolic link named like a file we write (`values.yaml` -> the
victim's ~/.bashrc), or a hard link to another file: writing through it would overwrite that file and make it 0600.
So, before anything is written, a folder holding a link, a file with other hard links or anything that is neither
a file nor a folder is refused (exit 2, naming it; only `.git` is not looked into: an export may sit in a work
tree), and every write goes through file descriptors opened with O_NOFOLLOW, folder by folder from the root
(`openat`), into a new file (0600; its folders 0700), so a link planted between the check and the write is not
followed either: the write fails instead.
"""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from gpu_bootstrap.core.errors import UsageError

SKIPPED = (".git",)  # a work tree's own folder: never written into, never looked into
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def refuse_planted(folder: Path, option: str, descend=None) -> None:
    """UsageError when `folder` is a link, or holds a link, a multiply linked file or a special file. `descend`
    (a test on the name of a folder at the top): look only into those (where we write); every entry at the top is
    checked either way."""
    if folder.is_symlink():
        raise UsageError(f"{option} {folder} is a symbolic link (to {os.readlink(folder)})",
                         "give the real folder: gpu-bootstrap never writes through a link")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise UsageError(f"{option} {folder} exists and is not a directory")
    for where, folders, files in os.walk(folder, followlinks=False):
        top = Path(where) == folder
        checked = [*folders, *files]
        folders[:] = [f for f in folders if not top or (f not in SKIPPED and (descend is None or descend(f)))]
        for name in checked:
            path = Path(where) / name
            problem = _planted(path)
            if problem:
                raise UsageError(f"{option} {folder} holds {path.relative_to(folder)}, {problem}",
                                 "gpu-bootstrap writes only plain files it makes; remove it, or give a new folder")


def _planted(path: Path) -> str:
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return f"a symbolic link (to {os.readlink(path)}) that gpu-bootstrap did not write"
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        return f"a file with {info.st_nlink - 1} other hard link(s)"
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        return "neither a file nor a folder"
    return ""


def make_folder(folder: Path) -> None:
    """Create `folder` (and its parents) 0700, whatever the umask; a folder that exists keeps its mode."""
    if not folder.exists():
        folder.mkdir(parents=True, mode=0o700)
        folder.chmod(0o700)


@contextlib.contextmanager
def _opened(root: Path, parts: tuple[str, ...]):
    """A descriptor of root/parts..., every folder on the way opened without following a link (made 0700 when
    missing)."""
    fd = os.open(root, _DIR)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
                made = True
            except FileExistsError:
                made = False
            child = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
            if made:
                os.fchmod(fd, 0o700)
        yield fd
    finally:
        os.close(fd)


def write(root: Path, relative: str | Path, text: str, append: bool = False) -> Path:
    """Write `text` to root/relative as a new 0600 file (append: to the file this run made there before)."""
    parts = Path(relative).parts
    if not parts or any(part in ("", ".", "..") for part in parts) or Path(relative).is_absolute():
        raise ValueError(f"not a path inside the folder: {relative}")
    with _opened(root, parts[:-1]) as folder:
        name = parts[-1]
        if append:
            fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=folder)
            if os.fstat(fd).st_nlink != 1:
                os.close(fd)
                raise UsageError(f"{root / relative} gained another hard link while it was written")
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=folder)  # a new inode: whatever stood there (a link, a hard link) is not reused
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=folder)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                fd = -1
                out.write(text)
        finally:
            if fd >= 0:
                os.close(fd)
    return root / relative
