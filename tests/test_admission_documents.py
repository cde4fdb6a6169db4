"""The admission objects as exact documents: OPA's Deployment (hardened security context, read-only mounts, probe
timings, a rollout that never drops a replica, the selector equal to the pod labels, off the GPU nodes unless it
must tolerate them), its Service, ServiceAccount, Namespace and policy ConfigMap, cert-manager's issuers and
certificates, the webhook configuration in each mode, the backstop policy's match constraints, the dry-run sample
pods, and a Secret shown without its data."""
from __future__ import annotations

import hashlib

import pytest

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.render import admission as render
from gpu_bootstrap.render import admission_policy as policy_render
from gpu_bootstrap.render import certificates as certs
from gpu_bootstrap.core import catalogue as images

pytestmark = pytest.mark.unit

NS = "gpu-bootstrap-admission"
MANAGED = {"app.kubernetes.io/managed-by": "gpu-bootstrap", "app.kubernetes.io/component": "admission"}
SELECTOR = {"app.kubernetes.io/name": "opa", "app.kubernetes.io/component": "admission"}
OWNED_META = {"name": "opa", "labels": MANAGED, "namespace": NS}


def conf(**admission) -> cfg.Config:
    return cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}], "admission": admission})


def test_the_owned_selector_selects_exactly_the_managed_labels():
    assert dict(pair.split("=") for pair in render.OWNED_SELECTOR.split(",")) == MANAGED


def test_opa_namespace_service_account_service_and_policy_are_exact():
    config = conf()
    assert render.namespace(config) == {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": NS, "labels": {**MANAGED, "pod-security.kubernetes.io/enforce": "restricted"}}}
    assert render.service_account(config) == {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": OWNED_META,
                                              "automountServiceAccountToken": False}
    assert render.service(config) == {"apiVersion": "v1", "kind": "Service", "metadata": OWNED_META, "spec": {
        "selector": SELECTOR, "ports": [{"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}]}}
    assert render.policy_configmap(config) == {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "opa-policy", "labels": MANAGED, "namespace": NS},
        "data": {"gpu-pods.rego": policy_render.rego(policy_render.of(config)), "authz.rego": policy_render.authz_rego()}}
    assert render.network_policy(config) == {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": OWNED_META,
        "spec": {"podSelector": {"matchLabels": SELECTOR}, "policyTypes": ["Ingress"],
                 "ingress": [{"ports": [{"protocol": "TCP", "port": 8443}]}]}}


PROBE = {"httpGet": {"path": "/health", "port": 8443, "scheme": "HTTPS"}}
CONTAINER = {
    "name": "opa", "image": images.default("opa"),
    "args": ["run", "--server", "--addr=0.0.0.0:8443", "--tls-cert-file=/certs/tls.crt",
             "--tls-private-key-file=/certs/tls.key", "--authentication=token", "--authorization=basic",
             "--disable-telemetry", "--log-level=info", "--set=server.decoding.max_length=8388608,server.decoding.gzip.max_length=8388608",
             "/policy/gpu-pods.rego", "/policy/authz.rego"],
    "ports": [{"name": "https", "containerPort": 8443, "protocol": "TCP"}],
    "readinessProbe": {**PROBE, "periodSeconds": 5, "failureThreshold": 3},
    "livenessProbe": {**PROBE, "initialDelaySeconds": 10, "periodSeconds": 10, "failureThreshold": 3},
    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
    "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                        "runAsUser": 1000, "runAsGroup": 1000, "capabilities": {"drop": ["ALL"]}},
    "volumeMounts": [{"name": "certs", "mountPath": "/certs", "readOnly": True},
                     {"name": "policy", "mountPath": "/policy", "readOnly": True}],
}
OFF_GPU = [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]
ANTI_AFFINITY = {"preferredDuringSchedulingIgnoredDuringExecution": [{
    "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                       "labelSelector": {"matchLabels": SELECTOR}}}]}
TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.mark.parametrize("tolerate, node_affinity, tolerations", [
    (None, {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": OFF_GPU}]}},
     {}),
    (TAINT, {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {
        "matchExpressions": OFF_GPU}}]}, {"tolerations": [TAINT]}),
])
def test_the_opa_deployment_is_exact(tolerate, node_affinity, tolerations):
    config = conf()
    policy_hash = hashlib.sha256((policy_render.authz_rego() + policy_render.rego(policy_render.of(config))).encode()
                                 ).hexdigest()[:16]
    assert render.deployment(config, "abc", tolerate) == {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": OWNED_META,
        "spec": {"replicas": 2, "selector": {"matchLabels": SELECTOR},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                 "template": {
                     "metadata": {"labels": {**MANAGED, **SELECTOR},
                                  "annotations": {"gpu-bootstrap.io/policy-hash": policy_hash,
                                                  "gpu-bootstrap.io/tls-hash": "abc"}},
                     "spec": {"serviceAccountName": "opa", "automountServiceAccountToken": False,
                              "priorityClassName": "system-cluster-critical",
                              "nodeSelector": {"kubernetes.io/os": "linux"},
                              "affinity": {"nodeAffinity": node_affinity, "podAntiAffinity": ANTI_AFFINITY},
                              "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                                  "seccompProfile": {"type": "RuntimeDefault"}},
                              "containers": [CONTAINER], **tolerations,
                              "volumes": [{"name": "certs", "secret": {"secretName": "opa-tls"}},
                                          {"name": "policy", "configMap": {"name": "opa-policy"}}]}}}}


def test_the_service_and_budget_select_the_pods_the_deployment_makes():
    config = conf()
    deploy = render.deployment(config, "")
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    for selector in (deploy["spec"]["selector"]["matchLabels"], render.service(config)["spec"]["selector"],
                     render.disruption_budget(config)["spec"]["selector"]["matchLabels"]):
        assert selector and selector.items() <= pod_labels.items()
    assert "gpu-bootstrap.io/tls-hash" not in deploy["spec"]["template"]["metadata"]["annotations"]


def test_cert_manager_reloads_the_files_it_renews_in_place():
    args = render.deployment(conf(certificates="cert-manager"), "")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["run", "--server", "--addr=0.0.0.0:8443", "--tls-cert-file=/certs/tls.crt",
                    "--tls-private-key-file=/certs/tls.key", "--tls-cert-refresh-period=10m",
                    "--authentication=token", "--authorization=basic", "--disable-telemetry", "--log-level=info",
                    "--set=server.decoding.max_length=8388608,server.decoding.gzip.max_length=8388608", "/policy/gpu-pods.rego", "/policy/authz.rego"]


def test_cert_manager_objects_are_exact():
    key = {"algorithm": "ECDSA", "size": 256}

    def obj(kind, name, spec):
        return {"apiVersion": "cert-manager.io/v1", "kind": kind, "metadata": {"name": name, "labels": MANAGED,
                                                                              "namespace": NS}, "spec": spec}
    assert render.cert_manager_objects(conf(certificates="cert-manager", rotate_before_days=20)) == [
        obj("Issuer", "opa-selfsigned", {"selfSigned": {}}),
        obj("Certificate", "opa-ca", {"isCA": True, "commonName": "gpu-bootstrap admission CA", "secretName": "opa-ca",
                                      "privateKey": key, "duration": "9480h",
                                      "issuerRef": {"name": "opa-selfsigned", "kind": "Issuer"}}),
        obj("Issuer", "opa-ca", {"ca": {"secretName": "opa-ca"}}),
        obj("Certificate", "opa-serving", {"secretName": "opa-tls", "dnsNames": [f"opa.{NS}.svc",
                                                                                  f"opa.{NS}.svc.cluster.local"],
                                           "privateKey": key, "duration": "8760h", "renewBefore": "480h",
                                           "usages": ["server auth", "digital signature"],
                                           "issuerRef": {"name": "opa-ca", "kind": "Issuer"}})]


RULES = [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
          "scope": "Namespaced"},
         {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/ephemeralcontainers"],
          "scope": "Namespaced"}]  # kubectl debug: an ephemeral container may not choose GPUs either (device access)


@pytest.mark.parametrize("settings, kube, bundle, kind, client_extra, hook_extra, annotations", [
    ({}, "1.31.0", "CA PEM", "MutatingWebhookConfiguration", {"caBundle": certs.b64("CA PEM")},
     {"reinvocationPolicy": "Never", "matchConditions": True}, None),
    ({"mode": "enforce"}, "1.29.0", "CA PEM", "ValidatingWebhookConfiguration", {"caBundle": certs.b64("CA PEM")},
     {}, None),
    ({}, "1.30.0", None, "MutatingWebhookConfiguration", {}, {"reinvocationPolicy": "Never", "matchConditions": True},
     None),
    ({"certificates": "cert-manager"}, "1.29.0", "CA PEM", "MutatingWebhookConfiguration", {},
     {"reinvocationPolicy": "Never"}, {"cert-manager.io/inject-ca-from": f"{NS}/opa-serving"}),
])
def test_the_webhook_configuration_is_exact(settings, kube, bundle, kind, client_extra, hook_extra, annotations):
    config = conf(**settings)
    policy = policy_render.of(config)
    hook = {"name": "gpu-pods.gpu-bootstrap.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Ignore", "timeoutSeconds": 3, "matchPolicy": "Equivalent",
            "clientConfig": {"service": {"namespace": NS, "name": "opa", "port": 443}, **client_extra},
            "rules": RULES, "namespaceSelector": policy_render.namespace_selector(policy), "objectSelector": {},
            **hook_extra}
    if hook_extra.get("matchConditions"):
        hook["matchConditions"] = policy_render.match_conditions(policy)
    meta = {"name": "gpu-bootstrap-gpu-pods", "labels": MANAGED,
            **({"annotations": annotations} if annotations else {})}
    assert render.webhook_configuration(config, kube, bundle) == {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": meta, "webhooks": [hook]}


def test_the_policies_match_pod_creation_outside_the_exempt_namespaces():
    config = conf(engine="vap")
    constraints = {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                      "resources": ["pods"]}],
                   "namespaceSelector": policy_render.namespace_selector(policy_render.of(config))}
    validating, binding = render.validating_policy(config)
    assert validating["spec"]["matchConstraints"] == constraints
    assert binding == {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                       "metadata": {"name": "gpu-bootstrap-gpu-pods", "labels": MANAGED},
                       "spec": {"policyName": "gpu-bootstrap-gpu-pods", "validationActions": ["Deny"]}}
    mutating, _ = render.mutating_policy(config, "admissionregistration.k8s.io/v1beta1")
    assert mutating["spec"]["matchConstraints"] == constraints


TOLERATE_ALL_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
PAUSE = {"name": "probe", "image": images.default("pause"),  # by digest (core/data/images.yaml)
         "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}
RESTRICTED = {"securityContext": {"runAsNonRoot": True, "runAsUser": 65535, "runAsGroup": 65535,
                                  "seccompProfile": {"type": "RuntimeDefault"}}, "automountServiceAccountToken": False}


@pytest.mark.parametrize("args, spec", [
    ((), {**RESTRICTED, "containers": [{**PAUSE, "resources": {"limits": {"nvidia.com/gpu": 1}}}],
          "tolerations": TOLERATE_ALL_GPU}),
    ((False,), {**RESTRICTED, "containers": [PAUSE], "tolerations": TOLERATE_ALL_GPU}),
    ((True, "gpu-1"), {**RESTRICTED, "containers": [{**PAUSE, "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                       "tolerations": TOLERATE_ALL_GPU, "nodeName": "gpu-1"}),
])
def test_the_sample_pods_are_exact(args, spec):
    assert render.sample_pod("probe-pod", "default", *args) == {
        "apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "probe-pod", "namespace": "default", "labels": {"app.kubernetes.io/managed-by": "gpu-bootstrap"}},
        "spec": spec}


def test_a_secret_is_shown_with_every_field_but_its_data():
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {"name": "s"},
              "data": {"b": "c2VjcmV0"}, "stringData": {"a": "secret"}}
    shown = "<redacted: private keys are never written outside the Secret>"
    assert render.redacted(secret) == {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                                       "metadata": {"name": "s"}, "data": {"a": shown, "b": shown}}


def test_the_policy_cannot_be_changed_after_it_is_derived():
    policy = policy_render.of(conf())
    with pytest.raises(AttributeError):  # dataclasses.FrozenInstanceError
        policy.scheduler = "default-scheduler"
    assert policy.scheduler == "gpu-binpack-scheduler"
