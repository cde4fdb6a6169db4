"""The rule catalogue behind security/rbac.py: the vocabulary of needs, what the pipeline around the steps makes,
and the charts' own objects. rbac.py assembles the roles from it. Each step's own needs are part of its
declaration (`needs=` in steps/<step>.py, built from the helpers here), handed to rbac.py by the caller.

A need says which API requests are made, by phase:
  READ   what check/doctor read (every pipeline command),
  WRITE  the changes its plan makes: `up --dry-run` sends the same requests with dryRun=All, which the API server
         authorizes exactly like real ones (server-side apply of a new object needs `create` as well as `patch`),
  RUN    what only a real `up` adds: verify's reads, helm's install (watches, hooks, its release Secrets),
         removals of leftovers,
  DOCTOR what only doctor adds (its probes).
It was derived by recording the requests each command makes on the test emulator, and the tests keep it honest:
`up --dry-run`, `doctor` and `status` run on the emulator as a token bound to their generated roles (the emulator
enforces RBAC) and succeed with no request refused, and fail with a 403 naming the rule when one is removed
(tests/test_rbac.py); every request of whole `up` runs (helm's included) and of doctor on a running stack is checked
against the generated `up` and `doctor` roles (tests/test_monitoring_emulator.py, tests/test_gpu_operator_emulator.py);
each role is attacked on the real API server (tests/live/test_attacks.py). Namespaced needs become Roles in their
namespace; needs that span namespaces (lists across the cluster, cluster-scoped objects) go into the ClusterRole. No
rule uses `*`. Each rule says which steps and checks need it (`Need.why`, printed as a comment above the rule).

The charts' own objects (kube-prometheus-stack, gpu-operator) are listed by kind in CHART_KINDS, from the charts the
version catalogue picks (a test renders the local charts and checks every kind is there).
"""
from __future__ import annotations

from dataclasses import dataclass

READ, WRITE, RUN, DOCTOR = "read", "write", "run", "doctor"
CLUSTER = None  # a need's scope: cluster-wide (ClusterRole); else the key of a namespace in `namespaces()`
APPLY = ("get", "patch", "create")  # server-side apply: patch, plus create when the object is new
HELM = ("get", "list", "watch", "create", "update", "patch", "delete")  # helm install/upgrade --wait, hooks


@dataclass(frozen=True)
class Need:
    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    scope: str | None = CLUSTER  # None: every namespace / cluster-scoped; else a key of namespaces(config)
    names: tuple[str, ...] = ()  # resourceNames: only these objects (bind, escalate, a Service's proxy)
    why: str = ""  # which step or check needs it (filled in by needs() from where it came from, when not given)


def need(group: str, resources: str, verbs: tuple[str, ...] | str, scope: str | None = CLUSTER,
         names=(), why: str = "") -> Need:
    return Need(group, tuple(resources.split()), tuple(verbs.split()) if isinstance(verbs, str) else verbs, scope,
                tuple(sorted(names)), why)


# The charts' objects: (group, resource, namespaced?) of every kind they render (and their CRDs).
CHART_KINDS = {
    "gpu-operator": [("", "configmaps", True), ("", "serviceaccounts", True), ("apps", "daemonsets", True),
                     ("apps", "deployments", True), ("batch", "jobs", True), ("nvidia.com", "clusterpolicies", False),
                     ("rbac.authorization.k8s.io", "clusterroles", False),
                     ("rbac.authorization.k8s.io", "clusterrolebindings", False),
                     ("rbac.authorization.k8s.io", "roles", True), ("rbac.authorization.k8s.io", "rolebindings", True),
                     ("apiextensions.k8s.io", "customresourcedefinitions", False)],
    # NVIDIA's DRA driver (gpu_operator.allocation: dra), with ComputeDomains' controller and CRDs when turned on
    "dra-driver": [("", "serviceaccounts", True), ("apps", "daemonsets", True), ("apps", "deployments", True),
                   ("resource.k8s.io", "deviceclasses", False),
                   ("admissionregistration.k8s.io", "validatingadmissionpolicies", False),
                   ("admissionregistration.k8s.io", "validatingadmissionpolicybindings", False),
                   ("rbac.authorization.k8s.io", "clusterroles", False),
                   ("rbac.authorization.k8s.io", "clusterrolebindings", False),
                   ("rbac.authorization.k8s.io", "roles", True), ("rbac.authorization.k8s.io", "rolebindings", True),
                   ("apiextensions.k8s.io", "customresourcedefinitions", False)],
    "monitoring": [("", "configmaps", True), ("", "secrets", True), ("", "services", True),
                   ("", "serviceaccounts", True), ("apps", "daemonsets", True), ("apps", "deployments", True),
                   ("batch", "jobs", True), ("monitoring.coreos.com", "alertmanagers", True),
                   ("monitoring.coreos.com", "prometheuses", True), ("monitoring.coreos.com", "prometheusrules", True),
                   ("monitoring.coreos.com", "servicemonitors", True),
                   ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", False),
                   ("admissionregistration.k8s.io", "validatingwebhookconfigurations", False),
                   ("rbac.authorization.k8s.io", "clusterroles", False),
                   ("rbac.authorization.k8s.io", "clusterrolebindings", False),
                   ("rbac.authorization.k8s.io", "roles", True), ("rbac.authorization.k8s.io", "rolebindings", True),
                   ("apiextensions.k8s.io", "customresourcedefinitions", False)],
}


def _fullname(release: str, name: str, limit: int = 63) -> str:
    """helm's usual fullname: the release name when it contains the chart's name, else release-name; cut to
    `limit` characters, no trailing '-'."""
    full = release if name in release else f"{release}-{name}"
    return full[:limit].rstrip("-")


def chart_roles(step: str, release: str) -> tuple[set[str], set[str]]:
    """(ClusterRoles, Roles in the release's namespace) the chart creates and binds, by the chart's own naming rules;
    tests/test_rbac.py renders the catalogue's charts with our values and several release names and compares."""
    if step == "gpu-operator":
        nfd = _fullname(release, "node-feature-discovery")
        return ({"gpu-operator", "gpu-operator-upgrade-crd-hook-role", nfd, f"{nfd}-gc", f"{nfd}-prune"},
                {"gpu-operator", f"{nfd}-worker"})
    if step == "dra-driver":  # the chart names its roles after itself, whatever the release
        chart = "dra-driver-nvidia-gpu"
        return ({"compute-domain-daemon-role", f"{chart}-clusterrole-controller", f"{chart}-clusterrole-kubeletplugin"},
                {f"{chart}-role-controller", f"{chart}-role-kubeletplugin"})
    if step == "monitoring":
        stack = _fullname(release, "kube-prometheus-stack", 26)  # the chart cuts its fullname to 26
        return ({f"{stack}-operator", f"{stack}-prometheus", f"{stack}-admission",
                 f"{_fullname(release, 'grafana')}-clusterrole", _fullname(release, "kube-state-metrics")},
                {f"{stack}-admission"})
    raise ValueError(step)


def chart_rbac_needs(step: str, release: str, scope: str) -> list[Need]:
    """Creating the chart's roles and bindings: RBAC lets a user create a role only with every permission in it, or
    `escalate` on it, and bind one only with them, or `bind` on it. Both by name, never all roles."""
    cluster_roles, roles = chart_roles(step, release)
    return [need("rbac.authorization.k8s.io", "clusterroles", "bind escalate", CLUSTER, cluster_roles),
            need("rbac.authorization.k8s.io", "roles", "bind escalate", scope, roles)]


# Objects a chart puts in another namespace: kube-prometheus-stack's Services for scraping the control plane.
CHART_ELSEWHERE = {"monitoring": [("", "services", "kube-system")]}


def chart_needs(step: str, scope: str, verbs: tuple[str, ...]) -> list[Need]:
    """The chart's objects, plus its release records (helm keeps them as Secrets in the release's namespace)."""
    out = [Need(group, (resource,), verbs, scope if namespaced else CLUSTER)
           for group, resource, namespaced in CHART_KINDS[step]]
    out += [Need(group, (resource,), verbs, where) for group, resource, where in CHART_ELSEWHERE.get(step, [])]
    if verbs == HELM:  # helm --wait follows a Deployment through its ReplicaSets and pods
        out += [need("apps", "replicasets", "get list watch", scope), need("", "pods", "get list watch", scope)]
    return out + [need("", "secrets", ("get", "list") if verbs == APPLY else verbs, scope)]


def pipeline_needs() -> dict[str, list[Need]]:
    """Every pipeline command (up, up --dry-run, doctor): the state record, the lock, the nodes."""
    return {
        READ: [need("", "configmaps", "get", "state", why="the pipeline: its state record (what ran, with which "
                                                            "inputs)"),
               need("", "nodes", "get list", why="the pipeline: the configured GPU nodes exist"),
               need("", "namespaces", "get", why="the pipeline: whether each namespace exists and is ours"),
               need("", "secrets", "get", "state", why="the pipeline: the key of the state record's fingerprints "
                                                        "(the plan role goes without: its plan says unknown)")],
        RUN: [need("", "namespaces", "create patch", why="the pipeline: create and label our namespaces"),
              need("", "configmaps", "create patch", "state", why="the pipeline: write its state record"),
              need("coordination.k8s.io", "leases", "get create update", "state", why="the pipeline: its run lock"),
              need("", "secrets", "get create", "state", why="the pipeline: the fingerprints' key (made once)")],
        DOCTOR: [need("authorization.k8s.io", "selfsubjectaccessreviews", "create",
                      why="doctor: which of up's permissions this identity lacks")],
    }


# Shared by the two admission steps: the kinds they manage, the scheduler they steer to, the dry runs they probe with.
ADMISSION_KINDS = ("mutatingwebhookconfigurations validatingwebhookconfigurations validatingadmissionpolicies "
                   "validatingadmissionpolicybindings")


def steering_needs() -> list[Need]:
    """admission steers GPU pods only to a scheduler that runs: its Deployment, its pods and its Lease."""
    return [need("apps", "deployments", "get", "scheduler", why="admission: does the bin-packing scheduler run?"),
            need("", "pods", "list", "scheduler", why="admission: does the bin-packing scheduler run?"),
            need("coordination.k8s.io", "leases", "get", "scheduler",
                 why="admission: does the bin-packing scheduler hold its Lease?")]


def admission_probes() -> list[Need]:
    return [need("", "pods", "create", where, why="admission: server-side dry runs of a GPU pod (is it steered? "
                                                   "never stored)") for where in ("probe-default", "state")]


def probes_through_the_cluster(config) -> bool:
    """Does preflight read the nodes through the in-cluster probe (preflight.via cluster, or auto without an SSH
    route)?"""
    via = config.preflight.via
    if via == "auto":
        via = "ssh" if "ssh" in config.model_fields_set or any(n.address for n in config.nodes) else "cluster"
    return via == "cluster"


def cluster_probe_needs() -> list[Need]:
    """preflight through the cluster: a namespace per run (its name is made per run, so the rules are cluster-wide;
    the probe identity's policy holds it to the probe's own namespaces), the script's ConfigMap and one probe pod per
    node in it, read back with one pod list and a watch from it, removed with the namespace; leftovers of killed
    runs are found by label."""
    why = "preflight through the cluster: the node probe's own namespace, its script and its pods"
    return [need("", "namespaces", "get list create delete", why=why), need("", "configmaps", "create", why=why),
            need("", "pods", "create", why=why),
            need("", "pods", "list watch", why="preflight through the cluster: the probe pods' results"),
            need("", "nodes", "list", why="preflight through the cluster: why a node's probe did not finish")]


@dataclass(frozen=True)
class PrometheusService:
    """The Service `status` queries through the API server's proxy, as the proxy's URL names it."""
    namespace: str
    service: str
    port: str

    @property
    def proxy_name(self) -> str:
        """The name RBAC checks a proxy request against: `<service>:<port>` (the URL's name segment)."""
        return f"{self.service}:{self.port}"


def prometheus_service(config, given: str | None = None) -> PrometheusService:
    """--prometheus NAMESPACE/SERVICE[:PORT], else the one the monitoring step installs (its chart names the Service
    `<fullname>-prometheus`, port `http-web`), else (attach) the Prometheus Operator's `prometheus-operated` Service
    in front of the configured Prometheus."""
    if given:
        namespace, _, rest = given.partition("/")
        service, _, port = rest.partition(":")
        return PrometheusService(namespace, service, port or "9090")
    section = config.monitoring if config is not None else None
    if section is not None and section.mode == "attach" and section.prometheus:
        return PrometheusService(section.prometheus.partition("/")[0], "prometheus-operated", "web")
    namespace = section.namespace if section is not None else "monitoring"
    release = section.release if section is not None else "kube-prometheus-stack"
    return PrometheusService(namespace, f"{_fullname(release, 'kube-prometheus-stack', 26)}-prometheus", "http-web")


def status_needs(prometheus: PrometheusService, scheduler: str = "gpu-binpack-scheduler") -> list[Need]:
    """`status`: nodes, pods, FailedScheduling events, Services (to find Prometheus), and the proxy to the one
    Prometheus Service only, in its namespace: a proxy to any Service would reach around NetworkPolicy. `scheduler`:
    the bin-packing scheduler's name, whose config (one ConfigMap, by name) says which share of nodes it scores."""
    return [need("", "nodes pods events services", "list", why="status: GPUs per node, namespace and pod; why pods "
                                                               "wait; where Prometheus is"),
            need("resource.k8s.io", "resourceslices resourceclaims", "list",
                 why="status: GPUs served through DRA (NVIDIA's driver's ResourceSlices) and the claims that hold them"),
            need("kueue.x-k8s.io", "clusterqueues localqueues workloads", "list",
                 why="status: each team's GPU quota, use and waiting workloads (the queues step's Kueue)"),
            need("karpenter.sh", "nodepools", "list",
                 why="status: which Karpenter NodePool can launch a node for each pending GPU pod, and why not"),
            need("", "configmaps", "get", "scheduler", (f"{scheduler}-config",),
                 why="status: whether the bin-packing scheduler scores every node of a cluster that has outgrown it"),
            need("", "services/proxy", "get", "prometheus", (prometheus.proxy_name,),
                 why=f"status: GPU utilisation from Prometheus ({prometheus.namespace}/{prometheus.proxy_name}) "
                     f"through the API server's proxy, this Service only")]
