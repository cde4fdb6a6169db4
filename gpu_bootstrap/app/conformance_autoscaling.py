"""`doctor --conformance`'s autoscaling items: a pending GPU pod brings a node from one of our NodePools
(cluster_autoscaling), and an HPA scales a GPU Deployment on the monitoring step's DCGM series through KEDA
(pod_autoscaling)."""
from __future__ import annotations

from gpu_bootstrap.app.conformance_probe import Probe, pause_pod, prometheus
from gpu_bootstrap.core.objects import condition_true
from gpu_bootstrap.core.refs import Ref
from gpu_bootstrap.render.conformance import IMPLEMENTED, NOT_APPLICABLE, NOT_IMPLEMENTED, Result


def cluster_autoscaling(probe: Probe) -> Result:
    """A pending GPU pod that fits on no node brings a node from one of our NodePools."""
    item = "cluster_autoscaling"
    pools = getattr(probe.ctx.config, "pools", None) or []
    if "gpu-pools" not in probe.steps or not pools:
        return Result(item, NOT_APPLICABLE, "no autoscaled pools are configured (pools provides Karpenter "
                                            "NodePools for GPU nodes)", in_scope=False)
    if probe.read_only:
        return Result(item, NOT_IMPLEMENTED, "not checked (--read-only): it creates a GPU pod that needs a new node")
    pool = pools[0]
    gpus = pool.requirements.gpu_count
    before = {c["metadata"]["name"] for c in probe.ctx.kube.list("karpenter.sh/v1", "NodeClaim")}
    pod = pause_pod("conformance-autoscaled", gpus=gpus, nodeSelector={"karpenter.sh/nodepool": pool.name})
    pod["metadata"]["namespace"] = probe.namespace
    probe.create(pod)

    def launched_and_bound():
        claims = [c["metadata"]["name"] for c in probe.ctx.kube.list("karpenter.sh/v1", "NodeClaim")
                  if c["metadata"]["name"] not in before]
        live = probe.ctx.kube.get("v1", "Pod", "conformance-autoscaled", probe.namespace) or {}
        node = (live.get("spec") or {}).get("nodeName")
        return (claims, node) if claims and node else None
    answer = probe.wait(f"a node from NodePool {pool.name} is launched and the {gpus}-GPU pod bound to it",
                        launched_and_bound)
    if not answer:
        _why_not_launched(probe, before)
    probe.ctx.kube.delete(Ref("v1", "Pod", "conformance-autoscaled", probe.namespace))
    if not answer:
        return Result(item, NOT_IMPLEMENTED, f"a pending {gpus}-GPU pod for NodePool {pool.name} brought no node "
                                             f"within {probe.within:g} s")
    claims, node = answer
    return Result(item, IMPLEMENTED, (
        f"Karpenter NodePools of GPU instance types (the gpu-pools step): a pending {gpus}-GPU pod brought NodeClaim "
        f"{claims[0]} and was bound to {node}; nodes left empty are removed after "
        f"{pool.disruption.consolidate_after} (consolidationPolicy WhenEmpty)"))


def _why_not_launched(probe: Probe, before: set[str]) -> None:
    """What the log needs to tell Karpenter from the scheduler: the pod's scheduling condition and the NodeClaims
    launched since, with their conditions."""
    pod = probe.ctx.kube.get("v1", "Pod", "conformance-autoscaled", probe.namespace) or {}
    for condition in (pod.get("status") or {}).get("conditions") or []:
        probe.say(f"pod condition {condition.get('type')}={condition.get('status')} {condition.get('reason', '')}: "
                  f"{condition.get('message', '')}")
    for claim in probe.ctx.kube.list("karpenter.sh/v1", "NodeClaim"):
        if claim["metadata"]["name"] not in before:
            states = [f"{c.get('type')}={c.get('status')}" for c in (claim.get("status") or {}).get("conditions")
                      or []]
            probe.say(f"NodeClaim {claim['metadata']['name']}: node {(claim.get('status') or {}).get('nodeName')}, "
                      f"{', '.join(states)}")


def pod_autoscaling(probe: Probe) -> Result:
    """The path an HPA scales GPU pods on: the per-pod and per-workload GPU series and an external-metrics API."""
    item = "pod_autoscaling"
    monitoring = probe.ctx.config.monitoring
    if "monitoring" not in probe.steps or not monitoring.workload_gpu_rules:
        return Result(item, NOT_IMPLEMENTED, "the monitoring step's workload GPU series are off "
                                             "(monitoring.workload_gpu_rules); the HPA has no GPU metric to scale on")
    recorded = _workload_rules_in_place(probe)
    if not recorded:
        return Result(item, NOT_IMPLEMENTED, "the monitoring step's PrometheusRule with the workload GPU series is "
                                             "not on the cluster (gpu-bootstrap up installs it)")
    service = probe.ctx.kube.get("apiregistration.k8s.io/v1", "APIService", "v1beta1.external.metrics.k8s.io")
    available = condition_true(service, "Available")
    crd = probe.ctx.kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "scaledobjects.keda.sh")
    probe.say(f"external.metrics.k8s.io APIService: {'available' if available else 'missing or not available'}; "
              f"KEDA's ScaledObject CRD: {'present' if crd else 'absent'}")
    if not (available and crd):
        return Result(item, NOT_IMPLEMENTED, (
            "the GPU series are recorded (namespace_workload:dcgm_gpu_utilization:avg), but no KEDA serves "
            "external metrics: install KEDA (docs/steps/monitoring.md) for HPAs on GPU utilization"))
    if probe.read_only:
        return Result(item, NOT_IMPLEMENTED, "not checked (--read-only): the GPU series are recorded and KEDA serves "
                                             "external metrics, but proving it scales deploys a GPU Deployment")
    return _scales(probe)


def _scales(probe: Probe) -> Result:
    """A 1-replica GPU Deployment and a ScaledObject on its pods' DCGM series: their count x 100 against 50 (an idle
    GPU reports 0 % utilization, so utilization itself would not move on a cluster at rest): the HPA must scale the
    Deployment to 2."""
    item, namespace, app = "pod_autoscaling", probe.namespace, "conformance-gpu-scaled"
    server = _prometheus_endpoint(probe)
    if not server:
        return Result(item, NOT_IMPLEMENTED, "the Prometheus Service has no ready endpoint for KEDA to query")
    probe.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": app, "namespace": namespace},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                           "template": {"metadata": {"labels": {"app": app}},
                                        "spec": pause_pod(app, gpus=1)["spec"]}}})
    query = f'count(namespace_pod:dcgm_gpu_utilization:avg{{namespace="{namespace}"}}) * 100'
    fast = {"stabilizationWindowSeconds": 0, "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}
    probe.create({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
                  "metadata": {"name": app, "namespace": namespace},
                  "spec": {"scaleTargetRef": {"name": app}, "minReplicaCount": 1, "maxReplicaCount": 2,
                           "pollingInterval": 5,
                           "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleUp": fast}}},
                           "triggers": [{"type": "prometheus", "metricType": "Value",
                                         "metadata": {"serverAddress": server, "query": query,
                                                      "threshold": "50"}}]}})

    def scaled():
        hpa = probe.ctx.kube.get("autoscaling/v2", "HorizontalPodAutoscaler", f"keda-hpa-{app}", namespace)
        found = probe.ctx.kube.get("apps/v1", "Deployment", app, namespace) or {}
        desired = ((hpa or {}).get("status") or {}).get("desiredReplicas")
        return (hpa, found) if desired == 2 and (found.get("spec") or {}).get("replicas") == 2 else None
    answer = probe.wait(f"the HPA KEDA made scales the GPU Deployment to 2 on {query} (threshold 50)", scaled)
    if not answer:
        return Result(item, NOT_IMPLEMENTED, f"an HPA on the Deployment's DCGM series did not scale it within "
                                             f"{probe.within:g} s")
    pods = probe.ctx.kube.list("v1", "Pod", namespace, label_selector=f"app={app}")
    probe.say(f"pods: {[(p['metadata']['name'], (p.get('spec') or {}).get('nodeName')) for p in pods]}")
    return Result(item, IMPLEMENTED, (
        "an HPA scales GPU pods on the monitoring step's recording rules over DCGM (namespace_pod: and "
        "namespace_workload:dcgm_gpu_utilization:avg) through KEDA's external metrics API: a 1-replica GPU "
        "Deployment was scaled to 2 on its pods' DCGM series, live"))


def _prometheus_endpoint(probe: Probe) -> str:
    """http://<address>:<port> of a ready endpoint of the Prometheus Service: what KEDA's operator reaches (a pod
    address works from a pod and from the local cluster's out-of-cluster KEDA alike; the Service's DNS name only
    from a pod)."""
    proxy = prometheus(probe)
    if isinstance(proxy, str):
        return ""
    namespace, service, port_name = proxy
    for found in probe.ctx.kube.list("discovery.k8s.io/v1", "EndpointSlice", namespace,
                                     label_selector=f"kubernetes.io/service-name={service}"):
        ports = [p["port"] for p in found.get("ports") or [] if p.get("name") == port_name or
                 str(p.get("port")) == port_name]
        for endpoint in found.get("endpoints") or []:
            if ports and (endpoint.get("conditions") or {}).get("ready") and endpoint.get("addresses"):
                return f"http://{endpoint['addresses'][0]}:{ports[0]}"
    return ""


def _workload_rules_in_place(probe: Probe) -> bool:
    from gpu_bootstrap.render import monitoring as render
    from gpu_bootstrap.steps.monitoring_target import decide
    rule = probe.ctx.kube.get("monitoring.coreos.com/v1", "PrometheusRule", render.RULE_NAME,
                              decide(probe.ctx).namespace)
    groups = [g.get("name") for g in ((rule or {}).get("spec") or {}).get("groups") or []]
    probe.say(f"PrometheusRule {render.RULE_NAME}: {'groups ' + ', '.join(groups) if rule else 'absent'}")
    return "gpu-bootstrap.gpu-workloads" in groups
