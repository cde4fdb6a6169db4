"""Signals and the child processes that must not outlive us.

Helm runs as a child process for minutes at a time. Three things keep it from outliving gpu-bootstrap:

* `start_child()` starts every such child in its own process group (`start_new_session=True`, so a terminal's
  Ctrl-C reaches only us and we decide what the child gets) and, on Linux, with `PR_SET_PDEATHSIG=SIGKILL`, so the
  kernel kills it when we die, even by `kill -9`. The children are kept in a registry while they run.
* `install()` (called once by the CLI) turns SIGINT and SIGTERM into: SIGTERM to every registered child's process
  group, SIGKILL to what is left after `GRACE` seconds, and a KeyboardInterrupt in the main thread, so the runner
  records the step as interrupted and releases the lock. A watchdog ends the process `EXIT_WITHIN` seconds after
  the signal whatever the cleanup is doing (CI runners and Kubernetes Jobs SIGKILL ~30 s after SIGTERM; we leave
  well before). A second signal ends the process at once. Both exits skip atexit, so they remove the run's temp
  folder (gpu_bootstrap/security/tempfiles.py: the user's client key, the relay's token) themselves.
* `exit_code()` is 128 + the signal number (130 for SIGINT, 143 for SIGTERM), or 130 without a signal.

After a signal, `cleanup_deadline()` tells adapters how long their cleanup requests may take, and `start_child()`
refuses to start anything new.
"""
from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import sys
import threading
import time

log = logging.getLogger("gpu_bootstrap.interrupts")

GRACE = 3.0  # seconds a child gets between SIGTERM and SIGKILL
EXIT_WITHIN = 4.5  # seconds after the first signal by which the process is gone, cleanup or not
CLEANUP_MARGIN = 1.0  # cleanup requests must be done this long before the watchdog fires
EXIT_INTERRUPTED = 130

_children: dict[int, subprocess.Popen] = {}  # pid -> running child (its process group has the same id)
_registry_lock = threading.RLock()  # re-entrant: the signal handler runs in the main thread, maybe inside it
_received: int | None = None  # the first SIGINT/SIGTERM, once one arrived
_received_at: float | None = None  # time.monotonic() of that signal
_kill_at: dict[int, float] = {}  # pid -> time.monotonic() after which a child that was told to stop gets SIGKILL
_settings = {"grace": GRACE, "exit_within": EXIT_WITHIN}
_before_exit: list = []  # callables run before os._exit skips atexit (security/tempfiles.py registers its removal)
_installed = False
_main_starting = False  # the main thread is between fork and registration in start_child()
_deferred = False  # a signal arrived then; start_child() raises the KeyboardInterrupt once the child is registered


# --- starting children ------------------------------------------------------------------------------------------------
def _prctl():
    """libc's prctl as a ctypes function, resolved once (None off Linux or without it)."""
    global _prctl_function
    if _prctl_function is None:
        _prctl_function = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes
                import ctypes.util
                libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
                function = libc.prctl
                function.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
                function.restype = ctypes.c_int
                _prctl_function = function
            except (OSError, AttributeError):
                log.debug("prctl is not available: children will not die with us on kill -9")
    return _prctl_function or None


_prctl_function = None
PR_SET_PDEATHSIG = 1


def _die_with_parent_hook():
    """A preexec_fn for Popen that makes the child receive SIGKILL when its parent dies (Linux prctl), or None
    where that is not available. Everything is resolved here, in the parent: the child makes two calls."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()
    kill_signal = int(signal.SIGKILL)

    def hook():  # runs in the child between fork and exec: no imports, no locks
        prctl(PR_SET_PDEATHSIG, kill_signal, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), kill_signal)
    return hook


def start_child(argv: list[str], **popen_args) -> subprocess.Popen:
    """Start a child that dies with us: its own process group (start_new_session), PR_SET_PDEATHSIG=SIGKILL on
    Linux, no shell. Registered until `forget()` (or `stop()`) sees it gone. Refused once a signal arrived."""
    global _main_starting, _deferred
    if _received is not None:
        raise KeyboardInterrupt(f"not starting {os.path.basename(argv[0])}: shutting down after a signal")
    hook = _die_with_parent_hook()
    in_main = threading.current_thread() is threading.main_thread()
    with _registry_lock:
        # A KeyboardInterrupt between fork and registration would lose the child: the handler defers it to here.
        if in_main:
            _main_starting = True
        try:
            process = subprocess.Popen(argv, start_new_session=True, preexec_fn=hook, close_fds=True, **popen_args)
            _children[process.pid] = process
        except BaseException as error:
            if in_main:
                _main_starting = False
                if _deferred:
                    _deferred = False
                    raise KeyboardInterrupt(signal_name()) from error
            raise
        if in_main:
            _main_starting = False
            if _deferred:  # the signal came while we were starting it: it gets the same treatment as the others
                _deferred = False
                _kill_at[process.pid] = (_received_at or time.monotonic()) + _settings["grace"]
                _signal_group(process, signal.SIGTERM)
                stop(process, wait=False)
                raise KeyboardInterrupt(signal_name())
    return process


def running() -> list[subprocess.Popen]:
    """The registered children that have not been reaped yet."""
    with _registry_lock:
        return [p for p in _children.values() if p.returncode is None]


def forget(process: subprocess.Popen) -> None:
    """Drop a child from the registry (call once it has been reaped)."""
    with _registry_lock:
        _children.pop(process.pid, None)
        _kill_at.pop(process.pid, None)


def _signal_group(process: subprocess.Popen, sig: int) -> bool:
    """Send sig to the child's process group. Only while the child is unreaped: its id cannot be reused then."""
    if process.returncode is not None:
        return False
    try:
        os.killpg(process.pid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a group we do not own
        try:
            process.send_signal(sig)
            return True
        except ProcessLookupError:
            return False


def _terminate(process: subprocess.Popen, grace: float) -> float:
    """SIGTERM to the child's group (once); returns when it is due for SIGKILL."""
    with _registry_lock:
        if process.pid not in _kill_at:
            _kill_at[process.pid] = time.monotonic() + grace
            _signal_group(process, signal.SIGTERM)
        return _kill_at[process.pid]


def stop(process: subprocess.Popen, grace: float | None = None, wait: bool = True) -> None:
    """End a child: SIGTERM to its process group, SIGKILL after `grace` seconds if it is still there, reap it and
    drop it from the registry. With wait=False the waiting happens in a background thread (the caller is
    unwinding after a signal and must not block); at interpreter exit whatever is left is killed."""
    kill_at = _terminate(process, _settings["grace"] if grace is None else grace)
    if wait:
        _reap(process, kill_at)
    else:
        threading.Thread(target=_reap, args=(process, kill_at), name=f"stop-{process.pid}", daemon=True).start()


def _reap(process: subprocess.Popen, kill_at: float) -> None:
    try:
        try:
            out, err = process.communicate(timeout=max(0.0, kill_at - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            out, err = process.communicate()
        if err:
            text = err.decode(errors="replace") if isinstance(err, bytes) else err
            log.debug("%s (pid %d) stopped: %s", os.path.basename(str(process.args[0])), process.pid,
                      text.strip()[-2000:])
    except (OSError, ValueError, RuntimeError) as error:  # pipes closed under us; make sure it is dead anyway
        log.debug("reaping pid %d: %s", process.pid, error)
        _signal_group(process, signal.SIGKILL)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
    finally:
        _kill_group_leftovers(process)
        forget(process)


def _kill_group_leftovers(process: subprocess.Popen) -> None:
    """A child that ended may leave descendants in its group (helm plugins, post-renderers); kill those too. The
    group id is the child's pid, which nobody can reuse while that group has members."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _kill_leftovers() -> None:
    """At interpreter exit nothing we started may survive: a child told to stop gets what is left of its grace
    period, anything else SIGKILL now. (PR_SET_PDEATHSIG covers the exits that skip atexit, like kill -9.)"""
    for process in running():
        kill_at = _kill_at.get(process.pid, time.monotonic())
        while process.poll() is None and time.monotonic() < kill_at:
            time.sleep(0.02)
        _signal_group(process, signal.SIGKILL)
        try:
            process.wait(timeout=2)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL never takes that long
            pass
        _kill_group_leftovers(process)


# --- signals ----------------------------------------------------------------------------------------------------------
def received() -> int | None:
    """The signal number that interrupted this run (SIGINT or SIGTERM), or None."""
    return _received


def exit_code(default: int = EXIT_INTERRUPTED) -> int:
    """128 + the signal number once a signal arrived (130 SIGINT, 143 SIGTERM); `default` otherwise."""
    return 128 + _received if _received is not None else default


def signal_name(signum: int | None = None) -> str:
    signum = _received if signum is None else signum
    if signum is None:
        return "a signal"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def cleanup_deadline() -> float | None:
    """time.monotonic() by which cleanup after a signal must be done (requests should give up then), or None
    while no signal arrived."""
    if _received_at is None:
        return None
    return _received_at + _settings["exit_within"] - CLEANUP_MARGIN


def install(grace: float = GRACE, exit_within: float = EXIT_WITHIN,
            signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> bool:
    """Handle SIGINT and SIGTERM as described in the module docstring. Call from the main thread; returns False
    (and does nothing) elsewhere, since Python only lets the main thread set handlers."""
    global _installed
    if threading.current_thread() is not threading.main_thread():
        return False
    _settings["grace"] = grace
    _settings["exit_within"] = exit_within
    for signum in signals:
        signal.signal(signum, _handle)
    _installed = True
    return True


def _handle(signum, frame):
    global _received, _received_at, _deferred
    if _received is not None:  # a second signal: stop now
        for process in running():
            _signal_group(process, signal.SIGKILL)
        _exit_now(128 + _received)
    _received, _received_at = signum, time.monotonic()
    for process in running():
        _terminate(process, _settings["grace"])
    threading.Thread(target=_watchdog, args=(signum, _received_at), name="interrupt-watchdog", daemon=True).start()
    if _main_starting:
        _deferred = True  # start_child() raises once the child it is starting is registered
        return
    raise KeyboardInterrupt(signal_name(signum))


def _watchdog(signum: int, at: float) -> None:
    """SIGKILL the children left after the grace period; end the process if it is still here at EXIT_WITHIN."""
    log.warning("received %s: stopping %d child process(es) and recording the interruption", signal_name(signum),
                len(running()))
    time.sleep(max(0.0, at + _settings["grace"] - time.monotonic()))
    for process in running():
        if _signal_group(process, signal.SIGKILL):
            log.warning("pid %d did not stop within %.0f s of SIGTERM; killed it", process.pid, _settings["grace"])
    time.sleep(max(0.0, at + _settings["exit_within"] - time.monotonic()))
    message = (f"gpu-bootstrap: cleanup after {signal_name(signum)} took longer than "
               f"{_settings['exit_within']:g} s; exiting now (the next run takes over the lock)")
    log.error("%s", message)
    try:
        for handler in logging.getLogger("gpu_bootstrap").handlers:
            handler.flush()
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - nothing may stop the exit
        pass
    _exit_now(128 + signum)


def before_exit(callback) -> None:
    """Run `callback` before a forced exit (os._exit skips atexit). The run's temp folder registers its removal
    here when it is made, so this floor module need not know it."""
    if callback not in _before_exit:
        _before_exit.append(callback)


def _exit_now(code: int) -> None:
    """os._exit, which skips atexit: the run's temp folder (the user's client key, the relay's token) goes first."""
    for callback in list(_before_exit):
        try:
            callback()
        except BaseException:  # noqa: BLE001 - nothing may stop the exit
            pass
    os._exit(code)


def reset() -> None:
    """Forget a received signal and restore the default handlers (tests, and embedding callers)."""
    global _received, _received_at, _installed, _deferred
    _received = _received_at = None
    _deferred = False
    _settings.update(grace=GRACE, exit_within=EXIT_WITHIN)
    if _installed and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _installed = False
