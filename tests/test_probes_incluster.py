"""The cluster probe's pure parts (probes/incluster.py): the result slices a pod's termination messages carry are
checked before anything is decoded, and a probe that did not finish says why, never "no driver"."""
from __future__ import annotations

import base64
import gzip
import re

import pytest

from gpu_bootstrap.probes import incluster
from gpu_bootstrap.probes.incluster import SLICE_BYTES, SLICES, decode, why_unfinished

pytestmark = pytest.mark.unit


def pod(payload: str, cut: dict | None = None, codes: dict | None = None, count: int | None = None) -> dict:
    """A pod as the kubelet reports it after the probe's shell ran; `payload` is "<rc>\\n<stderr>\\n<stdout>"."""
    rc, error, output = payload.split("\n", 2)
    messages = incluster.encode(output, int(rc), error)
    if count:
        messages = [re.sub(r"^(gb1 \d+) \d+ ", rf"\g<1> {count} ", m) for m in messages]
    statuses = []
    for index, message in enumerate(messages):
        if cut and index in cut:
            message = message[:cut[index]]
        statuses.append({"name": "probe" if index == 0 else f"result-{index}",
                         "state": {"terminated": {"exitCode": (codes or {}).get(index, 0), "message": message}}})
    return {"spec": {"nodeName": "n1"}, "status": {"initContainerStatuses": statuses}}


def test_a_result_round_trips():
    outcome = decode(pod("0\n\nsection output\nmore\n"))
    assert outcome.finished and outcome.output == "section output\nmore\n" and outcome.rc == 0


def test_a_cut_slice_is_incomplete_not_truncated_output():
    payload = "0\n\n" + "".join(f"{i * 7919 % 10007:05d}" for i in range(1200))  # two slices' worth
    assert SLICE_BYTES < len(base64.b64encode(gzip.compress(payload.encode()))) < 2 * SLICE_BYTES
    outcome = decode(pod(payload, cut={1: 200}))
    assert not outcome.finished and "arrived incomplete" in outcome.reason


def test_a_result_larger_than_the_slices_says_so():
    outcome = decode(pod("0\n\nx", count=SLICES + 1))
    assert not outcome.finished and "too large" in outcome.reason and "preflight.via: ssh" in outcome.reason


def test_a_failed_probe_container_is_unknown_with_its_exit_code():
    outcome = decode(pod("0\n\nx", codes={0: 126}))
    assert not outcome.finished and "exited with 126" in outcome.reason


def test_a_host_without_a_shell_is_unknown():
    outcome = decode(pod("127\nchroot: can't execute '/bin/sh': No such file or directory \n"))
    assert not outcome.finished and "no /bin/sh" in outcome.reason


def test_a_message_that_is_no_probe_result_is_refused():
    broken = pod("0\n\nx")
    broken["status"]["initContainerStatuses"][1]["state"]["terminated"]["message"] = '{"partial": "json'
    outcome = decode(broken)
    assert not outcome.finished and "not a probe result" in outcome.reason


NODE_READY = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
NODE_GONE = {"status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}}


@pytest.mark.parametrize("pod_status, node, expected", [
    (None, None, "not in the cluster"),
    (None, NODE_GONE, "probe pod is gone"),
    ({"spec": {"nodeName": "n1"}, "status": {"phase": "Failed", "reason": "OutOfpods", "message": "Pod was rejected: "
                                             "Node didn't have enough resource: pods"}}, NODE_READY,
     "kubelet refused the probe pod (OutOfpods: Pod was rejected: Node didn't have enough resource: pods)"),
    ({"spec": {"nodeName": "n1"}, "status": {"initContainerStatuses": [
        {"name": "probe", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling"}}}]}},
     NODE_READY, "image busybox:1.37.0 cannot be pulled"),
    ({"spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}}, NODE_GONE, "NotReady (NodeStatusUnknown)"),
    ({"spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}}, NODE_READY, "did not finish within"),
])
def test_why_a_probe_did_not_finish(pod_status, node, expected):
    assert expected in why_unfinished(pod_status, node, "busybox:1.37.0", 5)


def test_every_slice_fits_the_kubelets_limits():
    """Header and slice together stay within 4,096 bytes per container and an even share of 12 KiB per pod."""
    containers = SLICES + 1
    assert SLICE_BYTES + incluster.HEADER_ROOM <= min(4096, 12 * 1024 // containers)
    longest = f"gb1 {SLICES - 1} {SLICES} {incluster.CAPACITY} {'f' * 16}\n"
    assert len(longest) <= incluster.HEADER_ROOM


@pytest.mark.parametrize("document, flags, expected", [
    ({"nodes": [{"name": "a"}]}, {}, "cluster"),  # auto, nothing says how to reach the nodes over SSH
    ({"nodes": [{"name": "a"}], "ssh": {"user": "ops"}}, {}, "ssh"),  # an ssh section
    ({"nodes": [{"name": "a", "address": "10.0.0.5"}]}, {}, "ssh"),  # a node address
    ({"nodes": [{"name": "a"}]}, {"no_cluster": True}, "ssh"),  # no cluster to ask
    ({"nodes": [{"name": "a"}], "ssh": {}}, {"via": "cluster"}, "cluster"),  # the flag wins
    ({"nodes": [{"name": "a"}], "preflight": {"via": "ssh"}}, {}, "ssh"),  # the config's choice
])
def test_which_way_preflight_reads_the_nodes(document, flags, expected):
    from gpu_bootstrap.app.commands import Options, probe_via
    from gpu_bootstrap.core.config import Config
    assert probe_via(Options(**flags), Config.model_validate(document)) == expected


def test_via_cluster_without_a_cluster_is_bad_input():
    from gpu_bootstrap.app.commands import Options, probe_via
    from gpu_bootstrap.core.config import Config
    from gpu_bootstrap.core.errors import UsageError
    with pytest.raises(UsageError, match="--no-cluster"):
        probe_via(Options(via="cluster", no_cluster=True), Config.model_validate({"nodes": [{"name": "a"}]}))


def test_the_leftover_selector_matches_every_runs_namespace():
    labels = incluster.namespace_manifest("r1", "host:1", 0)["metadata"]["labels"]
    assert all(labels[key] == value for key, value in (pair.split("=") for pair in incluster.SELECTOR.split(",")))
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def _probe_pod(node: str, uid: str, phase: str = "Pending", deleting: bool = False) -> dict:
    meta = {"name": f"probe-{node}", "uid": uid, **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase}}


@pytest.mark.parametrize("events, by_node, settled", [
    ([("ADDED", _probe_pod("a", "1"))], {"a": "1"}, set()),
    ([("ADDED", _probe_pod("a", "1")), ("MODIFIED", _probe_pod("a", "1", "Failed"))], {"a": "1"}, {"a"}),
    # a pod being deleted, or gone, no longer stands for its node, nor counts as settled
    ([("MODIFIED", _probe_pod("a", "1", "Failed")), ("MODIFIED", _probe_pod("a", "1", "Failed", deleting=True))],
     {}, set()),
    ([("MODIFIED", _probe_pod("a", "1", "Failed")), ("DELETED", _probe_pod("a", "1", "Failed"))], {}, set()),
    # the deletion of an older pod of the node leaves its newer one alone
    ([("ADDED", _probe_pod("a", "2", "Failed")), ("DELETED", _probe_pod("a", "1"))], {"a": "2"}, {"a"}),
    # a pod for a node not asked about is not counted
    ([("ADDED", _probe_pod("z", "9", "Failed"))], {}, set()),
])
def test_probe_pods_follow_events_and_count_the_settled_ones(events, by_node, settled):
    from gpu_bootstrap.adapters.cluster_probe import ProbePods
    pods = ProbePods(["a", "b"])
    for kind, pod in events:
        pods.take(kind, pod)
    assert {node: pod["metadata"]["uid"] for node, pod in pods.by_node.items()} == by_node
    assert pods.settled == settled and not pods.all_settled
    pods.take("ADDED", _probe_pod("a", "3", "Failed"))
    pods.take("ADDED", _probe_pod("b", "4", "Failed"))
    assert pods.all_settled
