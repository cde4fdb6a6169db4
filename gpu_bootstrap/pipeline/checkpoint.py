"""The cluster-side record of what ran with which inputs: one ConfigMap, one key per step.

The cluster is the truth; this record only says which inputs a step last ran with, so an unchanged config skips
the step (when its check still passes) and a changed one re-runs exactly the affected steps. It lives in the
cluster so that a run from another machine, or a CI runner, resumes too.
"""
from __future__ import annotations

import datetime as _dt
import json
from dataclasses import asdict, dataclass

from gpu_bootstrap import __version__
from gpu_bootstrap.core.errors import Conflict
from gpu_bootstrap.core.objects import STATE_KEY_SECRET, STATE_NAMESPACE
from gpu_bootstrap.core.refs import Ref

NAMESPACE = STATE_NAMESPACE
NAME = "gpu-bootstrap-state"
KEY_SECRET = STATE_KEY_SECRET  # the fingerprints' HMAC key (step.Step.fingerprint), made by the first run
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-bootstrap"}


@dataclass
class Record:
    status: str  # applied | unchanged | failed | interrupted
    fingerprint: str
    time: str
    version: str
    changes: int = 0
    message: str = ""
    public: str = ""  # step.Step.public_fingerprint: comparable by a role that may not read the key


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def namespace_manifest() -> dict:
    """Ours, labelled for the restricted Pod Security profile (the validation pods that may run there pass it)."""
    from gpu_bootstrap.security import pod_security
    return pod_security.namespace(NAMESPACE, pod_security.RESTRICTED)


class Checkpoint:
    def __init__(self, kube):
        self.kube = kube
        self._exists: bool | None = None

    def load(self) -> dict[str, Record]:
        if self.kube is None:
            return {}
        config_map = self.kube.get("v1", "ConfigMap", NAME, NAMESPACE)
        self._exists = config_map is not None
        records = {}
        for step_id, text in ((config_map or {}).get("data") or {}).items():
            try:
                records[step_id] = Record(**json.loads(text))
            except (ValueError, TypeError):
                continue  # a record this version cannot read only means the step re-runs
        return records

    def key(self, create: bool) -> bytes | None:
        """The cluster's fingerprint key, from its Secret; made (32 random bytes) when absent and `create`. None
        when absent, or when this identity may not read it (a plan role): fingerprints then match nothing."""
        import base64
        import secrets
        from gpu_bootstrap.core.errors import ClusterError
        if self.kube is None:
            return None
        try:
            found = self.kube.get("v1", "Secret", KEY_SECRET, NAMESPACE)
        except ClusterError as error:
            if not create and error.status == 403:
                return None  # a role without Secrets (the plan role): the run compares live state only
            raise
        if found is None and create:
            value = secrets.token_bytes(32)
            try:
                self.kube.create({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                                  "metadata": {"name": KEY_SECRET, "namespace": NAMESPACE, "labels": dict(MANAGED_BY)},
                                  "data": {"key": base64.b64encode(value).decode()}})
                return value
            except Conflict:  # made by a run beside us a moment ago
                found = self.kube.get("v1", "Secret", KEY_SECRET, NAMESPACE)
        data = ((found or {}).get("data") or {}).get("key")
        return base64.b64decode(data) if data else None

    def save(self, step_id: str, status: str, fingerprint: str, changes: int = 0, message: str = "",
             public: str = "") -> Record:
        record = Record(status, fingerprint, now(), __version__, changes, message[:500], public)
        data = {step_id: json.dumps(asdict(record), sort_keys=True)}
        self._write(data)
        return record

    def keep(self, manifest: dict) -> None:
        """Write an object a step asked to keep beside the checkpoint (server-side apply, ours)."""
        self.kube.apply(manifest)

    def forget(self, step_id: str) -> None:
        if self._exists is not False:
            self._write({step_id: None})

    def _write(self, data: dict) -> None:
        ref = Ref("v1", "ConfigMap", NAME, NAMESPACE)
        if self._exists is not True:
            try:
                self.kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": dict(MANAGED_BY)},
                                  "data": {k: v for k, v in data.items() if v is not None}})
                self._exists = True
                return
            except Conflict:
                self._exists = True
        self.kube.patch(ref, {"data": data})
