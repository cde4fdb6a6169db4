"""Least-privilege RBAC (#23): `gpu-bootstrap rbac --for COMMAND` against the emulator, which enforces RBAC for a
bearer token bound to the generated roles (tests/kubeapi/rbac.py; proven with the real kubectl below).

Each command runs through the real CLI with a ServiceAccount token bound to the role generated for it, with the real
helm and the local charts: it succeeds, and no request it made was refused (so every request it makes is covered by
the generated rules); with one rule removed it fails with the API server's 403 naming the missing verb and resource.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap import steps as registry
from gpu_bootstrap.security import rbac as rbac_module
from gpu_bootstrap.security import rbac_rules
from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.core.config import load
from gpu_bootstrap.app.playbook import load_playbook
from tests.conftest import chart
from tests.nodes.reports import write_report

runner = CliRunner()
NODES = ["node5", "node6"]
SA = "system:serviceaccount:ci:gpu-bootstrap"


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.33.2", "gpu_nodes": NODES, "cpu_nodes": ["cpu-1"], "gpu_operator": True}


def write_config(tmp_path: Path, kubeconfig: Path | None = None, extra: str = "") -> Path:
    path = tmp_path / "gpu-bootstrap.yaml"
    path.write_text((f"cluster: {{kubeconfig: {kubeconfig}}}\n" if kubeconfig else "") + "nodes:\n" +
                    "".join(f"  - name: {n}\n" for n in NODES) +
                    f"gpu_operator:\n  chart: {chart('gpu-operator-v26.7.0.tgz')}\n"
                    f"monitoring:\n  chart: {chart('kube-prometheus-stack-88.5.3.tgz')}\n" + extra)
    return path


def generate(command: str, config: Path) -> tuple[str, list[dict]]:
    result = runner.invoke(app, ["rbac", "--for", command, "-c", str(config), "--service-account", "ci/gpu-bootstrap",
                                 "--kube-version", "1.33"])
    assert result.exit_code == 0, result.output
    return result.stdout, [d for d in yaml.safe_load_all(result.stdout) if d]


def uncovered(requests, command: str, config_path: Path, both_allocations: bool = False) -> list[str]:
    """The recorded requests the role generated for `command` would refuse (each as the emulator logged it).
    `both_allocations`: the role of `rbac --allow-allocation-change`."""
    from tests.kubeapi.rbac import _matches
    config = load(config_path)
    found = rbac_module.rules(command, config, registry.enabled(config, load_playbook("default").steps),
                              both_allocations=both_allocations)
    out = []
    for request in requests:
        access = request.access
        if access is None or (access.group, access.resource) == ("authorization.k8s.io", "selfsubjectaccessreviews"):
            continue
        rules = found.cluster + found.namespaced.get(access.namespace, [])
        if not any(_matches(rule, access) for rule in rules):
            out.append(f"{access.verb} {access.full_resource}.{access.group} in {access.namespace or 'the cluster'}")
    return sorted(set(out))


# --- the generator ---------------------------------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("command", rbac_module.COMMANDS)
@pytest.mark.parametrize("extra", ["", "monitoring:\n  mode: attach\nadmission:\n  certificates: cert-manager\n",
                                   "pools:\n  - {name: gpu, role: KarpenterNodeRole-x, discovery_tag: x}\n"])
def test_no_generated_role_uses_a_wildcard(tmp_path, command, extra):
    path = tmp_path / "c.yaml"
    path.write_text("nodes: [{name: node5}]\n" + extra)
    config = load(path)
    steps = registry.enabled(config, load_playbook("default").steps)
    found = rbac_module.rules(command, config, steps)
    every = found.cluster + [r for rules in found.namespaced.values() for r in rules]
    assert every
    for rule in every:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        assert rule["verbs"] and rule["resources"]


@pytest.mark.unit
def test_the_roles_follow_the_configured_steps(tmp_path):
    """A step the config turns off grants nothing: without admission, no admission policies; namespaced
    needs are Roles in their namespace."""
    path = tmp_path / "c.yaml"
    path.write_text("nodes: [{name: node5}]\nadmission: {enabled: false}\nvalidation: {enabled: false}\n")
    config = load(path)
    steps = registry.enabled(config, load_playbook("default").steps)
    assert "admission" not in steps and "validate" not in steps
    found = rbac_module.rules("dry-run", config, steps)
    assert not [r for r in found.cluster if r["apiGroups"] == ["admissionregistration.k8s.io"]
                and "validatingadmissionpolicies" in r["resources"]]  # (the stack's chart has webhooks of its own)
    assert "gpu-bootstrap-admission" not in found.namespaced
    # (the state record's namespace needs no Role here: monitoring.mode auto may attach anywhere, so configmaps are
    # in the ClusterRole)
    # (gpu-bootstrap: the fingerprints' key, read by a dry run to tell whether validate would run again)
    assert set(found.namespaced) == {"gpu-bootstrap", "gpu-operator", "kube-system", "monitoring"}


@pytest.mark.unit
def test_a_bad_service_account_is_bad_input(tmp_path):
    result = runner.invoke(app, ["rbac", "--for", "status", "--service-account", "gpu-bootstrap"])
    assert result.exit_code == 2
    assert "--service-account 'gpu-bootstrap' is not NAMESPACE/NAME" in " ".join(result.output.split())


# --- the emulator enforces RBAC --------------------------------------------------------------------------------------
def test_the_emulator_authorizes_a_token_by_its_roles_and_bindings(cluster, tmp_path):
    token = cluster.emu.add_token("system:serviceaccount:ci:reader")
    user = cluster.emu.user_kubeconfig(tmp_path / "user", token)
    as_user = ["--kubeconfig", str(user)]
    refused = cluster.kubectl(*as_user, "get", "nodes", check=False)
    assert refused.returncode != 0
    assert ('nodes is forbidden: User "system:serviceaccount:ci:reader" cannot list resource "nodes" in API group "" '
            'at the cluster scope') in refused.stderr
    cluster.kubectl("create", "namespace", "ci")
    subject = [{"kind": "ServiceAccount", "name": "reader", "namespace": "ci"}]
    group = "rbac.authorization.k8s.io"
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
        {"apiVersion": f"{group}/v1", "kind": "ClusterRole", "metadata": {"name": "node-reader"},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]},
        {"apiVersion": f"{group}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "node-reader"},
         "subjects": subject, "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": "node-reader"}},
        {"apiVersion": f"{group}/v1", "kind": "Role", "metadata": {"name": "cm-reader", "namespace": "ci"},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["allowed"]}]},
        {"apiVersion": f"{group}/v1", "kind": "RoleBinding", "metadata": {"name": "cm-reader", "namespace": "ci"},
         "subjects": subject, "roleRef": {"apiGroup": group, "kind": "Role", "name": "cm-reader"}}]))
    assert "node/node5" in cluster.kubectl(*as_user, "get", "nodes", "-o", "name").stdout
    cluster.kubectl("create", "configmap", "allowed", "-n", "ci")
    cluster.kubectl("create", "configmap", "other", "-n", "ci")
    cluster.kubectl(*as_user, "get", "configmap", "allowed", "-n", "ci")
    other = cluster.kubectl(*as_user, "get", "configmap", "other", "-n", "ci", check=False)
    assert 'configmaps "other" is forbidden: User "system:serviceaccount:ci:reader" cannot get resource ' \
           '"configmaps" in API group "" in the namespace "ci"' in other.stderr
    elsewhere = cluster.kubectl(*as_user, "get", "configmap", "allowed", "-n", "default", check=False)
    assert 'in the namespace "default"' in elsewhere.stderr


# --- each command with its generated role ----------------------------------------------------------------------------
def grant(cluster, config: Path, command: str, tmp_path: Path, drop: tuple[str, str, str, str] | None = None) -> Path:
    """Apply the generated role for `command` (as the admin, with the real kubectl), creating its namespaces as the
    header says; `drop`: (kind, namespace, resource, verb) removed from it. Returns the ServiceAccount's kubeconfig."""
    text, docs = generate(command, config)
    for line in text.splitlines():
        if line.startswith("#   kubectl create namespace "):
            namespace = line.split()[4]
            if cluster.emu.get("namespaces", namespace) is None:
                labels = line.split("kubectl label namespace ")[1].split()[1:]
                cluster.kubectl("create", "namespace", namespace)
                cluster.kubectl("label", "namespace", namespace, *labels)
    if drop is not None:
        kind, namespace, resource, verb = drop
        for doc in docs:
            if doc["kind"] == kind and doc["metadata"].get("namespace", "") == namespace:
                for rule in doc["rules"]:
                    if resource in rule["resources"]:
                        rule["verbs"] = [v for v in rule["verbs"] if v != verb]
                doc["rules"] = [r for r in doc["rules"] if r["verbs"]]
    cluster.kubectl("create", "namespace", "ci", check=False)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    token = cluster.emu.add_token(SA)
    return cluster.emu.user_kubeconfig(tmp_path / f"kubeconfig-{command}", token)


def run_as(kubeconfig: Path, config: Path, tmp_path: Path, *args: str):
    command = list(args)
    if command[0] == "up":
        command += ["--preflight-report", str(write_report(tmp_path / "report.json", NODES))]
    if command[0] == "doctor":
        command += ["--no-nodes"]
    result = runner.invoke(app, [*command, "-c", str(config), "--kubeconfig", str(kubeconfig), "-o", "json",
                                 "--log-file", str(tmp_path / "log")])
    return result, json.loads(result.stdout) if result.stdout.startswith("{") else None


def refused(cluster) -> list[str]:
    return [str(r) for r in cluster.emu.requests.all() if r.status == 403]


def test_a_namespace_an_admin_made_as_the_up_roles_header_says_ends_as_up_makes_it(cluster, tmp_path):
    """The header of `rbac --for up` has the admin create the Roles' namespaces with our managed-by label; `up` adopts
    them and labels them as it labels its own. Found on the real API server (tests/test_faults_real.py): the
    admission namespace kept no `app.kubernetes.io/component` label, so a CI run's cluster differed from an admin's."""
    from gpu_bootstrap.render import admission as render_admission
    config = write_config(tmp_path)
    user = grant(cluster, config, "up", tmp_path)
    namespace = load(config).admission.opa.namespace
    assert cluster.emu.get("namespaces", namespace) is not None  # the header made it
    result, document = run_as(user, config, tmp_path, "up", "--only", "admission-opa")
    assert result.exit_code == 0, result.output
    wanted = render_admission.namespace(load(config))["metadata"]["labels"]
    labels = cluster.emu.get("namespaces", namespace)["metadata"]["labels"]
    assert {k: labels.get(k) for k in wanted} == wanted


@pytest.mark.tools
@pytest.mark.slow
@pytest.mark.usefixtures("helm_on_path")
def test_up_dry_run_succeeds_with_its_role_and_names_a_removed_rule(cluster, tmp_path):
    config = write_config(tmp_path)
    user = grant(cluster, config, "dry-run", tmp_path)
    cluster.emu.requests.clear()
    result, document = run_as(user, config, tmp_path, "up", "--dry-run")
    assert result.exit_code == 0, result.output
    assert refused(cluster) == []
    assert {s["status"] for s in document["steps"]} <= {"planned", "unchanged", "skipped"}, document
    assert cluster.emu.requests.writes() == []  # a dry run, whoever runs it
    user = grant(cluster, config, "dry-run", tmp_path, drop=("ClusterRole", "", "nodes", "patch"))
    result, document = run_as(user, config, tmp_path, "up", "--dry-run")
    assert result.exit_code == 1
    assert ('nodes "node5" is forbidden: User "system:serviceaccount:ci:gpu-bootstrap" cannot patch resource '
            '"nodes" in API group "" at the cluster scope') in document["error"]


@pytest.mark.tools
@pytest.mark.parametrize("command", ["dry-run", "up"])
def test_without_pools_gpu_pools_may_look_for_pools_of_ours_it_no_longer_wants(cluster, tmp_path, command):
    """With `pools` left out the gpu-pools step still runs: where Karpenter's CRDs are served it lists our NodePools
    and EC2NodeClasses to remove those no longer configured. The roles once granted it nothing without `pools`, and
    its run as them was refused."""
    from tests.test_gpu_pools import install_crds
    install_crds(cluster)
    config = write_config(tmp_path)
    user = grant(cluster, config, command, tmp_path)
    cluster.emu.requests.clear()
    result, document = run_as(user, config, tmp_path, "up", *(["--dry-run"] if command == "dry-run" else []),
                              "--only", "gpu-pools")
    assert result.exit_code == 0, result.output
    assert refused(cluster) == []
    assert [s["status"] for s in document["steps"] if s["id"] == "gpu-pools"] == ["skipped"], document


@pytest.mark.tools
@pytest.mark.slow
@pytest.mark.usefixtures("helm_on_path")
def test_doctor_succeeds_with_its_role_and_names_a_removed_rule(cluster, tmp_path):
    config = write_config(tmp_path)
    user = grant(cluster, config, "doctor", tmp_path)
    cluster.emu.requests.clear()
    result, document = run_as(user, config, tmp_path, "doctor")
    assert refused(cluster) == []
    assert result.exit_code == 0, result.output
    messages = {c["message"].split(":")[0]: c["status"] for c in document["checks"]}
    # its SelfSubjectAccessReviews say it may not run `up` (a warning), and nothing it read was refused
    assert messages["missing permissions"] == "warn", document
    assert not [c for c in document["checks"] if "forbidden" in c["message"]], document
    user = grant(cluster, config, "doctor", tmp_path, drop=("ClusterRole", "", "configmaps", "get"))
    result, document = run_as(user, config, tmp_path, "doctor")
    assert result.exit_code == 1
    assert ('configmaps "gpu-bootstrap-state" is forbidden: User "system:serviceaccount:ci:gpu-bootstrap" cannot get '
            'resource "configmaps" in API group "" in the namespace "gpu-bootstrap"') in document["error"]


def test_status_succeeds_with_its_role_and_names_a_removed_rule(cluster, tmp_path):
    config = write_config(tmp_path)
    user = grant(cluster, config, "status", tmp_path)
    cluster.emu.requests.clear()
    result, _document = run_as(user, config, tmp_path, "status")
    assert result.exit_code == 0, result.output
    assert refused(cluster) == []
    user = grant(cluster, config, "status", tmp_path, drop=("ClusterRole", "", "nodes", "list"))
    result, document = run_as(user, config, tmp_path, "status")
    assert result.exit_code == 1, result.output
    assert ('nodes is forbidden: User "system:serviceaccount:ci:gpu-bootstrap" cannot list resource "nodes" in API '
            'group "" at the cluster scope') in (document or {}).get("error", result.output)


def _plural(kind: str) -> str:
    lower = kind.lower()
    return lower[:-1] + "ies" if lower.endswith("y") else lower + "es" if lower.endswith("s") else lower + "s"


DRA_CHART = ("dra-driver", "dra-driver-nvidia-gpu-0.5.0")
CHART_SETTINGS = {"dra-driver": ["--set", "gpuResourcesEnabledOverride=true"]}  # the chart refuses GPUs without it


@pytest.mark.tools
@pytest.mark.parametrize("step, archive", [("gpu-operator", "gpu-operator-v26.7.0.tgz"),
                                           ("gpu-operator", "gpu-operator-v25.10.1.tgz"),
                                           ("monitoring", "kube-prometheus-stack-88.5.3.tgz"), DRA_CHART])
def test_every_kind_a_chart_renders_is_in_the_table(step, archive):
    """The charts' objects are granted by kind (rbac_rules.CHART_KINDS): every kind the chart renders (hooks and CRDs
    included), and whether it is namespaced, must be there."""
    from tests.tools import tool, tool_env
    helm = tool("helm")
    import subprocess
    rendered = subprocess.run([helm, "template", "x", str(chart(archive)), "--namespace", "ns", "--kube-version",
                               "1.33.0", "--include-crds", *CHART_SETTINGS.get(step, [])], capture_output=True,
                              text=True, check=True, env=tool_env()).stdout
    found = set()
    for doc in yaml.load_all(rendered, Loader=yaml.BaseLoader):  # (a CRD holds "- =", which SafeLoader refuses)
        if isinstance(doc, dict) and doc.get("kind"):
            group = doc["apiVersion"].rpartition("/")[0]
            found.add((group, _plural(doc["kind"]), bool(doc["metadata"].get("namespace"))
                       or doc["kind"] in ("ServiceAccount", "ConfigMap", "Secret", "Service", "Job")))
    assert found - set(rbac_rules.CHART_KINDS[step]) == set()


@pytest.mark.unit
def test_the_cluster_probe_is_granted_only_where_preflight_probes_through_the_cluster(tmp_path):
    """preflight.via auto without an SSH route probes through the cluster: its per-run namespace, its pods (in a
    namespace named per run, so cluster-wide) and the pod list are in the up role (with an `ssh` section they are
    not) and always in the probe role, which exists for them (`doctor --via cluster`); never in doctor's, which is
    kept dry."""
    def probe_pods(text: str, command: str) -> bool:
        path = tmp_path / "c.yaml"
        path.write_text(text)
        config = load(path)
        found = rbac_module.rules(command, config, registry.enabled(config, load_playbook("default").steps))
        return any("pods" in r["resources"] and "create" in r["verbs"] and r["apiGroups"] == [""]
                   for r in found.cluster)
    assert probe_pods("nodes: [{name: node5}]\n", "probe") and probe_pods("nodes: [{name: node5}]\n", "up")
    assert not probe_pods("nodes: [{name: node5}]\n", "doctor")
    assert not probe_pods("nodes: [{name: node5}]\nssh: {user: root}\nmonitoring: {enabled: false}\n", "up")
    assert probe_pods("nodes: [{name: node5}]\nssh: {user: root}\nmonitoring: {enabled: false}\n", "probe")


# --- the plan role and the client-side plan (#33) ---------------------------------------------------------------------
@pytest.mark.tools
@pytest.mark.slow
@pytest.mark.usefixtures("helm_on_path")
def test_a_client_side_plan_with_the_plan_role_reads_only_and_reports_what_it_cannot_read(cluster, tmp_path):
    """`up --dry-run=client` with a token bound to `rbac --for plan`: only GETs (lists and gets), no write of any
    kind (not even a dry run); what is kept in a Secret it may not read (the webhook's certificate) is planned as on
    a fresh cluster while nothing of it runs (tests/test_admission_emulator.py: kept as it runs otherwise), never
    taken for "unchanged"; the others plan as usual, the charts' releases from their live objects."""
    config = write_config(tmp_path)
    user = grant(cluster, config, "plan", tmp_path)
    cluster.emu.requests.clear()
    result, document = run_as(user, config, tmp_path, "up", "--dry-run=client")
    assert result.exit_code == 0, result.output
    assert cluster.emu.requests.writes() == []
    assert {r.method for r in cluster.emu.requests.all()} == {"GET"}
    # refused: Secrets (the webhook's certificate: those steps are unknown) and the cluster-wide list of our
    # ConfigMaps (the plan role reads ConfigMaps only where it plans: it lists them there instead, and says so)
    assert {(r.access.resource, r.access.namespace or "*") for r in cluster.emu.requests.all()
            if r.status == 403 and r.access is not None} \
        <= {("secrets", "gpu-bootstrap-admission"), ("secrets", "gpu-bootstrap"), ("configmaps", "*"),
            ("configmaps", "kube-system")}  # the scheduler's own ConfigMap is read by name; no list of kube-system's
    assert any(r.access is not None and (r.access.resource, r.access.namespace, r.status) ==
               ("configmaps", "monitoring", 200) for r in cluster.emu.requests.all())
    statuses = {s["id"]: s["status"] for s in document["steps"]}
    # a fresh cluster: the charts' releases have no live object, so they are planned as installs (helm's records
    # are not read); no OPA runs yet, so its certificate is planned as a first one
    assert statuses == {"preflight": "unchanged", "node-prep": "planned", "gpu-pools": "skipped",
                        "monitoring": "planned", "gpu-operator": "planned", "binpack-scheduler": "planned",
                        "admission-opa": "planned", "admission": "planned", "queues": "skipped",
                        "validate": "planned"}


@pytest.mark.unit
@pytest.mark.parametrize("allocation", ["device-plugin", "dra"])
def test_no_role_but_ups_reads_secret_values(tmp_path, allocation):
    """helm's release records hold every chart value (the secret ones too), Grafana's Secret its password, OPA's its
    key: the dry-run, doctor and probe roles read no Secret at all but the state record's fingerprint key, by name;
    the plan role none; up's reads them (it installs them)."""
    path = tmp_path / "c.yaml"
    path.write_text(f"nodes: [{{name: node5}}]\ngpu_operator: {{allocation: {allocation}}}\n")
    config = load(path)
    steps = registry.enabled(config, load_playbook("default").steps)
    for command in ("plan", "dry-run", "doctor", "probe", "up"):
        found = rbac_module.rules(command, config, steps)
        secret_rules = [(ns, rule) for ns, rules in [(None, found.cluster), *found.namespaced.items()]
                        for rule in rules if "secrets" in rule["resources"]]
        if command == "up":
            assert secret_rules
        elif command == "plan":
            assert secret_rules == [], secret_rules
        else:
            assert [(ns, rule["resourceNames"], rule["verbs"]) for ns, rule in secret_rules] == [
                ("gpu-bootstrap", ["gpu-bootstrap-state-key"], ["get"])], (command, secret_rules)


@pytest.mark.unit
def test_the_pipeline_roles_from_least_to_most(tmp_path):
    """plan: get/list/watch, no Secrets; dry-run: bind/escalate only by name, no delete, deletecollection or
    impersonate; up: no `*` (checked for all above)."""
    path = tmp_path / "c.yaml"
    path.write_text("nodes: [{name: node5}]\n")
    config = load(path)
    steps = registry.enabled(config, load_playbook("default").steps)

    def every(command):
        found = rbac_module.rules(command, config, steps)
        return found.cluster + [r for rules in found.namespaced.values() for r in rules]
    plan = every("plan")
    assert {v for r in plan for v in r["verbs"]} <= {"get", "list", "watch"}
    assert not [r for r in plan if "secrets" in r["resources"]]
    for command in ("dry-run", "up"):
        for rule in every(command):
            if {"bind", "escalate", "impersonate"} & set(rule["verbs"]):
                assert rule.get("resourceNames") and "impersonate" not in rule["verbs"], (command, rule)
                assert set(rule["resources"]) <= {"clusterroles", "roles"}, (command, rule)
    dry = every("dry-run")
    assert not [r for r in dry if {"delete", "deletecollection", "impersonate"} & set(r["verbs"])]
    named = {n for r in dry if "bind" in r["verbs"] for n in r["resourceNames"]}
    assert "cluster-admin" not in named and {"system:kube-scheduler", "gpu-operator"} <= named


@pytest.mark.tools
@pytest.mark.parametrize("release", ["gpu-operator", "gpu", "a-rather-long-release-name-for-the-platform"])
@pytest.mark.parametrize("step, archive", [("gpu-operator", "gpu-operator-v26.7.0.tgz"),
                                           ("gpu-operator", "gpu-operator-v25.10.1.tgz"),
                                           ("monitoring", "kube-prometheus-stack-88.5.3.tgz"), DRA_CHART])
def test_the_roles_a_chart_creates_and_binds_are_the_ones_named(step, archive, release):
    """rbac_rules.chart_roles follows each chart's naming rules; the chart rendered with that release name agrees (the
    dry-run and up roles may bind and escalate exactly these)."""
    from tests.tools import tool, tool_env
    import subprocess
    rendered = subprocess.run([tool("helm"), "template", release, str(chart(archive)), "--namespace", "ns",
                               "--kube-version", "1.33.0", *CHART_SETTINGS.get(step, [])], capture_output=True,
                              text=True, check=True, env=tool_env()).stdout
    cluster_roles, roles = set(), set()
    for doc in yaml.load_all(rendered, Loader=yaml.BaseLoader):
        if isinstance(doc, dict) and doc.get("kind") in ("ClusterRole", "Role"):
            (cluster_roles if doc["kind"] == "ClusterRole" else roles).add(doc["metadata"]["name"])
        if isinstance(doc, dict) and doc.get("kind") in ("ClusterRoleBinding", "RoleBinding"):
            ref = doc["roleRef"]
            (cluster_roles if ref["kind"] == "ClusterRole" else roles).add(ref["name"])
    assert (cluster_roles, roles) == tuple(rbac_rules.chart_roles(step, release))


# --- the roles after the attacks (#41): what each may not do, as data (the live suite attacks them for real) ----------
def _config(tmp_path: Path, text: str = "nodes: [{name: node5}]\n"):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return load(path)


def _every(command: str, config, **more) -> list[dict]:
    found = rbac_module.rules(command, config, registry.enabled(config, load_playbook("default").steps),
                              **more)
    return found.cluster + [r for rules in found.namespaced.values() for r in rules]


@pytest.mark.unit
@pytest.mark.parametrize("command", ["dry-run", "doctor", "probe"])
def test_a_kept_identity_holds_no_write_on_what_admission_does_not_see(tmp_path, command):
    """Admission does not run for webhook configurations and admission policies, so no policy could keep a write of
    them dry: the dry-run, doctor and probe roles may only read them."""
    for rule in _every(command, _config(tmp_path)):
        if set(rule["resources"]) & set(rbac_module.ADMISSION_CONFIGURATION):
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule


@pytest.mark.unit
def test_the_service_proxy_reaches_only_the_prometheus_it_reads(tmp_path):
    config = _config(tmp_path, "nodes: [{name: node5}]\nmonitoring: {release: prom, namespace: obs}\n")
    for command in ("status", "doctor", "probe"):
        found = rbac_module.rules(command, config, registry.enabled(config, load_playbook("default").steps))
        proxies = [(ns, r) for ns, rules in [(None, found.cluster), *found.namespaced.items()] for r in rules
                   if "services/proxy" in r["resources"]]
        assert proxies == [("obs", {"apiGroups": [""], "resources": ["services/proxy"],
                                    "resourceNames": ["prom-kube-prometheus-stack-prometheus:http-web"],
                                    "verbs": ["get"], rbac_module.WHY: proxies[0][1][rbac_module.WHY]})], command
    given = rbac_module.prometheus_service(config, "metrics/prometheus-k8s:web")
    namespaced = rbac_module.rules("status", config, [], given).namespaced
    assert namespaced["metrics"] == [
        {"apiGroups": [""], "resources": ["services/proxy"], "resourceNames": ["prometheus-k8s:web"], "verbs": ["get"],
         rbac_module.WHY: [next(n.why for n in rbac_module.needs("status", config, [], given)
                                if "services/proxy" in n.resources)]}]
    # beside it, status reads one ConfigMap by name: the bin-packing scheduler's config (which share it scores)
    assert [(r["resources"], r.get("resourceNames"), r["verbs"]) for r in namespaced["kube-system"]] == [
        (["configmaps"], ["gpu-binpack-scheduler-config"], ["get"])]
    assert set(namespaced) == {"metrics", "kube-system"}


@pytest.mark.unit
def test_the_plan_role_reads_config_maps_only_where_it_plans(tmp_path):
    config = _config(tmp_path)
    found = rbac_module.rules("plan", config, registry.enabled(config, load_playbook("default").steps))
    assert not [r for r in found.cluster if "configmaps" in r["resources"]]
    where = {ns for ns, rules in found.namespaced.items() for r in rules if "configmaps" in r["resources"]}
    assert where == {"gpu-bootstrap", "monitoring", "kube-system", "gpu-bootstrap-admission", "gpu-operator"}


@pytest.mark.unit
def test_doctor_runs_no_probe_and_without_admission_policies_no_dry_run_pod(tmp_path):
    config = _config(tmp_path)
    assert not [r for r in _every("doctor", config) if "daemonsets" in r["resources"] and "create" in r["verbs"]]
    assert not [r for r in rbac_module.rules("doctor", config, registry.enabled(config, load_playbook("default").steps)).cluster if "pods" in r["resources"] and "create" in r["verbs"]]
    assert [r for r in _every("doctor", config) if r["resources"] == ["pods"] and "create" in r["verbs"]]
    assert not [r for r in _every("doctor", config, admission_policies=False)
                if "pods" in r["resources"] and "create" in r["verbs"]]


@pytest.mark.unit
def test_every_rule_says_who_needs_it(tmp_path):
    config = _config(tmp_path)
    for command in rbac_module.COMMANDS:
        for rule in _every(command, config):
            assert rule[rbac_module.WHY] and all(rule[rbac_module.WHY]), (command, rule)


@pytest.mark.unit
@pytest.mark.parametrize("command, args, said", [
    ("dry-run", ["--kube-version", "1.33"], "--for dry-run needs --service-account"),
    ("doctor", ["--kube-version", "1.33"], "--for doctor needs --service-account"),
    ("dry-run", ["--kube-version", "1.29", "--service-account", "ci/x"], "use --for plan"),
    ("probe", ["--kube-version", "1.29", "--service-account", "ci/x"], "serves no ValidatingAdmissionPolicy"),
    ("status", ["--prometheus", "monitoring/x;y"], "--prometheus 'monitoring/x;y' is not NAMESPACE/SERVICE"),
])
def test_rbac_refuses_what_would_not_hold(tmp_path, command, args, said):
    config = tmp_path / "c.yaml"
    config.write_text("nodes: [{name: node5}]\n")
    result = runner.invoke(app, ["rbac", "--for", command, "-c", str(config), *args, "--log-file",
                                 str(tmp_path / "log")])
    assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output


@pytest.mark.unit
def test_the_kept_identities_print_their_policy_first_and_every_shell_line_is_quoted(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("nodes: [{name: node5}]\n")
    for command in ("dry-run", "doctor", "probe"):
        result = runner.invoke(app, ["rbac", "--for", command, "-c", str(config), "--kube-version", "1.33",
                                     "--service-account", "ci/bot", "--log-file", str(tmp_path / "log")])
        assert result.exit_code == 0, result.output
        docs = [d for d in yaml.safe_load_all(result.stdout) if d]
        assert [d["kind"] for d in docs[:2]] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
        assert docs[0]["spec"]["matchConditions"][0]["expression"] == \
            'request.userInfo.username == "system:serviceaccount:ci:bot"'
    up = runner.invoke(app, ["rbac", "--for", "up", "-c", str(config), "--service-account", "ci/bot"])
    assert "CLUSTER-ADMIN-EQUIVALENT" in up.stdout and "--duration=1h" in up.stdout
    import shlex
    for line in up.stdout.splitlines():
        if line.startswith("#   kubectl "):
            assert shlex.split(line[4:])[0] == "kubectl" and ";" not in line
