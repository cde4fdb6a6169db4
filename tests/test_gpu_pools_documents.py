"""The gpu-pools render and plan, as exact documents: the node class's volume is encrypted and deleted with the
instance and pods cannot reach the instance metadata service; the requirements ask for at least `gpu_count` GPUs and
narrow to the families and GPU names given (and only then); a weight is set only when configured; the plan explains
a pool's choices under its NodePool only."""
from __future__ import annotations

import pytest

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.pipeline.step import ObjectsFacts
from gpu_bootstrap.core.refs import Ref, Verb
from gpu_bootstrap.render import gpu_pools as render
from gpu_bootstrap.steps.gpu_pools import GpuPools
from tests.test_step_plans import check_of, context

pytestmark = pytest.mark.unit

MANAGED = {"app.kubernetes.io/managed-by": "gpu-bootstrap", "app.kubernetes.io/component": "gpu-pools"}


def pools_config(*pools: dict, **sections) -> cfg.Config:
    return cfg.Config.model_validate({"nodes": [{"name": "node5"}], "pools": list(pools), **sections})


def pool(**fields) -> dict:
    return {"name": "gpu", "role": "KarpenterNodeRole-demo", "discovery_tag": "demo", **fields}


@pytest.mark.parametrize("family, device", [("al2023", "/dev/xvda"), ("bottlerocket", "/dev/xvdb")])
def test_the_node_class_encrypts_its_volume_and_keeps_pods_off_the_metadata_service(family, device):
    conf = pools_config(pool(ami_family=family, ami_version="v20250301", volume_size="300Gi"))
    discovery = [{"tags": {"karpenter.sh/discovery": "demo"}}]
    assert render.node_class(conf.pools[0]) == {
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "gpu", "labels": MANAGED},
        "spec": {"role": "KarpenterNodeRole-demo", "amiSelectorTerms": [{"alias": f"{family}@v20250301"}],
                 "subnetSelectorTerms": discovery, "securityGroupSelectorTerms": discovery,
                 "blockDeviceMappings": [{"deviceName": device, "ebs": {
                     "volumeSize": "300Gi", "volumeType": "gp3", "encrypted": True, "deleteOnTermination": True}}],
                 "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1},
                 "tags": {"app.kubernetes.io/managed-by": "gpu-bootstrap"}}}


BASE = [{"key": "karpenter.k8s.aws/instance-gpu-manufacturer", "operator": "In", "values": ["nvidia"]}]


@pytest.mark.parametrize("requirements, expected", [
    ({}, [{"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Gt", "values": ["0"]}, *BASE,
          {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
          {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
          {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]),
    ({"gpu_count": 4, "instance_families": ["g6", "p5"], "gpu_names": ["l4"], "capacity_types": ["spot"],
      "architectures": ["arm64"]},
     [{"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Gt", "values": ["3"]}, *BASE,
      {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
      {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]},
      {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
      {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["g6", "p5"]},
      {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["l4"]}]),
    ({"gpu_names": ["h100"]},
     [{"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Gt", "values": ["0"]}, *BASE,
      {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
      {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
      {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
      {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["h100"]}]),
])
def test_requirements_ask_for_at_least_the_gpu_count_and_narrow_only_when_told(requirements, expected):
    conf = pools_config(pool(requirements=requirements))
    assert render.requirements(conf.pools[0]) == expected


@pytest.mark.parametrize("weight, expected", [(None, None), (1, 1), (100, 100)])
def test_a_weight_is_set_only_when_configured(weight, expected):
    conf = pools_config(pool(weight=weight))
    spec = render.node_pool(conf.pools[0], conf.node_prep)["spec"]
    assert spec.get("weight") == expected and ("weight" in spec) is (weight is not None)


def test_the_plan_explains_a_pool_under_its_node_pool_only():
    conf = pools_config(pool(), pool(name="other"))
    desired = render.manifests(conf)
    gone = Ref("karpenter.sh/v1", "NodePool", "old")
    facts = ObjectsFacts(desired, {Ref.of(o): "missing" for o in desired}, [gone])
    changes = GpuPools().plan(context(conf), check_of(facts))
    assert [(c.verb, c.target.kind, c.target.name, c.details) for c in changes] == [
        (Verb.APPLY, "EC2NodeClass", "gpu", ()),
        (Verb.APPLY, "NodePool", "gpu", tuple(render.explain(conf.pools[0], conf.node_prep))),
        (Verb.APPLY, "EC2NodeClass", "other", ()),
        (Verb.APPLY, "NodePool", "other", tuple(render.explain(conf.pools[1], conf.node_prep))),
        (Verb.DELETE, "NodePool", "old", ())]
    assert changes[1].details[3] == "AMI al2023@latest  ← its NVIDIA variant on GPU instance types"
