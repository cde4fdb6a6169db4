"""Typed errors. The CLI catches them once, prints one line (what failed, where, what to do) and exits with the
error's code; the full detail goes to the log file."""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_LEFT_WAITING = 3  # teardown done, but it left pods waiting for a scheduler it removed
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


class GpuBootstrapError(Exception):
    exit_code = EXIT_FAILED

    def __init__(self, message: str, hint: str = "", step: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.step = step

    def one_line(self) -> str:
        where = f"[{self.step}] " if self.step else ""
        hint = f" — {self.hint}" if self.hint else ""
        return f"{where}{self.message}{hint}"


class ConfigError(GpuBootstrapError):
    """Bad input: a config file, a flag, a report file. Nothing has been touched."""

    exit_code = EXIT_USAGE


class UsageError(ConfigError):
    pass


class ClusterError(GpuBootstrapError):
    """The Kubernetes API refused or failed a request."""

    def __init__(self, message: str, hint: str = "", step: str = "", status: int = 0, reason: str = ""):
        super().__init__(message, hint, step)
        self.status = status
        self.reason = reason


class Conflict(ClusterError):
    """The object changed under us (409): re-read and re-plan."""


class NotFound(ClusterError):
    pass


class Unreachable(ClusterError):
    """No answer from the API server (connection refused, DNS, TLS, timeout)."""


class Unknown(GpuBootstrapError):
    """A fact nobody could ask about (a plan made with no cluster): neither present nor absent. Deliberately not a
    ClusterError, so no code that maps "the cluster refused" to "absent" can swallow it."""


class CheckFailed(GpuBootstrapError):
    """A precondition does not hold (e.g. a configured node is missing)."""


class StepFailed(GpuBootstrapError):
    pass


class LockHeld(GpuBootstrapError):
    def __init__(self, holder: str, since: str, lease: str):
        super().__init__(f"another gpu-bootstrap run holds the lock: {holder} (since {since})",
                         f"wait for it to finish, or if it is gone, rerun with --force-unlock (Lease {lease})")
        self.holder = holder
        self.since = since


class LockLost(GpuBootstrapError):
    def __init__(self, holder: str):
        super().__init__(f"the lock was taken over by {holder} while this run was working",
                         "another run forced the lock; rerun when it is done")


class Interrupted(GpuBootstrapError):
    """Ctrl-C or SIGTERM. The exit code is 128 + the signal number (130 SIGINT, 143 SIGTERM): `signum`, else the
    signal gpu_bootstrap.core.interrupts saw, else 130."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, step: str = "", signum: int | None = None):
        from gpu_bootstrap.core.interrupts import received, signal_name
        signum = received() if signum is None else signum
        super().__init__(f"interrupted by {signal_name(signum)}" if signum else "interrupted",
                         "rerun the same command to resume where it stopped", step)
        self.signum = signum
        if signum:
            self.exit_code = 128 + signum


class ReleaseNotFound(NotFound):
    """helm: the release does not exist."""
