"""What a user auditing the cluster would list: every API resource that can be listed, every object in it.

`audit` returns {(group/kind, namespace, name): metadata}; before/after comparisons name what appeared. Events are
left out (they record what happened and expire on their own).
"""
from __future__ import annotations

import json

OURS_LABEL = ("app.kubernetes.io/managed-by", "gpu-bootstrap")
OUR_PREFIX = "gpu-bootstrap.io/"
SKIP_KINDS = {"Event"}


def resources(target) -> list[str]:
    out = target.kubectl("api-resources", "--verbs=list", "-o", "name").stdout.split()
    return sorted(set(out))


def audit(target) -> dict:
    found = {}
    for resource in resources(target):
        result = target.kubectl("get", resource, "-A", "-o", "json", "--ignore-not-found", check=False)
        if result.returncode != 0 and "the server doesn't have a resource type" in result.stderr:
            continue  # a CRD deleted between the listing of resources and this (teardown --purge-crds)
        if result.returncode != 0:
            raise AssertionError(f"kubectl get {resource} -A failed: {result.stderr}")
        if not result.stdout.strip():
            continue
        for item in json.loads(result.stdout)["items"]:
            kind = item.get("kind") or resource
            if kind in SKIP_KINDS:
                continue
            group = item.get("apiVersion", "v1").rpartition("/")[0]
            meta = item["metadata"]
            found[(f"{group}/{kind}", meta.get("namespace", ""), meta["name"])] = meta
    return found


def ours(meta: dict) -> bool:
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    return labels.get(OURS_LABEL[0]) == OURS_LABEL[1] or any(k.startswith(OUR_PREFIX) for k in [*labels, *annotations]
                                                             if k != "gpu-bootstrap.io/fake-gpus")


def leftovers(before: dict, after: dict) -> list[str]:
    """Objects that were not there before, and objects carrying our marks."""
    new = [key for key in after if key not in before]
    marked = [key for key, meta in after.items() if ours(meta) and key not in new]
    return [f"{kind} {namespace + '/' if namespace else ''}{name}" for kind, namespace, name in sorted(new + marked)]


def node_view(target, name: str) -> dict:
    node = target.json("get", "node", name)
    labels = {k: v for k, v in (node["metadata"].get("labels") or {}).items()}
    annotations = {k: v for k, v in (node["metadata"].get("annotations") or {}).items()
                   if k.startswith(OUR_PREFIX) or k.startswith("nvidia.com/")}
    return {"labels": labels, "annotations": annotations, "taints": node["spec"].get("taints") or []}


# --- the local cluster's audit log (tests/localcluster: --audit-log-path, one JSON event per line) ------------------
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
OUR_AGENTS = ("gpu-bootstrap", "Helm/")  # the CLI's own client, and helm (directly or through the CLI's relay)


def audit_mark(cluster) -> int:
    """Where the audit log ends now: audit_writes(since=mark) reads only what comes after."""
    return cluster.audit_log.stat().st_size if cluster.audit_log.exists() else 0


def dry_run(event: dict) -> bool:
    """Whether the server treated a write as a dry run: a DELETE with a body by its DeleteOptions alone (the server
    then ignores the query), any other write by its query."""
    options = event.get("requestObject")
    if event.get("verb") in ("delete", "deletecollection") and isinstance(options, dict):
        return options.get("dryRun") == ["All"]
    return "dryRun=All" in event.get("requestURI", "")


def audit_writes(cluster, since: int = 0) -> list[str]:
    """Writes the API server recorded from gpu-bootstrap or helm (server-side dry runs left out), as
    'verb URI (user agent)'."""
    found = []
    with cluster.audit_log.open("rb") as log:
        log.seek(since)
        for line in log:
            event = json.loads(line)
            agent = event.get("userAgent") or ""
            if event.get("stage") != "ResponseComplete" or event.get("verb") not in WRITE_VERBS:
                continue
            if not agent.startswith(OUR_AGENTS) or dry_run(event):
                continue
            found.append(f"{event['verb']} {event['requestURI']} ({agent})")
    return found
