"""The admission policies `rbac` prints for the kept identities (security/identity_policy.py), evaluated on a real
CEL runtime (tests/kubeapi/cel.py) over the requests an attacker would send: the matchCondition picks exactly the
identity, and the validation lets through only dry runs (and, for the probe identity, the probe's own objects). The
live suite applies the same policies on the real API server and attacks them (tests/live/test_attacks.py)."""
from __future__ import annotations

import pytest

from gpu_bootstrap.security import identity_policy
from tests.kubeapi import cel

pytestmark = pytest.mark.unit
USER = "system:serviceaccount:ci:bot"


@pytest.fixture(autouse=True)
def runtime():
    if not cel.available():
        pytest.skip("the CEL runtime (pip package cel-expr-python) is not installed")


def request(operation="CREATE", group="", resource="configmaps", namespace="default", name="x", dry=False,
            user=USER, sub=""):
    found = {"operation": operation, "resource": {"group": group, "version": "v1", "resource": resource},
             "name": name, "userInfo": {"username": user}, "dryRun": dry}
    if namespace:
        found["namespace"] = namespace
    if sub:
        found["subResource"] = sub
    return found


def admitted(command: str, req: dict, obj=None, old=None) -> bool:
    policy = identity_policy.manifests(command, "ci/bot")[0]["spec"]
    variables = {"request": req, "object": obj, "oldObject": old}
    if not all(cel.truth(c["expression"], **variables) for c in policy["matchConditions"]):
        return True  # another identity: not this policy's business
    return all(cel.truth(v["expression"], **variables) for v in policy["validations"])


PROBE_LABELS = {"gpu-bootstrap.io/component": "node-probe"}


@pytest.mark.parametrize("command", ["dry-run", "doctor"])
def test_a_dry_identity_writes_nothing_for_real(command):
    assert admitted(command, request(dry=True))
    assert not admitted(command, request())
    assert not admitted(command, request(operation="DELETE", resource="namespaces", namespace="", name="default"))
    assert not admitted(command, request(operation="CONNECT", resource="pods", sub="exec"))
    assert admitted(command, request(user="system:serviceaccount:ci:other"))  # someone else


@pytest.mark.parametrize("req, obj, old, ok", [
    (request(resource="namespaces", namespace="", name="gpu-bootstrap-probe-ab12"),
     {"metadata": {"name": "gpu-bootstrap-probe-ab12", "labels": PROBE_LABELS}}, None, True),
    (request(resource="namespaces", namespace="", name="gpu-bootstrap-probe-ab12"),  # the prefix, not the labels
     {"metadata": {"name": "gpu-bootstrap-probe-ab12"}}, None, False),
    (request(resource="namespaces", namespace="", name="tenant"), {"metadata": {"name": "tenant",
                                                                              "labels": PROBE_LABELS}}, None, False),
    (request(operation="DELETE", resource="namespaces", namespace="", name="gpu-bootstrap-probe-ab12"), None,
     {"metadata": {"name": "gpu-bootstrap-probe-ab12", "labels": PROBE_LABELS}}, True),
    (request(operation="DELETE", resource="namespaces", namespace="", name="kube-system"), None,
     {"metadata": {"name": "kube-system"}}, False),
    (request(namespace="gpu-bootstrap-probe-ab12"), {}, None, True),
    (request(resource="pods", namespace="gpu-bootstrap-probe-ab12"), {}, None, True),  # one pod per node
    (request(resource="pods", namespace="kube-system"), {}, None, False),
    (request(group="apps", resource="daemonsets", namespace="gpu-bootstrap-probe-ab12"), {}, None, False),
    (request(resource="pods", sub="binding", namespace="gpu-bootstrap-probe-ab12"), {}, None, False),
    (request(operation="UPDATE", namespace="gpu-bootstrap-probe-ab12"), {}, {}, False),
    (request(group="rbac.authorization.k8s.io", resource="clusterrolebindings", namespace=""), {}, None, False),
    (request(group="apps", resource="daemonsets", namespace="kube-system", dry=True), {}, None, True),
])
def test_the_probe_identity_writes_for_real_only_the_probes_own_objects(req, obj, old, ok):
    assert admitted("probe", req, obj, old) is ok
