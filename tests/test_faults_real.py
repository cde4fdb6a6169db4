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

from tests.realfaults import (OUR_NAMESPACES, RealState, UpRun, helm_releases, kill, local_cluster, record,
                               restart, wait_for)
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
    from tests.conftest import chart
    from tests.nodes.reports import write_report
    folder = tmp_path_factory.mktemp("faults-real")
    with local_cluster(folder, gpu_nodes=3, cpu_nodes=1) as cluster:
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


# --- API Priority and Fairness: another identity's flood makes the API server answer 429 -------------------------
CI_ACCOUNT = ("gpu-bootstrap-ci", "runner")  # `up` as a deploy job runs it: `rbac --for up`, a TokenRequest token
FLOODER = ("faults-flood", "flooder")
APF_NAME = "faults-tight"
FLOOD_THREADS = 6
FLOODED_UNTIL = 4  # 429s `up` is answered before the flood stops


def told_to_wait(log: Path) -> int:
    """How many times the run was answered 429 (its log says so for each)."""
    return log.read_text().count("HTTP 429") if log.exists() else 0


def kubectl(faults: Faults, *args: str, input: str | None = None) -> str:
    from tests.tools import tool_env, run, tool
    return run([tool("kubectl"), "--kubeconfig", str(faults.cluster.kubeconfig), *args],
               tool_env(faults.folder / "kubectl-home"), 120, True, input).stdout


def token_kubeconfig(faults: Faults, account: tuple[str, str]) -> tuple[Path, str]:
    import base64
    token = kubectl(faults, "create", "token", account[1], "-n", account[0], "--duration=1h").strip()
    path = faults.folder / f"kubeconfig-{account[1]}"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "ci",
        "clusters": [{"name": "local", "cluster": {
            "server": f"https://127.0.0.1:{faults.cluster.ports['apiserver']}",
            "certificate-authority-data": base64.b64encode(faults.cluster.ca.read_bytes()).decode()}}],
        "users": [{"name": "ci", "user": {"token": token}}],
        "contexts": [{"name": "ci", "context": {"cluster": "local", "user": "ci"}}]}))
    path.chmod(0o600)
    return path, token


def grant_up(faults: Faults, others: tuple = (FLOODER,)) -> str:
    """`rbac --for up` applied as its header says (the namespaces first, those not there yet), for CI_ACCOUNT: the
    grant's YAML. `faults`: anything with a cluster, folder and config. `others`: accounts made beside it, no role."""
    import shlex
    import subprocess
    import sys
    from tests.tools import ROOT, tool_env
    text = subprocess.run([sys.executable, "-m", "gpu_bootstrap", "rbac", "--for", "up", "-c", str(faults.config),
                           "--service-account", "/".join(CI_ACCOUNT)], capture_output=True, text=True, check=True,
                          cwd=ROOT, env=tool_env()).stdout
    existing = set(kubectl(faults, "get", "namespaces", "-o", "name").replace("namespace/", "").split())
    for line in text.splitlines():
        if line.startswith("#   kubectl create namespace "):
            commands = [shlex.split(c)[1:] for c in line[len("#   "):].split(" && ")]
            if commands[0][-1] not in existing:
                for command in commands:
                    kubectl(faults, *command)
    for namespace, name in (CI_ACCOUNT, *others):
        if namespace not in existing:
            kubectl(faults, "create", "namespace", namespace)
            kubectl(faults, "create", "serviceaccount", name, "-n", namespace)
    kubectl(faults, "apply", "-f", "-", input=text)
    return text


def tight_priority_level(api) -> None:
    """What an admin does to keep CI jobs from starving the cluster: their identities in a priority level of their
    own, with a small share of the server's concurrency and no queue (a request over it is answered 429)."""
    api.create("/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations", {
        "metadata": {"name": APF_NAME}, "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": 1, "lendablePercent": 0, "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Reject"}}}})
    api.create("/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", {
        "metadata": {"name": APF_NAME}, "spec": {
            "priorityLevelConfiguration": {"name": APF_NAME}, "matchingPrecedence": 100,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount": {"namespace": ns, "name": name}}
                                    for ns, name in (CI_ACCOUNT, FLOODER)],
                       "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                          "clusterScope": True, "namespaces": ["*"]}],
                       "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}})


def flood(faults: Faults, token: str, stop) -> tuple[dict[int, int], list]:
    """FLOOD_THREADS clients of FLOODER listing 200 ConfigMaps of 4 KiB each, as fast as they can, until `stop` is
    set. Returns the answers counted by status (filled while they run) and the threads. Each client keeps its
    connection and reads the answer as bytes: on a loaded machine, a TLS handshake and a JSON parse per request left
    the priority level's seat idle often enough that `up` was never answered 429."""
    import http.client
    import ssl
    import threading
    api = faults.state.api
    for index in range(200):
        api.create(f"/api/v1/namespaces/{FLOODER[0]}/configmaps",
                   {"metadata": {"name": f"bulk-{index:03d}"}, "data": {"payload": "x" * 4096}})
    counts: dict[int, int] = {}
    lock = threading.Lock()
    context = ssl.create_default_context(cafile=str(faults.cluster.ca))
    headers = {"Authorization": f"Bearer {token}", "User-Agent": "flooder", "Accept": "application/json"}

    def loop():
        connection = None
        while not stop.is_set():
            try:
                if connection is None:
                    connection = http.client.HTTPSConnection("127.0.0.1", faults.cluster.ports["apiserver"],
                                                             context=context, timeout=30)
                connection.request("GET", f"/api/v1/namespaces/{FLOODER[0]}/configmaps", headers=headers)
                response = connection.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                status = 0
                if connection is not None:
                    connection.close()
                connection = None
            with lock:
                counts[status] = counts.get(status, 0) + 1
        if connection is not None:
            connection.close()
    threads = [threading.Thread(target=loop, daemon=True) for _ in range(FLOOD_THREADS)]
    for thread in threads:
        thread.start()
    return counts, threads


def rejected_writes(faults: Faults, since: int, user: str) -> dict[str, int]:
    """The writes of `user` the API server answered 429 (its audit log records writes), by user agent."""
    found: dict[str, int] = {}
    with faults.cluster.audit_log.open("rb") as log:
        log.seek(since)
        for line in log:
            event = json.loads(line)
            if event.get("stage") == "ResponseComplete" and (event.get("user") or {}).get("username") == user \
                    and (event.get("responseStatus") or {}).get("code") == 429:
                agent = (event.get("userAgent") or "").split("/")[0]
                found[agent] = found.get(agent, 0) + 1
    return found


def test_an_api_priority_and_fairness_overload_answers_429_and_up_backs_off_and_finishes(faults):
    """`up` as a CI job runs it (`rbac --for up` bound to a ServiceAccount, a TokenRequest token: an admin's
    system:masters requests are exempt from API Priority and Fairness) in a priority level the admin made tight, while
    another identity in it floods the API server with LISTs. The server answers 429 (with Retry-After) to `up` and to
    helm under it; both wait and repeat, and `up` finishes, reaching what an uninterrupted run makes."""
    import threading
    from tests.live.audit import audit_mark
    api = faults.state.api
    user = f"system:serviceaccount:{CI_ACCOUNT[0]}:{CI_ACCOUNT[1]}"
    grant = grant_up(faults)
    stop = threading.Event()
    threads: list = []
    run = None
    try:
        runner, _ = token_kubeconfig(faults, CI_ACCOUNT)
        _, flooder = token_kubeconfig(faults, FLOODER)
        kubectl(faults, "create", "clusterrolebinding", "faults-flooder-view", "--clusterrole=view",
                f"--serviceaccount={FLOODER[0]}:{FLOODER[1]}")
        tight_priority_level(api)
        config = faults.folder / "as-ci.yaml"
        settings = json.loads(faults.config.read_text())
        config.write_text(json.dumps({**settings, "cluster": {"kubeconfig": str(runner)}}))
        mark = audit_mark(faults.cluster)
        counts, threads = flood(faults, flooder, stop)
        wait_for(lambda: counts.get(429, 0) >= 10, 60, "the flood to be limited (answered 429)", interval=0.2)
        started = time.monotonic()
        run = UpRun(["up", "-c", str(config), "--only", STEPS, "--preflight-report", str(faults.report)],
                    faults.folder)
        # the flood lasts until `up` has been answered 429 FLOODED_UNTIL times, as a runaway client's
        # does until someone stops it; `up` meanwhile waits as long as each Retry-After asks (1, 2, 4 ... 32 s)
        wait_for(lambda: not run.running() or told_to_wait(run.log) >= FLOODED_UNTIL, 120,
                 "up to be answered 429", interval=0.2)
        stop.set()
        flood_seconds = time.monotonic() - started
        for thread in threads:
            thread.join(30)
        ended = run.wait(RUN_TIMEOUT)
        rejected = rejected_writes(faults, mark, user)
        waits = told_to_wait(run.log)
        print(f"flood for {flood_seconds:.0f} s: {counts}; up ended {ended.code} after {ended.seconds:.0f} s; "
              f"answered 429 {waits} times, of which writes (audit log): {rejected}")
        assert ended.code == 0, ended.output[-3000:]
        assert counts.get(429, 0) > 0, f"the flood itself was never limited: {counts}"
        assert waits >= FLOODED_UNTIL, "up was not answered 429 often: the overload proved nothing"
        log = run.log.read_text()
        assert log.count("HTTP 429") == log.count("as the server asked (Retry-After)"), \
            "a 429 was repeated sooner than its Retry-After asked"
        kubectl(faults, "delete", "-f", "-", "--ignore-not-found", input=grant)
        left = converged(faults.state, faults.reference, timeout=60)
        assert left == [], differences(faults.reference, view(faults.state), limit=60)
        assert helm_releases(faults.cluster) == {"gpu-operator/gpu-operator": "deployed"}
        assert user_objects_intact(api) == []
        record("API Priority and Fairness: a flood of LISTs by another identity in `up`'s priority level",
               "`up` as a CI ServiceAccount (`rbac --for up`), from its start",
               f"answered 429 {waits} times during a {flood_seconds:.0f} s flood; it waits as each Retry-After asks "
               f"and ends 0 ({ended.seconds:.0f} s)", time.monotonic() - started)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        if run is not None and run.running():
            run.kill()
        for kind in ("flowschemas", "prioritylevelconfigurations"):
            api.delete(f"/apis/flowcontrol.apiserver.k8s.io/v1/{kind}/{APF_NAME}")
        kubectl(faults, "delete", "-f", "-", "--ignore-not-found", input=grant)
        kubectl(faults, "delete", "clusterrolebinding", "faults-flooder-view", "--ignore-not-found")
        for namespace in (CI_ACCOUNT[0], FLOODER[0]):
            kubectl(faults, "delete", "namespace", namespace, "--ignore-not-found", "--wait=false")
        faults.teardown()
