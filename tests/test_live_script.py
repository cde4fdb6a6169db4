"""scripts/test-live against the emulator: its refusal of a cluster that does not look disposable, the fake GPUs it
adds to labelled nodes for the run and takes away afterwards, also when interrupted. The live suite itself is
replaced by a shell command (GPU_BOOTSTRAP_LIVE_PYTEST) that records what it saw; tests/live runs for real in
tests/live (on the emulator) and on kind (examples/ci/live-kind.yaml)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.live.fake_gpus import LABEL, RESOURCE
from tests.tools import tool

pytestmark = pytest.mark.tools
SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "test-live"


@pytest.fixture
def emulator_options():
    return {"cpu_nodes": ["control-plane"]}


@pytest.fixture
def workers(cluster):
    for name in ("worker", "worker2"):
        cluster.emu.add_node(name, labels={LABEL: "true"})
    cluster.emu.add_node("other")  # not labelled: never touched
    return cluster


def kubeconfig(cluster, tmp_path, context: str) -> Path:
    return cluster.emu.write_kubeconfig(tmp_path / f"kubeconfig-{context}", context=context)


def gpus(cluster) -> dict:
    return {n["metadata"]["name"]: (n["status"]["capacity"].get(RESOURCE), n["status"]["allocatable"].get(RESOURCE))
            for n in cluster.emu.list("nodes")}


def start(cluster, config: Path, *args: str, suite: str = "true") -> subprocess.Popen:
    env = {**cluster.env, "KUBECTL": tool("kubectl"), "GPU_BOOTSTRAP_LIVE_PYTEST": suite}
    env.pop("GPU_BOOTSTRAP_LIVE_KUBECONFIG", None)
    return subprocess.Popen([str(SCRIPT), "--kubeconfig", str(config), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.parametrize("context", ["emulator", "prod-eu-1", "my-kind-cluster"])
def test_refuses_a_context_that_does_not_look_disposable(workers, tmp_path, context):
    before = gpus(workers)
    workers.emu.requests.clear()
    process = start(workers, kubeconfig(workers, tmp_path, context), suite=f"touch {tmp_path / 'ran'}")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 2, (out, err)
    assert f"refusing context '{context}'" in err and "--yes" in err and "kind-*" in err
    assert not (tmp_path / "ran").exists()
    assert workers.emu.requests.writes() == [] and gpus(workers) == before


@pytest.mark.parametrize("context, extra", [("kind-live", ()), ("k3d-ci", ()), ("minikube", ()),
                                            ("prod-eu-1", ("--yes",))])
def test_fakes_gpus_on_labelled_nodes_for_the_run_and_takes_them_away(workers, tmp_path, context, extra):
    seen = tmp_path / "seen.json"
    suite = (f'"$KUBECTL" --kubeconfig "$GPU_BOOTSTRAP_LIVE_KUBECONFIG" get nodes -o json > {seen}; '
             f'echo "args: $*"; exit 3')
    process = start(workers, kubeconfig(workers, tmp_path, context), "--gpus", "4", *extra, "--", "-k", "packs",
                    suite=suite)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 3, (out, err)  # the suite's own exit status
    assert "args: -m live -p no:randomly -p no:xdist tests/live -k packs" in out
    during = {n["metadata"]["name"]: n["status"]["allocatable"].get(RESOURCE) for n in json.loads(seen.read_text())["items"]}
    assert during == {"control-plane": None, "worker": "4", "worker2": "4", "other": None}
    assert gpus(workers) == {name: (None, None) for name in during}


def test_an_interrupted_run_still_takes_the_fake_gpus_away(workers, tmp_path):
    started = tmp_path / "started"
    process = start(workers, kubeconfig(workers, tmp_path, "kind-live"), suite=f"touch {started}; exec sleep 120")
    deadline = time.monotonic() + 60
    while not started.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.1)
    assert gpus(workers)["worker"] == ("8", "8")
    os.kill(process.pid, signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode != 0, (out, err)
    assert gpus(workers)["worker"] == (None, None) and gpus(workers)["worker2"] == (None, None)


def test_an_unreachable_cluster_is_named_and_nothing_runs(tmp_path):
    from tests.kubeapi import Emulator
    from tests.tools import tool_env
    with Emulator() as emu:
        config = emu.write_kubeconfig(tmp_path / "kc", context="kind-gone")
    env = {**tool_env(tmp_path), "KUBECTL": tool("kubectl"), "GPU_BOOTSTRAP_LIVE_PYTEST": f"touch {tmp_path / 'ran'}"}
    result = subprocess.run([str(SCRIPT), "--kubeconfig", str(config)], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1 and "cannot reach the cluster of context 'kind-gone'" in result.stderr
    assert not (tmp_path / "ran").exists()
