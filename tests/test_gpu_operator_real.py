"""NVIDIA's own gpu-operator controller reconciling what gpu-bootstrap derives, on the local control plane.

The controller is the real one (cmd/gpu-operator), built by scripts/install-test-tools from the one commit of the
25.3 line the Go module proxy serves (scripts/gomod/gpu-operator/go.mod says why), with the chart of the same commit
(labelled v25.3.4, the line its versions.mk names). The local cluster's agent runs it for the operator Deployment's
pod, with the commit's state manifests at /opt/gpu-operator; KWOK plays the operand pods it creates. It proves our
values for the 25.3 line only: 25.10 and newer are still read from the source (render/gpu_operator_values.py).

* `up` (node-prep and gpu-operator, planned for the 25.3 line through `gpu_operator.skip_version_check`, the
  documented override for a Kubernetes release NVIDIA has not validated) is reconciled to `state: ready`, and a
  second `up` writes nothing (the API server's audit log);
* each node layout we support: the values `up` derives for it (render/gpu_operator_values.derive, the same call the
  step makes) rendered by the commit's chart into a ClusterPolicy, applied, and the DaemonSets the controller then
  creates read back: which exist, on which nodes, with which tolerations and environment;
* teardown leaves no operand, ClusterPolicy or label of ours.

An upgrade test would need one controller per chart version; the proxy serves one commit, so there is none.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.render import gpu_operator_values as gov
from gpu_bootstrap.steps.gpu_operator_health import meant_for
from tests.live.audit import audit_mark, audit_writes
from tests.localcluster.cluster import binaries, require
from tests.localcluster.rest import ApiError
from tests.realfaults import UpRun, local_cluster, wait_for
from tests.test_render_gpu_operator import CRIO, FRESH, K3S, RKE2, node
from tests.tools import run, tool, tool_env, wait_established

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.xdist_group("gpu-operator-real")]
GPU_NODES = ["gpu-1", "gpu-2"]
LINE = "v25.3.4"
STEPS = "node-prep,gpu-operator"
RUN_TIMEOUT = 420
NAMESPACE = "gpu-operator"
POLICY = "/apis/nvidia.com/v1/clusterpolicies"
CONTAINERD = "containerd://1.7.27"  # what tests/localcluster/nodes.py gives every node
SERVICE_MONITORS = "servicemonitors.monitoring.coreos.com"
RECONCILED_WITHIN = 180.0  # seconds: the controller's own requeue is 5 s; a loaded CI machine stretches it


@dataclass
class Operator:
    cluster: object
    folder: Path
    config: Path
    first: object = None  # realfaults.Ended of the first `up`
    ready_after_first: str | None = None  # the ClusterPolicy's status.state then
    # (its image, its own log) of the controller that reconciled the first `up`: read in the fixture, because a
    # layout test run before the test that reads it starts a new controller (restart_controller)
    first_controller: tuple = ("", "")
    second: object = None
    second_writes: list = field(default_factory=list)
    before: dict = field(default_factory=dict)  # node -> (labels, taints) before the first `up`

    @property
    def api(self):
        return self.cluster.admin()

    def up(self):
        return UpRun(["up", "-c", str(self.config), "--only", STEPS, "--preflight-report",
                      str(self.folder / "report.json")], self.folder).wait(RUN_TIMEOUT)

    def kubectl(self, *args: str, input: str | None = None) -> str:
        return run([tool("kubectl"), "--kubeconfig", str(self.cluster.kubeconfig), *args], tool_env(), 60, True,
                   input).stdout


# Kubernetes' own: the kubelet's (KWOK's) labels, added after a node is created, and the node lifecycle's taints
# (node.kubernetes.io/not-ready while a fresh node is not yet Ready)
SYSTEM_LABELS = ("kubernetes.io/", "beta.kubernetes.io/")
SYSTEM_TAINTS = "node.kubernetes.io/"


def node_marks(api, name: str) -> tuple[dict, list, list]:
    """A node's labels and taints (Kubernetes' own left out) and gpu-bootstrap's and the operator's annotations."""
    found = api.get(f"/api/v1/nodes/{name}")
    labels = {k: v for k, v in (found["metadata"].get("labels") or {}).items() if not k.startswith(SYSTEM_LABELS)}
    taints = [t for t in found["spec"].get("taints") or [] if not t["key"].startswith(SYSTEM_TAINTS)]
    ours = sorted(k for k in found["metadata"].get("annotations") or {}
                  if k.startswith(("gpu-bootstrap.io/", "nvidia.com/")))  # ours, and the operator's
    return labels, taints, ours


def policy_state(api) -> str | None:
    items = api.get(POLICY)["items"]
    return ((items[0].get("status") or {}).get("state")) if items else None


@pytest.fixture(scope="module")
def operator(tmp_path_factory):
    """One cluster, one `up` and a second `up` whose writes are counted, before any test of the module reads them
    (so the layout tests, which change the ClusterPolicy, cannot come between)."""
    require("gpu-operator", "gpu-operator-assets", "gpu-operator-chart")
    from tests.nodes.reports import write_report
    folder = tmp_path_factory.mktemp("gpu-operator-real")
    with local_cluster(folder, gpu_nodes=len(GPU_NODES), cpu_nodes=1) as cluster:
        write_report(folder / "report.json", GPU_NODES, gpus=4)
        config = folder / "gpu-bootstrap.yaml"
        config.write_text(json.dumps({
            "cluster": {"kubeconfig": str(cluster.kubeconfig)}, "nodes": [{"name": n} for n in GPU_NODES],
            "gpu_operator": {"chart": str(binaries()["gpu-operator-chart"]), "skip_version_check": True,
                             "wait_timeout": 300},
            "monitoring": {"enabled": False}}))
        found = Operator(cluster, folder, config)
        found.before = {n: node_marks(found.api, n) for n in GPU_NODES}
        found.first = found.up()
        if found.first.code == 0:
            try:  # the controller writes its status after the operands it waits for are ready, as `up` saw them
                wait_for(lambda: policy_state(found.api) == "ready", RECONCILED_WITHIN, "state ready", interval=1.0)
            except AssertionError:
                pass
            found.ready_after_first = policy_state(found.api)
            found.first_controller = controller_image_and_log(found)
            mark = audit_mark(cluster)
            found.second = found.up()
            found.second_writes = audit_writes(cluster, since=mark)
        yield found


def test_up_is_reconciled_by_the_real_controller_to_ready_and_a_second_up_writes_nothing(operator):
    assert operator.first.code == 0, operator.first.output[-3000:]
    statuses = {s["id"]: s["status"] for s in operator.first.document["steps"]}
    assert statuses == {"node-prep": "applied", "gpu-operator": "applied"}, statuses
    assert "skip_version_check" in json.dumps(operator.first.document), "the unvalidated pairing is not named"
    assert operator.ready_after_first == "ready"
    assert operator.second.code == 0, operator.second.output[-3000:]
    assert {s["id"]: s["status"] for s in operator.second.document["steps"]} == {
        "node-prep": "unchanged", "gpu-operator": "unchanged"}
    assert operator.second_writes == []
    image, log = operator.first_controller
    assert image.endswith(f"/gpu-operator:{LINE}"), image
    assert "ClusterPolicy is ready" in log or "clusterpolicy" in log.lower(), \
        "the controller's own log shows no reconcile: the stand-in may have played it"


# --- the layouts ---------------------------------------------------------------------------------------------------
@dataclass
class Layout:
    id: str
    facts: dict = field(default_factory=dict)  # changes to a healthy node's facts (tests/test_render_gpu_operator)
    section: dict = field(default_factory=dict)  # gpu_operator config
    runtime: str = CONTAINERD  # the nodes' status.nodeInfo.containerRuntimeVersion meanwhile
    monitoring: bool = False  # a monitoring step in the playbook (the DCGM ServiceMonitor wanted)
    crds: bool = False  # the Prometheus Operator's ServiceMonitor CRD exists
    service_monitors: bool = True  # what steps/gpu_operator.service_monitors_come answers for this run


LAYOUTS = [
    Layout("driver-and-toolkit-on-the-host"),
    Layout("no-driver-no-toolkit", facts=FRESH),
    Layout("driver-on-the-host-no-toolkit", facts=dict(toolkit_installed=False, toolkit_version=None,
                                                       toolkit_configured=False, toolkit_default=False)),
    Layout("k3s", facts=K3S),
    Layout("rke2", facts=RKE2),
    Layout("cri-o", facts=CRIO, runtime="cri-o://1.31.3"),
    Layout("time-slicing", section={"sharing": {"mode": "time-slicing", "replicas": 4}}),
    Layout("mig-single", section={"sharing": {"mode": "mig", "mig_strategy": "single"}}),
    Layout("mig-mixed", section={"sharing": {"mode": "mig", "mig_strategy": "mixed"}}),
    Layout("device-plugin-off-for-dra", section={"allocation": "dra"}),
    Layout("monitoring-before-the-operator", monitoring=True, crds=True),
    # `up --skip monitoring` (or --only gpu-operator) where nothing serves ServiceMonitors
    Layout("monitoring-not-run-and-no-prometheus-crds", monitoring=True, crds=False, service_monitors=False),
]


def plan_for(layout: Layout) -> gov.ValuesPlan:
    """What the gpu-operator step derives for these nodes (steps/gpu_operator.py `values`, the same call)."""
    config = cfg.validate({"nodes": [{"name": n} for n in GPU_NODES], "gpu_operator": layout.section,
                           "monitoring": {"enabled": layout.monitoring}}, cfg.Source(None, {}))
    steps = ["preflight", "node-prep", *(["monitoring"] if layout.monitoring else []), "gpu-operator"]
    return gov.derive([node(n, **layout.facts) for n in GPU_NODES], config, LINE, steps,
                      service_monitors=layout.service_monitors)


def rendered(operator: Operator, plan: gov.ValuesPlan) -> list[dict]:
    """The chart's objects for these values: what is applied."""
    return render_chart(operator, plan)


def render_chart(operator: Operator, plan: gov.ValuesPlan) -> list[dict]:
    values = operator.folder / "layout-values.json"  # no secret in these values (they are derived, not the user's)
    values.write_text(json.dumps(plan.merged))
    out = run([tool("helm"), "template", "gpu-operator", str(binaries()["gpu-operator-chart"]), "-n", NAMESPACE,
               "-f", str(values)], tool_env(), 120, True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


# ClusterPolicy section -> the DaemonSets the controller makes for it when `enabled` (the chart writes every
# section's `enabled`; the validator has none and always runs). The sandbox, vGPU, GDS and kata operands are off in
# every layout here and are not listed: a DaemonSet of theirs appearing is a difference too.
OPERANDS = {"driver": ["nvidia-driver-daemonset"], "toolkit": ["nvidia-container-toolkit-daemonset"],
            "devicePlugin": ["nvidia-device-plugin-daemonset", "nvidia-device-plugin-mps-control-daemon"],
            "dcgm": ["nvidia-dcgm"], "dcgmExporter": ["nvidia-dcgm-exporter"], "gfd": ["gpu-feature-discovery"],
            "migManager": ["nvidia-mig-manager"], "nodeStatusExporter": ["nvidia-node-status-exporter"]}


def meant_operands(operator: Operator, plan: gov.ValuesPlan) -> set[str]:
    """The DaemonSets the values mean the controller to make: from the ClusterPolicy the chart renders of them.
    Reading is done only once all of them exist, so that a reconcile still under way (some made, the status still
    the previous spec's `ready`) is never taken for its end."""
    spec = next(d for d in render_chart(operator, plan) if d["kind"] == "ClusterPolicy")["spec"]
    names = {"nvidia-operator-validator"}
    for section, daemonsets in OPERANDS.items():
        if (spec.get(section) or {}).get("enabled") is True:
            names.update(daemonsets)
    return names


def taint(api) -> dict:
    """node-prep's taint, as `up` put it on the GPU nodes."""
    taints = api.get(f"/api/v1/nodes/{GPU_NODES[0]}")["spec"].get("taints") or []
    ours = [t for t in taints if t["key"] == "nvidia.com/gpu"]
    assert ours, f"node-prep's taint is not on {GPU_NODES[0]}: {taints}"
    return ours[0]


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    return any((t.get("key") in (None, taint["key"])) and t.get("effect") in (None, "", taint["effect"]) and
               (t.get("operator") == "Exists" or t.get("value") == taint.get("value")) for t in tolerations or [])


def operands(api) -> dict[str, dict]:
    """The DaemonSets the controller owns (ownerReference to the ClusterPolicy), by name."""
    found = api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets")["items"]
    return {d["metadata"]["name"]: d for d in found
            if any(o.get("kind") == "ClusterPolicy" for o in d["metadata"].get("ownerReferences") or [])}


def env_of(daemonset: dict, container: str) -> dict[str, str]:
    """The literal environment of one of its containers ({} when it has none of that name: a problem the caller's
    expectation then names, while the controller may still be on its way)."""
    spec = daemonset["spec"]["template"]["spec"]
    for item in (spec.get("initContainers") or []) + spec["containers"]:
        if item["name"] == container:
            return {e["name"]: e.get("value") for e in item.get("env") or [] if "value" in e}
    return {}


def host_paths(daemonset: dict) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in daemonset["spec"]["template"]["spec"].get("volumes") or []
            if "hostPath" in v}


def config_maps(daemonset: dict) -> set[str]:
    return {v["configMap"]["name"] for v in daemonset["spec"]["template"]["spec"].get("volumes") or []
            if "configMap" in v}


def toolkit_env(plan: gov.ValuesPlan) -> dict[str, str]:
    return {e["name"]: e["value"] for e in plan.merged["toolkit"].get("env") or []}


def common_problems(found: dict[str, dict], nodes: dict[str, dict], gpu_taint: dict) -> list[str]:
    """Every operand: tolerates node-prep's taint, selects by the operator's gpu.deploy switch, and has a ready pod
    on every GPU node it is meant for."""
    problems = []
    for name, ds in found.items():
        spec, status = ds["spec"]["template"]["spec"], ds.get("status") or {}
        if not tolerates(spec.get("tolerations"), gpu_taint):
            problems.append(f"{name} does not tolerate node-prep's taint: {spec.get('tolerations')}")
        meant = meant_for(ds, nodes)
        if status.get("desiredNumberScheduled") != meant or status.get("numberReady") != meant:
            problems.append(f"{name}: {status.get('numberReady')} ready of {status.get('desiredNumberScheduled')} "
                            f"scheduled, {meant} meant")
    return problems


def layout_problems(layout: Layout, plan: gov.ValuesPlan, found: dict[str, dict], api) -> list[str]:
    """What the controller made that differs from what the values meant, for this layout."""
    problems = []
    merged = plan.merged

    def expect(condition: bool, message: str) -> None:
        if not condition:
            problems.append(message)
    driver, toolkit = "nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset"
    plugin = "nvidia-device-plugin-daemonset"
    expect((driver in found) == bool(merged["driver"]["enabled"]),
           f"driver.enabled={merged['driver']['enabled']}, driver DaemonSet present: {driver in found}")
    expect((toolkit in found) == bool(merged["toolkit"]["enabled"]),
           f"toolkit.enabled={merged['toolkit']['enabled']}, toolkit DaemonSet present: {toolkit in found}")
    if toolkit in found:
        env, paths, ours = env_of(found[toolkit], "nvidia-container-toolkit-ctr"), host_paths(found[toolkit]), \
            toolkit_env(plan)
        expect(env.get("RUNTIME") == ("crio" if layout.runtime.startswith("cri-o") else "containerd"),
               f"toolkit RUNTIME {env.get('RUNTIME')} for a {layout.runtime} node")
        for name, volume in (("CONTAINERD_CONFIG", "containerd-config"), ("CONTAINERD_SOCKET", "containerd-socket")):
            if name in ours:  # the controller mounts the file's folder and points the variable into the mount
                folder, base = os.path.split(ours[name])
                expect(paths.get(volume) == folder, f"{volume} hostPath {paths.get(volume)}, meant {folder}")
                expect((env.get(name) or "").endswith("/" + base), f"{name} {env.get(name)}, meant …/{base}")
        for name in ("RUNTIME_CONFIG_SOURCE", "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED"):
            if name in ours:
                expect(env.get(name) == ours[name], f"toolkit {name} {env.get(name)!r}, meant {ours[name]!r}")
        if layout.runtime.startswith("cri-o"):
            expect("CONTAINERD_CONFIG" not in env and "crio-config" in paths,
                   f"a CRI-O node's toolkit: env {sorted(env)}, host paths {sorted(paths)}")
    plugin_on = merged.get("devicePlugin", {}).get("enabled", True) is not False
    expect(any(n.startswith("nvidia-device-plugin") for n in found) == plugin_on,
           f"devicePlugin.enabled={plugin_on}, device plugin DaemonSets: "
           f"{sorted(n for n in found if n.startswith('nvidia-device-plugin'))}")
    strategy = (merged.get("mig") or {}).get("strategy", "single")
    for name, container in ((plugin, "nvidia-device-plugin"), ("gpu-feature-discovery", "gpu-feature-discovery")):
        if name in found:
            env = env_of(found[name], container)
            expect(env.get("MIG_STRATEGY") == strategy, f"{name} MIG_STRATEGY {env.get('MIG_STRATEGY')}, meant "
                                                        f"{strategy}")
    if plugin in found:  # CDI off on the 25.3 line unless set (CDI_BY_DEFAULT): devices are handed by env var
        cdi = bool((merged.get("cdi") or {}).get("enabled"))
        listed = env_of(found[plugin], "nvidia-device-plugin").get("DEVICE_LIST_STRATEGY", "")
        expect(("cdi-annotations" in listed) == cdi, f"DEVICE_LIST_STRATEGY {listed!r} with cdi.enabled={cdi}")
    sharing = (merged.get("devicePlugin") or {}).get("config") or {}
    if sharing.get("name"):
        for name, container in ((plugin, "config-manager"), ("gpu-feature-discovery", "config-manager")):
            expect(name in found and sharing["name"] in config_maps(found[name]),
                   f"{name} does not mount the time-slicing ConfigMap {sharing['name']}")
            if name in found:
                expect(env_of(found[name], container).get("DEFAULT_CONFIG") == sharing.get("default"),
                       f"{name} DEFAULT_CONFIG {env_of(found[name], container).get('DEFAULT_CONFIG')}, meant "
                       f"{sharing.get('default')}")
    if (merged.get("migManager") or {}).get("enabled", True) is not False:
        expect("nvidia-mig-manager" in found, "no nvidia-mig-manager DaemonSet")
    for name, labels in plan.node_labels.items():  # node-prep's labels (mig.config): the controller keeps them
        have = api.get(f"/api/v1/nodes/{name}")["metadata"].get("labels") or {}
        expect(all(have.get(k) == v for k, v in labels.items()), f"{name}'s labels {labels} were changed")
    monitor = ((merged.get("dcgmExporter") or {}).get("serviceMonitor") or {})
    made = service_monitor(api)
    expect(bool(monitor.get("enabled")) == (layout.monitoring and layout.service_monitors),
           f"dcgmExporter.serviceMonitor.enabled={monitor.get('enabled')}")
    if layout.crds and monitor.get("enabled"):
        expect(made is not None, "no DCGM exporter ServiceMonitor although its CRD exists")
        if made is not None:
            wanted = monitor.get("additionalLabels") or {}
            have = made["metadata"].get("labels") or {}
            expect(all(have.get(k) == v for k, v in wanted.items()),
                   f"the ServiceMonitor's labels {have} lack {wanted} (Prometheus selects by them)")
    return problems


def service_monitor(api) -> dict | None:
    try:
        found = api.get(f"/apis/monitoring.coreos.com/v1/namespaces/{NAMESPACE}/servicemonitors")["items"]
    except ApiError as error:
        if error.status == 404:
            return None
        raise
    return next((m for m in found if "dcgm" in m["metadata"]["name"]), None)


def set_crds(operator: Operator, wanted: bool) -> None:
    present = bool(operator.kubectl("get", "crd", "--ignore-not-found", "-o", "name", SERVICE_MONITORS).strip())
    if wanted and not present:
        import tarfile

        from tests.conftest import chart
        with tarfile.open(chart("prometheus-operator-crds-v0.80.0.tgz")) as archive:
            member = next(m for m in archive.getmembers() if m.name.endswith("_servicemonitors.yaml"))
            crd = archive.extractfile(member).read().decode()
        operator.kubectl("apply", "--server-side", "-f", "-", input=crd)
        wait_established(lambda name: operator.api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"),
                         SERVICE_MONITORS)
    elif not wanted and present:
        operator.kubectl("delete", "crd", SERVICE_MONITORS, "--wait=true")
        restart_controller(operator)


def restart_controller(operator: Operator) -> None:
    """A new controller process, as after a rollout. The running one's informer for ServiceMonitors outlives their
    CRD and keeps the last object it saw (client-go relists with back-off): with the CRD made again, it updates that
    ghost, fails, and its requeues back off for minutes. An operator whose Prometheus CRDs are removed under it is
    not what these tests are about; each layout starts from a controller that never saw the CRD go."""
    api = operator.api
    old = {p["metadata"]["uid"] for p in controller_pods(api)}
    operator.kubectl("delete", "pod", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=gpu-operator",
                     "--wait=true")
    wait_for(lambda: [p for p in controller_pods(api) if p["metadata"]["uid"] not in old and
                      (p.get("status") or {}).get("phase") == "Running"], 120, "a new gpu-operator pod", interval=1.0)


def controller_image_and_log(operator: Operator) -> tuple[str, str]:
    """The running controller pod's image and the log the agent keeps of its process ('' where there is none)."""
    pods = controller_pods(operator.api)
    if not pods:
        return "", ""
    log = operator.cluster.folder / "pods" / f"{NAMESPACE}_{pods[0]['metadata']['name']}" / "gpu-operator.log"
    return pods[0]["spec"]["containers"][0]["image"], log.read_text() if log.exists() else ""


def controller_pods(api) -> list[dict]:
    return api.get(f"/api/v1/namespaces/{NAMESPACE}/pods",
                   labelSelector="app.kubernetes.io/component=gpu-operator")["items"]


def set_runtime(api, runtime: str) -> None:
    for name in GPU_NODES:
        api.patch(f"/api/v1/nodes/{name}/status", {"status": {"nodeInfo": {"containerRuntimeVersion": runtime}}})


def set_labels(api, labels: dict[str, dict[str, str | None]]) -> None:
    for name, values in labels.items():
        api.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": values}})


def apply_policy(operator: Operator, documents: list[dict]) -> set[str]:
    """The chart's ClusterPolicy (and the ConfigMaps it names) in place of the one in the cluster, after removing the
    controller's DaemonSets, so that what is read afterwards is what it made of this spec. Returns the removed
    DaemonSets' uids."""
    api = operator.api
    for document in documents:
        if document["kind"] == "ConfigMap" and document["metadata"]["name"].startswith("time-slicing"):
            document["metadata"]["namespace"] = NAMESPACE
            operator.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(document))
    policy = next(d for d in documents if d["kind"] == "ClusterPolicy")
    old = operands(api)
    for name in old:
        api.request("DELETE", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{name}")
    replace_spec(api, policy["spec"])
    return {d["metadata"]["uid"] for d in old.values()}


def replace_spec(api, spec: dict, tries: int = 20) -> None:
    """The live ClusterPolicy's spec replaced by `spec`. The controller writes the policy's status while it reconciles
    (more so right after its operands were deleted), so a read-then-PUT can lose the race and get 409 Conflict; read
    again and retry, as any client of a busy object must (custom resources refuse an update without resourceVersion)."""
    for attempt in range(tries):
        live = api.get(POLICY)["items"][0]
        live["spec"] = spec
        try:
            api.request("PUT", f"{POLICY}/{live['metadata']['name']}", live)
            return
        except ApiError as error:
            if error.status != 409 or attempt == tries - 1:
                raise


@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout.id for layout in LAYOUTS])
def test_the_real_controller_makes_what_our_values_meant_for_the_layout(operator, layout):
    assert operator.first.code == 0, f"the module's up failed: {operator.first.output[-2000:]}"
    api = operator.api
    plan = plan_for(layout)
    documents = rendered(operator, plan)
    gpu_taint = taint(api)
    set_runtime(api, layout.runtime)
    set_labels(api, plan.node_labels)
    set_crds(operator, layout.crds)
    try:
        old = apply_policy(operator, documents)
        assert reconciled(api, old, layout, plan, gpu_taint, "ready", meant_operands(operator, plan)) == []
    finally:
        set_runtime(api, CONTAINERD)
        set_labels(api, {n: {k: None for k in labels} for n, labels in plan.node_labels.items()})
        if layout.crds:
            set_crds(operator, False)


def reconciled(api, old: set[str], layout: Layout, plan: gov.ValuesPlan, gpu_taint: dict, state: str,
               meant: set[str]) -> list[str]:
    """What still differs (nothing, once the controller made exactly the DaemonSets `meant`, as the values meant
    them, and reports `state`), polled until it is nothing or the time is up: the last reading's differences."""
    last: dict = {}

    def differences():
        found = {n: d for n, d in operands(api).items() if d["metadata"]["uid"] not in old}
        if set(found) != meant:
            last["problems"] = [f"DaemonSets {sorted(found)}, meant {sorted(meant)}"]
            return False
        nodes = {n: api.get(f"/api/v1/nodes/{n}") for n in GPU_NODES}
        problems = common_problems(found, nodes, gpu_taint) + layout_problems(layout, plan, found, api)
        if policy_state(api) != state:
            problems.append(f"ClusterPolicy state {policy_state(api)}, not {state}")
        last["problems"] = problems
        return not problems
    try:
        wait_for(differences, RECONCILED_WITHIN, "the controller to reconcile the layout", interval=2.0)
    except AssertionError as timeout:
        return last.get("problems") or [str(timeout)]
    return []


def test_a_wanted_service_monitor_without_its_crd_keeps_the_policy_not_ready_until_the_crd_comes(operator):
    """The finding behind `service_monitors_come`: with dcgmExporter.serviceMonitor on and no ServiceMonitor CRD,
    NVIDIA's controller makes every operand but reports the ClusterPolicy notReady ('Install Prometheus and
    necessary CRDs'), and keeps requeueing, so the ServiceMonitor comes once the CRD does (the stand-in used to
    report ready and never make it)."""
    assert operator.first.code == 0, f"the module's up failed: {operator.first.output[-2000:]}"
    api = operator.api
    layout = Layout("wanted-without-crd", monitoring=True, crds=False)
    plan = plan_for(layout)
    assert plan.merged["dcgmExporter"]["serviceMonitor"]["enabled"] is True
    gpu_taint = taint(api)
    set_crds(operator, False)
    try:
        old = apply_policy(operator, rendered(operator, plan))
        meant = meant_operands(operator, plan)
        assert reconciled(api, old, layout, plan, gpu_taint, "notReady", meant) == []
        assert service_monitor(api) is None
        set_crds(operator, True)
        with_crd = dataclasses.replace(layout, crds=True)
        assert reconciled(api, set(), with_crd, plan, gpu_taint, "ready", meant) == []
        assert service_monitor(api) is not None
    finally:
        set_crds(operator, False)


def test_teardown_with_the_real_controller_leaves_no_operand_policy_or_label_of_ours(operator):
    assert operator.first.code == 0, f"the module's up failed: {operator.first.output[-2000:]}"
    api = operator.api
    ended = UpRun(["teardown", "-c", str(operator.config), "--only", STEPS, "--yes"], operator.folder).wait(
        RUN_TIMEOUT)
    try:
        assert ended.code == 0, ended.output[-3000:]
        wait_for(lambda: not operands(api) and not (_served(api) and api.get(POLICY)["items"]), 180,
                 "the operands and the ClusterPolicy to be gone", interval=1.0)
        time.sleep(5)  # a controller still running would relabel within its 5 s requeue
        for name in GPU_NODES:  # the operator's labels (gpu.deploy.*, mig.config) and node-prep's, gone
            labels, taints, annotations = node_marks(api, name)
            before_labels, before_taints, _ = operator.before[name]
            assert labels == before_labels, {k: v for k, v in labels.items() if before_labels.get(k) != v}
            assert taints == before_taints and annotations == [], (name, taints, annotations)
    finally:  # the other tests of the module read the installation: put it back
        again = operator.up()
        assert again.code == 0, again.output[-3000:]


def _served(api) -> bool:
    try:
        api.get(POLICY)
    except ApiError as error:
        if error.status == 404:
            return False
        raise
    return True
