"""The live suite's cluster, one of three:
* external: the one GPU_BOOTSTRAP_LIVE_KUBECONFIG names (scripts/test-live, e.g. a kind cluster with fake GPUs);
* local (the default when its components are built, and always in .ci/run): the real control plane of
  tests/localcluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler built from Go modules; KWOK's fake
  GPU and CPU nodes; the real OPA, kube-scheduler, Prometheus Operator and Prometheus run by the agent for their
  pods; NVIDIA's gpu-operator controller of the 25.3 line, whose chart `up` installs there). `up` runs its whole
  default playbook, gpu-operator and validate included (their GPU parts are stand-ins: standins.py);
* emulator: tests/kubeapi, where neither of the others can be had (GPU_BOOTSTRAP_LIVE_TARGET=emulator forces it).

Everything the tests do goes through what a user has: the gpu-bootstrap CLI, the real kubectl, and Prometheus behind
the API server's service proxy. The emulator differs where nothing real can run here, and the fixture says how:
* its nodes are a kind-like cluster (an untainted control plane, two workers labelled for fake GPUs), and the fake
  GPUs are added by tests/live/fake_gpus.py through kubectl, as scripts/test-live does on a real cluster;
* the kube-prometheus-stack chart comes from ../shared/charts (a real cluster pulls it from its repository);
* behind the Prometheus Service's proxy stands a real local Prometheus; no Prometheus Operator runs, so after `up` the
  fixture does the operator's one job the tests look at: it loads the PrometheusRule's groups as a rule file.
"""
from __future__ import annotations

import json
import os
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.live import fake_gpus
from tests.tools import ROOT, tool_env, missing, run, tool, wait_established

LIVE_KUBECONFIG = os.environ.get("GPU_BOOTSTRAP_LIVE_KUBECONFIG")
EMULATOR_VERSION = os.environ.get("GPU_BOOTSTRAP_LIVE_EMULATOR_VERSION", "1.33.2")
PLAYBOOK = Path(__file__).resolve().parent / "playbook.yaml"
FULL_PLAYBOOK = ROOT / "playbooks" / "default.yaml"  # the local cluster runs every step
TEST_NAMESPACE = "gpu-bootstrap-live-test"  # the tests' own pods; created before the audit, removed at the end
STACK_NS, STACK_SERVICE = "monitoring", "kube-prometheus-stack-prometheus"
SCHEDULER = "gpu-binpack-scheduler"
PAUSE = "registry.k8s.io/pause:3.10"
TEARDOWN_TEST = "test_teardown_leaves_no_object_of_ours"
runner = CliRunner()


def pytest_configure(config):
    """Against a real cluster, SIGTERM stops the suite as Ctrl-C does, so the fixtures still tear down what `up`
    installed (scripts/test-live forwards an interrupt this way)."""
    if LIVE_KUBECONFIG:
        import signal

        def interrupt(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")
        signal.signal(signal.SIGTERM, interrupt)


def pytest_collection_modifyitems(config, items):
    """The teardown test runs after every other test of tests/live (after pytest-randomly's shuffle): they all share
    the session's one `up`. Correctness does not depend on this: a test after teardown deploys again
    (Deployment.ensure)."""
    here = Path(__file__).resolve().parent
    for item in [i for i in items if i.name == TEARDOWN_TEST]:
        items.remove(item)
        live = [index for index, other in enumerate(items) if Path(str(other.path)).resolve().parent == here]
        items.insert(live[-1] + 1 if live else len(items), item)


@dataclass
class Target:
    """The cluster under test and what real clients need to reach it."""

    kubeconfig: Path
    home: Path
    artifacts: Path
    emu: object = None  # tests.kubeapi.Emulator on the emulator run
    prometheus: object = None  # tests.monitoring.live.LocalPrometheus on the emulator run
    calls: int = 0
    cluster: object = None  # tests.localcluster.cluster.LocalCluster on the local run

    @property
    def live(self) -> bool:
        return self.emu is None

    @property
    def local(self) -> bool:
        return self.cluster is not None

    @property
    def playbook(self) -> Path:
        return FULL_PLAYBOOK if self.local else PLAYBOOK

    def steps(self) -> list[str]:
        return [s if isinstance(s, str) else s["id"] for s in yaml.safe_load(self.playbook.read_text())["steps"]]

    @property
    def env(self) -> dict:
        return tool_env(self.home)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None, timeout: float = 180):
        return run([tool("kubectl"), "--kubeconfig", str(self.kubeconfig), *args], self.env, timeout, check, input)

    def json(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def wait_established(self, *crds: str, timeout: float = 60) -> None:
        wait_established(lambda crd: self.json("get", f"crd/{crd}"), *crds, timeout=timeout)

    def cli(self, *args: str) -> tuple:
        """gpu-bootstrap in-process with -o json; its log goes to the artifacts folder (CI uploads it on failure)."""
        self.calls += 1
        log = self.artifacts / f"{self.calls:02d}-{args[0]}.log"
        env = {k: v for k, v in self.env.items() if k.startswith("HELM_") or k in ("PATH", "KUBECACHEDIR")}
        from gpu_bootstrap.cli.commands import app
        from tests.conftest import _process_state_kept
        # put back the signal handlers and the logger the run sets: the session-scoped deployment runs this before
        # any test's own guard (tests/conftest.py) has saved them, and would leave them to every later test in the
        # worker (test_process_state.py failed so)
        with _process_state_kept():
            result = runner.invoke(app, [*args, "-o", "json", "--log-file", str(log)], env=env)
        document = json.loads(result.stdout) if result.stdout.startswith("{") else None
        return result, document, log

    @property
    def kube_minor(self) -> int:
        version = json.loads(self.kubectl("version", "-o", "json").stdout)["serverVersion"]
        return int(version["minor"].rstrip("+"))

    def gpu_nodes(self) -> dict[str, int]:
        """Nodes advertising nvidia.com/gpu (the fake GPUs), by name."""
        found = {}
        for node in self.json("get", "nodes")["items"]:
            gpus = int((node["status"].get("allocatable") or {}).get(fake_gpus.RESOURCE, "0") or 0)
            if gpus:
                found[node["metadata"]["name"]] = gpus
        return found

    def prometheus_api(self, path: str, **params) -> dict:
        """Prometheus' HTTP API through the API server's service proxy, as `kubectl get --raw` reaches it."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        raw = self.kubectl("get", "--raw",
                           f"/api/v1/namespaces/{STACK_NS}/services/{STACK_SERVICE}:9090/proxy/api/v1/{path}{query}")
        answer = json.loads(raw.stdout)
        assert answer["status"] == "success", answer
        return answer["data"]


def _tools(local: bool) -> None:
    tool("kubectl")
    tool("helm")
    from tests.kubeapi import cel, rego
    if LIVE_KUBECONFIG or local:
        return
    tool("prometheus")
    if not rego.available():
        missing("the Rego engine (pip package gordon-to-regorus) is not installed")
    if not cel.available():
        missing("the CEL runtime (pip package cel-expr-python) is not installed")


@pytest.fixture(scope="session")
def target(request, tmp_path_factory):
    from tests.conftest import local_cluster_wanted
    local = not LIVE_KUBECONFIG and local_cluster_wanted()
    _tools(local)
    home = tmp_path_factory.mktemp("live-home")
    artifacts = Path(os.environ.get("GPU_BOOTSTRAP_LIVE_ARTIFACTS") or tmp_path_factory.mktemp("live-artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    if LIVE_KUBECONFIG:
        yield Target(Path(LIVE_KUBECONFIG), home, artifacts)
        return
    if local:
        cluster = request.getfixturevalue("local_cluster")
        yield Target(cluster.kubeconfig, home, artifacts, cluster=cluster)
        return
    yield from _emulated(home, artifacts, tmp_path_factory.mktemp("live-prometheus"))


def _emulated(home: Path, artifacts: Path, prometheus_dir: Path):
    from tests.kubeapi import Emulator
    from tests.monitoring.live import LocalPrometheus

    # kind's shape: a control plane (untainted here, as docs/testing.md's kind recipe makes it) and two workers
    emu = Emulator(kube_version=EMULATOR_VERSION, cpu_nodes=["live-control-plane"])
    for worker in ("live-worker", "live-worker2"):
        emu.add_node(worker, labels={fake_gpus.LABEL: "true"})
    emu.start()
    (prometheus_dir / "rules").mkdir()
    prometheus = None
    try:
        prometheus = LocalPrometheus(prometheus_dir, "global: {scrape_interval: 5s, evaluation_interval: 5s}\n"
                                                     "rule_files: [rules/*.yaml]\n")
        emu.proxy_service(STACK_NS, STACK_SERVICE, prometheus.url)
        target = Target(emu.write_kubeconfig(home / "kubeconfig"), home, artifacts, emu, prometheus)
        fake_gpus.add(str(target.kubeconfig), kubectl_path=tool("kubectl"), env=target.env)
        yield target
    finally:
        if prometheus is not None:
            prometheus.stop()
        emu.stop()


def load_rules_as_the_operator_would(target: Target) -> None:
    """Emulator only: the Prometheus Operator turns every PrometheusRule its Prometheus selects into a rule file and
    reloads Prometheus. Nothing runs the operator here, so this does that for the rules `up` created."""
    rules = target.json("get", "prometheusrules", "-A")["items"]
    folder = target.prometheus.folder / "rules"
    for old in folder.glob("*.yaml"):
        old.unlink()
    for rule in rules:
        meta = rule["metadata"]
        (folder / f"{meta['namespace']}-{meta['name']}.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    config = (target.prometheus.folder / "prometheus.yml").read_text()
    target.prometheus.reload(config)
    want = {g["name"] for r in rules for g in r["spec"]["groups"]}
    deadline = time.monotonic() + 30
    while {g["name"] for g in target.prometheus_api("rules")["groups"]} != want:
        assert time.monotonic() < deadline, "the local Prometheus did not load the rule files"
        time.sleep(0.3)


def write_config(target: Target, nodes: list[str], folder: Path) -> Path:
    """The config the live suite deploys with; on the emulator the chart is the local copy of the same release."""
    monitoring = {"wait_timeout": 900}
    extra = {"validate": {"enabled": False}}
    if not target.live:
        from tests.conftest import chart
        monitoring = {"wait_timeout": 90, "chart": str(chart("kube-prometheus-stack-88.5.3.tgz"))}
    if target.local:  # every step; kube-prometheus-stack from ../shared/charts (no chart repository is reachable
        # here), and the gpu-operator chart whose real controller the local cluster runs (the 25.3 line's commit:
        # tests/localcluster/agent.py; Kubernetes 1.37 is outside its validated range, hence skip_version_check)
        from tests.conftest import chart
        from tests.localcluster.cluster import binaries
        monitoring = {"wait_timeout": 300, "chart": str(chart("kube-prometheus-stack-88.5.3.tgz"))}
        extra = {"gpu_operator": {"wait_timeout": 300, "chart": str(binaries()["gpu-operator-chart"]),
                                  "skip_version_check": True},
                 "validate": {"enabled": True, "timeout": 300}}
    config = {"cluster": {"kubeconfig": str(target.kubeconfig)}, "nodes": [{"name": n} for n in nodes],
              "monitoring": monitoring, "scheduler": {"wait_timeout": 600}, "admission": {"wait_timeout": 600},
              **extra}
    path = folder / "gpu-bootstrap.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@dataclass
class Deployment:
    """The session's one `up`, shared by every test of tests/live; the teardown test takes it down and marks it so."""

    target: Target
    config: Path
    report: Path
    nodes: dict[str, int]
    before: dict = field(default_factory=dict)  # audit of the cluster before the first `up`
    nodes_before: dict = field(default_factory=dict)
    first: dict | None = None  # the first `up`'s JSON document
    first_log: Path | None = None
    up: bool = False
    empty_dry_run: tuple | None = None  # `up --dry-run` with the dry-run role before the first `up` (local only)

    def run_up(self) -> tuple:
        return self.target.cli("up", "-c", str(self.config), "--playbook", str(self.target.playbook),
                               "--preflight-report", str(self.report))

    def ensure(self) -> "Deployment":
        if self.up:
            return self
        result, document, log = self.run_up()
        assert result.exit_code == 0, f"up failed (log: {log}):\n{result.output}"
        if self.first is None:
            self.first, self.first_log = document, log
        if not self.target.live:
            load_rules_as_the_operator_would(self.target)
        self.up = True
        return self


@pytest.fixture(scope="session")
def deployment(target, tmp_path_factory):
    from tests.live.audit import audit, node_view
    from tests.nodes.reports import write_report

    folder = tmp_path_factory.mktemp("live-config")
    nodes = target.gpu_nodes()
    if len(nodes) < 2:
        pytest.fail(f"the live suite needs two nodes with fake GPUs, found {sorted(nodes) or 'none'}: label two "
                    f"workers {fake_gpus.SELECTOR} and run scripts/test-live (it patches their capacity)")
    names = sorted(nodes)
    report = write_report(folder / "preflight-report.json", names, gpus=min(nodes.values()))
    state = Deployment(target, write_config(target, names, folder), report, nodes)
    # a namespace an interrupted run left Terminating must be gone before it can be made again
    target.kubectl("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=180s")
    target.kubectl("create", "namespace", TEST_NAMESPACE)
    try:
        state.before = audit(target)
        state.nodes_before = {n: node_view(target, n) for n in names}
        if target.local:
            state.empty_dry_run = dry_run_as_its_role(state, folder)
        state.ensure()
        yield state
    finally:
        target.kubectl("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        if state.up and target.live:  # leave the cluster as we found it, whatever failed
            target.cli("teardown", "-c", str(state.config), "--playbook", str(target.playbook), "--yes",
                       "--purge-crds")


def dry_run_as_its_role(state: Deployment, folder: Path) -> tuple:
    """`up --dry-run` on the still empty cluster as a token of `rbac --for dry-run` (its policy keeps it dry): the
    namespaces the role's header says to create first, then the plan. Its grant is removed after; the namespaces
    stay for `up` to adopt, as a user's would."""
    from tests.live.identities import grant, remove_all
    target = state.target
    kubeconfig = grant(target, state, "dry-run", folder, "gpu-bootstrap-live-empty/dry-run")
    try:
        return target.cli("up", "--dry-run", "-c", str(state.config), "--playbook", str(target.playbook),
                          "--preflight-report", str(state.report), "--kubeconfig", str(kubeconfig))
    finally:
        remove_all(target, "gpu-bootstrap-live-empty")


# --- pods the tests create: pause containers requesting the fake GPUs -------------------------------------------------
def pause_pod(name: str, gpus: int = 1, scheduler: str | None = None) -> dict:
    """A pod that needs no GPU to run, requesting `gpus` fake ones; it tolerates node-prep's taint and passes the
    restricted Pod Security profile (so a namespace that enforces it takes it too)."""
    limits = {fake_gpus.RESOURCE: str(gpus)} if gpus else {}
    spec = {"terminationGracePeriodSeconds": 0,  # restartPolicy Always: a pause pod runs (and holds GPUs) until deleted
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65535, "seccompProfile": {"type": "RuntimeDefault"}},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "pause", "image": PAUSE,
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi", **limits},
                                          "limits": {"memory": "16Mi", **limits}},
                            "securityContext": {"allowPrivilegeEscalation": False,
                                                "capabilities": {"drop": ["ALL"]}}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": TEST_NAMESPACE, "labels": {"app": "gpu-bootstrap-live-test"}},
            "spec": spec}


def create(target: Target, pod: dict, check: bool = True):
    """kubectl create, as a user would; the pod as the API server stored it (after admission), or the result."""
    result = target.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(pod), check=check)
    return json.loads(result.stdout) if check else result


def wait_bound(target: Target, name: str, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while True:
        pod = target.json("get", "pod", name, "-n", TEST_NAMESPACE)
        if pod["spec"].get("nodeName"):
            return pod["spec"]["nodeName"]
        if time.monotonic() > deadline:
            raise AssertionError(f"pod {name} was not bound within {timeout:.0f}s: {pod.get('status')}")
        time.sleep(0.5)


def delete_test_pods(target: Target) -> None:
    target.kubectl("delete", "pods", "-n", TEST_NAMESPACE, "-l", "app=gpu-bootstrap-live-test", "--wait=true",
                   "--grace-period=0", "--force", "--ignore-not-found", check=False)
    deadline = time.monotonic() + 120
    while target.json("get", "pods", "-n", TEST_NAMESPACE)["items"]:
        assert time.monotonic() < deadline, "the test pods did not go away"
        time.sleep(0.5)


@pytest.fixture
def test_pods(target):
    """Each test removes the pods it made, so the others see the cluster as `up` left it."""
    delete_test_pods(target)
    yield
    delete_test_pods(target)
