"""Simulated control plane: the controllers a real cluster runs, so that clients waiting on readiness see what
they would see there. Each controller can be switched off by a test (`emulator.controllers.disable("job")`).

Controllers react to store events through one work queue and write back through the store with their real
field-manager names, so their writes show up in watches and managedFields but never in the HTTP request log.
"""
from __future__ import annotations

import heapq
import json
import random
import re
import threading
import time

from . import kinds
from .selectors import node_selector_term_matches, selector_object_matches
from .store import Event, Store, WriteOptions
from .util import ApiError, jcopy, now

ALL_CONTROLLERS = ("namespace", "serviceaccount", "crd", "gc", "deployment", "replicaset", "daemonset",
                   "statefulset", "job", "scheduler", "kubelet", "gpu-operator")
SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
CRD_CLEANUP = "customresourcecleanup.apiextensions.k8s.io"
DAEMON_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]
DAEMON_BURST = 250  # pods a DaemonSet sync creates at most (the controller's burstReplicas)
QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
SUFFIXES = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
            "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}


def parse_quantity(value) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    match = QUANTITY.match(str(value).strip())
    if not match or match.group(2) not in SUFFIXES:
        raise ValueError(f"invalid quantity {value!r}")
    return float(match.group(1)) * SUFFIXES[match.group(2)]


def pod_requests(spec: dict) -> dict[str, float]:
    """Effective requests: max(sum of containers, any init container), limits standing in for missing requests."""
    def of(container):
        resources = container.get("resources") or {}
        out = {k: parse_quantity(v) for k, v in (resources.get("limits") or {}).items()}
        out.update({k: parse_quantity(v) for k, v in (resources.get("requests") or {}).items()})
        return out

    total: dict[str, float] = {}
    for container in spec.get("containers") or []:
        for name, amount in of(container).items():
            total[name] = total.get(name, 0) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in of(container).items():
            total[name] = max(total.get(name, 0), amount)
    return total


def tolerates(tolerations: list, taint: dict) -> bool:
    for toleration in tolerations or []:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        operator = toleration.get("operator", "Equal")
        key = toleration.get("key")
        if operator == "Exists" and (not key or key == taint.get("key")):
            return True
        if operator == "Equal" and key == taint.get("key") and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def untolerated_taints(node: dict, tolerations: list) -> list[dict]:
    return [t for t in node.get("spec", {}).get("taints") or []
            if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, t)]


def node_matches_pod(node: dict, spec: dict) -> bool:
    labels = node["metadata"].get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if terms and not any(node_selector_term_matches(term, node) for term in terms):
        return False
    return True


def node_ready(node: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in node.get("status", {}).get("conditions") or [])


def owner_ref(owner: dict) -> dict:
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def controlled_by(obj: dict, owner: dict) -> bool:
    return any(ref.get("uid") == owner["metadata"]["uid"] and ref.get("controller")
               for ref in obj["metadata"].get("ownerReferences") or [])


VECTOR_ADD_LOG = ("[Vector addition of 50000 elements]\nCopy input data from the host memory to the CUDA device\n"
                  "CUDA kernel launch with 196 blocks of 256 threads\nCopy output data from the CUDA device to the "
                  "host memory\nTest PASSED\nDone\n")  # what NVIDIA's cuda-samples vectorAdd prints


def default_pod_behaviour(pod: dict) -> dict:
    """What the simulated kubelet does with a pod: run it (services) or run it to completion (Never/OnFailure).
    The CUDA vector-add sample prints its real output."""
    finishes = pod["spec"].get("restartPolicy", "Always") != "Always"
    images = " ".join(c.get("image", "") for c in pod["spec"].get("containers") or [])
    log = VECTOR_ADD_LOG if "vectoradd" in images else ""
    return {"phase": "Succeeded" if finishes else "Running", "ready": not finishes, "log": log, "exit_code": 0}


class ControllerManager:
    def __init__(self, store: Store, kube_version: str):
        self.store = store
        self.kube_version = kube_version
        self.enabled = {name: True for name in ALL_CONTROLLERS}
        self.schedulers = {"default-scheduler"}
        self.pod_behaviour = default_pod_behaviour
        self.ready_delay = 0.0  # seconds between a pod being bound and the kubelet reporting it running
        self.plugins: list = []  # extra controllers (e.g. the gpu-operator stand-in): wants(key), reconcile()
        self.kubelet_sim = None  # a kubelet that runs pods' commands on node trees (kubelet_sim.py)
        self._queue: list[tuple[float, int, tuple]] = []
        self._earliest: dict[tuple, tuple[float, int]] = {}  # key -> (due, seq) of its earliest queued entry
        self._seq = 0
        self._cv = threading.Condition()
        self._busy = False
        self._stop = False
        self._random = random.Random(11)
        self._thread = threading.Thread(target=self._run, name="kubeapi-controllers", daemon=True)
        store.listeners.append(self._on_event)

    # --- control ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=5)

    def disable(self, *names: str) -> None:
        for name in names:
            self._check(name)
            self.enabled[name] = False

    def enable(self, *names: str) -> None:
        for name in names:
            self._check(name)
            self.enabled[name] = True
        self.resync()

    def _check(self, name: str) -> None:
        if name not in self.enabled:
            raise KeyError(f"unknown controller {name!r}; known: {', '.join(ALL_CONTROLLERS)}")

    def register_scheduler(self, name: str) -> None:
        self.schedulers.add(name)
        self._enqueue(("@pending", "", "", ""))

    def unregister_scheduler(self, name: str) -> None:
        self.schedulers.discard(name)

    def resync(self) -> None:
        """Queue every object once, as an informer resync does."""
        for rt, obj in self.store.all_objects():
            if rt is not None:
                self._enqueue((rt.group, rt.plural, obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until no work is queued or running (delayed work that is not yet due does not count)."""
        deadline = time.monotonic() + timeout
        quiet_since = None
        while time.monotonic() < deadline:
            with self._cv:
                due = bool(self._queue) and self._queue[0][0] <= time.monotonic()
                idle = not due and not self._busy
            if idle:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 0.05:
                    return True
            else:
                quiet_since = None
            time.sleep(0.01)
        return False

    # --- queue ----------------------------------------------------------------------------------------------------
    def _on_event(self, event: Event) -> None:
        meta = event.obj["metadata"]
        key = (event.group, event.plural, meta.get("namespace", ""), meta["name"])
        self._enqueue(key)
        for ref in meta.get("ownerReferences") or []:
            self._enqueue(("@owner", ref.get("kind", ""), meta.get("namespace", ""), ref.get("name", "")))
        if event.type == "DELETED":
            self._enqueue(("@deleted", event.obj["metadata"]["uid"], "", ""))
            if meta.get("namespace"):
                self._enqueue(("", "namespaces", "", meta["namespace"]))
            if event.plural == "pods":
                self._enqueue(("@pending", "", "", ""))
        if event.plural in ("nodes", "pods"):
            self._enqueue(("@pending", "", "", ""))
            if event.plural == "nodes":
                self._enqueue(("@daemonsets", "", "", ""))

    def _enqueue(self, key: tuple, delay: float = 0.0) -> None:
        with self._cv:
            due = time.monotonic() + delay
            queued = self._earliest.get(key)
            if not delay and queued is not None and queued[0] <= due:
                return  # already queued to run no later: one reconcile covers both (an index, not a scan: 1,000s)
            self._seq += 1
            heapq.heappush(self._queue, (due, self._seq, key))
            if queued is None or due < queued[0]:
                self._earliest[key] = (due, self._seq)
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and (not self._queue or self._queue[0][0] > time.monotonic()):
                    wait = self._queue[0][0] - time.monotonic() if self._queue else None
                    self._cv.wait(timeout=wait)
                if self._stop:
                    return
                _due, seq, key = heapq.heappop(self._queue)
                if self._earliest.get(key, (0, None))[1] == seq:
                    del self._earliest[key]
                self._busy = True
            try:
                with self.store.lock:
                    self._reconcile(key)
            except ApiError:
                self._enqueue(key, delay=0.05)
            except Exception:  # noqa: BLE001 - a controller bug must not kill the emulator; make it visible instead
                import traceback
                traceback.print_exc()
            finally:
                with self._cv:
                    self._busy = False

    # --- dispatch ---------------------------------------------------------------------------------------------------
    def _reconcile(self, key: tuple) -> None:
        group, plural, namespace, name = key
        if group == "@deleted":
            return self._on(("gc",), self._collect_dependents, plural)
        if group == "@owner":
            return self._reconcile_owner(plural, namespace, name)
        if group == "@pending":
            return self._on(("scheduler",), self._schedule_pending)
        if group == "@daemonsets":
            for ds in list(self._bucket("apps", "daemonsets").values()):
                self._on(("daemonset",), self._daemonset, ds)
            return None
        obj = self._bucket(group, plural).get((namespace, name))
        if obj is None:
            self._plugins(key)
            return None
        handlers = {
            ("", "namespaces"): ("namespace", self._namespace),
            ("apiextensions.k8s.io", "customresourcedefinitions"): ("crd", self._crd),
            ("apps", "deployments"): ("deployment", self._deployment),
            ("apps", "replicasets"): ("replicaset", self._replicaset),
            ("apps", "daemonsets"): ("daemonset", self._daemonset),
            ("apps", "statefulsets"): ("statefulset", self._statefulset),
            ("batch", "jobs"): ("job", self._job),
            ("", "pods"): ("kubelet", self._pod),
        }
        if obj["metadata"].get("deletionTimestamp"):
            self._on(("gc",), self._finalize_owner, obj, group, plural)
        handler = handlers.get((group, plural))
        if handler:
            self._on((handler[0],), handler[1], obj)
        self._plugins(key)
        return None

    def _plugins(self, key: tuple) -> None:
        for plugin in self.plugins:
            if self.enabled.get("gpu-operator", True) and plugin.wants(key):
                plugin.reconcile()

    def _on(self, names: tuple, fn, *args):
        if all(self.enabled[n] for n in names):
            return fn(*args)
        return None

    def _reconcile_owner(self, kind: str, namespace: str, name: str) -> None:
        owners = {"ReplicaSet": ("apps", "replicasets"), "Deployment": ("apps", "deployments"),
                  "DaemonSet": ("apps", "daemonsets"), "StatefulSet": ("apps", "statefulsets"),
                  "Job": ("batch", "jobs")}
        if kind in owners:
            self._enqueue((*owners[kind], namespace, name))

    # --- store helpers -------------------------------------------------------------------------------------------
    def _rt(self, group: str, plural: str):
        return self.store.table.versions_of(group, plural)[0]

    def _bucket(self, group: str, plural: str) -> dict:
        return self.store.objects.get((group, plural), {})

    def _owned(self, group: str, plural: str, owner: dict) -> list[dict]:
        namespace = owner["metadata"].get("namespace", "")
        return [o for (ns, _n), o in sorted(self._bucket(group, plural).items())
                if ns == namespace and controlled_by(o, owner)]

    def _write_status(self, group: str, plural: str, obj: dict, status: dict, manager: str) -> None:
        if obj.get("status") == status:
            return
        body = {**obj, "status": status}  # store.update copies it
        rt = self._rt(group, plural)
        self.store.update(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"], body,
                          WriteOptions(manager=manager, subresource="status" if rt.has_status else ""))

    def _update(self, group: str, plural: str, obj: dict, manager: str) -> dict:
        rt = self._rt(group, plural)
        return self.store.update(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"], obj,
                                 WriteOptions(manager=manager))

    def _create(self, group: str, plural: str, namespace: str | None, obj: dict, manager: str) -> dict:
        return self.store.create(self._rt(group, plural), namespace, obj, WriteOptions(manager=manager))

    def _delete(self, group: str, plural: str, obj: dict, policy: str = "Background") -> None:
        try:
            self.store.delete(self._rt(group, plural), obj["metadata"].get("namespace"), obj["metadata"]["name"],
                              {"propagationPolicy": policy})
        except ApiError as error:
            if error.code != 404:
                raise

    def _suffix(self) -> str:
        return "".join(self._random.choice(SUFFIX_ALPHABET) for _ in range(5))

    # --- namespace + service account controllers ------------------------------------------------------------------
    def _namespace(self, ns: dict) -> None:
        name = ns["metadata"]["name"]
        if not ns["metadata"].get("deletionTimestamp"):
            self._on(("serviceaccount",), self._namespace_defaults, name)
            return
        for rt, obj in self._contents(name):
            if not obj["metadata"].get("deletionTimestamp"):
                self._delete(rt.group, rt.plural, obj)
        if self._contents(name):
            return  # objects with finalizers keep the namespace Terminating, as on a real cluster
        current = self._bucket("", "namespaces").get(("", name))
        if current is None:
            return
        finalized = jcopy(current)
        finalized["spec"]["finalizers"] = []
        if current.get("spec", {}).get("finalizers"):
            current = self.store.update(self._rt("", "namespaces"), None, name, finalized,
                                        WriteOptions(manager="kube-controller-manager", subresource="finalize"))
        if not current["metadata"].get("finalizers"):
            self.store._remove(self._rt("", "namespaces"), current, current, False)

    def _contents(self, namespace: str) -> list[tuple]:
        return [(rt, obj) for rt, obj in self.store.all_objects()
                if rt is not None and rt.namespaced and obj["metadata"].get("namespace") == namespace]

    def _namespace_defaults(self, name: str) -> None:
        if (name, "default") not in self._bucket("", "serviceaccounts"):
            self._create("", "serviceaccounts", name, {"metadata": {"name": "default"}}, "kube-controller-manager")
        if (name, "kube-root-ca.crt") not in self._bucket("", "configmaps"):
            self._create("", "configmaps", name, {
                "metadata": {"name": "kube-root-ca.crt",
                             "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to "
                                                                          "verify the kube-apiserver when using "
                                                                          "internal endpoints such as the internal "
                                                                          "service IP or kubernetes.default.svc."}},
                "data": {"ca.crt": getattr(self.store, "ca_pem", "")}}, "kube-controller-manager")

    # --- CRDs ---------------------------------------------------------------------------------------------------------
    def _crd(self, crd: dict) -> None:
        if crd["metadata"].get("deletionTimestamp"):
            spec = crd["spec"]
            rts = self.store.table.versions_of(spec["group"], spec["names"]["plural"])
            for obj in list(self._bucket(spec["group"], spec["names"]["plural"]).values()):
                if not obj["metadata"].get("deletionTimestamp") and rts:
                    self._delete(spec["group"], spec["names"]["plural"], obj)
            if self._bucket(spec["group"], spec["names"]["plural"]):
                return
            body = jcopy(crd)
            body["metadata"]["finalizers"] = [f for f in body["metadata"].get("finalizers", []) if f != CRD_CLEANUP]
            self._update("apiextensions.k8s.io", "customresourcedefinitions", body, "kube-apiserver")
            return
        spec = crd["spec"]
        storage = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
        stored = list(crd.get("status", {}).get("storedVersions") or [])
        for version in storage:
            if version not in stored:
                stored.append(version)
        transition = now()
        previous = {c["type"]: c for c in crd.get("status", {}).get("conditions") or []}

        def condition(kind, reason, message):
            old = previous.get(kind)
            stamp = old["lastTransitionTime"] if old and old.get("status") == "True" else transition
            return {"type": kind, "status": "True", "lastTransitionTime": stamp, "reason": reason, "message": message}

        status = {"acceptedNames": {k: v for k, v in spec.get("names", {}).items()},
                  "conditions": [condition("NamesAccepted", "NoConflicts", "no conflicts found"),
                                 condition("Established", "InitialNamesAccepted", "the initial names have been "
                                                                                  "accepted")],
                  "storedVersions": stored}
        self._write_status("apiextensions.k8s.io", "customresourcedefinitions", crd, status, "kube-apiserver")

    # --- garbage collector --------------------------------------------------------------------------------------
    def _dependents(self, uid: str) -> list[tuple]:
        return [(rt, obj) for rt, obj in self.store.dependents(uid) if rt is not None]

    def _collect_dependents(self, uid: str) -> None:
        if self.store.by_uid(uid) is not None:
            return  # owner still exists (e.g. only its old revision was deleted)
        for rt, obj in self._dependents(uid):
            if not obj["metadata"].get("deletionTimestamp"):
                self._delete(rt.group, rt.plural, obj)

    def _finalize_owner(self, obj: dict, group: str, plural: str) -> None:
        finalizers = obj["metadata"].get("finalizers") or []
        uid = obj["metadata"]["uid"]
        if "orphan" in finalizers:
            for rt, dependent in self._dependents(uid):
                body = jcopy(dependent)
                body["metadata"]["ownerReferences"] = [r for r in body["metadata"]["ownerReferences"]
                                                       if r.get("uid") != uid]
                self._update(rt.group, rt.plural, body, "kube-controller-manager")
            self._drop_finalizer(obj, group, plural, "orphan")
        elif "foregroundDeletion" in finalizers:
            dependents = self._dependents(uid)
            for rt, dependent in dependents:
                if not dependent["metadata"].get("deletionTimestamp"):
                    self._delete(rt.group, rt.plural, dependent, "Foreground")
            if not dependents:
                self._drop_finalizer(obj, group, plural, "foregroundDeletion")

    def _drop_finalizer(self, obj: dict, group: str, plural: str, finalizer: str) -> None:
        body = jcopy(obj)
        body["metadata"]["finalizers"] = [f for f in body["metadata"].get("finalizers") or [] if f != finalizer]
        self._update(group, plural, body, "kube-controller-manager")

    # --- workloads ----------------------------------------------------------------------------------------------
    def _deployment(self, deploy: dict) -> None:
        if deploy["metadata"].get("deletionTimestamp"):
            return
        spec = deploy["spec"]
        template = kinds.strip_for_template(spec.get("template", {}))
        digest = kinds.template_hash(template)
        owned = self._owned("apps", "replicasets", deploy)
        current = next((rs for rs in owned if rs["metadata"].get("labels", {}).get("pod-template-hash") == digest),
                       None)
        revisions = [int(rs["metadata"].get("annotations", {}).get("deployment.kubernetes.io/revision", "0"))
                     for rs in owned]
        if current is None:
            revision = str(max(revisions, default=0) + 1)
            rs_template = jcopy(template)
            rs_template.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = digest
            selector = jcopy(spec.get("selector") or {})
            selector.setdefault("matchLabels", {})["pod-template-hash"] = digest
            current = self._create("apps", "replicasets", deploy["metadata"]["namespace"], {
                "metadata": {"name": f"{deploy['metadata']['name']}-{digest}",
                             "labels": {**(template.get("metadata", {}).get("labels") or {}),
                                        "pod-template-hash": digest},
                             "annotations": {"deployment.kubernetes.io/desired-replicas": str(spec.get("replicas", 1)),
                                             "deployment.kubernetes.io/max-replicas": str(spec.get("replicas", 1)),
                                             "deployment.kubernetes.io/revision": revision},
                             "ownerReferences": [owner_ref(deploy)]},
                "spec": {"replicas": spec.get("replicas", 1), "selector": selector, "template": rs_template}},
                "kube-controller-manager")
        elif current["spec"].get("replicas") != spec.get("replicas", 1):
            body = jcopy(current)
            body["spec"]["replicas"] = spec.get("replicas", 1)
            current = self._update("apps", "replicasets", body, "kube-controller-manager")
        surge_only = str(((spec.get("strategy") or {}).get("rollingUpdate") or {}).get("maxUnavailable", "")) in \
            ("0", "0%")
        if surge_only and (current.get("status") or {}).get("availableReplicas", 0) < spec.get("replicas", 1):
            shrink = [current]  # maxUnavailable 0: the old pods serve until the new ones are available
        else:
            shrink = owned
        for rs in shrink:
            if rs is not current and rs["metadata"]["uid"] != current["metadata"]["uid"] and rs["spec"].get("replicas"):
                body = jcopy(rs)
                body["spec"]["replicas"] = 0
                self._update("apps", "replicasets", body, "kube-controller-manager")
        revision = current["metadata"].get("annotations", {}).get("deployment.kubernetes.io/revision", "1")
        if deploy["metadata"].get("annotations", {}).get("deployment.kubernetes.io/revision") != revision:
            body = jcopy(deploy)
            body["metadata"].setdefault("annotations", {})["deployment.kubernetes.io/revision"] = revision
            deploy = self._update("apps", "deployments", body, "kube-controller-manager")
        self._deployment_status(deploy, current, owned)

    def _deployment_status(self, deploy: dict, current: dict, owned: list[dict]) -> None:
        wanted = deploy["spec"].get("replicas", 1)
        rs_status = current.get("status", {})
        total = sum(rs.get("status", {}).get("replicas", 0) for rs in owned) or rs_status.get("replicas", 0)
        ready = rs_status.get("readyReplicas", 0)
        available = rs_status.get("availableReplicas", 0)
        updated = rs_status.get("replicas", 0)
        complete = available >= wanted and updated >= wanted and total == wanted
        previous = {c["type"]: c for c in deploy.get("status", {}).get("conditions") or []}
        stamp = now()

        def condition(kind, status, reason, message):
            old = previous.get(kind)
            same = old and old.get("status") == status and old.get("reason") == reason
            return {"type": kind, "status": status, "reason": reason, "message": message,
                    "lastUpdateTime": old["lastUpdateTime"] if same else stamp,
                    "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status else stamp}

        name = current["metadata"]["name"]
        status = {"observedGeneration": deploy["metadata"].get("generation", 1), "replicas": total,
                  "updatedReplicas": updated, "readyReplicas": ready, "availableReplicas": available,
                  "conditions": [
                      condition("Available", "True" if available >= wanted else "False",
                                "MinimumReplicasAvailable" if available >= wanted else "MinimumReplicasUnavailable",
                                "Deployment has minimum availability." if available >= wanted
                                else "Deployment does not have minimum availability."),
                      condition("Progressing", "True", "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
                                f'ReplicaSet "{name}" has successfully progressed.' if complete
                                else f'ReplicaSet "{name}" is progressing.')]}
        if total - available > 0:
            status["unavailableReplicas"] = total - available
        for key in ("readyReplicas", "availableReplicas", "updatedReplicas", "replicas"):
            if not status[key]:
                status.pop(key)
        self._write_status("apps", "deployments", deploy, status, "kube-controller-manager")

    def _pods_of(self, owner: dict) -> list[dict]:
        return [p for p in self._owned("", "pods", owner) if not p["metadata"].get("deletionTimestamp")]

    def _new_pod(self, owner: dict, name: str, extra_labels: dict | None = None, spec_patch: dict | None = None) -> None:
        template = jcopy(owner["spec"].get("template", {}))
        meta = template.get("metadata") or {}
        spec = template.get("spec") or {}
        if spec_patch:
            spec.update(spec_patch)
        self._create("", "pods", owner["metadata"]["namespace"], {
            "metadata": {"name": name, "labels": {**(meta.get("labels") or {}), **(extra_labels or {})},
                         "annotations": meta.get("annotations") or {}, "ownerReferences": [owner_ref(owner)]},
            "spec": spec}, "kube-controller-manager")

    def _replicaset(self, rs: dict) -> None:
        if rs["metadata"].get("deletionTimestamp"):
            return
        pods = self._pods_of(rs)
        wanted = rs["spec"].get("replicas", 1)
        for _ in range(wanted - len(pods)):
            self._new_pod(rs, f"{rs['metadata']['name']}-{self._suffix()}")
        for pod in pods[wanted:]:
            self._delete("", "pods", pod)
        pods = self._pods_of(rs)[:wanted]
        ready = sum(1 for p in pods if pod_is_ready(p))
        status = {"replicas": len(pods), "fullyLabeledReplicas": len(pods), "readyReplicas": ready,
                  "availableReplicas": ready, "observedGeneration": rs["metadata"].get("generation", 1)}
        status = {k: v for k, v in status.items() if v or k in ("replicas", "observedGeneration")}
        self._write_status("apps", "replicasets", rs, status, "kube-controller-manager")

    def _eligible_nodes(self, spec: dict) -> list[dict]:
        tolerations = (spec.get("tolerations") or []) + DAEMON_TOLERATIONS
        nodes = []
        for (_ns, _name), node in sorted(self._bucket("", "nodes").items()):
            if node_matches_pod(node, spec) and not untolerated_taints(node, tolerations):
                nodes.append(node)
        return nodes

    def _daemonset(self, ds: dict) -> None:
        if ds["metadata"].get("deletionTimestamp"):
            return
        spec = ds["spec"].get("template", {}).get("spec", {})
        nodes = self._eligible_nodes(spec)
        pods = self._pods_of(ds)
        names = {n["metadata"]["name"] for n in nodes}
        by_node = {}
        for pod in pods:
            target = pod_target_node(pod)
            if target in by_node or target not in names:
                self._delete("", "pods", pod)
            else:
                by_node[target] = pod
        created = 0
        revision = ""  # the template's hash: computed once per sync (a 1,000-node template takes ms), when needed
        for node in nodes:
            name = node["metadata"]["name"]
            if name not in by_node and created >= DAEMON_BURST:  # the rest in the next sync, as the real one does
                self._enqueue(("apps", "daemonsets", ds["metadata"]["namespace"], ds["metadata"]["name"]))
                break
            if name not in by_node:
                created += 1
                affinity = jcopy(spec.get("affinity") or {})
                affinity.setdefault("nodeAffinity", {})["requiredDuringSchedulingIgnoredDuringExecution"] = {
                    "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                            "values": [name]}]}]}
                tolerations = list(spec.get("tolerations") or [])
                tolerations += [t for t in DAEMON_TOLERATIONS if t not in tolerations]
                revision = revision or kinds.template_hash(ds["spec"].get("template", {}))[:10]
                self._new_pod(ds, f"{ds['metadata']['name']}-{self._suffix()}",
                              {"controller-revision-hash": revision,
                               "pod-template-generation": str(ds["metadata"].get("generation", 1))},
                              {"affinity": affinity, "tolerations": tolerations})
        pods = [p for p in self._pods_of(ds) if pod_target_node(p) in names]
        ready = sum(1 for p in pods if pod_is_ready(p))
        scheduled = sum(1 for p in pods if p["spec"].get("nodeName"))
        status = {"currentNumberScheduled": scheduled, "desiredNumberScheduled": len(nodes),
                  "numberMisscheduled": 0, "numberReady": ready, "observedGeneration": ds["metadata"].get("generation", 1),
                  "updatedNumberScheduled": scheduled, "numberAvailable": ready}
        if len(nodes) - ready:
            status["numberUnavailable"] = len(nodes) - ready
        if not ready:
            status.pop("numberAvailable")
        if not scheduled:
            status.pop("updatedNumberScheduled")
        self._write_status("apps", "daemonsets", ds, status, "kube-controller-manager")

    def _statefulset(self, sts: dict) -> None:
        if sts["metadata"].get("deletionTimestamp"):
            return
        wanted = sts["spec"].get("replicas", 1)
        name = sts["metadata"]["name"]
        revision = f"{name}-{kinds.template_hash(sts['spec'].get('template', {}))[:10]}"
        pods = {p["metadata"]["name"]: p for p in self._pods_of(sts)}
        for index in range(wanted):
            pod_name = f"{name}-{index}"
            if pod_name not in pods:
                self._new_pod(sts, pod_name, {"statefulset.kubernetes.io/pod-name": pod_name,
                                              "controller-revision-hash": revision,
                                              "apps.kubernetes.io/pod-index": str(index)},
                              {"hostname": pod_name, "subdomain": sts["spec"].get("serviceName", "")})
                break  # OrderedReady: one at a time
            if not pod_is_ready(pods[pod_name]):
                break
        for pod_name, pod in pods.items():
            if int(pod_name.rsplit("-", 1)[-1]) >= wanted:
                self._delete("", "pods", pod)
        pods = [p for p in self._pods_of(sts) if int(p["metadata"]["name"].rsplit("-", 1)[-1]) < wanted]
        ready = sum(1 for p in pods if pod_is_ready(p))
        status = {"observedGeneration": sts["metadata"].get("generation", 1), "replicas": len(pods),
                  "readyReplicas": ready, "currentReplicas": len(pods), "updatedReplicas": len(pods),
                  "availableReplicas": ready, "currentRevision": revision, "updateRevision": revision,
                  "collisionCount": 0}
        status = {k: v for k, v in status.items() if v or k in ("replicas", "observedGeneration")}
        self._write_status("apps", "statefulsets", sts, status, "kube-controller-manager")

    def _job(self, job: dict) -> None:
        if job["metadata"].get("deletionTimestamp"):
            return
        spec, status = job["spec"], jcopy(job.get("status") or {})
        if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in status.get("conditions") or []):
            return
        pods = self._owned("", "pods", job)
        succeeded = sum(1 for p in pods if p.get("status", {}).get("phase") == "Succeeded")
        failed = sum(1 for p in pods if p.get("status", {}).get("phase") == "Failed")
        active = [p for p in pods if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
        completions = spec.get("completions", 1)
        stamp = now()
        status.setdefault("startTime", stamp)
        conditions = []
        if succeeded >= completions:
            conditions = [{"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
                           "message": "Reached expected number of succeeded pods"},
                          {"type": "Complete", "status": "True", "reason": "CompletionsReached",
                           "message": "Reached expected number of succeeded pods"}]
            status["completionTime"] = stamp
        elif failed > spec.get("backoffLimit", 6):
            conditions = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                           "message": "Job has reached the specified backoff limit"}]
        else:
            for _ in range(min(spec.get("parallelism", 1), completions - succeeded) - len(active)):
                self._new_pod(job, f"{job['metadata']['name']}-{self._suffix()}")
            active = [p for p in self._owned("", "pods", job)
                      if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
        for condition in conditions:
            condition.update({"lastProbeTime": stamp, "lastTransitionTime": stamp})
        if conditions:
            status["conditions"] = conditions
        status.update({"active": len(active), "succeeded": succeeded, "failed": failed,
                       "ready": sum(1 for p in active if pod_is_ready(p)),
                       "terminating": 0, "uncountedTerminatedPods": {}})
        status = {k: v for k, v in status.items() if v != 0 or k == "ready"}
        self._write_status("batch", "jobs", job, status, "kube-controller-manager")

    # --- scheduler ------------------------------------------------------------------------------------------------
    def _schedule_pending(self) -> None:
        for pod in list(self._bucket("", "pods").values()):
            if (not pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp")
                    and pod["spec"].get("schedulerName", "default-scheduler") in self.schedulers):
                self._schedule(pod)

    def _schedule(self, pod: dict) -> None:
        requests = pod_requests(pod["spec"])
        pinned = self._bucket("", "nodes").get(("", pod_target_node(pod)))  # a DaemonSet's pod names its node
        if pinned is not None and not self._unfit(pinned, pod, requests):
            return self._bind(pod, pinned)
        nodes = sorted(self._bucket("", "nodes").values(), key=lambda n: n["metadata"]["name"])
        reasons: dict[str, int] = {}
        fits = []
        for node in nodes:
            reason = self._unfit(node, pod, requests)
            if reason:
                reasons[reason] = reasons.get(reason, 0) + 1
            else:
                fits.append(node)
        if not fits:
            detail = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
            message = f"0/{len(nodes)} nodes are available: {detail}." if nodes else "no nodes available to schedule pods"
            condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                         "lastProbeTime": None, "lastTransitionTime": now()}
            current = [c for c in pod.get("status", {}).get("conditions") or [] if c.get("type") == "PodScheduled"]
            if current and current[0].get("message") == message:
                return
            status = jcopy(pod.get("status") or {})
            status["conditions"] = [condition]
            self._write_status("", "pods", pod, status, "kube-scheduler")
            return
        best = min(fits, key=lambda n: (self._allocated_fraction(n), n["metadata"]["name"]))
        return self._bind(pod, best)

    def _bind(self, pod: dict, best: dict) -> None:
        self.store.bind(self._rt("", "pods"), pod["metadata"]["namespace"], pod["metadata"]["name"],
                        best["metadata"]["name"])

    def _node_usage(self, node_name: str) -> dict[str, float]:
        used: dict[str, float] = {"pods": 0}
        for pod in self._bucket("", "pods").values():
            if pod["spec"].get("nodeName") == node_name and pod.get("status", {}).get("phase") not in (
                    "Succeeded", "Failed"):
                used["pods"] += 1
                for name, amount in pod_requests(pod["spec"]).items():
                    used[name] = used.get(name, 0) + amount
        return used

    def _unfit(self, node: dict, pod: dict, requests: dict[str, float]) -> str:
        spec = pod["spec"]
        if node.get("spec", {}).get("unschedulable"):
            return "node(s) were unschedulable"
        if not node_matches_pod(node, spec):
            return "node(s) didn't match Pod's node affinity/selector"
        taints = untolerated_taints(node, spec.get("tolerations") or [])
        if taints:
            taint = taints[0]
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"node(s) had untolerated taint {{{taint['key']}{value}}}"
        allocatable = node.get("status", {}).get("allocatable") or {}
        used = self._node_usage(node["metadata"]["name"])
        if used["pods"] + 1 > parse_quantity(allocatable.get("pods", "110")):
            return "Too many pods"
        for name, amount in requests.items():
            have = parse_quantity(allocatable.get(name, "0"))
            if not have and amount and (devices := self._dra_devices(node["metadata"]["name"], name)) is not None:
                have = devices  # KEP-5004: a DeviceClass serves the extended resource from the node's ResourceSlices
            if amount and used.get(name, 0) + amount > have:
                return f"Insufficient {name}"
        if spec.get("resourceClaims") and not self._dra_devices(node["metadata"]["name"]):
            return "cannot allocate all claims"
        return ""

    def _dra_devices(self, node_name: str, extended_resource: str | None = None) -> int | None:
        """Devices the node's ResourceSlices publish: for `extended_resource`, those of the drivers a DeviceClass
        mapping that name selects (None: no class maps it); else all of them. Like the real scheduler's count, not
        its allocator: which device a claim gets is not modelled here (tests/test_dra_scheduling.py has the real one)."""
        drivers = None
        if extended_resource is not None:
            classes = [c for c in self._bucket("resource.k8s.io", "deviceclasses").values()
                       if (c.get("spec") or {}).get("extendedResourceName") == extended_resource]
            if not classes:
                return None
            text = json.dumps([c.get("spec", {}).get("selectors") for c in classes])
            drivers = {s["spec"].get("driver") for s in self._bucket("resource.k8s.io", "resourceslices").values()
                       if s["spec"].get("driver") and s["spec"]["driver"] in text}
        return sum(len(s["spec"].get("devices") or []) for s in self._bucket("resource.k8s.io", "resourceslices").values()
                   if s["spec"].get("nodeName") == node_name and (drivers is None or s["spec"].get("driver") in drivers))

    def _allocated_fraction(self, node: dict) -> float:
        allocatable = node.get("status", {}).get("allocatable") or {}
        used = self._node_usage(node["metadata"]["name"])
        fractions = [used.get(r, 0) / parse_quantity(allocatable[r]) for r in ("cpu", "memory")
                     if allocatable.get(r) and parse_quantity(allocatable[r])]
        return sum(fractions) / len(fractions) if fractions else 0.0

    # --- kubelet --------------------------------------------------------------------------------------------------------
    def _pod(self, pod: dict) -> None:
        node_name = pod["spec"].get("nodeName")
        phase = pod.get("status", {}).get("phase", "Pending")
        if not node_name or phase != "Pending" or pod["metadata"].get("deletionTimestamp"):
            return
        started = pod.get("status", {}).get("startTime")
        if self.ready_delay and not started:
            status = jcopy(pod.get("status") or {})
            status["startTime"] = now()
            self._write_status("", "pods", pod, status, "kubelet")
            self._enqueue(("", "pods", pod["metadata"]["namespace"], pod["metadata"]["name"]), self.ready_delay)
            return
        if self.ready_delay and started and time.time() - _epoch(started) < self.ready_delay:
            self._enqueue(("", "pods", pod["metadata"]["namespace"], pod["metadata"]["name"]), 0.05)
            return
        if self.kubelet_sim is not None and self.kubelet_sim.handle(pod, node_name):
            return
        self._run_pod(pod, node_name)

    def _run_pod(self, pod: dict, node_name: str) -> None:
        behaviour = {**default_pod_behaviour(pod), **(self.pod_behaviour(pod) or {})}
        node = self._bucket("", "nodes").get(("", node_name), {})
        host_ip = next((a["address"] for a in node.get("status", {}).get("addresses") or []
                        if a.get("type") == "InternalIP"), "10.0.0.1")
        stamp = now()
        phase = behaviour["phase"]
        ready = "True" if behaviour["ready"] and phase == "Running" else "False"
        pod_ip = host_ip if pod["spec"].get("hostNetwork") else self.store.allocator.pod_ip()
        status = {
            "phase": phase, "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
            "startTime": pod.get("status", {}).get("startTime") or stamp, "qosClass": pod["status"].get("qosClass",
                                                                                                        "BestEffort"),
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastProbeTime": None,
                 "lastTransitionTime": stamp},
                {"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp},
                {"type": "Ready", "status": ready, "lastProbeTime": None, "lastTransitionTime": stamp},
                {"type": "ContainersReady", "status": ready, "lastProbeTime": None, "lastTransitionTime": stamp},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp}],
            "containerStatuses": [self._container_status(c, behaviour, stamp) for c in pod["spec"]["containers"]]}
        if pod["spec"].get("initContainers"):
            init_phase = "Pending" if phase == "Pending" else "Succeeded"
            status["initContainerStatuses"] = [self._container_status(c, {**behaviour, "phase": init_phase}, stamp)
                                               for c in pod["spec"]["initContainers"]]
        if ready == "False" and phase in ("Succeeded", "Failed"):
            for condition in status["conditions"][2:4]:
                condition["reason"] = "PodCompleted"
        for container in pod["spec"]["containers"]:
            self.store.pod_logs[(pod["metadata"]["namespace"], pod["metadata"]["name"], container["name"])] = \
                behaviour.get("log", "")
        self._write_status("", "pods", pod, status, "kubelet")

    @staticmethod
    def _container_status(container: dict, behaviour: dict, stamp: str) -> dict:
        phase = behaviour["phase"]
        if phase == "Pending":
            state = {"waiting": {"reason": behaviour.get("reason", "ContainerCreating")}}
        elif phase == "Running":
            state = {"running": {"startedAt": stamp}}
        else:
            code = behaviour.get("exit_code", 0 if phase == "Succeeded" else 1)
            state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                    "startedAt": stamp, "finishedAt": stamp,
                                    "containerID": f"containerd://{abs(hash(container['name'] + stamp)):064x}"[:77]}}
        image = container.get("image", "")
        return {"name": container["name"], "image": image, "imageID": f"{image}@sha256:{'0' * 64}",
                "containerID": f"containerd://{abs(hash(container['name'] + stamp)):064x}"[:77],
                "ready": phase == "Running" and behaviour["ready"], "restartCount": 0,
                "started": phase == "Running", "state": state}


def pod_is_ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions") or [])


def pod_target_node(pod: dict) -> str:
    if pod["spec"].get("nodeName"):
        return pod["spec"]["nodeName"]
    terms = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("values"):
                return field["values"][0]
    return ""


def _epoch(stamp: str) -> float:
    from .util import parse_time
    return parse_time(stamp).timestamp()
