"""No key left behind (security/tempfiles.py): the kubernetes client's copies of client-key-data and the relay's
kubeconfig live in a per-run 0700 folder that every way out removes; `kill -9` leaves it, and the next run sweeps it;
the sweep touches nothing but our own stale folders."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from gpu_bootstrap.security import tempfiles
from tests.tools import ROOT, tool_env


def files_holding(root: Path, secret: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and secret in p.read_bytes()]


def wait_for(predicate, seconds: float = 60, what: str = ""):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds:g} s: {what}")


@pytest.mark.tools
def test_kill_9_leaves_the_key_and_the_next_run_removes_it(cluster, tmp_path):
    """`status --watch` (a real process against the emulator, whose kubeconfig carries client-key-data) is killed
    with SIGKILL once its key file exists; the next `status` leaves no file holding the key in $TMPDIR."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    key = cluster.emu.pki.client_key_pem
    key = key if isinstance(key, bytes) else key.encode()
    env = tool_env(TMPDIR=str(temp), NO_COLOR="1", XDG_STATE_HOME=str(tmp_path))
    args = [sys.executable, "-m", "gpu_bootstrap", "status", "--kubeconfig", str(cluster.kubeconfig)]
    watching = subprocess.Popen([*args, "--watch", "--interval", "1"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        held = wait_for(lambda: files_holding(temp, key), what="the run's copy of the client key")
    finally:
        watching.kill()
        watching.wait()
    assert [p.parent.name.startswith("gpu-bootstrap-run-") for p in held] == [True]
    assert stat.S_IMODE(held[0].parent.stat().st_mode) == 0o700
    assert files_holding(temp, key) == held  # kill -9 left it: that is what the next run must clean up
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode in (0, 1), again.stderr  # it ran (whatever it reported)
    assert files_holding(temp, key) == []
    assert sorted(p.name for p in temp.iterdir()) == []  # neither the killed run's folder nor its own


@pytest.mark.tools
def test_kill_9_during_images_leaves_its_scratch_render_to_the_next_runs_sweep(tmp_path):
    """`images --offline` renders the charts in a scratch folder (`gpu-bootstrap-images-*`): killed with SIGKILL
    while that folder exists, the run leaves it inside its own run folder, which the next command sweeps; nothing of
    the killed run stays in $TMPDIR. (It used to be made at the top of $TMPDIR, where no sweep looks.)"""
    from tests.tools import tool
    temp = tmp_path / "tmp"
    temp.mkdir()
    tool("helm")  # skips (or fails under GPU_BOOTSTRAP_REQUIRE_TOOLS) without the pinned helm
    env = tool_env(TMPDIR=str(temp), NO_COLOR="1", XDG_STATE_HOME=str(tmp_path))
    args = [sys.executable, "-m", "gpu_bootstrap", "images", "--offline", "-c", str(ROOT / "examples" / "minimal.yaml")]
    run = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        scratch = wait_for(lambda: list(temp.rglob("gpu-bootstrap-images-*")), what="the scratch render folder")
    finally:
        run.kill()
        run.wait()
    assert [p.parent.name.startswith("gpu-bootstrap-run-") and p.parent.parent == temp for p in scratch] == [True]
    status = subprocess.run([*args[:3], "rbac", "--for", "status"], env=env, capture_output=True, text=True,
                            timeout=120)
    assert status.returncode == 0, status.stderr  # any command sweeps at its start
    assert sorted(p.name for p in temp.iterdir()) == []  # the killed run's folder, scratch and all, is gone


SCRIPT = """
import time
from gpu_bootstrap.core import interrupts
from gpu_bootstrap.security import tempfiles
interrupts.install(grace=0.2, exit_within=1.5)
folder = tempfiles.run_folder()
(folder / "client-key").write_text("KEY")
try:
    print(folder, flush=True)  # inside the try: the signal may come as soon as this is read
    while True:
        time.sleep(0.02)
except KeyboardInterrupt:
    print("cleaning up", flush=True)
    while True:  # a cleanup that never ends: only the os._exit paths get out
        time.sleep(0.02)
"""


@pytest.mark.parametrize("way", ["second signal", "watchdog"])
def test_the_os_exit_paths_remove_the_run_folder(tmp_path, way):
    """core/interrupts.py leaves with os._exit (no atexit) after a second signal or when cleanup outlives EXIT_WITHIN:
    the run folder goes all the same."""
    process = subprocess.Popen([sys.executable, "-c", SCRIPT], env=tool_env(TMPDIR=str(tmp_path)),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        folder = Path(process.stdout.readline().strip())
        assert (folder / "client-key").exists()
        process.send_signal(signal.SIGTERM)
        assert process.stdout.readline().strip() == "cleaning up"
        if way == "second signal":
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 143
    finally:
        process.kill()
        process.communicate()
    assert not folder.exists() and list(tmp_path.iterdir()) == []


# --- host-free: the sweep touches only our own stale folders ---------------------------------------------------------
def dead_pid() -> int:
    """pid_max itself is never handed out: a pid that cannot be running."""
    return int(Path("/proc/sys/kernel/pid_max").read_text())


def folder(root: Path, name: str, age: float = 0.0, files: tuple[str, ...] = ("key",)) -> Path:
    path = root / name
    path.mkdir(mode=0o700)
    for file in files:
        (path / file).write_text("x")
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


@pytest.mark.unit
def test_the_sweep_removes_our_stale_folders_only(tmp_path):
    alive = os.getppid()
    gone = folder(tmp_path, f"gpu-bootstrap-run-{dead_pid()}-0123abcd", files=("key", tempfiles.LOCK_FILE))
    reused = folder(tmp_path, f"gpu-bootstrap-run-{alive}-0123abcd", files=("key", tempfiles.LOCK_FILE))
    unlocked = folder(tmp_path, f"gpu-bootstrap-run-{dead_pid()}-01234567")  # an older version's, or half-made
    ancient = folder(tmp_path, f"gpu-bootstrap-run-{alive}-89abcdef", age=tempfiles.UNLOCKED_RUN_AGE + 60)
    old_prep = folder(tmp_path, ".gpu-bootstrap-prep-0123abcd", age=tempfiles.UNLOCKED_RUN_AGE + 60,
                      files=(tempfiles.LOCK_FILE,))
    young_prep = folder(tmp_path, ".gpu-bootstrap-prep-89abcdef", files=(tempfiles.LOCK_FILE,))
    old_relay = folder(tmp_path, "gpu-bootstrap-relay-abc_1234", age=tempfiles.STALE_RELAY_AGE + 60)
    young_relay = folder(tmp_path, "gpu-bootstrap-relay-abc_5678", age=60)
    others = [folder(tmp_path, name, age=10 ** 8) for name in (
        "tmpabcd1234", "gpu-bootstrap-run-notes", f"gpu-bootstrap-run-{dead_pid()}-0123abcd-copy",
        "gpu-bootstrap-relay-x", "my-gpu-bootstrap-relay-abc_1234", ".gpu-bootstrap-prep-x")]
    (tmp_path / f"gpu-bootstrap-run-{dead_pid()}-deadbeef").write_text("a file, not our folder")
    (tmp_path / "elsewhere").mkdir()
    outside = folder(tmp_path / "elsewhere", "target", files=("key", tempfiles.LOCK_FILE))
    (tmp_path / f"gpu-bootstrap-run-{dead_pid()}-feedface").symlink_to(outside)
    theirs = folder(tmp_path, f"gpu-bootstrap-run-{dead_pid()}-00000000", files=("key", tempfiles.LOCK_FILE))
    os.chown(theirs, 12345, 12345)  # another user's (the tests run as root; elsewhere this needs root too)
    removed = tempfiles.sweep(tmp_path)
    # an unheld lock is a dead run whatever its pid (reused: the pid now names another process)
    assert sorted(removed) == sorted([gone, reused, ancient, old_prep, old_relay])
    assert all(p.exists() for p in (unlocked, young_prep, young_relay, *others, outside / "key", theirs))
    assert (tmp_path / f"gpu-bootstrap-run-{dead_pid()}-deadbeef").is_file()
    assert (tmp_path / f"gpu-bootstrap-run-{dead_pid()}-feedface").is_symlink()


HOLD_IN_ANOTHER_PID_NAMESPACE = r"""
import os, sys, tempfile
pid = int(sys.argv[1])
with open("/proc/sys/kernel/ns_last_pid", "w") as f:  # the run gets this pid inside its own PID namespace
    f.write(str(pid - 1))
child = os.fork()
if child == 0:
    tempfile.tempdir = sys.argv[2]
    from gpu_bootstrap.security import tempfiles
    print(tempfiles.run_folder(), os.getpid(), flush=True)
    sys.stdin.read()  # runs until the test closes its stdin
    os._exit(0)
os.waitpid(child, 0)
"""


@pytest.mark.tools
def test_a_live_run_in_another_pid_namespace_keeps_its_folder(tmp_path):
    """A container sharing /tmp with the host: its run's pid means nothing here (here it is no process at all), but
    its folder's lock is the same lock, so the host's sweep keeps the folder while the run lives and removes it
    after. Needs root (unshare --pid); a real second PID namespace, nothing faked."""
    if os.geteuid() != 0:
        pytest.skip("needs root for a PID namespace (unshare --pid)")
    pid = dead_pid() - 1000
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    env = tool_env()
    run = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                            HOLD_IN_ANOTHER_PID_NAMESPACE, str(pid), str(tmp_path)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        path, inner = run.stdout.readline().split()
        assert int(inner) == pid and not Path(f"/proc/{pid}").exists()  # that pid is nobody in our namespace
        assert Path(path).name.startswith(f"gpu-bootstrap-run-{pid}-")
        assert tempfiles.sweep(tmp_path) == [] and Path(path).is_dir()
    finally:
        run.stdin.close()
        run.wait(timeout=30)
    assert tempfiles.sweep(tmp_path) == [Path(path)] and not Path(path).exists()


@pytest.mark.unit
def test_the_run_folder_is_private_and_its_removal_forgets_the_clients_files(tmp_path, monkeypatch):
    """The kubernetes client's cache (content -> temp file) is stood in for by its shape: importing the package
    would open a socket, which a unit test may not."""
    monkeypatch.setattr(tempfiles.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(tempfiles, "_folder", None)
    monkeypatch.setattr(tempfiles, "_locks", {})  # the worker's own run folder and its lock stay as they are
    old = os.umask(0o022)
    try:
        run = tempfiles.run_folder()
    finally:
        os.umask(old)
    assert run.parent == tmp_path and stat.S_IMODE(run.stat().st_mode) == 0o700
    assert tempfiles.RUN_NAME.fullmatch(run.name) and tempfiles.run_folder() == run
    (run / "tmpkey").write_text("KEY")
    cache = {"b'KEY'": str(run / "tmpkey"), "b'OTHER'": str(tmp_path / "tmpother")}
    monkeypatch.setitem(sys.modules, "kubernetes.config.kube_config", types.SimpleNamespace(_temp_files=cache))
    tempfiles.remove()
    assert not run.exists() and cache == {"b'OTHER'": str(tmp_path / "tmpother")}  # someone else's is kept
    assert tempfiles.sweep(tmp_path) == [] and list(tmp_path.iterdir()) == []


SECOND_FOLDER_IN_ONE_PROCESS = r"""
import sys, tempfile
tempfile.tempdir = sys.argv[1]
from gpu_bootstrap.security import tempfiles
first = tempfiles.run_folder()
tempfiles._folder = None  # what a test swapping the module's folder did inside a live pytest worker
second = tempfiles.run_folder()
tempfiles.remove()  # the second one
print(first, second, flush=True)
sys.stdin.read()
"""


@pytest.mark.tools
def test_a_second_run_folder_made_and_removed_in_one_process_leaves_the_first_ones_lock_held(tmp_path):
    """The cause of a live relay's kubeconfig vanishing mid-install under a busy suite: a unit test swapped the run
    folder inside a pytest worker, making a second one closed the first one's lock, and another process's sweep then
    took the live folder for a dead run's. A lock now goes only with its own folder."""
    env = tool_env()
    run = subprocess.Popen([sys.executable, "-c", SECOND_FOLDER_IN_ONE_PROCESS, str(tmp_path)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        first, second = map(Path, run.stdout.readline().split())
        assert first.is_dir() and not second.exists()
        assert tempfiles.sweep(tmp_path) == [] and first.is_dir()  # held: its process lives
    finally:
        run.stdin.close()
        run.wait(timeout=30)
    assert tempfiles.sweep(tmp_path) == [first]
