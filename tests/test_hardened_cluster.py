"""doctor on a hardened cluster (#23), on the emulator (whose Pod Security Admission is proven in
tests/test_pod_security.py) through the real CLI: a server-side dry-run create of a privileged pod in the operator's
namespace and of a restricted pod in ours, and NetworkPolicies that keep the API server from OPA's port."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.security.hardening import blocking_policies
from tests.conftest import chart
from tests.nodes.reports import write_report

runner = CliRunner()
ENFORCE = "pod-security.kubernetes.io/enforce"
OPA_LABELS = {"app.kubernetes.io/managed-by": "gpu-bootstrap", "app.kubernetes.io/name": "opa",
              "app.kubernetes.io/component": "admission"}


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.33.2", "gpu_nodes": ["gpu-1"], "cpu_nodes": ["cpu-1"]}  # (gpu-operator 26.7 needs 1.33)


def doctor(tmp_path: Path, cluster, steps: list[str]) -> dict:
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text("name: hardened\nsteps: [" + ", ".join(steps) + "]\n")
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}}}\nnodes: [{{name: gpu-1}}]\n"
                      f"gpu_operator: {{chart: {chart('gpu-operator-v26.7.0.tgz')}}}\n")
    result = runner.invoke(app, ["doctor", "-c", str(config), "--playbook", str(playbook), "--no-nodes", "-o", "json",
                                 "--log-file", str(tmp_path / "log")])
    assert result.stdout.startswith("{"), result.output
    return json.loads(result.stdout)


def rows(document: dict, name: str) -> list[dict]:
    return [c for c in document["checks"] if c["id"] == name]


@pytest.mark.usefixtures("helm_on_path")
def test_doctor_reports_what_admission_would_reject_before_up_trips_on_it(cluster, tmp_path):
    cluster.kubectl("create", "namespace", "gpu-operator")  # not ours, and enforcing baseline
    cluster.kubectl("label", "namespace", "gpu-operator", f"{ENFORCE}=baseline")
    cluster.kubectl("create", "namespace", "gpu-bootstrap-admission")  # enforcing restricted
    cluster.kubectl("label", "namespace", "gpu-bootstrap-admission", f"{ENFORCE}=restricted",
                    "app.kubernetes.io/managed-by=gpu-bootstrap")
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "default-deny", "namespace": "gpu-bootstrap-admission"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}))
    cluster.emu.requests.clear()
    document = doctor(tmp_path, cluster, ["gpu-operator", "admission-opa", "validate"])
    assert document["ok"] is False
    operator, opa, validation = rows(document, "pod-security")
    assert operator["status"] == "fail"
    assert operator["message"].startswith("admission rejects a privileged pod (like the gpu-operator's driver) in "
                                          "gpu-operator: pods \"gpu-bootstrap-doctor-admission-probe\" is forbidden: "
                                          "violates PodSecurity \"baseline:latest\": host namespaces (hostPID=true)")
    assert operator["message"].endswith("namespace gpu-operator is not gpu-bootstrap's, so up does not relabel it: "
                                        "kubectl label --overwrite namespace gpu-operator "
                                        "pod-security.kubernetes.io/enforce=privileged")
    assert opa == {"id": "pod-security", "status": "pass", "message": (
        "admission accepts a pod that passes the restricted profile (like ours) in gpu-bootstrap-admission "
        "(server-side dry run; pod-security.kubernetes.io/enforce: restricted)")}
    assert validation["status"] == "pass" and "gpu-bootstrap does not exist yet" in validation["message"]
    [network] = rows(document, "network-policy")
    assert network["status"] == "warn"
    assert network["message"].startswith("NetworkPolicy default-deny in gpu-bootstrap-admission selects OPA's pods "
                                         "and admits no traffic to its port 8443")
    probes = [r for r in cluster.emu.requests.all() if r.method == "POST" and r.path.endswith("/pods")]
    assert len(probes) == 2 and all(r.dry_run for r in probes)  # dry runs only: nothing stored
    assert cluster.emu.list("pods", "gpu-operator") == [] and cluster.emu.list("pods", "gpu-bootstrap-admission") == []


DENY = {"metadata": {"name": "deny"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}


def allow(name: str, ports, selector=None, types=("Ingress",)) -> dict:
    spec = {"podSelector": selector or {}, "ingress": [{"ports": ports} if ports is not None else {}]}
    if types is not None:
        spec["policyTypes"] = list(types)
    return {"metadata": {"name": name}, "spec": spec}


@pytest.mark.unit
@pytest.mark.parametrize("policies, blocking", [
    ([], []),
    ([DENY], ["deny"]),
    ([DENY, allow("https", [{"port": 8443}])], []),
    ([DENY, allow("named", [{"port": "https", "protocol": "TCP"}])], []),
    ([DENY, allow("range", [{"port": 8000, "endPort": 9000}])], []),
    ([DENY, allow("any-port", None)], []),  # a rule without ports admits every port
    ([DENY, allow("udp", [{"port": 8443, "protocol": "UDP"}])], ["deny", "udp"]),
    ([DENY, allow("other-port", [{"port": 9090}])], ["deny", "other-port"]),
    ([DENY, allow("other-pods", [{"port": 8443}], {"matchLabels": {"app": "web"}})], ["deny"]),
    ([allow("egress-only", None, types=("Egress",))], []),
    ([{"metadata": {"name": "not-opa"}, "spec": {"podSelector": {"matchExpressions": [
        {"key": "app.kubernetes.io/name", "operator": "NotIn", "values": ["opa"]}]}}}], []),
])
def test_a_network_policy_blocks_opa_only_when_none_admits_its_port(policies, blocking):
    assert blocking_policies(policies, OPA_LABELS, 8443, "https") == blocking


@pytest.mark.usefixtures("helm_on_path")
def test_a_namespace_that_is_not_ours_is_never_relabelled_and_the_plan_says_what_it_needs(cluster, tmp_path):
    cluster.kubectl("create", "namespace", "gpu-operator")
    cluster.kubectl("label", "namespace", "gpu-operator", f"{ENFORCE}=baseline")
    config = tmp_path / "gpu-bootstrap.yaml"  # the admin's own namespace, adopted: `up` may install into it
    config.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}, adopt_namespaces: [gpu-operator]}}\n"
                      f"nodes: [{{name: gpu-1}}]\ngpu_operator: {{chart: {chart('gpu-operator-v26.7.0.tgz')}}}\n")
    out = tmp_path / "plan"
    report = write_report(tmp_path / "report.json", ["gpu-1"])
    result = runner.invoke(app, ["up", "--dry-run", "-c", str(config), "--only", "gpu-operator", "--render-dir",
                                 str(out), "--preflight-report", str(report), "-o", "json", "--log-file",
                                 str(tmp_path / "log")])
    steps = json.loads(result.stdout)["steps"]
    step = next((s for s in steps if s["id"] == "gpu-operator"), None)
    assert step is not None, result.output
    assert ("namespace gpu-operator is not gpu-bootstrap's, so it is not relabelled; it needs "
            "pod-security.kubernetes.io/enforce=privileged") in step["message"]
    assert "kubectl label namespace gpu-operator pod-security.kubernetes.io/enforce=privileged" in step["message"]
    assert not list(out.glob("*/*-namespace-*.yaml"))  # no change to it planned
    assert cluster.emu.get("namespaces", "gpu-operator")["metadata"]["labels"][ENFORCE] == "baseline"
