"""The `gpu-bootstrap status` command's flags (kept out of commands.py, which stays thin): read-only, shared options
through common.py's @command, the work in app/status.py and the screen in status_view.py."""
from enum import Enum
from typing import Annotated, Optional

import typer
from typer import Option

from gpu_bootstrap.cli.common import Output, options_from, run
from gpu_bootstrap.cli.common import command as _command


class View(str, Enum):
    text = "text"
    wide = "wide"
    json = "json"


class By(str, Enum):
    node = "node"
    namespace = "namespace"
    pod = "pod"


def register(app: typer.Typer) -> None:
    @_command(app, "config", "kubeconfig", "context", "verbose", "log_file")
    def status(common, output: Annotated[View, Option("-o", "--output", help=(
            "text for people, wide for more columns, json for machines (a documented contract)."))] = View.text,
               by: Annotated[By, Option("--by", help="One row per node, namespace or pod.")] = By.node,
               namespace: Annotated[Optional[str], Option("-n", "--namespace", metavar="NAME", help=(
                   "Pods, namespaces and pending pods of this namespace only (node figures stay whole)."))] = None,
               defrag: Annotated[bool, Option("--defrag", help=(
                   "Also plan which pods to re-create so that whole nodes free up for the pending (or largest) "
                   "GPU requests. A plan only: nothing is evicted."))] = False,
               watch: Annotated[bool, Option("-w", "--watch", help="Redraw in place until Ctrl-C.")] = False,
               interval: Annotated[float, Option("--interval", metavar="SECONDS", min=1.0, help=(
                   "With --watch: seconds between reads."))] = 5.0,
               prometheus: Annotated[Optional[str], Option("--prometheus", metavar="NS/SERVICE[:PORT]", help=(
                   "The Prometheus to ask for GPU utilisation (default: the Prometheus Operator's Service)."))] = None,
               window: Annotated[str, Option("--window", metavar="DURATION", help=(
                   "Utilisation window (a Prometheus duration)."))] = "1h",
               idle_below: Annotated[float, Option("--idle-below", metavar="PCT", help=(
                   "A GPU whose mean utilisation over the window is below this is idle."))] = 5.0) -> None:
        """GPU allocation at a glance: per node, namespace or pod, why GPU pods wait, how fragmented the free GPUs
        are (the figures `simulate` reports, by the same code) and which allocated GPUs sit idle. Read-only.

        [bold]Examples[/]

          gpu-bootstrap status
          gpu-bootstrap status --by pod -n ml -o wide
          gpu-bootstrap status --defrag
          gpu-bootstrap status -o json | jq .fragmentation
        """
        from gpu_bootstrap.app.status import StatusOptions
        common["output"] = Output.json if output == View.json else Output.text
        choice = StatusOptions(by.value, namespace, defrag, prometheus, True, window, idle_below)

        def body():
            from gpu_bootstrap.app import commands as application
            from gpu_bootstrap.cli import status_view
            from gpu_bootstrap.cli.ui import print_json
            produce = application.status(options_from(common), choice)
            if output == View.json:
                print_json(produce())
            elif watch:
                status_view.watch(produce, by.value, output == View.wide, interval)
            else:
                status_view.show(produce(), by.value, output == View.wide)

        run("status", common, body)
