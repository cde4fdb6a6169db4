"""Pod Security (#23): the labels on the namespaces we create, and our pod templates against the restricted profile.

The profile is checked by tests/kubeapi/pod_security.py, the emulator's Pod Security Admission (every rule of the
Pod Security Standards page for baseline and restricted). Its rules are proven one by one here (a compliant pod with
one thing broken fails exactly that rule), and the emulator's enforcement through the real kubectl.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.pipeline import checkpoint
from gpu_bootstrap.security import pod_security
from tests.kubeapi.pod_security import ENFORCE, template_of, violations

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {"Pod", "Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job", "CronJob"}
# The namespaces the default playbook creates, and the level each one enforces.
EXPECTED_LEVELS = {"gpu-operator": "privileged", "monitoring": "privileged", "gpu-bootstrap-admission": "restricted",
                   "gpu-bootstrap": "restricted"}


def render(tmp_path: Path, kube: str) -> list[dict]:
    out = tmp_path / f"render-{kube}"
    result = CliRunner().invoke(app, ["up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(ROOT / "examples" / "minimal.yaml"),
                                      "--kube-version", kube, "--render-dir", str(out), "-o", "json"],
                                env={"HOME": str(tmp_path), "KUBECONFIG": ""})
    assert result.exit_code == 0, result.output
    documents = []
    for path in sorted(out.glob("*/*.yaml")):
        if path.name in ("values.yaml", "release.yaml") or "-helm-" in path.name:
            continue  # the charts' own values: their pods are the chart's (gpu-operator, kube-prometheus-stack)
        documents += [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    return documents


@pytest.mark.unit
@pytest.mark.parametrize("kube", ["1.24", "1.33"])
def test_every_pod_template_we_render_passes_restricted_and_every_namespace_is_labelled(tmp_path, kube):
    documents = render(tmp_path, kube)
    templates = {f"{d['kind']} {d['metadata'].get('namespace')}/{d['metadata']['name']}": template_of(d)
                 for d in documents if d.get("kind") in WORKLOADS}
    # validation pods on both GPU nodes, the scheduler's and OPA's Deployments
    assert len(templates) == 4, sorted(templates)
    found = {name: violations(spec, meta, "restricted") for name, (spec, meta) in templates.items()}
    assert {name: v for name, v in found.items() if v} == {}
    namespaces = {d["metadata"]["name"]: d["metadata"].get("labels") or {} for d in documents
                  if d.get("kind") == "Namespace"}
    namespaces[checkpoint.NAMESPACE] = checkpoint.namespace_manifest()["metadata"]["labels"]
    assert {name: labels.get(ENFORCE) for name, labels in namespaces.items()} == EXPECTED_LEVELS
    assert all(labels.get("app.kubernetes.io/managed-by") == "gpu-bootstrap" for labels in namespaces.values())


@pytest.mark.unit
def test_the_pods_we_only_dry_run_pass_restricted_too():
    """The admission step's probe pods and doctor's restricted probe are rendered at run time, not into the render
    dir; doctor's privileged probe is the one that must not pass (it stands for the gpu-operator's driver pod)."""
    from gpu_bootstrap.security import hardening
    from gpu_bootstrap.render.admission import sample_pod
    pods = [sample_pod("p", "default"), sample_pod("p", "default", False), sample_pod("p", "default", True, "n1"),
            hardening.restricted_pod("ns")]
    assert [violations(p["spec"], p["metadata"], "restricted") for p in pods] == [[], [], [], []]
    privileged = hardening.privileged_pod("ns")
    assert [v.split(" (")[0] for v in violations(privileged["spec"], privileged["metadata"], "baseline")] == [
        "host namespaces", "privileged", "hostPath volumes"]


COMPLIANT = {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
             "containers": [{"name": "c", "image": "x", "securityContext": {
                 "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
             "volumes": [{"name": "v", "configMap": {"name": "m"}}]}
C = ("containers", 0, "securityContext")


def _set(spec: dict, path: tuple, value) -> dict:
    spec = copy.deepcopy(spec)
    target = spec
    for key in path[:-1]:
        target = target.setdefault(key, {}) if isinstance(key, str) else target[key]
    if value is None:
        target.pop(path[-1], None)
    else:
        target[path[-1]] = value
    return spec


# (what breaks, path in the pod spec, value (None: removed), the rule restricted reports, the one baseline reports
# (None: baseline admits it)); restricted reports its stricter check in place of baseline's capabilities, hostPath
# and seccomp checks, as the real plugin does
RULES = [
    ("hostProcess", ("securityContext", "windowsOptions"), {"hostProcess": True}, "hostProcess", "hostProcess"),
    ("host network", ("hostNetwork",), True, "host namespaces", "host namespaces"),
    ("host PID", ("hostPID",), True, "host namespaces", "host namespaces"),
    ("host IPC", ("hostIPC",), True, "host namespaces", "host namespaces"),
    ("privileged", (*C, "privileged"), True, "privileged", "privileged"),
    ("SYS_ADMIN", (*C, "capabilities"), {"drop": ["ALL"], "add": ["SYS_ADMIN"]}, "unrestricted capabilities",
     "non-default capabilities"),
    ("hostPath", ("volumes",), [{"name": "h", "hostPath": {"path": "/"}}], "restricted volume types",
     "hostPath volumes"),
    ("hostPort", ("containers", 0, "ports"), [{"containerPort": 80, "hostPort": 80}], "hostPort", "hostPort"),
    ("AppArmor", (*C, "appArmorProfile"), {"type": "Unconfined"}, "forbidden AppArmor profile",
     "forbidden AppArmor profile"),
    ("SELinux type", (*C, "seLinuxOptions"), {"type": "spc_t"}, "seLinuxOptions", "seLinuxOptions"),
    ("SELinux user", ("securityContext", "seLinuxOptions"), {"user": "root"}, "seLinuxOptions", "seLinuxOptions"),
    ("procMount", (*C, "procMount"), "Unmasked", "procMount", "procMount"),
    ("seccomp Unconfined", (*C, "seccompProfile"), {"type": "Unconfined"}, "seccompProfile", "seccompProfile"),
    ("unsafe sysctl", ("securityContext", "sysctls"), [{"name": "kernel.msgmax", "value": "1"}], "forbidden sysctls",
     "forbidden sysctls"),
    ("a gcePersistentDisk volume", ("volumes",), [{"name": "g", "gcePersistentDisk": {"pdName": "p"}}],
     "restricted volume types", None),
    ("privilege escalation", (*C, "allowPrivilegeEscalation"), None, "allowPrivilegeEscalation != false",
     None),
    ("capabilities kept", (*C, "capabilities"), None, "unrestricted capabilities", None),
    ("NET_RAW added", (*C, "capabilities"), {"drop": ["ALL"], "add": ["NET_RAW"]}, "unrestricted capabilities",
     "non-default capabilities"),  # NET_RAW is not among baseline's defaults
    ("only NET_RAW dropped", (*C, "capabilities"), {"drop": ["NET_RAW"]}, "unrestricted capabilities", None),
    ("runAsNonRoot unset", ("securityContext", "runAsNonRoot"), None, "runAsNonRoot != true", None),
    ("runAsNonRoot false on a container", (*C, "runAsNonRoot"), False, "runAsNonRoot != true", None),
    ("root user", ("securityContext", "runAsUser"), 0, "runAsUser=0", None),
    ("seccomp unset", ("securityContext", "seccompProfile"), None, "seccompProfile", None),
]


@pytest.mark.unit
def test_a_compliant_pod_passes_every_level():
    assert [violations(COMPLIANT, {}, level) for level in ("privileged", "baseline", "restricted")] == [[], [], []]


@pytest.mark.unit
@pytest.mark.parametrize("what, path, value, rule, baseline_rule", RULES, ids=[r[0] for r in RULES])
def test_each_pod_security_rule_fails_exactly_what_breaks_it(what, path, value, rule, baseline_rule):
    spec = _set(COMPLIANT, path, value)
    assert [v.split(" (")[0] for v in violations(spec, {}, "restricted")] == [rule]
    assert [v.split(" (")[0] for v in violations(spec, {}, "baseline")] == ([baseline_rule] if baseline_rule else [])
    assert violations(spec, {}, "privileged") == []


@pytest.mark.unit
def test_the_apparmor_annotation_counts_too():
    bad = {"annotations": {"container.apparmor.security.beta.kubernetes.io/c": "unconfined"}}
    assert violations(COMPLIANT, bad, "baseline") == ["forbidden AppArmor profile"]


@pytest.mark.unit
def test_the_validation_pod_before_the_fix_failed_four_rules():
    """What the issue found (12 violations on 3 pods): a pod with no security context at all."""
    bare = {"containers": [{"name": "vectoradd", "image": "cuda"}]}
    assert [v.split(" (")[0] for v in violations(bare, {}, "restricted")] == [
        "allowPrivilegeEscalation != false", "unrestricted capabilities", "runAsNonRoot != true", "seccompProfile"]


@pytest.mark.unit
@pytest.mark.parametrize("live, level, action, advises", [
    (None, "privileged", "create", False),
    ({"metadata": {"labels": {"app.kubernetes.io/managed-by": "gpu-bootstrap"}}}, "privileged", "label", False),
    ({"metadata": {"labels": {"app.kubernetes.io/managed-by": "gpu-bootstrap", ENFORCE: "privileged"}}},
     "privileged", "none", False),
    ({"metadata": {"labels": {}}}, "privileged", "none", True),  # theirs: never relabelled, the plan says what
    ({"metadata": {"labels": {ENFORCE: "baseline"}}}, "privileged", "none", True),
    ({"metadata": {"labels": {ENFORCE: "privileged"}}}, "privileged", "none", False),
    ({"metadata": {"labels": {ENFORCE: "restricted"}}}, "restricted", "none", False),
    ({"metadata": {"labels": {}}}, "restricted", "none", False),  # our restricted pods pass any level
])
def test_a_namespace_is_created_or_labelled_only_when_ours(live, level, action, advises):
    decision = pod_security.decide("ns", live, level, "why")
    assert decision.action == action
    assert bool(decision.advice) == advises
    if advises:
        assert f"kubectl label namespace ns {ENFORCE}={level}" in decision.advice
    if action == "none":
        assert decision.change() is None
    else:
        assert decision.change()[2]["metadata"]["labels"][ENFORCE] == level


# --- the emulator enforces it (proven with the real kubectl) ----------------------------------------------------------
def _pod(name: str, spec: dict) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def test_the_emulator_enforces_the_namespace_level_on_pod_creation(cluster):
    for name, level in (("locked", "restricted"), ("open", "privileged"), ("base", "baseline")):
        cluster.kubectl("create", "namespace", name)
        cluster.kubectl("label", "namespace", name, f"{ENFORCE}={level}")
    bare = _pod("bare", {"containers": [{"name": "c", "image": "x"}]})
    refused = cluster.kubectl("apply", "-n", "locked", "--dry-run=server", "-f", "-", input=bare, check=False)
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false' in refused.stderr
    assert 'container "c" must set securityContext.allowPrivilegeEscalation=false' in refused.stderr
    cluster.kubectl("create", "-n", "locked", "-f", "-", input=_pod("good", COMPLIANT))
    cluster.kubectl("create", "-n", "base", "-f", "-", input=bare)  # baseline admits a plain pod
    host = _pod("host", {"hostNetwork": True, "containers": [{"name": "c", "image": "x"}]})
    refused = cluster.kubectl("create", "-n", "base", "-f", "-", input=host, check=False)
    assert 'violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true)' in refused.stderr
    cluster.kubectl("create", "-n", "open", "-f", "-", input=host)
    names = cluster.kubectl("get", "pods", "-A", "-o", "name").stdout.split()
    assert sorted(names) == ["pod/bare", "pod/good", "pod/host"]
