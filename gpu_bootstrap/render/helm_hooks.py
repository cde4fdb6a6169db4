"""Which ServiceAccounts a release's delete hooks run as (pure: reads `helm get hooks` output, touches nothing).

`helm uninstall` first runs the chart's pre-delete hooks and waits for them. A hook Job's pods run as a ServiceAccount
the chart made with the release; when the release's install stopped before making it (an API outage, a kill), the
ServiceAccount admission plugin refuses every pod of the hook, the Job never completes, and the uninstall waits its
whole --timeout and fails (a CI run of tests/test_faults_real.py: gpu-operator's `gpu-operator-cleanup-gpucluster`).
Such a hook cannot do anything, and what it would clean up (the gpu-operator's own custom resources) was made by
workloads that could not run either: they need the same ServiceAccount. The Helm adapter then uninstalls without
the hooks, and says so.
"""
from __future__ import annotations

import yaml

DELETE_HOOKS = {"pre-delete", "post-delete"}
POD_TEMPLATES = {"Job": ("spec", "template", "spec"), "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
                 "Pod": ("spec",)}


def delete_hook_accounts(hooks_text: str, namespace: str) -> set[tuple[str, str]]:
    """(namespace, name) of the ServiceAccounts the release's delete hooks run pods as, except those a delete hook
    makes itself (a chart may ship its hook's ServiceAccount as a hook of lower weight)."""
    documents = [d for d in yaml.safe_load_all(hooks_text or "") if isinstance(d, dict)]
    hooks = [d for d in documents if _events(d) & DELETE_HOOKS]
    made = {(_namespace(d, namespace), d["metadata"]["name"]) for d in hooks if d.get("kind") == "ServiceAccount"}
    used = set()
    for hook in hooks:
        spec = _pod_spec(hook)
        if spec is not None:
            account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
            used.add((_namespace(hook, namespace), account))
    return used - made


def _events(document: dict) -> set[str]:
    annotations = (document.get("metadata") or {}).get("annotations") or {}
    return {part.strip() for part in str(annotations.get("helm.sh/hook", "")).split(",") if part.strip()}


def _namespace(document: dict, default: str) -> str:
    return (document.get("metadata") or {}).get("namespace") or default


def _pod_spec(document: dict) -> dict | None:
    path = POD_TEMPLATES.get(document.get("kind", ""))
    current = document if path else None
    for key in path or ():
        current = (current or {}).get(key)
    return current if isinstance(current, dict) else None
