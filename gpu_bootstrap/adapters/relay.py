"""helm's way to the API server: a relay on 127.0.0.1 that sends every request helm makes on with gpu-bootstrap's
own credentials and retry rule (Kube.forward).

Why: helm (client-go) repeats only reads after a connection reset, so under a lossy or restarting API server a
chart's install fails at its first reset write, and a large chart (kube-prometheus-stack: some 130 objects, each
written at least once) almost never gets through a whole attempt. Through the relay, a write the reset stopped is
repeated when that is safe (server-side apply, merge patches, PUT, DELETE, the create of a named object), exactly as
gpu-bootstrap's own writes are; 429 and 503 with Retry-After are waited out here too. Watches stream through
unrepeated (the watcher re-lists).

Safety: the relay listens on 127.0.0.1 only, on a port the kernel picks, and answers nothing that does not carry its
random bearer token, which is written only to a 0600 kubeconfig in a 0700 folder of its own, removed when the relay
stops. It holds no credential of its own: it uses the Kube adapter's (any auth method of the user's kubeconfig).
"""
from __future__ import annotations

import atexit
import base64
import hmac
import ipaddress
import logging
import secrets
import shutil
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

log = logging.getLogger("gpu_bootstrap.relay")
PASSED_HEADERS = ("Content-Type", "Accept", "User-Agent")  # what of helm's request goes on (auth is ours)
DROPPED_ANSWER_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"}
MAX_BODY = 64 * 1024 * 1024  # bytes: more than any object the API server accepts (etcd's limit is 1.5 MiB)


class Relay:
    """Started on first use (`kubeconfig()`), stopped by `close()` (idempotent)."""

    def __init__(self, kube):
        self.kube = kube
        self.token = secrets.token_urlsafe(32)
        self._server: ThreadingHTTPServer | None = None
        self._folder: Path | None = None
        self._lock = threading.Lock()

    def kubeconfig(self) -> Path:
        with self._lock:
            if self._server is None:
                self._start()
            return self._folder / "kubeconfig"

    def _start(self) -> None:
        self.kube.host  # noqa: B018 - load the user's kubeconfig now: its errors are ours to report, not helm's
        server = _Server(("127.0.0.1", 0), _handler(self))
        self._folder = Path(tempfile.mkdtemp(prefix="gpu-bootstrap-relay-"))  # 0700
        cert_pem = _serve_tls(server, self._folder)
        path = self._folder / "kubeconfig"
        path.touch(mode=0o600)
        path.write_text(KUBECONFIG.format(port=server.server_address[1], token=self.token,
                                          ca=base64.b64encode(cert_pem).decode()))
        threading.Thread(target=server.serve_forever, name="helm-relay", daemon=True).start()
        atexit.register(self.close)
        self._server = server
        log.debug("helm relay on 127.0.0.1:%d for %s", server.server_address[1], self.kube.host)

    def close(self) -> None:
        with self._lock:
            if self._server is not None:
                self._server.shutdown()
                self._server.server_close()
                self._server = None
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """helm went away mid-answer (it was stopped, or its context ended): for the log, not for the screen."""
        import sys
        log.debug("relay: request from %s ended: %s", client_address, sys.exc_info()[1])


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: relay, cluster: {{server: "https://127.0.0.1:{port}", certificate-authority-data: "{ca}"}}}}]
users: [{{name: relay, user: {{token: "{token}"}}}}]
contexts: [{{name: relay, context: {{cluster: relay, user: relay}}}}]
current-context: relay
"""


def _serve_tls(server: ThreadingHTTPServer, folder: Path) -> bytes:
    """TLS on the relay's socket with a self-signed certificate for 127.0.0.1 made now (client-go sends a bearer token
    only over TLS). The key exists on disk only for the moment the ssl module needs a file, 0600, in our folder."""
    import datetime as dt
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-bootstrap helm relay")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_file = folder / "relay.key"
    key_file.touch(mode=0o600)
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    (folder / "relay.crt").write_bytes(cert_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(folder / "relay.crt", key_file)
    finally:
        key_file.unlink()
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return cert_pem


def _handler(relay: Relay):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, and chunked answers for watches
        disable_nagle_algorithm = True  # headers and body go out in separate writes: no 40 ms delayed-ACK stall

        def _relay(self) -> None:
            if not hmac.compare_digest(self.headers.get("Authorization", ""), f"Bearer {relay.token}"):
                return self._answer(401, b'{"kind":"Status","status":"Failure","code":401}', {})
            headers = {name: self.headers[name] for name in PASSED_HEADERS if self.headers.get(name)}
            if _is_watch(self.path):
                return self._stream(headers)
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                return self._answer(413, b'{"kind":"Status","status":"Failure","code":413}', {})
            body = self.rfile.read(length) if length else None
            try:
                status, data, answer = relay.kube.forward(self.command, self.path, body, headers)
            except Exception as error:  # noqa: BLE001 - no answer upstream: say so as a gateway would
                log.debug("relay %s %s: %s", self.command, self.path, error)
                message = str(getattr(error, "message", error)).replace('"', "'")
                return self._answer(502, f'{{"kind":"Status","status":"Failure","code":502,'
                                         f'"message":"{message}"}}'.encode(), {})
            self._answer(status, data, answer)

        def _answer(self, status: int, data: bytes, headers: dict) -> None:
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() not in DROPPED_ANSWER_HEADERS and not name.startswith("X-Gpu-Bootstrap"):
                    self.send_header(name, value)
            if not any(name.lower() == "content-type" for name in headers):
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _stream(self, headers: dict) -> None:
            try:
                upstream = relay.kube.stream(self.command, self.path, headers)
            except Exception as error:  # noqa: BLE001
                log.debug("relay watch %s: %s", self.path, error)
                return self._answer(502, b'{"kind":"Status","status":"Failure","code":502}', {})
            ended = False
            try:
                self.send_response(upstream.status)
                for name, value in upstream.headers.items():
                    if name.lower() not in DROPPED_ANSWER_HEADERS:
                        self.send_header(name, value)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunks = upstream.read_chunked(decode_content=False) if upstream.chunked else \
                    upstream.stream(64 * 1024, decode_content=False)
                for chunk in chunks:
                    if chunk:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                ended = True
            except OSError:  # helm went away (its watch ended) or the server closed the stream
                self.close_connection = True
            finally:
                if ended:
                    upstream.release_conn()
                else:  # stopped mid-stream: that connection must not go back to the pool for another request
                    upstream.close()

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _relay  # noqa: N815

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
            log.debug("relay: " + format, *args)

    return Handler


def _is_watch(target: str) -> bool:
    path, _, query = target.partition("?")
    return "/watch/" in path or any(part in ("watch=true", "watch=1") for part in query.split("&"))
