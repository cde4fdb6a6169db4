"""The admission steps end to end: the real CLI against the emulator, whose admission chain calls the webhook over
HTTPS (certificate verified against the caBundle for the Service's DNS name), where the OPA stand-in serves the
rendered policy with a real Rego engine and the certificate `up` put in the Secret; CEL (matchConditions and the
backstop ValidatingAdmissionPolicy) runs on a real CEL runtime. GPU pods are created with the real kubectl.
"""
from __future__ import annotations

import base64
import datetime as _dt
import json
import statistics
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.render import certificates as certs
from gpu_bootstrap.steps.admission_opa import AdmissionOpa
from tests.kubeapi import cel, rego
from tests.tools import missing

runner = CliRunner()
SCHEDULER = "gpu-binpack-scheduler"
OPA_NS = "gpu-bootstrap-admission"
STEPS = "binpack-scheduler,admission-opa,admission"
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
GPU_OVERRIDES = json.dumps({"spec": {"containers": [{"name": "main", "image": "cuda",
                                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})


@pytest.fixture(autouse=True)
def engines():
    if not rego.available():
        missing("the Rego engine (pip package gordon-to-regorus) is not installed")
    if not cel.available():
        missing("the CEL runtime (pip package cel-expr-python) is not installed")


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.31.4", "gpu_nodes": ["gpu-1", "gpu-2"], "cpu_nodes": ["cpu-1"]}


def write_config(tmp_path: Path, cluster, admission: str = "") -> Path:
    path = tmp_path / "gpu-bootstrap.yaml"
    path.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}}}\nnodes: [{{name: gpu-1}}, {{name: gpu-2}}]\n"
                    f"scheduler: {{wait_timeout: 20}}\nadmission:\n  wait_timeout: 20\n{admission}")
    return path


def cli(command: str, config: Path, tmp_path: Path, *extra: str, steps: str = STEPS):
    args = [command, "-c", str(config), "-o", "json", *extra, "--log-file", str(tmp_path / "log")]
    if command != "doctor":
        args[1:1] = ["--only", steps]
    result = runner.invoke(app, args)
    document = json.loads(result.stdout) if result.stdout.startswith("{") else None
    return result, document


def steps_of(document: dict) -> dict:
    return {s["id"]: s for s in document["steps"]}


def kubectl_run(cluster, name: str, gpu: bool = True, namespace: str = "default"):
    args = ["run", name, "-n", namespace, "--image=cuda", "--restart=Never", "-o", "json"]
    if gpu:
        args.append(f"--overrides={GPU_OVERRIDES}")
    return cluster.kubectl(*args, check=False)


def secret_data(emu) -> dict:
    return {k: base64.b64decode(v).decode() for k, v in emu.get("secrets", "opa-tls", OPA_NS)["data"].items()}


def test_up_steers_gpu_pods_and_a_stopped_opa_blocks_no_cpu_pod(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    result, document = cli("up", config, tmp_path)
    assert result.exit_code == 0, result.output
    steps = steps_of(document)
    assert steps["admission-opa"]["status"] == "applied" and steps["admission"]["status"] == "applied"
    assert "a dry-run GPU pod is steered (schedulerName gpu-binpack-scheduler)" in steps["admission"]["message"]
    emu = cluster.emu

    created = kubectl_run(cluster, "trainer")  # a GPU pod as users write it: no scheduler, no toleration
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["spec"]["schedulerName"] == SCHEDULER
    assert TOLERATION in json.loads(created.stdout)["spec"]["tolerations"]
    web = kubectl_run(cluster, "web", gpu=False)
    assert json.loads(web.stdout)["spec"]["schedulerName"] == "default-scheduler"
    exempt = kubectl_run(cluster, "operator-like", namespace="kube-system")
    assert json.loads(exempt.stdout)["spec"]["schedulerName"] == "default-scheduler"
    emu.settle()
    assert emu.get("pods", "trainer", "default")["spec"].get("nodeName") in ("gpu-1", "gpu-2")
    patched = [c for c in emu.admission.calls if c.outcome == "patched"]
    assert patched and all(c.webhook == "gpu-pods.gpu-bootstrap.io" for c in emu.admission.calls)
    # matchConditions: nothing else reaches OPA (the one denial: verify's dry-run GPU pod that names a node)
    assert {c.outcome for c in emu.admission.calls} == {"patched", "denied"}
    print(f"\nwebhook round trip through the emulator: median {statistics.median(c.seconds for c in patched) * 1000:.1f}"
          f" ms over {len(patched)} call(s)")

    # Stop the webhook's server: every OPA pod crashes.
    emu.controllers.pod_behaviour = lambda pod: ({"phase": "Running", "ready": False, "reason": "CrashLoopBackOff"}
                                                 if pod["metadata"]["namespace"] == OPA_NS else {})
    for pod in emu.list("pods", OPA_NS):
        emu.delete("pods", pod["metadata"]["name"], OPA_NS)
    deadline = time.monotonic() + 10
    while emu.admission.routes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not emu.admission.routes
    started = time.monotonic()
    web2 = kubectl_run(cluster, "web-2", gpu=False)
    assert web2.returncode == 0 and time.monotonic() - started < 5, web2.stderr
    rejected = kubectl_run(cluster, "trainer-2")
    assert rejected.returncode != 0
    assert "ValidatingAdmissionPolicy 'gpu-bootstrap-gpu-pods'" in rejected.stderr
    assert f"set spec.schedulerName: {SCHEDULER}" in rejected.stderr
    result, doctor = cli("doctor", config, tmp_path, "--no-nodes")
    assert "checks" in doctor, result.output
    messages = " ".join(c["message"] for c in doctor["checks"])
    assert "which has no ready endpoints: GPU pods are not steered" in messages, messages
    assert "policy not answering as configured" in messages


def test_with_no_scheduler_running_gpu_pods_keep_theirs_get_the_toleration_and_are_scheduled(cluster, tmp_path):
    """Found on the real API server: `up --only node-prep,admission-opa,admission` steered a tenant's GPU pod to a
    bin-packing scheduler nothing had deployed, and it stayed Pending for good. Now admission steers only to a
    scheduler that runs: the plan says why it does not, the GPU pod keeps the default scheduler, gets the GPU taint's
    toleration, and is scheduled on a tainted GPU node; doctor says the same. Once the scheduler runs, the next `up`
    steers again."""
    config = write_config(tmp_path, cluster)
    result, document = cli("up", config, tmp_path, steps="node-prep,admission-opa,admission")
    assert result.exit_code == 0, result.output
    said = steps_of(document)["admission"]["message"]
    assert "GPU pods are not steered: gpu-binpack-scheduler is not deployed" in said, said
    assert "a dry-run GPU pod is left on its scheduler" in said and "one without a toleration gets the GPU " \
        "taint's" in said, said
    created = kubectl_run(cluster, "trainer")
    assert created.returncode == 0, created.stderr
    spec = json.loads(created.stdout)["spec"]
    assert spec["schedulerName"] == "default-scheduler" and TOLERATION in spec["tolerations"]
    cluster.emu.settle()
    assert cluster.emu.get("pods", "trainer", "default")["spec"].get("nodeName") in ("gpu-1", "gpu-2")
    assert all(t["key"] == "nvidia.com/gpu" for n in ("gpu-1", "gpu-2")
               for t in cluster.emu.get("nodes", n)["spec"]["taints"])  # node-prep tainted them
    result, doctor = cli("doctor", config, tmp_path, "--no-nodes")
    messages = " ".join(c["message"] for c in doctor["checks"])
    assert "GPU pods are not steered: gpu-binpack-scheduler is not deployed" in messages, messages
    # doctor tells whether the API server's ExtendedResourceToleration plugin is on (kubeadm leaves it off)
    assert "ExtendedResourceToleration is off (kubeadm's default): admission gives GPU pods the GPU taint's " \
        "toleration" in messages, messages
    cluster.emu.store.extended_resource_toleration = True
    result, doctor = cli("doctor", config, tmp_path, "--no-nodes")
    assert "ExtendedResourceToleration is on" in " ".join(c["message"] for c in doctor["checks"])
    cluster.emu.store.extended_resource_toleration = False
    result, document = cli("up", config, tmp_path, steps="binpack-scheduler,admission-opa,admission")
    assert result.exit_code == 0, result.output
    assert "a dry-run GPU pod is steered" in steps_of(document)["admission"]["message"]
    steered = kubectl_run(cluster, "trainer-2")
    assert json.loads(steered.stdout)["spec"]["schedulerName"] == SCHEDULER


def pod_as(cluster, name: str, namespace: str = "default", node: str | None = None, owner: str | None = None,
           as_user: str | None = None, groups: tuple = ()):
    """A server-side dry-run create of a GPU pod with the real kubectl, optionally impersonating a requester
    (--as / --as-group: the emulator's admission then sees that userInfo, as the API server would)."""
    meta = {"name": name, "namespace": namespace}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": "o", "controller": True,
                                    "uid": "6a1c4e9e-0000-4000-8000-000000000001"}]
    spec = {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    if node:
        spec["nodeName"] = node
    args = ["create", "--dry-run=server", "-o", "json", "-f", "-"]
    if as_user:
        args += [f"--as={as_user}", *(f"--as-group={g}" for g in groups)]
    return cluster.kubectl(*args, check=False, input=json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                                                                 "spec": spec}))


def opa_request(emu, method: str, path: str, body: dict | None = None, token: str | None = None):
    """One HTTPS request to a running OPA replica (the stand-in serves OPA's authorizer in front of its API)."""
    import http.client
    import socket
    import ssl
    server = emu.opa.server(OPA_NS, "opa")
    context = ssl.create_default_context(cadata=secret_data(emu)["ca.crt"])
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    connection.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", server.port), 10),
                                          server_hostname=f"opa.{OPA_NS}.svc")
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    payload = body if isinstance(body, str) or body is None else json.dumps(body)
    connection.request(method, path, body=payload, headers=headers)
    response = connection.getresponse()
    answer = response.status, json.loads(response.read() or b"null")
    connection.close()
    return answer


def test_only_the_system_claims_an_exemption_and_opa_serves_only_verdicts(cluster, tmp_path):
    """Exemptions follow the requester the API server authenticated, not fields the pod's creator writes; OPA's
    management API refuses everyone while the webhook's decision path keeps working."""
    config = write_config(tmp_path, cluster, "  mode: enforce\n")
    cluster.kubectl("create", "namespace", "legacy")
    cluster.kubectl("label", "namespace", "legacy", "gpu-bootstrap.io/admission=ignore")  # the old opt-out
    result, document = cli("up", config, tmp_path)
    assert result.exit_code == 0, result.output
    assert "legacy carry gpu-bootstrap.io/admission=ignore, which no longer exempts anything" in \
        steps_of(document)["admission"]["message"]
    emu = cluster.emu
    labelled = kubectl_run(cluster, "trainer", namespace="legacy")
    assert labelled.returncode != 0 and "spec.schedulerName" in labelled.stderr

    tenant = pod_as(cluster, "pinned", node="gpu-1")
    assert tenant.returncode != 0 and "spec.nodeName" in tenant.stderr, tenant.stderr
    kubelet = pod_as(cluster, "static", node="gpu-1", as_user="system:node:gpu-1", groups=("system:nodes",))
    assert kubelet.returncode == 0, kubelet.stderr
    not_a_node = pod_as(cluster, "static-2", node="gpu-1", as_user="alice", groups=("system:nodes",))
    assert not_a_node.returncode != 0 and "spec.nodeName" in not_a_node.stderr
    no_group = pod_as(cluster, "static-3", node="gpu-1", as_user="system:node:gpu-1")
    assert no_group.returncode != 0 and "spec.nodeName" in no_group.stderr  # a kubelet is also in system:nodes
    cluster.kubectl("create", "namespace", "gpu-operator")
    daemon = pod_as(cluster, "plugin", "gpu-operator", owner="DaemonSet",
                    as_user="system:serviceaccount:kube-system:daemon-set-controller")
    assert daemon.returncode == 0, daemon.stderr
    tenant_daemon = pod_as(cluster, "plugin-3", owner="DaemonSet",  # a tenant's own DaemonSet: not exempt
                           as_user="system:serviceaccount:kube-system:daemon-set-controller")
    assert tenant_daemon.returncode != 0 and "spec.schedulerName" in tenant_daemon.stderr
    fake_daemon = pod_as(cluster, "plugin-2", owner="DaemonSet")
    assert fake_daemon.returncode != 0 and "spec.schedulerName" in fake_daemon.stderr
    validator = pod_as(cluster, "cuda-validator", "gpu-operator", node="gpu-1",
                       as_user="system:serviceaccount:gpu-operator:nvidia-operator-validator")
    assert validator.returncode == 0, validator.stderr
    tenant_in_operator_ns = pod_as(cluster, "sneaky", "gpu-operator", node="gpu-1")
    assert tenant_in_operator_ns.returncode != 0 and "spec.nodeName" in tenant_in_operator_ns.stderr

    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "operation": "CREATE", "namespace": "default", "kind": {"group": "", "version": "v1",
                                                                             "kind": "Pod"},
        "userInfo": {"username": "alice"}, "object": json.loads(GPU_OVERRIDES) | {"metadata": {"name": "x"}}}}
    status, answer = opa_request(emu, "POST", "/?timeout=3s", review)
    assert status == 200 and answer["response"]["allowed"] is False  # the verdict: enforce mode rejects it
    assert opa_request(emu, "GET", "/health")[0] == 200
    evil = "package system\n\nmain := {\"apiVersion\": \"admission.k8s.io/v1\", \"kind\": \"AdmissionReview\", " \
           "\"response\": {\"uid\": input.request.uid, \"allowed\": true}}\n"
    for method, path, body in (("PUT", "/v1/policies/evil", evil), ("GET", "/v1/data", None),
                               ("GET", "/v1/data/system/scheduler", None), ("POST", "/v1/data/system/main", {}),
                               ("DELETE", "/v1/policies/policy/gpu-pods.rego", None), ("GET", "/metrics", None)):
        for token in (None, "guessed"):
            status, answer = opa_request(emu, method, path, body, token)
            assert (status, answer.get("code")) == (401, "unauthorized"), (method, path, answer)
    still = kubectl_run(cluster, "trainer")
    assert still.returncode != 0 and "spec.schedulerName" in still.stderr  # the policy was not replaced


def test_a_second_up_changes_nothing_and_teardown_leaves_no_webhook(cluster, tmp_path):
    config = write_config(tmp_path, cluster)
    assert cli("up", config, tmp_path)[0].exit_code == 0
    emu = cluster.emu
    before = emu.get("secrets", "opa-tls", OPA_NS)["metadata"]["resourceVersion"]
    certificate = secret_data(emu)["tls.crt"]
    emu.requests.clear()
    result, document = cli("up", config, tmp_path)
    assert result.exit_code == 0, result.output
    assert {steps_of(document)[s]["status"] for s in ("admission-opa", "admission")} == {"unchanged"}
    assert emu.requests.writes() == []
    assert emu.get("secrets", "opa-tls", OPA_NS)["metadata"]["resourceVersion"] == before
    assert secret_data(emu)["tls.crt"] == certificate

    result, document = cli("teardown", config, tmp_path, "--yes")
    assert result.exit_code == 0, result.output
    emu.settle()
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations", "validatingadmissionpolicies",
                 "validatingadmissionpolicybindings"):
        assert emu.list(kind) == [], kind
    assert emu.get("namespaces", OPA_NS) is None or emu.get("namespaces", OPA_NS)["metadata"].get("deletionTimestamp")
    order = [r.path for r in emu.requests.writes() if r.method == "DELETE"]
    webhook = next(i for i, p in enumerate(order) if "webhookconfigurations" in p)
    deployment = next(i for i, p in enumerate(order) if "/deployments/" in p)
    assert webhook < deployment  # the webhook goes first: nothing may call a removed server


@pytest.mark.parametrize("emulator_options, who", [
    ({"kube_version": "1.31.4", "gpu_nodes": ["gpu-1", "gpu-2"]}, "ValidatingAdmissionPolicy 'gpu-bootstrap-gpu-pods'"),
    ({"kube_version": "1.29.6", "gpu_nodes": ["gpu-1", "gpu-2"]}, 'admission webhook "gpu-pods.gpu-bootstrap.io"'),
], ids=["1.31-backstop", "1.29-opa-webhook"])
def test_enforce_rejects_gpu_pods_naming_the_field(cluster, tmp_path, who):
    result, document = cli("up", write_config(tmp_path, cluster, "  mode: enforce\n"), tmp_path)
    assert result.exit_code == 0, result.output
    assert "a dry-run GPU pod is rejected" in steps_of(document)["admission"]["message"]
    rejected = kubectl_run(cluster, "trainer")
    assert rejected.returncode != 0
    assert who in rejected.stderr and f"set spec.schedulerName: {SCHEDULER}" in rejected.stderr, rejected.stderr
    assert "(Forbidden)" in rejected.stderr
    assert kubectl_run(cluster, "web", gpu=False).returncode == 0
    kinds = {o["kind"] for o in cluster.emu.list("validatingwebhookconfigurations")}
    assert kinds == {"ValidatingWebhookConfiguration"} and cluster.emu.list("mutatingwebhookconfigurations") == []


@pytest.mark.parametrize("emulator_options", [{"kube_version": "1.29.6", "gpu_nodes": ["gpu-1"]}])
def test_engine_vap_on_1_29_is_refused_before_anything_changes(cluster, tmp_path):
    cluster.emu.requests.clear()
    result, document = cli("up", write_config(tmp_path, cluster, "  engine: vap\n  mode: enforce\n"), tmp_path,
                           steps="admission")
    assert result.exit_code == 2, result.output
    assert "admission.engine: vap cannot enforce on Kubernetes 1.29" in document["error"]
    assert "use admission.engine: opa" in document["error"]
    assert cluster.emu.requests.writes() == []


def test_only_admission_without_opa_is_refused_naming_the_step_to_run_first(cluster, tmp_path):
    """A webhook with no server plus the backstop would reject every GPU pod: refused before anything changes."""
    cluster.emu.requests.clear()
    result, document = cli("up", write_config(tmp_path, cluster), tmp_path, steps="admission")
    assert result.exit_code == 2, result.output
    assert "OPA is not deployed" in document["error"] and "--only admission-opa,admission" in document["error"]
    assert cluster.emu.requests.writes() == []


def test_engine_vap_enforces_without_any_server(cluster, tmp_path):
    result, document = cli("up", write_config(tmp_path, cluster, "  engine: vap\n  mode: enforce\n"), tmp_path)
    assert result.exit_code == 0, result.output
    assert steps_of(document)["admission-opa"]["status"] == "skipped"
    assert cluster.emu.list("deployments", OPA_NS) == [] and cluster.emu.list("validatingwebhookconfigurations") == []
    rejected = kubectl_run(cluster, "trainer")
    assert rejected.returncode != 0 and f"set spec.schedulerName: {SCHEDULER}" in rejected.stderr


def test_rotation_near_expiry_keeps_every_request_succeeding(cluster, tmp_path, monkeypatch):
    from gpu_bootstrap.adapters.kube import Kube
    from gpu_bootstrap.core.errors import ClusterError
    from gpu_bootstrap.render.admission import sample_pod

    # The first certificate was issued 355 days ago (a clock in the past), so today it is within rotate_before_days
    # of expiry; every certificate involved is valid now, so the TLS checks run on the real clock.
    config = write_config(tmp_path, cluster)
    issued_then = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(days=certs.SERVING_DAYS - 10)
    monkeypatch.setattr(AdmissionOpa, "clock", staticmethod(lambda: issued_then))
    assert cli("up", config, tmp_path)[0].exit_code == 0
    monkeypatch.setattr(AdmissionOpa, "clock", staticmethod(lambda: _dt.datetime.now(_dt.timezone.utc)))
    emu = cluster.emu
    old = secret_data(emu)
    assert certs.days_left(old["tls.crt"], _dt.datetime.now(_dt.timezone.utc)) < 11
    kube = Kube(cluster.kubeconfig)
    outcomes: list[str] = []
    stamps: list[float] = []
    stop = threading.Event()

    def traffic():
        while not stop.is_set() and len(outcomes) < 5000:
            try:
                answer = kube.create(sample_pod("probe", "default"), dry_run=True)
                outcomes.append("steered" if answer["spec"]["schedulerName"] == SCHEDULER else "not steered")
            except ClusterError as error:
                outcomes.append(f"failed: {error.message}")
            stamps.append(time.monotonic())
            time.sleep(0.01)

    emu.controllers.ready_delay = 1.5  # new replicas take a while: the switch lasts long enough to be watched
    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    try:
        switch_started = time.monotonic()
        result, document = cli("up", config, tmp_path)
        switch_ended = time.monotonic()
        assert result.exit_code == 0, result.output
        switching = secret_data(emu)
        assert switching["tls.crt"] != old["tls.crt"] and switching["tls.key"] != old["tls.key"]
        assert len(certs.split_bundle(switching["ca.crt"])) == 2
        result, document = cli("up", config, tmp_path)  # the rollout is done: the old CA is no longer trusted
        assert result.exit_code == 0, result.output
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join(timeout=10)
    final = secret_data(emu)
    assert final["tls.crt"] == switching["tls.crt"] and len(certs.split_bundle(final["ca.crt"])) == 1
    hook = emu.get("mutatingwebhookconfigurations", "gpu-bootstrap-gpu-pods")["webhooks"][0]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]).decode() == final["ca.crt"]
    failures = [o for o in outcomes if o != "steered"]
    print(f"\nrotation: {len(outcomes)} dry-run GPU pods across the switch, {len(failures)} not steered")
    errors = [c.outcome for c in emu.admission.calls if c.outcome.startswith("error")]
    during = sum(1 for t in stamps if switch_started <= t <= switch_ended)
    print(f"rotation: {during} of them while the rotating `up` ran ({switch_ended - switch_started:.1f} s)")
    assert during >= 3 and failures == [], (failures[:3], errors[:3])


@pytest.mark.parametrize("emulator_options", [{"kube_version": "1.36.0", "gpu_nodes": ["gpu-1"]}])
def test_engine_vap_mutate_plans_the_backstop_beside_the_mutating_policy(cluster, tmp_path):
    """No mutation can steer a GPU pod that names a node: the ValidatingAdmissionPolicy that rejects it comes with
    the MutatingAdmissionPolicy."""
    result, document = cli("up", write_config(tmp_path, cluster, "  engine: vap\n"), tmp_path, "--dry-run",
                           steps="admission")
    assert result.exit_code == 0, result.output
    step = steps_of(document)["admission"]
    assert step["changes"] == 8, step  # and the device-access pair of each (render/device_access.py)
    made = {p["target"] for p in step["planned"]}
    for kind in ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy",
                 "ValidatingAdmissionPolicyBinding"):
        assert {f"{kind} gpu-bootstrap-gpu-pods", f"{kind} gpu-bootstrap-gpu-device-access"} <= made, made


@pytest.mark.parametrize("emulator_options", [{"kube_version": "1.29.6", "gpu_nodes": ["gpu-1", "gpu-2"]}])
def test_the_backstop_policy_appears_once_the_cluster_reaches_1_30(cluster, tmp_path):
    """Admission follows the control plane (#26): on 1.29 there is no ValidatingAdmissionPolicy; after the cluster is
    upgraded to 1.30 the next `up` adds the backstop and its binding, and the scheduler moves to the new version."""
    config = write_config(tmp_path, cluster)
    assert cli("up", config, tmp_path)[0].exit_code == 0
    assert cluster.emu.table.lookup("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies") is None
    cluster.emu.upgrade_control_plane("1.30.14")
    result, document = cli("up", config, tmp_path)
    assert result.exit_code == 0, result.output
    assert steps_of(document)["admission"]["status"] == "applied"
    policies = cluster.emu.list("validatingadmissionpolicies")
    assert sorted(p["metadata"]["name"] for p in policies) == ["gpu-bootstrap-gpu-device-access",
                                                               "gpu-bootstrap-gpu-pods"]
    assert len(cluster.emu.list("validatingadmissionpolicybindings")) == 2
    deploy = cluster.emu.get("deployments", SCHEDULER, "kube-system")
    assert deploy["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":v1.30.14")


def test_the_offline_teardown_preview_is_the_teardown_of_a_real_up(cluster, tmp_path):
    """`teardown --dry-run --offline` plans a fresh `up` without a cluster and runs the steps' own teardown plan on
    the cluster that would leave. Here it is compared with the real thing: `up` on the API server, then the online
    `teardown --dry-run`, which reads what is there. The same changes, step by step."""
    steps = f"node-prep,{STEPS}"
    config = write_config(tmp_path, cluster)
    result, document = cli("up", config, tmp_path, steps=steps)
    assert result.exit_code == 0, result.output
    cluster.emu.requests.clear()
    online, online_doc = cli("teardown", config, tmp_path, "--dry-run", steps=steps)
    assert online.exit_code == 0, online.output
    # a dry run writes nothing: a DELETE's dryRun travels in its DeleteOptions body (the server ignores the query
    # beside a body), and the emulator reads it where the real server does
    assert cluster.emu.requests.writes() == [], [str(r) for r in cluster.emu.requests.writes()]
    assert cluster.emu.get("deployments", "opa", OPA_NS) is not None
    offline, offline_doc = cli("teardown", config, tmp_path, "--dry-run", "--offline", "--kube-version", "1.31.4",
                               steps=steps)
    assert offline.exit_code == 0, offline.output

    def changes(doc):
        return sorted((s["id"], c["verb"], c["target"]) for s in doc["steps"] for c in s.get("planned", []))
    assert changes(offline_doc) == changes(online_doc)
    assert ("admission", "delete", "MutatingWebhookConfiguration gpu-bootstrap-gpu-pods") in changes(offline_doc)
    assert ("node-prep", "patch", "Node gpu-1") in changes(offline_doc)
    assert cluster.emu.get("mutatingwebhookconfigurations", "gpu-bootstrap-gpu-pods") is not None  # nothing removed
    assert cluster.emu.get("namespaces", OPA_NS) is not None
    refused, _doc = cli("teardown", config, tmp_path, "--offline", "--yes", steps=steps)
    assert refused.exit_code == 2 and "add --dry-run" in refused.output, refused.output


@pytest.mark.tools
@pytest.mark.usefixtures("helm_on_path")  # the steps left out include the charts' (helm reads their releases)
def test_a_teardown_of_the_steps_an_only_run_made_removes_the_tools_state_once_nothing_of_ours_is_left(cluster,
                                                                                                        tmp_path):
    """`up --only node-prep,admission-opa` then `teardown --only` of those steps left the tool's namespace (its
    checkpoint ConfigMap gpu-bootstrap-state, key and lock) behind, seen on the real API server. A partial teardown
    removes it when no step left out has a record or anything to undo; while one has, it stays, even when that
    step's record is gone (a run killed before it recorded the step) but its objects are not."""
    from gpu_bootstrap.pipeline import checkpoint as cp
    config = write_config(tmp_path, cluster)
    emu = cluster.emu
    steps = "node-prep,admission-opa"
    assert cli("up", config, tmp_path, steps=steps)[0].exit_code == 0
    state = emu.get("configmaps", cp.NAME, cp.NAMESPACE)
    del state["data"]["admission-opa"]  # as a run killed before it recorded the step leaves it
    emu.seed(state)
    result, _document = cli("teardown", config, tmp_path, "--yes", steps="node-prep")
    assert result.exit_code == 0, result.output
    assert emu.get("namespaces", cp.NAMESPACE)["metadata"].get("deletionTimestamp") is None  # OPA is still ours
    preview = runner.invoke(app, ["teardown", "--only", "admission-opa", "-c", str(config), "--dry-run",
                                  "--log-file", str(tmp_path / "log")])
    assert f"then the tool's own namespace {cp.NAMESPACE}" in " ".join(preview.output.split()), preview.output
    result, _document = cli("teardown", config, tmp_path, "--yes", steps="admission-opa")
    assert result.exit_code == 0, result.output
    emu.settle()
    gone = emu.get("namespaces", cp.NAMESPACE)
    assert gone is None or gone["metadata"].get("deletionTimestamp"), gone
    assert emu.get("configmaps", cp.NAME, cp.NAMESPACE) is None


def test_doctor_flags_an_exempt_namespace_that_does_not_exist_and_up_refuses_one_it_did_not_make(cluster, tmp_path):
    """Squatting: an exempt namespace nobody made yet is anyone's who may create namespaces (their GPU pods there
    would be unseen), so doctor names it; and an existing namespace `up` would install into (OPA's) that gpu-bootstrap
    did not create is refused (exit 2, nothing changed) until the config adopts it."""
    config = write_config(tmp_path, cluster, "  exempt_namespaces: [research]\n")
    _result, document = cli("doctor", config, tmp_path)
    flagged = [c for c in document["checks"] if "research" in c["message"]]
    assert [c["status"] for c in flagged] == ["warn"] and "do not exist" in flagged[0]["message"], flagged
    cluster.emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-bootstrap-admission"}})
    writes = len(cluster.emu.requests.writes())
    result, document = cli("up", config, tmp_path)
    assert result.exit_code == 2 and "gpu-bootstrap-admission (admission-opa)" in document["error"], document
    assert len(cluster.emu.requests.writes()) == writes  # refused before anything changed
    adopted = write_config(tmp_path, cluster, "  exempt_namespaces: [research]\n")
    adopted.write_text(adopted.read_text().replace("cluster: {", "cluster: {adopt_namespaces: [gpu-bootstrap-admission], "))
    result, document = cli("up", adopted, tmp_path, "--dry-run")
    assert result.exit_code == 0, result.output
