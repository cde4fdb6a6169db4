"""The Kubernetes adapter: plain dicts over the REST API, using the `kubernetes` package only for what it does
well (kubeconfig loading and every auth method it supports). Transient failures are retried; every answer that is
not a success becomes a typed error."""
from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

from gpu_bootstrap.core import interrupts
from gpu_bootstrap.adapters import backoff
from gpu_bootstrap.core.errors import ClusterError, Conflict, NotFound, Unreachable
from gpu_bootstrap.core.refs import Ref

log = logging.getLogger("gpu_bootstrap.kube")
FIELD_MANAGER = "gpu-bootstrap"
RETRYABLE = {429, 500, 502, 503, 504}
REQUEST_TIMEOUT = 30.0  # seconds one attempt may wait for an answer
CONNECT_TIMEOUT = 10.0  # of which connecting (TCP and TLS handshake)
DEADLINE = 60.0  # seconds one request may take, all attempts and waits included ...
# ... except the waits a 429 asked for (Retry-After): the server is up and says when to come back. Under API Priority
# and Fairness a flow that keeps being rejected is asked for 1, 2, 4, ... 32 s (seen on a real 1.37 API server), so
# those waits have a budget of their own, as client-go's ten retries after the server's Retry-After do
OVERLOAD_DEADLINE = 300.0
MAX_ATTEMPTS = 20
MAX_TIMEOUTS = 2  # attempts that may time out waiting for an answer: a server that hung twice is not coming back in
# time. A connect that times out (TCP or TLS handshake) is not counted: a kube-apiserver that restarts binds its port
# long before it serves, so for its first seconds (tens on a busy control plane) a handshake waits unanswered; only
# the deadline bounds those (a CI run saw two in a row, 20 s, and gave up on a server back 10 s later)
BACKOFF_BASE = 0.25  # seconds before the 2nd attempt; doubles each time ...
BACKOFF_CAP = 4.0  # ... up to this; each wait is drawn from [half, all] of it (jitter)
REPEATABLE_PATCHES = ("application/apply-patch+yaml", "application/merge-patch+json",
                      "application/strategic-merge-patch+json")  # the same patch twice gives the same object
ORIGIN_FORM = re.compile(r"/(?!/)[!-~]*")  # a target another client may send: one leading slash, printable ASCII
ATTEMPTS_HEADER = "X-Gpu-Bootstrap-Attempts"  # _call notes its retries here, for the error message
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


@dataclass(frozen=True)
class NoAnswer:
    """Why an attempt got no HTTP answer, and whether it may be repeated."""

    cause: str  # for people: "connection refused", "timed out after 30 s waiting for an answer", ...
    transient: bool  # a later attempt may succeed
    unsent: bool  # the server certainly did not see the request (safe to repeat even a POST)


def classify(error: BaseException, timeout: float, connect_timeout: float | None = None) -> NoAnswer:
    """Name the real cause of a transport error (urllib3 wraps it once or twice)."""
    chain = _chain(error)
    names = {type(e).__name__ for e in chain}
    lowered = " ".join(str(e) for e in chain).lower()
    if "certificate verify failed" in lowered:
        return NoAnswer("TLS certificate verify failed", False, True)
    if "wrong version number" in lowered:
        return NoAnswer("TLS wrong version number (is it an HTTPS port?)", False, True)
    if "refused" in lowered:
        return NoAnswer("connection refused", True, True)
    if "temporary failure in name resolution" in lowered:
        return NoAnswer("temporary failure in name resolution (DNS)", True, True)
    if "name or service not known" in lowered or "nodename nor servname" in lowered:
        return NoAnswer("Name or service not known (DNS)", False, True)
    if "ConnectTimeoutError" in names or "handshake operation timed out" in lowered:
        return NoAnswer(f"timed out after {connect_timeout or timeout:.3g} s connecting (TCP/TLS handshake)", True, True)
    if "ReadTimeoutError" in names or "TimeoutError" in names or "timed out" in lowered:
        return NoAnswer(f"timed out after {timeout:.3g} s waiting for an answer", True, False)
    if "ConnectionResetError" in names or "reset by peer" in lowered:
        return NoAnswer("connection reset by peer", True, False)
    if names & {"RemoteDisconnected", "BrokenPipeError", "IncompleteRead", "ProtocolError", "SSLEOFError"} or \
            "eof" in lowered:
        return NoAnswer("the server closed the connection without answering", True, False)
    return NoAnswer(str(error).strip()[:300] or type(error).__name__, False, False)


def _chain(error: BaseException) -> list[BaseException]:
    """The error and what it wraps (urllib3's .reason, causes, exceptions among the args)."""
    found: list[BaseException] = []
    todo: list = [error]
    while todo and len(found) < 10:
        current = todo.pop(0)
        if not isinstance(current, BaseException) or any(current is f for f in found):
            continue
        found.append(current)
        todo += [getattr(current, "reason", None), current.__cause__, current.__context__, *current.args]
    return found


def retry_after(headers) -> float | None:
    """Seconds from a Retry-After header (delta-seconds; an HTTP date is ignored: API servers send seconds)."""
    value = (headers or {}).get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _message(data: bytes) -> str:
    """The message of a Status body, for the log."""
    try:
        return str(json.loads(data).get("message", ""))[:200]
    except (ValueError, AttributeError):
        return data[:200].decode(errors="replace")


def _named(body: bytes | None) -> str | None:
    """The name of the object a JSON create body carries (None for generateName, a review, or no JSON)."""
    try:
        meta = json.loads(body or b"").get("metadata") or {}
    except (ValueError, AttributeError):
        return None
    return meta.get("name") if isinstance(meta.get("name"), str) and meta.get("name") else None


def _carries(stored, sent) -> bool:
    """Does the stored object hold everything that was sent? (The server adds defaults and status; a list item
    sent must be found among the stored ones; scalars compare as text, so 1 and "1" are equal.)"""
    if isinstance(sent, dict):
        return isinstance(stored, dict) and all(
            key in ("apiVersion", "kind") or (value is None and stored.get(key) is None) or
            (key in stored and _carries(stored[key], value)) for key, value in sent.items())
    if isinstance(sent, list):
        return isinstance(stored, list) and all(any(_carries(item, wanted) for item in stored) for wanted in sent)
    return stored is not None and str(stored) == str(sent)


class Kube:
    """Talks to one cluster. Construct cheaply; the client is built on first use.

    Every attempt has a timeout (`request_timeout`, connect `connect_timeout`); a request that is safe to repeat
    (GET, server-side apply, merge patch, PUT with a resourceVersion, DELETE, any dry run, the create of a named
    object) is retried on 429 (after its Retry-After), 5xx, resets and timeouts with exponential backoff and jitter
    until `deadline` seconds have passed (sooner after two answers that never came: a hung server); any request is
    retried when the server certainly did not see it (429 or a 5xx with Retry-After, connection refused, connect
    timeout). Waits a 429 asked for do not count against `deadline`: they have OVERLOAD_DEADLINE of their own.
    After SIGINT/SIGTERM the deadline shrinks to what the shutdown leaves (gpu_bootstrap.core.interrupts)."""

    def __init__(self, kubeconfig: Path | None = None, context: str | None = None, field_manager: str = FIELD_MANAGER,
                 timeout: float | None = None, attempts: int = MAX_ATTEMPTS, *,
                 request_timeout: float = REQUEST_TIMEOUT, connect_timeout: float = CONNECT_TIMEOUT,
                 deadline: float = DEADLINE, overload_deadline: float = OVERLOAD_DEADLINE,
                 pool_size: int | None = None):
        self.kubeconfig = kubeconfig
        self.context = context
        self.field_manager = field_manager
        self.request_timeout = float(timeout if timeout is not None else request_timeout)  # `timeout`: old name
        self.connect_timeout = min(float(connect_timeout), self.request_timeout)
        self.deadline = float(deadline)
        self.overload_deadline = float(overload_deadline)
        self.attempts = attempts
        self.pool_size = pool_size  # connections kept open to the server (None: the kubernetes package's default)
        self._client = None
        self._host = ""
        self._discovered: dict[tuple[str, str], tuple[str, bool]] = {}
        self.requests = 0  # attempts sent
        self.retries = 0  # attempts that were repeats

    @property
    def timeout(self) -> float:  # the old name of request_timeout
        return self.request_timeout

    # --- connection -----------------------------------------------------------------------------------------------
    def _api(self):
        if self._client is None:
            from kubernetes import config as kube_config
            from kubernetes.client import ApiClient, Configuration
            from kubernetes.config.config_exception import ConfigException

            from gpu_bootstrap.security import tempfiles
            try:
                # the client copies client-key-data (and certificate data) into files: into the run's private
                # folder, which every way out of the process removes (gpu_bootstrap/security/tempfiles.py)
                configuration = type.__call__(Configuration)  # as new_client_from_config: not the global default
                kube_config.load_kube_config(config_file=str(self.kubeconfig) if self.kubeconfig else None,
                                             context=self.context, client_configuration=configuration,
                                             persist_config=False, temp_file_path=tempfiles.run_folder_or_none())
                self._client = ApiClient(configuration=configuration)
            except ConfigException as error:
                raise ClusterError(f"cannot load kubeconfig {self.kubeconfig or '(default)'}: {error}",
                                   "check --kubeconfig / --context (or GPU_BOOTSTRAP_KUBECONFIG)") from None
            except FileNotFoundError as error:
                raise ClusterError(f"kubeconfig not found: {error.filename}",
                                   "pass --kubeconfig, set KUBECONFIG, or use --offline for a dry run") from None
            if self.pool_size:
                from kubernetes.client.rest import RESTClientObject
                self._client.configuration.connection_pool_maxsize = self.pool_size
                self._client.rest_client = RESTClientObject(self._client.configuration)
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
        status, data, headers = self._call(method, path, query, body, content_type, idempotent)
        return self._decode(method, path, status, data, headers.get(ATTEMPTS_HEADER))

    def _call(self, method: str, path: str, query: dict | None = None, body=None,
              content_type: str = "application/json", idempotent: bool | None = None,
              accept: str = "application/json", agent: str | None = None,
              dry_run: bool = False) -> tuple[int, bytes, dict]:
        """One logical request: attempts with backoff until an answer that is final, the deadline, or the attempt
        limit. Returns (status, body, headers) of the last answer; raises Unreachable when there was none."""
        import urllib3

        api = self._api()
        query = {k: v for k, v in (query or {}).items() if v is not None}
        url = api.configuration.host + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": accept, "User-Agent": agent or "gpu-bootstrap"}
        payload = None
        if body is not None:
            headers["Content-Type"] = content_type  # JSON is YAML too: apply-patch+yaml bodies go as JSON
            payload = body if isinstance(body, bytes) else body.encode() if isinstance(body, str) else \
                json.dumps(body).encode()
        api.update_params_for_auth(headers, [], ["BearerToken"], path, method, None)  # token, exec plugins
        repeatable = method in ("GET", "HEAD") if idempotent is None else idempotent
        repeatable = repeatable or dry_run or query.get("dryRun") == "All"  # a dry run stores nothing: repeatable
        started = time.monotonic()
        attempt, timeouts, last = 0, 0, None
        excused = 0.0  # seconds waited as 429s asked: not part of the outage deadline
        while True:
            attempt += 1
            cutoff = started + self.deadline + excused
            shutdown = interrupts.cleanup_deadline()
            if shutdown is not None and shutdown < cutoff:
                cutoff = shutdown
                if cutoff - time.monotonic() < 0.05:
                    raise Unreachable(f"{method} {path} not sent: shutting down after {interrupts.signal_name()}",
                                      "rerun the same command to resume")
            remaining = max(cutoff - time.monotonic(), 0.05)
            read_timeout = round(min(self.request_timeout, remaining), 2)
            connect_timeout = round(min(self.connect_timeout, remaining), 2)
            timeout = urllib3.Timeout(connect=connect_timeout, read=read_timeout)
            sent_at = time.monotonic()
            self.requests += 1
            try:
                response = api.rest_client.pool_manager.request(method, url, body=payload, headers=headers,
                                                                timeout=timeout, retries=False, redirect=False,
                                                                preload_content=True)
            except TRANSPORT_ERRORS() as error:
                last = classify(error, read_timeout, connect_timeout)
                timeouts += last.cause.startswith("timed out") and not last.unsent
                log.debug("%s %s -> no answer (%r) after %.0f ms", method, path, error,
                          (time.monotonic() - sent_at) * 1000)
                if last.transient and (repeatable or last.unsent) and attempt < self.attempts and \
                        timeouts < MAX_TIMEOUTS and self._wait(attempt, None, cutoff, f"{method} {path}: {last.cause}"):
                    continue
                raise self._unreachable(last, method, path, attempt, started) from None
            status, data = response.status, response.data
            log.debug("%s %s -> %s in %.0f ms", method, path, status, (time.monotonic() - sent_at) * 1000)
            asked = retry_after(response.headers) if status in RETRYABLE else None
            # 429, or a 5xx with Retry-After, is the server saying it did not process the request and when to come
            # back (API priority and fairness, a server shutting down): safe to repeat whatever the verb, as
            # client-go does
            if status in RETRYABLE and (repeatable or status == 429 or asked is not None) and \
                    attempt < self.attempts:
                overloaded = status == 429 and asked is not None
                limit = self._overload_limit(started, shutdown) if overloaded else cutoff
                before = time.monotonic()
                if self._wait(attempt, asked, limit, f"{method} {path}: HTTP {status} {_message(data)}"):
                    if overloaded:
                        excused += time.monotonic() - before
                    continue
                log.info("%s %s: giving up after %d attempt(s) in %.1f s (HTTP %s%s)", method, path, attempt,
                         time.monotonic() - started, status,
                         f", Retry-After {asked:g} s is past the deadline" if asked else "")
            answer = dict(response.headers)
            if attempt > 1:
                answer[ATTEMPTS_HEADER] = f"{attempt} attempts in {time.monotonic() - started:.1f} s"
            return status, data, answer

    # --- another client's requests (helm, through adapters/relay.py) ------------------------------------------------
    def upstream_url(self, target: str) -> str:
        """The URL another client's request target (path and query) reaches: the configured server's, or ValueError.
        Only an origin-form target (one leading `/`) is taken, and the URL it makes must name the same scheme, host,
        port and no user of its own: `@otherhost/x` would otherwise send our credentials to another server."""
        from urllib3.util import parse_url
        if not ORIGIN_FORM.fullmatch(target or "") or "\\" in target or "#" in target:
            raise ValueError("only an origin-form request target (one leading '/', printable ASCII) is relayed")
        base = self.host
        url = base + target
        want, got = parse_url(base), parse_url(url)
        if (got.scheme, got.host, got.port, got.auth) != (want.scheme, want.host, want.port, want.auth) or \
                not (got.path or "/").startswith((want.path or "").rstrip("/") + "/"):
            raise ValueError(f"the request target leaves the API server {base}")
        return url

    def forward(self, method: str, target: str, body: bytes | None, headers: dict) -> tuple[int, bytes, dict]:
        """Send a request another client made (`target`: path and query) with our credentials and our retry rule,
        and return the final (status, body, headers). What is safe to repeat is decided as for our own requests:
        reads, DELETE, PUT, server-side apply, merge and strategic merge patches, dry runs and the create of a named
        object (a 409 after a repeat of one whose first attempt may have landed is read back, as create() does);
        anything else is repeated only when the server certainly did not see it."""
        self.upstream_url(target)  # ValueError for a target that is not the API server's (the relay checked it too)
        path, _, query = target.partition("?")
        content_type = headers.get("Content-Type") or "application/json"
        named = _named(body) if method == "POST" and "json" in content_type else None
        repeatable = method in ("GET", "HEAD", "DELETE", "PUT") or named is not None or \
            (method == "PATCH" and content_type.split(";")[0] in REPEATABLE_PATCHES)
        status, data, answer = self._call(method, target, None, body, content_type, repeatable,
                                          accept=headers.get("Accept") or "application/json",
                                          agent=headers.get("User-Agent"),
                                          dry_run="dryRun=All" in query)
        if status == 409 and named and ATTEMPTS_HEADER in answer:
            status2, stored, answer2 = self._call("GET", f"{path}/{quote(named, safe='')}", None, None,
                                                  agent=headers.get("User-Agent"))
            try:
                found = json.loads(stored) if status2 == 200 else None
            except ValueError:
                found = None
            if found and not found["metadata"].get("deletionTimestamp") and _carries(found, json.loads(body)):
                log.info("POST %s: %s exists as sent after a repeat: an earlier attempt created it", path, named)
                return 201, stored, answer2
        return status, data, answer

    def stream(self, method: str, target: str, headers: dict):
        """Open a streaming request (a watch) for another client: sent once, not repeated (a watcher re-lists and
        watches again), no read timeout. Returns the urllib3 response, its body not yet read."""
        import urllib3
        api = self._api()
        url = self.upstream_url(target)
        sent = {"Accept": headers.get("Accept") or "application/json",
                "User-Agent": headers.get("User-Agent") or "gpu-bootstrap"}
        api.update_params_for_auth(sent, [], ["BearerToken"], target, method, None)
        self.requests += 1
        return api.rest_client.pool_manager.request(
            method, url, headers=sent, retries=False, redirect=False,
            preload_content=False, timeout=urllib3.Timeout(connect=self.connect_timeout, read=None))

    def _overload_limit(self, started: float, shutdown: float | None) -> float:
        """Until when a request answered 429 with Retry-After may keep waiting as asked: OVERLOAD_DEADLINE (at least
        the outage deadline), and never past a shutdown's."""
        limit = started + max(self.overload_deadline, self.deadline)
        return limit if shutdown is None else min(limit, shutdown)

    def _wait(self, attempt: int, asked: float | None, cutoff: float, what: str) -> bool:
        """Sleep before the next attempt (adapters/backoff.py), at least what Retry-After asked for. False when
        that would pass the deadline."""
        if not backoff.wait(attempt, BACKOFF_BASE, BACKOFF_CAP, cutoff, what, log, asked):
            return False
        self.retries += 1
        return True

    def _unreachable(self, why: NoAnswer, method: str = "", path: str = "", attempts: int = 1,
                     started: float | None = None) -> Unreachable:
        tried = f" ({method} {path})" if method else ""
        if attempts > 1 and started is not None:
            tried = f" ({method} {path}: {attempts} attempts in {time.monotonic() - started:.1f} s)"
        return Unreachable(f"cannot reach the Kubernetes API at {self._host}: {why.cause}{tried}",
                           "check --kubeconfig/--context and that the cluster is up; use --offline for a dry run")

    def _decode(self, method: str, path: str, status: int, data: bytes, attempts: str | None = None):
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
                 403: "your account lacks the RBAC permission for this; 'gpu-bootstrap rbac --for COMMAND' prints what "
                      "each command needs",
                 422: "the API server rejected the object as invalid"}
        tried = f" (HTTP {status}, {attempts})" if attempts and status in RETRYABLE else ""
        raise ClusterError(f"{where} failed: {message}{tried}", hints.get(status, ""), status=status, reason=reason)

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
        return self.list_at(api_version, kind, namespace, label_selector, field_selector)[0]

    def list_at(self, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None,
                field_selector: str | None = None) -> tuple[list[dict], str]:
        """list() and the resourceVersion its snapshot was read at (the first page's: the rest continue it), to
        watch from."""
        path = self._collection(api_version, kind, namespace)
        items, token, version = [], None, ""
        while True:
            page = self.request("GET", path, {"labelSelector": label_selector, "fieldSelector": field_selector,
                                              "limit": 500, "continue": token})
            version = version or page.get("metadata", {}).get("resourceVersion", "")
            for item in page.get("items", []):
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                items.append(item)
            token = page.get("metadata", {}).get("continue")
            if not token:
                return items, version

    def _collection(self, api_version: str, kind: str, namespace: str | None) -> str:
        return self.path(api_version, kind, namespace=namespace) if namespace or not self.resource(
            api_version, kind)[1] else self.path(api_version, kind).replace("/namespaces/default", "")

    def watch(self, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None,
              resource_version: str = "", seconds: float = 60.0):
        """Yield (type, object) for each event of one watch from resource_version, with bookmarks, until the server
        ends it (after `seconds`) or the stream breaks: then the iteration just ends and the caller watches again
        from the last resourceVersion it saw. Sent once, never repeated (a watch is no request to retry). Raises
        Unreachable when there is no answer (the caller lists again, and list() retries) and ClusterError for an
        error answer (403: the identity may not watch). An expired resourceVersion comes as an ERROR event (410)."""
        import urllib3
        path = self._collection(api_version, kind, namespace)
        seconds = max(1, int(seconds))
        query = {"watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": seconds,
                 "labelSelector": label_selector, "resourceVersion": resource_version or None}
        url = self._api().configuration.host + path + "?" + urlencode({k: v for k, v in query.items() if v})
        headers = {"Accept": "application/json", "User-Agent": "gpu-bootstrap"}
        self._api().update_params_for_auth(headers, [], ["BearerToken"], path, "GET", None)
        self.requests += 1
        try:  # a read waits at most as long as the server holds the watch, and a little more
            response = self._api().rest_client.pool_manager.request(
                "GET", url, headers=headers, retries=False, redirect=False, preload_content=False,
                timeout=urllib3.Timeout(connect=self.connect_timeout, read=seconds + 10))
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise Unreachable(f"watch {path} not answered: {error}", "check that the API server is reachable") \
                from None
        ended = False
        try:
            if response.status != 200:
                ended = True
                self._decode("GET", path, response.status, response.read())
            pending = b""
            for chunk in response.stream(64 * 1024):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        event = json.loads(line)
                        yield event.get("type", ""), event.get("object") or {}
            ended = True
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as error:
            log.info("watch %s ended early (%s)", path, error)
        finally:
            if ended:
                response.release_conn()
            else:  # left mid-stream (the caller had what it waited for, or the stream broke): never pooled again
                response.close()

    def logs(self, namespace: str, pod: str, container: str | None = None) -> str:
        """A pod's log as text ('' when there is none yet)."""
        status, data, _headers = self._call("GET", self.path("v1", "Pod", pod, namespace) + "/log",
                                            {"container": container}, accept="*/*")
        return data.decode(errors="replace") if 200 <= status < 300 else ""

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
        """Create an object. A named one cannot be created twice (the server refuses a second with 409), so its
        create is repeated like any safe request; when a repeat is refused with 409 after an attempt that may
        have landed (no answer, or a 5xx), the object is read back and, if it carries everything that was sent
        and is not being deleted, it is the one the earlier attempt created. A generateName create is not
        repeated after an attempt that may have landed: that could make a second object."""
        ref = Ref.of(obj)
        path = self.path(ref.api_version, ref.kind, namespace=ref.namespace)
        named = bool(ref.name)
        status, data, headers = self._call("POST", path, {"fieldManager": self.field_manager,
                                                          "dryRun": "All" if dry_run else None}, obj,
                                           idempotent=named)
        if status == 409 and named and not dry_run and ATTEMPTS_HEADER in headers:
            existing = self.get(ref.api_version, ref.kind, ref.name, ref.namespace)
            if existing is not None and not existing["metadata"].get("deletionTimestamp") and _carries(existing, obj):
                log.info("POST %s: %s %s exists as sent after a repeat: an earlier attempt created it", path,
                         ref.kind, ref.name)
                return existing
        return self._decode("POST", path, status, data, headers.get(ATTEMPTS_HEADER))

    def update(self, obj: dict, dry_run: bool = False) -> dict:
        ref = Ref.of(obj)
        return self.request("PUT", self.path(ref.api_version, ref.kind, ref.name, ref.namespace),
                            {"fieldManager": self.field_manager, "dryRun": "All" if dry_run else None}, obj,
                            idempotent=True)

    def delete(self, ref: Ref, dry_run: bool = False, propagation: str = "Background") -> bool:
        """Returns False when the object was already gone."""
        # The options go in the body, dryRun with them: the API server reads a DELETE's query only when it has no
        # body, so a dryRun=All query beside a DeleteOptions body deletes for real (a teardown --dry-run did, on
        # kube-apiserver 1.37)
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        if dry_run:
            options["dryRun"] = ["All"]
        try:
            self.request("DELETE", self.path(ref.api_version, ref.kind, ref.name, ref.namespace),
                         {"dryRun": "All" if dry_run else None}, options, idempotent=True)
            return True
        except NotFound:
            return False
