"""The emulator's admission chain on its own, driven by the real kubectl: failurePolicy, timeouts, TLS verification
against the caBundle, objectSelector, and the status codes the real API server gives."""
from __future__ import annotations

import base64
import datetime
import json
import time

import pytest

from gpu_bootstrap.render import certificates as certs
from tests.kubeapi import cel, rego
from tests.kubeapi.opa_sim import OpaServer
from tests.tools import missing

ALLOW_ALL = 'package system\n\nmain := {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", ' \
            '"response": {"uid": input.request.uid, "allowed": true}}\n'
DENY_ALL = 'package system\n\nmain := {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", ' \
           '"response": {"uid": input.request.uid, "allowed": false, "status": {"message": "no"}}}\n'


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@pytest.fixture(autouse=True)
def engines():
    if not rego.available() or not cel.available():
        missing("the Rego engine (gordon-to-regorus) or the CEL runtime (cel-expr-python) is not installed")


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.31.4", "cpu_nodes": ["node-1"]}


def webhook(cluster, kind: str, policy: str, ca_pem: str, failure: str = "Fail", timeout: int = 2, **extra) -> None:
    hook = {"name": "test.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": failure, "timeoutSeconds": timeout,
            "clientConfig": {"service": {"namespace": "default", "name": "hook", "port": 443},
                             "caBundle": base64.b64encode(ca_pem.encode()).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            **extra}
    doc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": "test"},
           "webhooks": [hook]}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))


def serve(cluster, policy: str, names=("hook", "default")) -> OpaServer:
    issued = certs.issue(names[0], names[1], now(), bytes(range(32)))
    server = OpaServer(issued.cert_pem, issued.key_pem, {"p.rego": policy})
    cluster.emu.admission.route("default", "hook", 443, "127.0.0.1", server.port)
    server.ca_pem = issued.ca_pem
    return server


def run_pod(cluster, name: str, labels: str = ""):
    args = ["run", name, "--image=nginx", "--restart=Never"] + ([f"--labels={labels}"] if labels else [])
    return cluster.kubectl(*args, check=False)


def test_a_denying_validating_webhook_answers_403_with_its_message(cluster):
    server = serve(cluster, DENY_ALL)
    try:
        webhook(cluster, "ValidatingWebhookConfiguration", DENY_ALL, server.ca_pem)
        result = run_pod(cluster, "a")
        assert result.returncode != 0
        assert 'admission webhook "test.example.com" denied the request: no' in result.stderr
        assert "(Forbidden)" in result.stderr
        assert cluster.emu.get("pods", "a", "default") is None
        assert run_pod(cluster, "b", labels="skip=yes").returncode != 0  # no objectSelector: still called
    finally:
        server.stop()


def test_fail_policy_without_endpoints_blocks_pods_and_ignore_does_not(cluster):
    issued = certs.issue("hook", "default", now(),
                         bytes(range(32)))
    webhook(cluster, "MutatingWebhookConfiguration", ALLOW_ALL, issued.ca_pem, "Fail")
    blocked = run_pod(cluster, "a")
    assert blocked.returncode != 0
    assert 'Internal error occurred: failed calling webhook "test.example.com"' in blocked.stderr
    assert 'no endpoints available for service "hook"' in blocked.stderr
    # the recovery path: webhook configurations never pass through webhooks
    cluster.kubectl("delete", "mutatingwebhookconfiguration", "test")
    webhook(cluster, "MutatingWebhookConfiguration", ALLOW_ALL, issued.ca_pem, "Ignore")
    assert run_pod(cluster, "b").returncode == 0


def test_a_certificate_from_another_ca_is_refused(cluster):
    server = serve(cluster, ALLOW_ALL)
    other = certs.issue("hook", "default", now(),
                        bytes(32 * [3]))
    try:
        webhook(cluster, "ValidatingWebhookConfiguration", ALLOW_ALL, other.ca_pem, "Fail")
        result = run_pod(cluster, "a")
        assert result.returncode != 0 and "tls: failed to verify certificate" in result.stderr
        webhook(cluster, "ValidatingWebhookConfiguration", ALLOW_ALL, server.ca_pem, "Fail")
        assert run_pod(cluster, "b").returncode == 0
    finally:
        server.stop()


def test_the_timeout_is_honoured(cluster):
    server = serve(cluster, ALLOW_ALL)
    cluster.emu.admission.route("default", "hook", 443, "127.0.0.1", server.port)
    import socket
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts, never answers the TLS handshake
    cluster.emu.admission.route("default", "hook", 443, "127.0.0.1", silent.getsockname()[1])
    try:
        webhook(cluster, "ValidatingWebhookConfiguration", ALLOW_ALL, server.ca_pem, "Ignore", timeout=1)
        started = time.monotonic()
        assert run_pod(cluster, "a").returncode == 0
        assert 0.9 < time.monotonic() - started < 5
        assert any("context deadline exceeded" in c.outcome for c in cluster.emu.admission.calls)
    finally:
        silent.close()
        server.stop()


def test_object_selector_and_match_conditions_skip_the_call(cluster):
    server = serve(cluster, DENY_ALL)
    try:
        webhook(cluster, "ValidatingWebhookConfiguration", DENY_ALL, server.ca_pem, "Fail",
                objectSelector={"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
                matchConditions=[{"name": "not-nginx-2", "expression": "object.metadata.name != 'nginx-2'"}])
        assert run_pod(cluster, "a", labels="skip=yes").returncode == 0
        assert run_pod(cluster, "nginx-2").returncode == 0
        assert run_pod(cluster, "c").returncode != 0
        assert server.requests == 1
    finally:
        server.stop()


@pytest.mark.parametrize("authorization", [False, True])
def test_without_authz_anyone_can_replace_the_policy_and_with_it_nobody_can(cluster, authorization):
    """The attack the security review found, through the emulator's admission chain: a pod that can reach OPA PUTs
    a `package system` that allows everything. Without --authorization=basic the webhook then admits what it denied;
    with the rendered system.authz (only POST / and GET /health) the PUT is refused and the verdict stands."""
    import http.client
    import socket
    import ssl

    from gpu_bootstrap.render import admission_policy as policy_render
    issued = certs.issue("hook", "default", now(), bytes(range(32)))
    modules = {"p.rego": DENY_ALL, "authz.rego": policy_render.authz_rego()}
    server = OpaServer(issued.cert_pem, issued.key_pem, modules, authorization=authorization,
                       authentication="token" if authorization else None)
    try:
        cluster.emu.admission.route("default", "hook", 443, "127.0.0.1", server.port)
        webhook(cluster, "ValidatingWebhookConfiguration", DENY_ALL, issued.ca_pem)
        assert run_pod(cluster, "before").returncode != 0
        context = ssl.create_default_context(cadata=issued.ca_pem)
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        connection.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", server.port), 10),
                                              server_hostname="hook.default.svc")
        connection.request("PUT", "/v1/policies/p.rego", body=ALLOW_ALL)
        response = connection.getresponse()
        answer = json.loads(response.read())
        connection.close()
        after = run_pod(cluster, "after")
        if authorization:
            assert (response.status, answer) == (401, {"code": "unauthorized",
                                                       "message": "request rejected by administrative policy"})
            assert after.returncode != 0 and 'denied the request: no' in after.stderr
        else:
            assert response.status == 200
            assert after.returncode == 0, after.stderr  # subverted
    finally:
        server.stop()
