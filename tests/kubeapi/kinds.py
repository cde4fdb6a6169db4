"""Per-kind behaviour of the apiserver's registry strategies: defaulting, status reset on create, generation
tracking, immutable fields, and the admission plugins that are on by default (plus ExtendedResourceToleration,
which managed clusters commonly enable)."""
from __future__ import annotations

import hashlib
import ipaddress

from .util import jcopy

# Kinds whose metadata.generation the apiserver maintains.
GENERATION_GROUPS = {"apps", "batch", "apiextensions.k8s.io", "policy", "networking.k8s.io", "autoscaling",
                     "admissionregistration.k8s.io", "scheduling.k8s.io", "resource.k8s.io"}
NAME_STYLE = {"namespaces": "label", "services": "label"}
PATH_NAMED_GROUPS = {"rbac.authorization.k8s.io"}
WORKLOAD_SELECTOR_KINDS = {"Deployment", "ReplicaSet", "DaemonSet", "StatefulSet"}


def tracks_generation(rt) -> bool:
    return rt.custom or rt.group in GENERATION_GROUPS


def name_style(rt) -> str:
    if rt.group in PATH_NAMED_GROUPS:
        return "path"
    return NAME_STYLE.get(rt.plural, "subdomain")


# --- defaulting --------------------------------------------------------------------------------------------------------
def default_container(container: dict) -> None:
    image = container.get("image", "")
    tag = image.rsplit("/", 1)[-1]
    latest = "@" not in image and (":" not in tag or tag.endswith(":latest"))
    container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    container.setdefault("resources", {})
    for port in container.get("ports") or []:
        port.setdefault("protocol", "TCP")
    for probe_name in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = container.get(probe_name)
        if isinstance(probe, dict):
            for key, value in (("timeoutSeconds", 1), ("periodSeconds", 10), ("successThreshold", 1),
                               ("failureThreshold", 3)):
                probe.setdefault(key, value)
    for env in container.get("env") or []:
        ref = (env.get("valueFrom") or {}).get("fieldRef")
        if isinstance(ref, dict):
            ref.setdefault("apiVersion", "v1")


def default_pod_spec(spec: dict) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    if "serviceAccountName" in spec:
        spec.setdefault("serviceAccount", spec["serviceAccountName"])
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            default_container(container)
    for volume in spec.get("volumes") or []:
        for source in ("configMap", "secret"):
            if isinstance(volume.get(source), dict):
                volume[source].setdefault("defaultMode", 420)
        if isinstance(volume.get("hostPath"), dict):
            volume["hostPath"].setdefault("type", "")


def _template_spec(obj: dict) -> dict | None:
    template = obj.get("spec", {}).get("template")
    if isinstance(template, dict):
        return template.setdefault("spec", {})
    return None


def default_workload(obj: dict) -> None:
    kind, spec = obj.get("kind"), obj.setdefault("spec", {})
    pod_spec = _template_spec(obj)
    if pod_spec is not None:
        default_pod_spec(pod_spec)
    if kind in ("Deployment", "ReplicaSet", "StatefulSet"):
        spec.setdefault("replicas", 1)
    if kind in ("Deployment", "DaemonSet", "StatefulSet"):
        spec.setdefault("revisionHistoryLimit", 10)
    if kind == "Deployment":
        spec.setdefault("progressDeadlineSeconds", 600)
        strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            strategy.setdefault("type", "RollingUpdate")
            strategy.setdefault("rollingUpdate", {}).setdefault("maxSurge", "25%")
            strategy["rollingUpdate"].setdefault("maxUnavailable", "25%")
    if kind == "DaemonSet":
        strategy = spec.setdefault("updateStrategy", {"type": "RollingUpdate"})
        if strategy.get("type") == "RollingUpdate":
            strategy.setdefault("rollingUpdate", {}).setdefault("maxUnavailable", 1)
            strategy["rollingUpdate"].setdefault("maxSurge", 0)
    if kind == "StatefulSet":
        spec.setdefault("podManagementPolicy", "OrderedReady")
        spec.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
        spec.setdefault("persistentVolumeClaimRetentionPolicy", {"whenDeleted": "Retain", "whenScaled": "Retain"})
    if kind == "Job":
        spec.setdefault("completions", 1)
        spec.setdefault("parallelism", 1)
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
        if pod_spec is not None and "manualSelector" not in spec:
            uid = obj.get("metadata", {}).get("uid", "")
            labels = {"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid,
                      "batch.kubernetes.io/job-name": obj["metadata"].get("name", ""),
                      "job-name": obj["metadata"].get("name", "")}
            spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
            template_meta = spec["template"].setdefault("metadata", {})
            template_meta.setdefault("labels", {}).update(labels)
    if kind == "CronJob":
        spec.setdefault("concurrencyPolicy", "Allow")
        spec.setdefault("suspend", False)
        spec.setdefault("successfulJobsHistoryLimit", 3)
        spec.setdefault("failedJobsHistoryLimit", 1)
        job_spec = spec.get("jobTemplate", {}).get("spec", {})
        template = job_spec.get("template", {})
        if isinstance(template, dict):
            default_pod_spec(template.setdefault("spec", {}))


class Allocator:
    """Hands out ClusterIPs and pod IPs like the real allocators (deterministic, never reused)."""

    def __init__(self):
        self._service = ipaddress.ip_address("10.96.0.10")
        self._pod = ipaddress.ip_address("10.244.0.10")

    def service_ip(self) -> str:
        self._service += 1
        return str(self._service)

    def pod_ip(self) -> str:
        self._pod += 1
        return str(self._pod)


def default_service(obj: dict, allocator: Allocator, old: dict | None) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec["type"] != "ExternalName":
        spec.setdefault("internalTrafficPolicy", "Cluster")
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        previous = (old or {}).get("spec", {}).get("clusterIP")
        if "clusterIP" not in spec:
            spec["clusterIP"] = previous or allocator.service_ip()
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))
    obj.setdefault("status", {}).setdefault("loadBalancer", {})


def default_namespace(obj: dict) -> None:
    name = obj.get("metadata", {}).get("name", "")
    obj.setdefault("metadata", {}).setdefault("labels", {})["kubernetes.io/metadata.name"] = name
    obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    status = obj.setdefault("status", {})
    status.setdefault("phase", "Active")


def default_crd(obj: dict) -> None:
    spec = obj.setdefault("spec", {})
    names = spec.setdefault("names", {})
    if "kind" in names:
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", names["kind"] + "List")
    spec.setdefault("conversion", {"strategy": "None"})
    obj.setdefault("status", {}).setdefault("storedVersions", [])


def default_object(obj: dict, rt, allocator: Allocator, old: dict | None) -> None:
    kind = obj.get("kind")
    if rt.group in ("apps", "batch") or kind in ("ReplicationController", "PodTemplate"):
        default_workload(obj)
    elif kind == "Pod":
        default_pod_spec(obj.setdefault("spec", {}))
    elif kind == "Service":
        default_service(obj, allocator, old)
    elif kind == "Namespace":
        default_namespace(obj)
    elif kind == "CustomResourceDefinition":
        default_crd(obj)
    elif kind == "Secret":
        obj.setdefault("type", "Opaque")
    elif kind == "PriorityClass":
        obj.setdefault("preemptionPolicy", "PreemptLowerPriority")
    elif kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        for hook in obj.get("webhooks") or []:
            hook.setdefault("failurePolicy", "Fail")
            hook.setdefault("matchPolicy", "Equivalent")
            hook.setdefault("namespaceSelector", {})
            hook.setdefault("objectSelector", {})
            hook.setdefault("timeoutSeconds", 10)
            if kind == "MutatingWebhookConfiguration":
                hook.setdefault("reinvocationPolicy", "Never")
            for rule in hook.get("rules") or []:
                rule.setdefault("scope", "*")
    elif kind == "ClusterRole" and obj.get("aggregationRule") is None:
        obj.setdefault("rules", obj.get("rules") or [])


# --- admission (mutating) ------------------------------------------------------------------------------------------------
NOT_READY_TOLERATIONS = (("node.kubernetes.io/not-ready", 300), ("node.kubernetes.io/unreachable", 300))


def admit_pod(pod: dict, extended_resource_toleration: bool) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    tolerations = spec.setdefault("tolerations", [])
    for key, seconds in NOT_READY_TOLERATIONS:
        if not any(t.get("key") == key and t.get("effect") in ("NoExecute", None) for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                "tolerationSeconds": seconds})
    if extended_resource_toleration:
        for resource in sorted(extended_resources(spec)):
            if not any(t.get("key") == resource and t.get("operator") == "Exists" for t in tolerations):
                tolerations.append({"key": resource, "operator": "Exists", "effect": "NoSchedule"})
    if not tolerations:
        spec.pop("tolerations")
    pod.setdefault("status", {})
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(spec)}


def extended_resources(spec: dict) -> set[str]:
    names = set()
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            resources = container.get("resources") or {}
            for section in ("requests", "limits"):
                names |= {n for n in (resources.get(section) or {}) if "/" in n and not n.startswith("kubernetes.io/")}
    return names


def qos_class(spec: dict) -> str:
    containers = spec.get("containers") or []
    requests_any = limits_all = False
    guaranteed = bool(containers)
    for container in containers:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        if requests or limits:
            requests_any = True
        for resource in ("cpu", "memory"):
            if resource not in limits or requests.get(resource, limits[resource]) != limits[resource]:
                guaranteed = False
        limits_all = limits_all or bool(limits)
    if guaranteed:
        return "Guaranteed"
    return "Burstable" if requests_any else "BestEffort"


# --- the fields a write may not change ------------------------------------------------------------------------------
def immutable_violations(rt, old: dict, new: dict) -> list[tuple[str, str, str]]:
    causes = []
    if rt.kind in WORKLOAD_SELECTOR_KINDS and old.get("spec", {}).get("selector") != new.get("spec", {}).get("selector"):
        causes.append(("FieldValueInvalid", "spec.selector",
                       f"Invalid value: {new.get('spec', {}).get('selector')!r}: field is immutable"))
    if rt.kind == "Job" and old.get("spec", {}).get("template") != new.get("spec", {}).get("template"):
        causes.append(("FieldValueInvalid", "spec.template", "Invalid value: field is immutable"))
    if rt.kind in ("Secret", "ConfigMap") and old.get("immutable"):
        for key in ("data", "binaryData", "stringData"):
            if old.get(key) != new.get(key):
                causes.append(("FieldForbidden", key, "Forbidden: field is immutable when `immutable` is set"))
    if rt.kind == "Service":
        old_ip, new_ip = old.get("spec", {}).get("clusterIP"), new.get("spec", {}).get("clusterIP")
        if old_ip and new_ip != old_ip:
            causes.append(("FieldValueInvalid", "spec.clusterIPs[0]", f"Invalid value: {new_ip!r}: may not change "
                                                                      f"once set"))
    if rt.kind == "Pod":
        for key in ("containers", "initContainers", "volumes", "nodeSelector", "serviceAccountName"):
            if _containers_shape(old.get("spec", {}).get(key)) != _containers_shape(new.get("spec", {}).get(key)):
                causes.append(("FieldValueForbidden", f"spec", "Forbidden: pod updates may not change fields other "
                                                                "than `spec.containers[*].image`, "
                                                                "`spec.activeDeadlineSeconds`, `spec.tolerations` "
                                                                "(only additions to existing tolerations)"))
                break
        old_node, new_node = old.get("spec", {}).get("nodeName"), new.get("spec", {}).get("nodeName")
        if old_node and old_node != new_node:
            causes.append(("FieldValueForbidden", "spec.nodeName", "Forbidden: pod is already bound"))
    return causes


def _containers_shape(value):
    """A pod's containers minus the image, which is the one container field an update may change."""
    if not isinstance(value, list):
        return value
    return [{k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c for c in value]


def semantic_problems(obj: dict) -> list[tuple[str, str, str]]:
    """Validation beyond the schema that users hit in practice."""
    causes = []
    kind = obj.get("kind")
    if kind == "Node":
        for index, taint in enumerate(obj.get("spec", {}).get("taints") or []):
            effect = taint.get("effect")
            if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
                causes.append(("FieldValueNotSupported", f"spec.taints[{index}].effect",
                               f'Unsupported value: "{effect}": supported values: "NoSchedule", '
                               f'"PreferNoSchedule", "NoExecute"'))
        seen = set()
        for index, taint in enumerate(obj.get("spec", {}).get("taints") or []):
            identity = (taint.get("key"), taint.get("effect"))
            if identity in seen:
                causes.append(("FieldValueDuplicate", f"spec.taints[{index}]",
                               f"Duplicate value: taints must be unique by key and effect pair"))
            seen.add(identity)
    if kind in WORKLOAD_SELECTOR_KINDS or kind == "Job":
        from .selectors import selector_object_matches
        spec = obj.get("spec", {})
        labels = (spec.get("template", {}).get("metadata") or {}).get("labels")
        selector = spec.get("selector")
        if selector is not None and not selector_object_matches(selector, labels):
            causes.append(("FieldValueInvalid", "spec.template.metadata.labels",
                           "Invalid value: `selector` does not match template `labels`"))
    pod_spec, at = _pod_spec(obj)
    if pod_spec is not None:
        causes += _node_field_problems(pod_spec, at)
    if kind == "CustomResourceDefinition":
        spec = obj.get("spec", {})
        expected = f"{spec.get('names', {}).get('plural', '')}.{spec.get('group', '')}"
        if obj.get("metadata", {}).get("name") != expected:
            causes.append(("FieldValueInvalid", "metadata.name",
                           f'Invalid value: "{obj.get("metadata", {}).get("name")}": must be spec.names.plural+"."+'
                           f'spec.group'))
        storage = [v for v in spec.get("versions") or [] if v.get("storage")]
        if len(storage) != 1:
            causes.append(("FieldValueInvalid", "spec.versions", "Invalid value: must have exactly one version "
                                                                 "marked as storage version"))
    return causes


def _pod_spec(obj: dict) -> tuple[dict | None, str]:
    """A pod's spec, or a workload's pod template's, with its path."""
    if obj.get("kind") == "Pod":
        return obj.get("spec") or {}, "spec"
    if obj.get("kind") in WORKLOAD_SELECTOR_KINDS or obj.get("kind") == "Job":
        return (obj.get("spec") or {}).get("template", {}).get("spec") or {}, "spec.template.spec"
    return None, ""


def _node_field_problems(spec: dict, at: str) -> list[tuple[str, str, str]]:
    """ValidateNodeFieldSelectorRequirement: a node field selector (matchFields) names exactly one node with In or
    NotIn (a term per node for several; the DaemonSet controller writes one such term into each pod it makes)."""
    causes = []
    required = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    base = f"{at}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    for index, term in enumerate(required):
        for position, field in enumerate((term or {}).get("matchFields") or []):
            path = f"{base}.nodeSelectorTerms[{index}].matchFields[{position}]"
            if field.get("operator") in ("In", "NotIn") and len(field.get("values") or []) != 1:
                causes.append(("FieldValueRequired", f"{path}.values",
                               "Required value: must be only one value when `operator` is 'In' or 'NotIn' for node "
                               "field selector"))
            if field.get("key") != "metadata.name":
                causes.append(("FieldValueInvalid", f"{path}.key",
                               f'Invalid value: "{field.get("key")}": not a valid field selector key'))
    return causes


def template_hash(template: dict) -> str:
    """The pod-template-hash label value (stable for the same template, like the controller's FNV hash)."""
    digest = hashlib.sha256(repr(_canonical(template)).encode()).hexdigest()
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    number = int(digest[:16], 16)
    out = ""
    for _ in range(10):
        number, index = divmod(number, len(alphabet))
        out += alphabet[index]
    return out


def _canonical(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_canonical(v) for v in value)
    return value


def strip_for_template(template: dict) -> dict:
    out = jcopy(template)
    out.get("metadata", {}).get("labels", {}).pop("pod-template-hash", None)
    return out
