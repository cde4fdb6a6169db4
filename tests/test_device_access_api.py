"""Device access with engine vap, on the API server itself (render.device_access_policies, created as `up` creates
them): pods as a tenant writes them, sent as server-side dry runs, on the emulator and on the real kube-apiserver 1.37
of the local cluster (tests/test_kubeapi_api.py's `emu` fixture). The ValidatingAdmissionPolicy refuses a pod that
chooses devices itself, naming the field (messageExpression); on the real server the MutatingAdmissionPolicy sets
NVIDIA_VISIBLE_DEVICES=void (the emulator stores MutatingAdmissionPolicies without running them) and an ephemeral
container added through the pods/ephemeralcontainers subresource is judged too. Engine opa with the same policy
beside it is the live stack's (tests/live/test_attacks.py: the tenant attacks).
"""
from __future__ import annotations

import time

import pytest

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.render import admission as render
from gpu_bootstrap.render import admission_policy as policy_render
from tests.localcluster.facade import RealEmu
from tests.test_claim_policies_api import emulator_options, engine  # noqa: F401 - 1.37, the real CEL runtime
from tests.test_kubeapi_api import api, emu  # noqa: F401 - the fixtures: emulator and real backends

PODS = "/api/v1/namespaces/default/pods"
GROUP = "/apis/admissionregistration.k8s.io/v1"
MAP_API = "admissionregistration.k8s.io/v1"
TOLERATE = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def pod(name: str, env=None, runtime: str = "", tolerations=None, extra_container: bool = False) -> dict:
    container = {"name": "c", "image": "registry.k8s.io/pause:3.10", **({"env": env} if env else {})}
    spec = {"containers": [container] + ([{"name": "side", "image": "registry.k8s.io/pause:3.10"}]
                                         if extra_container else [])}
    if runtime:
        spec["runtimeClassName"] = runtime
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def install(api, config) -> None:  # noqa: F811 - api: the fixture's client
    objects = render.device_access_policies(config, MAP_API, policy_render.of(config))
    for obj in objects:
        kind = obj["kind"]
        path = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies",
                "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
                "MutatingAdmissionPolicy": "mutatingadmissionpolicies",
                "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings"}[kind]
        answer = api.post(f"{GROUP}/{path}", obj)
        assert answer.status == 201, answer


def answer(api, obj: dict):  # noqa: F811
    return api.post(f"{PODS}?dryRun=All", obj)


def refused_for(api, obj: dict) -> str:  # noqa: F811
    """'admitted', or the field the refusal names."""
    found = answer(api, obj)
    if found.status == 201:
        return "admitted"
    message = found.json.get("message", "")
    assert found.status == 403 and "gpu-bootstrap admission" in message, (found.status, message)
    for field in ("spec.containers[c].env[NVIDIA_VISIBLE_DEVICES]", "spec.containers[c].env[NVIDIA_IMEX_CHANNELS]",
                  "spec.runtimeClassName"):
        if field in message:
            return field
    return message


def wait_until_refused(api, obj: dict, what: str) -> None:  # noqa: F811
    deadline = time.monotonic() + 120  # the real server takes up a new policy a moment later
    while refused_for(api, obj) == "admitted":
        assert time.monotonic() < deadline, f"the device-access policy did not take effect within 120 s ({what})"
        time.sleep(0.5)


def test_the_api_servers_policy_refuses_pods_that_choose_devices_and_names_the_field(emu, api):  # noqa: F811
    config = cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}], "admission": {"engine": "vap",
                                                                                    "mode": "enforce"}})
    if isinstance(emu, RealEmu):  # the RuntimeClass admission plugin refuses a pod naming one that does not exist
        for name in ("nvidia", "nvidia-legacy"):
            api.post("/apis/node.k8s.io/v1/runtimeclasses", {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                                             "metadata": {"name": name}, "handler": name})
    install(api, config)
    wait_until_refused(api, pod("probe", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]), "env")
    gpu = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
    assert {name: refused_for(api, obj) for name, obj in {
        "all": pod("a", [gpu]),
        "valueFrom": pod("b", [{"name": "NVIDIA_VISIBLE_DEVICES",
                                "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}]),
        "IMEX channels": pod("c", [{"name": "NVIDIA_IMEX_CHANNELS", "value": "0"}]),
        "void": pod("d", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]),
        "runtime class nvidia-legacy, no GPU": pod("e", runtime="nvidia-legacy"),
        "a CPU pod": pod("f"),
    }.items()} == {
        "all": "spec.containers[c].env[NVIDIA_VISIBLE_DEVICES]",
        "valueFrom": "spec.containers[c].env[NVIDIA_VISIBLE_DEVICES]",
        "IMEX channels": "spec.containers[c].env[NVIDIA_IMEX_CHANNELS]",
        "void": "admitted", "runtime class nvidia-legacy, no GPU": "spec.runtimeClassName", "a CPU pod": "admitted"}


def test_the_mutating_policy_voids_containers_given_no_gpu_and_ephemeral_containers_are_judged(emu, api):  # noqa: F811
    """Real server only (the emulator does not run MutatingAdmissionPolicies, nor serve pods/ephemeralcontainers):
    engine vap, mode mutate. A CPU pod that tolerates the GPU taint is admitted with NVIDIA_VISIBLE_DEVICES=void on
    every container; an ephemeral container that names GPUs is refused through the subresource, naming its field; a
    plain one is admitted with void."""
    if not isinstance(emu, RealEmu):
        pytest.skip("the emulator does not run MutatingAdmissionPolicies or serve pods/ephemeralcontainers (real only)")
    config = cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}], "admission": {"engine": "vap"}})
    install(api, config)
    wait_until_refused(api, pod("probe", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]), "env")
    deadline = time.monotonic() + 120
    while True:
        made = answer(api, pod("tolerating", tolerations=TOLERATE, extra_container=True))
        assert made.status == 201, made
        values = [{e["name"]: e.get("value") for e in c.get("env") or []}.get("NVIDIA_VISIBLE_DEVICES")
                  for c in made.json["spec"]["containers"]]
        if values == ["void", "void"]:
            break
        assert time.monotonic() < deadline, f"the mutating policy did not take effect within 120 s: {values}"
        time.sleep(0.5)
    gpu_pod = pod("gpu", tolerations=TOLERATE)
    gpu_pod["spec"]["schedulerName"] = "gpu-binpack-scheduler"
    gpu_pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    gpu_pod["spec"]["initContainers"] = [{"name": "init", "image": "registry.k8s.io/pause:3.10"}]
    made = answer(api, gpu_pod)  # its GPU container kept as written, its init container voided
    assert made.status == 201, made
    assert [c.get("env") for c in made.json["spec"]["containers"]] == [None], made.json["spec"]["containers"]
    assert made.json["spec"]["initContainers"][0]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    plain = answer(api, pod("plain"))  # cannot land on a GPU node: left as it is
    assert plain.status == 201 and "env" not in plain.json["spec"]["containers"][0], plain
    running = api.post(PODS, pod("running", tolerations=TOLERATE))
    assert running.status == 201, running
    ephemeral = dict(running.json)
    ephemeral["metadata"] = {k: v for k, v in running.json["metadata"].items() if k != "resourceVersion"}
    ephemeral["spec"] = {**running.json["spec"], "ephemeralContainers": [
        {"name": "dbg", "image": "registry.k8s.io/pause:3.10", "env": [{"name": "NVIDIA_VISIBLE_DEVICES",
                                                                       "value": "all"}]}]}
    refused = api.request("PUT", f"{PODS}/running/ephemeralcontainers", ephemeral)
    assert refused.status == 403 and "spec.ephemeralContainers[dbg].env[NVIDIA_VISIBLE_DEVICES]" in \
        refused.json["message"], refused
    ephemeral["spec"]["ephemeralContainers"][0].pop("env")
    added = api.request("PUT", f"{PODS}/running/ephemeralcontainers", ephemeral)
    assert added.status == 200, added
    [debug] = added.json["spec"]["ephemeralContainers"]
    assert debug.get("env") == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}], debug


def test_with_engine_vap_opas_namespace_is_no_hiding_place(emu, api):  # noqa: F811
    """Namespace squatting: with engine vap no OPA runs, so its namespace is not exempt; whoever may create namespaces
    and makes one by that name gets no unsteered GPU pods there (nor pods that choose devices). On the emulator and
    the real server; the namespace is made as a squatter would, before gpu-bootstrap ever ran."""
    config = cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}], "admission": {"engine": "vap",
                                                                                    "mode": "enforce"}})
    policy = policy_render.of(config)
    assert config.admission.opa.namespace not in policy.exempt_namespaces
    for obj in render.validating_policy(config, policy) + render.device_access_policies(config, None, policy):
        path = "validatingadmissionpolicies" if obj["kind"] == "ValidatingAdmissionPolicy" else \
            "validatingadmissionpolicybindings"
        assert api.post(f"{GROUP}/{path}", obj).status == 201
    squatted = config.admission.opa.namespace
    # another test on the shared server may be deleting a namespace of that name: the squatter waits it out
    deadline = time.monotonic() + 120
    while (existing := api.get(f"/api/v1/namespaces/{squatted}")).status == 200 and \
            existing.json["metadata"].get("deletionTimestamp"):
        assert time.monotonic() < deadline, f"namespace {squatted} still terminating after 120 s"
        time.sleep(0.5)
    made = api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": squatted}})
    assert made.status in (201, 409), made
    gpu = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "squat", "namespace": squatted},
           "spec": {"containers": [{"name": "c", "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    deadline = time.monotonic() + 120
    while (found := api.post(f"/api/v1/namespaces/{squatted}/pods?dryRun=All", gpu)).status == 201:
        assert time.monotonic() < deadline, "the policies did not take effect within 120 s"
        time.sleep(0.5)
    assert found.status == 403 and "spec.schedulerName" in found.json["message"], found
