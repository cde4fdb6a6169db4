"""GPU pods that scale on GPU utilization: a HorizontalPodAutoscaler made by the real KEDA (v2.21.0, its operator and
metrics adapter: scripts/gomod/keda, tests/localcluster/keda.py) from a ScaledObject whose `prometheus` trigger reads
DCGM_FI_DEV_GPU_UTIL from the Prometheus that gpu-bootstrap's monitoring step installed, on the real API server,
with the real kube-controller-manager's HPA controller doing the scaling and the real schedulers placing the pods.

`gpu-bootstrap up` runs node-prep, monitoring (kube-prometheus-stack from ../shared/charts, the real Prometheus
Operator and Prometheus), gpu-operator (the real controller of the 25.3 line: its DCGM exporter DaemonSet and
ServiceMonitor, with the monitoring step's relabelling), the bin-packing scheduler and admission. Then, as a user
would: a Deployment of one replica asking for one GPU (no toleration, no scheduler name: admission steers it), and a
ScaledObject: the average over the Deployment's pods of namespace_pod:dcgm_gpu_utilization:avg, the monitoring step's
recording rule over DCGM_FI_DEV_GPU_UTIL (by the namespace and pod labels the exporter gives each GPU a pod holds,
which the ServiceMonitor's honorLabels keeps; evaluated by the real Prometheus from our PrometheusRule), against 50,
as `metricType: Value` (the HPA scales replicas by value / target, as for CPU utilization), 1 to 3 replicas, with
the HPA's stabilization windows shortened through advanced.horizontalPodAutoscalerConfig.behavior.

* utilization 90 -> the HPA scales the Deployment to 3; the new pods are GPU pods, steered and bound to GPU nodes;
* utilization 10 -> it scales back to 1.

What stands in, and what differs from a real cluster:
* the DCGM exporter is tests/localcluster/standins.py's: a pod's GPUs report the utilization the test writes
  (standins.set_gpu_load), and which GPU a pod holds is decided there, not by a kubelet's device manager;
* KEDA runs out of cluster with the admin's credentials (keda.py). It has no cluster DNS and nothing here routes
  ClusterIPs, so the trigger's serverAddress is the Prometheus pod's address (the Service's endpoint, reachable from
  this machine) instead of http://kube-prometheus-stack-prometheus.monitoring.svc:9090, which a ScaledObject on a
  real cluster names;
* the HPA controller syncs every 5 s (cluster.HPA_SYNC; 15 s by default) and Prometheus scrapes the exporter every
  5 s (monitoring.scrape_interval), so the test waits seconds rather than minutes;
* the pods are KWOK's: Running as soon as they are bound, nothing runs in them.
"""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import pytest

from tests.localcluster import cluster as local
from tests.localcluster.cluster import binaries, require
from tests.localcluster.standins import set_gpu_load
from tests.realfaults import UpRun, wait_for

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.xdist_group("pod-autoscaling-real")]
GPU_NODES = ["gpu-1", "gpu-2"]
STEPS = "node-prep,monitoring,gpu-operator,binpack-scheduler,admission-opa,admission"
RUN_TIMEOUT = 600
SCHEDULER = "gpu-binpack-scheduler"
NAMESPACE, APP = "inference", "infer"
PAUSE = "registry.k8s.io/pause:3.10"
STACK_NS, STACK_SERVICE = "monitoring", "kube-prometheus-stack-prometheus"
THRESHOLD, MAX_REPLICAS = 50, 3
HPA = f"/apis/autoscaling/v2/namespaces/{NAMESPACE}/horizontalpodautoscalers/keda-hpa-{APP}"
DEPLOYMENT = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{APP}"
# the Deployment's pods: <deployment>-<pod-template-hash>-<suffix>, as the exporter names the pod holding a GPU
# the per-pod series of the monitoring step's recording rules (monitoring.workload_gpu_rules); a real cluster's
# ScaledObject names the per-workload one, namespace_workload:dcgm_gpu_utilization:avg{workload="infer"}, which
# needs kube-state-metrics' pod owners (kube-prometheus-stack runs it; nothing here can)
QUERY = f'avg(namespace_pod:dcgm_gpu_utilization:avg{{namespace="{NAMESPACE}",pod=~"{APP}-[a-z0-9]+-[a-z0-9]+"}})'
WITHIN = 180.0  # seconds for Prometheus, KEDA, the HPA controller and the schedulers on a loaded CI machine


@contextlib.contextmanager
def keda_cluster(folder: Path):
    """A local cluster with KEDA (skipped when it is not built, a failure when it does not start), always stopped."""
    from tests.conftest import local_cluster_wanted
    if not local_cluster_wanted():
        pytest.skip("the local cluster is not built (scripts/install-test-tools); GPU_BOOTSTRAP_LIVE_TARGET=emulator")
    try:
        cluster = local.up(folder / "cluster", gpu_nodes=len(GPU_NODES), cpu_nodes=2, die_with_parent=True,
                           keda=True)
    except local.ClusterError as error:
        pytest.fail(f"the local cluster did not start: {error}")
    try:
        yield cluster
    finally:
        local.down(folder / "cluster")


def write_config(path: Path, kubeconfig: Path) -> None:
    from tests.conftest import chart
    path.write_text(json.dumps({
        "cluster": {"kubeconfig": str(kubeconfig)}, "nodes": [{"name": n} for n in GPU_NODES],
        "monitoring": {"wait_timeout": 300, "chart": str(chart("kube-prometheus-stack-88.5.3.tgz")),
                       "scrape_interval": "5s"},
        "gpu_operator": {"chart": str(binaries()["gpu-operator-chart"]), "skip_version_check": True,
                         "wait_timeout": 300},
        "scheduler": {"wait_timeout": 300}, "admission": {"wait_timeout": 300}, "validate": {"enabled": False}}))


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    """The cluster after `up`, and how that `up` ended."""
    require("keda-operator", "keda-adapter", "keda-crds", "gpu-operator", "gpu-operator-chart")
    from tests.nodes.reports import write_report
    folder = tmp_path_factory.mktemp("pod-autoscaling-real")
    with keda_cluster(folder) as cluster:
        write_report(folder / "report.json", GPU_NODES, gpus=4)
        config = folder / "gpu-bootstrap.yaml"
        write_config(config, cluster.kubeconfig)
        ended = UpRun(["up", "-c", str(config), "--only", STEPS, "--preflight-report", str(folder / "report.json")],
                      folder).wait(RUN_TIMEOUT)
        yield cluster, ended


def deployment() -> dict:
    """A GPU Deployment as users write it: one GPU in its limits, no toleration, no scheduler name."""
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": APP},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": APP}},
                     "template": {"metadata": {"labels": {"app": APP}},
                                  "spec": {"containers": [{"name": "server", "image": PAUSE,
                                                           "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def scaled_object(server: str) -> dict:
    """KEDA's ScaledObject: the Prometheus trigger on the pods' average GPU utilization; the HPA's stabilization
    windows at 0 and one sync period per step, so each change shows within seconds."""
    fast = {"stabilizationWindowSeconds": 0, "policies": [{"type": "Percent", "value": 100, "periodSeconds": 5}]}
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": APP},
            "spec": {"scaleTargetRef": {"name": APP}, "minReplicaCount": 1, "maxReplicaCount": MAX_REPLICAS,
                     "pollingInterval": 5,
                     "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleUp": fast,
                                                                                 "scaleDown": fast}}},
                     "triggers": [{"type": "prometheus", "metricType": "Value",
                                   "metadata": {"serverAddress": server, "query": QUERY,
                                                "threshold": str(THRESHOLD)}}]}}


def prometheus_address(api) -> str:
    """The Prometheus Service's endpoint (its pod's address and port): what KEDA reaches from out of cluster."""
    slices = api.get(f"/apis/discovery.k8s.io/v1/namespaces/{STACK_NS}/endpointslices",
                     labelSelector=f"kubernetes.io/service-name={STACK_SERVICE}")["items"]
    for found in slices:
        port = next((p["port"] for p in found.get("ports") or [] if p.get("name") == "http-web"), None)
        for endpoint in found.get("endpoints") or []:
            if port and (endpoint.get("conditions") or {}).get("ready"):
                return f"http://{endpoint['addresses'][0]}:{port}"
    return ""


def prometheus_value(api, promql: str) -> float | None:
    """An instant query through the API server's service proxy, as `kubectl get --raw` reaches Prometheus."""
    path = f"/api/v1/namespaces/{STACK_NS}/services/{STACK_SERVICE}:9090/proxy/api/v1/query"
    result = api.get(path, query=promql)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def app_pods(api) -> list[dict]:
    return [p for p in api.get(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=f"app={APP}")["items"]
            if not p["metadata"].get("deletionTimestamp")]


def running_on_gpu_nodes(api) -> list[dict]:
    return [p for p in app_pods(api) if (p.get("status") or {}).get("phase") == "Running"
            and p["spec"].get("nodeName") in GPU_NODES]


def hpa_value(hpa: dict) -> float | None:
    """The external metric's value the HPA controller last read from KEDA's adapter."""
    for metric in (hpa.get("status") or {}).get("currentMetrics") or []:
        if metric.get("type") == "External":
            quantity = metric["external"]["current"].get("value", "")
            return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
    return None


def scaled_to(api, replicas: int, above: bool):
    """The Deployment and its HPA once both say `replicas`, every pod running on a GPU node, and the HPA's reading
    above (or below) the threshold; None before."""
    hpa, found = api.get(HPA), api.get(DEPLOYMENT)
    value = hpa_value(hpa)
    status = hpa.get("status") or {}
    if value is None or (value > THRESHOLD) != above or found["spec"]["replicas"] != replicas or \
            status.get("desiredReplicas") != replicas or status.get("currentReplicas") != replicas:
        return None
    return (hpa, found) if len(running_on_gpu_nodes(api)) == replicas == len(app_pods(api)) else None


def state(api) -> str:
    hpa = api.get(HPA)
    pods = [(p["metadata"]["name"], p["spec"].get("nodeName"), p["status"].get("phase")) for p in app_pods(api)]
    return (f"deployment replicas {api.get(DEPLOYMENT)['spec']['replicas']}, HPA status {hpa.get('status')}, "
            f"pods {pods}, Prometheus {prometheus_value(api, QUERY)}")


def keda_logs(cluster) -> str:
    return "\n".join(f"--- {name}\n{cluster.log(name).read_text(errors='replace')[-2500:]}"
                     for name in ("keda-operator", "keda-adapter"))


def test_gpu_utilization_scales_a_gpu_deployment_up_and_back_down(platform):
    cluster, ended = platform
    assert ended.code == 0, ended.output[-3000:]
    api = cluster.admin()
    api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    api.create(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", deployment())
    set_gpu_load(cluster.folder, [{"namespace": NAMESPACE, "labels": {"app": APP}, "utilization": 10}])
    wait_for(lambda: len(running_on_gpu_nodes(api)) == 1, WITHIN, lambda: state(api))
    [first] = app_pods(api)
    assert first["spec"]["schedulerName"] == SCHEDULER  # steered by admission: the user named no scheduler
    # the exporter's series for the pod's GPU, with its namespace and pod, reached Prometheus (scraped every 5 s)
    wait_for(lambda: prometheus_value(api, QUERY) == 10, WITHIN, lambda: state(api), interval=1.0)
    server = prometheus_address(api)
    assert server, "the Prometheus Service has no ready endpoint"
    api.create(f"/apis/keda.sh/v1alpha1/namespaces/{NAMESPACE}/scaledobjects", scaled_object(server))
    # KEDA made the HPA, and the HPA controller read the metric through external.metrics.k8s.io: 10 < 50, 1 replica
    wait_for(lambda: scaled_to(api, 1, above=False), WITHIN, lambda: state(api) + "\n" + keda_logs(cluster),
             interval=1.0)

    started = time.monotonic()
    set_gpu_load(cluster.folder, [{"namespace": NAMESPACE, "labels": {"app": APP}, "utilization": 90}])
    hpa, _ = wait_for(lambda: scaled_to(api, MAX_REPLICAS, above=True), WITHIN,
                      lambda: state(api) + "\n" + keda_logs(cluster), interval=1.0)
    scale_up = time.monotonic() - started
    assert hpa_value(hpa) == 90
    assert hpa["spec"]["metrics"][0]["external"]["target"] == {"type": "Value", "value": str(THRESHOLD)}
    pods = app_pods(api)
    assert {p["spec"]["schedulerName"] for p in pods} == {SCHEDULER}
    assert all(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1" for p in pods)

    started = time.monotonic()
    set_gpu_load(cluster.folder, [{"namespace": NAMESPACE, "labels": {"app": APP}, "utilization": 10}])
    hpa, found = wait_for(lambda: scaled_to(api, 1, above=False), WITHIN,
                          lambda: state(api) + "\n" + keda_logs(cluster), interval=1.0)
    assert hpa_value(hpa) == 10 and found["spec"]["replicas"] == 1
    print(f"scaled up in {scale_up:.0f} s, down in {time.monotonic() - started:.0f} s")
