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

Robustness: no connection can stop it (docs/security.md, "The relay"). Each connection gets its own thread, in which
the TLS handshake runs with a time limit (HANDSHAKE_TIMEOUT); a connection's first request, which proves the token,
must be complete within FIRST_REQUEST_TIMEOUT (so unauthenticated idle connections cannot hold the MAX_CONNECTIONS
slots: any local user can connect); once a request was authenticated, a connection waits at most IDLE_TIMEOUT for its
next one, and a request's line, headers and body must arrive within REQUEST_TIMEOUT (a slow-loris that trickles bytes
is cut off). At most MAX_CONNECTIONS are served at once; more are closed at once. A request must send its body with a
Content-Length between 0 and MAX_BODY and name an origin-form target (one leading `/`), and the URL sent upstream is
checked to name the API server the kubeconfig names (a target like `@otherhost/x` would move the user's credentials to
another host). `close()` ends every open connection and returns within a second.
"""
from __future__ import annotations

import atexit
import base64
import hmac
import io
import ipaddress
import logging
import secrets
import shutil
import socket
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

log = logging.getLogger("gpu_bootstrap.relay")
PASSED_HEADERS = ("Content-Type", "Accept", "User-Agent")  # what of helm's request goes on (auth is ours)
DROPPED_ANSWER_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"}
MAX_BODY = 64 * 1024 * 1024  # bytes: more than any object the API server accepts (etcd's limit is 1.5 MiB)
HANDSHAKE_TIMEOUT = 10.0  # seconds a connection has for its TLS handshake
FIRST_REQUEST_TIMEOUT = 10.0  # seconds after the handshake by which a connection's first request must be complete
IDLE_TIMEOUT = 120.0  # seconds an authenticated connection may wait for its next request (client-go closes idle ones after 90 s)
REQUEST_TIMEOUT = 60.0  # seconds from a request's first byte to its last (request line, headers and body)
WRITE_TIMEOUT = 120.0  # seconds one write of an answer may block on a client that does not read
MAX_CONNECTIONS = 256  # served at once (helm opens a few dozen at most: writes, watches, kstatus polls)


class Relay:
    """Started on first use (`kubeconfig()`), stopped by `close()` (idempotent)."""

    def __init__(self, kube, *, handshake_timeout: float = HANDSHAKE_TIMEOUT, idle_timeout: float = IDLE_TIMEOUT,
                 request_timeout: float = REQUEST_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                 first_request_timeout: float = FIRST_REQUEST_TIMEOUT):
        self.kube = kube
        self.token = secrets.token_urlsafe(32)
        self.handshake_timeout = handshake_timeout
        self.idle_timeout = idle_timeout
        self.request_timeout = request_timeout
        self.first_request_timeout = first_request_timeout
        self.max_connections = max_connections
        self._server: _Server | None = None
        self._folder: Path | None = None
        self._cert_pem = b""
        self._lock = threading.Lock()

    def kubeconfig(self) -> Path:
        with self._lock:
            if self._server is None:
                self._start()
            elif not (self._folder / "kubeconfig").is_file():
                # its folder was removed under the live relay (a temp cleaner; another run's sweep once did, when
                # a test dropped this process's lock): helm gets a fresh copy of the same kubeconfig
                log.warning("the helm relay's kubeconfig in %s was removed by something else; writing it again",
                            self._folder)
                self._write_kubeconfig(self._server)
            return self._folder / "kubeconfig"

    def _start(self) -> None:
        self.kube.host  # noqa: B018 - load the user's kubeconfig now: its errors are ours to report, not helm's
        server = _Server(("127.0.0.1", 0), _handler(self), self)
        self._folder = Path(tempfile.mkdtemp(prefix="gpu-bootstrap-relay-", dir=_temp_root()))  # 0700
        self._cert_pem = _serve_tls(server, self._folder)
        self._write_kubeconfig(server)
        threading.Thread(target=server.serve_forever, name="helm-relay", daemon=True).start()
        atexit.register(self.close)
        self._server = server
        log.debug("helm relay on 127.0.0.1:%d for %s", server.server_address[1], self.kube.host)

    def _write_kubeconfig(self, server: _Server) -> None:
        if not self._folder.is_dir():
            self._folder = Path(tempfile.mkdtemp(prefix="gpu-bootstrap-relay-", dir=_temp_root()))  # 0700
        path = self._folder / "kubeconfig"
        path.touch(mode=0o600)
        path.write_text(KUBECONFIG.format(port=server.server_address[1], token=self.token,
                                          ca=base64.b64encode(self._cert_pem).decode()))

    def close(self) -> None:
        with self._lock:
            if self._server is not None:
                self._server.shutdown()  # the accept loop never blocks on a client: this returns within 0.5 s
                self._server.server_close()
                self._server.end_connections()
                self._server = None
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None


def _temp_root() -> str | None:
    """Where the relay's folder goes: the run's private temp folder (security/tempfiles.py), removed on every
    way out of the process, even when close() never runs."""
    from gpu_bootstrap.security import tempfiles
    return tempfiles.run_folder_or_none()


class _Server(ThreadingHTTPServer):
    """The accept loop only accepts: TLS, reading and answering happen in each connection's own thread, so no
    client can stall it. `ssl_context` is set by _serve_tls."""

    daemon_threads = True
    ssl_context = None

    def __init__(self, address, handler, relay: Relay):
        super().__init__(address, handler)
        self.relay = relay
        self._served = 0  # connections being served (each in its own thread)
        self._open: set = set()  # their sockets, for end_connections()
        self._open_lock = threading.Lock()

    @property
    def connections(self) -> int:
        """Connections being served now (for the log, and tests)."""
        return self._served

    def process_request(self, request, client_address) -> None:
        """In the accept loop: a thread for the connection, or, at max_connections, close it now."""
        with self._open_lock:
            full = self._served >= self.relay.max_connections
            self._served += not full
        if full:
            log.warning("relay: %d connections open; closing a new one from %s", self.relay.max_connections,
                        client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done()

    def _done(self) -> None:
        with self._open_lock:
            self._served -= 1

    def finish_request(self, request, client_address) -> None:
        """In the connection's thread: the TLS handshake (within handshake_timeout), then its requests."""
        request.settimeout(self.relay.handshake_timeout)
        connection = self.ssl_context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        self._track(connection, True)  # (wrap_socket took the socket over: `request` has no descriptor now)
        try:
            try:
                connection.do_handshake()
            except (OSError, ValueError) as error:  # no handshake in time, not TLS, or ended by close()
                log.debug("relay: TLS handshake with %s failed: %s", client_address, error)
                return
            self.RequestHandlerClass(connection, client_address, self)
        finally:
            self._track(connection, False)
            self.shutdown_request(connection)

    def _track(self, connection, opened: bool) -> None:
        with self._open_lock:
            (self._open.add if opened else self._open.discard)(connection)

    def end_connections(self) -> None:
        """Shut every open connection (a handshake under way, an idle keep-alive, a watch): their threads end."""
        with self._open_lock:
            connections = list(self._open)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

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


def _serve_tls(server: _Server, folder: Path) -> bytes:
    """TLS for the relay's connections with a self-signed certificate for 127.0.0.1 made now (client-go sends a bearer
    token only over TLS). The key exists on disk only for the moment the ssl module needs a file, 0600, in our folder."""
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
    server.ssl_context = context  # each connection's own thread does its handshake (_Server.finish_request)
    return cert_pem


class _DeadlineReader(io.RawIOBase):
    """A connection's reads, each with the time the handler allows: until its next request starts, the idle
    timeout; from its first byte on, what is left of the request's deadline (so trickling bytes does not help)."""

    def __init__(self, connection, handler):
        self.connection = connection
        self.handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self.connection.settimeout(self.handler.read_timeout())
        return self.connection.recv_into(buffer)


def _status(code: int, message: str = "") -> bytes:
    """A Kubernetes Status body, as the API server would send for this failure."""
    import json
    return json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                       **({"message": message} if message else {})}, separators=(",", ":")).encode()


def _handler(relay: Relay):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, and chunked answers for watches
        disable_nagle_algorithm = True  # headers and body go out in separate writes: no 40 ms delayed-ACK stall
        deadline: float | None = None  # time.monotonic() by which the request being read must be complete
        authenticated = False  # a request on this connection carried the token: from then on, the idle limit
        first_deadline = 0.0  # until then, time.monotonic() by which the first request must be complete

        def setup(self) -> None:
            super().setup()
            self.first_deadline = time.monotonic() + relay.first_request_timeout
            self.rfile.close()  # the socket's own file: ours reads with deadlines (closed, so it holds no fd)
            self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self))

        def read_timeout(self) -> float:
            now = time.monotonic()
            if not self.authenticated and self.first_deadline - now <= 0:
                raise TimeoutError(f"no authenticated request within {relay.first_request_timeout:g} s")
            left = relay.idle_timeout if self.deadline is None else self.deadline - now
            if left <= 0:
                raise TimeoutError(f"request not complete within {relay.request_timeout:g} s")
            return left if self.authenticated else min(left, self.first_deadline - now)

        def handle_one_request(self) -> None:
            self.deadline = None
            try:
                if not self.rfile.peek(1):  # the client closed the connection
                    self.close_connection = True
                    return
            except OSError as error:  # idle for too long (TimeoutError), or reset
                log.debug("relay: connection from %s closed while idle: %s", self.client_address, error)
                self.close_connection = True
                return
            self.deadline = time.monotonic() + relay.request_timeout
            super().handle_one_request()

        def _refuse(self, status: int, message: str) -> None:
            """Answer an error and close: a body we did not read must not be taken for the next request."""
            log.debug("relay: refused %s %r from %s: %s", self.command, self.path[:200], self.client_address, message)
            self.close_connection = True
            self._answer(status, _status(status, message), {})

        def _length(self) -> int | None:
            """The request body's length, or None after refusing a missing, negative, oversized or chunked one."""
            if self.headers.get("Transfer-Encoding"):
                return self._refuse(411, "send the body with a Content-Length")
            given = self.headers.get_all("Content-Length") or ["0"]
            text = given[0].strip()
            if len(given) > 1 or not (text.isascii() and text.isdigit()):  # negative, signed, non-numeric, twice
                return self._refuse(400, "invalid Content-Length")
            if int(text) > MAX_BODY:
                return self._refuse(413, f"request body over {MAX_BODY} bytes")
            return int(text)

        def _relay(self) -> None:
            if not hmac.compare_digest(self.headers.get("Authorization", ""), f"Bearer {relay.token}"):
                return self._refuse(401, "")
            self.authenticated = True
            try:
                relay.kube.upstream_url(self.path)
            except ValueError as error:
                return self._refuse(400, str(error))
            headers = {name: self.headers[name] for name in PASSED_HEADERS if self.headers.get(name)}
            if _is_watch(self.path):
                if self.headers.get("Content-Length", "0").strip() != "0" or self.headers.get("Transfer-Encoding"):
                    return self._refuse(400, "a watch has no body")
                self._read_done()
                return self._stream(headers)
            length = self._length()
            if length is None:
                return None
            body = self.rfile.read(length) if length else None
            if length and len(body or b"") < length:  # the client closed before sending it all
                self.close_connection = True
                return None
            self._read_done()
            try:
                status, data, answer = relay.kube.forward(self.command, self.path, body, headers)
            except Exception as error:  # noqa: BLE001 - no answer upstream: say so as a gateway would
                log.debug("relay %s %s: %s", self.command, self.path, error)
                return self._answer(502, _status(502, str(getattr(error, "message", error))), {})
            self._answer(status, data, answer)

        def _read_done(self) -> None:
            """The request is read: the answer's writes get their own limit (a watch may stream for long)."""
            self.deadline = None
            self.connection.settimeout(WRITE_TIMEOUT)

        def _answer(self, status: int, data: bytes, headers: dict) -> None:
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() not in DROPPED_ANSWER_HEADERS and not name.startswith("X-Gpu-Bootstrap"):
                    self.send_header(name, value)
            if not any(name.lower() == "content-type" for name in headers):
                self.send_header("Content-Type", "application/json")
            if self.close_connection:
                self.send_header("Connection", "close")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _stream(self, headers: dict) -> None:
            try:
                upstream = relay.kube.stream(self.command, self.path, headers)
            except Exception as error:  # noqa: BLE001
                log.debug("relay watch %s: %s", self.path, error)
                return self._answer(502, _status(502), {})
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
