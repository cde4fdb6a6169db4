"""Faults only a real control plane has, met by `gpu-bootstrap up` and `teardown` on the local cluster
(tests/localcluster: etcd, kube-apiserver, kube-controller-manager and kube-scheduler v1.37, KWOK nodes, the agent).

Each case runs the command as a separate process, breaks a component of the cluster at a chosen moment (the moment
is read from the API server: a node patched, a helm release pending, the admission namespace made), lets the run end
as it ends, runs it again, and checks that the cluster reached what an uninterrupted run makes (tests/reliability.py
compares, as the kill matrix does), that the user's objects are untouched and that helm ends deployed with nothing
pending. The reference is made once per module, by an uninterrupted `up` on the same cluster.

The playbook is cut to the steps the faults are about (node-prep, the gpu-operator chart, OPA and its admission):
the monitoring stack and validate add minutes and nothing these faults reach.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.realfaults import OUR_NAMESPACES, RealState, UpRun, helm_releases, kill, record, restart, wait_for
from tests.reliability import converged, differences, view

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.faults, pytest.mark.xdist_group("faults-real")]
STEPS = "node-prep,gpu-operator,admission-opa,admission"
OUTAGE = 3.0  # seconds the API server stays down
RUN_TIMEOUT = 420  # seconds a run may take here, the outage and the retries included
USER_NAMESPACE = "tenant-a"
USER_LABEL = ("team.example.com/owner", "ml-platform")


@dataclass
class Faults:
    cluster: object
    folder: Path
    config: Path
    report: Path
    state: RealState
    reference: dict

    def up(self) -> UpRun:
        return UpRun(["up", "-c", str(self.config), "--only", STEPS, "--preflight-report", str(self.report)],
                     self.folder)

    def teardown(self) -> None:
        ended = UpRun(["teardown", "-c", str(self.config), "--only", STEPS, "--yes"], self.folder).wait(RUN_TIMEOUT)
        assert ended.code == 0, ended.output[-3000:]
        api = self.state.api
        wait_for(lambda: not [n for n in api.get("/api/v1/namespaces")["items"]
                              if n["metadata"]["name"] in OUR_NAMESPACES], 180,
                 "our namespaces to be gone after teardown", interval=0.5)


def plant_user_objects(api) -> None:
    """What a user has in the cluster before gpu-bootstrap: a namespace with a ConfigMap and a Secret, and their own
    label on the GPU nodes."""
    api.create("/api/v1/namespaces", {"metadata": {"name": USER_NAMESPACE}})
    api.create(f"/api/v1/namespaces/{USER_NAMESPACE}/configmaps",
               {"metadata": {"name": "training-config"}, "data": {"epochs": "90"}})
    api.create(f"/api/v1/namespaces/{USER_NAMESPACE}/secrets",
               {"metadata": {"name": "registry-token"}, "stringData": {"token": "user-secret"}})
    for node in ("gpu-1", "gpu-2"):
        api.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {USER_LABEL[0]: USER_LABEL[1]}}})


def user_objects_intact(api) -> list[str]:
    problems = []
    config_map = api.get(f"/api/v1/namespaces/{USER_NAMESPACE}/configmaps/training-config")
    if config_map.get("data") != {"epochs": "90"}:
        problems.append(f"the user's ConfigMap changed: {config_map.get('data')}")
    api.get(f"/api/v1/namespaces/{USER_NAMESPACE}/secrets/registry-token")  # raises when removed
    for node in ("gpu-1", "gpu-2"):
        labels = api.get(f"/api/v1/nodes/{node}")["metadata"].get("labels") or {}
        if labels.get(USER_LABEL[0]) != USER_LABEL[1]:
            problems.append(f"the user's label on {node} is gone")
    return problems


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    from tests.conftest import chart, local_cluster_wanted
    if not local_cluster_wanted():
        pytest.skip("the local cluster is not built (scripts/install-test-tools); GPU_BOOTSTRAP_LIVE_TARGET=emulator")
    from tests.localcluster import cluster as local
    from tests.nodes.reports import write_report
    folder = tmp_path_factory.mktemp("faults-real")
    try:
        cluster = local.up(folder / "cluster", gpu_nodes=3, cpu_nodes=1, die_with_parent=True)
    except local.ClusterError as error:
        pytest.fail(f"the local cluster did not start: {error}")
    try:
        config = folder / "gpu-bootstrap.yaml"
        config.write_text(json.dumps({
            "cluster": {"kubeconfig": str(cluster.kubeconfig)}, "nodes": [{"name": "gpu-1"}, {"name": "gpu-2"}],
            "gpu_operator": {"chart": str(chart("gpu-operator-v26.7.0.tgz")), "wait_timeout": 300},
            "admission": {"wait_timeout": 300}, "monitoring": {"enabled": False}}))
        report = write_report(folder / "report.json", ["gpu-1", "gpu-2"], gpus=4)
        state = RealState(cluster)
        plant_user_objects(state.api)
        found = Faults(cluster, folder, config, report, state, {})
        first = found.up().wait(RUN_TIMEOUT)
        assert first.code == 0, first.output[-3000:]
        found.reference = view(state)
        found.teardown()
        yield found
    finally:
        local.down(folder / "cluster")


def _node_patched(api) -> bool:
    return any("nvidia.com/gpu.present" in (n["metadata"].get("labels") or {})
               and (n["metadata"].get("annotations") or {}).get("gpu-bootstrap.io/node-prep")
               for n in api.get("/api/v1/nodes")["items"])


def _helm_installing(api) -> bool:
    return bool(api.get("/api/v1/namespaces/gpu-operator/secrets", labelSelector="owner=helm,status=pending-install")
                ["items"])


def _admission_applying(api) -> bool:
    return bool(api.get("/api/v1/namespaces", fieldSelector="metadata.name=gpu-bootstrap-admission")["items"])


POINTS = {"node-prep's patches": _node_patched, "helm's install of the gpu-operator chart": _helm_installing,
          "admission being applied": _admission_applying}


@pytest.mark.parametrize("point", list(POINTS))
def test_the_api_server_killed_and_restarted_mid_up_converges(faults, point):
    """A rolling control-plane upgrade, or a crash: kube-apiserver gone for OUTAGE seconds."""
    outage_mid_up(faults, point, "kube-apiserver", OUTAGE)


def test_etcd_stopped_for_20_s_mid_up_converges(faults):
    """etcd gone for 20 s (a leader change that takes long, a restart) while helm installs a chart: the API server
    answers errors or nothing until it is back."""
    outage_mid_up(faults, "helm's install of the gpu-operator chart", "etcd", 20.0)


def outage_mid_up(faults: Faults, point: str, component: str, outage: float) -> None:
    api = faults.state.api
    run = faults.up()
    try:
        wait_for(lambda: POINTS[point](api), RUN_TIMEOUT, f"the run to reach {point}", interval=0.02)
        kill(faults.cluster, component)
        broken = time.monotonic()
        time.sleep(outage)
        restart(faults.cluster, component)
        back = time.monotonic() - broken
        first = run.wait(RUN_TIMEOUT)
        print(f"{component} down {outage:g} s at {point}: the interrupted run ended {first.code} after "
              f"{first.seconds:.0f} s: {((first.document or {}).get('error') or '')[:300]}")
        # shorter than one request's retry deadline (adapters/kube.py DEADLINE, 60 s; helm's requests go through
        # the relay, which repeats them the same way): the run rides it out. With retries switched off it ends 1,
        # "kubernetes cluster unreachable" (tried by hand).
        assert first.code == 0, first.output[-3000:]
        again = faults.up().wait(RUN_TIMEOUT)
        assert again.code == 0, again.output[-3000:]
        left = converged(faults.state, faults.reference, timeout=60)
        assert left == [], differences(faults.reference, view(faults.state), limit=60)
        assert helm_releases(faults.cluster) == {"gpu-operator/gpu-operator": "deployed"}
        assert user_objects_intact(api) == []
        what = "SIGKILL, restarted" if component == "kube-apiserver" else "killed, started again"
        record(f"{component} {what} ({back:.0f} s down)", f"`up`, {point}",
               f"nothing: the run retries and ends 0 ({first.seconds:.0f} s); the next `up` changes nothing",
               time.monotonic() - broken)
    finally:
        if run.running():
            run.kill()
        faults.teardown()


def _admission_undone(api) -> bool:
    hooks = api.get("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations")["items"]
    return not [h for h in hooks if h["metadata"]["name"] == "gpu-bootstrap-gpu-pods"]


def _opa_undone(api) -> bool:
    found = api.get("/api/v1/namespaces", fieldSelector="metadata.name=gpu-bootstrap-admission")["items"]
    return not found or bool(found[0]["metadata"].get("deletionTimestamp"))


def _operator_undone(api) -> bool:
    return not api.get("/api/v1/namespaces/gpu-operator/secrets", labelSelector="owner=helm")["items"]


BOUNDARIES = {"after admission": _admission_undone, "after admission-opa": _opa_undone,
              "after the gpu-operator": _operator_undone}


def test_teardown_killed_at_each_step_boundary_and_run_again_leaves_nothing_of_ours(faults):
    """One `up`, then a teardown killed with -9 as each step's undo ends, each time run again (from where the last
    one stopped), and a last one to the end: nothing of ours is left, the tool's own namespace included, and nothing
    of the user's is removed."""
    api = faults.state.api
    assert faults.up().wait(RUN_TIMEOUT).code == 0
    args = ["teardown", "-c", str(faults.config), "--only", STEPS, "--yes"]
    broken = time.monotonic()
    for boundary, reached in BOUNDARIES.items():
        run = UpRun(args, faults.folder)
        try:
            wait_for(lambda: reached(api), RUN_TIMEOUT, f"the teardown to reach {boundary}", interval=0.02)
        finally:
            run.kill()
    last = UpRun(args, faults.folder).wait(RUN_TIMEOUT)
    assert last.code == 0, last.output[-3000:]
    wait_for(lambda: not [n for n in api.get("/api/v1/namespaces")["items"]
                          if n["metadata"]["name"] in OUR_NAMESPACES], 180, "our namespaces to be gone", interval=0.5)
    # gpu-3 is not in `nodes`: the operator labels it too, and with no record of its labels before the operator,
    # teardown leaves them (they cannot be told from the user's own)
    ours = [key for key, obj in faults.state.snapshot().items() if key != ("/Node", "", "gpu-3")
            if (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") in ("gpu-bootstrap", "Helm")
            or any(k.startswith("gpu-bootstrap.io/") for k in obj["metadata"].get("annotations") or {})
            or "nvidia.com/gpu.present" in (obj["metadata"].get("labels") or {})]
    assert ours == [], json.dumps([faults.state.snapshot()[key]["metadata"]["labels"] for key in ours])
    assert helm_releases(faults.cluster) == {}
    assert user_objects_intact(api) == []
    record("kill -9 of `teardown`, three times", "at each step boundary (after admission, OPA, the gpu-operator)",
           "each rerun goes on where the last stopped; the last ends 0 and nothing of ours is left",
           time.monotonic() - broken)


def test_a_teardown_of_the_steps_an_only_run_made_leaves_no_state(faults):
    """`up --only node-prep,admission-opa` then `teardown --only` of the same steps: the tool's namespace (its
    checkpoint ConfigMap gpu-bootstrap-state) goes too, on the real API server where it was first seen left."""
    api = faults.state.api
    steps = "node-prep,admission-opa"
    up = UpRun(["up", "-c", str(faults.config), "--only", steps, "--preflight-report", str(faults.report)],
               faults.folder).wait(RUN_TIMEOUT)
    assert up.code == 0, up.output[-3000:]
    down = UpRun(["teardown", "-c", str(faults.config), "--only", steps, "--yes"], faults.folder).wait(RUN_TIMEOUT)
    assert down.code == 0, down.output[-3000:]
    started = time.monotonic()
    wait_for(lambda: not api.get("/api/v1/namespaces", fieldSelector="metadata.name=gpu-bootstrap")["items"], 120,
             "the tool's namespace gpu-bootstrap to be gone", interval=0.5)
    assert user_objects_intact(api) == []
    record("none: `up --only node-prep,admission-opa`, then `teardown --only` of the same steps", "teardown",
           "the tool's namespace (its checkpoint ConfigMap) goes too", down.seconds + time.monotonic() - started)


def test_a_node_gone_while_validate_waits_fails_the_run_naming_it_before_the_timeout(faults):
    """gpu-3 leaves the cluster (its Node deleted, as a cloud's node lifecycle controller does for a terminated
    instance) after the gpu-operator step and before validate: its validation pod never starts. `up` exits 1 and
    validate names the node and why, at its next look at the nodes, not at validate.timeout."""
    from tests.localcluster import nodes as node_specs
    from tests.nodes.reports import write_report
    api = faults.state.api
    names = ["gpu-1", "gpu-2", "gpu-3"]
    config = faults.folder / "three-nodes.yaml"
    settings = json.loads(faults.config.read_text())
    config.write_text(json.dumps({**settings, "nodes": [{"name": n} for n in names],
                                  "validate": {"enabled": True, "timeout": RUN_TIMEOUT}}))
    report = write_report(faults.folder / "three-nodes.json", names, gpus=4)
    steps = "node-prep,gpu-operator,validate"
    run = UpRun(["up", "-c", str(config), "--only", steps, "--preflight-report", str(report)], faults.folder)
    try:
        wait_for(lambda: "gpu-operator" in (api.get("/api/v1/namespaces/gpu-bootstrap/configmaps/"
                                                    "gpu-bootstrap-state").get("data") or {}),
                 RUN_TIMEOUT, "the gpu-operator step to be recorded", interval=0.02)
        api.delete("/api/v1/nodes/gpu-3")
        broken = time.monotonic()
        ended = run.wait(RUN_TIMEOUT)
        assert ended.code == 1, ended.output[-3000:]
        validate = {s["id"]: s for s in ended.document["steps"]}["validate"]
        assert validate["status"] == "failed", validate
        assert "gpu-3: the node left the cluster while its validation pod waited" in validate["message"], validate
        assert "gpu-1" not in validate["message"] and "gpu-2" not in validate["message"], validate
        record("a GPU node deleted", "`up`, before validate (its validation pod never starts)",
               f"exit 1: validate says \"gpu-3: the node left the cluster while its validation pod waited\" "
               f"({ended.seconds:.0f} s; validate.timeout is {RUN_TIMEOUT} s)", time.monotonic() - broken)
    finally:
        if run.running():
            run.kill()
        down = UpRun(["teardown", "-c", str(config), "--only", steps, "--yes"], faults.folder).wait(RUN_TIMEOUT)
        assert down.code == 0, down.output[-3000:]
        faults.teardown()
        # the node comes back as it was, after the operator is gone (one that joins while the operator runs gets
        # its labels, and a node with no record of its labels before the operator keeps them at teardown)
        if not api.get("/api/v1/nodes", fieldSelector="metadata.name=gpu-3")["items"]:
            [node] = [n for n in node_specs.objects(faults.cluster.nodes, faults.cluster.network)
                      if n["metadata"]["name"] == "gpu-3"]
            api.create("/api/v1/nodes", node)
