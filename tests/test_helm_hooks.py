"""render/helm_hooks.py: the ServiceAccounts a release's delete hooks run as, read from `helm get hooks` output."""
from __future__ import annotations

import pytest

from gpu_bootstrap.render.helm_hooks import delete_hook_accounts

pytestmark = pytest.mark.unit


def hook(kind: str, name: str, events: str, account: str | None = None, namespace: str | None = None,
         **extra) -> str:
    meta = f"  name: {name}\n" + (f"  namespace: {namespace}\n" if namespace else "")
    meta += f"  annotations:\n    helm.sh/hook: {events}\n"
    pod = f"serviceAccountName: {account}\n" if account else "containers: []\n"
    if kind == "Job":
        body = f"spec:\n  template:\n    spec:\n      {pod}"
    elif kind == "CronJob":
        body = f"spec:\n  jobTemplate:\n    spec:\n      template:\n        spec:\n          {pod}"
    elif kind == "Pod":
        body = f"spec:\n  {pod}"
    else:
        body = ""
    return f"---\n# Source: chart/templates/{name}.yaml\napiVersion: v1\nkind: {kind}\nmetadata:\n{meta}{body}"


CASES = [
    ("gpu-operator's cleanup Job", hook("Job", "cleanup", "pre-delete", "gpu-operator"),
     {("ns", "gpu-operator")}),
    ("a post-delete Pod", hook("Pod", "bye", "post-delete", "eraser"), {("ns", "eraser")}),
    ("no account named: the namespace's default", hook("Job", "cleanup", "pre-delete"), {("ns", "default")}),
    ("an install hook is not a delete hook", hook("Job", "certgen", "pre-install,pre-upgrade", "certgen"), set()),
    ("one of several events", hook("Job", "both", "post-install, pre-delete", "both"), {("ns", "both")}),
    ("the hook's own namespace", hook("Job", "x", "pre-delete", "a", namespace="other"), {("other", "a")}),
    ("a CronJob's template", hook("CronJob", "cron", "pre-delete", "c"), {("ns", "c")}),
    ("an account the delete hooks make themselves",
     hook("ServiceAccount", "hooker", "pre-delete") + "\n" + hook("Job", "cleanup", "pre-delete", "hooker"), set()),
    ("an account made by an install hook is not there at delete time",
     hook("ServiceAccount", "hooker", "pre-install") + "\n" + hook("Job", "cleanup", "pre-delete", "hooker"),
     {("ns", "hooker")}),
    ("no hooks", "", set()),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_delete_hook_accounts(text, expected):
    assert delete_hook_accounts(text, "ns") == expected
