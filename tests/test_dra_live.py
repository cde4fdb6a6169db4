"""gpu_operator.allocation: dra end to end on the local cluster started as `scripts/local-cluster up --dra`: real
etcd, kube-apiserver, kube-controller-manager (its ResourceClaim controller makes a template's claim) and
kube-scheduler v1.37, KWOK GPU nodes with no `nvidia.com/gpu` capacity whose GPUs are ResourceSlices of NVIDIA's
DRA driver, and its DeviceClass serving nvidia.com/gpu; the agent runs the real OPA and the real bin-packing
kube-scheduler in the pods of their Deployments. The slices are written at the cluster's start, as the driver's
kubelet plugin would (tests/localcluster/dra.py says why); the charts are the real gpu-operator and DRA driver charts.

`up` installs the operator without its device plugin and the DRA driver beside it, a second `up` changes nothing,
pods as users write them (no scheduler name, no toleration) that ask `nvidia.com/gpu: 2` or name a ResourceClaimTemplate
for gpu.nvidia.com are steered, bound by the bin-packing scheduler with their devices and counted by `status` on their
node and namespace, and `teardown` removes what is ours (the driver's release and its DeviceClasses among it) and leaves
the slices (the admin's here) and the tenant's objects.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.live.audit import audit_mark, audit_writes
from tests.localcluster import dra
from tests.realfaults import UpRun, helm_releases, local_cluster, wait_for
from tests.tools import tool, tool_env

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.xdist_group("dra-live")]
STEPS = "node-prep,gpu-operator,binpack-scheduler,admission-opa,admission,validate"
RUN_TIMEOUT = 600
SCHEDULER = "gpu-binpack-scheduler"
TENANT = "dra-tenant"
IMPLICIT = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
GPUS_PER_NODE = 4
ONE_GPU_TEMPLATE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": "one-gpu", "namespace": TENANT},
                    "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                        "deviceClassName": dra.GPU_CLASS, "count": 1}}]}}}}

NIC_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "nic.example.com"},
             "spec": {"selectors": [{"cel": {"expression": "device.driver == 'nic.example.com'"}}]}}
ONE_NIC_TEMPLATE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": "one-nic", "namespace": TENANT},
                    "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                        "deviceClassName": "nic.example.com", "count": 1}}]}}}}


def user_pod(name: str, gpus: int = 0, template: str = "", resource: str = "nvidia.com/gpu") -> dict:
    """A pod as users write it: no scheduler name, no toleration for the GPU taint."""
    container = {"name": "main", "image": "registry.example.com/ml/train:1.0"}
    spec = {"containers": [container]}
    if gpus:
        container["resources"] = {"limits": {resource: str(gpus)}}
    if template:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": TENANT}, "spec": spec}


def claim_of(api, pod: dict) -> dict:
    """The claim holding the pod's GPUs: the one the scheduler wrote for its extended resource, or the one the
    ResourceClaim controller made from its template."""
    status = pod.get("status") or {}
    name = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName") or next(
        (c["resourceClaimName"] for c in status.get("resourceClaimStatuses") or [] if c.get("resourceClaimName")), "")
    assert name, f"{pod['metadata']['name']} has no claim: {status}"
    return api.get(f"/apis/resource.k8s.io/v1/namespaces/{TENANT}/resourceclaims/{name}")


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    from tests.conftest import chart
    from tests.nodes.reports import write_report
    folder = tmp_path_factory.mktemp("dra-live")
    with local_cluster(folder, gpu_nodes=2, cpu_nodes=1, dra=True) as cluster:
        config = folder / "gpu-bootstrap.yaml"
        config.write_text(json.dumps({
            "cluster": {"kubeconfig": str(cluster.kubeconfig)}, "nodes": [{"name": "gpu-1"}, {"name": "gpu-2"}],
            "gpu_operator": {"allocation": "dra", "chart": str(chart("gpu-operator-v26.7.0.tgz")),
                             "wait_timeout": 300, "dra_driver": {"chart": str(chart("dra-driver-nvidia-gpu-0.5.0"))}},
            "scheduler": {"wait_timeout": 300}, "admission": {"wait_timeout": 300},
            "validate": {"nodes": "all", "timeout": 300},
            "monitoring": {"enabled": False}}))
        report = write_report(folder / "report.json", ["gpu-1", "gpu-2"], gpus=GPUS_PER_NODE)
        yield cluster, cluster.admin(), folder, config, report


def run(platform, *args: str):
    _cluster, _api, folder, config, report = platform
    extra = ["--preflight-report", str(report)] if args[0] == "up" else []
    return UpRun([*args, "-c", str(config), "--only", STEPS, *extra], folder).wait(RUN_TIMEOUT)


def test_up_in_dra_mode_steers_and_counts_dra_gpu_pods_and_teardown_removes_only_ours(platform):
    cluster, api, folder, config, _report = platform
    first = run(platform, "up")
    assert first.code == 0, first.output[-4000:]
    validated = next(s for s in first.document["steps"] if s["id"] == "validate")
    assert validated["message"] == "CUDA vector-add passed on gpu-1, gpu-1 (GPU from a ResourceClaim), gpu-2", validated
    releases = helm_releases(cluster)
    assert releases == {"gpu-operator/gpu-operator": "deployed",
                        "dra-driver-nvidia-gpu/dra-driver-nvidia-gpu": "deployed"}, releases
    values = json.loads(subprocess.run([tool("helm"), "get", "values", "gpu-operator", "-n", "gpu-operator", "-o", "json",
                                        "--kubeconfig", str(cluster.kubeconfig)], capture_output=True, text=True,
                                       check=True, env=tool_env(folder / "helm-home")).stdout)
    assert values["devicePlugin"]["enabled"] is False, values.get("devicePlugin")
    # a second up changes nothing: the API server's audit log holds no write of gpu-bootstrap's or helm's
    mark = audit_mark(cluster)
    second = run(platform, "up")
    assert second.code == 0, second.output[-4000:]
    assert audit_writes(cluster, since=mark) == []
    assert {s["id"]: s["status"] for s in second.document["steps"]} == {
        s["id"]: "unchanged" for s in second.document["steps"]}, second.document["steps"]
    # pods as users write them
    api.create("/api/v1/namespaces", {"metadata": {"name": TENANT}})
    api.create(f"/apis/resource.k8s.io/v1/namespaces/{TENANT}/resourceclaimtemplates", ONE_GPU_TEMPLATE)
    api.create(f"/api/v1/namespaces/{TENANT}/pods", user_pod("two-gpus", gpus=2))
    api.create(f"/api/v1/namespaces/{TENANT}/pods", user_pod("templated", template="one-gpu"))
    api.create(f"/api/v1/namespaces/{TENANT}/pods", user_pod("cpu-only"))
    # KEP-5004's implicit name of the GPU class: a GPU pod by another name, held to our scheduler all the same (#54)
    api.create(f"/api/v1/namespaces/{TENANT}/pods", user_pod("implicit", gpus=1, resource=IMPLICIT))
    # a claim of another driver's class is no GPU pod's: untouched (its devices do not exist, so it stays Pending)
    api.create("/apis/resource.k8s.io/v1/deviceclasses", NIC_CLASS)
    api.create(f"/apis/resource.k8s.io/v1/namespaces/{TENANT}/resourceclaimtemplates", ONE_NIC_TEMPLATE)
    nic = api.create(f"/api/v1/namespaces/{TENANT}/pods", user_pod("nic-claim", template="one-nic"))
    assert nic["spec"]["schedulerName"] == "default-scheduler" and not any(
        t.get("key") == "nvidia.com/gpu" for t in nic["spec"].get("tolerations", [])), nic["spec"]

    def pods() -> dict:
        return {p["metadata"]["name"]: p for p in api.get(f"/api/v1/namespaces/{TENANT}/pods")["items"]
                if p["metadata"]["name"] != "nic-claim"}

    wait_for(lambda: all(p["spec"].get("nodeName") for p in pods().values()), 180, "every tenant pod to be bound")
    found = pods()
    assert {n: p["spec"]["schedulerName"] for n, p in found.items()} == {
        "two-gpus": SCHEDULER, "templated": SCHEDULER, "cpu-only": "default-scheduler", "implicit": SCHEDULER}
    assert any(t.get("key") == "nvidia.com/gpu" and t.get("value") == "present"
               for t in found["templated"]["spec"]["tolerations"]), found["templated"]["spec"]["tolerations"]
    claims = {name: claim_of(api, found[name]) for name in ("two-gpus", "templated", "implicit")}
    for name, claim in claims.items():
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [r["driver"] for r in results] == [dra.DRIVER] * {"two-gpus": 2, "templated": 1,
                                                                   "implicit": 1}[name], results
        assert {r["pool"] for r in results} == {found[name]["spec"]["nodeName"]}, results
    status = UpRun(["status", "--kubeconfig", str(cluster.kubeconfig)], folder).wait(120)
    assert status.code == 0, status.output[-3000:]
    document = status.document
    expected = {"gpu-1": 0, "gpu-2": 0}
    expected[found["two-gpus"]["spec"]["nodeName"]] += 2
    expected[found["templated"]["spec"]["nodeName"]] += 1
    expected[found["implicit"]["spec"]["nodeName"]] += 1
    assert {n["name"]: n["gpus"]["requested"] for n in document["nodes"] if n["name"] in expected} == expected
    assert {n["name"]: n["gpus"]["allocatable"] for n in document["nodes"] if n["name"] in expected} == {
        "gpu-1": GPUS_PER_NODE, "gpu-2": GPUS_PER_NODE}
    namespace = next(n for n in document["namespaces"] if n["name"] == TENANT)
    assert (namespace["gpu_pods"], namespace["gpus"]) == (3, 4)
    # a tenant after GPUs it was not given, in DRA mode too (#54; tests/live/tenant_attacks.py): every way refused,
    # voided or steered, as on the device-plugin stack
    from tests.live import tenant_attacks
    from tests.live.conftest import Target
    target = Target(cluster.kubeconfig, folder / "tenant-home", folder, cluster=cluster)
    try:
        attacked = tenant_attacks.run(tenant_attacks.set_stage(target, folder), target)
    finally:
        tenant_attacks.clear_stage(target)
    allowed = [f"{attack}: {outcome.by} ({'; '.join(outcome.said)[:300]})" for attack, outcome in attacked.items()
               if not outcome.refused]
    assert not allowed, "\n".join(allowed)
    # teardown: ours goes (the driver's release with its DeviceClass); the slices, written here by the admin as the
    # plugin would, and the tenant's objects stay
    api.request("DELETE", f"/api/v1/namespaces/{TENANT}/pods", {"gracePeriodSeconds": 0})
    down = run(platform, "teardown", "--yes")
    assert down.code == 0, down.output[-4000:]
    assert helm_releases(cluster) == {}
    assert [c["metadata"]["name"] for c in api.get("/apis/resource.k8s.io/v1/deviceclasses")["items"]
            if c["metadata"]["name"].endswith(".nvidia.com")] == []
    slices = api.get("/apis/resource.k8s.io/v1/resourceslices")["items"]
    assert sorted(s["spec"]["nodeName"] for s in slices if s["spec"]["driver"] == dra.DRIVER) == ["gpu-1", "gpu-2"]
    assert api.get(f"/apis/resource.k8s.io/v1/namespaces/{TENANT}/resourceclaimtemplates")["items"]
