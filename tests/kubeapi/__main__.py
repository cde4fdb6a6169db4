"""python -m tests.kubeapi serve --kubeconfig PATH [--port 0] [--kube-version 1.31.0] [--gpu-nodes n1,n2]
[--gpus-per-node 8] [--cpu-nodes m1]

Prints exactly one line, `ready <server-url>`, once it accepts requests, then serves until SIGTERM or Ctrl-C."""
from __future__ import annotations

import argparse
import signal
import sys
import threading


def _names(text: str) -> list[str]:
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.kubeapi", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the emulator until SIGTERM")
    serve.add_argument("--kubeconfig", required=True, help="where to write a kubeconfig for real clients")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve.add_argument("--kube-version", default="1.31.0", help="the version /version reports (default 1.31.0)")
    serve.add_argument("--gpu-nodes", default="", help="comma-separated GPU node names")
    serve.add_argument("--gpus-per-node", type=int, default=8)
    serve.add_argument("--cpu-nodes", default="", help="comma-separated CPU-only node names")
    serve.add_argument("--auth", choices=("cert", "token"), default="cert",
                       help="credential the kubeconfig carries (default: client certificate)")
    serve.add_argument("--scheduler", action="append", default=[],
                       help="register an extra scheduler name whose pods get bound (repeatable)")
    serve.add_argument("--no-controllers", action="store_true", help="switch off every simulated controller")
    args = parser.parse_args(argv)

    from .emulator import Emulator

    emulator = Emulator(args.kube_version, _names(args.gpu_nodes), args.gpus_per_node, _names(args.cpu_nodes),
                        controllers=not args.no_controllers)
    for name in args.scheduler:
        emulator.register_scheduler(name)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    emulator.start(args.host, args.port)
    emulator.write_kubeconfig(args.kubeconfig, auth=args.auth)
    print(f"ready {emulator.url}", flush=True)
    stop.wait()
    emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
