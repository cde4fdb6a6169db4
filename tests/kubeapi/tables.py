"""meta.k8s.io/v1 Table responses, with the columns the real apiserver's printers use for the kinds we serve."""
from __future__ import annotations

import json
import re

from .util import age

NAME = {"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.",
        "priority": 0}


def _col(name: str, kind: str = "string", priority: int = 0, description: str = "") -> dict:
    return {"name": name, "type": kind, "format": "", "description": description or name, "priority": priority}


AGE = _col("Age", description="CreationTimestamp is a timestamp representing the server time when this object was "
                              "created.")


def _images(obj: dict) -> tuple[str, str]:
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    containers = spec.get("containers") or []
    return ",".join(c.get("name", "") for c in containers), ",".join(c.get("image", "") for c in containers)


def _selector(obj: dict) -> str:
    selector = obj.get("spec", {}).get("selector") or {}
    labels = selector.get("matchLabels", selector if obj.get("kind") == "Service" else {}) or {}
    parts = [f"{k}={v}" for k, v in sorted(labels.items())]
    for expr in selector.get("matchExpressions") or []:
        parts.append(f"{expr.get('key')} {expr.get('operator', '').lower()} ({','.join(expr.get('values') or [])})")
    return ",".join(parts) or "<none>"


def _node_row(node: dict) -> list:
    conditions = {c.get("type"): c.get("status") for c in node.get("status", {}).get("conditions") or []}
    status = "Ready" if conditions.get("Ready") == "True" else "NotReady"
    if node.get("spec", {}).get("unschedulable"):
        status += ",SchedulingDisabled"
    labels = node["metadata"].get("labels") or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/")) or ["<none>"]
    info = node.get("status", {}).get("nodeInfo") or {}
    addresses = {a.get("type"): a.get("address") for a in node.get("status", {}).get("addresses") or []}
    return [node["metadata"]["name"], status, ",".join(roles), age(node["metadata"].get("creationTimestamp")),
            info.get("kubeletVersion", ""), addresses.get("InternalIP", "<none>"),
            addresses.get("ExternalIP", "<none>"), info.get("osImage", ""), info.get("kernelVersion", ""),
            info.get("containerRuntimeVersion", "")]


def _pod_row(pod: dict) -> list:
    status = pod.get("status", {})
    containers = status.get("containerStatuses") or []
    ready = sum(1 for c in containers if c.get("ready"))
    total = len(pod.get("spec", {}).get("containers") or [])
    reason = status.get("phase", "Pending")
    if reason == "Succeeded":
        reason = "Completed"
    for container in containers:
        waiting = container.get("state", {}).get("waiting")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    restarts = sum(c.get("restartCount", 0) for c in containers)
    return [pod["metadata"]["name"], f"{ready}/{total}", reason, restarts,
            age(pod["metadata"].get("creationTimestamp")), status.get("podIP", "<none>"),
            pod.get("spec", {}).get("nodeName", "<none>"), status.get("nominatedNodeName", "<none>"), "<none>"]


def _deployment_row(obj: dict) -> list:
    status = obj.get("status", {})
    names, images = _images(obj)
    return [obj["metadata"]["name"], f"{status.get('readyReplicas', 0)}/{obj['spec'].get('replicas', 1)}",
            status.get("updatedReplicas", 0), status.get("availableReplicas", 0),
            age(obj["metadata"].get("creationTimestamp")), names, images, _selector(obj)]


def _replicaset_row(obj: dict) -> list:
    status = obj.get("status", {})
    names, images = _images(obj)
    return [obj["metadata"]["name"], obj["spec"].get("replicas", 1), status.get("replicas", 0),
            status.get("readyReplicas", 0), age(obj["metadata"].get("creationTimestamp")), names, images,
            _selector(obj)]


def _daemonset_row(obj: dict) -> list:
    status = obj.get("status", {})
    names, images = _images(obj)
    node_selector = obj["spec"].get("template", {}).get("spec", {}).get("nodeSelector") or {}
    return [obj["metadata"]["name"], status.get("desiredNumberScheduled", 0), status.get("currentNumberScheduled", 0),
            status.get("numberReady", 0), status.get("updatedNumberScheduled", 0), status.get("numberAvailable", 0),
            ",".join(f"{k}={v}" for k, v in sorted(node_selector.items())) or "<none>",
            age(obj["metadata"].get("creationTimestamp")), names, images, _selector(obj)]


def _statefulset_row(obj: dict) -> list:
    names, images = _images(obj)
    return [obj["metadata"]["name"], f"{obj.get('status', {}).get('readyReplicas', 0)}/{obj['spec'].get('replicas', 1)}",
            age(obj["metadata"].get("creationTimestamp")), names, images]


def _job_row(obj: dict) -> list:
    status = obj.get("status", {})
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    state = "Complete" if conditions.get("Complete") == "True" else (
        "Failed" if conditions.get("Failed") == "True" else "Running")
    names, images = _images(obj)
    return [obj["metadata"]["name"], state, f"{status.get('succeeded', 0)}/{obj['spec'].get('completions', 1)}",
            "0s" if status.get("completionTime") else age(status.get("startTime")),
            age(obj["metadata"].get("creationTimestamp")), names, images, _selector(obj)]


def _service_row(obj: dict) -> list:
    spec = obj.get("spec", {})
    ports = ",".join(f"{p.get('port')}{'/' + p['nodePort'] if p.get('nodePort') else ''}/{p.get('protocol', 'TCP')}"
                     for p in spec.get("ports") or []) or "<none>"
    return [obj["metadata"]["name"], spec.get("type", "ClusterIP"), spec.get("clusterIP", "<none>"),
            ",".join(spec.get("externalIPs") or []) or "<none>", ports,
            age(obj["metadata"].get("creationTimestamp")), _selector(obj)]


def _event_row(obj: dict) -> list:
    involved = obj.get("involvedObject") or {}
    return [age(obj.get("lastTimestamp") or obj.get("eventTime") or obj["metadata"].get("creationTimestamp")),
            obj.get("type", ""), obj.get("reason", ""), f"{involved.get('kind', '').lower()}/{involved.get('name', '')}",
            obj.get("message", "")]


PRINTERS = {
    "Node": ([NAME, _col("Status"), _col("Roles"), AGE, _col("Version"), _col("Internal-IP", priority=1),
              _col("External-IP", priority=1), _col("OS-Image", priority=1), _col("Kernel-Version", priority=1),
              _col("Container-Runtime", priority=1)], _node_row),
    "Pod": ([NAME, _col("Ready"), _col("Status"), _col("Restarts", "string"), AGE, _col("IP", priority=1),
             _col("Node", priority=1), _col("Nominated Node", priority=1), _col("Readiness Gates", priority=1)],
            _pod_row),
    "Deployment": ([NAME, _col("Ready"), _col("Up-to-date", "integer"), _col("Available", "integer"), AGE,
                    _col("Containers", priority=1), _col("Images", priority=1), _col("Selector", priority=1)],
                   _deployment_row),
    "ReplicaSet": ([NAME, _col("Desired", "integer"), _col("Current", "integer"), _col("Ready", "integer"), AGE,
                    _col("Containers", priority=1), _col("Images", priority=1), _col("Selector", priority=1)],
                   _replicaset_row),
    "DaemonSet": ([NAME, _col("Desired", "integer"), _col("Current", "integer"), _col("Ready", "integer"),
                   _col("Up-to-date", "integer"), _col("Available", "integer"), _col("Node Selector"), AGE,
                   _col("Containers", priority=1), _col("Images", priority=1), _col("Selector", priority=1)],
                  _daemonset_row),
    "StatefulSet": ([NAME, _col("Ready"), AGE, _col("Containers", priority=1), _col("Images", priority=1)],
                    _statefulset_row),
    "Job": ([NAME, _col("Status"), _col("Completions"), _col("Duration"), AGE, _col("Containers", priority=1),
             _col("Images", priority=1), _col("Selector", priority=1)], _job_row),
    "Service": ([NAME, _col("Type"), _col("Cluster-IP"), _col("External-IP"), _col("Port(s)"), AGE,
                 _col("Selector", priority=1)], _service_row),
    "Namespace": ([NAME, _col("Status"), AGE],
                  lambda o: [o["metadata"]["name"], o.get("status", {}).get("phase", ""),
                             age(o["metadata"].get("creationTimestamp"))]),
    "ConfigMap": ([NAME, _col("Data", "integer"), AGE],
                  lambda o: [o["metadata"]["name"], len(o.get("data") or {}) + len(o.get("binaryData") or {}),
                             age(o["metadata"].get("creationTimestamp"))]),
    "Secret": ([NAME, _col("Type"), _col("Data", "integer"), AGE],
               lambda o: [o["metadata"]["name"], o.get("type", "Opaque"), len(o.get("data") or {}),
                          age(o["metadata"].get("creationTimestamp"))]),
    "ServiceAccount": ([NAME, _col("Secrets", "integer"), AGE],
                       lambda o: [o["metadata"]["name"], len(o.get("secrets") or []),
                                  age(o["metadata"].get("creationTimestamp"))]),
    "Lease": ([NAME, _col("Holder"), AGE],
              lambda o: [o["metadata"]["name"], o.get("spec", {}).get("holderIdentity", ""),
                         age(o["metadata"].get("creationTimestamp"))]),
    "Event": ([_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Message")], _event_row),
}
GENERIC = ([NAME, _col("Created At", "date")],
           lambda o: [o["metadata"]["name"], o["metadata"].get("creationTimestamp", "")])


def columns_and_row(rt, obj: dict) -> tuple[list[dict], list]:
    if rt.custom:
        return _custom(rt, obj)
    columns, row = PRINTERS.get(rt.kind, GENERIC)
    return columns, row(obj)


def _custom(rt, obj: dict) -> tuple[list[dict], list]:
    declared = [json.loads(c) for c in rt.printer_columns]
    if not declared:
        return [NAME, AGE], [obj["metadata"]["name"], age(obj["metadata"].get("creationTimestamp"))]
    columns, cells = [NAME], [obj["metadata"]["name"]]
    for column in declared:
        columns.append({"name": column.get("name", ""), "type": column.get("type", "string"),
                        "format": column.get("format", ""), "description": column.get("description", ""),
                        "priority": column.get("priority", 0)})
        value = json_path(obj, column.get("jsonPath", ""))
        cells.append(age(value) if column.get("type") == "date" and value else value)
    return columns, cells


def json_path(obj, path: str):
    """The subset of JSONPath CRDs use: .a.b, .a[0], .a[?(@.k=="v")].b."""
    current = obj
    for token in re.findall(r"\.([^.\[]+)|\[(\d+)\]|\[\?\(@\.(\w+)\s*==\s*[\"']([^\"']*)[\"']\)\]", path):
        field, index, key, value = token
        if current is None:
            return None
        if field:
            current = current.get(field) if isinstance(current, dict) else None
        elif index:
            current = current[int(index)] if isinstance(current, list) and int(index) < len(current) else None
        else:
            current = next((i for i in current if isinstance(i, dict) and str(i.get(key)) == value), None) \
                if isinstance(current, list) else None
    return current


def table(rt, objects: list[dict], include: str, resource_version: str, continue_token: str = "",
          remaining: int = -1) -> dict:
    columns = None
    rows = []
    for obj in objects:
        cols, cells = columns_and_row(rt, obj)
        columns = columns or cols
        row = {"cells": cells}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj["metadata"]}
        rows.append(row)
    if columns is None:
        columns = PRINTERS.get(rt.kind, GENERIC)[0] if not rt.custom else [NAME, AGE]
    metadata = {"resourceVersion": resource_version}
    if continue_token:
        metadata["continue"] = continue_token
    if remaining >= 0:
        metadata["remainingItemCount"] = remaining
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "columnDefinitions": columns,
            "rows": rows}
