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


def pins():
    from gpu_bootstrap.app.rbac import probe_pins
    from gpu_bootstrap.core import config as cfg
    return probe_pins(cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}, {"name": "gpu-2"}]}))


def admitted(command: str, req: dict, obj=None, old=None, pinned=None) -> bool:
    policy = identity_policy.manifests(command, "ci/bot", pinned)[0]["spec"]
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


# --- the probe's objects exactly as it makes them (rbac --for probe pins them) ----------------------------------------
def probe_objects(node: str = "gpu-1") -> tuple[dict, dict, dict]:
    """The namespace, ConfigMap and pod the in-cluster probe makes for one run, as adapters/cluster_probe.py does."""
    from gpu_bootstrap.core.catalogue import locate
    from gpu_bootstrap.probes import incluster
    from gpu_bootstrap.probes.script import build, command_timeout, new_marker
    image = locate(pins().image)
    return (incluster.namespace_manifest("ab12", "host:1", 1), incluster.script_manifest("ab12", build(
        new_marker(), command_timeout(120))), incluster.pod_manifest("ab12", node, 0, image))


def judged(kind: str, obj: dict) -> bool:
    namespace = "" if kind == "namespaces" else "gpu-bootstrap-probe-ab12"
    name = obj["metadata"]["name"]
    return admitted("probe", request(resource=kind, namespace=namespace, name=name), obj, None, pins())


def changed(obj: dict, change) -> dict:
    import copy
    obj = copy.deepcopy(obj)
    change(obj)
    return obj


def test_the_probe_identity_makes_the_probes_objects_exactly_and_nothing_like_them():
    """The probe identity is root on the configured GPU nodes, not cluster-admin: its namespace must carry exactly
    the probe's labels (no Pod Security label of its own choosing elsewhere), its ConfigMap must hold this
    gpu-bootstrap's probe script (what the pod's shell runs as root), and its pods must be the probe's: on a
    configured GPU node, the probe's image and commands, no host namespace, the host's / read-only."""
    namespace, script, pod = probe_objects()
    assert judged("namespaces", namespace) and judged("configmaps", script) and judged("pods", pod)
    refused = {
        "a label of its own": ("namespaces", changed(namespace, lambda o: o["metadata"]["labels"].update(
            {"team": "x"}))),
        "another run's label": ("namespaces", changed(namespace, lambda o: o["metadata"]["labels"].update(
            {"gpu-bootstrap.io/probe-run": "zz99"}))),
        "another script": ("configmaps", changed(script, lambda o: o["data"].update(
            {"probe.sh": o["data"]["probe.sh"].replace("exit 0", "cat /host/etc/kubernetes/admin.conf; exit 0")}))),
        "a second key": ("configmaps", changed(script, lambda o: o["data"].update({"other": "x"}))),
        "a node not configured": ("pods", probe_objects("control-plane")[2]),
        "another image": ("pods", changed(pod, lambda o: o["spec"]["containers"][0].update({"image": "alpine"}))),
        "another command": ("pods", changed(pod, lambda o: o["spec"]["initContainers"][0].update(
            {"command": ["sh", "-c", "cat /host/etc/shadow"]}))),
        "args beside the command": ("pods", changed(pod, lambda o: o["spec"]["containers"][0].update(
            {"args": ["x"]}))),
        "hostPID": ("pods", changed(pod, lambda o: o["spec"].update({"hostPID": True}))),
        "hostNetwork": ("pods", changed(pod, lambda o: o["spec"].update({"hostNetwork": True}))),
        "the host writable": ("pods", changed(pod, lambda o: o["spec"]["initContainers"][0]["volumeMounts"][0].update(
            {"readOnly": False}))),
        "another hostPath": ("pods", changed(pod, lambda o: o["spec"]["volumes"].append(
            {"name": "kubelet", "hostPath": {"path": "/var/lib/kubelet"}}))),
        "an ephemeral container": ("pods", changed(pod, lambda o: o["spec"].update(
            {"ephemeralContainers": [{"name": "e", "image": "alpine"}]}))),
    }
    assert {what: judged(kind, obj) for what, (kind, obj) in refused.items()} == {what: False for what in refused}
