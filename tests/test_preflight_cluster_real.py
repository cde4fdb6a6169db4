"""The in-cluster node probe on the real API server of the local cluster (tests/localcluster).

Real: the API server (admission, Pod Security on the probe's privileged namespace, the probe identity's policy)
taking one pod per selected node, bound by name, and the namespace controller that removes everything when the probe
deletes its namespace. Fake, because there is no container runtime here: the
kubelet. For three nodes this test adds (nodes.TREE_NODES) the agent's kubelet stand-in (probe_kubelet.py, the
emulator's kubelet_sim.py writing through the real API) really runs the probe pods' init containers against the same
chrooted node trees the sshd tests serve (tests/nodes), so the facts read through the cluster can be compared with
those read over SSH; the other nodes are KWOK's, which runs nothing.
"""
from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from tests.nodes import scenarios
from tests.nodes.farm import NodeFarm

pytestmark = [pytest.mark.tools, pytest.mark.xdist_group("live-api")]
runner = CliRunner()
PROBE_SELECTOR = "gpu-bootstrap.io/component=node-probe"
TIMEOUT = 20  # preflight.timeout


@pytest.fixture(scope="module")
def trees(tmp_path_factory, request):
    """tree-1 (8×H100, driver installed, as busy as a DGX at its pod limit) and tree-2 (no driver) with file trees
    and sshd; tree-3 admits no pod (capacity pods: 0), so its kubelet refuses the probe pod."""
    from tests.conftest import local_cluster_wanted
    if not local_cluster_wanted():
        pytest.skip("the local cluster is not built (scripts/install-test-tools); GPU_BOOTSTRAP_LIVE_TARGET=emulator")
    from tests.localcluster import nodes
    from tests.localcluster.probe_kubelet import TREES_FILE
    cluster = request.getfixturevalue("local_cluster")
    folder = tmp_path_factory.mktemp("probe")
    farm = NodeFarm()
    api = cluster.admin()
    trees_file = cluster.folder / TREES_FILE
    try:
        farm.add("tree-1", scenarios.busy_h100)  # 2,600 processes: the result must still fit the pod's messages
        farm.add("tree-2", scenarios.driver_missing)
        trees_file.write_text(json.dumps({name: str(node.root) for name, node in farm.nodes.items()}))
        for index, (name, gpus, pods) in enumerate((("tree-1", 8, 110), ("tree-2", 4, 110), ("tree-3", 4, 0))):
            api.create("/api/v1/nodes", nodes.tree_node(name, gpus, f"198.19.255.{10 + index}", pods))
        wait(lambda: all(ready(api.get(f"/api/v1/nodes/{n}")) for n in ("tree-1", "tree-2", "tree-3")), 60,
             "KWOK did not make the added nodes Ready")
        kubeconfig = cluster.kubeconfig
        known = farm.known_hosts(folder / "known_hosts")
        extra = f"preflight: {{timeout: {TIMEOUT}}}\n"
        over_ssh = farm.config_yaml(folder / "ssh.yaml", known, kubeconfig=kubeconfig, extra=extra)
        through_cluster = farm.config_yaml(folder / "cluster.yaml", known, kubeconfig=kubeconfig, extra=extra)
        through_cluster.write_text(through_cluster.read_text().replace(
            "preflight:", "  - name: tree-3\n    address: 127.0.0.1\n    port: 1\npreflight:"))
        yield cluster, api, over_ssh, through_cluster, folder
    finally:
        for name in ("tree-1", "tree-2", "tree-3"):
            api.delete(f"/api/v1/nodes/{name}")
        trees_file.unlink(missing_ok=True)
        farm.close()


def ready(node: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))


def wait(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(what)


def doctor(config, folder, via: str) -> tuple:
    result = runner.invoke(app, ["doctor", "-c", str(config), "-o", "json", "--via", via, "--log-file",
                                 str(folder / f"{via}.log")])
    assert result.stdout.startswith("{"), result.output
    return result, json.loads(result.stdout)


def checks(document: dict) -> dict:
    return {n["name"]: n["checks"] for n in document["nodes"]}


def probe_leftovers(api) -> list:
    namespaces = api.get("/api/v1/namespaces", labelSelector=PROBE_SELECTOR)["items"]
    pods = [p for p in api.get("/api/v1/pods")["items"]
            if p["metadata"]["namespace"].startswith("gpu-bootstrap-probe-")]
    return [n["metadata"]["name"] for n in namespaces] + [p["metadata"]["name"] for p in pods]


def test_the_probe_through_the_real_api_reports_what_ssh_reports_and_why_a_refused_node_is_unknown(trees):
    cluster, api, over_ssh, through_cluster, folder = trees
    _, by_ssh = doctor(over_ssh, folder, "ssh")
    result, by_cluster = doctor(through_cluster, folder, "cluster")
    found = checks(by_cluster)
    # the nodes whose pods ran: the same facts and verdicts as over SSH, read from the pods' termination messages
    for name in ("tree-1", "tree-2"):
        assert found[name] == checks(by_ssh)[name], name
        assert {n["name"]: n["source"] for n in by_cluster["nodes"]}[name] == "cluster"
    verdicts = {name: {c["id"]: c["status"] for c in found[name]} for name in ("tree-1", "tree-2")}
    assert verdicts["tree-1"]["nvidia-driver"] == "pass" and verdicts["tree-2"]["nvidia-driver"] != "pass"
    # the node whose kubelet refuses the probe pod: unknown (never "no driver"), with the kubelet's reason
    refused = {c["id"]: c for c in found["tree-3"]}
    assert refused["ssh"]["status"] == "fail" and refused["nvidia-driver"]["status"] == "skip"
    assert refused["nvidia-driver"]["data"] == {}
    assert "kubelet refused the probe pod (OutOfpods" in refused["ssh"]["message"], refused["ssh"]["message"]
    assert "enough resource: pods" in refused["ssh"]["message"], refused["ssh"]["message"]
    assert result.exit_code == 1
    # and nothing of the probe is left: its namespace removed by the real namespace controller, pods and all
    wait(lambda: not probe_leftovers(api), 60, "the probe left objects behind")


def test_the_probe_role_reads_the_nodes_as_an_admin_does_and_doctors_role_runs_no_probe(trees, tmp_path):
    """`rbac --for probe` (node-root-equivalent: its policy lets it write for real only the probe's own namespaces,
    their ConfigMap and pods) reads tree-1 and tree-2 as the admin does; `rbac --for doctor` (kept dry) makes
    no probe at all: the nodes' facts are unknown with the reason, never "no driver"."""
    import base64

    import yaml

    from tests.tools import tool_env, run, tool
    cluster, api, over_ssh, through_cluster, folder = trees

    def kubectl(*args: str, input: str | None = None, check: bool = True):
        return run([tool("kubectl"), "--kubeconfig", str(cluster.kubeconfig), *args], tool_env(tmp_path), 60, check,
                   input)
    _, by_admin = doctor(through_cluster, folder, "cluster")
    found, made = {}, {"gpu-bootstrap-live-probe"}
    try:
        kubectl("create", "namespace", "gpu-bootstrap-live-probe")
        for role in ("probe", "doctor"):
            granted = runner.invoke(app, ["rbac", "--for", role, "-c", str(through_cluster), "--service-account",
                                          f"gpu-bootstrap-live-probe/{role}"])
            assert granted.exit_code == 0, granted.output
            docs = [d for d in yaml.safe_load_all(granted.stdout) if d]
            kubectl("create", "serviceaccount", role, "-n", "gpu-bootstrap-live-probe")
            for namespace in {d["metadata"].get("namespace") for d in docs} - {None}:
                if kubectl("create", "namespace", namespace, check=False).returncode == 0:
                    made.add(namespace)
            kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
            token = kubectl("create", "token", role, "-n", "gpu-bootstrap-live-probe").stdout.strip()
            kubeconfig = folder / f"{role}.kubeconfig"
            kubeconfig.write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "t",
                "clusters": [{"name": "c", "cluster": {"server": cluster.server, "certificate-authority-data":
                                                       base64.b64encode(cluster.ca.read_bytes()).decode()}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u"}}]}))
            time.sleep(2)  # the API server loads a new admission policy a moment after it is stored
            result = runner.invoke(app, ["doctor", "-c", str(through_cluster), "-o", "json", "--via", "cluster",
                                         "--kubeconfig", str(kubeconfig), "--log-file", str(folder / f"{role}.log")])
            found[role] = json.loads(result.stdout)
        for name in ("tree-1", "tree-2"):
            assert checks(found["probe"])[name] == checks(by_admin)[name], name
        refused = {c["id"]: c for c in checks(found["doctor"])["tree-1"]}
        assert refused["nvidia-driver"]["status"] == "skip" and refused["nvidia-driver"]["data"] == {}
        assert "refused the node probe" in json.dumps(found["doctor"]), found["doctor"]
        wait(lambda: not probe_leftovers(api), 60, "the probe left objects behind")
    finally:
        kubectl("delete", "clusterroles,clusterrolebindings,validatingadmissionpolicies,"
                "validatingadmissionpolicybindings", "-l", "app.kubernetes.io/component=rbac", check=False)
        for namespace in made:
            kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False)
