"""The Kubernetes adapter under faults, against the emulator over HTTPS: 503s, 429s with Retry-After and connection
resets are retried within a deadline; a request that is not safe to repeat is not; a server that accepts
connections but never answers fails within the per-request timeout, naming it."""
from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

from gpu_bootstrap.core import interrupts
from gpu_bootstrap.adapters import kube as kube_module
from gpu_bootstrap.adapters.kube import Kube, Ref
from gpu_bootstrap.core.errors import ClusterError, Conflict, Unreachable

UNAVAILABLE = "the server is currently unable to handle the request"
CM = "/api/v1/namespaces/default/configmaps"


@pytest.fixture
def quick_backoff(monkeypatch):
    monkeypatch.setattr(kube_module, "BACKOFF_BASE", 0.01)
    monkeypatch.setattr(kube_module, "BACKOFF_CAP", 0.05)


@pytest.fixture
def kube(cluster) -> Kube:
    return Kube(cluster.kubeconfig)


def configmap(name: str, **data) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
            "data": data}


def answered(emu, method: str, path: str) -> list[int]:
    return [r.status for r in emu.requests.all() if r.method == method and r.path == path]


def test_503s_are_retried(emu, kube, quick_backoff):
    emu.faults.add("GET", r"/api/v1/nodes$", status=503, count=3, message=UNAVAILABLE)
    assert {n["metadata"]["name"] for n in kube.list("v1", "Node")} == {"gpu-1", "gpu-2", "cpu-1"}
    assert answered(emu, "GET", "/api/v1/nodes") == [503, 503, 503, 200] and kube.retries == 3


def test_429_waits_as_long_as_retry_after_asks(emu, kube):
    emu.faults.add("GET", r"/api/v1/nodes/gpu-1$", status=429, count=2, headers={"Retry-After": "1"},
                   message="Too many requests, please try again later.")
    started = time.monotonic()
    assert kube.get("v1", "Node", "gpu-1")["metadata"]["name"] == "gpu-1"
    assert time.monotonic() - started >= 2.0  # two waits of at least the 1 s the server asked for
    assert answered(emu, "GET", "/api/v1/nodes/gpu-1") == [429, 429, 200]


def test_waits_a_429_asked_for_do_not_use_up_the_outage_deadline(emu, cluster):
    """Under API Priority and Fairness a real API server asks a flow it keeps rejecting for ever longer waits (1, 2,
    4, ... 32 s on 1.37, tests/test_faults_real.py): a server that answers is up, so its Retry-After waits have a
    budget of their own (overload_deadline), past the deadline meant for outages."""
    kube = Kube(cluster.kubeconfig, deadline=1.5, overload_deadline=30)
    emu.faults.add("GET", r"/api/v1/nodes/gpu-1$", status=429, count=3, headers={"Retry-After": "1"},
                   message="Too many requests, please try again later.")
    started = time.monotonic()
    assert kube.get("v1", "Node", "gpu-1")["metadata"]["name"] == "gpu-1"
    assert time.monotonic() - started >= 3.0
    assert answered(emu, "GET", "/api/v1/nodes/gpu-1") == [429, 429, 429, 200]


def test_a_429_that_never_ends_fails_at_the_overload_deadline_naming_it(emu, cluster):
    kube = Kube(cluster.kubeconfig, deadline=1, overload_deadline=2.5)
    emu.faults.add("GET", r"/api/v1/nodes/gpu-1$", status=429, count=20, headers={"Retry-After": "1"},
                   message="Too many requests, please try again later.")
    started = time.monotonic()
    with pytest.raises(ClusterError, match="Too many requests.*HTTP 429, 3 attempts"):
        kube.get("v1", "Node", "gpu-1")
    assert time.monotonic() - started < 4
    assert answered(emu, "GET", "/api/v1/nodes/gpu-1") == [429, 429, 429]


def test_resets_are_retried_for_requests_safe_to_repeat(emu, kube, quick_backoff):
    emu.faults.add("GET", r"/configmaps/a$", reset=True, count=2)
    emu.faults.add("PATCH", r"/configmaps/a$", reset=True, count=2)
    kube.apply(configmap("a", k="1"))  # server-side apply: the same request twice is the same result
    assert kube.get("v1", "ConfigMap", "a", "default")["data"] == {"k": "1"}
    assert answered(emu, "PATCH", f"{CM}/a") == [-1, -1, 201]


def test_a_generate_name_create_that_may_have_landed_is_not_repeated(emu, kube, quick_backoff):
    """A repeat could make a second object: the error names the request and the cause instead."""
    emu.faults.add("POST", r"/configmaps$", reset=True, count=1)
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "b-", "namespace": "default"}}
    with pytest.raises(Unreachable, match=f"cannot reach the Kubernetes API at .*: the server closed the connection "
                                          f"without answering \\(POST {CM}\\)"):
        kube.create(body)
    assert answered(emu, "POST", CM) == [-1]


def landed_then_reset(emu, path: str):
    """A create the server carried out, whose answer was lost on the way back (the connection reset)."""
    def store(request):
        emu.seed(json.loads(request.body))
    return emu.faults.add("POST", path, reset=True, count=1, observe=store)


def test_a_named_create_is_repeated_and_an_answer_lost_after_it_landed_is_read_back(emu, kube, quick_backoff):
    """The name makes a repeat safe: the server refuses a second object (409), and the one it holds is what was
    sent, so it is the one the lost attempt created."""
    landed_then_reset(emu, r"/configmaps$")
    created = kube.create(configmap("b", k="1"))
    assert created["metadata"]["name"] == "b" and created["data"] == {"k": "1"}
    assert answered(emu, "POST", CM) == [-1, 409]
    emu.faults.add("POST", r"/configmaps$", reset=True, count=1)  # this time it did not land: the repeat creates
    kube.create(configmap("b2"))
    assert answered(emu, "POST", CM)[-2:] == [-1, 201]


def test_a_named_create_after_a_lost_answer_still_conflicts_with_someone_elses_object(emu, kube, quick_backoff):
    def someone_else_creates_it(_request):
        emu.seed(configmap("b", k="theirs"))
    emu.faults.add("POST", r"/configmaps$", reset=True, count=1, observe=someone_else_creates_it)
    with pytest.raises(Conflict):
        kube.create(configmap("b", k="ours"))
    assert emu.get("configmaps", "b", "default")["data"] == {"k": "theirs"}


def test_a_named_create_conflicting_at_once_is_not_read_back(emu, kube):
    emu.seed(configmap("b", k="1"))
    with pytest.raises(Conflict):
        kube.create(configmap("b", k="1"))  # no attempt was lost: an object that was there already is a conflict
    assert answered(emu, "POST", CM) == [409]


def test_the_lock_is_taken_when_the_answer_to_its_create_was_lost(cluster, emu, kube, quick_backoff):
    from gpu_bootstrap.pipeline.lock import LEASE, Lock
    emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-bootstrap"}})
    landed_then_reset(emu, r"/leases$")
    lock = Lock(kube)
    lock.acquire()
    try:
        assert emu.get("leases", LEASE, "gpu-bootstrap")["spec"]["holderIdentity"] == lock.holder
        assert [r.status for r in emu.requests.all() if r.method == "POST"] == [-1, 409]
    finally:
        lock.release()


def test_a_create_refused_with_429_is_repeated(emu, kube, quick_backoff):
    """429 means the request was not processed: even a POST may go again."""
    emu.faults.add("POST", r"/configmaps$", status=429, count=1, message="Too many requests, please try again later.")
    kube.create(configmap("c"))
    assert answered(emu, "POST", CM) == [429, 201]


def test_a_5xx_with_retry_after_is_repeated_whatever_the_verb(emu, kube, quick_backoff):
    """With Retry-After the server says it did not process the request and when to come back (client-go repeats
    these for every verb); without it, a request that is not safe to repeat is not."""
    emu.faults.add("POST", r"/configmaps$", status=503, count=1, message=UNAVAILABLE, headers={"Retry-After": "0"})
    kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "c-", "namespace": "default"}})
    assert answered(emu, "POST", CM) == [503, 201]
    emu.faults.add("POST", r"/configmaps$", status=503, count=1, message=UNAVAILABLE)
    with pytest.raises(ClusterError, match="HTTP 503|unable to handle"):
        kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"generateName": "c-", "namespace": "default"}})
    assert answered(emu, "POST", CM)[-1] == 503


def test_a_dry_run_is_repeated_after_a_reset(emu, kube, quick_backoff):
    """A dry run stores nothing, so even a POST may go again."""
    emu.faults.add("POST", r"/configmaps$", reset=True, count=2)
    kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "d-", "namespace": "default"}},
                dry_run=True)
    assert answered(emu, "POST", CM) == [-1, -1, 201]
    assert [c for c in emu.list("configmaps", "default") if c["metadata"]["name"].startswith("d-")] == []


def test_an_api_that_keeps_failing_is_given_up_at_the_deadline_naming_its_answer(cluster, emu, quick_backoff):
    emu.faults.add("GET", r"/api/v1/nodes$", status=503, count=None, message=UNAVAILABLE)
    kube = Kube(cluster.kubeconfig, deadline=2)
    started = time.monotonic()
    with pytest.raises(ClusterError) as caught:
        kube.list("v1", "Node")
    assert time.monotonic() - started < 10
    assert caught.value.status == 503
    assert caught.value.message.startswith(f"GET /api/v1/nodes failed: {UNAVAILABLE} (HTTP 503, ")
    assert len(answered(emu, "GET", "/api/v1/nodes")) > 2


def test_random_503s_and_resets_on_every_request(cluster, emu, quick_backoff):
    """20 % of all requests fail (seeded): reads, applies, merge patches, updates and deletes all get through."""
    emu.faults.add("*", r"/configmaps", status=503, count=None, probability=0.15, message=UNAVAILABLE)
    emu.faults.add("*", r"/configmaps", reset=True, count=None, probability=0.05)
    kube = Kube(cluster.kubeconfig)
    for i in range(10):
        kube.apply(configmap(f"r{i}", n=str(i)))
        kube.patch(Ref("v1", "ConfigMap", f"r{i}", "default"), {"data": {"patched": "yes"}})
        current = kube.get("v1", "ConfigMap", f"r{i}", "default")
        current["data"]["updated"] = "yes"
        kube.update(current)
    assert sorted(c["metadata"]["name"] for c in kube.list("v1", "ConfigMap", "default")
                  if c["metadata"]["name"].startswith("r")) == [f"r{i}" for i in range(10)]
    for i in range(10):
        kube.delete(Ref("v1", "ConfigMap", f"r{i}", "default"))
    assert kube.retries > 0
    assert [c for c in emu.list("configmaps", "default") if c["metadata"]["name"].startswith("r")] == []


@pytest.fixture
def silent_server():
    """Accepts TCP connections (and keeps them) but never says a word: not even the TLS handshake."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    kept, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                kept.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for connection in kept:
        connection.close()
    server.close()


def test_a_server_that_accepts_but_never_answers_fails_within_the_deadline(cluster, silent_server):
    """Handshakes that never end are repeated until the deadline (a starting API server looks the same, see the
    next test), then named."""
    kubeconfig = cluster.kubeconfig.with_name("silent")
    kubeconfig.write_text(cluster.kubeconfig.read_text().replace(cluster.emu.address, f"127.0.0.1:{silent_server}"))
    kube = Kube(kubeconfig, request_timeout=1.5, connect_timeout=1.0, deadline=4.0)
    started = time.monotonic()
    with pytest.raises(Unreachable) as caught:
        kube.version()
    took = time.monotonic() - started
    assert took < 4.0 + 1.0 + 3  # the deadline, one last handshake's timeout, slack
    # the last handshake gets what is left of the deadline: 1 s, or less on a machine too busy to start it at once
    assert re.search(rf"127\.0\.0\.1:{silent_server}: timed out after (1|0\.\d+) s connecting \(TCP/TLS handshake\)",
                     caught.value.message), caught.value.message
    assert kube.requests >= 2


@pytest.fixture
def late_server(cluster):
    """Like a kube-apiserver that was just restarted: its port accepts connections at once, but no TLS handshake
    is answered until `opens` is set (it serves only once started); from then on it relays to the emulator."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    host, port = cluster.emu.address.rsplit(":", 1)
    opens, stop, kept = threading.Event(), threading.Event(), []

    def pump(source, target):
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, target):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve(client):
        opens.wait()
        if stop.is_set():
            return
        upstream = socket.create_connection((host, int(port)))
        kept.append(upstream)
        threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
        pump(upstream, client)

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                client = server.accept()[0]
            except OSError:
                continue
            kept.append(client)
            threading.Thread(target=serve, args=(client,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], opens
    stop.set()
    opens.set()
    thread.join()
    for connection in kept:
        connection.close()
    server.close()


def test_an_api_server_that_answers_handshakes_only_after_a_while_is_waited_for(cluster, late_server, quick_backoff):
    """A CI run of the fault tests: kube-apiserver restarted mid-`up`, its port open and its handshakes unanswered
    for tens of seconds; two connect timeouts in a row ended the request well inside its deadline, and the run.
    Connect timeouts are bounded by the deadline only."""
    port, opens = late_server
    kubeconfig = cluster.kubeconfig.with_name("late")
    kubeconfig.write_text(cluster.kubeconfig.read_text().replace(cluster.emu.address, f"127.0.0.1:{port}"))
    kube = Kube(kubeconfig, request_timeout=2.0, connect_timeout=0.5, deadline=30.0)
    timer = threading.Timer(2.5, opens.set)  # several handshakes time out first
    timer.start()
    try:
        assert kube.version()["major"]
    finally:
        timer.cancel()
    assert kube.requests >= 3


def test_an_api_that_never_answers_a_request_fails_within_the_timeout(cluster, emu):
    """TLS works, the HTTP answer never comes."""
    emu.faults.add("GET", r"^/version$", delay=30, count=None)
    kube = Kube(cluster.kubeconfig, request_timeout=1)
    started = time.monotonic()
    with pytest.raises(Unreachable) as caught:
        kube.version()
    assert time.monotonic() - started < 2 * 1 + 3
    assert "timed out after 1 s waiting for an answer" in caught.value.message


def test_after_a_signal_requests_give_up_when_the_shutdown_budget_is_spent(cluster, emu, monkeypatch):
    emu.faults.add("GET", r"^/version$", delay=30, count=None)
    monkeypatch.setattr(interrupts, "cleanup_deadline", lambda: started + 1.0)
    monkeypatch.setattr(interrupts, "signal_name", lambda signum=None: "SIGTERM")
    kube = Kube(cluster.kubeconfig)
    started = time.monotonic()
    with pytest.raises(Unreachable):
        kube.version()
    assert time.monotonic() - started < 3
    with pytest.raises(Unreachable, match="not sent: shutting down after SIGTERM"):
        kube.version()
