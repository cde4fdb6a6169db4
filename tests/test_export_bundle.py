"""app/export/bundle.py and app/export/mirror.py, pure: changes in, units out; an image list in, the tools' files
out."""
from __future__ import annotations

import pytest
import yaml

from gpu_bootstrap.app.export import bundle, mirror
from gpu_bootstrap.app.images import ImageList
from gpu_bootstrap.pipeline.step import Change
from gpu_bootstrap.core.refs import Ref, Verb

pytestmark = pytest.mark.unit


def obj(kind: str, name: str, namespace: str | None = None) -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "v1", "kind": kind, "metadata": meta}


def apply(o: dict) -> Change:
    return Change(Verb.APPLY, Ref.of(o), "create", body=o)


def release(name: str, values: dict, derived=()) -> Change:
    body = {"release": name, "namespace": "ns", "chart": {"ref": name, "repo": "https://charts.example", "version": "1"},
            "values": values, "derived": list(derived)}
    return Change(Verb.HELM_UPGRADE, Ref.release(name, "ns"), "install", body=body)


def test_a_step_with_objects_around_a_chart_becomes_three_units_in_order():
    submitted = [("node-prep", Change(Verb.PATCH, Ref.node("n1"), "taint", body={"spec": {"taints": []}})),
                 ("monitoring", apply(obj("Namespace", "monitoring"))),
                 ("monitoring", release("kps", {})),
                 ("monitoring", apply(obj("ConfigMap", "dash", "monitoring"))),
                 ("monitoring", apply(obj("CustomResourceDefinition", "x.example"))),
                 ("gpu-operator", Change(Verb.PATCH, Ref.node("n1"), "record",
                                         body={"metadata": {"annotations": {"gpu-bootstrap.io/labels-before": "[]"}}})),
                 ("gpu-operator", release("gpu-operator", {})),
                 ("validate", apply(obj("Namespace", "gpu-bootstrap"))),
                 ("validate", Change(Verb.CREATE, Ref("v1", "Pod", "p", "gpu-bootstrap"), "run", body={}))]
    made = bundle.build(submitted, "1.33.0", "flux", run_steps={"validate"})
    assert [(u.id, u.wave) for u in made.units] == [("monitoring", 0), ("monitoring-kps", 1),
                                                    ("monitoring-2", 2), ("gpu-operator-gpu-operator", 3)]
    assert [o["kind"] for o in made.units[2].objects] == ["CustomResourceDefinition", "ConfigMap"]  # CRDs first
    assert made.units[2].objects[1]["metadata"]["annotations"]["gpu-bootstrap.io/exported-to"] == "flux"
    assert list(made.imperative) == ["node-prep", "validate"]  # the operator's node record is up's bookkeeping
    assert len(made.imperative["validate"]) == 2


import base64  # noqa: E402

PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA0Z3\n-----END RSA PRIVATE KEY-----\n"


@pytest.mark.parametrize("values, paths, kept", [
    ({"grafana": {"adminPassword": "x1", "enabled": True}}, ["grafana.adminPassword"],
     {"grafana": {"enabled": True}}),
    # a list holding a secret goes whole (helm replaces lists; the Secret's values document brings it back)
    ({"a": [{"url": "https://u:pw@host/x"}, {"url": "https://host"}], "b": [1]}, ["a[0].url"], {"b": [1]}),
    ({"node.kubernetes.io/x": {"token": "t"}}, ["node\\.kubernetes\\.io/x.token"], {"node.kubernetes.io/x": {}}),
    ({"plain": "value", "existingSecret": "name"}, [], {"plain": "value", "existingSecret": "name"}),
    # key names in the wider sense, any case, joined by _ - or .
    ({"x": {"PASSWD": "a", "db.pass": "b", "Api-Key": "c", "key": "d", "Credential": "e", "auth_string": "f",
            "my_secret": "g", "token": "h", "authEnabled": True, "keyFile": "/k", "secretName": "s"}},
     ["x.PASSWD", "x.db\\.pass", "x.Api-Key", "x.key", "x.Credential", "x.auth_string", "x.my_secret", "x.token"],
     {"x": {"authEnabled": True, "keyFile": "/k", "secretName": "s"}}),
    # a toleration's and a selector's `key` name a label, not a secret
    ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}], "podAntiAffinityTopologyKey": "zone"}, [],
     {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}], "podAntiAffinityTopologyKey": "zone"}),
    # webhook URLs with a token in the path or the query, whatever their key (found: Alertmanager webhook_configs)
    ({"r": {"webhook": {"url": "https://alerts.example.com/hooks/3f9a8b7c6d5e4f3a2b1c"},
            "other": {"url": "https://h.example.com/x?sig=abc123"}, "plain": {"url": "http://svc.ns:8080/alert"}}},
     ["r.webhook.url", "r.other.url"], {"r": {"webhook": {}, "other": {}, "plain": {"url": "http://svc.ns:8080/alert"}}}),
    # --flag=value naming a secret, and a flag whose value is the next argument
    ({"extraArgs": ["--x-password=hunter2"]}, ["extraArgs[0]"], {}),
    ({"args": ["--db-password", "hunter2"], "keep": ["--log-level=2"]}, ["args[1]"], {"keep": ["--log-level=2"]}),
    # env entries whose name names a secret
    ({"env": {"GF_SECURITY_ADMIN_PASSWORD": "x"}, "extraEnv": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "y"}]},
     ["env.GF_SECURITY_ADMIN_PASSWORD", "extraEnv[0].value"], {"env": {}}),
    # PEM, plain and base64; htpasswd; user:pass; docker config JSON; a generated token under any key
    ({"a": PEM, "b": base64.b64encode(PEM.encode()).decode(), "c": "admin:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/",
      "d": "admin:hunter2", "e": '{"auths": {"r.example.com": {"auth": "dXNlcjpwYXNzd29yZA=="}}}',
      "f": "AbC123xYz987LmN4pQ", "image": "nginx:1.27", "addr": "host:8080"},
     ["a", "b", "c", "d", "e", "f"], {"image": "nginx:1.27", "addr": "host:8080"}),
])
def test_secret_values_are_split_out_by_their_helm_path(values, paths, kept):
    assert bundle.split_secrets(values)[:2] == (kept, paths)


def test_the_skeleton_brings_back_every_secret_and_whole_lists_without_a_value():
    values = {"grafana": {"grafana.ini": {"database": {"password": "s3cret-1", "host": "db"}}},
              "extraEnv": [{"name": "DB_SECRET", "value": "s3cret-2"}, {"name": "A", "value": "b"}]}
    _kept, paths, skeleton = bundle.split_secrets(values)
    assert skeleton == {"grafana": {"grafana.ini": {"database": {
                            "password": "<secret: grafana.grafana\\.ini.database.password>"}}},
                        "extraEnv": [{"name": "DB_SECRET", "value": "<secret: extraEnv[0].value>"},
                                     {"name": "A", "value": "b"}]}
    assert "s3cret" not in repr(skeleton) and len(paths) == 2


def test_a_value_decided_without_node_facts_is_named():
    made = bundle.build([("gpu-operator", release("gpu-operator", {}, [
        "driver.enabled=true  ← no node facts (offline without --preflight-report): the chart's default",
        "toolkit.enabled=false  ← n1: toolkit 1.17 with nvidia as the default runtime"]))], "1.33.0", "flux")
    assert bundle.values_without_facts(made) == ["gpu-operator: driver.enabled"]


def test_mirror_lists_hold_each_source_once_with_docker_hub_spelled_out():
    found = ImageList()
    for ref, who in (("quay.io/prometheus/prometheus:v3.14.0", "kps"), ("busybox:1.37.0@sha256:" + "a" * 64, "probe"),
                     ("nvcr.io/nvidia/gpu-operator:v26.7.0", "op"), ("nvcr.io/nvidia/gpu-operator:v26.7.0", "op2")):
        found.add(ref, "reg.local/m", who)
    found.mirror = "reg.local/m"
    sync = yaml.safe_load(mirror.skopeo(found))
    assert sync == {"docker.io": {"images": {"library/busybox": ["sha256:" + "a" * 64]}},
                    "nvcr.io": {"images": {"nvidia/gpu-operator": ["v26.7.0"]}},
                    "quay.io": {"images": {"prometheus/prometheus": ["v3.14.0"]}}}
    assert "skopeo sync --src yaml --dest docker skopeo-sync.yaml reg.local/m" in mirror.skopeo(found)
    hauler = yaml.safe_load(mirror.hauler(found))
    assert [i["name"] for i in hauler["spec"]["images"]] == mirror.sources(found) and len(mirror.sources(found)) == 3
    assert "registry://reg.local/m" in mirror.hauler(found)
    assert yaml.safe_load(mirror.zarf(found, "1.0.0"))["components"][0]["images"] == mirror.sources(found)
