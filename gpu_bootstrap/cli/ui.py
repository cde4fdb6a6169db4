"""Everything people see: progress and tables (rich), the JSON document for machines, and the log file.

The pipeline reports through a Reporter and never touches the screen itself.
"""
from __future__ import annotations

import datetime as _dt
import errno
import json
import logging
import os
import sys
from pathlib import Path

from gpu_bootstrap.pipeline.context import LogReporter
from gpu_bootstrap.core.errors import UsageError
from gpu_bootstrap.core.paths import state_dir

STATUS_STYLE = {"applied": "green", "unchanged": "dim", "probed": "green", "skipped": "dim", "planned": "cyan",
                "incomplete": "yellow", "unknown": "yellow", "failed": "bold red", "interrupted": "yellow",
                "undone": "green", "pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
STATUS_ICON = {"applied": "✔", "unchanged": "·", "probed": "✔", "skipped": "-", "planned": "→", "incomplete": "!",
               "unknown": "?", "failed": "✘", "interrupted": "!", "undone": "✔", "pass": "✔", "warn": "!", "fail": "✘", "skip": "-"}
WIDTH_WHEN_NOT_A_TERMINAL = 200  # logs and pipes: never fold a table at 80 columns
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
    try:
        fd = os.open(log_file, LOG_FLAGS, 0o600)
    except OSError as error:
        from gpu_bootstrap.core.errors import UsageError
        if error.errno == errno.ELOOP:  # O_NOFOLLOW: the last part of the path is a symbolic link
            raise UsageError(f"--log-file {log_file}: is a symbolic link; gpu-bootstrap does not write its log "
                             f"through one (it could point anywhere)", "name the file itself") from None
        raise UsageError(f"--log-file {log_file}: cannot open it: {error.strerror}",
                         "use a file you can write, or leave --log-file out") from None
    try:  # the mode above applies only to a new file: an existing one is made private too
        import stat
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode) and stat.S_IMODE(mode) != 0o600:  # never /dev/null or a pipe
            os.fchmod(fd, 0o600)
    except PermissionError as error:
        from gpu_bootstrap.core.errors import UsageError
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
    file_handler = PrivateFileHandler(log_file)
    file_handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(file_handler)
    if verbose:
        stream = logging.StreamHandler(sys.stderr)
        stream.setLevel(logging.DEBUG if verbose > 1 else logging.INFO)
        stream.setFormatter(RedactingFormatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(stream)
    root.propagate = False
    return log_file


# Opening the log: never through a symbolic link (O_NOFOLLOW), created 0600
LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


class PrivateFileHandler(logging.FileHandler):
    """A FileHandler that opens its file with LOG_FLAGS: a link put in the file's place after the check in
    setup_logging is refused (ELOOP) instead of followed."""

    def _open(self):
        return open(os.open(self.baseFilename, LOG_FLAGS, 0o600), "a", encoding=self.encoding or "utf-8",
                    errors=self.errors)


class RedactingFormatter(logging.Formatter):
    """A log line with secret-looking text redacted (gpu_bootstrap.security.redact): a helm error or an API answer that
    quotes a value must not carry it into the log file."""

    def format(self, record: logging.LogRecord) -> str:
        from gpu_bootstrap.security import redact
        return redact.text(super().format(record))


def _prune(folder: Path) -> None:
    logs = sorted(folder.glob("*.log"), key=lambda p: p.stat().st_mtime)
    for old in logs[:-KEEP_LOGS]:
        try:
            old.unlink()
        except OSError:
            pass


def escape(text: str) -> str:
    """Text for the screen: rich markup escaped, and secret-looking parts redacted (security/redact.py), since a
    message may quote what an API server or helm said about a value."""
    from rich.markup import escape as rich_escape

    from gpu_bootstrap.security.redact import text as redacted
    return rich_escape(redacted(text))


def wrapped(text: str, width: int, indent: str, hanging: str) -> list[str]:
    """A long plan line folded at the screen's width, at spaces and after the commas and colons of compact JSON (a
    derived value such as dcgmExporter.serviceMonitor={...}), never inside a word."""
    import re
    import textwrap
    spaced = re.sub(r'":(?=["{\[\dtfn])', '": ', re.sub(r",(?=[\"{\[])", ", ", text))
    return textwrap.wrap(spaced, max(width, 40), initial_indent=indent, subsequent_indent=hanging,
                         break_long_words=False, break_on_hyphens=False) or [indent]


def console(stderr: bool = False):
    from rich.console import Console
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else WIDTH_WHEN_NOT_A_TERMINAL
    # soft_wrap: never split a path or message in logs
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


# --- reporters ------------------------------------------------------------------------------------------------------------
Reporter = LogReporter  # silent: logs what happens


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
            first, *rest = wrapped(f"{step.id} {step.title} …", self.out.width, "", "    ")
            self.out.print(f"[bold]{escape(step.id)}[/]{escape(first[len(step.id):])}")
            for part in rest:
                self.out.print(escape(part))

    def _stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def step_finished(self, result) -> None:
        super().step_finished(result)
        self._stop()
        style = STATUS_STYLE.get(result.status, "")
        count = f" ({result.changes} change{'s' if result.changes != 1 else ''})" if result.changes else ""
        head = f"{STATUS_ICON.get(result.status, ' ')} {result.id}: {result.status}{count}"
        first, *rest = wrapped(f"{head} — {result.message}" if result.message else head, self.out.width, "", "    ")
        self.out.print(f"[{style}]{escape(head)}[/][dim]{escape(first[len(head):])}[/]")
        for part in rest:
            self.out.print(f"[dim]{escape(part)}[/]")

    def change(self, step_id: str, change, applied: bool) -> None:
        super().change(step_id, change, applied)
        verb = "[green]changed[/]" if applied else "[cyan]would change[/]"
        reason = f"  ← {change.reason}" if change.reason else ""
        first, *rest = wrapped(f"{change.target}: {change.summary}{reason}", self.out.width - 17, "", "")
        self.out.print(f"    {verb} {escape(first)}")
        for part in rest:
            self.out.print(f"            [dim]{escape(part)}[/]")
        for line in change.details:  # the paths of the user's values, never the values; escape() redacts the rest
            for part in wrapped(line, self.out.width, "        ", "            "):
                self.out.print(f"[dim]{escape(part)}[/]")

    def warn(self, message: str) -> None:
        super().warn(message)
        console(stderr=True).print(f"[yellow]warning:[/] {escape(message)}")

    def kubernetes(self, version: str, source: str) -> None:
        super().kubernetes(version, source)
        self.out.print(f"[bold]Kubernetes {escape(version)}[/] [dim]({escape(source)})[/]")

    def note(self, message: str) -> None:
        super().note(message)
        for part in wrapped(message, self.out.width, "", "    "):
            self.out.print(f"[dim]{escape(part)}[/]")

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


def results_document(results, ok: bool, error: str | None = None, exit_code: int | None = None) -> dict:
    """The -o json contract of up and teardown: every step's outcome, ok, and the error when there was one."""
    from gpu_bootstrap.security.redact import text as redacted
    steps = []
    for result in results:
        step = {**result.to_json(), "message": redacted(result.message)}
        if "planned" in step:
            step["planned"] = [{key: redacted(value) for key, value in change.items()} for change in step["planned"]]
        steps.append(step)
    document = {"steps": steps, "ok": ok}
    if error is not None:
        document.update(error=redacted(error), exit_code=exit_code)
    return document


def plan_verdict(results) -> str:
    """One line for a dry run: how many objects and releases it would create, change and remove, in which steps,
    and the steps it could not judge."""
    from gpu_bootstrap.core.refs import Verb
    planned = [r for r in results if r.status in ("planned", "incomplete")]
    unknown = [r.id for r in results if r.status == "unknown"]
    unchanged = [r.id for r in results if r.status == "unchanged"]
    counts = {"create": 0, "change": 0, "remove": 0}
    for result in planned:
        for change in result.planned:
            verb = Verb(change.verb)
            if verb in (Verb.DELETE, Verb.HELM_UNINSTALL):
                counts["remove"] += 1
            elif verb == Verb.CREATE or change.summary.startswith(("create", "install")):
                counts["create"] += 1
            else:
                counts["change"] += 1
    if planned:
        total = sum(r.changes for r in planned)
        text = (f"{counts['create']} to create, {counts['change']} to change, {counts['remove']} to remove "
                f"({total} change(s) planned in {', '.join(r.id for r in planned)})")
    else:
        text = "no changes"
    if unchanged:
        text += f"; {len(unchanged)} step(s) unchanged"
    if unknown:
        text += (f"; unknown: {', '.join(unknown)} (their state is in Secrets this identity may not read, so "
                 f"neither changes nor their absence can be said)")
    return text


def incomplete_steps(results) -> list[str]:
    """'step: what is missing' of every step whose plan is incomplete (a chart not rendered, values decided without
    the facts they depend on)."""
    return [f"{r.id}: {r.message.removeprefix('planned, but ')}" for r in results if r.status == "incomplete"]


def show_results(results, reporter, as_json: bool, title: str, note: str | None = None, plan: bool = False,
                 allow_incomplete: bool = False) -> bool:
    """The summary of up or teardown (a table, or the JSON document); a failed step is also named on stderr.
    `plan`: a dry run, summed up in one line (plan_verdict; "plan" in the JSON); an incomplete plan fails unless
    `allow_incomplete`, and either way names what is missing. Returns whether it succeeded."""
    failed = next((f"[{r.id}] {r.message}" for r in results if r.status in ("failed", "interrupted")), None)
    missing = incomplete_steps(results) if plan else []
    if missing and not failed and not allow_incomplete:
        failed = (f"the plan is incomplete: {'; '.join(missing)} — pass --allow-incomplete to accept a partial "
                  f"plan")
    if as_json:
        document = results_document(results, not failed, failed, 1 if failed else None)
        if planned_for := getattr(reporter, "planned_for", None):
            document["kubernetes"] = {"version": planned_for[0], "source": planned_for[1]}
        if plan:
            document["plan"] = plan_verdict(results)
            document["incomplete"] = missing
        print_json(document)
    else:
        reporter.summary(results, title)
        if plan:
            reporter.note(f"plan: {plan_verdict(results)}")
        if missing and allow_incomplete:
            reporter.note(f"incomplete, accepted (--allow-incomplete): {'; '.join(missing)}")
        if note:
            reporter.note(note)
    if failed:
        print_error(failed, None)
    return not failed


def doctor_document(report) -> dict:
    from gpu_bootstrap.security.redact import text as redacted
    return {"checks": [{"id": name, "status": c.status, "message": redacted(c.message)} for name, c in report.rows],
            "nodes": [r.to_json() for r in report.nodes], "ok": report.ok}


def confirm_teardown(plans, left_waiting: dict | None = None) -> bool:
    """Show what teardown will change, and what it leaves waiting, and ask; only ever called with a terminal on
    stdin."""
    from rich.prompt import Confirm
    out = console()
    total = sum(len(changes) for _step, changes in plans)
    out.print(f"teardown will make {total} change(s):")
    for step, changes in plans:
        for change in changes:
            out.print(f"  {step.id}: {change.describe()}", markup=False)
    for step_id, lines in (left_waiting or {}).items():
        for line in lines:
            out.print(f"[{STATUS_STYLE['warn']}]{STATUS_ICON['warn']} {escape(step_id)}: {escape(line)}[/]")
    return Confirm.ask("Proceed, leaving them waiting?" if left_waiting else "Proceed?", default=False, console=out)


def left_waiting(results) -> list[str]:
    """Every 'step: what it leaves waiting' line of a teardown's results."""
    return [f"{r.id}: {line}" for r in results for line in getattr(r, "left_waiting", [])]


def print_json(document: dict) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def print_error(message: str, log_file: Path | None) -> None:
    err = console(stderr=True)
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)  # escape() redacts: it may quote a value
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
    import time
    from gpu_bootstrap.probes.recorded import describe_source
    now = time.time()
    table = Table(title="GPU nodes", title_justify="left")
    table.add_column("node")
    table.add_column("facts from", overflow="fold")  # ssh, cluster, report, recorded (age), pool
    for check in reports[0].checks:
        table.add_column("os" if check.id == "ssh" else check.id, overflow="fold")  # the check reads the OS
    for report in reports:
        table.add_row(escape(report.name), escape(describe_source(report, now)), *[_cell(c) for c in report.checks])
    out.print(table)
    for report in reports:
        for check in report.checks:
            if check.status in ("warn", "fail"):
                style = STATUS_STYLE[check.status]
                out.print(f"[{style}]{STATUS_ICON[check.status]} {escape(report.name)} {check.id}:[/] "
                          f"{escape(check.message)}")


# --- simulate -------------------------------------------------------------------------------------------------------
