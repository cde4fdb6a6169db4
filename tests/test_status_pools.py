"""`status`'s NodePool verdicts for pending GPU pods (app/status_pools.py), table-tested without a cluster on
NodePools shaped as gpu-bootstrap renders them and as Karpenter reports them (`status.resources`); the real
Karpenter's NodePools are read by tests/test_gpu_pools_real.py."""
from __future__ import annotations

import pytest

from gpu_bootstrap.app.status_pools import CAN, annotate, verdict

pytestmark = pytest.mark.unit
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TOLERATES = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def pool(name: str = "gpu", limit: str | None = "16", used: str | None = "8", taints=(TAINT,), labels=None,
         requirements=()) -> dict:
    spec = {"template": {"metadata": {"labels": labels or {"nvidia.com/gpu.present": "true"}},
                         "spec": {"taints": list(taints), "requirements": list(requirements)}}}
    if limit is not None:
        spec["limits"] = {"nvidia.com/gpu": limit}
    return {"metadata": {"name": name}, "spec": spec,
            "status": {"resources": {"nvidia.com/gpu": used}} if used is not None else {}}


def pod(tolerations=TOLERATES, selector=None, affinity_terms=None) -> dict:
    spec = {"tolerations": list(tolerations), "nodeSelector": selector or {}}
    if affinity_terms is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": k, "operator": "In", "values": [v]}
                                                        for k, v in term.items()]} for term in affinity_terms]}}}
    return {"metadata": {"namespace": "ml", "name": "p"}, "spec": spec}


@pytest.mark.parametrize("the_pod, gpus, the_pool, says", [
    (pod(), 8, pool(), CAN),
    (pod(), 9, pool(), "at its GPU limit (8 of 16 in use, the pod asks for 9)"),
    (pod(), 1, pool(used=None), CAN),  # no nodes yet: Karpenter reports nothing in use
    (pod(), 64, pool(limit=None), CAN),  # no GPU limit (not ours: we always set one)
    (pod(tolerations=()), 1, pool(), "the pod does not tolerate its taint nvidia.com/gpu:NoSchedule"),
    (pod(tolerations=()), 1, pool(taints=()), CAN),
    (pod(selector={"nvidia.com/gpu.present": "false"}), 1, pool(),
     "its nodes are labelled nvidia.com/gpu.present=true, the pod asks for false"),
    (pod(selector={"karpenter.k8s.aws/instance-gpu-name": "a100"}), 1,
     pool(requirements=[{"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["h100", "l4"]}]),
     "its requirement on karpenter.k8s.aws/instance-gpu-name rules out a100"),
    (pod(selector={"karpenter.k8s.aws/instance-gpu-count": "8"}), 1,
     pool(requirements=[{"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Gt", "values": ["3"]}]), CAN),
    (pod(selector={"team": "ml"}), 1, pool(), CAN),  # a label Karpenter may still give: not ruled out
    # one affinity term the pool satisfies is enough
    (pod(affinity_terms=[{"nvidia.com/gpu.present": "false"}, {"nvidia.com/gpu.present": "true"}]), 1, pool(), CAN),
    (pod(affinity_terms=[{"nvidia.com/gpu.present": "false"}]), 1, pool(),
     "its nodes are labelled nvidia.com/gpu.present=true, the pod asks for false"),
])
def test_a_pool_serves_a_pending_pod_unless_its_limit_taint_or_labels_say_no(the_pod, gpus, the_pool, says):
    assert verdict(the_pod, gpus, the_pool) == says


def test_each_pending_row_gets_every_pool_by_name_and_nothing_without_pools():
    rows = [{"namespace": "ml", "name": "p", "gpus": 4}]
    annotate(rows, {("ml", "p"): pod()}, [])
    assert "pools" not in rows[0]
    annotate(rows, {("ml", "p"): pod()}, [pool("z", used="14"), pool("a")])
    assert rows[0]["pools"] == {"a": CAN, "z": "at its GPU limit (14 of 16 in use, the pod asks for 4)"}
