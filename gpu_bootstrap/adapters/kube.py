"""The Kubernetes adapter: plain dicts over the REST API, using the `kubernetes` package only for what it does
well (kubeconfig loading and every auth method it supports). Transient failures are retried; every answer that is
not a success becomes a typed error."""
from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from urllib.parse import quote, urlencode

from ..errors import ClusterError, Conflict, NotFound, Unreachable
from ..refs import Ref

log = logging.getLogger("gpu_bootstrap.kube")
FIELD_MANAGER = "gpu-bootstrap"
RETRYABLE = {429, 500, 502, 503, 504}
# kind -> (plural, namespaced) for what the tool touches; anything else is found through discovery.
KNOWN = {
    ("v1", "Node"): ("nodes", False), ("v1", "Namespace"): ("namespaces", False),
    ("v1", "ConfigMap"): ("configmaps", True), ("v1", "Secret"): ("secrets", True),
    ("v1", "ServiceAccount"): ("serviceaccounts", True), ("v1", "Service"): ("services", True),
    ("v1", "Pod"): ("pods", True), ("v1", "Event"): ("events", True),
    ("apps/v1", "Deployment"): ("deployments", True), ("apps/v1", "DaemonSet"): ("daemonsets", True),
    ("batch/v1", "Job"): ("jobs", True), ("coordination.k8s.io/v1", "Lease"): ("leases", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): ("clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ("clusterrolebindings", False),
    ("rbac.authorization.k8s.io/v1", "Role"): ("roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rolebindings", True),
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"): ("validatingwebhookconfigurations", False),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"): ("mutatingwebhookconfigurations", False),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): ("customresourcedefinitions", False),
    ("scheduling.k8s.io/v1", "PriorityClass"): ("priorityclasses", False),
    ("policy/v1", "PodDisruptionBudget"): ("poddisruptionbudgets", True),
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): ("selfsubjectaccessreviews", False),
}


def TRANSPORT_ERRORS() -> tuple:  # noqa: N802 - a lazily built constant
    """The exceptions that mean "no answer from the server" (imported late: urllib3 comes with kubernetes)."""
    import ssl

    import urllib3
    from kubernetes.client.exceptions import ApiException
    return (urllib3.exceptions.HTTPError, OSError, ssl.SSLError, ApiException)


class Kube:
    """Talks to one cluster. Construct cheaply; the client is built on first use."""

    def __init__(self, kubeconfig: Path | None = None, context: str | None = None, field_manager: str = FIELD_MANAGER,
                 timeout: float = 30.0, attempts: int = 4):
        self.kubeconfig = kubeconfig
        self.context = context
        self.field_manager = field_manager
        self.timeout = timeout
        self.attempts = attempts
        self._client = None
        self._host = ""
        self._discovered: dict[tuple[str, str], tuple[str, bool]] = {}
        self.requests = 0

    # --- connection -----------------------------------------------------------------------------------------------
    def _api(self):
        if self._client is None:
            from kubernetes import config as kube_config
            from kubernetes.config.config_exception import ConfigException
            try:
                self._client = kube_config.new_client_from_config(
                    config_file=str(self.kubeconfig) if self.kubeconfig else None, context=self.context,
                    persist_config=False)
            except ConfigException as error:
                raise ClusterError(f"cannot load kubeconfig {self.kubeconfig or '(default)'}: {error}",
                                   "check --kubeconfig / --context (or GPU_BOOTSTRAP_KUBECONFIG)") from None
            except FileNotFoundError as error:
                raise ClusterError(f"kubeconfig not found: {error.filename}",
                                   "pass --kubeconfig, set KUBECONFIG, or use --offline for a dry run") from None
            self._host = self._client.configuration.host
            self._client.user_agent = "gpu-bootstrap"
        return self._client

    @property
    def host(self) -> str:
        self._api()
        return self._host

    # --- raw requests -----------------------------------------------------------------------------------------------
    def request(self, method: str, path: str, query: dict | None = None, body=None,
                content_type: str = "application/json", idempotent: bool | None = None):
        api = self._api()
        query = {k: v for k, v in (query or {}).items() if v is not None}
        url = api.configuration.host + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": "application/json", "User-Agent": "gpu-bootstrap"}
        if body is not None:
            headers["Content-Type"] = content_type  # the REST client serializes JSON and structured YAML itself
        api.update_params_for_auth(headers, [], ["BearerToken"], path, method, None)  # token, exec plugins
        retry = method in ("GET",) if idempotent is None else idempotent
        for attempt in range(1, self.attempts + 1):
            started = time.monotonic()
            try:
                self.requests += 1
                response = api.rest_client.request(method, url, headers=headers, body=body,
                                                   _request_timeout=(5, self.timeout))
                data = response.read() if hasattr(response, "read") else response.data
                status = response.status
            except TRANSPORT_ERRORS() as error:
                log.debug("%s %s -> no answer (%s) after %.0f ms", method, path, error,
                          (time.monotonic() - started) * 1000)
                if retry and attempt < self.attempts:
                    self._backoff(attempt)
                    continue
                raise self._unreachable(error) from None
            log.debug("%s %s -> %s in %.0f ms", method, path, status, (time.monotonic() - started) * 1000)
            if status in RETRYABLE and retry and attempt < self.attempts:
                self._backoff(attempt)
                continue
            return self._decode(method, path, status, data)
        raise AssertionError("unreachable")

    @staticmethod
    def _backoff(attempt: int) -> None:
        time.sleep(min(0.2 * 2 ** (attempt - 1), 2.0) * (0.5 + random.random()))

    def _unreachable(self, error: Exception) -> Unreachable:
        reason = str(error)
        for marker in ("Connection refused", "Name or service not known", "certificate verify failed",
                       "timed out", "Connection reset"):
            if marker in reason:
                reason = marker
                break
        return Unreachable(f"cannot reach the Kubernetes API at {self._host}: {reason}",
                           "check --kubeconfig/--context and that the cluster is up; use --offline for a dry run")

    def _decode(self, method: str, path: str, status: int, data: bytes):
        try:
            body = json.loads(data) if data else {}
        except ValueError:
            body = {"message": data[:200].decode(errors="replace")}
        if 200 <= status < 300:
            return body
        message = body.get("message") or f"HTTP {status}"
        reason = body.get("reason", "")
        where = f"{method} {path}"
        if status == 404:
            raise NotFound(message, status=status, reason=reason)
        if status == 409:
            raise Conflict(message, status=status, reason=reason)
        hints = {401: "the credentials in the kubeconfig were refused; log in again",
                 403: "your account lacks the RBAC permission for this; run 'gpu-bootstrap doctor' to see which",
                 422: "the API server rejected the object as invalid"}
        raise ClusterError(f"{where} failed: {message}", hints.get(status, ""), status=status, reason=reason)

    # --- resource paths ------------------------------------------------------------------------------------------
    def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        known = KNOWN.get((api_version, kind)) or self._discovered.get((api_version, kind))
        if known:
            return known
        base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        try:
            listing = self.request("GET", base)
        except NotFound:
            raise ClusterError(f"the cluster does not serve {api_version}",
                               f"is the CRD for {kind} installed?") from None
        for entry in listing.get("resources", []):
            if "/" not in entry["name"]:
                self._discovered[(api_version, entry["kind"])] = (entry["name"], entry["namespaced"])
        if (api_version, kind) not in self._discovered:
            raise ClusterError(f"the cluster serves no {kind} in {api_version}")
        return self._discovered[(api_version, kind)]

    def path(self, api_version: str, kind: str, name: str = "", namespace: str | None = None) -> str:
        plural, namespaced = self.resource(api_version, kind)
        base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        if namespaced:
            base += f"/namespaces/{quote(namespace or 'default', safe='')}"
        base += f"/{plural}"
        return f"{base}/{quote(name, safe='')}" if name else base

    # --- verbs --------------------------------------------------------------------------------------------------------
    def version(self) -> dict:
        return self.request("GET", "/version")

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        try:
            return self.request("GET", self.path(api_version, kind, name, namespace))
        except NotFound:
            return None

    def list(self, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict]:
        path = self.path(api_version, kind, namespace=namespace) if namespace or not self.resource(
            api_version, kind)[1] else self.path(api_version, kind).replace("/namespaces/default", "")
        items, token = [], None
        while True:
            page = self.request("GET", path, {"labelSelector": label_selector, "fieldSelector": field_selector,
                                              "limit": 500, "continue": token})
            for item in page.get("items", []):
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                items.append(item)
            token = page.get("metadata", {}).get("continue")
            if not token:
                return items

    def logs(self, namespace: str, pod: str, container: str | None = None) -> str:
        """A pod's log as text ('' when there is none yet)."""
        api = self._api()
        url = api.configuration.host + self.path("v1", "Pod", pod, namespace) + "/log" + \
            (f"?container={quote(container, safe='')}" if container else "")
        headers = {"Accept": "*/*", "User-Agent": "gpu-bootstrap"}
        api.update_params_for_auth(headers, [], ["BearerToken"], url, "GET", None)
        try:
            response = api.rest_client.request("GET", url, headers=headers, _request_timeout=(5, self.timeout))
            data = response.read() if hasattr(response, "read") else response.data
        except TRANSPORT_ERRORS() as error:
            raise self._unreachable(error) from None
        return data.decode(errors="replace") if 200 <= response.status < 300 else ""

    def apply(self, obj: dict, dry_run: bool = False, force: bool = True, manager: str | None = None) -> dict:
        ref = Ref.of(obj)
        return self.request("PATCH", self.path(ref.api_version, ref.kind, ref.name, ref.namespace),
                            {"fieldManager": manager or self.field_manager, "force": "true" if force else None,
                             "fieldValidation": "Strict", "dryRun": "All" if dry_run else None},
                            obj, "application/apply-patch+yaml", idempotent=True)

    def patch(self, ref: Ref, patch, patch_type: str = "merge", dry_run: bool = False) -> dict:
        content = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
                   "strategic": "application/strategic-merge-patch+json"}[patch_type]
        return self.request("PATCH", self.path(ref.api_version, ref.kind, ref.name, ref.namespace),
                            {"fieldManager": self.field_manager, "dryRun": "All" if dry_run else None},
                            patch, content, idempotent=patch_type == "merge")

    def create(self, obj: dict, dry_run: bool = False) -> dict:
        ref = Ref.of(obj)
        return self.request("POST", self.path(ref.api_version, ref.kind, namespace=ref.namespace),
                            {"fieldManager": self.field_manager, "dryRun": "All" if dry_run else None}, obj)

    def update(self, obj: dict, dry_run: bool = False) -> dict:
        ref = Ref.of(obj)
        return self.request("PUT", self.path(ref.api_version, ref.kind, ref.name, ref.namespace),
                            {"fieldManager": self.field_manager, "dryRun": "All" if dry_run else None}, obj,
                            idempotent=True)

    def delete(self, ref: Ref, dry_run: bool = False, propagation: str = "Background") -> bool:
        """Returns False when the object was already gone."""
        try:
            self.request("DELETE", self.path(ref.api_version, ref.kind, ref.name, ref.namespace),
                         {"dryRun": "All" if dry_run else None}, {"propagationPolicy": propagation},
                         idempotent=True)
            return True
        except NotFound:
            return False
