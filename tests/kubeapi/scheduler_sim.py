"""A stand-in for kube-scheduler containers run by a Deployment, for the emulator.

No scheduler binary can run here, so when a Deployment's pods run an image named kube-scheduler and are ready, this
does what the real one does from the same inputs: it reads the KubeSchedulerConfiguration from the ConfigMap the
pod mounts at its --config path, takes the leader election lease named there (identity "<pod>_<uuid>", renewed
every few seconds while a replica is ready) and serves every profile's schedulerName through the emulator's
scheduler. When no replica is ready any more, those scheduler names stop being served and the lease goes stale.
"""
from __future__ import annotations

import posixpath
import uuid

import yaml

from .controllers import pod_is_ready
from .util import jcopy, now

TICK = ("@scheduler-sim", "", "", "")
RENEW_EVERY = 2.0


class SchedulerSim:
    def __init__(self, manager):
        self.manager = manager
        self.store = manager.store
        self.served: dict[tuple, set[str]] = {}  # Deployment (namespace, name) -> scheduler names it serves
        self.identity: dict[str, str] = {}  # pod name -> its leader election identity

    def wants(self, key: tuple) -> bool:
        return key == TICK or (key[0], key[1]) in {("apps", "deployments"), ("", "pods"), ("", "configmaps")}

    def reconcile(self) -> None:
        seen = set()
        for (namespace, name), deploy in list(self.store.objects.get(("apps", "deployments"), {}).items()):
            container = self._scheduler_container(deploy)
            if container is None:
                continue
            seen.add((namespace, name))
            ready = self._ready_pods(deploy)
            config = self._config(deploy, container) if ready else None
            self._serve((namespace, name), self._profiles(config) if config else set())
            if config:
                self._lead(config, namespace, ready)
        for key in set(self.served) - seen:
            self._serve(key, set())
        if any(self.served.values()):
            self.manager._enqueue(TICK, RENEW_EVERY)

    # --- pieces -----------------------------------------------------------------------------------------------------
    @staticmethod
    def _scheduler_container(deploy: dict) -> dict | None:
        for container in deploy["spec"]["template"]["spec"].get("containers") or []:
            if "kube-scheduler" in container.get("image", "").rsplit("/", 1)[-1]:
                return container
        return None

    def _ready_pods(self, deploy: dict) -> list[dict]:
        selector = deploy["spec"].get("selector", {}).get("matchLabels") or {}
        pods = []
        for (namespace, _name), pod in sorted(self.store.objects.get(("", "pods"), {}).items()):
            labels = pod["metadata"].get("labels") or {}
            if namespace != deploy["metadata"]["namespace"] or pod["metadata"].get("deletionTimestamp"):
                continue
            if all(labels.get(k) == v for k, v in selector.items()) and pod_is_ready(pod):
                pods.append(pod)
        return pods

    def _config(self, deploy: dict, container: dict) -> dict | None:
        """The file named by --config, read from the ConfigMap volume mounted over its directory."""
        args = (container.get("command") or []) + (container.get("args") or [])
        path = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
        if path is None:
            return None
        for mount in container.get("volumeMounts") or []:
            if posixpath.dirname(path) != mount["mountPath"].rstrip("/"):
                continue
            volume = next((v for v in deploy["spec"]["template"]["spec"].get("volumes") or []
                           if v["name"] == mount["name"]), None)
            source = (volume or {}).get("configMap")
            if not source:
                return None
            cm = self.store.objects.get(("", "configmaps"), {}).get((deploy["metadata"]["namespace"], source["name"]))
            text = ((cm or {}).get("data") or {}).get(posixpath.basename(path))
            return yaml.safe_load(text) if text else None
        return None

    @staticmethod
    def _profiles(config: dict) -> set[str]:
        return {p.get("schedulerName", "default-scheduler") for p in config.get("profiles") or [{}]}

    def _serve(self, key: tuple, names: set[str]) -> None:
        for name in self.served.get(key, set()) - names:
            self.manager.unregister_scheduler(name)
        for name in names - self.served.get(key, set()):
            self.manager.register_scheduler(name)
        self.served[key] = names

    def _lead(self, config: dict, namespace: str, ready: list[dict]) -> None:
        election = config.get("leaderElection") or {}
        if not election.get("leaderElect", True):
            return
        lease_name = election.get("resourceName", "kube-scheduler")
        lease_namespace = election.get("resourceNamespace", "kube-system")
        leases = self.store.objects.get(("coordination.k8s.io", "leases"), {})
        lease = leases.get((lease_namespace, lease_name))
        names = [p["metadata"]["name"] for p in ready]
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity", "")
        leader = holder.split("_", 1)[0] if holder.split("_", 1)[0] in names else names[0]
        identity = self.identity.setdefault(leader, f"{leader}_{uuid.uuid4()}")
        stamp = now().replace("Z", ".000000Z")
        if lease is None:
            self.manager._create("coordination.k8s.io", "leases", lease_namespace, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": lease_name, "namespace": lease_namespace},
                "spec": {"holderIdentity": identity, "leaseDurationSeconds": 15, "acquireTime": stamp,
                         "renewTime": stamp, "leaseTransitions": 0}}, "kube-scheduler")
            return
        if holder == identity and lease["spec"].get("renewTime", "")[:19] == stamp[:19]:
            return
        body = jcopy(lease)
        spec = body.setdefault("spec", {})
        if holder != identity:
            spec.update(holderIdentity=identity, acquireTime=stamp,
                        leaseTransitions=(spec.get("leaseTransitions") or 0) + 1)
        spec.update(renewTime=stamp, leaseDurationSeconds=15)
        self.manager._update("coordination.k8s.io", "leases", body, "kube-scheduler")
