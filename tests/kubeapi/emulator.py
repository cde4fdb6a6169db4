"""The emulator facade: one object a test starts, points real clients at, seeds, inspects and breaks."""
from __future__ import annotations

import threading
import uuid
from pathlib import Path

import yaml

from . import certs
from .admission import AdmissionChain
from .controllers import ControllerManager
from .discovery import OpenAPI
from .faults import Faults
from .requestlog import RequestLog
from .resources import ResourceTable, ResourceType
from .schema import SchemaSet
from .server import EmulatorHTTPServer, ssl_context
from .store import Store, WriteOptions
from .util import jcopy, now, parse_time

SEED_MANAGER = "emulator-seed"
VOLATILE_META = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation")


class Emulator:
    def __init__(self, kube_version: str = "1.31.0", gpu_nodes=(), gpus_per_node: int = 8, cpu_nodes=(),
                 controllers: bool = True, history_limit: int = 20000, extended_resource_toleration: bool = False,
                 gpu_product: str = "NVIDIA-H100-80GB-HBM3", gpu_operator: bool = False,
                 scheduler_pods: bool = True, mutating_admission_policy_beta: bool = False,
                 opa_pods: bool = True):
        """gpu_operator=True: a stand-in for the gpu-operator's controllers runs, and GPU nodes advertise
        nvidia.com/gpu only once its device plugin is ready on them (as on a real cluster).
        scheduler_pods=True: ready pods of a Deployment running kube-scheduler take their config's leader lease and
        serve its profiles' scheduler names (tests/kubeapi/scheduler_sim.py).
        mutating_admission_policy_beta=True: 1.34-1.35 serve MutatingAdmissionPolicy v1beta1 (gate and runtime-config on).
        opa_pods=True: ready pods of a Deployment running openpolicyagent/opa serve its policy over HTTPS with a real
        Rego engine, and their Service is routed there for webhook calls (tests/kubeapi/opa_sim.py)."""
        self.kube_version = kube_version.lstrip("v")
        self.kube_minor = int(self.kube_version.split(".")[1])
        self.table = ResourceTable(self.kube_minor)
        if mutating_admission_policy_beta and 34 <= self.kube_minor <= 35:
            from .resources import MAP_BETA
            for rt in MAP_BETA:
                self.table.add(rt)
        self.schemas = SchemaSet(self.kube_minor)
        self.store = Store(self.table, self.schemas, history_limit, extended_resource_toleration)
        self.controllers = ControllerManager(self.store, self.kube_version)
        if not controllers:
            self.controllers.enabled = {name: False for name in self.controllers.enabled}
        self.openapi = OpenAPI(self.table, self.schemas, self._crd_for)
        self.faults = Faults()
        self.admission = AdmissionChain(self)
        self.service_proxies: dict[tuple[str, str], str] = {}  # (namespace, service) -> URL the proxy forwards to
        self.requests = RequestLog()
        self.pki = certs.generate()
        self.store.ca_pem = self.pki.ca_pem
        self.token = uuid.uuid4().hex
        self.rbac_tokens: dict[str, str] = {}  # bearer token -> user name, authorized by RBAC (tests/kubeapi/rbac.py)
        self.gpu_product = gpu_product
        self.gpu_operator = gpu_operator
        if gpu_operator:
            from .gpu_operator_sim import GpuOperatorSim
            self.controllers.plugins.append(GpuOperatorSim(self.controllers))
        if scheduler_pods:
            from .scheduler_sim import SchedulerSim
            self.controllers.plugins.append(SchedulerSim(self.controllers))
        from .endpoints import EndpointSliceController
        self.controllers.plugins.append(EndpointSliceController(self.controllers))
        self.opa = None
        if opa_pods:
            from .opa_sim import OpaSim
            self.opa = OpaSim(self.controllers, self.admission)
            self.controllers.plugins.append(self.opa)
        self._server: EmulatorHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._node_index = 0
        self._bootstrap(list(gpu_nodes), gpus_per_node, list(cpu_nodes))

    # --- lifecycle -------------------------------------------------------------------------------------------------
    def start(self, host: str = "127.0.0.1", port: int = 0) -> "Emulator":
        self._server = EmulatorHTTPServer((host, port), self, ssl_context(self.pki))
        self._thread = threading.Thread(target=self._server.serve_forever, name="kubeapi-http", daemon=True)
        self._thread.start()
        self.controllers.start()
        self.controllers.resync()
        return self

    def stop(self) -> None:
        if self._server is not None:
            for watcher in list(self._server.open_watches):
                watcher.queue.put(None)
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.controllers.stop()
        if self.controllers.kubelet_sim is not None:
            self.controllers.kubelet_sim.close()
        if self.opa is not None:
            self.opa.stop_all()

    def __enter__(self) -> "Emulator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    @property
    def url(self) -> str:
        return f"https://{self.address}"

    def kubeconfig(self, auth: str = "cert", context: str = "emulator") -> dict:
        """A kubeconfig for real clients. auth='cert' (client certificate) or 'token' (bearer token)."""
        import base64

        def b64(text: str) -> str:
            return base64.b64encode(text.encode()).decode()

        users = [{"name": "emulator-admin", "user": {"client-certificate-data": b64(self.pki.client_cert_pem),
                                                     "client-key-data": b64(self.pki.client_key_pem)}},
                 {"name": "emulator-token", "user": {"token": self.token}}]
        contexts = [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator-admin"}},
                    {"name": "emulator-token", "context": {"cluster": "emulator", "user": "emulator-token"}}]
        current = "emulator-token" if auth == "token" else "emulator"
        if context not in ("emulator", "emulator-token"):
            contexts.append({"name": context, "context": {"cluster": "emulator",
                                                          "user": "emulator-token" if auth == "token"
                                                          else "emulator-admin"}})
            current = context
        return {"apiVersion": "v1", "kind": "Config", "current-context": current,
                "clusters": [{"name": "emulator", "cluster": {"server": self.url,
                                                              "certificate-authority-data": b64(self.pki.ca_pem)}}],
                "contexts": contexts, "users": users, "preferences": {}}

    def add_token(self, user: str) -> str:
        """A bearer token that authenticates as `user` (e.g. system:serviceaccount:ci:gpu-bootstrap), whose requests
        RBAC authorizes against the stored roles and bindings."""
        token = uuid.uuid4().hex
        self.rbac_tokens[token] = user
        return token

    def user_kubeconfig(self, path, token: str) -> Path:
        """A kubeconfig that presents `token` (from add_token)."""
        document = self.kubeconfig("token")
        document["users"] = [{"name": "emulator-token", "user": {"token": token}}]
        document["contexts"] = [c for c in document["contexts"] if c["name"] == "emulator-token"]
        path = Path(path)
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        path.chmod(0o600)
        return path

    def write_kubeconfig(self, path, auth: str = "cert", context: str = "emulator") -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.kubeconfig(auth, context), sort_keys=False))
        path.chmod(0o600)
        return path

    # --- direct access for tests ---------------------------------------------------------------------------------
    def resource(self, name: str) -> ResourceType:
        return self.table.find(name)

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict | None:
        """A copy of the stored object (editing it changes nothing until you seed it back)."""
        return jcopy(self.store.find(self.resource(resource), namespace, name))

    def list(self, resource: str, namespace: str | None = None, label_selector: str = "") -> list[dict]:
        return jcopy(self.store.list(self.resource(resource), namespace, label_selector)[0])

    def seed(self, obj: dict, manager: str = SEED_MANAGER) -> dict:
        """Create or replace an object directly (no HTTP request is logged)."""
        rt = self.table.for_kind(obj["apiVersion"], obj["kind"])
        if rt is None:
            raise KeyError(f"no served resource for {obj['apiVersion']} {obj['kind']}")
        namespace = obj.get("metadata", {}).get("namespace") if rt.namespaced else None
        if rt.namespaced and not namespace:
            namespace = "default"
        name = obj["metadata"]["name"]
        with self.store.lock:
            existing = self.store.find(rt, namespace, name)
            options = WriteOptions(manager=manager)
            if existing is None:
                result = self.store.create(rt, namespace, obj, options)
                if obj.get("status") and rt.has_status:
                    status = jcopy(result)
                    status["status"] = obj["status"]
                    result = self.store.update(rt, namespace, name, status,
                                               WriteOptions(manager=manager, subresource="status"))
                return result
            body = jcopy(obj)
            body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            return self.store.update(rt, namespace, name, body, options)

    def delete(self, resource: str, name: str, namespace: str | None = None) -> None:
        self.store.delete(self.resource(resource), namespace, name)

    def proxy_service(self, namespace: str, name: str, url: str) -> None:
        """Make /api/v1/namespaces/{namespace}/services/{name}[:port]/proxy/... forward to `url` (e.g. a local
        Prometheus): the Service's one ready endpoint, as far as the API server's service proxy is concerned."""
        self.service_proxies[(namespace, name)] = url

    def kubelet(self, workers: int = 4):
        """The kubelet stand-in that runs pods' commands against node file trees (kubelet_sim.py), made once (with
        `workers` pods running at a time): `emu.kubelet().attach(node, tree_root)`, `.unpullable.add(image)`,
        `.canned[node] = {...}`."""
        if self.controllers.kubelet_sim is None:
            from tests.tools import tool
            from .kubelet_sim import KubeletSim
            self.controllers.kubelet_sim = KubeletSim(self.controllers, tool("busybox"), workers)
        return self.controllers.kubelet_sim

    def post_node_status(self, name: str) -> dict:
        """The node's kubelet posts its status (a heartbeat: the conditions' lastHeartbeatTime), as it does every
        few seconds on a real cluster: the Node's resourceVersion moves, nothing else of it does. The times have a
        second's grain, so a second post within the same second is dated a second after the last."""
        import datetime as dt
        with self.store.lock:
            rt = self.resource("nodes")
            node = jcopy(self.store.find(rt, None, name))
            for condition in node["status"].get("conditions") or []:
                last = condition.get("lastHeartbeatTime")
                stamp = parse_time(now()) if not last else max(parse_time(now()),
                                                               parse_time(last) + dt.timedelta(seconds=1))
                condition["lastHeartbeatTime"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
            return self.store.update(rt, None, name, node, WriteOptions(manager="kubelet", subresource="status"))

    def set_node_not_ready(self, name: str) -> dict:
        """The node's kubelet stops posting status, as the node lifecycle controller then records it: Ready
        Unknown (NodeStatusUnknown) and the unreachable taints."""
        with self.store.lock:
            rt = self.resource("nodes")
            node = jcopy(self.store.find(rt, None, name))
            for condition in node["status"]["conditions"]:
                condition.update(status="Unknown", reason="NodeStatusUnknown",
                                 message="Kubelet stopped posting node status.", lastTransitionTime=now())
            self.store.update(rt, None, name, node, WriteOptions(manager="kube-controller-manager",
                                                                 subresource="status"))
            node = jcopy(self.store.find(rt, None, name))
            node["spec"]["taints"] = [t for t in node["spec"].get("taints") or []
                                      if t.get("key") != "node.kubernetes.io/unreachable"] + [
                {"key": "node.kubernetes.io/unreachable", "effect": effect, **({"timeAdded": now()}
                                                                              if effect == "NoExecute" else {})}
                for effect in ("NoSchedule", "NoExecute")]
            return self.store.update(rt, None, name, node, WriteOptions(manager="kube-controller-manager"))

    def register_scheduler(self, name: str) -> None:
        self.controllers.register_scheduler(name)

    def upgrade_control_plane(self, kube_version: str) -> None:
        """A Kubernetes upgrade of the cluster (kubeadm upgrade apply, then the kubelets): /version answers the new
        version, the built-in kinds new in it are served, objects are validated against its schemas, and the nodes
        report the new kubelet version. Stored objects are kept, as on a real upgrade."""
        from .resources import BUILTIN
        with self.store.lock:
            self.kube_version = kube_version.lstrip("v")
            self.kube_minor = int(self.kube_version.split(".")[1])
            self.controllers.kube_version = self.kube_version
            self.table.kube_minor = self.kube_minor
            for rt in BUILTIN:
                if self.kube_minor >= rt.min_minor and self.table.lookup(rt.group, rt.version, rt.plural) is None:
                    self.table.add(rt)
            self.schemas.__init__(self.kube_minor)  # shared with the store and the OpenAPI documents
            nodes = self.resource("nodes")
            for node in self.store.list(nodes, None, "")[0]:
                body = jcopy(node)
                info = body["status"]["nodeInfo"]
                info["kubeletVersion"] = info["kubeProxyVersion"] = f"v{self.kube_version}"
                self.store.update(nodes, None, node["metadata"]["name"], body,
                                  WriteOptions(manager="kubelet", subresource="status"))

    def settle(self, timeout: float = 10.0) -> bool:
        return self.controllers.settle(timeout)

    def snapshot(self, include_system: bool = False) -> dict:
        """Stored objects by (group/kind, namespace, name), minus fields that differ between identical runs."""
        out = {}
        for rt, obj in self.store.all_objects():
            if rt is None:
                continue
            clean = jcopy(obj)
            for key in VOLATILE_META:
                clean["metadata"].pop(key, None)
            out[(f"{rt.group}/{rt.kind}", obj["metadata"].get("namespace", ""), obj["metadata"]["name"])] = clean
        return out

    def _crd_for(self, group: str, plural: str) -> dict | None:
        return self.store.objects.get(("apiextensions.k8s.io", "customresourcedefinitions"), {}).get(
            ("", f"{plural}.{group}"))

    # --- the cluster a fresh kubeadm-like install has ----------------------------------------------------------
    def _bootstrap(self, gpu_nodes: list[str], gpus_per_node: int, cpu_nodes: list[str]) -> None:
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self._create("v1", "Namespace", {"metadata": {"name": name}})
            self.controllers._namespace_defaults(name)
        self._create("v1", "Service", {
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "targetPort": 6443}]}})
        for name, value in (("system-cluster-critical", 2000000000), ("system-node-critical", 2000001000)):
            self._create("scheduling.k8s.io/v1", "PriorityClass", {
                "metadata": {"name": name}, "value": value,
                "description": "Used for system critical pods that must run in the cluster, but can be moved to "
                               "another node if necessary."})
        for name, rules in BOOTSTRAP_CLUSTER_ROLES.items():
            self._create("rbac.authorization.k8s.io/v1", "ClusterRole",
                         {"metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                          "rules": rules})
        self._create("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", {
            "metadata": {"name": "cluster-admin"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:masters"}]})
        self._create("rbac.authorization.k8s.io/v1", "Role", {
            "metadata": {"name": "extension-apiserver-authentication-reader", "namespace": "kube-system"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                       "resourceNames": ["extension-apiserver-authentication"], "verbs": ["get", "list", "watch"]}]})
        self._create("v1", "ConfigMap", {"metadata": {"name": "extension-apiserver-authentication",
                                                      "namespace": "kube-system"},
                                         "data": {"client-ca-file": self.pki.ca_pem}})
        for lease in ("kube-scheduler", "kube-controller-manager"):
            self._create("coordination.k8s.io/v1", "Lease", {
                "metadata": {"name": lease, "namespace": "kube-system"},
                "spec": {"holderIdentity": f"control-plane_{uuid.uuid4()}", "leaseDurationSeconds": 15,
                         "acquireTime": now().replace("Z", ".000000Z"), "renewTime": now().replace("Z", ".000000Z"),
                         "leaseTransitions": 0}})
        if not gpu_nodes and not cpu_nodes:
            cpu_nodes = ["node-1"]
        for name in gpu_nodes:
            self.add_node(name, gpus=gpus_per_node)
        for name in cpu_nodes:
            self.add_node(name)

    def _create(self, api_version: str, kind: str, obj: dict) -> dict:
        obj = {"apiVersion": api_version, "kind": kind, **obj}
        return self.seed(obj, manager="kube-apiserver")

    def add_node(self, name: str, gpus: int = 0, labels: dict | None = None, taints: list | None = None,
                 cpu: str | None = None, memory: str | None = None) -> dict:
        """Register a node as its kubelet would (GPU nodes advertise nvidia.com/gpu)."""
        self._node_index += 1
        index = self._node_index
        cpu = cpu or ("96" if gpus else "16")
        memory = memory or ("791366656Ki" if gpus else "65843012Ki")
        capacity = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "959786032Ki",
                    "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
        allocatable = dict(capacity, cpu=str(int(cpu) - 1) if cpu.isdigit() and int(cpu) > 1 else cpu,
                           **{"ephemeral-storage": "884538805627"})
        if gpus and not self.gpu_operator:
            capacity["nvidia.com/gpu"] = allocatable["nvidia.com/gpu"] = str(gpus)
        stamp = now()
        node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64", **(labels or {})}

        def condition(kind, status, reason, message):
            return {"type": kind, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}

        annotations = {"node.alpha.kubernetes.io/ttl": "0",
                       "volumes.kubernetes.io/controller-managed-attach-detach": "true"}
        if gpus:
            annotations["kubeapi.emulator/gpus"] = str(gpus)  # what the node's hardware has (for the device plugin)
        node = {
            "metadata": {"name": name, "labels": node_labels, "annotations": annotations},
            "spec": {"podCIDR": f"10.244.{index}.0/24", "podCIDRs": [f"10.244.{index}.0/24"]},
            "status": {
                "capacity": capacity, "allocatable": allocatable,
                "conditions": [
                    condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                              "kubelet has sufficient memory available"),
                    condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                    condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                    condition("Ready", "True", "KubeletReady", "kubelet is posting ready status")],
                "addresses": [{"type": "InternalIP", "address": f"10.0.0.{10 + index}"},
                              {"type": "Hostname", "address": name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"machineID": uuid.uuid5(uuid.NAMESPACE_DNS, name).hex,
                             "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
                             "bootID": str(uuid.uuid4()), "kernelVersion": "5.15.0-131-generic",
                             "osImage": "Ubuntu 22.04.5 LTS", "containerRuntimeVersion": "containerd://1.7.27",
                             "kubeletVersion": f"v{self.kube_version}", "kubeProxyVersion": f"v{self.kube_version}",
                             "operatingSystem": "linux", "architecture": "amd64"},
                "images": []}}
        if taints:
            node["spec"]["taints"] = taints
        created = self._create("v1", "Node", node)
        self._create("coordination.k8s.io/v1", "Lease", {
            "metadata": {"name": name, "namespace": "kube-node-lease",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                              "uid": created["metadata"]["uid"]}]},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                     "renewTime": now().replace("Z", ".000000Z")}})
        return created


_ALL = {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}
BOOTSTRAP_CLUSTER_ROLES = {
    "cluster-admin": [_ALL, {"nonResourceURLs": ["*"], "verbs": ["*"]}],
    "admin": [_ALL],
    "edit": [{"apiGroups": ["", "apps", "batch"], "resources": ["*"], "verbs": ["create", "delete", "get", "list",
                                                                                 "patch", "update", "watch"]}],
    "view": [{"apiGroups": ["", "apps", "batch"], "resources": ["*"], "verbs": ["get", "list", "watch"]}],
    "system:kube-scheduler": [
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resourceNames": ["kube-scheduler"], "resources": ["leases"],
         "verbs": ["get", "update"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete", "get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["bindings", "pods/binding"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
        {"apiGroups": ["", "apps", "policy", "storage.k8s.io"],
         "resources": ["replicationcontrollers", "services", "replicasets", "statefulsets", "poddisruptionbudgets",
                       "persistentvolumeclaims", "persistentvolumes", "csinodes", "csidrivers",
                       "csistoragecapacities", "namespaces", "storageclasses"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}],
    "system:volume-scheduler": [
        {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get", "list", "patch", "update", "watch"]},
        {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list", "patch", "update",
                                                                                "watch"]}],
}
