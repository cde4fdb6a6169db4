"""A stand-in for OPA containers run by a Deployment, for the emulator.

No OPA binary runs here, so when a Deployment's pods run an image named openpolicyagent/opa and are ready, this does
what `opa run --server` does from the same inputs: it reads the TLS certificate and key from the Secret mounted at
the --tls-cert-file / --tls-private-key-file paths and the policy files named on the command line from their
ConfigMap, loads the policy into a real Rego engine (tests/kubeapi/rego.py), and serves HTTPS on 127.0.0.1: POST to
the root path answers with data.system.main for the AdmissionReview sent as input (OPA's webhook contract), GET
/health answers 200. Every Service in the namespace whose selector picks those pods is routed there for webhook
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

from .controllers import pod_is_ready
from .selectors import selector_object_matches

OPA_IMAGE = "openpolicyagent/opa"
GRACE_SECONDS = 2.0


class OpaServer:
    def __init__(self, cert_pem: str, key_pem: str, modules: dict[str, str]):
        from .rego import Policy
        self.policy = Policy(modules)
        self.requests = 0
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

            def do_GET(self):  # noqa: N802
                if self.path.split("?")[0] == "/health":
                    return self._send(200, {})
                return self._send(404, {"code": "resource_not_found"})

            def do_POST(self):  # noqa: N802
                server.requests += 1
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    document = json.loads(self.rfile.read(length) or b"null")
                except ValueError:
                    return self._send(400, {"code": "invalid_parameter", "message": "body is not JSON"})
                if self.path.split("?")[0] != "/":
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
            server = OpaServer(cert, private, modules)
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
