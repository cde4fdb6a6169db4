"""What every gpu-bootstrap command shares: the options declared once (SHARED) and added to each command by
@command, their translation into app/commands.py's Options, and the one place typed errors become a message and an
exit code."""
import functools
import inspect
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer import core as _typer_core

from gpu_bootstrap.core.errors import EXIT_FAILED, GpuBootstrapError


def _flags_without_placeholder():
    """Typer shows '<bool>' after every flag (--help included) and '<int>' after counts; a flag takes no value."""
    shown = _typer_core.TyperOption.display_type_rich
    _typer_core.TyperOption.display_type_rich = lambda self, ctx: (
        self.metavar if self.is_flag or self.count else shown(self, ctx))


_flags_without_placeholder()


def _fold_long_words():
    """An option's help at 80 columns: a word longer than its column (GPU_BOOTSTRAP_KUBECONFIG, a path, an option's
    long name) is folded onto the next line instead of cut off with an ellipsis."""
    from typer import rich_utils

    class FoldingTable(rich_utils.Table):
        def add_row(self, *renderables, **kwargs):
            for item in renderables:
                if hasattr(item, "overflow"):
                    item.overflow = "fold"
            return super().add_row(*renderables, **kwargs)
    rich_utils.Table = FoldingTable
    original = rich_utils._get_parameter_help

    def folded(**kwargs):
        found = original(**kwargs)
        for item in getattr(found, "renderables", []):
            if hasattr(item, "overflow"):
                item.overflow = "fold"
        return found
    rich_utils._get_parameter_help = folded


def unwrapped(doc: str | None) -> str | None:
    """A command's docstring with its paragraphs' hard line breaks joined, so that the help wraps at the terminal's
    width instead of breaking mid-sentence; indented lines (examples) and blank lines stay as they are."""
    if not doc:
        return doc
    import inspect
    out, paragraph = [], []
    for line in inspect.cleandoc(doc).splitlines():
        if line.strip() and not line.startswith(" "):
            paragraph.append(line.strip())
            continue
        if paragraph:
            out.append(" ".join(paragraph))
            paragraph = []
        out.append(line)
    if paragraph:
        out.append(" ".join(paragraph))
    return "\n".join(out)


_fold_long_words()


def _errors_as_one_line():
    """Bad usage (an unknown option, a missing value, a value not among the choices) in the same style as every
    other error: `error: ... — try: gpu-bootstrap CMD --help`, one line on stderr, exit 2; not a rich box."""
    from typer import rich_utils

    def one_line(error) -> None:
        if error.__class__.__name__ == "NoArgsIsHelpError":
            return
        from gpu_bootstrap.cli.ui import print_error
        ctx = getattr(error, "ctx", None)
        hint = f" — try: {ctx.command_path} --help" if ctx is not None else ""
        print_error(" ".join(error.format_message().split()) + hint, None)
    rich_utils.rich_format_error = one_line


_errors_as_one_line()


class Output(str, Enum):
    text = "text"
    json = "json"


SHARED = {  # name -> (annotation, default): declared once, added to the commands that name them
    "config": (Annotated[Path, typer.Option("-c", "--config", metavar="FILE", help="Config file.")],
               Path("gpu-bootstrap.yaml")),
    "playbook": (Annotated[str, typer.Option("--playbook", metavar="NAME|PATH", help=(
        "Which ordered step list to run (playbooks/NAME.yaml or a path)."))], "default"),
    "only": (Annotated[Optional[list[str]], typer.Option("--only", metavar="STEP[,STEP]", help=(
        "Run only these steps (repeatable)."))], None),
    "skip": (Annotated[Optional[list[str]], typer.Option("--skip", metavar="STEP[,STEP]", help=(
        "Leave out these steps (repeatable)."))], None),
    "force_unlock": (Annotated[bool, typer.Option("--force-unlock", help=(
        "Take the run lock even if another run seems to hold it. Only when you know that run is gone."))], False),
    "output": (Annotated[Output, typer.Option("-o", "--output", help="text for people, json for machines.")], Output.text),
    "kubeconfig": (Annotated[Optional[Path], typer.Option("--kubeconfig", metavar="FILE", help=(
        "Kubeconfig to use (overrides the config file and GPU_BOOTSTRAP_KUBECONFIG; default $KUBECONFIG, "
        "then ~/.kube/config)."))], None),
    "context": (Annotated[Optional[str], typer.Option("--context", metavar="NAME", help="Kubeconfig context to use.")],
                None),
    "verbose": (Annotated[int, typer.Option("-v", "--verbose", count=True, show_default=False, help=(
        "More detail on stderr (-vv: debug)."))], 0),
    "log_file": (Annotated[Optional[Path], typer.Option("--log-file", metavar="FILE", help=(
        "Write the full log here, mode 0600 (default: a new file under ~/.local/state/gpu-bootstrap/logs)."))],
                 None),
}
CLUSTER = ("config", "kubeconfig", "context", "output", "verbose", "log_file")
PIPELINE = ("playbook", "only", "skip", "force_unlock") + CLUSTER


def command(app: typer.Typer, *shared: str):
    """Register fn(common: dict, **own options) as a command taking its own options plus the shared ones named."""
    def decorate(fn):
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name != "common"]
        extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=SHARED[name][0],
                                   default=SHARED[name][1]) for name in shared]

        @functools.wraps(fn)
        def wrapper(**kwargs):
            common = {name: kwargs.pop(name) for name in shared}
            return fn(common, **kwargs)

        wrapper.__doc__ = unwrapped(fn.__doc__)
        wrapper.__signature__ = inspect.Signature(own + extra)
        wrapper.__annotations__ = {p.name: p.annotation for p in own + extra}
        return app.command()(wrapper)
    return decorate


def options_from(common: dict, **more):
    """Shared flags (and a command's own) -> app/commands.py's Options."""
    from gpu_bootstrap.app.commands import Options
    from gpu_bootstrap.app.playbook import split_ids
    return Options(config=common.get("config"), kubeconfig=common.get("kubeconfig"), context=common.get("context"),
                   playbook=common.get("playbook", "default"), only=split_ids(common.get("only")),
                   skip=split_ids(common.get("skip")), force_unlock=common.get("force_unlock", False),
                   json=common.get("output") == Output.json, **more)


def run(name: str, common: dict, body) -> None:
    """Run a command body with logging, signals and typed-error handling in one place."""
    from gpu_bootstrap.cli.ui import print_error, print_json, results_document, setup_logging
    try:
        log_path = setup_logging(name, common.get("log_file"), common.get("verbose", 0))
    except GpuBootstrapError as error:  # --log-file unusable: said before anything runs, with no log to point at
        print_error(error.one_line(), None)
        raise typer.Exit(error.exit_code) from None
    from gpu_bootstrap.core import interrupts
    from gpu_bootstrap.security import tempfiles
    interrupts.install()  # SIGINT/SIGTERM: stop helm, record `interrupted`, release the lock, exit within 5 s
    tempfiles.sweep()  # the temp folders (client keys, relay tokens) of runs that were killed
    try:
        body()
    except typer.Exit:
        raise
    except BrokenPipeError:
        # the reader went away (`gpu-bootstrap images | head -1`): stop quietly, as a command SIGPIPE ends does
        import os
        import signal
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not fail again
        except (OSError, ValueError):  # a stdout without a file descriptor (a test runner's buffer)
            pass
        raise typer.Exit(128 + signal.SIGPIPE) from None  # 141, what a shell reports for such a command
    except (GpuBootstrapError, KeyboardInterrupt) as error:
        if isinstance(error, KeyboardInterrupt):
            from gpu_bootstrap.core.errors import Interrupted
            error = Interrupted()
        import logging
        logging.getLogger("gpu_bootstrap").error("%s", error.one_line(), exc_info=True)
        if common.get("output") == Output.json:
            print_json(results_document(getattr(error, "results", []), False, error.one_line(), error.exit_code))
        print_error(error.one_line(), log_path)
        raise typer.Exit(error.exit_code)
    except Exception as error:  # noqa: BLE001 - the one place a bug becomes a message instead of a traceback
        import logging
        logging.getLogger("gpu_bootstrap").exception("internal error")
        print_error(f"internal error: {error!r} — this is a bug in gpu-bootstrap; please report it with the log "
                    f"file", log_path)
        raise typer.Exit(EXIT_FAILED)


def relative_path(path: Path) -> str:
    """A path as it goes into a Git repository: as given when relative, its last part when absolute."""
    return path.as_posix() if not path.is_absolute() else path.name
