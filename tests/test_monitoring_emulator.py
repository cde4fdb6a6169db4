"""The monitoring step end to end on the Kubernetes API emulator, through the real CLI, the real helm and charts:

* install mode: one `up` on a fresh cluster installs kube-prometheus-stack 88.5.3, then the gpu-operator, whose
  stand-in controller creates the DCGM ServiceMonitor only because the Prometheus Operator's CRDs already exist;
* the API server's service proxy in front of the chart's Prometheus Service points at a real local Prometheus that
  scrapes a stand-in dcgm-exporter per GPU node (tests/monitoring/live.py) with the ServiceMonitor's settings, so
  verify and doctor run their real queries;
* attach mode against a Prometheus object with non-default selectors, which is never changed;
* teardown: our objects; the stack only when we installed it; CRDs only with --purge-crds.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.render import monitoring as render
from tests.conftest import chart
from tests.monitoring.live import LocalPrometheus, StandInExporter, scrape_config
from tests.nodes.reports import write_report
from tests.test_rbac import uncovered
from tests.tools import tool_env

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.usefixtures("helm_on_path")]
runner = CliRunner()
NODES = ["node5", "node6"]
STACK_NS, STACK_SERVICE = "monitoring", "kube-prometheus-stack-prometheus"
SCENARIO_NODE = {"node5": "gpu-1", "node6": "gpu-2"}


@pytest.fixture
def emulator_options():
    return {"kube_version": "1.33.2", "gpu_nodes": NODES, "cpu_nodes": ["cpu-1"], "gpu_operator": True}


@pytest.fixture
def stand_ins(tmp_path):
    """A dcgm-exporter stand-in per GPU node and a local Prometheus (no scrape jobs until a ServiceMonitor exists)."""
    exporters = {node: StandInExporter(SCENARIO_NODE[node], node) for node in NODES}
    folder = tmp_path / "prometheus"
    folder.mkdir()
    prometheus = LocalPrometheus(folder, "global: {scrape_interval: 1s}\n")
    try:
        yield exporters, prometheus
    finally:
        prometheus.stop()
        for exporter in exporters.values():
            exporter.stop()


def write_config(tmp_path: Path, cluster, monitoring: str = "", playbook_extra: str = "") -> Path:
    path = tmp_path / "gpu-bootstrap.yaml"
    path.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}}}\nnodes:\n" +
                    "".join(f"  - name: {n}\n" for n in NODES) +
                    f"gpu_operator:\n  chart: {chart('gpu-operator-v26.7.0.tgz')}\n  wait_timeout: 30\n"
                    f"validate: {{enabled: false}}\n"
                    f"monitoring:\n  chart: {chart('kube-prometheus-stack-88.5.3.tgz')}\n  wait_timeout: 60\n"
                    + monitoring)
    return path


def cli(*args: str, tmp_path: Path):
    extra = []
    if args[0] == "up":
        report = tmp_path / "report.json"
        extra = ["--preflight-report", str(report if report.exists() else write_report(report, NODES))]
    if args[0] == "doctor":
        extra = ["--no-nodes"]
    result = runner.invoke(app, [*args, *extra, "-o", "json", "--log-file", str(tmp_path / "run.log")])
    document = json.loads(result.stdout) if result.stdout.startswith("{") else None
    return result, document


def statuses(document) -> dict:
    return {s["id"]: s["status"] for s in document["steps"]}


def message(document, step: str) -> str:
    return next(s["message"] for s in document["steps"] if s["id"] == step)


def start_scraping(cluster, prometheus, exporters) -> dict:
    """Prometheus 'discovers' the DCGM ServiceMonitor the operator created and scrapes as it says."""
    monitor = cluster.emu.get("servicemonitors", "nvidia-dcgm-exporter", "gpu-operator")
    assert monitor is not None, "the gpu-operator created no DCGM ServiceMonitor"
    prometheus.reload(scrape_config(exporters, monitor, "gpu-operator"), wait_for="nvidia-dcgm-exporter")
    up = prometheus.wait_for('up{job="nvidia-dcgm-exporter"} == 1', lambda r: len(r) == len(NODES))
    assert sorted(r["metric"]["node"] for r in up) == NODES
    return monitor


def test_one_up_installs_the_stack_the_operator_creates_the_dcgm_servicemonitor_and_verify_queries_it(
        cluster, tmp_path, stand_ins):
    """One test, so that the stack is installed once for all of it (an `up` with helm takes about a minute here)."""
    exporters, prometheus = stand_ins
    cluster.emu.proxy_service(STACK_NS, STACK_SERVICE, prometheus.url)
    result, document = cli("up", "-c", str(write_config(tmp_path, cluster)), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    # every request of a whole `up` (helm's included) is one the role `gpu-bootstrap rbac --for up` grants (#23)
    assert uncovered(cluster.emu.requests.all(), "up", write_config(tmp_path, cluster)) == []
    assert statuses(document) == {"preflight": "probed", "node-prep": "applied", "gpu-pools": "skipped", "monitoring": "applied",
                                  "gpu-operator": "applied", "binpack-scheduler": "applied", "admission-opa": "applied",
                                  "admission": "applied", "queues": "skipped", "validate": "skipped"}
    assert "Prometheus answers; dashboards and alerts in place; the DCGM exporter is not deployed yet" in \
        message(document, "monitoring")
    releases = {r["name"]: r for r in json.loads(cluster.helm("list", "-A", "-o", "json").stdout)}
    assert releases["kube-prometheus-stack"]["chart"] == "kube-prometheus-stack-88.5.3"
    values = json.loads(cluster.helm("get", "values", "kube-prometheus-stack", "-n", STACK_NS, "-o", "json").stdout)
    assert values["prometheus"]["prometheusSpec"]["serviceMonitorSelectorNilUsesHelmValues"] is False
    assert render.installed_by_us(values)
    prom = cluster.emu.list("prometheuses", STACK_NS)[0]
    assert prom["spec"]["serviceMonitorSelector"] == {} and prom["spec"]["ruleSelector"] == {}
    # the DCGM ServiceMonitor exists after one up, with the values both steps agree on
    monitor = start_scraping(cluster, prometheus, exporters)
    endpoint = monitor["spec"]["endpoints"][0]
    scrape = render.dcgm_service_monitor("15s", {"release": "kube-prometheus-stack"})
    assert endpoint["honorLabels"] is True and endpoint["interval"] == "15s"
    assert endpoint["relabelings"] == scrape["relabelings"]
    assert monitor["metadata"]["labels"] == {"app": "nvidia-dcgm-exporter", "release": "kube-prometheus-stack"}
    rule = cluster.emu.get("prometheusrules", render.RULE_NAME, STACK_NS)
    assert rule["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-bootstrap"
    assert len(cluster.emu.list("configmaps", STACK_NS, "app.kubernetes.io/part-of=gpu-bootstrap-monitoring")) == 5
    # the relabeling gives every series a node label from either exporter dialect; unheld GPUs get no pod label
    series = prometheus.query('count by (node, Hostname, hostname) (DCGM_FI_DEV_GPU_UTIL)')
    assert sorted((s["metric"]["node"], s["metric"].get("Hostname", s["metric"].get("hostname")))
                  for s in series) == [("node5", "node5"), ("node6", "node6")]
    assert prometheus.query('DCGM_FI_DEV_GPU_UTIL{pod=~"nvidia-dcgm-exporter.*"}') == []
    # a rerun with nothing new writes nothing
    config = write_config(tmp_path, cluster)
    cluster.emu.requests.clear()
    result, document = cli("up", "-c", str(config), tmp_path=tmp_path)
    assert result.exit_code == 0 and statuses(document)["monitoring"] == "unchanged", result.output
    assert cluster.emu.requests.writes() == []
    # a changed retention upgrades the release; verify now finds the exporter and asks Prometheus for its targets
    config = write_config(tmp_path, cluster, "  retention: 30d\n")
    result, document = cli("up", "-c", str(config), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert message(document, "monitoring") == ("install mode (monitoring/kube-prometheus-stack-prometheus): DCGM "
                                               "exporter scraped on 2 GPU node(s); dashboards and alerts in place")
    assert cluster.emu.list("prometheuses", STACK_NS)[0]["spec"]["retention"] == "30d"
    # doctor: the real queries through the emulator's service proxy
    cluster.emu.seed({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train-0", "namespace": "default"},
                      "spec": {"nodeName": "node5", "containers": [{"name": "trainer", "image": "cuda",
                                                                   "resources": {"limits": {"nvidia.com/gpu": 4}}}],
                               "tolerations": [{"operator": "Exists"}]}})
    cluster.emu.settle()
    cluster.emu.requests.clear()
    result, document = cli("doctor", "-c", str(config), tmp_path=tmp_path)
    checks = [c for c in document["checks"] if c["id"] == "monitoring"]
    assert [c["status"] for c in checks] == ["pass", "pass"], checks
    assert uncovered(cluster.emu.requests.all(), "doctor", config) == []
    assert checks[1]["message"] == ("DCGM exporter scraped on every GPU node (2); series carry namespace/pod for the "
                                    "1 running GPU pod(s)")
    # an exporter that stops mapping GPUs to pods is named
    for exporter in exporters.values():
        exporter.pods = False
    prometheus.wait_for('count(DCGM_FI_DEV_GPU_UTIL{pod!=""})', lambda r: not r)
    result, document = cli("doctor", "-c", str(config), tmp_path=tmp_path)
    checks = [c for c in document["checks"] if c["id"] == "monitoring"]
    assert checks[1]["status"] == "warn" and "but no DCGM series has a pod label" in checks[1]["message"]
    for exporter in exporters.values():
        exporter.pods = True
    # a node whose exporter Prometheus cannot scrape fails verify, naming the node
    exporters["node6"].fail()
    prometheus.wait_for('up{job="nvidia-dcgm-exporter",node="node6"} == 0', bool)
    config = write_config(tmp_path, cluster, "  retention: 31d\n  wait_timeout: 10\n")
    config.write_text(config.read_text().replace("  wait_timeout: 60\n", ""))
    result, document = cli("up", "-c", str(config), tmp_path=tmp_path)
    assert result.exit_code == 1
    assert "no healthy DCGM exporter target in Prometheus for node6" in document["error"]


def test_teardown_uninstalls_the_stack_we_installed_and_crds_only_when_purged(cluster, tmp_path, stand_ins):
    exporters, prometheus = stand_ins
    cluster.emu.proxy_service(STACK_NS, STACK_SERVICE, prometheus.url)
    config = write_config(tmp_path, cluster)
    assert cli("up", "-c", str(config), tmp_path=tmp_path)[0].exit_code == 0
    result = runner.invoke(app, ["teardown", "-c", str(config), "--yes", "--log-file", str(tmp_path / "t.log")])
    assert result.exit_code == 0, result.output
    assert json.loads(cluster.helm("list", "-A", "-o", "json").stdout) == []
    cluster.emu.settle()
    assert cluster.emu.list("configmaps", None, render.OWNED_SELECTOR) == []
    crds = {c["metadata"]["name"] for c in cluster.emu.list("customresourcedefinitions")}
    assert "prometheuses.monitoring.coreos.com" in crds
    assert cli("up", "-c", str(config), tmp_path=tmp_path)[0].exit_code == 0
    result = runner.invoke(app, ["teardown", "-c", str(config), "--yes", "--purge-crds", "--log-file",
                                 str(tmp_path / "t.log")])
    assert result.exit_code == 0, result.output
    cluster.emu.settle()
    crds = {c["metadata"]["name"] for c in cluster.emu.list("customresourcedefinitions")}
    assert not any(name.endswith(".monitoring.coreos.com") for name in crds)


# --- attach mode -------------------------------------------------------------------------------------------------------
OBSERVABILITY = "observability"
PROMETHEUS = {
    "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
    "metadata": {"name": "main", "namespace": OBSERVABILITY, "labels": {"team": "platform"}},
    "spec": {"serviceMonitorSelector": {"matchLabels": {"team": "gpu"}},
             "serviceMonitorNamespaceSelector": {"matchExpressions": [
                 {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["gpu-operator", "apps"]}]},
             "ruleSelector": {"matchExpressions": [{"key": "prometheus", "operator": "In", "values": ["main"]}]},
             "ruleNamespaceSelector": None, "retention": "7d"}}
GRAFANA = {
    "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "grafana", "namespace": OBSERVABILITY},
    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "grafana"}},
             "template": {"metadata": {"labels": {"app": "grafana"}}, "spec": {"containers": [
                 {"name": "grafana", "image": "grafana/grafana:12.0.0"},
                 {"name": "grafana-sc-dashboard", "image": "quay.io/kiwigrid/k8s-sidecar:1.30.0",
                  "env": [{"name": "LABEL", "value": "dashboards-for-grafana"}, {"name": "LABEL_VALUE", "value": "yes"},
                          {"name": "FOLDER", "value": "/tmp/dashboards"},
                          {"name": "NAMESPACE", "value": "dashboards,observability"}]}]}}}}


def preload_prometheus_operator(cluster) -> None:
    """A cluster that already runs the Prometheus Operator: its CRDs (from the chart), a Prometheus with non-default
    selectors, its Service, and a Grafana with a dashboard sidecar watching other labels."""
    crds = cluster.helm("show", "crds", str(chart("kube-prometheus-stack-88.5.3.tgz"))).stdout
    cluster.kubectl("apply", "--server-side", "-f", "-", input=crds, timeout=120)
    cluster.kubectl("create", "namespace", OBSERVABILITY)
    cluster.emu.settle()
    cluster.emu.seed(PROMETHEUS)
    cluster.emu.seed({"apiVersion": "v1", "kind": "Service",
                      "metadata": {"name": "prometheus-operated", "namespace": OBSERVABILITY},
                      "spec": {"clusterIP": "None", "selector": {"app.kubernetes.io/name": "prometheus"},
                               "ports": [{"name": "web", "port": 9090, "targetPort": "web"}]}})
    cluster.emu.seed(GRAFANA)
    cluster.emu.settle()


def test_attach_mode_labels_our_objects_for_the_prometheus_found_and_changes_nothing_of_it(cluster, tmp_path,
                                                                                           stand_ins):
    exporters, prometheus = stand_ins
    preload_prometheus_operator(cluster)
    cluster.emu.proxy_service(OBSERVABILITY, "prometheus-operated", prometheus.url)
    before = cluster.emu.get("prometheuses", "main", OBSERVABILITY)
    config = write_config(tmp_path, cluster)
    out = tmp_path / "plan"
    result, document = cli("up", "-c", str(config), "--dry-run", "--only", "monitoring", "--render-dir", str(out),
                           tmp_path=tmp_path)  # (the gpu-operator chart cannot be dry-run before its CRDs exist)
    assert result.exit_code == 0, result.output
    plan = (out / "monitoring" / "01-apply-prometheusrule-gpu-bootstrap-gpu-alerts.yaml").read_text()
    for line in ("monitoring.mode: auto: the cluster runs the Prometheus Operator; attaching to Prometheus "
                 "observability/main (it is not changed)",
                 "serviceMonitorSelector team=gpu → the DCGM ServiceMonitor gets team=gpu",
                 "ruleSelector prometheus In main → our PrometheusRule gets prometheus=main",
                 "serviceMonitorNamespaceSelector namespaces matching kubernetes.io/metadata.name In "
                 "gpu-operator,apps includes gpu-operator",
                 "ruleNamespaceSelector its own namespace observability (selector null): our PrometheusRule goes to "
                 "observability",
                 "Grafana dashboard sidecar in Deployment observability/grafana: ConfigMaps labelled "
                 "dashboards-for-grafana=yes in dashboards, observability → our dashboards go to observability"):
        assert line in plan, plan
    result, document = cli("up", "-c", str(config), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert json.loads(cluster.helm("list", "-A", "-o", "json").stdout)[0]["name"] == "gpu-operator"  # no stack
    assert cluster.emu.get("prometheuses", "main", OBSERVABILITY)["metadata"]["resourceVersion"] == \
        before["metadata"]["resourceVersion"]
    rule = cluster.emu.get("prometheusrules", render.RULE_NAME, OBSERVABILITY)
    assert rule["metadata"]["labels"]["prometheus"] == "main"
    boards = cluster.emu.list("configmaps", OBSERVABILITY, "dashboards-for-grafana=yes")
    assert len(boards) == 5
    monitor = start_scraping(cluster, prometheus, exporters)
    assert monitor["metadata"]["labels"]["team"] == "gpu"
    result, document = cli("doctor", "-c", str(config), tmp_path=tmp_path)
    checks = [c for c in document["checks"] if c["id"] == "monitoring"]
    assert [c["status"] for c in checks] == ["pass", "pass"], checks
    # teardown removes our objects and leaves the user's Prometheus, its CRDs and Grafana alone
    result = runner.invoke(app, ["teardown", "-c", str(config), "--yes", "--purge-crds", "--log-file",
                                 str(tmp_path / "t.log")])
    assert result.exit_code == 0, result.output
    cluster.emu.settle()
    assert cluster.emu.get("prometheusrules", render.RULE_NAME, OBSERVABILITY) is None
    assert cluster.emu.list("configmaps", OBSERVABILITY, "dashboards-for-grafana=yes") == []
    assert cluster.emu.get("prometheuses", "main", OBSERVABILITY) is not None
    assert cluster.emu.get("deployments", "grafana", OBSERVABILITY) is not None


def test_attach_mode_refuses_a_prometheus_that_would_ignore_the_dcgm_servicemonitor(cluster, tmp_path):
    preload_prometheus_operator(cluster)
    narrow = json.loads(json.dumps(PROMETHEUS))
    narrow["spec"]["serviceMonitorNamespaceSelector"] = None  # its own namespace only
    cluster.emu.seed(narrow)
    cluster.emu.requests.clear()
    result, document = cli("up", "-c", str(write_config(tmp_path, cluster, "  mode: attach\n")), tmp_path=tmp_path)
    assert result.exit_code == 1
    assert ("observability/main looks for ServiceMonitors only in its own namespace observability (selector null), "
            "not in gpu-operator") in document["error"]
    assert [r for r in cluster.emu.requests.writes() if "/namespaces/gpu-bootstrap/" not in r.path] == []


def test_an_unreadable_prometheus_is_not_taken_for_none(cluster, tmp_path):
    preload_prometheus_operator(cluster)
    cluster.emu.faults.add("GET", r"/apis/monitoring.coreos.com/v1/prometheuses$", status=403)
    cluster.emu.requests.clear()
    result, document = cli("up", "-c", str(write_config(tmp_path, cluster)), tmp_path=tmp_path)
    assert result.exit_code == 1, result.output
    assert "prometheuses" in document["error"]
    assert json.loads(cluster.helm("list", "-A", "-o", "json").stdout) == []  # nothing installed on a guess


def test_the_proxy_is_a_real_api_path_for_kubectl(cluster, tmp_path, stand_ins):
    _exporters, prometheus = stand_ins
    cluster.kubectl("create", "namespace", STACK_NS)
    cluster.emu.seed({"apiVersion": "v1", "kind": "Service", "metadata": {"name": STACK_SERVICE, "namespace": STACK_NS},
                      "spec": {"ports": [{"name": "http-web", "port": 9090}]}})
    base = f"/api/v1/namespaces/{STACK_NS}/services/{STACK_SERVICE}:http-web/proxy"
    missing = cluster.kubectl("get", "--raw", f"{base}/api/v1/query?query=vector(1)", check=False)
    assert missing.returncode != 0 and "no endpoints available" in missing.stderr
    cluster.emu.proxy_service(STACK_NS, STACK_SERVICE, prometheus.url)
    answer = json.loads(cluster.kubectl("get", "--raw", f"{base}/api/v1/query?query=vector(42)").stdout)
    assert answer["status"] == "success" and answer["data"]["result"][0]["value"][1] == "42"
    by_number = cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{STACK_NS}/services/{STACK_SERVICE}:9090/proxy"
                                             f"/api/v1/status/buildinfo")
    assert json.loads(by_number.stdout)["status"] == "success"
    wrong = cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{STACK_NS}/services/nope:9090/proxy/", check=False)
    assert wrong.returncode != 0 and 'services "nope" not found' in wrong.stderr
    assert any(r.verb == "proxy" for r in cluster.emu.requests.all())


def test_with_the_operator_first_the_dcgm_servicemonitor_comes_once_the_stack_brings_its_crd(cluster, tmp_path):
    """An operator that reconciles a wanted ServiceMonitor before Prometheus' CRDs exist stays notReady and requeues
    (NVIDIA's controller: ServiceMonitor() in controllers/object_controls.go, seen in tests/test_gpu_operator_real.py),
    so it makes the ServiceMonitor once the monitoring step installed them. (The stand-in once said it never would.)"""
    playbook = tmp_path / "operator-first.yaml"
    playbook.write_text("name: operator-first\nsteps: [preflight, node-prep, gpu-operator, monitoring]\n")
    config = write_config(tmp_path, cluster).read_text()  # (no Prometheus behind the proxy: verify gives up at 10 s)
    (tmp_path / "gpu-bootstrap.yaml").write_text(config.replace("  wait_timeout: 60\n", "  wait_timeout: 10\n"))
    result, document = cli("up", "-c", str(tmp_path / "gpu-bootstrap.yaml"), "--playbook", str(playbook),
                           tmp_path=tmp_path)
    assert statuses(document)["gpu-operator"] == "applied", result.output
    cluster.emu.settle()
    assert cluster.emu.get("customresourcedefinitions", "servicemonitors.monitoring.coreos.com") is not None
    assert cluster.emu.get("servicemonitors", "nvidia-dcgm-exporter", "gpu-operator") is not None
    assert cluster.emu.get("clusterpolicies", "cluster-policy")["status"]["state"] == "ready"


@pytest.mark.parametrize("emulator_options", [{"kube_version": "1.33.2", "gpu_nodes": NODES, "gpu_operator": True}])
def test_on_an_all_gpu_cluster_the_stack_tolerates_the_gpu_taint(cluster, tmp_path, stand_ins):
    _exporters, prometheus = stand_ins
    cluster.emu.proxy_service(STACK_NS, STACK_SERVICE, prometheus.url)
    result, document = cli("up", "-c", str(write_config(tmp_path, cluster)), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert statuses(document)["monitoring"] == "applied"
    values = json.loads(cluster.helm("get", "values", "kube-prometheus-stack", "-n", STACK_NS, "-o", "json").stdout)
    assert values["prometheusOperator"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                            "effect": "NoSchedule"}]
    pods = cluster.emu.list("pods", STACK_NS)
    assert pods and all(p["spec"].get("nodeName") in NODES for p in pods)


def test_a_run_killed_during_the_stack_install_converges_on_rerun(cluster, tmp_path, stand_ins):
    """SIGKILL to gpu-bootstrap and helm mid-install leaves the release pending-install, with gpu-bootstrap's marker
    already in it: the rerun recognises the stack as its own (mode auto does not attach to it), clears the pending
    release and converges."""
    import os
    import signal
    import subprocess
    import sys
    import time
    _exporters, prometheus = stand_ins
    cluster.emu.proxy_service(STACK_NS, STACK_SERVICE, prometheus.url)
    config = write_config(tmp_path, cluster)
    report = write_report(tmp_path / "report.json", NODES)
    cluster.emu.faults.add("PATCH", r"/deployments/kube-prometheus-stack-operator$", delay=3, count=1)
    process = subprocess.Popen([sys.executable, "-m", "gpu_bootstrap", "up", "-c", str(config), "--only",
                                "monitoring", "--preflight-report", str(report), "--log-file",
                                str(tmp_path / "killed.log")], cwd=Path(__file__).resolve().parent.parent,
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=tool_env())
    deadline = time.monotonic() + 90
    while not any(r.path.endswith("/deployments/kube-prometheus-stack-operator") and r.method == "PATCH"
                  for r in cluster.emu.requests.all()):
        assert time.monotonic() < deadline, "the install never reached the operator Deployment"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    time.sleep(3.2)
    status = json.loads(cluster.helm("status", "kube-prometheus-stack", "-n", STACK_NS, "-o", "json").stdout)
    assert status["info"]["status"] == "pending-install" and render.installed_by_us(status["config"])
    result, document = cli("up", "-c", str(config), "--only", "monitoring", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert statuses(document)["monitoring"] == "applied"
    [release] = json.loads(cluster.helm("list", "-A", "-o", "json").stdout)
    assert release["status"] == "deployed"
    assert cluster.emu.get("prometheusrules", render.RULE_NAME, STACK_NS) is not None


def test_a_cluster_with_prometheus_operator_0_80_crds_gets_0_93_crds_before_the_stack(cluster, tmp_path, stand_ins):
    """CRDs an older stack left (v0.80.0) are server-side applied at the chart's 0.93.1 before kube-prometheus-stack
    88.5.3 is installed (helm would keep the old ones); the second run makes no CRD write."""
    import tarfile

    import yaml

    from gpu_bootstrap.adapters.helm import _CrdLoader
    with tarfile.open(chart("prometheus-operator-crds-v0.80.0.tgz")) as archive:
        old = [doc for member in archive.getmembers() if member.name.endswith(".yaml")
               for doc in yaml.load_all(archive.extractfile(member).read(), Loader=_CrdLoader) if doc]
    assert len(old) == 10
    for crd in old:
        cluster.emu.seed(crd)
    _exporters, prometheus = stand_ins
    cluster.emu.proxy_service(STACK_NS, STACK_SERVICE, prometheus.url)
    config = write_config(tmp_path, cluster)
    result, document = cli("up", "-c", str(config), "--only", "monitoring", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    versions = {c["metadata"]["name"]: c["metadata"]["annotations"]["operator.prometheus.io/version"]
                for c in cluster.emu.list("customresourcedefinitions") if c["spec"]["group"] == "monitoring.coreos.com"}
    assert set(versions.values()) == {"0.93.1"} and len(versions) == 10, versions
    assert json.loads(cluster.helm("list", "-A", "-o", "json").stdout)[0]["chart"] == "kube-prometheus-stack-88.5.3"
    cluster.emu.requests.clear()
    result, document = cli("up", "-c", str(config), "--only", "monitoring", tmp_path=tmp_path)
    assert result.exit_code == 0 and statuses(document)["monitoring"] == "unchanged", result.output
    assert not [r for r in cluster.emu.requests.writes() if "customresourcedefinitions" in r.path]


def test_a_refused_service_proxy_route_does_not_fail_a_running_prometheus(cluster, tmp_path):
    """A private control plane: the API server cannot reach Prometheus (here its proxy forwards to a closed port, and
    answers 503 'error trying to reach service: ... Connection refused'). Without a ready endpoint that is just a
    Prometheus not up yet, and verify waits it out; with one, the step passes within a few answers, saying what it
    could not verify and how to check it, instead of waiting the full wait_timeout and failing."""
    import socket

    from gpu_bootstrap.steps.monitoring_prometheus import ROUTE_CONFIRMATIONS
    preload_prometheus_operator(cluster)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    cluster.emu.proxy_service(OBSERVABILITY, "prometheus-operated", f"http://127.0.0.1:{closed}")
    config = write_config(tmp_path, cluster)
    config.write_text(config.read_text().replace("  wait_timeout: 60\n", "  wait_timeout: 10\n"))
    result, document = cli("up", "-c", str(config), "--only", "monitoring", tmp_path=tmp_path)
    assert result.exit_code == 1, result.output
    assert "not ready after 10s" in document["error"] and "Connection refused" in document["error"]
    cluster.emu.seed({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "prometheus-main-0", "namespace": OBSERVABILITY, "labels": {"app.kubernetes.io/name": "prometheus"}},
        "spec": {"nodeName": "cpu-1", "containers": [{"name": "prometheus", "image": "prom/prometheus"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.9", "conditions": [{"type": "Ready", "status": "True"}]}})
    cluster.emu.settle()
    cluster.emu.requests.clear()
    result, document = cli("up", "-c", str(config), "--only", "monitoring", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    text = message(document, "monitoring")
    assert "Service observability/prometheus-operated has ready endpoints" in text
    assert "not verified: Prometheus cannot be reached through the API server's service proxy" in text
    assert "kubectl -n observability port-forward svc/prometheus-operated 9090:9090" in text
    assert len([r for r in cluster.emu.requests.all() if r.verb == "proxy"]) == ROUTE_CONFIRMATIONS
