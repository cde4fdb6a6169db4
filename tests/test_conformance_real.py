"""The AI platform a full `up` makes, proved on the real control plane: GPU pods that scale on GPU utilization, and
`doctor --conformance` filling in the Kubernetes AI Conformance checklist from live proofs.

One local cluster for the module: the real API server, kube-scheduler, controller-manager (its HPA controller), KWOK
GPU nodes, the real Karpenter (KWOK provider), the real KEDA (v2.21.0, its operator and metrics adapter:
scripts/gomod/keda, tests/localcluster/keda.py), and what `up` installs: node-prep, monitoring (kube-prometheus-stack
from ../shared/charts, the real Prometheus Operator and Prometheus), the gpu-operator (the real controller of the 25.3
line: its DCGM exporter DaemonSet and ServiceMonitor), the bin-packing scheduler, admission (OPA), team queues (the
real Kueue) and a Karpenter pool.

Scaling on GPU utilization: a Deployment of one replica asking for one GPU (no toleration, no scheduler name:
admission steers it), and a KEDA ScaledObject: the average over the Deployment's pods of
namespace_pod:dcgm_gpu_utilization:avg, the monitoring step's recording rule over DCGM_FI_DEV_GPU_UTIL (by the
namespace and pod labels the exporter gives each GPU a pod holds, which the ServiceMonitor's honorLabels keeps;
evaluated by the real Prometheus from our PrometheusRule), against 50, as `metricType: Value` (the HPA scales
replicas by value / target, as for CPU utilization), 1 to 3 replicas, with the HPA's stabilization windows shortened
through advanced.horizontalPodAutoscalerConfig.behavior.

* utilization 90 -> the HPA scales the Deployment to 3; the new pods are GPU pods, steered and bound to GPU nodes;
* utilization 10 -> it scales back to 1.

Conformance: after the full `up` every MUST gpu-bootstrap covers is Implemented, with evidence; the items it does not
cover never are; `--read-only` as an identity that may only read creates nothing, reports what it can and names what
it could not check; with queues, then admission, then monitoring torn down in turn, the matching items turn Not
Implemented and the command exits 1 (then `up` puts the platform back).

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

import json
import time
from pathlib import Path

import pytest

from tests.localcluster.cluster import binaries, require
from tests.localcluster.standins import set_gpu_load
from tests.realfaults import UpRun, local_cluster, wait_for

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.xdist_group("conformance-real")]
GPU_NODES = ["gpu-1", "gpu-2"]
TEAM, POOL = "team-a", "gpus"
RUN_TIMEOUT = 900
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


def write_config(path: Path, kubeconfig: Path) -> None:
    from tests.conftest import chart
    path.write_text(json.dumps({
        "cluster": {"kubeconfig": str(kubeconfig)}, "nodes": [{"name": n} for n in GPU_NODES],
        "monitoring": {"wait_timeout": 300, "chart": str(chart("kube-prometheus-stack-88.5.3.tgz")),
                       "scrape_interval": "5s"},
        "gpu_operator": {"chart": str(binaries()["gpu-operator-chart"]), "skip_version_check": True,
                         "wait_timeout": 300},
        "scheduler": {"wait_timeout": 300}, "admission": {"wait_timeout": 300}, "validate": {"enabled": False},
        "queues": {"kueue": {"chart": str(binaries()["kueue-chart"])},
                   "teams": [{"name": TEAM, "namespaces": [TEAM], "gpus": 8}]},
        "pools": [{"name": POOL, "cloud": "kwok", "requirements": {"gpu_count": 8}, "limits": {"nvidia.com/gpu": 64},
                   "disruption": {"consolidate_after": "20s", "budgets": [{"nodes": "100%"}]}}]}))


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    """The cluster after the full `up` (every step of the default playbook but validate), and how that `up` ended."""
    require("keda-operator", "keda-adapter", "keda-crds", "gpu-operator", "gpu-operator-chart", "kueue",
            "kueue-chart", "karpenter", "karpenter-crds")
    from tests.nodes.reports import write_report
    folder = tmp_path_factory.mktemp("conformance-real")
    with local_cluster(folder, gpu_nodes=len(GPU_NODES), cpu_nodes=2, karpenter=True, keda=True) as cluster:
        write_report(folder / "report.json", GPU_NODES, gpus=4)
        config = folder / "gpu-bootstrap.yaml"
        write_config(config, cluster.kubeconfig)
        cluster.admin().create("/api/v1/namespaces", {"metadata": {"name": TEAM}})  # the team's, not ours
        ended = UpRun(["up", *gpu_bootstrap_args(folder)], folder).wait(RUN_TIMEOUT)
        yield cluster, ended, folder


def gpu_bootstrap_args(folder: Path) -> list[str]:
    return ["-c", str(folder / "gpu-bootstrap.yaml"), "--preflight-report", str(folder / "report.json")]


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
    """The app's pods running on nodes that advertise GPUs (the cluster's own, or one a pool launched)."""
    gpu_nodes = {n["metadata"]["name"] for n in api.get("/api/v1/nodes")["items"]
                 if int(((n.get("status") or {}).get("capacity") or {}).get("nvidia.com/gpu", "0")) > 0}
    return [p for p in app_pods(api) if (p.get("status") or {}).get("phase") == "Running"
            and p["spec"].get("nodeName") in gpu_nodes]


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
    cluster, ended, _folder = platform
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
    api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")  # the module's other test tears steps down


# --- doctor --conformance ---------------------------------------------------------------------------------------------
COVERED_MUSTS = ("gang_scheduling", "cluster_autoscaling", "pod_autoscaling", "accelerator_metrics",
                 "ai_service_metrics", "secure_accelerator_access", "robust_controller")
PLATFORM = {"platformName": "gpu-bootstrap on the local control plane", "vendorName": "Example",
            "websiteUrl": "https://example.org", "documentationUrl": "https://example.org/docs",
            "productLogoUrl": "https://example.org/logo.svg", "description": "A GPU platform built by gpu-bootstrap",
            "contactEmailAddress": "gpu@example.org",
            "k8sConformanceUrl": "https://github.com/cncf/k8s-conformance/tree/master/v1.37/example"}
NOT_COVERED = ("virtualized_accelerator", "ai_inference", "advanced_inference_ingress", "high_performance_networking",
               "disaggregated_inference")


def conformance(folder: Path, out: Path, *extra: str, kubeconfig: Path | None = None):
    """`doctor --conformance OUT` as a user runs it; (how it ended, item id -> the checklist's entry)."""
    import yaml
    args = [*gpu_bootstrap_args(folder), "--conformance", str(out), *extra]
    if kubeconfig is not None:
        args += ["--kubeconfig", str(kubeconfig)]
    ended = UpRun(["doctor", *args], folder).wait(RUN_TIMEOUT)
    assert ended.document is not None, ended.output[-3000:]
    checklist = yaml.safe_load((out / "AIConformance.yaml").read_text())
    return ended, {entry["id"]: entry for section in checklist["spec"].values() for entry in section}


def evidence(out: Path, item: str) -> str:
    return (out / f"{item}.log").read_text()


def reader_kubeconfig(cluster, folder: Path) -> Path:
    """An identity that may read everything and create nothing (not even a dry run): a ServiceAccount bound to a
    ClusterRole of get/list/watch, and the Prometheus service proxy."""
    import base64
    api = cluster.admin()
    api.create("/api/v1/namespaces/default/serviceaccounts", {"metadata": {"name": "conformance-reader"}})
    api.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", {
        "metadata": {"name": "conformance-reader"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]},
                  {"apiGroups": [""], "resources": ["services/proxy"], "verbs": ["get"]}]})
    api.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": "conformance-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "conformance-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "conformance-reader", "namespace": "default"}]})
    token = api.create("/api/v1/namespaces/default/serviceaccounts/conformance-reader/token",
                       {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"expirationSeconds": 3600}})["status"]["token"]
    path = folder / "reader.kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "reader",
        "clusters": [{"name": "local", "cluster": {
            "server": f"https://127.0.0.1:{cluster.ports['apiserver']}",
            "certificate-authority-data": base64.b64encode(cluster.ca.read_bytes()).decode()}}],
        "users": [{"name": "reader", "user": {"token": token}}],
        "contexts": [{"name": "reader", "context": {"cluster": "local", "user": "reader"}}]}))
    path.chmod(0o600)
    return path


def test_conformance_proves_the_full_platform_and_fails_each_item_whose_step_is_torn_down(platform, tmp_path):
    """Issue 60's acceptance on one cluster, in order: the full platform; a read-only identity; then queues,
    admission and monitoring torn down in turn (each teardown keeps the earlier ones), the platform put back after."""
    from gpu_bootstrap.render import conformance as rules
    from tests.live.audit import audit_mark, audit_writes
    cluster, ended, folder = platform
    assert ended.code == 0, ended.output[-3000:]
    api = cluster.admin()
    # the DCGM stand-in labels the GPUs pods hold, as the real exporter does in Kubernetes mode (idle: 0 %)
    set_gpu_load(cluster.folder, [])
    out = tmp_path / "full"
    platform_file = tmp_path / "platform.yaml"
    platform_file.write_text(json.dumps(PLATFORM))
    done, items = conformance(folder, out, "--conformance-metadata", str(platform_file))
    assert done.code == 0, done.output[-4000:]
    assert {i: items[i]["status"] for i in COVERED_MUSTS} == {i: "Implemented" for i in COVERED_MUSTS}
    assert {items[i]["status"] for i in NOT_COVERED} == {"Not Implemented"}
    assert "admitted whole" in items["gang_scheduling"]["notes"] and \
        "both pods are bound: yes" in evidence(out, "gang_scheduling")
    assert "brought NodeClaim" in items["cluster_autoscaling"]["notes"]
    assert "scaled to 2" in items["pod_autoscaling"]["notes"] and \
        "scales the GPU Deployment to 2" in evidence(out, "pod_autoscaling")
    assert "was refused" in evidence(out, "secure_accelerator_access") and \
        "NVIDIA_VISIBLE_DEVICES" in evidence(out, "secure_accelerator_access")
    assert "refused" in evidence(out, "robust_controller") and "suspend: True" in evidence(out, "robust_controller")
    assert "Prometheus scrapes the workload" in evidence(out, "ai_service_metrics")
    from xml.etree import ElementTree
    suite = ElementTree.parse(out / "junit.xml").getroot()
    assert suite.get("failures") == "0" and suite.get("tests") == "14"
    # the program's validator's structural checks pass but for the one MUST nobody here provides, as the run said
    template_items = rules.checklist()[1]
    import yaml
    written = yaml.safe_load((out / "AIConformance.yaml").read_text())
    assert {k: written["metadata"][k] for k in PLATFORM} == PLATFORM
    problems = rules.structural_problems(written, template_items, {p.name for p in out.iterdir()})
    assert problems == done.document["validator_problems"] == [
        "Requirement 'ai_inference' is MUST level but status is 'Not Implemented'. It must be 'Implemented'."]
    wait_for(lambda: not [n for n in api.get("/api/v1/namespaces")["items"]
                          if n["metadata"]["name"].startswith("gpu-bootstrap-conformance-")], 120,
             "the check's own namespace is removed")

    # read-only, as an identity that may not create anything: nothing written, what could not be checked named
    mark = audit_mark(cluster)
    reader = reader_kubeconfig(cluster, folder)
    done, items = conformance(folder, tmp_path / "read-only", "--read-only", kubeconfig=reader)
    assert done.code == 1, done.output[-3000:]
    assert audit_writes(cluster, since=mark) == []
    assert items["accelerator_metrics"]["status"] == "Implemented"
    for item in ("gang_scheduling", "cluster_autoscaling", "ai_service_metrics", "pod_autoscaling"):
        assert items[item]["notes"].startswith("not checked (--read-only)"), items[item]
    assert items["secure_accelerator_access"]["notes"].startswith("could not check:"), items[
        "secure_accelerator_access"]  # its dry run is a create, which this identity may not send

    # each of queues, admission and monitoring torn down in turn: its items turn Not Implemented, exit 1
    turned = {"queues": ("gang_scheduling", "robust_controller"),
              "admission-opa,admission": ("secure_accelerator_access",),
              "monitoring": ("accelerator_metrics", "ai_service_metrics")}
    try:
        for steps, expected in turned.items():
            down = UpRun(["teardown", *gpu_bootstrap_args(folder)[:2], "--only", steps, "--yes"], folder).wait(
                RUN_TIMEOUT)
            assert down.code == 0, down.output[-3000:]
            done, items = conformance(folder, tmp_path / steps.replace(",", "-"), "--conformance-wait", "30")
            assert done.code == 1, done.output[-3000:]
            for item in expected:
                assert items[item]["status"] == "Not Implemented", (steps, items[item])
            assert {items[i]["status"] for i in NOT_COVERED} == {"Not Implemented"}
    finally:
        again = UpRun(["up", *gpu_bootstrap_args(folder)], folder).wait(RUN_TIMEOUT)
        assert again.code == 0, again.output[-3000:]
