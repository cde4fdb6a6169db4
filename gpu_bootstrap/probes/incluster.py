"""The node probe run through the cluster instead of SSH: the same probe script (probes/script.py), run by one
pod bound to each selected GPU node, its output read back from the containers' termination messages. Pure: the
manifests, the shell the containers run, and the decoding of what a pod reports; the API calls live in
adapters/cluster_probe.py.

The pod: hostPath `/` mounted read-only at /host; init container `probe` pipes the script (a ConfigMap) into the
host's own shell (`chroot /host /bin/sh -s`, as NVIDIA's validator runs `chroot /host nvidia-smi`), compresses the output
(gzip + base64) into a shared emptyDir, and every init container writes one slice of it, with a header, to its
termination message; the main container only sleeps (a failed slice container is restarted, its last end kept).
The kubelet keeps at most 4,096 bytes per container and 12 KiB per pod split over its containers, keeping the first
bytes, so each slice fits a third of that budget. A result that does not fit is reported as too large, never cut: the reader checks the
slice count, the length and a checksum before it decodes anything.
"""
from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import re
from dataclasses import dataclass

from gpu_bootstrap.core.objects import PROBE_COMPONENT, PROBE_NAMESPACE_PREFIX

MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-bootstrap"}
COMPONENT = PROBE_COMPONENT
RUN_LABEL = "gpu-bootstrap.io/probe-run"
OWNER_ANNOTATION = "gpu-bootstrap.io/probe-owner"  # host:pid of the run that created it
EXPIRES_ANNOTATION = "gpu-bootstrap.io/probe-expires"  # after this (epoch seconds) anyone may remove it
NAMESPACE_PREFIX = PROBE_NAMESPACE_PREFIX
NAME = "gpu-bootstrap-node-probe"
SELECTOR = "app.kubernetes.io/managed-by=gpu-bootstrap,gpu-bootstrap.io/component=node-probe"  # ours, any run
PRIVILEGED = {f"pod-security.kubernetes.io/{mode}": "privileged" for mode in ("enforce", "audit", "warn")}

SLICES = 3  # init containers carrying the result; with the sleeping main container, 4 containers per pod
POD_MESSAGE_BUDGET = 12 * 1024  # kubelet: MaxPodTerminationMessageLogLength, split evenly over all containers
CONTAINER_MESSAGE_LIMIT = 4096  # kubelet: MaxContainerTerminationMessageLength
HEADER_ROOM = 96  # "gb1 <index> <count> <length> <sha256/16>\n" with room to spare
SLICE_BYTES = min(CONTAINER_MESSAGE_LIMIT, POD_MESSAGE_BUDGET // (SLICES + 1)) - HEADER_ROOM
CAPACITY = SLICE_BYTES * SLICES  # base64 characters a result may have
HEADER = re.compile(r"gb1 (\d+) (\d+) (\d+) ([0-9a-f]{16})\n")

# Runs in the probe image (busybox): the script goes to the host's shell; the result is "<rc>\n<stderr>\n<stdout>",
# compressed. A host without /bin/sh (e.g. Bottlerocket) gives rc 127 and chroot's error, which the reader reports.
PROBE_SHELL = (
    'chroot /host /bin/sh -s </gb-script/probe.sh >/gb/out 2>/gb/err; rc=$?; '
    '{ echo "$rc"; head -c 300 /gb/err | tr "\\n" " "; echo; cat /gb/out; } | gzip -c | base64 | tr -d "\\n" '
    '>/gb/b64; ')
# Runs in every init container: write slice $GB_SLICE of /gb/b64, with its header, as the termination message.
SLICE_SHELL = (
    'len=$(wc -c </gb/b64); len=$((len+0)); count=$(( (len + {size} - 1) / {size} )); '
    'sum=$(sha256sum </gb/b64 | cut -c1-16); '
    'printf "gb1 %s %s %s %s\\n" "$GB_SLICE" "$count" "$len" "$sum" >/dev/termination-log; '
    'tail -c +$((GB_SLICE * {size} + 1)) /gb/b64 | head -c {size} >>/dev/termination-log').format(size=SLICE_BYTES)


def namespace_name(run_id: str) -> str:
    return NAMESPACE_PREFIX + run_id


def namespace_manifest(run_id: str, owner: str, expires: int) -> dict:
    """Our own namespace for one probe run: privileged (Pod Security `baseline` forbids every hostPath), ours, and
    saying who created it and until when, so a later run removes it only when that run is gone."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace_name(run_id),
                         "labels": {**MANAGED_BY, **COMPONENT, RUN_LABEL: run_id, **PRIVILEGED},
                         "annotations": {OWNER_ANNOTATION: owner, EXPIRES_ANNOTATION: str(expires)}}}


def script_manifest(run_id: str, script: str) -> dict:
    """The probe script, mounted into the probe container (kept out of the pod spec: every LIST of the pods would
    carry it once per node)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": NAME, "namespace": namespace_name(run_id),
                         "labels": {**MANAGED_BY, **COMPONENT, RUN_LABEL: run_id}},
            "data": {"probe.sh": script}}


def pod_name(index: int) -> str:
    return f"{NAME}-{index}"


def pod_manifest(run_id: str, node: str, index: int, image: str) -> dict:
    """The probe pod for one node, bound to it by name (spec.nodeName, as the DaemonSet controller binds its pods):
    every pod, and every request, has the same size whatever the fleet's. A DaemonSet would need one nodeSelectorTerm
    per selected node (a node field selector takes one value), copied into each of its pods: a LIST of them grows with
    the square of the node count. Tolerates every taint (GPU nodes are tainted, maybe NotReady) and reads the host
    through a read-only hostPath; only the probe container is privileged (nvidia-smi opens the GPU devices), the others
    only copy a slice of its result. The main container sleeps, so a failed probe container is restarted and its
    last termination kept, as under a DaemonSet; the pods go with the run's namespace."""
    labels = {**MANAGED_BY, **COMPONENT, RUN_LABEL: run_id}
    probe_mounts = [{"name": "host", "mountPath": "/host", "readOnly": True},
                    {"name": "script", "mountPath": "/gb-script", "readOnly": True}]
    result = [{"name": "result", "mountPath": "/gb"}]

    def slice_container(slice_index: int) -> dict:
        container = {"name": "probe" if slice_index == 0 else f"result-{slice_index}", "image": image,
                     "command": ["sh", "-c", (PROBE_SHELL if slice_index == 0 else "") + SLICE_SHELL],
                     "env": [{"name": "GB_SLICE", "value": str(slice_index)}],
                     "volumeMounts": (probe_mounts if slice_index == 0 else []) + result,
                     "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent",
                     "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}}
        if slice_index == 0:
            container["securityContext"] = {"privileged": True, "runAsUser": 0}
        return container

    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name(index), "namespace": namespace_name(run_id), "labels": labels},
            "spec": {"nodeName": node,
                     "tolerations": [{"operator": "Exists"}],
                     "automountServiceAccountToken": False,
                     "enableServiceLinks": False,
                     "terminationGracePeriodSeconds": 0,
                     "initContainers": [slice_container(i) for i in range(SLICES)],
                     "containers": [{
                         "name": "sleep", "image": image, "command": ["sleep", "2147483647"],
                         "imagePullPolicy": "IfNotPresent",
                         "resources": {"requests": {"cpu": "1m", "memory": "4Mi"}, "limits": {"memory": "16Mi"}}}],
                     "volumes": [{"name": "host", "hostPath": {"path": "/", "type": "Directory"}},
                                 {"name": "script", "configMap": {"name": NAME}},
                                 {"name": "result", "emptyDir": {"sizeLimit": "4Mi"}}]}}


# --- reading a pod back ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """What one node's probe pod says: `output` (the script's stdout) when it finished, else `reason` (unknown)."""
    output: str | None = None
    reason: str = ""
    rc: int = 0
    error: str = ""  # the host shell's stderr (first bytes)

    @property
    def finished(self) -> bool:
        return self.output is not None


def pod_node(pod: dict) -> str:
    """The node a probe pod is for (it is bound to it from its creation)."""
    return (pod.get("spec") or {}).get("nodeName") or ""


def _terminated(status: dict) -> dict | None:
    state = status.get("state") or {}
    return state.get("terminated") or (status.get("lastState") or {}).get("terminated")


def finished(pod: dict) -> bool:
    """Every slice container has run to the end (or failed for good: it is restarting)."""
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    return len(statuses) >= SLICES and all(_terminated(s) for s in statuses[:SLICES])


def settled(pod: dict) -> bool:
    """Nothing more will come from this pod: it finished, or its kubelet refused it (phase Failed)."""
    return finished(pod) or (pod.get("status") or {}).get("phase") == "Failed"


def decode(pod: dict) -> Outcome:
    """The result a finished pod carries, checked: every slice present, length and checksum right."""
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("initContainerStatuses") or []}
    names = ["probe"] + [f"result-{i}" for i in range(1, SLICES)]
    slices: dict[int, str] = {}
    expected = None
    for name in names:
        terminated = _terminated(statuses.get(name) or {}) or {}
        if terminated.get("exitCode", 0) != 0:
            message = (terminated.get("message") or "").strip()[:200]
            return Outcome(reason=f"the probe container {name} exited with {terminated.get('exitCode')} "
                                  f"({terminated.get('reason', 'Error')}{': ' + message if message else ''})")
        message = terminated.get("message") or ""
        header = HEADER.match(message)
        if header is None:
            return Outcome(reason=f"the probe pod's termination message from {name} is not a probe result (was the "
                                  f"image's shell replaced, or terminationMessagePath ignored?)")
        index, count, length, digest = int(header[1]), int(header[2]), int(header[3]), header[4]
        if expected is None:
            expected = (count, length, digest)
        elif expected != (count, length, digest):
            return Outcome(reason="the probe's result slices disagree (different runs?); rerun")
        slices[index] = message[header.end():]
    count, length, digest = expected
    if count > SLICES:
        return Outcome(reason=f"the probe's result is too large for the termination messages ({length} bytes "
                              f"compressed, at most {CAPACITY}): use SSH for this node (preflight.via: ssh) or "
                              f"--preflight-report")
    text = "".join(slices.get(i, "") for i in range(count))
    if len(text) != length or hashlib.sha256(text.encode()).hexdigest()[:16] != digest:
        return Outcome(reason=f"the probe's result arrived incomplete ({len(text)} of {length} bytes): the kubelet "
                              f"cut a termination message; rerun, or use SSH for this node")
    try:
        raw = gzip.decompress(base64.b64decode(text, validate=True)).decode("utf-8", errors="replace")
    except (binascii.Error, OSError, EOFError, ValueError) as error:
        return Outcome(reason=f"the probe's result cannot be decoded: {error}")
    rc_line, _, rest = raw.partition("\n")
    error, _, output = rest.partition("\n")
    rc = int(rc_line) if rc_line.strip().isdigit() else -1
    if rc == 127 and not output.strip():
        return Outcome(reason=f"the node has no /bin/sh the probe can run ({error.strip()[:160] or 'exit 127'}): "
                              f"use SSH or --preflight-report for it", rc=rc, error=error)
    return Outcome(output=output, rc=rc, error=error)


def encode(output: str, rc: int = 0, error: str = "") -> list[str]:
    """What the probe's shell writes to the slice containers' termination messages for this output (the inverse of
    decode; for tests and canned results)."""
    payload = f"{rc}\n{error}\n{output}".encode()
    text = base64.b64encode(gzip.compress(payload)).decode()
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    count = -(-len(text) // SLICE_BYTES)
    return [f"gb1 {i} {count} {len(text)} {digest}\n{text[i * SLICE_BYTES:(i + 1) * SLICE_BYTES]}"
            for i in range(SLICES)]


def why_unfinished(pod: dict | None, node: dict | None, image: str, timeout: int) -> str:
    """Why a node's probe did not finish within the timeout, from its pod and its Node: never 'no driver'."""
    if node is None:
        return "the node is not in the cluster (kubectl get nodes): check its name in `nodes`"
    ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    not_ready = ready is not None and ready.get("status") != "True"
    if pod is None:
        extra = " (the node is NotReady)" if not_ready else ""
        return (f"the node's probe pod is gone{extra}: something deleted it (the pod garbage collector removes "
                f"the pods of a node that left the cluster)")
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":  # the kubelet refused it (OutOfcpu, OutOfpods, a NodeAffinity rule ...)
        return (f"the node's kubelet refused the probe pod ({status.get('reason') or 'Failed'}: "
                f"{(status.get('message') or '').strip()[:160]})")
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"):
            return (f"the probe image {image} cannot be pulled on this node ({waiting['reason']}: "
                    f"{(waiting.get('message') or '').strip()[:160]}): mirror it and set preflight.image")
        if waiting.get("reason") in ("CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError",
                                     "RunContainerError"):
            return (f"the probe container {container.get('name')} cannot run ({waiting['reason']}: "
                    f"{(waiting.get('message') or '').strip()[:160]})")
    if not_ready:
        return (f"the node is NotReady ({ready.get('reason') or 'no kubelet heartbeat'}): its kubelet did not start "
                f"the probe within {timeout}s")
    phase = status.get("phase") or "Pending"
    return f"the probe did not finish within preflight.timeout ({timeout}s); its pod is {phase}"
