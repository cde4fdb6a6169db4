"""A stand-in for the NVIDIA gpu-operator's controller and the node agents it drives, for the emulator.

No real operator can run here (it needs GPUs and a kubelet), so this does what it does, from the same inputs:
NFD's worker labels GPU nodes it runs on (feature.node.kubernetes.io/pci-10de.present), the operator labels them
nvidia.com/gpu.present and nvidia.com/gpu.deploy.<operand>=true (leaving a user's "false" alone), creates one
DaemonSet per operand enabled in the ClusterPolicy (with the ClusterPolicy's tolerations), and the device plugin
makes a node advertise nvidia.com/gpu once its pod is ready (time-slicing replicas included). NVIDIA's DRA driver
(gpu_operator.allocation: dra) publishes a node's GPUs as a ResourceSlice once its kubelet plugin's pod is ready
there, and withdraws it when that pod goes.
"""
from __future__ import annotations

import yaml

from .util import jcopy

GPUS_ANNOTATION = "kubeapi.emulator/gpus"
DCGM = "nvidia-dcgm-exporter"
PCI_LABEL = "feature.node.kubernetes.io/pci-10de.present"
DRA_PLUGIN = "dra-driver-nvidia-gpu-kubelet-plugin"  # the DRA driver chart's DaemonSet (its pods' name prefix)
OPERANDS = (
    # (ClusterPolicy spec key, DaemonSet name, deploy label suffix)
    ("driver", "nvidia-driver-daemonset", "driver"),
    ("toolkit", "nvidia-container-toolkit-daemonset", "container-toolkit"),
    ("devicePlugin", "nvidia-device-plugin-daemonset", "device-plugin"),
    ("gfd", "gpu-feature-discovery", "gpu-feature-discovery"),
    ("dcgmExporter", "nvidia-dcgm-exporter", "dcgm-exporter"),
    ("validator", "nvidia-operator-validator", "operator-validator"),
    ("migManager", "nvidia-mig-manager", "mig-manager"),
)


class GpuOperatorSim:
    def __init__(self, manager):
        self.manager = manager
        self.store = manager.store
        self._scrape_seen: tuple | None = None  # (ClusterPolicy uid, generation) whose ServiceMonitor was decided
        self._scrape_blocked = False  # a ServiceMonitor wanted while no CRD serves it: the real one stays notReady

    def wants(self, key: tuple) -> bool:
        group, plural = key[0], key[1]
        return (group, plural) in {("nvidia.com", "clusterpolicies"), ("apps", "deployments"), ("", "nodes"),
                                   ("", "pods"), ("apps", "daemonsets"), ("", "configmaps"), ("", "serviceaccounts"),
                                   ("resource.k8s.io", "resourceslices")}

    def reconcile(self) -> None:
        policy = next(iter(self.store.objects.get(("nvidia.com", "clusterpolicies"), {}).values()), None)
        operator = self._operator()
        self._nfd_labels()
        self._publish_slices()
        if policy is None or operator is None or policy["metadata"].get("deletionTimestamp"):
            self._advertise(None, None)
            return
        namespace = operator["metadata"]["namespace"]
        spec = policy.get("spec") or {}
        enabled = [(key, name, suffix) for key, name, suffix in OPERANDS if self._enabled(spec, key)]
        self._operator_labels(enabled)
        for key, name, suffix in OPERANDS:
            if (key, name, suffix) in enabled:
                self._ensure_daemonset(policy, namespace, spec, key, name, suffix)
            else:
                existing = self.store.objects.get(("apps", "daemonsets"), {}).get((namespace, name))
                if existing is not None:
                    self.manager._delete("apps", "daemonsets", existing)
        self._dcgm_scrape(policy, namespace, spec, any(key == "dcgmExporter" for key, _n, _s in enabled))
        self._advertise(namespace, spec)
        self._status(policy, namespace, [name for _k, name, _s in enabled])

    # --- pieces -----------------------------------------------------------------------------------------------------
    def _operator(self) -> dict | None:
        for (namespace, name), deploy in self.store.objects.get(("apps", "deployments"), {}).items():
            conditions = {c.get("type"): c.get("status") for c in (deploy.get("status") or {}).get("conditions") or []}
            if name == "gpu-operator" and conditions.get("Available") == "True":
                return deploy
        return None

    @staticmethod
    def _enabled(spec: dict, key: str) -> bool:
        section = spec.get(key) or {}
        if key == "validator":
            return True
        if key == "migManager":
            return bool(section.get("enabled", True)) and (spec.get("mig") or {}).get("strategy") == "mixed"
        return bool(section.get("enabled", True))

    def _gpu_nodes(self) -> list[dict]:
        return [node for node in self.store.objects.get(("", "nodes"), {}).values()
                if (node["metadata"].get("annotations") or {}).get(GPUS_ANNOTATION)]

    def _pods_ready_on(self, prefix: str, node_name: str, namespace: str | None = None) -> bool:
        for (ns, name), pod in self.store.objects.get(("", "pods"), {}).items():
            if namespace and ns != namespace:
                continue
            if name.startswith(prefix) and pod["spec"].get("nodeName") == node_name and any(
                    c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (pod.get("status") or {}).get("conditions") or []):
                return True
        return False

    def _label(self, node: dict, labels: dict) -> None:
        current = node["metadata"].get("labels") or {}
        if all(current.get(k) == v for k, v in labels.items()):
            return
        body = jcopy(node)
        body["metadata"].setdefault("labels", {}).update(labels)
        self.manager._update("", "nodes", body, "nfd-master" if PCI_LABEL in labels else "gpu-operator")

    def _nfd_labels(self) -> None:
        for node in self._gpu_nodes():
            if self._pods_ready_on("gpu-operator-node-feature-discovery-worker", node["metadata"]["name"]):
                self._label(node, {PCI_LABEL: "true"})

    def _operator_labels(self, enabled) -> None:
        for node in self._gpu_nodes():
            labels = node["metadata"].get("labels") or {}
            if labels.get(PCI_LABEL) != "true":
                continue
            wanted = {"nvidia.com/gpu.present": "true"}
            for _key, _name, suffix in enabled:
                label = f"nvidia.com/gpu.deploy.{suffix}"
                if labels.get(label) not in ("false", "pre-installed"):
                    wanted[label] = "true"
            self._label(node, wanted)

    def _ensure_daemonset(self, policy, namespace, spec, key, name, suffix) -> None:
        section = spec.get(key) or {}
        daemonsets = spec.get("daemonsets") or {}
        image = f"{section.get('repository', 'nvcr.io/nvidia')}/{section.get('image', name)}:" \
                f"{section.get('version', 'latest')}"
        wanted_spec = {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name, "app.kubernetes.io/part-of": "gpu-operator"}},
                         "spec": {"nodeSelector": {f"nvidia.com/gpu.deploy.{suffix}": "true"},
                                  "tolerations": jcopy(daemonsets.get("tolerations") or []),
                                  "priorityClassName": daemonsets.get("priorityClassName", "system-node-critical"),
                                  "serviceAccountName": name,
                                  "containers": [{"name": name, "image": image}]}}}
        if (namespace, name) not in self.store.objects.get(("", "serviceaccounts"), {}):
            # the operator makes each operand's ServiceAccount (and RBAC) before its DaemonSet: without it the
            # ServiceAccount admission plugin refuses every pod of the DaemonSet
            self.manager._create("", "serviceaccounts", namespace, {
                "metadata": {"name": name, "ownerReferences": [self._owner(policy)]}}, "gpu-operator")
        existing = self.store.objects.get(("apps", "daemonsets"), {}).get((namespace, name))
        if existing is None:
            self.manager._create("apps", "daemonsets", namespace, {
                "metadata": {"name": name, "labels": {"app": name, "app.kubernetes.io/managed-by": "gpu-operator"},
                             "ownerReferences": [{"apiVersion": policy["apiVersion"], "kind": "ClusterPolicy",
                                                  "name": policy["metadata"]["name"],
                                                  "uid": policy["metadata"]["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": wanted_spec}, "gpu-operator")
            return
        template = existing["spec"]["template"]["spec"]
        if template.get("tolerations") != wanted_spec["template"]["spec"]["tolerations"] or \
                template["containers"][0]["image"] != image:
            body = jcopy(existing)
            body["spec"]["template"] = jcopy(wanted_spec["template"])
            self.manager._update("apps", "daemonsets", body, "gpu-operator")

    def _dcgm_scrape(self, policy: dict, namespace: str, spec: dict, exporter: bool) -> None:
        """The exporter's Service (port gpu-metrics 9400) and, as the operator's ServiceMonitor() control function
        does (controllers/object_controls.go), its ServiceMonitor with the ClusterPolicy's serviceMonitor edits,
        created only when the servicemonitors CRD exists at that moment. The real operator stops requeueing once
        the ClusterPolicy is ready and does not watch CRDs, so CRDs that appear later are not noticed until the
        ClusterPolicy changes: this decides once per ClusterPolicy generation, while it is not yet ready."""
        services = self.store.objects.get(("", "services"), {})
        if exporter and (namespace, DCGM) not in services:
            self.manager._create("", "services", namespace, {
                "metadata": {"name": DCGM, "labels": {"app": DCGM}, "annotations": {"prometheus.io/scrape": "true"},
                             "ownerReferences": [self._owner(policy)]},
                "spec": {"selector": {"app": DCGM}, "internalTrafficPolicy": "Cluster",
                         "ports": [{"name": "gpu-metrics", "port": 9400, "targetPort": 9400, "protocol": "TCP"}]}},
                "gpu-operator")
        seen = (policy["metadata"]["uid"], policy["metadata"].get("generation"))
        ready = (policy.get("status") or {}).get("state") == "ready"
        if ready and self._scrape_seen == seen:
            return
        self._scrape_seen = seen
        crd = self.store.objects.get(("apiextensions.k8s.io", "customresourcedefinitions"), {}).get(
            ("", "servicemonitors.monitoring.coreos.com"))
        config = (spec.get("dcgmExporter") or {}).get("serviceMonitor") or {}
        existing = self.store.objects.get(("monitoring.coreos.com", "servicemonitors"), {}).get((namespace, DCGM))
        self._scrape_blocked = crd is None and exporter and bool(config.get("enabled"))
        if crd is None:  # the real controller logs "Install Prometheus and necessary CRDs" and stays notReady
            return
        if not exporter or not config.get("enabled"):
            if existing is not None:
                self.manager._delete("monitoring.coreos.com", "servicemonitors", existing)
            return
        endpoint = {"port": "gpu-metrics", "path": "/metrics"}
        for key in ("interval", "scrapeTimeout"):
            if config.get(key):
                endpoint[key] = config[key]
        if config.get("honorLabels") is not None:
            endpoint["honorLabels"] = config["honorLabels"]
        if config.get("relabelings") is not None:
            endpoint["relabelings"] = config["relabelings"]
        body = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                "metadata": {"name": DCGM, "namespace": namespace,
                             "labels": {"app": DCGM, **(config.get("additionalLabels") or {})},
                             "ownerReferences": [self._owner(policy)]},
                "spec": {"endpoints": [endpoint], "jobLabel": "app", "namespaceSelector": {"matchNames": [namespace]},
                         "selector": {"matchLabels": {"app": DCGM}}}}
        if existing is None:
            self.manager._create("monitoring.coreos.com", "servicemonitors", namespace, body, "gpu-operator")
        elif existing.get("spec") != body["spec"] or existing["metadata"].get("labels") != body["metadata"]["labels"]:
            updated = jcopy(existing)
            updated["metadata"]["labels"] = body["metadata"]["labels"]
            updated["spec"] = body["spec"]
            self.manager._update("monitoring.coreos.com", "servicemonitors", updated, "gpu-operator")

    @staticmethod
    def _owner(policy: dict) -> dict:
        return {"apiVersion": policy["apiVersion"], "kind": "ClusterPolicy", "name": policy["metadata"]["name"],
                "uid": policy["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}

    def _advertise(self, namespace: str | None, spec: dict | None) -> None:
        replicas, resource = 1, "nvidia.com/gpu"
        if spec:
            replicas, resource = self._sharing(namespace, spec)
        for node in self._gpu_nodes():
            name = node["metadata"]["name"]
            count = int(node["metadata"]["annotations"][GPUS_ANNOTATION])
            running = namespace is not None and self._pods_ready_on("nvidia-device-plugin-daemonset", name, namespace)
            status = node.get("status") or {}
            wanted = {resource: str(count * replicas)} if running else {}
            current = {k: v for k, v in (status.get("allocatable") or {}).items() if k.startswith("nvidia.com/gpu")}
            if current == wanted:
                continue
            body = jcopy(node)
            for section in ("capacity", "allocatable"):
                values = body["status"].setdefault(section, {})
                for key in [k for k in values if k.startswith("nvidia.com/gpu")]:
                    del values[key]
                values.update(wanted)
            self.manager._write_status("", "nodes", node, body["status"], "nvidia-device-plugin")

    def _publish_slices(self) -> None:
        """NVIDIA's DRA driver: a ready kubelet-plugin pod on a GPU node publishes that node's GPUs (one pool named
        after the node, tests/localcluster/dra.py's H200 devices); no ready pod, no slice."""
        if int(self.manager.kube_version.lstrip("v").split(".")[1]) < 34:  # resource.k8s.io/v1 not served
            return
        from tests.localcluster.dra import resource_slice
        slices = self.store.objects.get(("resource.k8s.io", "resourceslices"), {})
        for node in self._gpu_nodes():
            name = node["metadata"]["name"]
            wanted = resource_slice(name, int(node["metadata"]["annotations"][GPUS_ANNOTATION])) \
                if self._pods_ready_on(DRA_PLUGIN, name) else None
            current = slices.get(("", f"{name}-gpu.nvidia.com"))
            if wanted is not None and current is None:
                self.manager._create("resource.k8s.io", "resourceslices", None, wanted, "gpu.nvidia.com")
            elif wanted is None and current is not None:
                self.manager._delete("resource.k8s.io", "resourceslices", current)

    def _sharing(self, namespace: str, spec: dict) -> tuple[int, str]:
        config = ((spec.get("devicePlugin") or {}).get("config") or {})
        name, default = config.get("name"), config.get("default") or "default"
        cm = self.store.objects.get(("", "configmaps"), {}).get((namespace, name)) if name else None
        if not cm:
            return 1, "nvidia.com/gpu"
        try:
            parsed = yaml.safe_load((cm.get("data") or {}).get(default, "")) or {}
            slicing = (parsed.get("sharing") or {}).get("timeSlicing") or {}
            replicas = int((slicing.get("resources") or [{}])[0].get("replicas", 1))
        except (ValueError, yaml.YAMLError, AttributeError):
            return 1, "nvidia.com/gpu"
        return replicas, "nvidia.com/gpu.shared" if slicing.get("renameByDefault") else "nvidia.com/gpu"

    def _status(self, policy: dict, namespace: str, names: list[str]) -> None:
        daemonsets = self.store.objects.get(("apps", "daemonsets"), {})
        ready = all((ds := daemonsets.get((namespace, n))) is not None and
                    (ds.get("status") or {}).get("desiredNumberScheduled", 0) > 0 and
                    ds["status"].get("numberReady") == ds["status"]["desiredNumberScheduled"] for n in names)
        status = {"state": "ready" if ready and not self._scrape_blocked else "notReady", "namespace": namespace}
        if (policy.get("status") or {}) != status:
            self.manager._write_status("nvidia.com", "clusterpolicies", policy, status, "gpu-operator")
