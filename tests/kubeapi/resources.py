"""The table of served resources: what discovery advertises and what the router accepts.

Built-in resources come from BUILTIN; custom resources are added and removed as CRDs come and go.
"""
from __future__ import annotations

from dataclasses import dataclass, field

STANDARD_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUBRESOURCE_VERBS = {
    "status": ("get", "patch", "update"),
    "scale": ("get", "patch", "update"),
    "finalize": ("update",),
    "log": ("get",),
    "binding": ("create",),
    "eviction": ("create",),
    "token": ("create",),
}


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    verbs: tuple[str, ...] = STANDARD_VERBS
    categories: tuple[str, ...] = ()
    min_minor: int = 0  # first Kubernetes 1.x minor that serves it
    custom: bool = False
    singular: str = ""
    list_kind: str = ""
    printer_columns: tuple = field(default=(), compare=False, hash=False)
    selectable_fields: tuple[str, ...] = field(default=(), compare=False, hash=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def singular_name(self) -> str:
        return self.singular or self.kind.lower()

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _r(group, version, plural, kind, namespaced, short=(), sub=(), verbs=STANDARD_VERBS, cat=(), min_minor=0):
    return ResourceType(group, version, plural, kind, namespaced, tuple(short), tuple(sub), tuple(verbs), tuple(cat),
                        min_minor)


ALL = ("all",)
BUILTIN: tuple[ResourceType, ...] = (
    # core/v1
    _r("", "v1", "configmaps", "ConfigMap", True, ["cm"]),
    _r("", "v1", "endpoints", "Endpoints", True, ["ep"]),
    _r("", "v1", "events", "Event", True, ["ev"]),
    _r("", "v1", "limitranges", "LimitRange", True, ["limits"]),
    _r("", "v1", "namespaces", "Namespace", False, ["ns"], ["status", "finalize"],
       ("create", "delete", "get", "list", "patch", "update", "watch")),
    _r("", "v1", "nodes", "Node", False, ["no"], ["status"]),
    _r("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, ["pvc"], ["status"]),
    _r("", "v1", "persistentvolumes", "PersistentVolume", False, ["pv"], ["status"]),
    _r("", "v1", "pods", "Pod", True, ["po"], ["status", "log", "binding", "eviction"], cat=ALL),
    _r("", "v1", "podtemplates", "PodTemplate", True),
    _r("", "v1", "replicationcontrollers", "ReplicationController", True, ["rc"], ["status", "scale"], cat=ALL),
    _r("", "v1", "resourcequotas", "ResourceQuota", True, ["quota"], ["status"]),
    _r("", "v1", "secrets", "Secret", True),
    _r("", "v1", "serviceaccounts", "ServiceAccount", True, ["sa"], ["token"]),
    _r("", "v1", "services", "Service", True, ["svc"], ["status"], cat=ALL),
    # apps/v1
    _r("apps", "v1", "controllerrevisions", "ControllerRevision", True),
    _r("apps", "v1", "daemonsets", "DaemonSet", True, ["ds"], ["status"], cat=ALL),
    _r("apps", "v1", "deployments", "Deployment", True, ["deploy"], ["status", "scale"], cat=ALL),
    _r("apps", "v1", "replicasets", "ReplicaSet", True, ["rs"], ["status", "scale"], cat=ALL),
    _r("apps", "v1", "statefulsets", "StatefulSet", True, ["sts"], ["status", "scale"], cat=ALL),
    # batch/v1
    _r("batch", "v1", "cronjobs", "CronJob", True, ["cj"], ["status"], cat=ALL),
    _r("batch", "v1", "jobs", "Job", True, (), ["status"], cat=ALL),
    # autoscaling
    _r("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True, ["hpa"], ["status"], cat=ALL),
    # rbac
    _r("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _r("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    _r("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    _r("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    # apiextensions
    _r("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
       ["crd", "crds"], ["status"]),
    # admissionregistration
    _r("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False),
    _r("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration",
       False),
    _r("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy", False,
       (), ["status"], min_minor=30),
    _r("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding",
       False, min_minor=30),
    _r("admissionregistration.k8s.io", "v1", "mutatingadmissionpolicies", "MutatingAdmissionPolicy", False,
       min_minor=36),
    _r("admissionregistration.k8s.io", "v1", "mutatingadmissionpolicybindings", "MutatingAdmissionPolicyBinding",
       False, min_minor=36),
    # resource.k8s.io (DRA), v1 served from 1.34
    _r("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False, min_minor=34),
    _r("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False, min_minor=34),
    _r("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, (), ["status"], min_minor=34),
    _r("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True, min_minor=34),
    # the rest of the groups we touch
    _r("coordination.k8s.io", "v1", "leases", "Lease", True),
    _r("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ["pdb"], ["status"]),
    _r("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, ["pc"]),
    _r("storage.k8s.io", "v1", "csidrivers", "CSIDriver", False),
    _r("storage.k8s.io", "v1", "csinodes", "CSINode", False),
    _r("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, ["sc"]),
    _r("storage.k8s.io", "v1", "volumeattachments", "VolumeAttachment", False, (), ["status"]),
    _r("networking.k8s.io", "v1", "ingressclasses", "IngressClass", False),
    _r("networking.k8s.io", "v1", "ingresses", "Ingress", True, ["ing"], ["status"]),
    _r("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, ["netpol"]),
    _r("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True),
    _r("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False),
    _r("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False,
       verbs=("create",)),
)

# MutatingAdmissionPolicy v1beta1: served on 1.34-1.35 only with the feature gate and runtime-config enabled
# (Emulator(mutating_admission_policy_beta=True)).
MAP_BETA = (
    _r("admissionregistration.k8s.io", "v1beta1", "mutatingadmissionpolicies", "MutatingAdmissionPolicy", False),
    _r("admissionregistration.k8s.io", "v1beta1", "mutatingadmissionpolicybindings", "MutatingAdmissionPolicyBinding",
       False),
)

# Field selectors the real apiserver accepts besides metadata.name / metadata.namespace.
FIELD_SELECTORS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "pods"): ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
                   "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs", "status.nominatedNodeName"),
    ("", "events"): ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
                     "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
                     "reason", "reportingComponent", "source", "type"),
    ("", "secrets"): ("type",),
    ("", "nodes"): ("spec.unschedulable",),
    ("", "namespaces"): ("status.phase",),
    ("", "replicationcontrollers"): ("status.replicas",),
    ("apps", "replicasets"): ("status.replicas",),
    ("batch", "jobs"): ("status.successful",),
}


class ResourceTable:
    """Served resources, indexed for the router and for discovery."""

    def __init__(self, kube_minor: int):
        self.kube_minor = kube_minor
        self._by_gvr: dict[tuple[str, str, str], ResourceType] = {}
        for rt in BUILTIN:
            if kube_minor >= rt.min_minor:
                self.add(rt)

    def add(self, rt: ResourceType) -> None:
        self._by_gvr[(rt.group, rt.version, rt.plural)] = rt

    def remove_group_resource(self, group: str, plural: str) -> None:
        for key in [k for k in self._by_gvr if k[0] == group and k[2] == plural]:
            del self._by_gvr[key]

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_gvr.get((group, version, plural))

    def all(self) -> list[ResourceType]:
        return list(self._by_gvr.values())

    def versions_of(self, group: str, plural: str) -> list[ResourceType]:
        return [rt for (g, _v, p), rt in self._by_gvr.items() if g == group and p == plural]

    def groups(self) -> dict[str, list[str]]:
        """group -> served versions (preferred first)."""
        out: dict[str, list[str]] = {}
        for (group, version, _plural) in self._by_gvr:
            versions = out.setdefault(group, [])
            if version not in versions:
                versions.append(version)
        for versions in out.values():
            versions.sort(key=version_priority)
        return out

    def find(self, name: str) -> ResourceType:
        """Resolve a user-facing name: 'nodes', 'node', 'Node', 'deploy', 'deployments.apps', 'apps/v1/deployments'."""
        if name.count("/") == 2 or (name.count("/") == 1 and not name.startswith("apis")):
            parts = name.split("/")
            group, version, plural = (parts if len(parts) == 3 else ["", parts[0], parts[1]])
            found = self.lookup(group, version, plural)
            if found:
                return found
        group = ""
        if "." in name:
            name, group = name.split(".", 1)
        lowered = name.lower()
        candidates = [rt for rt in self._by_gvr.values() if (not group or rt.group == group) and (
            lowered in (rt.plural, rt.singular_name, rt.kind.lower()) or lowered in rt.short_names)]
        if not candidates:
            raise KeyError(f"unknown resource {name!r}")
        candidates.sort(key=lambda rt: (rt.group != "", rt.custom, version_priority(rt.version)))
        return candidates[0]

    def for_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        for rt in self._by_gvr.values():
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        return None


def version_priority(version: str):
    """Kubernetes version ordering: GA > beta > alpha, higher numbers first."""
    import re
    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not match:
        return (3, 0, 0, version)
    major, stage, minor = match.groups()
    rank = {"alpha": 2, "beta": 1, None: 0}[stage]
    return (rank, -int(major), -int(minor or 0), version)
