"""The live suite: gpu-bootstrap end to end on a cluster with fake GPUs, through the CLI, kubectl and Prometheus.

Against a real cluster (the local cluster of tests/localcluster, the default; or GPU_BOOTSTRAP_LIVE_KUBECONFIG, e.g.
kind via scripts/test-live) the assertions are about the real kube-apiserver, kube-scheduler, OPA and
kube-prometheus-stack. Against the emulator (GPU_BOOTSTRAP_LIVE_TARGET=emulator, or where the local cluster is not
built) a few of them cannot hold, because nothing real runs there; those tests say so where they branch, check the
nearest thing the emulator can show, and never weaken the live assertion.

One `up` (the session's `deployment` fixture) serves every test; the teardown test runs last and, if anything runs
after it, the next test deploys again.
"""
from __future__ import annotations

import json
import re
import time

import pytest

from tests.live.audit import audit, audit_mark, audit_writes, leftovers, node_view
from tests.live.conftest import SCHEDULER, TEST_NAMESPACE, create, pause_pod, wait_bound

pytestmark = [pytest.mark.live, pytest.mark.tools, pytest.mark.slow, pytest.mark.xdist_group("live"),
              pytest.mark.usefixtures("test_pods")]

WRITE = re.compile(r"\b(POST|PUT|PATCH|DELETE) (/\S+) -> ")  # the kube adapter's request lines in the log file
# helm commands that change a release (the log also has their "-> exit" lines and the --dry-run=server upgrades the
# gpu-operator step plans with, which change nothing)
HELM_WRITE = re.compile(r"\bhelm (install|upgrade|uninstall|rollback) (?!->)(?!.*--dry-run)")


def writes_in(log) -> list[str]:
    """API writes (server-side dry runs excluded) and helm changes the CLI logged."""
    text = log.read_text()
    found = [m.group(0) for m in WRITE.finditer(text) if "dryRun=" not in m.group(2)]
    return found + [m.group(0) for m in HELM_WRITE.finditer(text)]


def wait_for(probe, check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if check(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f}s; last answer: {str(value)[:3000]}")
        time.sleep(2)


def test_the_binpack_scheduler_fills_one_node_before_the_next(deployment, target):
    """GPU pods whose cpu and memory are in step with their GPUs (each asks for 70 % of a node's cpu and memory
    divided by its GPUs), as training pods are: the default profile's BalancedAllocation term (over cpu, memory and
    the GPU) is then about equal on every node and RequestedToCapacityRatio decides, filling a node first. Pods that
    ask for next to no cpu and memory beside a GPU are spread at low load by that term instead
    (docs/steps/binpack-scheduler.md, "Choosing the scoring")."""
    deployment.ensure()
    per_node = min(deployment.nodes.values())
    nodes = [target.json("get", "node", name) for name in deployment.nodes]
    cpu_milli = min(quantity_milli(n["status"]["allocatable"]["cpu"]) for n in nodes) * 7 // 10 // per_node
    memory_mib = min(quantity_bytes(n["status"]["allocatable"]["memory"]) for n in nodes) * 7 // 10 // per_node >> 20
    placed = []
    for index in range(per_node + 1):  # one at a time, so each sees the one before it bound
        pod = pause_pod(f"pack-{index}", scheduler=SCHEDULER)
        pod["spec"]["containers"][0]["resources"]["requests"].update(
            {"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi"})
        pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = f"{memory_mib}Mi"
        create(target, pod)
        placed.append(wait_bound(target, f"pack-{index}"))
    assert set(placed) <= set(deployment.nodes), placed  # only the nodes with (fake) GPUs fit
    if target.live:
        # The real kube-scheduler of our Deployment, scoring with the rendered profile: the first node is full
        # before any pod goes to another one.
        assert len(set(placed[:per_node])) == 1, f"GPU pods spread over {sorted(set(placed))}: {placed}"
        assert placed[per_node] != placed[0], placed
    else:
        # EMULATOR: its scheduler stand-in binds pods for the scheduler names our Deployment serves but does not score
        # like kube-scheduler (it spreads), so packing cannot be shown here. The nearest thing: every pod was bound at
        # all, which happens only while a ready pod of our Deployment serves its config's profile (with nothing
        # serving gpu-binpack-scheduler they stay Pending), and that config scores the way packing needs.
        config = target.json("get", "configmap", "-n", "kube-system", f"{SCHEDULER}-config")["data"]
        text = next(iter(config.values()))
        assert "RequestedToCapacityRatio" in text and "nvidia.com/gpu" in text, text


def quantity_milli(text: str) -> int:
    """A cpu quantity in millicores ('32', '31500m')."""
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


def quantity_bytes(text: str) -> int:
    """A memory quantity in bytes ('256Gi', '263999000Ki', '1e9')."""
    units = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9,
             "T": 10 ** 12}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[:-len(suffix)]) * factor)
    return int(float(text))


def test_the_opa_webhook_steers_a_gpu_pod_and_leaves_a_cpu_pod_alone(deployment, target):
    deployment.ensure()
    gpu = create(target, pause_pod("steered"), check=False)
    assert gpu.returncode == 0, f"a GPU pod naming no scheduler was refused: {gpu.stderr}"
    assert json.loads(gpu.stdout)["spec"]["schedulerName"] == SCHEDULER
    cpu = create(target, pause_pod("cpu-only", gpus=0))
    assert cpu["spec"]["schedulerName"] == "default-scheduler"
    assert wait_bound(target, "steered") in deployment.nodes


def test_with_opa_down_the_backstop_rejects_a_gpu_pod_on_the_default_scheduler(deployment, target):
    """With the webhook answering, a GPU pod that asks for the default scheduler is steered like any other (the API
    server has defaulted schedulerName before the webhook sees it). What the backstop is for is the webhook not
    answering (failurePolicy Ignore): scale OPA to zero and the ValidatingAdmissionPolicy, inside the API server,
    rejects the pod naming the field to set. OPA is scaled back before the test ends."""
    deployment.ensure()
    if target.kube_minor < 30:
        pytest.skip("the ValidatingAdmissionPolicy backstop exists from Kubernetes 1.30")
    namespace = "gpu-bootstrap-admission"
    replicas = target.json("get", "deployment", "opa", "-n", namespace)["spec"]["replicas"]
    target.kubectl("scale", "deployment", "opa", "-n", namespace, "--replicas=0")
    try:
        wait_for(lambda: dry_run(target, pause_pod("probe")), lambda result: not steered(result), 180,
                 "the webhook still steers GPU pods with OPA scaled to zero")
        rejected = create(target, pause_pod("backstopped", scheduler="default-scheduler"), check=False)
        assert rejected.returncode != 0, f"a GPU pod on the default scheduler was admitted with OPA down: " \
                                         f"{rejected.stdout[:300]}"
        assert "spec.schedulerName" in rejected.stderr and SCHEDULER in rejected.stderr, rejected.stderr
        assert "ValidatingAdmissionPolicy" in rejected.stderr, rejected.stderr
        cpu = create(target, pause_pod("cpu-with-opa-down", gpus=0), check=False)
        assert cpu.returncode == 0, cpu.stderr
    finally:
        target.kubectl("scale", "deployment", "opa", "-n", namespace, f"--replicas={replicas}")
        target.kubectl("rollout", "status", "deployment/opa", "-n", namespace, "--timeout=300s")
        wait_for(lambda: dry_run(target, pause_pod("probe")), steered, 180,
                 "the webhook did not steer again after OPA came back")


def dry_run(target, pod: dict):
    """A server-side dry run: the pod goes through admission and nothing is stored."""
    return target.kubectl("create", "-f", "-", "--dry-run=server", "-o", "json", input=json.dumps(pod), check=False)


def steered(result) -> bool:
    return result.returncode == 0 and json.loads(result.stdout)["spec"].get("schedulerName") == SCHEDULER


def test_prometheus_scrapes_kube_state_metrics_and_loaded_our_alert_rules(deployment, target):
    deployment.ensure()
    rules = target.json("get", "prometheusrules", "-A", "-l", "app.kubernetes.io/managed-by=gpu-bootstrap")["items"]
    ours = {g["name"] for rule in rules for g in rule["spec"]["groups"]}
    alerts = {r["alert"] for rule in rules for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert ours and alerts, "up created no PrometheusRule with alert rules"
    loaded = wait_for(lambda: target.prometheus_api("rules")["groups"],
                      lambda groups: ours <= {g["name"] for g in groups}, 300,
                      f"Prometheus did not load our rule groups {sorted(ours)}")
    assert alerts <= {r["name"] for g in loaded for r in g["rules"] if r["type"] == "alerting"}
    expr = 'up{job=~".*kube-state.*"}'
    if target.local:
        # LOCAL CLUSTER: the real Prometheus Operator turned the chart's ServiceMonitors into the real Prometheus'
        # scrape configuration, so kube-state-metrics is a discovered target, but it is down: no kube-state-metrics
        # process runs (the module proxy refuses its module). The DCGM exporter's target, whose pods the agent serves
        # (a stand-in), is what shows a scrape through the whole chain: ServiceMonitor -> operator -> Prometheus ->
        # Kubernetes service discovery with the pod's token -> the pod's address.
        discovered = wait_for(lambda: target.prometheus_api("query", query=expr)["result"], bool, 300,
                              "Prometheus has not discovered the kube-state-metrics target")
        assert {s["metric"].get("job") for s in discovered} == {"kube-state-metrics"}, discovered
        dcgm = wait_for(lambda: target.prometheus_api("query", query='up{job="nvidia-dcgm-exporter"}')["result"],
                        lambda result: sum(s["value"][1] == "1" for s in result) == len(deployment.nodes), 300,
                        "Prometheus does not scrape the DCGM exporter on every GPU node")
        assert {s["metric"]["node"] for s in dcgm} == set(deployment.nodes)
    elif target.live:
        up = wait_for(lambda: target.prometheus_api("query", query=expr)["result"],
                      lambda result: any(s["value"][1] == "1" for s in result), 300,
                      "Prometheus has no kube-state-metrics target up")
        assert up
    else:
        # EMULATOR: no kube-state-metrics runs and nothing turns ServiceMonitors into scrape jobs, so the query can
        # only be answered, not answered with a target. The nearest thing: Prometheus answers it through the service
        # proxy, and the chart's kube-state-metrics ServiceMonitor exists where our Prometheus selects every one.
        assert target.prometheus_api("query", query=expr)["resultType"] == "vector"
        monitors = target.json("get", "servicemonitors", "-A")["items"]
        assert any("kube-state-metrics" in m["metadata"]["name"] for m in monitors), \
            [m["metadata"]["name"] for m in monitors]
        prometheus = target.json("get", "prometheuses", "-n", "monitoring")["items"]
        assert [p["spec"].get("serviceMonitorSelector") for p in prometheus] == [{}]


def test_status_reports_the_fake_gpus_as_allocated(deployment, target):
    deployment.ensure()
    for index, gpus in enumerate((1, 2)):
        create(target, pause_pod(f"held-{index}", gpus=gpus))
    held = {wait_bound(target, "held-0"): 1}
    node = wait_bound(target, "held-1")
    held[node] = held.get(node, 0) + 2
    result, document, log = target.cli("status", "--kubeconfig", str(target.kubeconfig))
    assert result.exit_code == 0, result.output
    nodes = {n["name"]: n["gpus"] for n in document["nodes"]}
    assert {name: gpus["allocatable"] for name, gpus in nodes.items()} == deployment.nodes
    assert {name: gpus["requested"] for name, gpus in nodes.items() if gpus["requested"]} == held
    assert document["totals"]["gpus_requested"] == 3
    assert document["totals"]["gpus_allocatable"] == sum(deployment.nodes.values())
    assert [n for n in document["namespaces"] if n["name"] == TEST_NAMESPACE][0]["gpus"] == 3


def test_a_second_up_makes_no_writes(deployment, target):
    deployment.ensure()
    assert deployment.first_log is not None and writes_in(deployment.first_log), \
        "the first up's log shows no write: the log no longer records them, so this test could not see one"
    if target.emu is not None:
        target.emu.requests.clear()
    if target.local:  # the API server's audit log is the other witness: it saw the first up write
        assert audit_writes(target.cluster), "the audit log shows no write by gpu-bootstrap or helm at all"
        mark = audit_mark(target.cluster)
    result, document, log = deployment.run_up()
    assert result.exit_code == 0, result.output
    assert {s["id"]: s["status"] for s in document["steps"]} == {
        s: "skipped" if s in ("gpu-pools", "queues") else "unchanged" for s in target.steps()}
    assert writes_in(log) == []
    if target.emu is not None:  # the emulator also sees every request: none wrote (the log is not the only witness)
        assert target.emu.requests.writes() == [], [str(r) for r in target.emu.requests.writes()]
    if target.local:  # ... and the real API server's audit log, by user agent: neither gpu-bootstrap nor its helm
        assert audit_writes(target.cluster, since=mark) == []


def compare_the_offline_teardown_preview(deployment, target) -> None:
    """`teardown --dry-run --offline` (no cluster: the teardown of what a fresh `up` of the config would leave)
    names the same changes as `teardown --dry-run` on the cluster the session's real `up` made, --purge-crds
    included (helm renders the charts offline to name their CRDs)."""
    def changes(*extra: str) -> list:
        result, document, _log = target.cli("teardown", "-c", str(deployment.config), "--playbook",
                                            str(target.playbook), "--dry-run", "--purge-crds", *extra)
        assert result.exit_code == 0, result.output
        return sorted((s["id"], c["verb"], c["target"]) for s in document["steps"] for c in s.get("planned", []))
    version = target.json("version")["serverVersion"]["gitVersion"].lstrip("v")
    mark = audit_mark(target.cluster) if target.local else 0
    online = changes()
    if target.local:  # a dry run writes nothing (a dryRun query beside a DeleteOptions body once deleted for real)
        assert audit_writes(target.cluster, since=mark) == []
    offline = changes("--offline", "--kube-version", version)
    assert offline == online, {"online only": sorted(set(online) - set(offline)),
                               "offline only": sorted(set(offline) - set(online))}


def test_teardown_leaves_no_object_of_ours(deployment, target):
    """Every listable API resource before the first `up` and after `teardown --purge-crds`, as a user auditing the
    cluster would: nothing new remains, nothing carries our marks, the GPU nodes' labels and taints are as before."""
    deployment.ensure()
    compare_the_offline_teardown_preview(deployment, target)
    # a pod as a user writes it for our scheduler, that no node can take: once the scheduler is gone nothing ever
    # schedules it, and teardown says so (issue 56) before and after, and exits 3
    create(target, pause_pod("waits-for-the-scheduler", gpus=64, scheduler=SCHEDULER))
    result, document, log = target.cli("teardown", "-c", str(deployment.config), "--playbook",
                                       str(target.playbook), "--yes", "--purge-crds")
    deployment.up = False
    assert result.exit_code == 3, result.output
    waiting = [line for s in document["steps"] for line in s.get("left_waiting", [])]
    assert len(waiting) == 1 and f"{TEST_NAMESPACE}/waits-for-the-scheduler" in waiting[0], document["steps"]
    target.kubectl("delete", "pod", "waits-for-the-scheduler", "-n", TEST_NAMESPACE, "--grace-period=0", "--force",
                   "--wait=true")
    if target.emu is not None:
        target.emu.settle()
    remaining = wait_for(lambda: leftovers(deployment.before, audit(target)), lambda left: not left, 300,
                         "teardown left objects behind")
    assert remaining == []
    assert {n: node_view(target, n) for n in deployment.nodes} == deployment.nodes_before
