"""render/live_diff.py: a chart's rendered objects against the live ones, for a plan that may not read the helm
release's record (its Secret). Pure; table-tested."""
from __future__ import annotations

import pytest

from gpu_bootstrap.render import live_diff

pytestmark = pytest.mark.unit


def deployment(image="x:1", memory="1024Mi", extra=None):
    container = {"name": "c", "image": image, "resources": {"limits": {"memory": memory}},
                 "ports": [{"containerPort": 80}]}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "a", "namespace": "n"},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [container], **(extra or {})}}}}


def live_of(doc, **changes):
    import copy
    live = copy.deepcopy(doc)
    live["metadata"].update(uid="u", resourceVersion="9", annotations={"deployment.kubernetes.io/revision": "3"})
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["ports"][0]["protocol"] = "TCP"  # defaults the server adds
    container.update(changes)
    live["status"] = {"readyReplicas": 1}
    return {("Deployment", "n", "a"): live}


@pytest.mark.parametrize("live_changes, expected", [
    ({}, []),  # defaults and status only: the same
    ({"resources": {"limits": {"memory": "1Gi"}}}, []),  # a quantity in its canonical form
    ({"image": "x:2"}, ["Deployment n/a: spec.template.spec.containers[c].image: the live value differs from the rendered one"]),
    ({"resources": {"limits": {"memory": "2Gi"}}},
     ["Deployment n/a: spec.template.spec.containers[c].resources.limits.memory: the live value differs from the "
      "rendered one"]),
])
def test_only_what_the_chart_sets_counts(live_changes, expected):
    rendered = deployment()
    assert live_diff.compare([rendered], live_of(rendered, **live_changes), "n").differences == expected


def test_missing_objects_secrets_and_hooks():
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "n"}, "data": {"k": "dg=="}}
    hook = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "n",
                                                                  "annotations": {"helm.sh/hook": "post-install"}}}
    diff = live_diff.compare([deployment(), secret, hook], {("Deployment", "n", "a"): None}, "n")
    assert diff.missing == ["Deployment n/a"] and not diff.same
    assert diff.not_compared == ["Secret n/s", "Job n/j"]
    state = live_diff.release_state(diff, "v26.7.0")
    assert state["up_to_date"] is False and "missing Deployment n/a" in state["reason"]


def test_an_up_to_date_release_says_what_it_did_not_compare():
    rendered = deployment()
    hook = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "n",
                                                                  "annotations": {"helm.sh/hook": "post-install"}}}
    state = live_diff.release_state(live_diff.compare([rendered, hook], live_of(rendered), "n"), "v1")
    assert state == {"up_to_date": True, "installed": "v1", "reason": "its live objects match the chart rendered "
                     "with these values; not compared: 1 object(s) (Secrets, hooks)"}


def test_a_number_stored_as_its_string_and_a_list_by_name():
    rendered = deployment(extra={"tolerations": [{"key": "a", "operator": "Exists"}]})
    live = live_of(rendered)
    live[("Deployment", "n", "a")]["spec"]["replicas"] = "1"
    assert live_diff.compare([rendered], live, "n").differences == []
    live[("Deployment", "n", "a")]["spec"]["template"]["spec"]["tolerations"] = []
    assert live_diff.compare([rendered], live, "n").differences == [
        "Deployment n/a: spec.template.spec.tolerations: the live value differs from the rendered one"]


def test_nulls_and_the_zero_values_the_server_omits_are_not_differences():
    """Found on the real API server: charts render `annotations: null`, `hostNetwork: false`,
    `initialDelaySeconds: 0`, `revisionHistoryLimit: null`; the stored object omits them or has defaults."""
    rendered = deployment(extra={"hostNetwork": False, "dnsConfig": None})
    rendered["metadata"]["annotations"] = None
    rendered["spec"]["revisionHistoryLimit"] = None
    rendered["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] = {"initialDelaySeconds": 0,
                                                                           "periodSeconds": 10}
    live = live_of(rendered)
    live_spec = live[("Deployment", "n", "a")]["spec"]
    live_spec["revisionHistoryLimit"] = 10
    del live_spec["template"]["spec"]["hostNetwork"], live_spec["template"]["spec"]["dnsConfig"]
    del live_spec["template"]["spec"]["containers"][0]["livenessProbe"]["initialDelaySeconds"]
    assert live_diff.compare([rendered], live, "n").differences == []
    live_spec["template"]["spec"]["containers"][0]["livenessProbe"]["periodSeconds"] = 30
    assert live_diff.compare([rendered], live, "n").differences == [
        "Deployment n/a: spec.template.spec.containers[c].livenessProbe.periodSeconds: the live value differs from the "
        "rendered one"]


def test_a_checksum_annotation_is_not_compared():
    """grafana's `checksum/secret` hashes a Secret whose password the chart generates at every render."""
    rendered = deployment()
    rendered["spec"]["template"]["metadata"] = {"annotations": {"checksum/secret": "aaa", "team": "gpu"}}
    live = live_of(rendered)
    live[("Deployment", "n", "a")]["spec"]["template"]["metadata"]["annotations"] = {"checksum/secret": "bbb",
                                                                                       "team": "ml"}
    assert live_diff.compare([rendered], live, "n").differences == [
        "Deployment n/a: spec.template.metadata.annotations.team: the live value differs from the rendered one"]


def test_a_difference_names_the_field_never_a_value():
    """A drift line of a chart's env password (found so: `env[GF_DATABASE_PASSWORD].value: rendered '…', live '…'`)
    names the path and says it differs; neither side's value is printed, whatever the key is called."""
    rendered = deployment()
    rendered["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "GF_DATABASE_PASSWORD", "value": "rendered-s3cret"}, {"name": "PLAIN", "value": "one-value"},
        {"name": "GONE", "value": "was-here"}]
    live = live_of(rendered)
    live[("Deployment", "n", "a")]["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "GF_DATABASE_PASSWORD", "value": "live-s3cret"}, {"name": "PLAIN", "value": {"nested": "map-value"}},
        {"name": "GONE"}]
    found = live_diff.compare([rendered], live, "n").differences
    prefix = "Deployment n/a: spec.template.spec.containers[c].env"
    assert found == [f"{prefix}[GF_DATABASE_PASSWORD].value: the live value differs from the rendered one",
                     f"{prefix}[PLAIN].value: the live value is a map, the chart renders a value",
                     f"{prefix}[GONE].value: not set on the live object"]
    shown = " ".join(found) + live_diff.release_state(live_diff.compare([rendered], live, "n"), "1.0")["reason"]
    for value in ("s3cret", "one-value", "map-value", "was-here"):
        assert value not in shown
