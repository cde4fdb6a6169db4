"""The admission renderers: certificates (checked by the real `openssl verify`), the rotation decision with a clock
near expiry, and every rendered object valid against the official schemas of each Kubernetes version."""
from __future__ import annotations

import datetime as _dt
import subprocess

import kubernetes_validate
import pytest

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.render import admission as render
from gpu_bootstrap.render import certificates as certs
from gpu_bootstrap.steps.admission_opa import decide
from gpu_bootstrap.core import catalogue as images
from tests.tools import tool

NOW = _dt.datetime(2026, 11, 23, 12, 0, tzinfo=_dt.timezone.utc)
SEED = bytes(range(32))


def conf(**admission) -> cfg.Config:
    return cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}], "admission": admission})


# --- certificates ------------------------------------------------------------------------------------------------------
def test_openssl_verifies_the_serving_certificate_against_the_ca_for_the_service_names(tmp_path):
    issued = certs.issue("opa", "gpu-bootstrap-admission", NOW, SEED)
    (tmp_path / "ca.pem").write_text(issued.ca_pem)
    (tmp_path / "tls.pem").write_text(issued.cert_pem)
    openssl = tool("openssl")
    at = str(int((NOW + _dt.timedelta(days=1)).timestamp()))
    for name in ("opa.gpu-bootstrap-admission.svc", "opa.gpu-bootstrap-admission.svc.cluster.local"):
        result = subprocess.run([openssl, "verify", "-attime", at, "-purpose", "sslserver", "-verify_hostname", name,
                                 "-CAfile", tmp_path / "ca.pem", tmp_path / "tls.pem"], capture_output=True, text=True)
        assert result.returncode == 0 and result.stdout.strip().endswith(": OK"), result.stdout + result.stderr
    wrong = subprocess.run([openssl, "verify", "-attime", at, "-verify_hostname", "opa.other.svc", "-CAfile",
                            tmp_path / "ca.pem", tmp_path / "tls.pem"], capture_output=True, text=True)
    assert wrong.returncode != 0
    other_ca = certs.issue("opa", "gpu-bootstrap-admission", NOW, bytes(32 * [7]))
    (tmp_path / "other.pem").write_text(other_ca.ca_pem)
    assert subprocess.run([openssl, "verify", "-attime", at, "-CAfile", tmp_path / "other.pem", tmp_path / "tls.pem"],
                          capture_output=True).returncode != 0
    expired = str(int((NOW + _dt.timedelta(days=certs.SERVING_DAYS + 1)).timestamp()))
    assert subprocess.run([openssl, "verify", "-attime", expired, "-CAfile", tmp_path / "ca.pem",
                           tmp_path / "tls.pem"], capture_output=True).returncode != 0


@pytest.mark.unit
def test_issuing_is_a_function_of_the_clock_and_the_seed():
    one, two = certs.issue("opa", "ns", NOW, SEED), certs.issue("opa", "ns", NOW, SEED)
    assert one.key_pem == two.key_pem  # same seed, same key (ECDSA signatures still differ: that is fine)
    first, second = certs.inspect(one.cert_pem), certs.inspect(two.cert_pem)
    assert (first.not_before, first.not_after, first.sans) == (second.not_before, second.not_after, second.sans)
    assert certs.issue("opa", "ns", NOW, bytes(32 * [1])).key_pem != one.key_pem
    info = certs.inspect(one.cert_pem)
    assert info.sans == ("opa.ns.svc", "opa.ns.svc.cluster.local")
    assert info.not_after == NOW - certs.BACKDATE + _dt.timedelta(days=certs.SERVING_DAYS)
    assert certs.signed_by(one.cert_pem, one.ca_pem) and certs.key_matches(one.cert_pem, one.key_pem)
    assert "PRIVATE" not in repr(one) and "PRIVATE" not in repr(certs.Stored(one.cert_pem, one.key_pem, one.ca_pem))


def stored_from(config, now, seed=SEED) -> certs.Stored:
    cert = decide(config, None, now, seed, None)
    return certs.Stored.from_secret(cert.secret)


@pytest.mark.unit
def test_a_rerun_keeps_the_certificate_and_rotation_keeps_the_old_ca_until_the_rollout_is_done():
    config = conf()
    stored = stored_from(config, NOW)
    kept = decide(config, stored, NOW + _dt.timedelta(days=100), bytes(32 * [9]), None)
    assert kept.secret is None and kept.bundle == stored.ca_bundle
    assert kept.tls_hash == certs.fingerprint(stored.cert_pem)

    near_expiry = NOW + _dt.timedelta(days=certs.SERVING_DAYS - 10)  # within rotate_before_days (30)
    rotated = decide(config, stored, near_expiry, bytes(32 * [9]), None)
    assert "within rotate_before_days: 30" in rotated.reason and rotated.old_ca_kept
    new = certs.Stored.from_secret(rotated.secret)
    assert new.cert_pem != stored.cert_pem and new.key_pem != stored.key_pem
    cas = certs.split_bundle(new.ca_bundle)
    assert len(cas) == 2 and certs.signed_by(new.cert_pem, cas[0]) and cas[1].strip() == stored.signer.strip()
    assert rotated.tls_hash != kept.tls_hash  # the pods roll

    mid_rollout = decide(config, new, near_expiry, bytes(32 * [3]), rolled_out=kept.tls_hash)
    assert mid_rollout.secret is None and len(certs.split_bundle(mid_rollout.bundle)) == 2
    done = decide(config, new, near_expiry, bytes(32 * [3]), rolled_out=rotated.tls_hash)
    assert done.reason.startswith("every replica serves the new certificate")
    assert certs.split_bundle(done.bundle) == [cas[0]]
    assert certs.Stored.from_secret(done.secret).key_pem == new.key_pem  # no new key, no rollout
    assert done.tls_hash == rotated.tls_hash


@pytest.mark.unit
@pytest.mark.parametrize("change, reason", [
    (lambda s: certs.Stored(s.cert_pem, certs.issue("opa", "x", NOW, bytes(32 * [5])).key_pem, s.ca_bundle),
     "the stored key does not belong to the certificate"),
    (lambda s: certs.Stored(s.cert_pem, s.key_pem, certs.issue("opa", "x", NOW, bytes(32 * [5])).ca_pem),
     "no CA in ca.crt signed the certificate"),
    (lambda s: certs.Stored("garbage", s.key_pem, s.ca_bundle), "the stored certificate cannot be read"),
])
def test_a_broken_secret_is_replaced(change, reason):
    config = conf()
    stored = change(stored_from(config, NOW))
    assert decide(config, stored, NOW, bytes(32 * [4]), None).reason == reason


@pytest.mark.unit
def test_a_moved_namespace_reissues_for_the_new_names():
    stored = stored_from(conf(), NOW)
    moved = decide(conf(opa={"namespace": "policy"}), stored, NOW, bytes(32 * [4]), None)
    assert "are not the Service's opa.policy.svc" in moved.reason
    assert certs.inspect(certs.Stored.from_secret(moved.secret).cert_pem).sans[0] == "opa.policy.svc"


@pytest.mark.unit
def test_a_secret_is_redacted_for_display():
    secret = decide(conf(), None, NOW, SEED, None).secret
    shown = render.redacted(secret)
    assert set(shown["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    assert "PRIVATE KEY" not in str(shown) and "LS0t" not in str(shown)


# --- schemas -------------------------------------------------------------------------------------------------------------
# kubernetes-validate ships schemas from 1.25 on; the kinds rendered for 1.24 (core, apps, policy, admissionregistration
# v1 webhooks) are unchanged in 1.25, so 1.24 renders are checked against the 1.25 schemas.
SCHEMA_VERSION = {"1.24.17": "1.25.0"}
VERSIONS = ["1.24.17", "1.29.4", "1.30.2", "1.31.4", "1.35.0"]


def objects_for(config, kube: str) -> list[dict]:
    cert = decide(config, None, NOW, SEED, None)
    objects = [render.namespace(config), render.service_account(config), render.policy_configmap(config),
               cert.secret, render.deployment(config, cert.tls_hash), render.service(config),
               render.disruption_budget(config), render.network_policy(config),
               render.webhook_configuration(config, kube, cert.bundle)]
    if render.cel_available(kube):
        objects += render.validating_policy(config) + render.device_access_policies(config, None)
    return [o for o in objects if o]


@pytest.mark.unit
@pytest.mark.parametrize("kube", VERSIONS)
@pytest.mark.parametrize("mode", ["mutate", "enforce"])
def test_every_rendered_object_is_valid_for_the_version(kube, mode):
    config = conf(mode=mode)
    objects = objects_for(config, kube)
    kinds = [o["kind"] for o in objects]
    assert ("MutatingWebhookConfiguration" if mode == "mutate" else "ValidatingWebhookConfiguration") in kinds
    assert ("ValidatingAdmissionPolicy" in kinds) == (kube >= "1.30")
    hook = next(o for o in objects if o["kind"].endswith("WebhookConfiguration"))["webhooks"][0]
    assert ("matchConditions" in hook) == (kube >= "1.30")
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None" and hook["timeoutSeconds"] <= 5
    assert hook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                              "resources": ["pods"], "scope": "Namespaced"},
                             {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                              "resources": ["pods/ephemeralcontainers"], "scope": "Namespaced"}]
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "ValidatingAdmissionPolicy"] == (
        [render.CONFIG_NAME, render.DEVICE_ACCESS_NAME] if kube >= "1.30" else [])
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-bootstrap"
        kubernetes_validate.validate(obj, SCHEMA_VERSION.get(kube, kube), strict=True)


@pytest.mark.unit
@pytest.mark.parametrize("kube, api_version", [("1.34.0", "admissionregistration.k8s.io/v1beta1"),
                                               ("1.36.0", "admissionregistration.k8s.io/v1")])
def test_the_mutating_admission_policy_is_valid_where_it_is_served(kube, api_version):
    config = conf(engine="vap")
    for obj in render.mutating_policy(config, api_version) + render.device_access_policies(config, api_version):
        kubernetes_validate.validate(obj, kube, strict=True)


@pytest.mark.unit
def test_cert_manager_mode_renders_issuers_and_the_injection_annotation():
    config = conf(certificates="cert-manager")
    objects = render.cert_manager_objects(config)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("Issuer", "opa-selfsigned"), ("Certificate", "opa-ca"), ("Issuer", "opa-ca"), ("Certificate", "opa-serving")]
    serving = objects[-1]["spec"]
    assert serving["secretName"] == render.SECRET and serving["dnsNames"] == certs.sans("opa", "gpu-bootstrap-admission")
    hook = render.webhook_configuration(config, "1.31.0", "ignored")
    assert hook["metadata"]["annotations"] == {render.INJECT_CA: "gpu-bootstrap-admission/opa-serving"}
    assert "caBundle" not in hook["webhooks"][0]["clientConfig"]
    deploy = render.deployment(config, "")
    assert "--tls-cert-refresh-period=10m" in deploy["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.unit
def test_the_default_opa_image_is_pulled_by_digest():
    image = render.deployment(conf(), "abc")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "openpolicyagent/opa:1.16.2@sha256:a915d8b59ddb09a9badecd8e061d43cf3111283494c4cf1d38a675bdb4e81a13"


@pytest.mark.unit
def test_opa_runs_hardened_and_off_the_gpu_nodes():
    deploy = render.deployment(conf(), "abc")
    spec = deploy["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["image"] == images.default("opa")
    assert "--set=server.decoding.max_length=8388608,server.decoding.gzip.max_length=8388608" in container["args"]
    assert container["args"][:2] == ["run", "--server"] and "--tls-cert-file=/certs/tls.crt" in container["args"]
    assert container["securityContext"]["readOnlyRootFilesystem"] and spec["securityContext"]["runAsNonRoot"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8443, "scheme": "HTTPS"}
    assert container["resources"]["requests"]
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"] == [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]
    assert deploy["spec"]["replicas"] == 2 and render.disruption_budget(conf())["spec"]["maxUnavailable"] == 1
    assert render.disruption_budget(conf(opa={"replicas": 1})) is None
    assert deploy["spec"]["template"]["metadata"]["annotations"][render.TLS_HASH] == "abc"
