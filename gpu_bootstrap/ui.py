"""Everything people see: progress and tables (rich), the JSON document for machines, and the log file.

The pipeline reports through a Reporter and never touches the screen itself.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import sys
from pathlib import Path

from .paths import state_dir

STATUS_STYLE = {"applied": "green", "unchanged": "dim", "skipped": "dim", "planned": "cyan", "failed": "bold red",
                "interrupted": "yellow", "undone": "green", "pass": "green", "warn": "yellow", "fail": "bold red",
                "skip": "dim"}
STATUS_ICON = {"applied": "✔", "unchanged": "·", "skipped": "-", "planned": "→", "failed": "✘", "interrupted": "!",
               "undone": "✔", "pass": "✔", "warn": "!", "fail": "✘", "skip": "-"}
KEEP_LOGS = 30


# --- log file ----------------------------------------------------------------------------------------------------------
def setup_logging(command: str, log_file: Path | None, verbose: int) -> Path:
    """Log everything to a 0600 file (default under the user's state dir) and, with -v, to stderr."""
    if log_file is None:
        folder = state_dir() / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        log_file = folder / f"{command}-{stamp}-{os.getpid()}.log"
        _prune(folder)
    else:
        log_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:  # the mode above applies only to a new file: an existing one is made private too
        import stat
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode) and stat.S_IMODE(mode) != 0o600:  # never /dev/null or a pipe
            os.fchmod(fd, 0o600)
    except PermissionError as error:
        from .errors import UsageError
        raise UsageError(f"--log-file {log_file}: cannot make it private (0600): {error.strerror}",
                         "use a file you own, or leave --log-file out") from None
    finally:
        os.close(fd)
    root = logging.getLogger("gpu_bootstrap")
    root.setLevel(logging.DEBUG)
    for handler in list(root.handlers):
        root.removeHandler(handler)
        if isinstance(handler, logging.FileHandler):  # an earlier run in this process: close its file
            handler.close()
    file_handler = logging.FileHandler(log_file)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(file_handler)
    if verbose:
        stream = logging.StreamHandler(sys.stderr)
        stream.setLevel(logging.DEBUG if verbose > 1 else logging.INFO)
        stream.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(stream)
    root.propagate = False
    helm = logging.getLogger("pyhelm3")  # the helm driver logs every command: into our file, not onto stderr
    helm.handlers = [file_handler]
    helm.setLevel(logging.INFO)
    helm.propagate = False
    return log_file


def _prune(folder: Path) -> None:
    logs = sorted(folder.glob("*.log"), key=lambda p: p.stat().st_mtime)
    for old in logs[:-KEEP_LOGS]:
        try:
            old.unlink()
        except OSError:
            pass


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape
    return rich_escape(text)


def console(stderr: bool = False):
    from rich.console import Console
    return Console(stderr=stderr, highlight=False, soft_wrap=True)  # never split a path or message in logs


# --- reporters ------------------------------------------------------------------------------------------------------------
class Reporter:
    """Silent base: logs what happens."""

    log = logging.getLogger("gpu_bootstrap.run")

    def step_started(self, step) -> None:
        self.log.info("step %s: %s", step.id, step.title)

    def step_finished(self, result) -> None:
        self.log.info("step %s: %s (%d changes) %s", result.id, result.status, result.changes, result.message)

    def change(self, step_id: str, change, applied: bool) -> None:
        self.log.info("%s: %s %s", step_id, "applied" if applied else "planned", change.describe())

    def warn(self, message: str) -> None:
        self.log.warning(message)

    def note(self, message: str) -> None:
        self.log.info(message)


class RichReporter(Reporter):
    """Progress per step and each change as it happens, for people at a terminal."""

    def __init__(self, dry_run: bool = False):
        self.out = console()
        self.dry_run = dry_run
        self._status = None

    def step_started(self, step) -> None:
        super().step_started(step)
        if self.out.is_terminal:
            self._status = self.out.status(f"[bold]{step.id}[/] {escape(step.title)} …")
            self._status.start()
        else:
            self.out.print(f"[bold]{step.id}[/] {step.title} …")

    def _stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def step_finished(self, result) -> None:
        super().step_finished(result)
        self._stop()
        style = STATUS_STYLE.get(result.status, "")
        count = f" ({result.changes} change{'s' if result.changes != 1 else ''})" if result.changes else ""
        message = f" — {escape(result.message)}" if result.message else ""
        self.out.print(f"[{style}]{STATUS_ICON.get(result.status, ' ')} {result.id}: {result.status}{count}[/]"
                       f"[dim]{message}[/]")

    def change(self, step_id: str, change, applied: bool) -> None:
        super().change(step_id, change, applied)
        verb = "[green]changed[/]" if applied else "[cyan]would change[/]"
        reason = f" [dim]← {escape(change.reason)}[/]" if change.reason else ""
        self.out.print(f"    {verb} {escape(str(change.target))}: {escape(change.summary)}{reason}")

    def warn(self, message: str) -> None:
        super().warn(message)
        console(stderr=True).print(f"[yellow]warning:[/] {escape(message)}")

    def note(self, message: str) -> None:
        super().note(message)
        self.out.print(f"[dim]{escape(message)}[/]")

    def summary(self, results, title: str) -> None:
        from rich.table import Table
        table = Table(title=title, title_justify="left", show_lines=False)
        for column in ("step", "status", "changes", "message"):
            table.add_column(column, overflow="fold")
        for result in results:
            style = STATUS_STYLE.get(result.status, "")
            table.add_row(result.id, f"[{style}]{result.status}[/]", str(result.changes), escape(result.message))
        self.out.print(table)


class JsonReporter(Reporter):
    """Nothing on stdout until the end; then one JSON document."""

    def summary(self, results, title: str) -> None:
        pass


def print_json(document: dict) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def print_error(message: str, log_file: Path | None) -> None:
    err = console(stderr=True)
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    if log_file is not None:
        err.print(f"[dim]details: {escape(str(log_file))}[/]")


# --- doctor -------------------------------------------------------------------------------------------------------------
def _cell(check) -> str:
    """Status icon plus the one fact that matters, for the node table."""
    data = check.data or {}
    summary = ""
    if check.status in ("pass", "warn"):
        if check.id == "ssh":
            summary = f"{data.get('os_id', '')} {data.get('os_version', '')}"
        elif check.id == "nvidia-driver":
            gpus = data.get("gpus") or []
            summary = data.get("driver_version") or "no driver"
            if gpus:
                summary += f" {len(gpus)}×{gpus[0]['name'].replace('NVIDIA ', '')[:18]}"
        elif check.id == "container-runtime":
            distro = data.get("distribution")
            summary = f"{data.get('runtime')} {data.get('version') or ''}".strip()
            summary += f" ({distro})" if distro and distro != "standard" else ""
        elif check.id == "nvidia-container-toolkit":
            state = ("default" if data.get("default_runtime") else "configured" if data.get("runtime_configured")
                     else "not configured" if data.get("installed") else "absent")
            summary = f"{data.get('version') or ''} {state}"
        elif check.id == "nouveau":
            summary = "loaded" if data.get("loaded") else "no"
    style = STATUS_STYLE.get(check.status, "")
    return f"[{style}]{STATUS_ICON.get(check.status, '')}[/] {escape(summary.strip() or check.status)}"


def doctor_tables(rows, reports) -> None:
    """The cluster/step checks, the node × check table, then every warning and failure in full."""
    from rich.table import Table
    out = console()
    if rows:
        table = Table(title="cluster and steps", title_justify="left")
        for column in ("check", "status", "message"):
            table.add_column(column, overflow="fold")
        for name, check in rows:
            style = STATUS_STYLE.get(check.status, "")
            table.add_row(name, f"[{style}]{STATUS_ICON.get(check.status, '')} {check.status}[/]",
                          escape(check.message))
        out.print(table)
    if not reports:
        return
    table = Table(title="GPU nodes", title_justify="left")
    table.add_column("node")
    for check in reports[0].checks:
        table.add_column(check.id, overflow="fold")
    for report in reports:
        table.add_row(escape(report.name), *[_cell(c) for c in report.checks])
    out.print(table)
    for report in reports:
        for check in report.checks:
            if check.status in ("warn", "fail"):
                style = STATUS_STYLE[check.status]
                out.print(f"[{style}]{STATUS_ICON[check.status]} {escape(report.name)} {check.id}:[/] "
                          f"{escape(check.message)}")
