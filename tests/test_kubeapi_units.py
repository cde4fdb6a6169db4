"""Table tests of the emulator's pure parts (selectors, patches, field sets, protobuf), and its command line."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.kubeapi import protobuf
from tests.kubeapi.patches import json_patch, merge_patch, strategic_merge
from tests.kubeapi.schema import SchemaSet
from tests.kubeapi.selectors import labels_match, parse_label_selector, selector_object_matches
from tests.kubeapi.ssa import apply, fieldset_of, from_fields_v1, to_fields_v1
from tests.kubeapi.util import ApiError
from tests.tools import tool_env

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = SchemaSet(31)
DEPLOYMENT = SCHEMAS.for_gvk("apps", "v1", "Deployment")
NODE = SCHEMAS.for_gvk("", "v1", "Node")
LABELS = {"app": "web", "tier": "front", "version": "3"}


@pytest.mark.unit
@pytest.mark.parametrize("selector, expected", [
    ("app=web", True), ("app==web", True), ("app!=web", False), ("app=db", False),
    ("tier in (front,back)", True), ("tier notin (front)", False), ("missing notin (x)", True),
    ("app", True), ("!app", False), ("!missing", True), ("app=web,tier=front", True), ("app=web,tier=back", False),
    ("version>2", True), ("version<3", False), ("", True),
])
def test_label_selector(selector, expected):
    assert labels_match(parse_label_selector(selector), LABELS) is expected


@pytest.mark.unit
@pytest.mark.parametrize("bad", ["app in web", "app=web,", "tier in (a"])
def test_label_selector_errors(bad):
    with pytest.raises(ApiError):
        parse_label_selector(bad)


@pytest.mark.unit
@pytest.mark.parametrize("selector, expected", [
    ({"matchLabels": {"app": "web"}}, True), ({}, True), (None, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}]}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, False),
])
def test_label_selector_objects(selector, expected):
    assert selector_object_matches(selector, LABELS) is expected


@pytest.mark.unit
@pytest.mark.parametrize("target, patch, expected", [
    ({"a": 1, "b": 2}, {"b": None}, {"a": 1}),
    ({"a": {"x": 1}}, {"a": {"y": 2}}, {"a": {"x": 1, "y": 2}}),
    ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),
])
def test_merge_patch(target, patch, expected):
    assert merge_patch(target, patch) == expected


def _deploy(*containers):
    return {"spec": {"template": {"spec": {"containers": [dict(c) for c in containers]}}}}


@pytest.mark.unit
@pytest.mark.parametrize("original, patch, expected", [
    (_deploy({"name": "a", "image": "1"}), _deploy({"name": "a", "image": "2"}), _deploy({"name": "a", "image": "2"})),
    # a new item goes before the live ones (apimachinery's normalizeElementOrder; seen on the real API server)
    (_deploy({"name": "a", "image": "1"}), _deploy({"name": "b", "image": "1"}),
     _deploy({"name": "b", "image": "1"}, {"name": "a", "image": "1"})),
    (_deploy({"name": "a"}, {"name": "b"}), _deploy({"name": "b", "image": "2"}, {"name": "c"}),
     _deploy({"name": "a"}, {"name": "b", "image": "2"}, {"name": "c"})),
    (_deploy({"name": "a"}, {"name": "b"}), _deploy({"name": "a", "$patch": "delete"}), _deploy({"name": "b"})),
    (_deploy({"name": "a"}, {"name": "b"}), _deploy({"$patch": "replace"}, {"name": "c"}), _deploy({"name": "c"})),
    (_deploy({"name": "a"}, {"name": "b"}),
     {"spec": {"template": {"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}]}}}},
     _deploy({"name": "b"}, {"name": "a"})),
    ({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}},
     {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}, {"spec": {"strategy": {"type": "Recreate"}}}),
])
def test_strategic_merge_patch(original, patch, expected):
    assert strategic_merge(original, patch, DEPLOYMENT) == expected


@pytest.mark.unit
def test_json_patch_escapes_and_moves():
    doc = {"metadata": {"labels": {"a/b": "1"}}}
    out = json_patch(doc, [{"op": "move", "from": "/metadata/labels/a~1b", "path": "/metadata/labels/c"}])
    assert out == {"metadata": {"labels": {"c": "1"}}} and doc == {"metadata": {"labels": {"a/b": "1"}}}


@pytest.mark.unit
def test_fieldset_uses_list_keys_and_round_trips_fields_v1():
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x", "labels": {"a": "b"}},
              "spec": {"replicas": 1, "template": {"spec": {"containers": [
                  {"name": "c", "image": "i", "ports": [{"containerPort": 80}]}]}}}}
    fields = fieldset_of(deploy, DEPLOYMENT)
    v1 = to_fields_v1(fields)
    container = v1["f:spec"]["f:template"]["f:spec"]["f:containers"]['k:{"name":"c"}']
    assert container["."] == {} and container["f:image"] == {}
    assert 'k:{"containerPort":80,"protocol":"TCP"}' in container["f:ports"]
    assert v1["f:metadata"] == {"f:labels": {"f:a": {}}}
    assert from_fields_v1(v1) == fields


@pytest.mark.unit
def test_apply_on_atomic_list_replaces_it_whole():
    live = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
            "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}}
    live = apply(None, live, "one", False, NODE, "v1", "t")
    result = apply(live, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
                          "spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}}, "one", False, NODE, "v1", "t")
    assert result["spec"]["taints"] == [{"key": "b", "effect": "NoSchedule"}]


@pytest.mark.unit
@pytest.mark.parametrize("obj", [
    {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "n", "labels": {"a": "b"},
                                                        "creationTimestamp": "2026-01-02T03:04:05Z"},
     "type": "Opaque", "data": {"k": "dmFsdWU="}},
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "finalizers": ["x/y"]}, "data": {"a": "b"}},
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}, "spec": {"finalizers": ["kubernetes"]}},
    {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground", "gracePeriodSeconds": 0},
])
def test_protobuf_round_trip(obj):
    assert protobuf.decode(protobuf.encode(obj)) == obj


@pytest.mark.unit
def test_protobuf_of_an_unsupported_kind_is_415():
    envelope = protobuf.MAGIC + protobuf.encode_message("Unknown", {"typeMeta": {"apiVersion": "apps/v1",
                                                                                 "kind": "Deployment"}})
    with pytest.raises(ApiError) as raised:
        protobuf.decode(envelope)
    assert raised.value.code == 415


@pytest.mark.tools
def test_serve_prints_one_ready_line_and_stops_on_sigterm(tmp_path):
    kubeconfig = tmp_path / "kc"
    process = subprocess.Popen([sys.executable, "-m", "tests.kubeapi", "serve", "--kubeconfig", str(kubeconfig),
                                "--gpu-nodes", "g1,g2", "--gpus-per-node", "8"], cwd=ROOT, env=tool_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("ready https://127.0.0.1:")
        config = yaml.safe_load(kubeconfig.read_text())
        assert config["clusters"][0]["cluster"]["server"] == line.split()[1]
        assert oct(kubeconfig.stat().st_mode & 0o777) == "0o600"
        from tests.tools import run, tool
        out = run([tool("kubectl"), "--kubeconfig", str(kubeconfig), "get", "nodes", "-o",
                   "custom-columns=NAME:.metadata.name,GPU:.status.allocatable.nvidia\\.com/gpu", "--no-headers"],
                  tool_env(tmp_path)).stdout
        assert out.split() == ["g1", "8", "g2", "8"]
    finally:
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=10)
    assert process.returncode == 0 and rest == ""


def test_jcopy_copies_every_level_and_shares_nothing():
    """The emulator's stored objects must not share parts with their copies (a caller's edit would reach the store),
    even where the original shares one dict in two places."""
    from tests.kubeapi.util import jcopy
    shared = {"k": [1, 2.5, True, None, "s"]}
    original = {"a": shared, "b": shared, "c": [shared]}
    copy = jcopy(original)
    assert copy == original
    copy["a"]["k"].append("x")
    assert original["a"]["k"] == [1, 2.5, True, None, "s"] and copy["b"]["k"] == [1, 2.5, True, None, "s"]
    assert type(copy["a"]["k"][2]) is bool and type(copy["a"]["k"][1]) is float
