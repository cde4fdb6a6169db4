"""The admission steps' objects: OPA (its Secret, policy, Deployment, Service, PDB, NetworkPolicy) and what points the
API server at it (the webhook configuration), or the in-process policies (ValidatingAdmissionPolicy, MutatingAdmissionPolicy).

Pure functions of (config, Kubernetes version, certificate material). Every object carries the managed-by label.
"""
from __future__ import annotations

import hashlib

from gpu_bootstrap.core.versions import minor_of
from gpu_bootstrap.core import catalogue as images
from gpu_bootstrap.render import admission_policy as policy_render
from gpu_bootstrap.render import certificates as certs
from gpu_bootstrap.security import pod_security

MANAGED = {"app.kubernetes.io/managed-by": "gpu-bootstrap", "app.kubernetes.io/component": "admission"}
OWNED_SELECTOR = "app.kubernetes.io/managed-by=gpu-bootstrap,app.kubernetes.io/component=admission"
NAME = "opa"  # the Deployment, Service, ServiceAccount and PDB
SECRET = "opa-tls"
POLICY_CONFIGMAP = "opa-policy"
POLICY_FILE = "gpu-pods.rego"
AUTHZ_FILE = "authz.rego"  # package system.authz: what OPA's HTTP API lets anyone do (docs/security.md)
CONFIG_NAME = "gpu-bootstrap-gpu-pods"  # webhook configurations and policies
DEVICE_ACCESS_NAME = "gpu-bootstrap-gpu-device-access"  # GPUs only for pods given them (render/device_access.py)
WEBHOOK_NAME = "gpu-pods.gpu-bootstrap.io"
PORT = 8443
TIMEOUT_SECONDS = 3
TLS_HASH = "gpu-bootstrap.io/tls-hash"
POLICY_HASH = "gpu-bootstrap.io/policy-hash"
INJECT_CA = "cert-manager.io/inject-ca-from"
REDACTED = "<redacted: private keys are never written outside the Secret>"
GROUP = "admissionregistration.k8s.io"
CERT_MANAGER = "cert-manager.io/v1"


def cel_available(kube_version: str) -> bool:
    """Webhook matchConditions and ValidatingAdmissionPolicy: GA in 1.30."""
    return minor_of(kube_version) >= (1, 30)


def labels(extra: dict | None = None) -> dict:
    return {**MANAGED, **(extra or {})}


def _meta(name: str, namespace: str | None = None, extra_labels: dict | None = None) -> dict:
    meta = {"name": name, "labels": labels(extra_labels)}
    if namespace:
        meta["namespace"] = namespace
    return meta


def selector() -> dict:
    return {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": "admission"}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- OPA -----------------------------------------------------------------------------------------------------------
def namespace(config) -> dict:
    """Exempt by name (admission_policy.of), not by a label; OPA's pods pass the restricted profile."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": _meta(config.admission.opa.namespace, extra_labels={
                pod_security.ENFORCE: pod_security.RESTRICTED})}


def policy_files(config, policy=None) -> dict[str, str]:
    """The files OPA loads: the admission policy and the authorization policy of its own API."""
    return {POLICY_FILE: policy_render.rego(policy or policy_render.of(config)),
            AUTHZ_FILE: policy_render.authz_rego()}


def policy_configmap(config, policy=None) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(POLICY_CONFIGMAP, config.admission.opa.namespace),
            "data": policy_files(config, policy)}


def network_policy(config) -> dict:
    """Traffic to OPA's pods only on its serving port. It cannot name the API server as the only client: a
    NetworkPolicy selects pods and IP blocks, and the API server is neither a pod nor at an address the cluster
    tells (managed control planes, konnectivity). Any pod may reach the port; system.authz lets it do nothing there
    but ask for a verdict and read /health."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(NAME, config.admission.opa.namespace),
            "spec": {"podSelector": {"matchLabels": selector()}, "policyTypes": ["Ingress"],
                     "ingress": [{"ports": [{"protocol": "TCP", "port": PORT}]}]}}


def tls_secret(config, cert_pem: str, key_pem: str, ca_bundle: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": _meta(SECRET, config.admission.opa.namespace),
            "data": {certs.TLS_CERT: certs.b64(cert_pem), certs.TLS_KEY: certs.b64(key_pem),
                     certs.CA_CERT: certs.b64(ca_bundle)}}


def redacted(secret: dict) -> dict:
    """What may be shown of a Secret: everything but its data."""
    shown = {k: v for k, v in secret.items() if k not in ("data", "stringData")}
    shown["data"] = {key: REDACTED for key in sorted((secret.get("data") or {}) | (secret.get("stringData") or {}))}
    return shown


def service_account(config) -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(NAME, config.admission.opa.namespace),
            "automountServiceAccountToken": False}


def service(config) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(NAME, config.admission.opa.namespace),
            "spec": {"selector": selector(),
                     "ports": [{"name": "https", "port": 443, "targetPort": PORT, "protocol": "TCP"}]}}


# What OPA reads of a request body (its default: 256 MiB, and 512 MiB gzip-decoded). Anyone may POST to / (the API
# server calls the webhook without credentials), so the bound is an AdmissionReview's size: the API server accepts
# bodies up to 3 MiB and a review holds the object (twice for an UPDATE); 8 MiB leaves room and keeps a 256Mi pod alive.
MAX_REQUEST_BYTES = 8 * 1024 * 1024
DECODING_LIMITS = f"server.decoding.max_length={MAX_REQUEST_BYTES},server.decoding.gzip.max_length={MAX_REQUEST_BYTES}"


def deployment(config, tls_hash: str, tolerate: dict | None = None, policy=None) -> dict:
    """OPA serving the policy over TLS on the Secret's certificate. `tls_hash` (the certificate's fingerprint) and
    the policy's are in the pod template, so a new certificate or policy rolls the pods and an unchanged one does
    not."""
    settings = config.admission
    opa_ns = settings.opa.namespace
    files = policy_files(config, policy)
    # --authentication=token --authorization=basic: every request goes through data.system.authz.allow (AUTHZ_FILE),
    # which allows the webhook's POST to / and GET /health to anyone and nothing else to anybody: no token exists,
    # so the policy can be changed only by changing the ConfigMap (docs/security.md).
    args = ["run", "--server", f"--addr=0.0.0.0:{PORT}", "--tls-cert-file=/certs/tls.crt",
            "--tls-private-key-file=/certs/tls.key", "--authentication=token", "--authorization=basic",
            "--disable-telemetry", "--log-level=info", f"--set={DECODING_LIMITS}", *(f"/policy/{name}" for name in files)]
    if settings.certificates == "cert-manager":
        args.insert(5, "--tls-cert-refresh-period=10m")  # cert-manager renews in place: reload the files
    probe = {"httpGet": {"path": "/health", "port": PORT, "scheme": "HTTPS"}}
    container = {
        "name": "opa", "image": settings.opa.image, "args": args,
        "ports": [{"name": "https", "containerPort": PORT, "protocol": "TCP"}],
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe, "initialDelaySeconds": 10, "periodSeconds": 10, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "certs", "mountPath": "/certs", "readOnly": True},
                         {"name": "policy", "mountPath": "/policy", "readOnly": True}],
    }
    annotations = {POLICY_HASH: digest("".join(files[name] for name in sorted(files)))}
    if tls_hash:
        annotations[TLS_HASH] = tls_hash
    pod_labels = labels(selector())
    # Off the GPU nodes: node-prep labels them nvidia.com/gpu.present=true (and taints them). `tolerate`: a cluster
    # with no other node left; then off them when possible, on them (tolerating their taint) when not.
    off_gpu = [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]
    node_affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": off_gpu}]}}
    if tolerate is not None:
        node_affinity = {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": off_gpu}}]}
    anti_affinity = {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                          "labelSelector": {"matchLabels": selector()}}}]}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(NAME, opa_ns),
            "spec": {"replicas": settings.opa.replicas, "selector": {"matchLabels": selector()},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                     "template": {
                         "metadata": {"labels": pod_labels, "annotations": annotations},
                         "spec": {"serviceAccountName": NAME, "automountServiceAccountToken": False,
                                  "priorityClassName": "system-cluster-critical",
                                  "nodeSelector": {"kubernetes.io/os": "linux"},
                                  "affinity": {"nodeAffinity": node_affinity, "podAntiAffinity": anti_affinity},
                                  "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                                      "seccompProfile": {"type": "RuntimeDefault"}},
                                  "containers": [container],
                                  **({"tolerations": [tolerate]} if tolerate else {}),
                                  "volumes": [{"name": "certs", "secret": {"secretName": SECRET}},
                                              {"name": "policy", "configMap": {"name": POLICY_CONFIGMAP}}]}}}}


def disruption_budget(config) -> dict | None:
    if config.admission.opa.replicas < 2:
        return None
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": _meta(NAME, config.admission.opa.namespace),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector()}}}


def cert_manager_objects(config) -> list[dict]:
    """A self-signed issuer makes a CA; a CA issuer signs the serving certificate into the same Secret name."""
    ns = config.admission.opa.namespace
    names = certs.sans(NAME, ns)

    def obj(kind: str, name: str, spec: dict) -> dict:
        return {"apiVersion": CERT_MANAGER, "kind": kind, "metadata": _meta(name, ns), "spec": spec}

    key = {"algorithm": "ECDSA", "size": 256}
    return [
        obj("Issuer", "opa-selfsigned", {"selfSigned": {}}),
        obj("Certificate", "opa-ca", {"isCA": True, "commonName": "gpu-bootstrap admission CA", "secretName": "opa-ca",
                                      "privateKey": key, "duration": f"{certs.CA_DAYS * 24}h",
                                      "issuerRef": {"name": "opa-selfsigned", "kind": "Issuer"}}),
        obj("Issuer", "opa-ca", {"ca": {"secretName": "opa-ca"}}),
        obj("Certificate", "opa-serving", {"secretName": SECRET, "dnsNames": names, "privateKey": key,
                                           "duration": f"{certs.SERVING_DAYS * 24}h",
                                           "renewBefore": f"{config.admission.rotate_before_days * 24}h",
                                           "usages": ["server auth", "digital signature"],
                                           "issuerRef": {"name": "opa-ca", "kind": "Issuer"}}),
    ]


# --- what points the API server at it ------------------------------------------------------------------------------
def webhook_configuration(config, kube_version: str, ca_bundle: str | None, policy=None) -> dict:
    """Mutating (mode mutate) or Validating (mode enforce); CREATE on pods only; failurePolicy Ignore
    (docs/steps/admission.md: a webhook whose server is down must never block the cluster; the in-process backstop
    policy catches what it misses). `ca_bundle` None: cert-manager injects it (or it is not known yet)."""
    settings = config.admission
    policy = policy or policy_render.of(config)
    mutating = settings.mode == "mutate"
    client = {"service": {"namespace": settings.opa.namespace, "name": NAME, "port": 443}}
    if ca_bundle and settings.certificates == "generated":
        client["caBundle"] = certs.b64(ca_bundle)
    hook = {
        "name": WEBHOOK_NAME, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Ignore",
        "timeoutSeconds": TIMEOUT_SECONDS, "matchPolicy": "Equivalent", "clientConfig": client,
        "rules": _webhook_rules(policy),
        "namespaceSelector": policy_render.namespace_selector(policy), "objectSelector": {},
    }
    if mutating:
        hook["reinvocationPolicy"] = "Never"
    if cel_available(kube_version):
        hook["matchConditions"] = policy_render.match_conditions(policy)
    meta = _meta(CONFIG_NAME)
    if settings.certificates == "cert-manager":
        meta["annotations"] = {INJECT_CA: f"{settings.opa.namespace}/opa-serving"}
    kind = "MutatingWebhookConfiguration" if mutating else "ValidatingWebhookConfiguration"
    return {"apiVersion": f"{GROUP}/v1", "kind": kind, "metadata": meta, "webhooks": [hook]}


def _webhook_rules(policy) -> list[dict]:
    """CREATE of pods; with device access also the UPDATE that adds an ephemeral container (`kubectl debug`)."""
    rules = [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
              "scope": "Namespaced"}]
    if policy.device_access:
        rules.append({"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                      "resources": ["pods/ephemeralcontainers"], "scope": "Namespaced"})
    return rules


def _device_constraints(policy) -> dict:
    return {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                               "resources": ["pods"]},
                              {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                               "resources": ["pods/ephemeralcontainers"]}],
            "namespaceSelector": policy_render.namespace_selector(policy)}


def device_access_policies(config, map_version: str | None, policy=None) -> list[dict]:
    """GPUs only for pods given them (render/device_access.py), in the API server itself (>= 1.30), whatever the
    engine: the ValidatingAdmissionPolicy that refuses a pod choosing devices itself (failurePolicy Fail: nothing
    outside the API server can make it fail open), and, in mode mutate where `map_version` is served (engine vap; with
    engine opa, OPA sets it), the MutatingAdmissionPolicy that sets NVIDIA_VISIBLE_DEVICES=void."""
    policy = policy or policy_render.of(config)
    if not policy.device_access:
        return []
    name = DEVICE_ACCESS_NAME
    objects = []
    if map_version and config.admission.mode == "mutate" and config.admission.engine == "vap":
        mutation = {"patchType": "ApplyConfiguration",
                    "applyConfiguration": {"expression": policy_render.void_apply_configuration()}}
        objects += [{"apiVersion": map_version, "kind": "MutatingAdmissionPolicy", "metadata": _meta(name),
                     "spec": {"failurePolicy": "Ignore", "reinvocationPolicy": "IfNeeded",
                              "matchConstraints": _device_constraints(policy),
                              "matchConditions": policy_render.device_mutation_conditions(policy),
                              "mutations": [mutation]}},
                    {"apiVersion": map_version, "kind": "MutatingAdmissionPolicyBinding", "metadata": _meta(name),
                     "spec": {"policyName": name}}]
    spec = {"failurePolicy": "Fail", "matchConstraints": _device_constraints(policy),
            "matchConditions": policy_render.device_conditions(policy),
            "validations": policy_render.device_validations()}
    objects += [{"apiVersion": f"{GROUP}/v1", "kind": "ValidatingAdmissionPolicy", "metadata": _meta(name),
                 "spec": spec},
                {"apiVersion": f"{GROUP}/v1", "kind": "ValidatingAdmissionPolicyBinding", "metadata": _meta(name),
                 "spec": {"policyName": name, "validationActions": ["Deny"]}}]
    return objects


def _constraints(policy) -> dict:
    return {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                               "resources": ["pods"]}],
            "namespaceSelector": policy_render.namespace_selector(policy)}


def _validating(name: str, policy, conditions: list[dict], param_kind: dict | None = None) -> list[dict]:
    spec = {"failurePolicy": "Ignore", "matchConstraints": _constraints(policy), "matchConditions": conditions,
            "validations": policy_render.validations(policy)}
    binding = {"policyName": name, "validationActions": ["Deny"]}
    if param_kind:
        spec["paramKind"], binding["paramRef"] = param_kind, PARAMS_IN_THE_PODS_NAMESPACE
    return [{"apiVersion": f"{GROUP}/v1", "kind": "ValidatingAdmissionPolicy", "metadata": _meta(name), "spec": spec},
            {"apiVersion": f"{GROUP}/v1", "kind": "ValidatingAdmissionPolicyBinding", "metadata": _meta(name),
             "spec": binding}]


def _mutating(name: str, api_version: str, policy, conditions: list[dict], param_kind: dict | None = None):
    mutations = []
    if policy.steer:
        mutations.append({"patchType": "ApplyConfiguration",
                          "applyConfiguration": {"expression": policy_render.apply_configuration(policy)}})
    if policy.toleration is not None:
        mutations.append({"patchType": "JSONPatch",
                          "jsonPatch": {"expression": policy_render.toleration_patch(policy)}})
    spec = {"failurePolicy": "Ignore", "reinvocationPolicy": "Never", "matchConstraints": _constraints(policy),
            "matchConditions": conditions, "mutations": mutations}
    binding = {"policyName": name}
    if param_kind:
        spec["paramKind"], binding["paramRef"] = param_kind, PARAMS_IN_THE_PODS_NAMESPACE
    return [{"apiVersion": api_version, "kind": "MutatingAdmissionPolicy", "metadata": _meta(name), "spec": spec},
            {"apiVersion": api_version, "kind": "MutatingAdmissionPolicyBinding", "metadata": _meta(name),
             "spec": binding}]


def validating_policy(config, policy=None) -> list[dict]:
    """The in-process check (>= 1.30): a GPU pod that is still not on our scheduler after mutation is rejected with
    the field to set. It cannot go down; failurePolicy Ignore so that not even a bug in it can block other pods."""
    policy = policy or policy_render.of(config)
    return _validating(CONFIG_NAME, policy, policy_render.exemption_conditions(policy))


def mutating_policy(config, api_version: str, policy=None) -> list[dict]:
    """engine vap, mode mutate: a MutatingAdmissionPolicy (v1beta1 on 1.34-1.35 when enabled, v1 from 1.36): the
    scheduler (while it runs) and the GPU taint's toleration."""
    policy = policy or policy_render.of(config)
    return _mutating(CONFIG_NAME, api_version, policy, policy_render.mutation_conditions(policy))


# gpu_operator.allocation: dra. The pod names its claims; what they ask for is in the claim templates and claims.
# Each binding selects every one of them in the pod's own namespace (no paramRef.namespace: the request's), and
# the API server evaluates the policy once per template or claim found, none when there is none (Allow).
CLAIM_POLICY_NAMES = {"ResourceClaimTemplate": f"{CONFIG_NAME}-claim-templates",
                      "ResourceClaim": f"{CONFIG_NAME}-claims"}
PARAMS_IN_THE_PODS_NAMESPACE = {"selector": {}, "parameterNotFoundAction": "Allow"}
RESOURCE_API = "resource.k8s.io/v1"


def claim_policies(config, map_version: str | None, policy=None) -> list[dict]:
    """For pods whose GPUs come through ResourceClaims (policy_render.claim_condition): per param kind, the
    MutatingAdmissionPolicy that steers them and gives them the GPU taint's toleration (mode mutate, where
    `map_version` is served), and the ValidatingAdmissionPolicy that rejects those still not on our scheduler."""
    policy = policy or policy_render.of(config)
    objects = []
    for kind, name in CLAIM_POLICY_NAMES.items():
        param_kind = {"apiVersion": RESOURCE_API, "kind": kind}
        if map_version and config.admission.mode == "mutate":
            objects += _mutating(name, map_version, policy, policy_render.claim_mutation_conditions(policy, kind),
                                 param_kind)
        objects += _validating(name, policy, policy_render.claim_conditions(policy, kind), param_kind)
    return objects


# --- the sample pods verify and doctor send as server-side dry runs ----------------------------------------------------
def tolerates(toleration: dict, taint: dict) -> bool:
    """Does this toleration tolerate the taint `taint` names (key, value, effect)? Kubernetes' own rule."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return toleration.get("key", "") in ("", taint["key"])
    return toleration.get("key") == taint["key"] and toleration.get("value", "") == taint.get("value", "")


EXTENDED_RESOURCE_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def sample_pod(name: str, namespace: str, gpu: bool = True, node_name: str | None = None,
               tolerate: bool = True) -> dict:
    container = {"name": "probe", "image": images.default("pause"),  # never started: server-side dry runs only
                 "securityContext": pod_security.restricted_container()}
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    # restricted: the namespace it is tried in may enforce it (gpu-bootstrap's own does)
    spec = {"securityContext": pod_security.restricted_pod(65535), "automountServiceAccountToken": False,
            "containers": [container]}
    if tolerate:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "gpu-bootstrap"}},
            "spec": spec}
