"""helm's relay (gpu_bootstrap/adapters/relay.py), with the real helm and kubectl against the emulator: a write whose
connection is reset fails helm on its own and is repeated through the relay; watches stream; the relay answers only
its own token; its kubeconfig is private and gone when it stops; a create that landed before its answer was lost is
read back, not refused. No connection can stop it (real sockets against the real relay): an idle connection, a
slow-loris, a `@host` target and a negative Content-Length are each refused or timed out while a real helm request
goes through, connections beyond the bound are closed, and close() never hangs."""
from __future__ import annotations

import json
import os
import socket
import ssl
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml

from gpu_bootstrap.adapters.kube import Kube
from gpu_bootstrap.adapters.relay import Relay
from tests.tools import run, tool

pytestmark = pytest.mark.tools

CHART = {"Chart.yaml": "apiVersion: v2\nname: demo\nversion: 0.1.0\n",
         "templates/configmap.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: demo}\ndata: {a: '1'}\n"}


@pytest.fixture
def relay(cluster):
    relay = Relay(Kube(cluster.kubeconfig))
    yield relay
    relay.close()


@pytest.fixture
def demo_chart(tmp_path):
    for name, text in CHART.items():
        (tmp_path / "demo" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "demo" / name).write_text(text)
    return tmp_path / "demo"


def reset_the_first_write(emu, path: str) -> list:
    """The first create and the first patch at `path` get a TCP reset before the server handles them."""
    return [emu.faults.add(method, path, count=1, reset=True) for method in ("POST", "PATCH")]


def helm(cluster, kubeconfig, *args: str):
    return run([tool("helm"), "--kubeconfig", str(kubeconfig), *args], cluster.env, 120, check=False)


def test_a_reset_write_fails_helm_alone_and_is_repeated_through_the_relay(cluster, relay, demo_chart):
    emu = cluster.emu
    faults = reset_the_first_write(emu, r"/namespaces/default/configmaps(/demo)?$")
    alone = helm(cluster, cluster.kubeconfig, "install", "demo", str(demo_chart), "-n", "default")
    assert alone.returncode != 0 and "connection reset by peer" in alone.stderr, alone.stderr
    assert sum(f.fired for f in faults) == 1
    assert emu.get("configmaps", "demo", "default") is None
    helm(cluster, cluster.kubeconfig, "uninstall", "demo", "-n", "default")

    faults = reset_the_first_write(emu, r"/namespaces/default/configmaps(/demo)?$")
    through = helm(cluster, relay.kubeconfig(), "install", "demo", str(demo_chart), "-n", "default", "--wait")
    assert through.returncode == 0, through.stderr
    assert sum(f.fired for f in faults) == 1, "the fault did not hit the relayed install"
    assert emu.get("configmaps", "demo", "default")["data"] == {"a": "1"}
    status = json.loads(helm(cluster, relay.kubeconfig(), "status", "demo", "-n", "default", "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    # helm's own identity reaches the server (audit logs, field managers)
    assert any(r.user_agent.startswith("Helm/") and r.method in ("POST", "PATCH") for r in emu.requests.all())


def test_a_relay_whose_folder_was_removed_under_it_hands_helm_a_fresh_kubeconfig(cluster, relay, demo_chart):
    """Something else removed the live relay's folder (a temp cleaner; once another run's sweep): helm asks for the
    kubeconfig again and gets a new copy for the same relay, so the install goes on instead of failing on a missing
    file."""
    import shutil
    first = relay.kubeconfig()
    shutil.rmtree(first.parent)
    again = relay.kubeconfig()
    assert again.is_file() and stat.S_IMODE(again.stat().st_mode) == 0o600
    installed = helm(cluster, again, "install", "demo", str(demo_chart), "-n", "default", "--wait")
    assert installed.returncode == 0, installed.stderr
    assert cluster.emu.get("configmaps", "demo", "default")["data"] == {"a": "1"}


def test_a_watch_streams_through_the_relay(cluster, relay):
    watch = subprocess.Popen([tool("kubectl"), "--kubeconfig", str(relay.kubeconfig()), "get", "configmaps", "-n",
                              "default", "--watch", "-o", "name"], env=cluster.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)  # not a race the test depends on: an object made before the watch starts is listed too
        cluster.kubectl("create", "configmap", "late", "-n", "default")
        deadline = time.monotonic() + 20
        seen = []
        os.set_blocking(watch.stdout.fileno(), False)
        while "configmap/late" not in seen and time.monotonic() < deadline:
            line = watch.stdout.readline()
            if line:
                seen.append(line.strip())
            else:
                time.sleep(0.05)
        assert "configmap/late" in seen, (seen, watch.stderr.read() if watch.poll() is not None else "")
        assert watch.poll() is None, "the watch ended instead of streaming"
    finally:
        watch.kill()
        watch.communicate()


def test_the_relay_answers_only_its_token_and_keeps_its_kubeconfig_private(relay):
    kubeconfig = relay.kubeconfig()
    config = yaml.safe_load(kubeconfig.read_text())
    assert stat.S_IMODE(kubeconfig.stat().st_mode) == 0o600
    assert stat.S_IMODE(kubeconfig.parent.stat().st_mode) == 0o700
    assert sorted(p.name for p in kubeconfig.parent.iterdir()) == ["kubeconfig", "relay.crt"]  # no key on disk
    server = config["clusters"][0]["cluster"]["server"]
    assert server.startswith("https://127.0.0.1:")
    context = ssl.create_default_context(cafile=str(kubeconfig.parent / "relay.crt"))
    for token in ("", "Bearer wrong", f"Bearer {relay.token}x"):
        request = urllib.request.Request(server + "/api/v1/namespaces", headers={"Authorization": token})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, context=context, timeout=10)
        assert refused.value.code == 401
    right = urllib.request.Request(server + "/api/v1/namespaces", headers={"Authorization": f"Bearer {relay.token}"})
    with urllib.request.urlopen(right, context=context, timeout=10) as answer:
        assert json.loads(answer.read())["kind"] == "NamespaceList"
    relay.close()
    assert not kubeconfig.parent.exists()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(right, context=context, timeout=5)


def test_a_create_that_landed_before_its_answer_was_lost_is_read_back(cluster):
    """The emulator resets the connection only before handling a request, so the fault's action creates the object
    first (as the lost attempt would have): the repeat gets 409, and the relay's rule reads it back."""
    emu, kube = cluster.emu, Kube(cluster.kubeconfig)
    sent = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "landed", "namespace": "default"},
            "data": {"k": "v"}}
    emu.faults.add("POST", r"/namespaces/default/configmaps$", count=1, reset=True, action=lambda: emu.seed(sent))
    status, body, _headers = kube.forward("POST", "/api/v1/namespaces/default/configmaps",
                                          json.dumps(sent).encode(), {"Content-Type": "application/json"})
    assert status == 201 and json.loads(body)["data"] == {"k": "v"}
    # someone else's object of that name with other data is not taken for ours
    other = dict(sent, metadata={"name": "theirs", "namespace": "default"}, data={"k": "theirs"})
    emu.faults.add("POST", r"/namespaces/default/configmaps$", count=1, reset=True, action=lambda: emu.seed(other))
    mine = dict(other, data={"k": "mine"})
    status, body, _headers = kube.forward("POST", "/api/v1/namespaces/default/configmaps",
                                          json.dumps(mine).encode(), {"Content-Type": "application/json"})
    assert status == 409
    assert emu.get("configmaps", "theirs", "default")["data"] == {"k": "theirs"}


# --- no connection can stop the relay ------------------------------------------------------------------------------
def address(relay) -> tuple[str, int]:
    server = yaml.safe_load(relay.kubeconfig().read_text())["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("https://").split(":")
    return host, int(port)


def tls(relay) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(relay.kubeconfig().parent / "relay.crt"))
    return context.wrap_socket(socket.create_connection(address(relay), timeout=30), server_hostname="127.0.0.1")


def ask(relay, request: bytes) -> bytes:
    """One raw request on its own TLS connection; the whole answer (the relay closes after a refusal)."""
    with tls(relay) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
        return answer


def closed_by_relay(connection: socket.socket, within: float = 30) -> bool:
    """Does the relay close this connection (EOF or reset) within `within` seconds? (A liveness bound far above the
    relay's timeouts in these tests, not a measurement.)"""
    connection.settimeout(within)
    try:
        while connection.recv(4096):
            pass
        return True
    except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def still_open(connection: socket.socket) -> bool:
    connection.settimeout(0.05)
    try:
        return connection.recv(1) != b""  # nothing was asked: the relay cannot have answered
    except TimeoutError:
        return True
    except OSError:
        return False


def slow_loris(relay, stop: threading.Event) -> ssl.SSLSocket:
    """A TLS connection that sends a request's header one byte every 0.1 s, forever (within any per-read limit, and
    never reaching the server's limits on header count or line length)."""
    connection = tls(relay)
    connection.sendall(b"GET /api/v1/namespaces HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")

    def trickle():
        while not stop.wait(0.1):
            try:
                connection.sendall(b"a")
            except OSError:
                return
    threading.Thread(target=trickle, daemon=True).start()
    return connection


def head(answer: bytes) -> str:
    return answer.split(b"\r\n", 1)[0].decode()


def test_no_connection_stops_the_relay_while_helm_goes_through(cluster, demo_chart):
    """With time limits longer than the test, the attackers stay open the whole time: helm's install succeeds beside
    them, a `@host` target and bad lengths are refused at once, and close() ends it all without hanging."""
    relay = Relay(Kube(cluster.kubeconfig), handshake_timeout=60, idle_timeout=60, request_timeout=60,
                  first_request_timeout=60)
    stop = threading.Event()
    other = socket.create_server(("127.0.0.1", 0))  # where a `@host` target would send the user's credentials
    try:
        idle = socket.create_connection(address(relay))  # connects, never starts TLS
        quiet = tls(relay)  # TLS, then never asks anything
        loris = slow_loris(relay, stop)
        token = f"Authorization: Bearer {relay.token}\r\nHost: 127.0.0.1\r\n".encode()
        at_host = ask(relay, b"GET @127.0.0.1:%d/api/v1/namespaces HTTP/1.1\r\n%s\r\n" % (other.getsockname()[1], token))
        assert head(at_host) == "HTTP/1.1 400 Bad Request" and b"origin-form" in at_host
        other.settimeout(0)
        with pytest.raises(BlockingIOError):
            other.accept()  # the relay never connected there (it would have before answering)
        for length, status in ((b"-5", 400), (b"+5", 400), (b"nope", 400), ("²".encode(), 400),
                               (b"2\r\nContent-Length: 3", 400), (b"%d" % (2 ** 40), 413)):
            answer = ask(relay, b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\n%sContent-Type: "
                                b"application/json\r\nContent-Length: %s\r\n\r\n{}" % (token, length))
            assert head(answer).startswith(f"HTTP/1.1 {status} "), (length, answer[:200])
        chunked = ask(relay, b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\n%sTransfer-Encoding: "
                             b"chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n" % token)
        assert head(chunked).startswith("HTTP/1.1 411 ")
        assert cluster.emu.get("configmaps", "x", "default") is None
        installed = helm(cluster, relay.kubeconfig(), "install", "demo", str(demo_chart), "-n", "default", "--wait")
        assert installed.returncode == 0, installed.stderr
        assert cluster.emu.get("configmaps", "demo", "default")["data"] == {"a": "1"}
        assert still_open(idle) and still_open(quiet) and still_open(loris)  # they were there all along
        closing = threading.Thread(target=relay.close)
        closing.start()
        closing.join(30)
        assert not closing.is_alive(), "close() hangs"
        assert closed_by_relay(idle) and closed_by_relay(quiet) and closed_by_relay(loris)
    finally:
        stop.set()
        other.close()
        relay.close()


def test_an_idle_connection_and_a_slow_loris_are_timed_out(cluster):
    """Short time limits: a connection that never starts TLS, one that never asks, and one whose headers trickle in
    (each line well within the idle limit, the whole past the request limit) are all closed by the relay."""
    relay = Relay(Kube(cluster.kubeconfig), handshake_timeout=1, idle_timeout=1.5, request_timeout=2)
    stop = threading.Event()
    try:
        idle, quiet, loris = socket.create_connection(address(relay)), tls(relay), slow_loris(relay, stop)
        assert closed_by_relay(idle) and closed_by_relay(quiet) and closed_by_relay(loris)
        with tls(relay) as fine:  # and the relay still answers
            fine.sendall(b"GET /api/v1/namespaces HTTP/1.1\r\nAuthorization: Bearer %s\r\nHost: x\r\n\r\n"
                         % relay.token.encode())
            assert head(fine.recv(65536)) == "HTTP/1.1 200 OK"
    finally:
        stop.set()
        relay.close()


def test_connections_beyond_the_bound_are_closed_and_the_slots_come_back(cluster):
    relay = Relay(Kube(cluster.kubeconfig), handshake_timeout=60, max_connections=2)
    try:
        held = [socket.create_connection(address(relay)) for _ in range(2)]
        extra = socket.create_connection(address(relay))
        assert closed_by_relay(extra)  # closed at once: the two held ones take every slot
        assert all(still_open(connection) for connection in held)
        for connection in held:
            connection.close()
        deadline = time.monotonic() + 30
        while relay._server.connections and time.monotonic() < deadline:  # their threads see the EOF
            time.sleep(0.02)
        answer = ask(relay, b"GET /version HTTP/1.1\r\nAuthorization: Bearer %s\r\nHost: x\r\nConnection: "
                            b"close\r\n\r\n" % relay.token.encode())
        assert head(answer) == "HTTP/1.1 200 OK"
    finally:
        relay.close()


def test_unauthenticated_connections_lose_their_slots_after_the_first_request_deadline(cluster):
    """Any local user can connect: TLS connections that never send the token (silent, or trickling a request) are cut
    after the first-request deadline, though the idle limit is long, so they cannot hold every slot; a connection
    whose request carried the token keeps the idle limit."""
    relay = Relay(Kube(cluster.kubeconfig), handshake_timeout=60, idle_timeout=60, request_timeout=60,
                  first_request_timeout=1, max_connections=3)
    stop = threading.Event()
    try:
        authenticated = tls(relay)
        authenticated.sendall(b"GET /version HTTP/1.1\r\nAuthorization: Bearer %s\r\nHost: x\r\n\r\n"
                              % relay.token.encode())
        assert head(authenticated.recv(65536)) == "HTTP/1.1 200 OK"
        squatters = [tls(relay), slow_loris(relay, stop)]  # with `authenticated`, every slot is taken
        assert all(closed_by_relay(connection, within=20) for connection in squatters)
        assert still_open(authenticated)  # past the first-request deadline: it had proved the token
        deadline = time.monotonic() + 30
        while relay._server.connections > 1 and time.monotonic() < deadline:  # the squatters' threads end
            time.sleep(0.02)
        answer = ask(relay, b"GET /version HTTP/1.1\r\nAuthorization: Bearer %s\r\nHost: x\r\nConnection: "
                            b"close\r\n\r\n" % relay.token.encode())
        assert head(answer) == "HTTP/1.1 200 OK"
        authenticated.close()
    finally:
        stop.set()
        relay.close()


def test_close_returns_while_a_handshake_waits(cluster):
    """With the default time limits: a client that connected and never began TLS does not hold close() up."""
    relay = Relay(Kube(cluster.kubeconfig))
    idle = socket.create_connection(address(relay))
    time.sleep(0.2)  # not a race the test depends on: the connection is accepted before or while close() runs
    closing = threading.Thread(target=relay.close)
    closing.start()
    closing.join(30)
    assert not closing.is_alive(), "close() hangs"
    assert closed_by_relay(idle)


# (not `unit`: the check parses with urllib3, as the request will be sent, and importing urllib3 opens a socket)
@pytest.mark.parametrize("target, taken", [
    ("/api/v1/namespaces?limit=500", True), ("/apis/apps/v1/deployments", True), ("@evil:443/x", False),
    ("//evil/x", False), ("http://evil/x", False), ("*", False), ("/a b", False), ("/x\\@evil", False),
    ("/x#frag", False), ("", False), ("/api/../../x", True)])
def test_only_origin_form_targets_on_the_configured_server(target, taken):
    kube = Kube()
    kube._client, kube._host = object(), "https://10.0.0.1:6443"
    if taken:
        assert kube.upstream_url(target).startswith("https://10.0.0.1:6443/")
    else:
        with pytest.raises(ValueError):
            kube.upstream_url(target)


def test_a_server_under_a_path_keeps_its_prefix():
    kube = Kube()
    kube._client, kube._host = object(), "https://rancher.example.com/k8s/clusters/c-1"
    assert kube.upstream_url("/api/v1/nodes") == "https://rancher.example.com/k8s/clusters/c-1/api/v1/nodes"
    with pytest.raises(ValueError):
        kube.upstream_url("/../../other/api")
