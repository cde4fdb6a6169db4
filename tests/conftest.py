"""Shared fixtures: a running Kubernetes API emulator with its kubeconfig, and helpers to run the real clients."""
from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import http.client
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kubeapi import Emulator
from tests.localcluster.rest import Verbs
from tests.tools import ROOT, tool_env, run, shared_dir, tool

SHARED = shared_dir()
CHARTS = SHARED / "charts"


@contextmanager
def _process_state_kept():
    """An in-process CLI run (CliRunner) sets process-wide state: the gpu_bootstrap logger (DEBUG, not propagating, a
    file handler on that run's log) and SIGINT/SIGTERM handlers. This puts both back as they were on entry, so that
    a later test in the same worker sees its own log records (caplog) and the signal handlers it started with (the
    live suite's SIGTERM cleanup), whatever order the tests run in."""
    import logging
    import signal
    import threading
    from gpu_bootstrap.core import interrupts
    logger = logging.getLogger("gpu_bootstrap")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    main = threading.current_thread() is threading.main_thread()
    signals = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    finally:
        for handler in [h for h in logger.handlers if h not in handlers]:
            logger.removeHandler(handler)
            handler.close()
        for handler in [h for h in handlers if h not in logger.handlers]:
            logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
        interrupts.reset()  # forgets a received signal; puts back the defaults, so the saved handlers go back after it
        for sig, handler in signals.items():
            if handler is not None:
                signal.signal(sig, handler)


@pytest.fixture(autouse=True, scope="module")
def _process_state_kept_per_module():
    """Module-scoped fixtures (a shared `up`, a fleet) may run the CLI too: their state goes with their module."""
    with _process_state_kept():
        yield


@pytest.fixture(autouse=True)
def _process_state_kept_per_test():
    with _process_state_kept():
        yield


@pytest.fixture
def helm_on_path(monkeypatch, tmp_path):
    """The pinned helm first on PATH, with its caches and config under tmp_path (tests that shell out to helm)."""
    for key, value in tool_env(tmp_path).items():
        if key.startswith("HELM_") or key == "PATH":
            monkeypatch.setenv(key, value)
    tool("helm")


def chart(name: str) -> Path:
    """A real upstream chart from ../shared/charts (see its README for provenance), or one that
    scripts/install-test-tools took from its source module into .tools/charts (CHART_MODULES there)."""
    path = CHARTS / name
    if not path.exists() and (ROOT / ".tools" / "charts" / name).exists():
        path = ROOT / ".tools" / "charts" / name
    if not path.exists():
        from tests.tools import missing
        missing(f"chart {path} is not present")
    return path


@dataclass
class Cluster:
    """An emulator plus what real clients need to reach it."""

    emu: Emulator
    kubeconfig: Path
    home: Path

    @property
    def env(self) -> dict:
        return tool_env(self.home)

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60, input: str | None = None):
        return run([tool("kubectl"), "--kubeconfig", str(self.kubeconfig), *args], self.env, timeout, check, input)

    def helm(self, *args: str, check: bool = True, timeout: float = 180):
        return run([tool("helm"), "--kubeconfig", str(self.kubeconfig), *args], self.env, timeout, check)


def local_cluster_wanted() -> bool:
    """Whether tests that can use the local real cluster (tests/localcluster) should: when its components are built,
    or when .ci/run requires every tool (then a missing build fails the test instead of quietly using the emulator).
    GPU_BOOTSTRAP_LIVE_TARGET=emulator (or =local) decides it by hand."""
    chosen = os.environ.get("GPU_BOOTSTRAP_LIVE_TARGET")
    if chosen in ("emulator", "local"):
        return chosen == "local"
    from tests.localcluster.cluster import missing_binaries
    from tests.tools import tools_required
    return tools_required() or not missing_binaries()


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory):
    """A real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) with KWOK's fake GPU and
    CPU nodes and the agent (tests/localcluster), one per test session and worker: the tests that use it are in the
    xdist groups "live" (tests/live: one deployment) and "live-api" (the emulator's API tests on the real server), so
    at most two workers start one. The two must not share a cluster: the API tests' objects (labelled as ours) and
    the deployment's pods (on the nodes the API tests list by field selector) break each other's assertions. It dies with the worker (PR_SET_PDEATHSIG), and is stopped and
    removed at the end of the session."""
    from tests.localcluster import cluster as local
    from tests.tools import missing
    absent = local.missing_binaries()
    if absent:
        missing("the local cluster's components are not built: " + ", ".join(absent))
    folder = tmp_path_factory.mktemp("local-cluster")
    try:
        started = local.up(folder, die_with_parent=True)
    except local.ClusterError as error:
        pytest.fail(f"the local cluster did not start: {error}")
    try:
        yield started
    finally:
        local.down(folder)


@pytest.fixture
def emulator_options() -> dict:
    """Override in a module to start the emulator differently (e.g. another Kubernetes version)."""
    return {"gpu_nodes": ["gpu-1", "gpu-2"], "cpu_nodes": ["cpu-1"]}


@pytest.fixture
def cluster(tmp_path, emulator_options) -> Cluster:
    emu = Emulator(**emulator_options).start()
    kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
    home = tmp_path / "home"
    home.mkdir()
    try:
        yield Cluster(emu, kubeconfig, home)
    finally:
        emu.stop()


@pytest.fixture
def emu(cluster) -> Emulator:
    return cluster.emu


class Api(Verbs):
    """A minimal HTTPS client for raw API tests: exact bytes and headers, nothing hidden."""

    def __init__(self, emu: Emulator, auth: str = "cert"):
        self.emu = emu
        self.context = ssl.create_default_context(cadata=emu.pki.ca_pem)
        self.headers = {}
        if auth == "cert":
            import tempfile
            with tempfile.TemporaryDirectory() as folder:
                cert, key = Path(folder, "c.pem"), Path(folder, "k.pem")
                cert.write_text(emu.pki.client_cert_pem)
                key.write_text(emu.pki.client_key_pem)
                self.context.load_cert_chain(cert, key)
        elif auth == "token":
            self.headers["Authorization"] = f"Bearer {emu.token}"

    def request(self, method: str, path: str, body=None, content_type: str = "application/json",
                accept: str = "application/json", headers: dict | None = None):
        host, port = self.emu.address.split(":")
        connection = http.client.HTTPSConnection(host, int(port), context=self.context, timeout=30)
        payload = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        all_headers = {"Accept": accept, **self.headers, **(headers or {})}
        if payload is not None:
            all_headers["Content-Type"] = content_type
        connection.request(method, path, body=payload, headers=all_headers)
        response = connection.getresponse()
        data = response.read()
        connection.close()
        return Response(response.status, dict(response.getheaders()), data)


@dataclass
class Response:
    status: int
    headers: dict
    data: bytes

    @property
    def json(self):
        return json.loads(self.data)

    def __repr__(self) -> str:
        return f"Response({self.status}, {self.data[:300]!r})"


@pytest.fixture
def api(emu) -> Api:
    return Api(emu)


def pytest_collection_finish(session):
    """kubernetes-validate re-reads (and re-parses) a schema file for every document it validates; the files do not
    change during a run, so each is read once per process."""
    import sys
    validate = sys.modules.get("kubernetes_validate.utils")
    if validate is not None and not hasattr(validate.schema_contents, "cache_info"):
        import functools
        validate.schema_contents = functools.lru_cache(maxsize=None)(validate.schema_contents)


@pytest.hookimpl(trylast=True)  # after pytest-randomly has shuffled them
def pytest_collection_modifyitems(config, items):
    _longest_first(items)
    if os.environ.get("GPU_BOOTSTRAP_LIVE_KUBECONFIG"):
        return
    for item in items:
        if "live_only" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs GPU_BOOTSTRAP_LIVE_KUBECONFIG (a real cluster)"))


def _longest_first(items) -> None:
    """Slow tests first, then the rest, then unit tests; a stable sort, so each class keeps pytest-randomly's order.
    xdist's loadgroup hands out work in this order as workers free up, so the minutes-long tests start early and
    the quick ones fill the gaps, instead of one long test starting last and running alone (longest-first
    scheduling). Order dependence is still caught: within each class the order is random."""
    def rank(item) -> int:
        if item.get_closest_marker("slow") is not None:
            return 0
        return 2 if item.get_closest_marker("unit") is not None else 1
    items[:] = sorted(items, key=rank)


# The `unit` marker promises a host-free test (no emulator, sshd, helm, kubectl or Prometheus; no subprocess, no
# socket). The promise is checked, not trusted: a unit test asking for a host fixture fails at setup, and one that
# starts a process or opens a connection fails where it does so. GPU_BOOTSTRAP_UNIT_AUDIT=1 instead lists the tests
# that passed without touching a host yet carry no `unit` marker (candidates for it).
# Module-scoped ones (sshd farms, probed distributions, a Prometheus) touch the host only in the first test's setup, so
# they are named here rather than left to the runtime check.
HOST_FIXTURES = {"cluster", "emu", "api", "helm_on_path", "farm", "private_farm", "reports", "prometheus"}
_AUDIT = os.environ.get("GPU_BOOTSTRAP_UNIT_AUDIT") == "1"
_touched: set[str] = set()
_host_free_unmarked: list[str] = []


TOOLS_ON_PATH = ("helm", "kubectl", "go", "promtool", "prometheus", "opa")  # a unit test finds none of them
TOOL_VARIABLES = ("PATH", "GPU_BOOTSTRAP_HELM")


class HostUse(BaseException):  # not Exception: code under test that catches Exception must not hide it
    """A unit test reached for a host resource."""


@contextmanager
def _host_guard(nodeid: str, strict: bool):
    def refuse(what):
        def blocked(*args, **kwargs):
            if strict:
                raise HostUse(f"{nodeid} is marked unit but {what}; remove the marker or the host use")
            _touched.add(nodeid)
            return original[what](*args, **kwargs)
        return blocked

    original = {"starts a process": subprocess.Popen._execute_child, "opens a socket connection": socket.socket.connect,
                "listens on a socket": socket.socket.bind}
    subprocess.Popen._execute_child = refuse("starts a process")
    socket.socket.connect = refuse("opens a socket connection")
    socket.socket.bind = refuse("listens on a socket")
    environ = {name: os.environ.get(name) for name in TOOL_VARIABLES}
    if strict:  # no tool from PATH: the unit layer passes the same with and without helm, kubectl or Go installed
        for name in TOOL_VARIABLES:
            os.environ.pop(name, None)
        os.environ["PATH"] = os.pathsep.join(p for p in (environ["PATH"] or "").split(os.pathsep)
                                             if not any(Path(p, tool).exists() for tool in TOOLS_ON_PATH))
    try:
        yield
    finally:
        subprocess.Popen._execute_child = original["starts a process"]
        socket.socket.connect = original["opens a socket connection"]
        socket.socket.bind = original["listens on a socket"]
        for name, value in environ.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _guarded(item) -> bool:
    return item.get_closest_marker("unit") is not None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    parametrized = set(getattr(getattr(item, "callspec", None), "params", {}))  # an argument, not a fixture
    used = HOST_FIXTURES.intersection(item.fixturenames) - parametrized
    if used and not _guarded(item):
        _touched.add(item.nodeid)
    if _guarded(item):
        if used:
            pytest.fail(f"{item.nodeid} is marked unit but uses host fixture(s) {sorted(used)}", pytrace=False)
    if _guarded(item) or _AUDIT:
        with _host_guard(item.nodeid, strict=_guarded(item)):
            yield
    else:
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if _guarded(item) or _AUDIT:
        with _host_guard(item.nodeid, strict=_guarded(item)):
            yield
    else:
        yield


def pytest_runtest_logreport(report):
    if _AUDIT and report.when == "call" and report.passed and "unit" not in report.keywords \
            and report.nodeid not in _touched:
        _host_free_unmarked.append(report.nodeid)


def pytest_terminal_summary(terminalreporter):
    if _AUDIT:
        terminalreporter.write_sep("=", f"host-free tests without the unit marker: {len(_host_free_unmarked)}")
        for nodeid in sorted(_host_free_unmarked):
            terminalreporter.write_line(nodeid)


# GPU_BOOTSTRAP_TOY_STEP_AT=first|middle|last: every test runs with a toy step (tests/toy_step.py) inserted there in
# the default playbook, as a contributor's new step would be. No test of another step may notice (#55): folders,
# units and expectations go by step id, never by place.
_TOY_AT = os.environ.get("GPU_BOOTSTRAP_TOY_STEP_AT")


@pytest.fixture(autouse=True, scope="session")
def _toy_step_inserted(tmp_path_factory):
    if not _TOY_AT:
        yield
        return
    import shutil
    import yaml
    from gpu_bootstrap import steps
    from gpu_bootstrap.app import playbook as playbook_module
    from gpu_bootstrap.core.paths import data_path
    from tests.toy_step import TOY
    folder = tmp_path_factory.mktemp("toy-playbooks") / "playbooks"
    shutil.copytree(data_path("playbooks"), folder)
    document = yaml.safe_load((folder / "default.yaml").read_text())
    order = document["steps"]
    order.insert({"first": 0, "middle": len(order) // 2, "last": len(order)}[_TOY_AT], TOY)
    (folder / "default.yaml").write_text(yaml.safe_dump(document))
    steps.ELSEWHERE[TOY] = "tests.toy_step"
    original = playbook_module.data_path
    playbook_module.data_path = lambda *parts: folder.joinpath(*parts[1:]) if parts[:1] == ("playbooks",) \
        else original(*parts)
    try:
        yield
    finally:
        playbook_module.data_path = original
        steps.ELSEWHERE.pop(TOY, None)
