"""Preflight without SSH: the probe pods through the emulated API, its pods run by the emulator's kubelet
stand-in against the same chrooted node trees the sshd tests serve (tests/nodes), so the probe script really runs on
both paths and their facts can be compared."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.probes import incluster
from tests.kubeapi import Emulator, pod_security
from tests.nodes import scenarios
from tests.nodes.farm import NodeFarm
from tests.tools import tool_env

pytestmark = pytest.mark.tools
ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
PROBE_SELECTOR = "gpu-bootstrap.io/component=node-probe"


def doctor(config: Path, folder: Path, *args: str):
    result = runner.invoke(app, ["doctor", "-c", str(config), "-o", "json", *args, "--log-file",
                                 str(folder / "log")])
    assert result.stdout.startswith("{"), result.output
    return result, json.loads(result.stdout)


def facts(document: dict) -> dict:
    """Node facts and verdicts by node, without where they came from."""
    return {n["name"]: [{k: v for k, v in c.items()} for c in n["checks"]] for n in document["nodes"]}


def probe_leftovers(emu: Emulator) -> list:
    return [ns["metadata"]["name"] for ns in emu.list("namespaces", label_selector=PROBE_SELECTOR)] + [
        p["metadata"]["name"] for p in emu.list("pods") if p["metadata"]["namespace"].startswith("gpu-bootstrap-probe")]


def gone(emu: Emulator, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not probe_leftovers(emu):
            return True
        time.sleep(0.05)
    return False


class Fleet:
    """sshd nodes (farm) that are also the emulated cluster's nodes, their trees attached to its kubelet."""

    def __init__(self, folder: Path, nodes: dict, extra: str = "", **emulator):
        self.farm = NodeFarm()
        for name, scenario in nodes.items():
            self.farm.add(name, scenario)
        self.emu = Emulator(gpu_nodes=list(nodes), **emulator).start()
        self.kubelet = self.emu.kubelet()
        for name in nodes:
            self.kubelet.attach(name, self.farm.nodes[name].root)
        kubeconfig = self.emu.write_kubeconfig(folder / "kubeconfig")
        self.config = self.farm.config_yaml(folder / "gpu-bootstrap.yaml", self.farm.known_hosts(folder / "known"),
                                            kubeconfig=kubeconfig, extra=extra)

    def close(self):
        self.emu.stop()
        self.farm.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = Fleet(tmp_path_factory.mktemp("fleet"), scenarios.SCENARIOS)
    yield fleet
    fleet.close()


@pytest.fixture(scope="module")
def both(fleet, tmp_path_factory):
    folder = tmp_path_factory.mktemp("doctor")
    _, over_ssh = doctor(fleet.config, folder, "--via", "ssh")
    result, through_cluster = doctor(fleet.config, folder, "--via", "cluster")
    return over_ssh, through_cluster, result


@pytest.mark.parametrize("scenario", list(scenarios.SCENARIOS))
def test_cluster_probe_reports_what_ssh_reports(both, scenario):
    over_ssh, through_cluster, _result = both
    assert facts(through_cluster)[scenario] == facts(over_ssh)[scenario]
    sources = {n["name"]: n["source"] for n in through_cluster["nodes"]}
    assert sources[scenario] == "cluster"
    assert {n["name"]: n["source"] for n in over_ssh["nodes"]}[scenario] == "ssh"


def test_cluster_probe_ran_on_every_node_and_left_nothing(fleet, both):
    ran = {node for node, _pod, container in fleet.kubelet.executed if container == "probe"}
    assert ran == set(scenarios.SCENARIOS)
    assert gone(fleet.emu), probe_leftovers(fleet.emu)


def test_the_probe_pod_is_read_only_tolerant_and_targeted(fleet, tmp_path):
    """What the cluster is asked to run: hostPath / read-only, every taint tolerated, nodes by name, privileged
    namespace of ours; and the probe cannot write to the host (the stand-in mounts /host read-only)."""
    manifest = incluster.pod_manifest("abcd1234", "n1", 0, "busybox:1.37.0")
    spec = manifest["spec"]
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert {"name": "host", "hostPath": {"path": "/", "type": "Directory"}} in spec["volumes"]
    assert {"name": "host", "mountPath": "/host", "readOnly": True} in spec["initContainers"][0]["volumeMounts"]
    assert spec["nodeName"] == "n1" and "affinity" not in spec
    labels = incluster.namespace_manifest("abcd1234", "h:1", 0)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["app.kubernetes.io/managed-by"] == "gpu-bootstrap"
    for node in fleet.farm.nodes.values():
        assert not (node.root / "gb").exists() and not list(node.root.glob("tmp/gb*"))


# --- unknown is not absent ---------------------------------------------------------------------------------------
@pytest.fixture
def small(tmp_path):
    fleet = Fleet(tmp_path, {"good": scenarios.healthy_h100, "other": scenarios.driver_missing},
                  extra="preflight: {timeout: 3}\n")
    yield fleet
    fleet.close()


def unknown_reasons(document: dict) -> dict:
    out = {}
    for node in document["nodes"]:
        checks = {c["id"]: c for c in node["checks"]}
        if checks["ssh"]["status"] == "fail":
            assert all(checks[i]["status"] == "skip" for i in checks if i != "ssh"), checks
            assert checks["nvidia-driver"]["data"] == {}  # unknown: no "driver_version: None" that reads as absent
            out[node["name"]] = checks["ssh"]["message"]
    return out


def test_a_notready_node_is_unknown_with_its_reason_within_the_timeout(small, tmp_path):
    small.emu.set_node_not_ready("other")
    started = time.monotonic()
    result, document = doctor(small.config, tmp_path, "--via", "cluster")
    assert time.monotonic() - started < 3 + 8
    assert result.exit_code == 1
    reasons = unknown_reasons(document)
    assert list(reasons) == ["other"] and "NotReady" in reasons["other"] and "NodeStatusUnknown" in reasons["other"]
    assert {c["id"]: c["status"] for c in document["nodes"][0]["checks"]}["nvidia-driver"] == "pass"
    assert gone(small.emu), probe_leftovers(small.emu)


def test_an_unpullable_image_names_the_image_and_the_setting(small, tmp_path):
    small.kubelet.unpullable.add("registry.invalid/busybox:1.37.0")
    small.config.write_text(small.config.read_text().replace(
        "preflight: {timeout: 3}", "preflight: {timeout: 3, image: registry.invalid/busybox:1.37.0}"))
    result, document = doctor(small.config, tmp_path, "--via", "cluster")
    reasons = unknown_reasons(document)
    assert result.exit_code == 1 and set(reasons) == {"good", "other"}
    for reason in reasons.values():
        assert "registry.invalid/busybox:1.37.0 cannot be pulled" in reason and "preflight.image" in reason
        assert "ErrImagePull" in reason
    assert gone(small.emu), probe_leftovers(small.emu)


def test_an_emulator_that_runs_no_pods_gives_unknown_not_absent(small, tmp_path):
    small.emu.controllers.disable("kubelet")
    started = time.monotonic()
    result, document = doctor(small.config, tmp_path, "--via", "cluster")
    assert time.monotonic() - started < 3 + 8
    reasons = unknown_reasons(document)
    assert result.exit_code == 1 and set(reasons) == {"good", "other"}
    assert all("did not finish within preflight.timeout (3s)" in r for r in reasons.values()), reasons
    assert gone(small.emu), probe_leftovers(small.emu)


def test_a_cluster_refusing_hostpath_gets_one_clear_error(small, tmp_path):
    """A policy engine (here a real ValidatingAdmissionPolicy, run by the emulator's CEL runtime) denies hostPath."""
    small.emu.seed({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                    "metadata": {"name": "no-hostpath"},
                    "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [{
                        "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                        "resources": ["pods"]}]},
                        "validations": [{"expression": "!has(object.spec.volumes) || "
                                                       "object.spec.volumes.all(v, !has(v.hostPath))",
                                         "message": "hostPath volumes are forbidden"}]}})
    small.emu.seed({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                    "metadata": {"name": "no-hostpath"},
                    "spec": {"policyName": "no-hostpath", "validationActions": ["Deny"]}})
    result = runner.invoke(app, ["doctor", "-c", str(small.config), "--via", "cluster", "--log-file",
                                 str(tmp_path / "log")])
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert "refused the node probe's pod" in text and "hostPath volumes are forbidden" in text, text
    assert "preflight.via: ssh" in text and "--preflight-report" in text
    assert gone(small.emu), probe_leftovers(small.emu)


# --- interruptions converge --------------------------------------------------------------------------------------
def start_doctor(config: Path, folder: Path) -> subprocess.Popen:
    env = tool_env()
    return subprocess.Popen([sys.executable, "-m", "gpu_bootstrap", "doctor", "-c", str(config), "--via", "cluster",
                             "-o", "json", "--log-file", str(folder / "killed.log")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def wait_for_probe_pods(emu: Emulator, process: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if any(p["metadata"]["namespace"].startswith("gpu-bootstrap-probe") for p in emu.list("pods")):
            return
        time.sleep(0.05)
    raise AssertionError(f"no probe pods appeared: {process.poll()}")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_an_interrupted_probe_converges_on_the_next_run(small, tmp_path, sig):
    small.config.write_text(small.config.read_text().replace("preflight: {timeout: 3}", "preflight: {timeout: 30}"))
    _, before = doctor(small.config, tmp_path, "--via", "cluster")
    small.kubelet.delay = 60.0  # the probe pods take their time: the run is surely inside the probe
    process = start_doctor(small.config, tmp_path)
    wait_for_probe_pods(small.emu, process)
    process.send_signal(sig)
    process.wait(timeout=15)
    if sig == signal.SIGTERM:
        assert process.returncode == 143
        assert gone(small.emu), probe_leftovers(small.emu)  # removed on the way out
    else:
        assert probe_leftovers(small.emu)  # kill -9: nothing could clean up
    small.kubelet.delay = 0.0
    _, after = doctor(small.config, tmp_path, "--via", "cluster")
    assert facts(after) == facts(before)
    assert gone(small.emu), probe_leftovers(small.emu)


def test_teardown_removes_what_a_killed_probe_left(small, tmp_path):
    small.kubelet.delay = 60.0
    process = start_doctor(small.config, tmp_path)
    wait_for_probe_pods(small.emu, process)
    process.kill()
    process.wait(timeout=15)
    assert probe_leftovers(small.emu)
    result = runner.invoke(app, ["teardown", "-c", str(small.config), "--only", "preflight", "--yes", "-o", "json",
                                 "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 0, result.output
    assert gone(small.emu), probe_leftovers(small.emu)


def test_an_oversized_result_is_reported_never_cut(small, tmp_path):
    """A node whose runtime configs do not compress into the termination messages: unknown with the reason, the
    other node's facts unaffected (the kubelet stand-in cuts messages exactly as the kubelet does)."""
    import secrets
    # the healthy node must finish however busy the machine is: only the other one is to be unknown
    small.config.write_text(small.config.read_text().replace("preflight: {timeout: 3}", "preflight: {timeout: 60}"))
    tree = small.farm.nodes["other"].root
    (tree / "etc/containerd/conf.d").mkdir(parents=True, exist_ok=True)
    noise = "\n".join(f"# {secrets.token_hex(60)}" for _ in range(120))  # ~15 KB that gzip cannot shrink much
    (tree / "etc/containerd/conf.d/99-big.toml").write_text(noise)
    result, document = doctor(small.config, tmp_path, "--via", "cluster")
    reasons = unknown_reasons(document)
    assert list(reasons) == ["other"] and "too large for the termination messages" in reasons["other"], reasons
    assert "preflight.via: ssh" in reasons["other"]
    _, over_ssh = doctor(small.config, tmp_path, "--via", "ssh")
    assert facts(over_ssh)["good"] == facts(document)["good"]


def test_up_records_the_cluster_probes_facts_like_an_ssh_preflight(small, tmp_path):
    from gpu_bootstrap.probes.report import RECORD_NAME, RECORD_NAMESPACE
    result = runner.invoke(app, ["up", "-c", str(small.config), "--only", "preflight", "--via", "cluster", "-o",
                                 "json", "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 0, result.output
    record = small.emu.get("configmaps", RECORD_NAME, RECORD_NAMESPACE)
    assert record["data"]["source"] == "cluster"
    recorded = json.loads(record["data"]["nodes.json"])
    _, document = doctor(small.config, tmp_path, "--via", "ssh")
    assert facts(recorded) == facts(document)
    assert {n["source"] for n in recorded["nodes"]} == {"cluster"}
    assert gone(small.emu), probe_leftovers(small.emu)


def test_pods_refused_by_pod_security_get_one_clear_error(small, tmp_path):
    """A policy engine that resets every new namespace's Pod Security label to baseline: the emulator's Pod Security
    admission (the real plugin's rules and words) refuses the probe's pods, and the run says so once."""
    def baseline(request):
        namespace = request.path.split("/namespaces/")[1].split("/")[0]
        found = small.emu.get("namespaces", namespace)
        found["metadata"]["labels"][pod_security.ENFORCE] = "baseline"
        small.emu.seed(found)

    small.emu.faults.add("POST", r"/namespaces/gpu-bootstrap-probe-[0-9a-f]+/configmaps$", observe=baseline)
    result = runner.invoke(app, ["doctor", "-c", str(small.config), "--via", "cluster", "--log-file",
                                 str(tmp_path / "log")])
    text = " ".join(result.output.split())
    assert result.exit_code == 1
    assert "refused the node probe's pod" in text and 'violates PodSecurity "baseline:latest"' in text, text
    assert not [p for p in small.emu.list("pods") if p["metadata"]["namespace"].startswith("gpu-bootstrap-probe")]


def answer_probed(emu: Emulator, names: list[str], workers: int) -> None:
    """The kubelet stand-in answers every node's probe pod with the canned result "probed"."""
    kubelet = emu.kubelet(workers=workers)
    slices = dict(zip(["probe"] + [f"result-{i}" for i in range(1, incluster.SLICES)], incluster.encode("probed\n")))
    for name in names:
        kubelet.canned[name] = {container: (0, message) for container, message in slices.items()}


@pytest.mark.tools
def test_every_probe_request_is_the_same_size_whatever_the_fleets(tmp_path):
    """One pod bound to each node by name: no request (and no stored object) grows with the node count, so the etcd
    request limit never caps the fleet and listing the pods grows linearly, not with its square. (A DaemonSet needs a
    nodeSelectorTerm per node, since a node field selector takes one value, and copies them into every pod.)
    Canned results from the kubelet stand-in: what is measured is what the tool sends."""
    from gpu_bootstrap.adapters.cluster_probe import ClusterProbe
    from gpu_bootstrap.adapters.kube import Kube
    largest = {}
    for count in (3, 300):
        names = [f"gpu-{i:04d}" for i in range(count)]
        emu = Emulator(gpu_nodes=names).start()
        try:
            answer_probed(emu, names, workers=8)
            kube = Kube(emu.write_kubeconfig(tmp_path / f"kubeconfig-{count}"))
            outcomes = ClusterProbe(kube, "busybox:1.37.0", 60).run(names, "echo probed\n")
            assert {name: outcome.output for name, outcome in outcomes.items()} == {n: "probed\n" for n in names}
            largest[count] = max(len(request.body) for request in emu.requests.writes())
        finally:
            emu.stop()
    assert largest[300] <= largest[3] + 8, largest  # the node names' length at most


@pytest.mark.tools
@pytest.mark.parametrize("watch_fault", ["none", "reset", "forbidden"])
def test_the_probe_lists_its_pods_once_and_watches_them_and_still_reads_every_node_when_the_watch_fails(
        tmp_path, watch_fault):
    """A fleet's probe pods each carry up to 9 KiB of results: they are listed once and then watched, not listed
    again and again. A watch that gets no answer is followed by a LIST and a new watch (a little later each time); an
    identity that may list but not watch pods (a role from before the probe watched) is polled with LISTs. Each way, every node's result is read.
    Canned results from the kubelet stand-in: what is measured is what the tool sends."""
    from gpu_bootstrap.adapters.cluster_probe import ClusterProbe
    from gpu_bootstrap.adapters.kube import Kube
    names = [f"gpu-{i:04d}" for i in range(200)]
    emu = Emulator(gpu_nodes=names).start()
    try:
        answer_probed(emu, names, workers=4)
        if watch_fault == "reset":
            emu.faults.add("GET", r"/namespaces/gpu-bootstrap-probe-[0-9a-f]+/pods$", query="watch=true", reset=True,
                           count=None)
        if watch_fault == "forbidden":
            emu.faults.add("GET", r"/namespaces/gpu-bootstrap-probe-[0-9a-f]+/pods$", query="watch=true",
                           status=403, count=None, message='pods is forbidden: cannot watch resource "pods"')
        kube = Kube(emu.write_kubeconfig(tmp_path / "kubeconfig"))
        outcomes = ClusterProbe(kube, "busybox:1.37.0", 60).run(names, "echo probed\n")
        assert {name: outcome.output for name, outcome in outcomes.items()} == {n: "probed\n" for n in names}
        reads = [r for r in emu.requests.matching("GET", "/pods") if "gpu-bootstrap-probe-" in r.path]
        lists = [r for r in reads if r.query.get("watch") != "true"]
        watches = [r for r in reads if r.query.get("watch") == "true"]
    finally:
        emu.stop()
    if watch_fault == "none":
        assert len(lists) == 1 and 1 <= len(watches) <= 2, (len(lists), len(watches))
    elif watch_fault == "reset":  # each unanswered watch: a LIST, then (unless every pod had ended) a watch again
        assert len(watches) >= 1 and len(lists) in (len(watches), len(watches) + 1), (len(lists), len(watches))
    else:
        assert len(watches) == 1 and len(lists) >= 2, (len(lists), len(watches))
