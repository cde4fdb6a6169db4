"""The live suite's checks that need the real control plane of tests/localcluster: exemptions judged by the real
API server's requester, the real PodSecurity plugin, RBAC roles with TokenRequest tokens, the real CRD schemas, the
bin-packing kube-scheduler's Lease and placements (against `simulate`), `doctor` and `status`.

They share the session's one `up` with tests/live/test_live.py (same worker, same cluster) and are skipped
on the emulator (which has its own tests for each) and on external clusters (whose nodes are not KWOK's).
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import yaml

from tests.live.conftest import SCHEDULER, TEST_NAMESPACE, create, pause_pod, wait_bound

pytestmark = [pytest.mark.live, pytest.mark.tools, pytest.mark.slow, pytest.mark.xdist_group("live"),
              pytest.mark.usefixtures("test_pods")]
OPERATOR_NS = "gpu-operator"
SA_NAMESPACE, SA_NAME = "gpu-bootstrap-live-ci", "gpu-bootstrap"


@pytest.fixture(autouse=True)
def local_only(target):
    if not target.local:
        pytest.skip("needs the local real cluster (tests/localcluster); the emulator's own tests cover this there")


def wait_until(probe, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f}s")
        time.sleep(0.5)


# --- admission through the real chain --------------------------------------------------------------------------------
def test_a_daemonset_in_the_operators_namespace_is_exempt_and_a_tenant_pod_naming_a_node_is_not(deployment, target):
    """The webhook judges the requester the API server authenticated: pods the real DaemonSet controller creates in
    the gpu-operator namespace keep the default scheduler; a tenant's GPU pod that names its node is rejected."""
    deployment.ensure()
    template = pause_pod("x")
    template["spec"].pop("terminationGracePeriodSeconds")
    daemonset = {"apiVersion": "apps/v1", "kind": "DaemonSet",
                 "metadata": {"name": "live-test-plugin", "namespace": OPERATOR_NS},
                 "spec": {"selector": {"matchLabels": {"app": "live-test-plugin"}},
                          "template": {"metadata": {"labels": {"app": "live-test-plugin"}},
                                       "spec": {**template["spec"],
                                                "nodeSelector": {"kubernetes.io/hostname": sorted(deployment.nodes)[0]}}}}}
    target.kubectl("apply", "-f", "-", input=json.dumps(daemonset))
    try:
        pods = wait_until(lambda: target.json("get", "pods", "-n", OPERATOR_NS, "-l", "app=live-test-plugin")["items"],
                          120, "the DaemonSet controller created no pod (was it refused? kubectl describe ds)")
        assert pods[0]["spec"]["schedulerName"] == "default-scheduler", pods[0]["spec"]
        assert pods[0]["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
    finally:
        target.kubectl("delete", "daemonset", "live-test-plugin", "-n", OPERATOR_NS, "--wait=true")
    pinned = pause_pod("pinned")
    pinned["spec"]["nodeName"] = sorted(deployment.nodes)[0]
    refused = create(target, pinned, check=False)
    assert refused.returncode != 0, "a tenant's GPU pod naming its node was admitted"
    assert "spec.nodeName" in refused.stderr and "denied the request" in refused.stderr, refused.stderr


def test_a_gpu_pod_as_users_write_it_is_steered_tolerated_and_scheduled(deployment, target):
    """A tenant's GPU pod with no toleration and no scheduler name, after `up` in mode mutate: the real API server's
    admission chain (our webhook through OPA) steers it to the bin-packing scheduler and gives it the GPU taint's
    toleration, and the real bin-packing scheduler binds it to a GPU node that node-prep tainted. Found: such a pod
    stayed Pending, as the API server here (like kubeadm's) runs no ExtendedResourceToleration plugin."""
    deployment.ensure()
    plain = pause_pod("plain-gpu-pod")
    plain["spec"].pop("tolerations")
    assert "schedulerName" not in plain["spec"]
    stored = create(target, plain)
    assert stored["spec"]["schedulerName"] == SCHEDULER, stored["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"} in \
        stored["spec"]["tolerations"], stored["spec"]["tolerations"]
    node = wait_bound(target, "plain-gpu-pod")
    taints = target.json("get", "node", node)["spec"].get("taints") or []
    assert node in deployment.nodes and any(t["key"] == "nvidia.com/gpu" for t in taints), (node, taints)


def test_our_namespaces_pod_security_labels_are_enforced_by_the_real_plugin(deployment, target):
    deployment.ensure()
    namespaces = target.json("get", "namespaces", "-l", "app.kubernetes.io/managed-by=gpu-bootstrap")["items"]
    enforced = {n["metadata"]["name"]: n["metadata"]["labels"].get("pod-security.kubernetes.io/enforce")
                for n in namespaces}
    strict = [name for name, level in enforced.items() if level in ("restricted", "baseline")]
    assert strict, f"no namespace of ours enforces baseline or restricted: {enforced}"
    for namespace in strict:
        privileged = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged", "namespace": namespace},
                      "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                               "securityContext": {"privileged": True}}]}}
        refused = target.kubectl("create", "-f", "-", "--dry-run=server", input=json.dumps(privileged), check=False)
        assert refused.returncode != 0, f"a privileged pod was admitted in {namespace} ({enforced[namespace]})"
        assert f'violates PodSecurity "{enforced[namespace]}:' in refused.stderr, refused.stderr


# --- RBAC: each generated role, bound to a ServiceAccount, with a token from the TokenRequest API -------------------
SERVICE_ACCOUNT = f"{SA_NAMESPACE}/{SA_NAME}"


def grant(target, deployment, command: str, folder: Path, drop: tuple[str, str, str] | None = None) -> Path:
    from tests.live.identities import grant as grant_identity
    return grant_identity(target, deployment, command, folder, SERVICE_ACCOUNT, drop)


def can_i(target, verb: str, resource: str) -> bool:
    from tests.live.identities import can_i as may
    return may(target, SERVICE_ACCOUNT, verb, resource)


def run_as(target, deployment, kubeconfig: Path, command: str):
    args = {"up": ["up", "--preflight-report", str(deployment.report)],
            "dry-run": ["up", "--dry-run", "--preflight-report", str(deployment.report)],
            "plan": ["up", "--dry-run=client", "--preflight-report", str(deployment.report)],
            "status": ["status"], "doctor": ["doctor", "--no-nodes"],
            "probe": ["doctor", "--via", "cluster"]}[command]
    if command != "status":
        args += ["-c", str(deployment.config), "--playbook", str(target.playbook)]
    return target.cli(*args, "--kubeconfig", str(kubeconfig))


def as_token(kubeconfig: Path, *args: str, input: str | None = None):
    from tests.live.identities import as_token as token_kubectl
    return token_kubectl(kubeconfig, *args, input=input)


SELF_ADMIN = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
              "metadata": {"name": "live-test-self-admin"},
              "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
              "subjects": [{"kind": "ServiceAccount", "name": SA_NAME, "namespace": SA_NAMESPACE}]}
PLANTED_LIVE_VALUE = "planted-live-s3cret-4417"  # a chart's env value changed by hand: the plan names it, never says it


def refused_requests(log: Path, command: str) -> list[str]:
    """The requests of a run the API server refused, from its log. The plan role's refusals by design are left
    out: Secrets (those steps are unknown) and the cluster-wide list of our ConfigMaps (it lists them where it plans
    instead, and says so)."""
    expected = ('"secrets"', "secrets is forbidden", 'secrets "',
                'cannot list resource "configmaps" in API group "" at the cluster scope') if command == "plan" else ()
    return [line for line in log.read_text().splitlines()
            if "forbidden" in line and not any(known in line for known in expected)]


@pytest.mark.parametrize("command", ["status", "doctor", "probe", "plan", "dry-run", "up"])
def test_each_generated_role_lets_its_command_succeed_and_a_removed_rule_is_named_in_a_403(
        deployment, target, command, tmp_path):
    """Each `rbac --for` role (with its admission policy, for the kept identities), bound to a ServiceAccount whose
    token comes from the TokenRequest API: its command succeeds with no request refused, and fails with a 403 naming
    `list nodes` once that rule is removed. `probe` runs doctor with the in-cluster node probe.

    The same grant also proves (one grant and one run per role keep the live worker short):
    - no pipeline role can bind cluster-admin to itself, for real or as a server-side dry run (RBAC's escalation
      check: the dry-run and up roles may bind only the roles they name); tests/live/test_attacks.py attacks each
      role in every way the review did;
    - the plan role reads no Secret and writes nothing;
    - the plan role's `up --dry-run=client`, which cannot read helm's record of a release, finds values of a
      chart's objects changed by hand (the Prometheus' retention, a Grafana env value) by rendering the chart and
      comparing the live objects, and names each by its path, never its value; every other step is unchanged (the
      webhook's, whose certificate's Secret it may not read, by what runs: the certificate's hash, the CA trusted)."""
    deployment.ensure()
    prometheus = target.json("get", "prometheus", "-n", "monitoring")["items"][0]
    name, before = prometheus["metadata"]["name"], prometheus["spec"].get("retention")
    drifted = "3d" if before != "3d" else "4d"
    grafana = None
    try:
        kubeconfig = grant(target, deployment, command, tmp_path)
        wait_until(lambda: can_i(target, "list", "nodes"), 30, "the role did not take effect")
        if command == "plan":
            target.kubectl("patch", "prometheus", name, "-n", "monitoring", "--type", "merge", "-p",
                           json.dumps({"spec": {"retention": drifted}}))
            grafana = plant_grafana_env(target)
        result, document, log = run_as(target, deployment, kubeconfig, command)
        if command == "probe":  # KWOK runs no container: the probe pods were made and report nothing (unknown)
            said = [c["message"] for n in document["nodes"] for c in n["checks"]]
            assert any("not a probe result" in m for m in said), said
        else:
            assert result.exit_code == 0, f"{command} failed with its own role (log: {log}):\n{result.output}"
        if command == "plan":
            message = next(s for s in document["steps"] if s["id"] == "monitoring")["message"]
            assert_plan_names_only_the_drift(document, f"Prometheus monitoring/{name}: spec.retention: the live "
                                                       f"value differs from the rendered one")
            assert f"env[{grafana[1]}].value: the live value differs from the rendered one" in message or \
                "(and " in message, message
            for shown in (result.output, log.read_text()):
                assert PLANTED_LIVE_VALUE not in shown and f"'{grafana[2]}'" not in shown
            assert_plan_role_reads_no_secret_and_writes_nothing(target, deployment, kubeconfig)
        assert refused_requests(log, command) == [], f"a request of {command} was refused (log: {log})"
        if command in ("plan", "dry-run", "up"):
            assert_cannot_bind_cluster_admin_to_itself(target, kubeconfig, command)
        kubeconfig = grant(target, deployment, command, tmp_path, drop=("ClusterRole", "nodes", "list"))
        wait_until(lambda: not can_i(target, "list", "nodes"), 30, "the removed rule still applies")
        result, document, log = run_as(target, deployment, kubeconfig, command)
        assert result.exit_code != 0, f"{command} succeeded without `list nodes`"
        said = " ".join(result.output.replace('\\"', '"').split())  # the JSON document escapes the quotes
        assert (f'User "system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}" cannot list resource "nodes" in API group '
                f'"" at the cluster scope') in said, said
    finally:
        if command == "plan":
            target.kubectl("patch", "prometheus", name, "-n", "monitoring", "--type", "merge", "-p",
                           json.dumps({"spec": {"retention": before}}))
            if grafana is not None:
                restore_grafana_env(target, grafana)
        target.kubectl("delete", "clusterrolebinding", "live-test-self-admin", "--ignore-not-found", check=False)
        from tests.live.identities import remove_all
        remove_all(target, SA_NAMESPACE)


def test_the_dry_run_role_plans_an_empty_cluster_with_no_request_refused(deployment, target):
    """Before the session's first `up`, `up --dry-run` as a token of `rbac --for dry-run` (kept dry by its policy):
    it plans every step and no request is refused, though the role holds no write on webhook configurations (those
    are judged client-side) and nothing it sends is stored."""
    if deployment.empty_dry_run is None:
        pytest.skip("the empty cluster's dry run runs before the session's first `up`; this session began after it")
    result, document, log = deployment.empty_dry_run
    assert result.exit_code == 0, f"up --dry-run as the dry-run role failed (log: {log}):\n{result.output}"
    assert refused_requests(log, "dry-run") == [], f"a request was refused (log: {log})"
    statuses = {s["id"]: s["status"] for s in document["steps"]}
    assert set(statuses.values()) <= {"planned", "unchanged", "skipped"}, statuses
    assert statuses["admission"] == statuses["monitoring"] == "planned", statuses
    assert "judged client-side" in log.read_text()


def plant_grafana_env(target) -> tuple[str, str, str]:
    """Change one env value the chart renders in Grafana's Deployment to a planted one; returns (container, env
    name, the rendered value) to put back."""
    found = target.json("get", "deployment", "-n", "monitoring", "-l", "app.kubernetes.io/name=grafana")["items"][0]
    for container in found["spec"]["template"]["spec"]["containers"]:
        for entry in container.get("env") or []:
            if "value" in entry and entry["value"]:
                patch = {"spec": {"template": {"spec": {"containers": [
                    {"name": container["name"], "env": [{"name": entry["name"], "value": PLANTED_LIVE_VALUE}]}]}}}}
                target.kubectl("patch", "deployment", found["metadata"]["name"], "-n", "monitoring", "-p",
                               json.dumps(patch))
                return found["metadata"]["name"], entry["name"], entry["value"]
    raise AssertionError("Grafana's Deployment renders no env value to change")


def restore_grafana_env(target, grafana: tuple[str, str, str]) -> None:
    deployment_name, env, value = grafana
    found = target.json("get", "deployment", deployment_name, "-n", "monitoring")
    for container in found["spec"]["template"]["spec"]["containers"]:
        for entry in container.get("env") or []:
            if entry["name"] == env:
                entry["value"] = value
    target.kubectl("replace", "-f", "-", input=json.dumps(found))


def assert_plan_names_only_the_drift(document: dict, drift: str) -> None:
    steps = {s["id"]: s for s in document["steps"]}
    assert steps["monitoring"]["status"] == "planned", steps["monitoring"]
    assert drift in steps["monitoring"]["message"], steps["monitoring"]["message"]
    # the charts' releases compared through their live objects: up to date but for the drift; the webhook's steps
    # without its certificate's Secret: OPA kept with the certificate it runs with, the webhook with the CA it trusts
    changed = [f'{i} {s["status"]}: {s["message"]}' for i, s in steps.items()
               if s["status"] not in ("unchanged", "skipped") and i != "monitoring"]
    assert not changed, "\n".join(changed)
    assert document["plan"].startswith("0 to create, 1 to change, 0 to remove (1 change(s) planned in monitoring)")
    assert "unknown" not in document["plan"], document["plan"]
    assert document["kubernetes"]["source"] == "the cluster's", document["kubernetes"]


def assert_plan_role_reads_no_secret_and_writes_nothing(target, deployment, kubeconfig: Path) -> None:
    from tests.live.identities import generate
    for what in (["secrets", "-A"], ["secrets", "-n", "gpu-bootstrap"]):
        read = as_token(kubeconfig, "get", *what)
        assert read.returncode != 0 and 'cannot list resource "secrets"' in read.stderr, read.stderr
    made = as_token(kubeconfig, "create", "configmap", "live-test-x", "-n", "default")
    assert made.returncode != 0 and 'cannot create resource "configmaps"' in made.stderr, made.stderr
    rules = [r for d in yaml.safe_load_all(generate(target, deployment, "plan", None)) if d
             for r in d.get("rules") or []]
    assert {v for r in rules for v in r["verbs"]} <= {"get", "list"}
    assert not [r for r in rules if "secrets" in r["resources"]]


def assert_cannot_bind_cluster_admin_to_itself(target, kubeconfig: Path, command: str) -> None:
    for dry in ([], ["--dry-run=server"]):
        made = as_token(kubeconfig, "create", "-f", "-", *dry, input=json.dumps(SELF_ADMIN))
        assert made.returncode != 0, f"{command}: bound cluster-admin to itself {dry}"
        assert "forbidden" in made.stderr, made.stderr
    assert target.kubectl("get", "clusterrolebinding", "live-test-self-admin", check=False).returncode != 0


# --- CRD schemas ------------------------------------------------------------------------------------------------------
def test_every_custom_object_we_render_is_accepted_by_its_real_crd_schema(deployment, target, tmp_path):
    """ClusterPolicy, ServiceMonitor and PrometheusRule against the CRDs the charts installed; NodePool and
    EC2NodeClass against Karpenter's CRDs (tests/data/karpenter), installed here for the check and removed."""
    from tests.tools import ROOT
    deployment.ensure()
    karpenter = sorted((ROOT / "tests" / "data" / "karpenter").glob("*.yaml"))
    for crd in karpenter:
        target.kubectl("apply", "--server-side", "-f", str(crd))
    try:
        target.wait_established("nodepools.karpenter.sh", "ec2nodeclasses.karpenter.k8s.aws")
        config = deployment.config.read_text() + (
            "pools:\n  - name: a100\n    role: KarpenterNodeRole-live\n    discovery_tag: live\n")
        (tmp_path / "gpu-bootstrap.yaml").write_text(config)
        render = tmp_path / "render"
        # offline: everything rendered as for a fresh cluster, the charts' manifests included (on this cluster the
        # plan would leave out what is already in place)
        result, document, log = target.cli("up", "--dry-run", "--offline", "--kube-version",
                                           target.cluster.version.lstrip("v"), "-c", str(tmp_path / "gpu-bootstrap.yaml"),
                                           "--playbook", str(target.playbook), "--preflight-report",
                                           str(deployment.report), "--render-dir", str(render))
        assert result.exit_code == 0, result.output
        kinds = {}
        for path in sorted(render.rglob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if isinstance(doc, dict) and doc.get("kind") in ("ClusterPolicy", "ServiceMonitor",
                                                                  "PrometheusRule", "NodePool", "EC2NodeClass"):
                    kinds.setdefault(doc["kind"], []).append(doc)
        assert set(kinds) == {"ClusterPolicy", "ServiceMonitor", "PrometheusRule", "NodePool", "EC2NodeClass"}, \
            sorted(kinds)
        for kind, docs in kinds.items():
            for doc in docs:
                doc["metadata"]["name"] = f"schema-{doc['metadata']['name']}"[:63]
                checked = target.kubectl("create", "-f", "-", "--dry-run=server", "--validate=strict",
                                         input=json.dumps(doc), check=False)
                assert checked.returncode == 0, f"{kind} {doc['metadata']['name']}: {checked.stderr}"
    finally:
        for crd in karpenter:
            target.kubectl("delete", "-f", str(crd), "--ignore-not-found", "--wait=true")


# --- the bin-packing scheduler ----------------------------------------------------------------------------------------
def test_the_scheduler_holds_its_lease_as_one_of_its_deployments_pods(deployment, target):
    deployment.ensure()
    lease = target.json("get", "lease", SCHEDULER, "-n", "kube-system")
    pods = target.json("get", "pods", "-n", "kube-system", "-l", f"app.kubernetes.io/name={SCHEDULER}")["items"]
    names = {p["metadata"]["name"] for p in pods}
    holder = lease["spec"]["holderIdentity"]
    assert holder.split("_")[0] in names, (holder, names)


SCENARIO = [  # (GPUs, cpu millicores, memory MiB), placed one at a time after a pinned 3-GPU pod on the second node
    (1, 500, 1024), (2, 4000, 8192), (1, 250, 512), (1, 1000, 4096), (2, 2000, 2048), (1, 100, 128)]


def test_the_real_scheduler_places_a_fixed_scenario_as_simulate_predicts(deployment, target):
    """The real kube-scheduler running the rendered profile against `simulate`'s model of it (gpu_bootstrap.sim),
    from the same starting state (what already runs on the nodes, read as `simulate --from-cluster` reads it). The
    pinned pod makes every later choice unique, so neither side breaks a tie at random."""
    from gpu_bootstrap.adapters.kube import Kube
    from gpu_bootstrap.sim import engine, scoring, trace
    from gpu_bootstrap.core.versions import server_version
    deployment.ensure()
    first, second = sorted(deployment.nodes)[:2]
    pinned = pause_pod("pinned-3", gpus=3, scheduler=SCHEDULER)
    pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": second}
    create(target, pinned)
    assert wait_bound(target, "pinned-3") == second
    config = target.json("get", "configmap", "-n", "kube-system", f"{SCHEDULER}-config")["data"]
    kube = Kube(target.kubeconfig)
    version = server_version(kube.version())  # kube-scheduler 1.36+ scores BalancedAllocation differently
    profile = scoring.profile_from_config(yaml.safe_load(next(iter(config.values()))), 0, version)
    nodes, used = trace.cluster_snapshot(kube)
    gpu_nodes = [n for n in nodes if n.gpus]
    model = engine.Scheduler(engine.Cluster(gpu_nodes, {n.name: used.get(n.name, []) for n in gpu_nodes}),
                             profile, random.Random(0))
    predicted, placed = [], []
    for index, (gpus, cpu, memory) in enumerate(SCENARIO):
        pod = pause_pod(f"scenario-{index}", gpus=gpus, scheduler=SCHEDULER)
        pod["spec"]["containers"][0]["resources"]["requests"].update({"cpu": f"{cpu}m", "memory": f"{memory}Mi"})
        pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = f"{memory}Mi"
        chosen = model.place(trace.pod_from_spec(pod["spec"]))
        predicted.append(gpu_nodes[chosen].name if chosen is not None else None)
        create(target, pod)
        placed.append(bound_or_unschedulable(target, f"scenario-{index}"))
    assert placed == predicted, f"real {placed} != simulate {predicted}"
    assert None in placed and len(set(placed) - {None}) == 2  # both nodes used, and the last pod did not fit


def bound_or_unschedulable(target, name: str, timeout: float = 120) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = target.json("get", "pod", name, "-n", TEST_NAMESPACE)
        if pod["spec"].get("nodeName"):
            return pod["spec"]["nodeName"]
        if any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or []):
            return None
        time.sleep(0.3)
    raise AssertionError(f"pod {name} was neither bound nor reported unschedulable within {timeout:.0f}s")


# --- doctor -----------------------------------------------------------------------------------------------------------
def test_doctor_finds_every_step_in_place_on_the_real_cluster(deployment, target):
    deployment.ensure()
    result, document, log = target.cli("doctor", "--no-nodes", "-c", str(deployment.config), "--playbook",
                                       str(target.playbook))
    assert result.exit_code == 0, f"doctor failed (log: {log}):\n{result.output}"
    checks = _checks(document)
    assert {c["id"] for c in checks} >= {"node-prep", "monitoring", "gpu-operator", "binpack-scheduler",
                                         "admission-opa", "admission", "validate"}, checks
    assert [c for c in checks if c.get("status") == "fail"] == []


def test_a_second_up_doctor_and_export_use_the_recorded_facts_and_refuse_them_for_a_replaced_node(
        deployment, target, tmp_path):
    """Issue 56: the in-cluster probe cannot read KWOK's nodes (their pods never finish), as on a cluster whose
    probe is refused. The session's `up` was given a report; a second `up`, `doctor`, `images` and an online
    `export` without one use the facts that run recorded, say so and how old they are, and change nothing. A node replaced under the
    same name (a new machine ID and boot ID in its status, as a new machine's kubelet reports) gets no stale facts:
    `up` stops before any change, naming the node and why."""
    deployment.ensure()
    config = yaml.safe_load(deployment.config.read_text())
    config["preflight"] = {"timeout": 3}  # the probe gives up fast on KWOK's nodes
    path = tmp_path / "no-report.yaml"
    path.write_text(yaml.safe_dump(config))
    args = ["-c", str(path), "--playbook", str(target.playbook)]
    result, document, log = target.cli("up", *args)
    assert result.exit_code == 0, f"up without a report failed (log: {log}):\n{result.output}"
    steps = {s["id"]: s for s in document["steps"]}
    assert "recorded facts for " in steps["preflight"]["message"], steps["preflight"]
    assert {s["status"] for s in document["steps"]} <= {"unchanged", "skipped"}, document["steps"]
    result, document, log = target.cli("doctor", *args)
    assert result.exit_code == 0, f"doctor failed (log: {log}):\n{result.output}"
    assert {n["name"]: n.get("came_from") for n in document["nodes"]} == {n: "recorded" for n in deployment.nodes}
    result, document, log = target.cli("images", *args)
    assert result.exit_code == 0, f"images failed (log: {log}):\n{result.output}"
    assert not [n for n in document["notes"] if "unknown" in n], document["notes"]  # the nodes' OS was known
    out = tmp_path / "bundle"
    exported = run_export(target, ["export", "--format", "helmfile", "-o", str(out), *args,
                                   "--certificates", "cert-manager"])
    assert exported.exit_code == 0, exported.output
    assert (out / "helmfile.yaml").is_file()
    node = sorted(deployment.nodes)[0]
    before = target.json("get", "node", node)["status"]["nodeInfo"]
    replaced = {"machineID": "0" * 32, "bootID": "00000000-0000-4000-8000-000000000000"}
    try:
        target.kubectl("patch", "node", node, "--subresource=status", "--type=merge",
                       "-p", json.dumps({"status": {"nodeInfo": replaced}}))
        result, document, log = target.cli("up", *args)
        assert result.exit_code == 1, result.output
        assert f"{node}: ssh:" in document["error"] and "machine ID changed" in document["error"], document["error"]
        assert not [s for s in document.get("steps") or [] if s["status"] == "applied"], document["steps"]
    finally:
        target.kubectl("patch", "node", node, "--subresource=status", "--type=merge",
                       "-p", json.dumps({"status": {"nodeInfo": {k: before[k] for k in replaced}}}))


def _checks(document: dict) -> list[dict]:
    found = []

    def walk(value):
        if isinstance(value, dict):
            if "status" in value and "id" in value:
                found.append(value)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
    walk(document)
    return found


# --- GitOps exports ---------------------------------------------------------------------------------------------------
def test_each_export_format_passes_a_server_side_dry_run_with_the_engines_crds(deployment, target, tmp_path):
    """`export` for this cluster (its version; the very config the session's `up` used, with local charts and a
    generated CA, made fit for Git by export's overrides: --certificates cert-manager, and for the engines that
    fetch charts --chart-repository default), each format sent to the real API server as a server-side dry run,
    with the engines' own CRDs (Argo CD's Application, Flux's Kustomization/HelmRelease/HelmRepository,
    cert-manager's Issuer/Certificate, from their Go modules) installed for the check and removed: the engines'
    objects, our plain manifests and the charts rendered by `--format manifests` (CRDs included) are all accepted
    with strict field validation."""
    from tests.tools import ROOT
    deployment.ensure()
    crds = sorted((ROOT / ".tools" / "schemas").glob("*/*.yaml"))
    assert crds, "scripts/install-test-tools puts the engines' CRDs in .tools/schemas"
    version = target.json("version")["serverVersion"]["gitVersion"].lstrip("v")
    names = [yaml.safe_load(c.read_text())["metadata"]["name"] for c in crds]
    try:
        for crd in crds:
            target.kubectl("apply", "--server-side", "-f", str(crd))
        target.wait_established(*names)
        for namespace in ("argocd", "flux-system"):
            target.kubectl("create", "namespace", namespace, check=False)
        for engine in ("argocd", "flux", "helmfile", "manifests"):
            out = tmp_path / engine
            args = ["export", "--format", engine, "-o", str(out), "-c", str(deployment.config), "--playbook",
                    str(target.playbook), "--offline", "--kube-version", version, "--preflight-report",
                    str(deployment.report), "--certificates", "cert-manager"]
            if engine in ("argocd", "flux"):  # they fetch charts from repositories, not from this machine
                args += ["--chart-repository", "default"]
            if engine == "argocd":
                args += ["--repo-url", "https://git.example.com/fleet.git"]
            result = run_export(target, args)
            assert result.exit_code == 0, result.output
            assert "`admission.certificates` | generated | cert-manager" in (out / "README.md").read_text()
            files = engine_files(out, engine, tmp_path)
            assert files, engine
            sent = target.kubectl("apply", "--server-side", "--force-conflicts", "--dry-run=server",
                                  "--field-manager=gitops-export-check", *[a for f in files for a in ("-f", str(f))],
                                  check=False, timeout=300)
            assert sent.returncode == 0, f"{engine}: refused:\n{sent.stderr[-3000:]}"
            said = sent.stdout.count("(server dry run)")
            assert said >= len(files), f"{engine}: {said} objects sent for {len(files)} files:\n{sent.stdout}"
    finally:
        target.kubectl("delete", "crd", *names, "--ignore-not-found", "--wait=false", check=False)
        target.kubectl("delete", "namespace", "argocd", "flux-system", "--ignore-not-found", "--wait=false",
                       check=False)


def engine_files(out, engine: str, tmp_path) -> list:
    """What the engine sends to the API server: its own objects (Applications, Kustomizations, HelmReleases) and
    each unit of ours as the engine builds it (kustomize, or helm template for helmfile's local charts), written
    to files next to the export."""
    from tests.test_export import built_units
    own = [p for p in sorted(out.rglob("*.yaml")) if p.name in ("helmrelease.yaml", "helmrepository.yaml")
           or p.parent.name in ("apps", "flux") and p.name != "kustomization.yaml" or p.name == "app-of-apps.yaml"]
    built = []
    for unit, objects in built_units(out, engine, tmp_path).items():
        path = tmp_path / f"built-{engine}-{unit}.yaml"
        path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
        built.append(path)
    return own + built


def run_export(target, args: list[str]):
    from gpu_bootstrap.cli.commands import app
    from tests.conftest import _process_state_kept
    from tests.live.conftest import runner
    env = {k: v for k, v in target.env.items() if k.startswith("HELM_") or k in ("PATH",)}
    with _process_state_kept():
        return runner.invoke(app, [*args, "--log-file", str(target.artifacts / "export.log")], env=env)
