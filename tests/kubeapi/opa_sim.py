"""A stand-in for OPA containers run by a Deployment, for the emulator.

No OPA binary runs here, so when a Deployment's pods run an image named openpolicyagent/opa and are ready, this does
what `opa run --server` does from the same inputs: it reads the TLS certificate and key from the Secret mounted at
the --tls-cert-file / --tls-private-key-file paths and the policy files named on the command line from their
ConfigMap, loads the policy into a real Rego engine (tests/kubeapi/rego.py), and serves HTTPS on 127.0.0.1: POST to
the root path answers with data.system.main for the AdmissionReview sent as input (OPA's webhook contract), GET
/health answers 200, and the management API parts an attacker would use are served too (PUT/DELETE
/v1/policies/<id>, GET/POST /v1/data/<path>). With `--authorization=basic` every request first goes through
data.system.authz.allow with the input OPA's server builds (v1/server/authorizer: method, path split at '/', params,
headers, identity = the bearer token under `--authentication=token`, body for POSTs of / and /v1/data), and a refusal
is OPA's 401 "request rejected by administrative policy". Every Service in the namespace whose selector picks those pods is routed there for webhook
calls. Like a container, it reads its files when its set of ready pods changes (a rollout), not on every Secret edit;
with no ready pod it stops serving and its Services have no endpoint.
"""
from __future__ import annotations

import json
import os
import posixpath
import ssl
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from .controllers import pod_is_ready
from .selectors import selector_object_matches

OPA_IMAGE = "openpolicyagent/opa"
GRACE_SECONDS = 2.0


def authz_input(method: str, target: str, headers, body, authentication: str | None) -> dict:
    """What OPA's authorizer gives data.system.authz (v1/server/authorizer/authorizer.go makeInput)."""
    split = urlsplit(target)
    path = [unquote(part) for part in split.path[1:].split("/")] if split.path else []
    document = {"method": method.upper(), "path": path, "params": parse_qs(split.query, keep_blank_values=True),
                "headers": {key.title(): headers.get_all(key) for key in set(headers.keys())}}
    expects_body = method.upper() == "POST" and (path == [""] or (len(path) >= 2 and path[0] in ("v0", "v1") and
                                                                 path[1] == "data"))
    if expects_body and body is not None:
        document["body"] = body
    header = headers.get("Authorization", "")
    if authentication == "token" and header.startswith("Bearer "):
        document["identity"] = header[len("Bearer "):]
    return document


class OpaServer:
    def __init__(self, cert_pem: str, key_pem: str, modules: dict[str, str], authorization: bool = False,
                 authentication: str | None = None):
        from .rego import Policy
        self.policy = Policy(modules)
        self.requests = 0
        self.authorization = authorization
        self.authentication = authentication
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, code: int, body: dict) -> None:
                payload = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _allowed(self, raw: bytes | None) -> bool:
                """OPA's authorizer; False after sending its 401."""
                if not server.authorization:
                    return True
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                document = authz_input(self.command, self.path, self.headers, body, server.authentication)
                if server.policy.decide("data.system.authz.allow", document) is True:
                    return True
                self._send(401, {"code": "unauthorized", "message": "request rejected by administrative policy"})
                return False

            def do_GET(self):  # noqa: N802
                if not self._allowed(None):
                    return None
                path = urlsplit(self.path).path
                if path == "/health":
                    return self._send(200, {})
                if path.startswith("/v1/data"):
                    rule = ".".join(["data", *[p for p in path[len("/v1/data"):].split("/") if p]])
                    return self._send(200, {"result": server.policy.decide(rule, {})})
                return self._send(404, {"code": "resource_not_found"})

            def do_PUT(self):  # noqa: N802
                raw = self._body()
                if not self._allowed(None):
                    return None
                path = urlsplit(self.path).path
                if not path.startswith("/v1/policies/"):
                    return self._send(404, {"code": "resource_not_found"})
                try:
                    server.replace_module(unquote(path[len("/v1/policies/"):]), raw.decode())
                except Exception as error:  # noqa: BLE001 - OPA answers a policy that does not compile with 400
                    return self._send(400, {"code": "invalid_parameter", "message": str(error)})
                return self._send(200, {})

            def do_DELETE(self):  # noqa: N802
                self._body()
                if not self._allowed(None):
                    return None
                path = urlsplit(self.path).path
                if not path.startswith("/v1/policies/"):
                    return self._send(404, {"code": "resource_not_found"})
                try:
                    server.delete_module(unquote(path[len("/v1/policies/"):]))
                except KeyError:
                    return self._send(404, {"code": "resource_not_found"})
                return self._send(200, {})

            def do_POST(self):  # noqa: N802
                server.requests += 1
                raw = self._body()
                try:
                    document = json.loads(raw or b"null")
                except ValueError:
                    return self._send(400, {"code": "invalid_parameter", "message": "body is not JSON"})
                if not self._allowed(raw):
                    return None
                path = urlsplit(self.path).path
                if path.startswith("/v1/data"):
                    rule = ".".join(["data", *[p for p in path[len("/v1/data"):].split("/") if p]])
                    given = (document or {}).get("input") if isinstance(document, dict) else None
                    return self._send(200, {"result": server.policy.decide(rule, given)})
                if path != "/":
                    return self._send(404, {"code": "resource_not_found"})
                try:
                    return self._send(200, server.policy.decide("data.system.main", document))
                except Exception as error:  # noqa: BLE001 - OPA answers an evaluation error with 500
                    return self._send(500, {"code": "internal_error", "message": str(error)})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory() as folder:
            cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
            with open(cert, "w") as handle:
                handle.write(cert_pem)
            with open(key, "w") as handle:
                handle.write(key_pem)
            context.load_cert_chain(cert, key)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="opa-sim", daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def replace_module(self, name: str, text: str) -> None:
        """PUT /v1/policies/<id>: the module set with this one added or replaced must compile."""
        from .rego import Policy
        with self._lock:
            self.policy = Policy({**self.policy.modules, name: text})

    def delete_module(self, name: str) -> None:
        """DELETE /v1/policies/<id> (files loaded by `opa run` have their path as id)."""
        from .rego import Policy
        with self._lock:
            modules = dict(self.policy.modules)
            del modules[name]
            self.policy = Policy(modules)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class OpaSim:
    def __init__(self, manager, chain):
        self.manager = manager
        self.store = manager.store
        self.chain = chain
        self.servers: dict[tuple, tuple[frozenset, OpaServer | None]] = {}  # Deployment key -> (ready pods, server)
        self.routed: dict[tuple, set] = {}
        self.errors: dict[tuple, str] = {}

    def wants(self, key: tuple) -> bool:
        return (key[0], key[1]) in {("apps", "deployments"), ("", "pods"), ("", "services")}

    def reconcile(self) -> None:
        seen = set()
        for (namespace, name), deploy in list(self.store.objects.get(("apps", "deployments"), {}).items()):
            container = next((c for c in deploy["spec"]["template"]["spec"].get("containers") or []
                              if OPA_IMAGE in c.get("image", "")), None)
            if container is None:
                continue
            key = (namespace, name)
            seen.add(key)
            ready = self._ready_pods(deploy)
            identity = frozenset(p["metadata"]["uid"] for p in ready)
            current_identity, server = self.servers.get(key, (frozenset(), None))
            if identity != current_identity:
                old, server = server, self._start(key, deploy, container) if ready else None
                self.servers[key] = (identity, server)
                self._route(key, deploy, ready, server)
                if old is not None:  # a terminating pod finishes the requests it has (graceful termination)
                    timer = threading.Timer(GRACE_SECONDS, old.stop)
                    timer.daemon = True
                    timer.start()
            else:
                self._route(key, deploy, ready, server)
        for key in set(self.servers) - seen:
            _identity, server = self.servers.pop(key)
            if server is not None:
                server.stop()
            self._route(key, None, [], None)

    def stop_all(self) -> None:
        for _identity, server in self.servers.values():
            if server is not None:
                server.stop()
        self.servers.clear()

    def server(self, namespace: str, name: str) -> OpaServer | None:
        return self.servers.get((namespace, name), (None, None))[1]

    # --- pieces -------------------------------------------------------------------------------------------------------
    def _ready_pods(self, deploy: dict) -> list[dict]:
        selector = deploy["spec"].get("selector") or {}
        namespace = deploy["metadata"]["namespace"]
        return [p for (ns, _n), p in sorted(self.store.objects.get(("", "pods"), {}).items())
                if ns == namespace and not p["metadata"].get("deletionTimestamp") and
                selector_object_matches(selector, p["metadata"].get("labels")) and pod_is_ready(p)]

    def _file(self, deploy: dict, container: dict, path: str) -> str | None:
        """The content of a file the container sees, from the Secret or ConfigMap volume mounted over it."""
        namespace = deploy["metadata"]["namespace"]
        for mount in container.get("volumeMounts") or []:
            if posixpath.dirname(path) != mount["mountPath"].rstrip("/"):
                continue
            volume = next((v for v in deploy["spec"]["template"]["spec"].get("volumes") or []
                           if v["name"] == mount["name"]), {})
            if volume.get("secret"):
                obj = self.store.objects.get(("", "secrets"), {}).get((namespace, volume["secret"]["secretName"]))
                value = ((obj or {}).get("data") or {}).get(posixpath.basename(path))
                import base64
                return base64.b64decode(value).decode() if value else None
            if volume.get("configMap"):
                obj = self.store.objects.get(("", "configmaps"), {}).get((namespace, volume["configMap"]["name"]))
                return ((obj or {}).get("data") or {}).get(posixpath.basename(path))
        return None

    def _start(self, key: tuple, deploy: dict, container: dict) -> OpaServer | None:
        args = (container.get("command") or []) + (container.get("args") or [])
        flags = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if a.startswith("--") and "=" in a}
        files = [a for a in args if not a.startswith("-") and a not in ("run", "opa")]
        cert = self._file(deploy, container, flags.get("--tls-cert-file", ""))
        private = self._file(deploy, container, flags.get("--tls-private-key-file", ""))
        modules = {path: self._file(deploy, container, path) for path in files}
        if not cert or not private or not modules or any(text is None for text in modules.values()):
            self.errors[key] = "a mounted file is missing (the container would not start)"
            return None
        try:
            server = OpaServer(cert, private, modules, authorization=flags.get("--authorization") == "basic",
                               authentication=flags.get("--authentication"))
        except Exception as error:  # noqa: BLE001 - a policy that does not parse: OPA exits at start
            self.errors[key] = f"{type(error).__name__}: {error}"
            return None
        self.errors.pop(key, None)
        return server

    def _route(self, key: tuple, deploy: dict | None, ready: list[dict], server: OpaServer | None) -> None:
        """Point the Services that select the ready pods at the server; the switch from an old server to a new one
        is one assignment, so no webhook call falls between them."""
        namespace = key[0]
        routed = set()
        if deploy is not None and server is not None:
            for (ns, name), service in self.store.objects.get(("", "services"), {}).items():
                selector = (service.get("spec") or {}).get("selector")
                if ns != namespace or not selector or not any(
                        selector_object_matches({"matchLabels": selector}, p["metadata"].get("labels")) for p in ready):
                    continue
                for port in (service.get("spec") or {}).get("ports") or []:
                    self.chain.route(namespace, name, int(port["port"]), "127.0.0.1", server.port)
                routed.add(name)
        for service in self.routed.get(key, set()) - routed:
            self.chain.unroute(namespace, service)
        self.routed[key] = routed
