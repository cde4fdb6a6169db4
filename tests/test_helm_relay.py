"""helm's relay (gpu_bootstrap/adapters/relay.py), with the real helm and kubectl against the emulator: a write whose
connection is reset fails helm on its own and is repeated through the relay; watches stream; the relay answers only
its own token; its kubeconfig is private and gone when it stops; a create that landed before its answer was lost is
read back, not refused."""
from __future__ import annotations

import json
import os
import ssl
import stat
import subprocess
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
