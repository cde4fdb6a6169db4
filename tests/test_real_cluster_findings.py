"""Bugs the real API server (tests/localcluster) exposed in gpu-bootstrap, each pinned here without a host, so that
the fast loop catches a return; tests/live shows each on the real control plane.
"""
from __future__ import annotations

import pytest

from gpu_bootstrap.steps.gpu_operator import operand_problems
from gpu_bootstrap.render.monitoring import kubelet_service_of

pytestmark = pytest.mark.unit

GPU_NODE = {"metadata": {"name": "gpu-1"}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}}


def daemonset(name: str, desired: int, current: int, ready: int) -> dict:
    return {"metadata": {"name": name}, "status": {"desiredNumberScheduled": desired,
                                                   "currentNumberScheduled": current, "numberReady": ready}}


def test_an_operand_whose_pods_were_never_created_is_not_ready_even_where_the_node_advertises_gpus():
    """Found on the real API server: the gpu-operator stand-in's DaemonSets named ServiceAccounts that did not exist,
    the ServiceAccount admission plugin refused every pod, and since KWOK's nodes advertise their GPUs from the start
    (as a node with a device plugin already running does), the step passed with no operand running."""
    nodes = {"gpu-1": GPU_NODE}
    broken = [daemonset("nvidia-device-plugin-daemonset", 1, 0, 0), daemonset("nvidia-dcgm-exporter", 1, 0, 0)]
    problems = operand_problems(broken, [], nodes, "gpu-operator")
    assert any("nvidia-device-plugin-daemonset has 0 of 1 pod(s)" in p for p in problems), problems
    assert any("nvidia-dcgm-exporter has 0 of 1 pod(s)" in p and "describe daemonset" in p for p in problems)
    healthy = [daemonset("nvidia-device-plugin-daemonset", 1, 1, 1), daemonset("nvidia-dcgm-exporter", 1, 1, 1)]
    assert operand_problems(healthy, [], nodes, "gpu-operator") == []


def test_pods_that_exist_but_are_not_ready_are_reported_by_pod_not_twice():
    nodes = {"gpu-1": GPU_NODE}
    pod = {"metadata": {"name": "nvidia-dcgm-exporter-x1", "labels": {"app": "nvidia-dcgm-exporter"}},
           "spec": {"nodeName": "gpu-1"}, "status": {"phase": "Pending"}}
    problems = operand_problems([daemonset("nvidia-device-plugin-daemonset", 1, 1, 1),
                                 daemonset("nvidia-dcgm-exporter", 1, 1, 0)], [pod], nodes, "gpu-operator")
    assert len(problems) == 1 and "on gpu-1" in problems[0], problems


def selecting(ds: dict, **selector) -> dict:
    ds["spec"] = {"template": {"spec": {"nodeSelector": selector}}}
    return ds


@pytest.mark.parametrize("mps_capable, problems", [(None, 0), ("true", 1)])
def test_the_mps_control_daemon_is_meant_only_for_nodes_gpu_feature_discovery_marks_mps_capable(mps_capable,
                                                                                                problems):
    """Found by NVIDIA's real controller (tests/test_gpu_operator_real.py): it creates
    nvidia-device-plugin-mps-control-daemon on every install, selecting nvidia.com/mps.capable=true, which only
    nodes with MPS sharing carry; `up` waited for it on every GPU node and failed after its timeout. The stand-in
    never made it. The operator's gpu.deploy.* switch still counts as 'not labelled yet'."""
    labels = {"nvidia.com/gpu.present": "true", **({"nvidia.com/mps.capable": mps_capable} if mps_capable else {})}
    nodes = {"gpu-1": {**GPU_NODE, "metadata": {"name": "gpu-1", "labels": labels}}}
    found = operand_problems([daemonset("nvidia-device-plugin-daemonset", 1, 1, 1),
                              selecting(daemonset("nvidia-device-plugin-mps-control-daemon", 0, 0, 0),
                                        **{"nvidia.com/gpu.deploy.device-plugin": "true",
                                           "nvidia.com/mps.capable": "true"})], [], nodes, "gpu-operator")
    assert len(found) == problems, found
    if problems:
        assert "mps-control-daemon is scheduled on 0 of 1 GPU nodes" in found[0]
    unlabelled = selecting(daemonset("nvidia-device-plugin-daemonset", 0, 0, 0),
                           **{"nvidia.com/gpu.deploy.device-plugin": "true"})
    assert any("scheduled on 0 of 1" in p for p in operand_problems([unlabelled], [], nodes, "gpu-operator"))


@pytest.mark.parametrize("args, expected", [
    (["--kubelet-service=kube-system/kube-prometheus-stack-kubelet", "--localhost=127.0.0.1"],
     ("kube-system", "kube-prometheus-stack-kubelet")),
    (["--kubelet-service=monitoring/mine-kubelet"], ("monitoring", "mine-kubelet")),
    (["--kubelet-service="], None),
    (["--localhost=127.0.0.1"], None),
])
def test_the_operators_kubelet_service_is_read_from_its_flag(args, expected):
    """Found on the real cluster: the Prometheus Operator of the stack we install makes <release>-kubelet in
    kube-system, outside the release, and `helm uninstall` left it behind after teardown."""
    deployment = {"spec": {"template": {"spec": {"containers": [{"name": "operator", "args": args}]}}}}
    assert kubelet_service_of([{"spec": {}}, deployment]) == expected
