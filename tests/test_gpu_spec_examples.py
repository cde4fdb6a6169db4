"""examples/pods/gpu-spec-pods.yaml: pods that select GPUs by memory, product and compute capability.

* every pod validates against the Kubernetes schemas (kubernetes-validate, strict), names the bin-packing scheduler
  and tolerates node-prep's default taint;
* applied with the real kubectl to the API emulator, whose scheduler stands in for ours (it serves the
  gpu-binpack-scheduler name and evaluates node affinity as kube-scheduler does), each pod lands only on a node
  whose GPU feature discovery labels meet its terms; a pod no node satisfies stays Pending, marked Unschedulable
  (what Karpenter provisions for).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpu_bootstrap.core.config import NodePrepConfig, SchedulerConfig

kubernetes_validate = pytest.importorskip("kubernetes_validate")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pods" / "gpu-spec-pods.yaml"
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GFD = {  # node -> the labels GPU feature discovery puts on it
    "c-h100": {"nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
               "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0"},
    "b-a100-40gb": {"nvidia.com/gpu.memory": "40960", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
                "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "0"},
    "a-t4": {"nvidia.com/gpu.memory": "15360", "nvidia.com/gpu.product": "Tesla-T4",
             "nvidia.com/gpu.compute.major": "7", "nvidia.com/gpu.compute.minor": "5"},
}
ELIGIBLE = {"cuda-at-least-40gb": {"c-h100", "b-a100-40gb"}, "cuda-on-h100": {"c-h100"},
            "cuda-compute-8-or-newer": {"c-h100", "b-a100-40gb"}}


def pods() -> list[dict]:
    return [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]


@pytest.mark.unit
@pytest.mark.parametrize("kube", ["1.30", "1.33"])
def test_example_pods_are_valid_and_use_our_scheduler(kube):
    found = pods()
    assert [p["metadata"]["name"] for p in found] == list(ELIGIBLE)
    taint = NodePrepConfig().taint.as_taint()
    for pod in found:
        kubernetes_validate.validate(pod, kube, strict=True)
        assert pod["spec"]["schedulerName"] == SchedulerConfig().name
        assert {"key": taint["key"], "operator": "Exists", "effect": taint["effect"]} in pod["spec"]["tolerations"]
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0]["key"].startswith("nvidia.com/gpu.")  # GPU feature discovery's
        assert terms[1]["matchExpressions"][0]["key"].startswith("karpenter.k8s.aws/instance-gpu-")


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.33.2", "cpu_nodes": ["cpu-1"]}


@pytest.mark.tools
def test_each_pod_lands_only_where_its_gpu_terms_hold(cluster):
    for name, labels in GFD.items():
        cluster.emu.add_node(name, gpus=8, labels={"nvidia.com/gpu.present": "true", **labels}, taints=[TAINT])
    cluster.emu.register_scheduler(SchedulerConfig().name)
    cluster.kubectl("apply", "-f", str(EXAMPLE))
    for _ in range(3):  # the pods land one at a time; a-t4 sorts first, so any pod it satisfies lands there
        cluster.emu.settle()
    placed = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.emu.list("pods", "default")}
    assert set(placed) == set(ELIGIBLE)
    for pod, node in placed.items():
        assert node in ELIGIBLE[pod], (pod, node)


@pytest.mark.tools
def test_a_pod_no_node_satisfies_stays_pending_marked_unschedulable(cluster):
    cluster.emu.add_node("a-t4", gpus=8, labels={"nvidia.com/gpu.present": "true", **GFD["a-t4"]}, taints=[TAINT])
    cluster.emu.register_scheduler(SchedulerConfig().name)
    h100 = next(p for p in pods() if p["metadata"]["name"] == "cuda-on-h100")
    cluster.kubectl("apply", "-f", "-", input=json.dumps(h100))
    cluster.emu.settle()
    pod = cluster.emu.get("pods", "cuda-on-h100", "default")
    assert not pod["spec"].get("nodeName")
    [condition] = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
