"""Fake GPU capacity on chosen nodes, as kind users do: the node's status advertises `nvidia.com/gpu: 8` (a PATCH of
the status subresource, which no kubelet without a device plugin ever changes), so the scheduler and `status` see
GPUs that no hardware backs. Only nodes carrying LABEL are touched, and `remove` takes exactly that resource away.

Used by scripts/test-live (before and after the live suite) and by tests/live's emulator run, through the real
kubectl, so the path a real cluster takes is the one CI exercises here.

    python3 -m tests.live.fake_gpus add|remove|list --kubeconfig PATH [--count 8] [--selector LABEL=VALUE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

LABEL = "gpu-bootstrap.io/fake-gpus"  # `kubectl label node NAME gpu-bootstrap.io/fake-gpus=true` (or kind's config)
SELECTOR = f"{LABEL}=true"
RESOURCE = "nvidia.com/gpu"
COUNT = 8


def kubectl(kubeconfig: str, *args: str, kubectl_path: str | None = None, env: dict | None = None) -> str:
    binary = kubectl_path or os.environ.get("KUBECTL", "kubectl")
    result = subprocess.run([binary, "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=60,
                            env=env)  # tool_env: the caller's; a script scripts/test-live runs on a user's cluster
    if result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def labelled(kubeconfig: str, selector: str = SELECTOR, **kw) -> list[str]:
    nodes = json.loads(kubectl(kubeconfig, "get", "nodes", "-l", selector, "-o", "json", **kw))["items"]
    return sorted(n["metadata"]["name"] for n in nodes)


def _patch(kubeconfig: str, node: str, value, **kw) -> None:
    body = {"status": {"capacity": {RESOURCE: value}, "allocatable": {RESOURCE: value}}}
    kubectl(kubeconfig, "patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(body), **kw)


def add(kubeconfig: str, count: int = COUNT, selector: str = SELECTOR, **kw) -> list[str]:
    """Advertise `count` fake GPUs on every labelled node; returns their names (an error when there is none)."""
    nodes = labelled(kubeconfig, selector, **kw)
    if not nodes:
        raise RuntimeError(f"no node is labelled {selector}: label the workers that should get fake GPUs, e.g. "
                           f"kubectl label node NAME {selector}")
    for node in nodes:
        _patch(kubeconfig, node, str(count), **kw)
    return nodes


def remove(kubeconfig: str, selector: str = SELECTOR, **kw) -> list[str]:
    """Take the fake GPUs away again (a JSON merge patch with null deletes the key)."""
    nodes = labelled(kubeconfig, selector, **kw)
    for node in nodes:
        _patch(kubeconfig, node, None, **kw)
    return nodes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["add", "remove", "list"])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--count", type=int, default=COUNT)
    parser.add_argument("--selector", default=SELECTOR)
    args = parser.parse_args(argv)
    try:
        if args.action == "add":
            nodes = add(args.kubeconfig, args.count, args.selector)
        elif args.action == "remove":
            nodes = remove(args.kubeconfig, args.selector)
        else:
            nodes = labelled(args.kubeconfig, args.selector)
    except RuntimeError as error:
        print(f"fake-gpus: {error}", file=sys.stderr)
        return 1
    print(f"fake-gpus: {args.action}: {', '.join(nodes) or 'no node'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
