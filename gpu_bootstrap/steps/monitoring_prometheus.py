"""Asking the Prometheus behind the monitoring step through the API server's service proxy: is the stack ready, is
the DCGM exporter scraped on every GPU node, do its series name the pods, and, when the proxy route itself is blocked
(a private control plane), what was verified and how to check the rest by hand."""
from __future__ import annotations

from dataclasses import dataclass

from gpu_bootstrap.core.errors import ClusterError, Unreachable
from gpu_bootstrap.core.objects import pod_ready
from gpu_bootstrap.pipeline.step import PASS, WARN, Check
from gpu_bootstrap.render import monitoring as render

PROMETHEUS_CRD = "prometheuses.monitoring.coreos.com"
MONITORING_API = "monitoring.coreos.com/v1"
DCGM_SERVICE = "nvidia-dcgm-exporter"


def crd_exists(ctx, name: str) -> bool:
    return ctx.kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name) is not None


ROUTE_FAILURES = {403, 502, 503, 504}  # the proxy refused, or could not reach or wait for the pod
ROUTE_CONFIRMATIONS = 3  # verify accepts a blocked route after this many answers in a row (2 s apart)


@dataclass(frozen=True)
class RouteBlocked:
    verified: str  # what was verified
    warning: str  # what could not be, and how to check it


def _ready_endpoints(ctx, namespace: str, service: str) -> bool:
    slices = ctx.kube.list("discovery.k8s.io/v1", "EndpointSlice", namespace,
                           label_selector=f"kubernetes.io/service-name={service}")
    return any((e.get("conditions") or {}).get("ready") is not False
               for found in slices for e in found.get("endpoints") or [])


def _service_port(ctx, namespace: str, service: str, port: str) -> str:
    """The number of the Service port the proxy was asked for by name (for kubectl port-forward)."""
    found = ctx.kube.get("v1", "Service", service, namespace) or {}
    ports = (found.get("spec") or {}).get("ports") or []
    chosen = next((p for p in ports if port in (p.get("name"), str(p.get("port")))), ports[0] if ports else {})
    return str(chosen.get("port", 9090))


def workload_problems(ctx) -> list[str]:
    section = ctx.config.monitoring
    problems = []
    for kind in ("Deployment", "DaemonSet", "StatefulSet"):
        for obj in ctx.kube.list("apps/v1", kind, section.namespace):
            labels = obj["metadata"].get("labels") or {}
            if section.release not in (labels.get("release"), labels.get("app.kubernetes.io/instance")):
                continue
            status = obj.get("status") or {}
            if kind == "DaemonSet":
                ready = status.get("numberReady", 0) >= status.get("desiredNumberScheduled", 0)
            else:
                ready = status.get("readyReplicas", 0) >= (obj.get("spec") or {}).get("replicas", 1)
            if not ready:
                problems.append(f"{kind} {section.namespace}/{obj['metadata']['name']} is not ready")
    return problems

def prometheus_proxy(ctx, target: render.Target) -> str | tuple[str, str, str]:
    """(namespace, service, port) of the Service in front of the Prometheus, or why there is none yet."""
    section = ctx.config.monitoring
    if target.mode == "install":
        found = [p for p in ctx.kube.list(MONITORING_API, "Prometheus", section.namespace)
                 if (p["metadata"].get("labels") or {}).get("release") == section.release] \
            if crd_exists(ctx, PROMETHEUS_CRD) else []
        if not found:
            return f"the chart's Prometheus object in {section.namespace} does not exist yet"
        namespace, name = section.namespace, found[0]["metadata"]["name"]
    else:
        namespace, _, name = target.prometheus.partition("/")
    services = ctx.kube.list("v1", "Service", namespace)
    chosen = next((s for s in services if ((s.get("spec") or {}).get("selector") or {}).get(
        "operator.prometheus.io/name") == name), None) or \
        next((s for s in services if s["metadata"]["name"] == "prometheus-operated"), None)
    if chosen is None:
        return f"no Service in {namespace} selects the pods of Prometheus {name} yet"
    ports = (chosen.get("spec") or {}).get("ports") or []
    port = next((p for p in ports if p.get("name") in ("http-web", "web")), ports[0] if ports else {})
    return namespace, chosen["metadata"]["name"], str(port.get("name") or port.get("port") or 9090)

def route_blocked(ctx, target: render.Target, proxy, error: ClusterError) -> RouteBlocked | None:
    """When the service-proxy route itself fails (refused, timed out, forbidden: a private control plane, a
    firewall, RBAC) although Prometheus runs (its Service has ready endpoints, the stack's workloads are
    ready), what was verified and what could not be, with how to check it by hand. None: Prometheus may just
    not be up yet (no ready endpoint, or the proxy's own 'no endpoints available')."""
    if not isinstance(proxy, tuple) or "no endpoints available" in error.message:
        return None
    if not (isinstance(error, Unreachable) or error.status in ROUTE_FAILURES):
        return None
    namespace, service, port = proxy
    try:
        if not _ready_endpoints(ctx, namespace, service):
            return None
        number = _service_port(ctx, namespace, service, port)
    except ClusterError:  # the API itself does not answer now: verify asks again
        return None
    return RouteBlocked(
        f"{target.mode} mode ({target.prometheus}): Prometheus runs (Service {namespace}/{service} has ready "
        f"endpoints); dashboards and alerts in place",
        f"Prometheus cannot be reached through the API server's service proxy ({error.message}; a private "
        f"control plane or a firewall blocks this route), so whether it scrapes the DCGM exporter on every GPU "
        f"node was not checked — check it by hand: kubectl -n {namespace} port-forward svc/{service} "
        f"9090:{number}, then open http://localhost:9090/targets (job {render.DCGM_JOB})")

def query(ctx, proxy: tuple[str, str, str], promql: str) -> list[dict]:
    namespace, service, port = proxy
    path = f"/api/v1/namespaces/{namespace}/services/{service}:{port}/proxy/api/v1/query"
    # One attempt: verify's own loop asks again, and a route that is refused must not be retried for a minute
    answer = ctx.kube.request("GET", path, {"query": promql}, idempotent=False)
    if answer.get("status") != "success":
        raise ClusterError(f"Prometheus refused the query {promql}: {answer.get('error', answer)}")
    return (answer.get("data") or {}).get("result") or []

def missing_targets(ctx, up: list[dict]) -> list[str]:
    healthy = {r["metric"].get("node") for r in up if r.get("value", [0, "0"])[1] == "1"}
    return [n.name for n in ctx.config.nodes if n.name not in healthy]

def scrape_report(ctx, target: render.Target) -> Check:
    """Missing DCGM targets, and DCGM series without namespace/pod labels while GPU pods run."""
    proxy = None
    try:
        proxy = prometheus_proxy(ctx, target)
        if isinstance(proxy, str):
            return Check(WARN, proxy)
        up = query(ctx, proxy, f'up{{job="{render.DCGM_JOB}"}}')
        missing = missing_targets(ctx, up)
        problems = [f"no healthy DCGM exporter target for {', '.join(missing)} (is the ServiceMonitor "
                    f"{ctx.config.gpu_operator.namespace}/{DCGM_SERVICE} there and labelled "
                    f"{render._labels_text(target.service_monitor_labels)}?)"] if missing else []
        running = gpu_pods(ctx)
        if running:
            with_pod = query(ctx, proxy, 'count(DCGM_FI_DEV_GPU_UTIL{pod!=""})')
            if not with_pod:
                exported = query(ctx, proxy, 'count(DCGM_FI_DEV_GPU_UTIL{exported_pod!=""})')
                problems.append(
                    f"{len(running)} GPU pod(s) run ({', '.join(running[:3])}) but no DCGM series has a pod "
                    "label" + (": they arrive as exported_pod/exported_namespace, so the ServiceMonitor has "
                               "honorLabels: false (gpu-bootstrap sets true: rerun up)" if exported else
                               ": the exporter does not map GPUs to pods (is DCGM_EXPORTER_KUBERNETES on and the "
                               "kubelet's pod-resources socket mounted?)"))
    except ClusterError as error:
        where = f" (check it by hand: kubectl -n {proxy[0]} port-forward svc/{proxy[1]} 9090:" \
                f"{_service_port(ctx, proxy[0], proxy[1], proxy[2])}, then http://localhost:9090/targets)" \
            if isinstance(proxy, tuple) else ""
        return Check(WARN, f"Prometheus could not be queried through the API server's service proxy: "
                           f"{error.message}{where}")
    if problems:
        return Check(WARN, "; ".join(problems))
    return Check(PASS, f"DCGM exporter scraped on every GPU node ({len(ctx.config.nodes)})" +
                 (f"; series carry namespace/pod for the {len(running)} running GPU pod(s)" if running else ""))

def gpu_pods(ctx) -> list[str]:
    """Running pods that hold GPUs: by their resources, and with allocation: dra also by a ResourceClaim (as
    admission takes them: render/admission_policy.py)."""
    claims = ctx.config.gpu_operator.allocation == "dra"
    out = []
    for pod in ctx.kube.list("v1", "Pod", field_selector="status.phase=Running"):
        containers = (pod.get("spec") or {}).get("containers") or []
        wants = any(str(name).startswith(("nvidia.com/gpu", "nvidia.com/mig-"))
                    for c in containers for name in ((c.get("resources") or {}).get("limits") or {}))
        wants = wants or (claims and bool((pod.get("spec") or {}).get("resourceClaims")))
        if wants and pod_ready(pod):
            out.append(f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}")
    return out
