"""The Helm adapter's process handling and retry policy, with a scripted stand-in for helm (no cluster needed):
values on stdin only, which failures are repeated and which are not, what the final error names, time limits,
and a helm that ignores SIGTERM."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpu_bootstrap.core import interrupts
from gpu_bootstrap.adapters import helm as helm_module
from gpu_bootstrap.adapters.helm import Chart, Helm, seconds
from gpu_bootstrap.core.errors import ClusterError, ReleaseNotFound
from tests.tools import ROOT, Stall, tool_env

UNAVAILABLE = "Error: query: failed to query with labels: the server is currently unable to handle the request"
PENDING = "Error: UPGRADE FAILED: another operation (install/upgrade/rollback) is in progress"
FAKE = textwrap.dedent("""\
    #!{python}
    # A stand-in for helm: the n-th run plays the n-th entry of script.json (the last one repeats) and records its
    # argv and stdin in calls.jsonl.
    import json, os, signal, sys, time
    here = os.path.dirname(os.path.abspath(__file__))
    stdin = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    with open(os.path.join(here, "calls.jsonl"), "a") as log:
        log.write(json.dumps({{"argv": sys.argv[1:], "stdin": stdin, "pid": os.getpid()}}) + "\\n")
    with open(os.path.join(here, "calls.jsonl")) as log:
        n = sum(1 for _ in log)
    steps = json.load(open(os.path.join(here, "script.json")))
    step = steps[min(n, len(steps)) - 1]
    if step.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if step.get("pidfile"):
        open(os.path.join(here, step["pidfile"]), "w").write(str(os.getpid()))
    time.sleep(step.get("sleep", 0))
    sys.stdout.write(step.get("stdout", ""))
    sys.stderr.write(step.get("stderr", ""))
    sys.exit(step.get("code", 0))
""")


class FakeHelm:
    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "helm"
        self.path.write_text(FAKE.format(python=sys.executable))
        self.path.chmod(0o755)

    def script(self, *steps: dict) -> "FakeHelm":
        (self.folder / "script.json").write_text(json.dumps(list(steps)))
        return self

    def calls(self) -> list[dict]:
        log = self.folder / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def fake(tmp_path) -> FakeHelm:
    return FakeHelm(tmp_path / "fakehelm")


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(helm_module, "BACKOFF_BASE", 0.01)
    monkeypatch.setattr(helm_module, "BACKOFF_CAP", 0.05)


def adapter(fake: FakeHelm, **options) -> Helm:
    return Helm(Path("/nonexistent/kubeconfig"), "ctx", executable=str(fake.path), **options)


def upgrades(fake: FakeHelm) -> list[dict]:
    """The `helm upgrade` runs (an upgrade that worked is followed by a `helm status` reading its record back)."""
    return [c for c in fake.calls() if c["argv"][0] == "upgrade"]


# A local chart: a repository chart is first pulled and checked against the catalogue (tests/test_chart_digest.py),
# which this fake helm does not script.
CHART = Chart("/charts/gpu-operator-v26.7.0.tgz", None, None)
RELEASE_JSON = json.dumps({"name": "gpu-operator", "info": {"status": "deployed"}})


def test_values_travel_on_stdin_never_on_the_command_line(fake):
    fake.script({"stdout": RELEASE_JSON})
    secret = {"driver": {"licensingConfig": {"nlsEnabled": True, "secretName": "s3cr3t-t0ken"}}}
    adapter(fake).upgrade("gpu-operator", CHART, secret, "gpu-operator", timeout="300s")
    assert [c["argv"][0] for c in fake.calls()] == ["upgrade", "status"]
    [call] = upgrades(fake)
    assert "s3cr3t-t0ken" not in " ".join(call["argv"])
    assert json.loads(call["stdin"]) == secret
    assert call["argv"][:2] == ["upgrade", "gpu-operator"] and "--values" in call["argv"]
    assert call["argv"][-4:] == ["--kubeconfig", "/nonexistent/kubeconfig", "--kube-context", "ctx"]


def test_a_read_is_repeated_after_a_transient_error(fake):
    fake.script({"stderr": UNAVAILABLE + "\n", "code": 1},
                {"stderr": "Error: kubernetes cluster unreachable: Get \"https://10.0.0.1:6443/version\": read tcp "
                           "10.0.0.9:51234->10.0.0.1:6443: read: connection reset by peer\n", "code": 1},
                {"stdout": RELEASE_JSON})
    helm = adapter(fake)
    assert helm.status("gpu-operator", "gpu-operator")["info"]["status"] == "deployed"
    assert len(fake.calls()) == 3 and helm.retries == 2


def test_a_read_that_keeps_failing_names_helms_error_within_its_deadline(fake):
    fake.script({"stderr": "W0101 warning: something secondary\n" + UNAVAILABLE + "\n", "code": 1})
    started = time.monotonic()
    with pytest.raises(ClusterError) as caught:
        adapter(fake, read_deadline=4).history("gpu-operator", "gpu-operator")
    assert time.monotonic() - started < 15
    assert caught.value.message.startswith(f"helm history failed: {UNAVAILABLE} (after ")
    # repeated until the deadline: how often depends on how fast the (fake) helm starts, at least once more on a
    # loaded machine, and the message counts every attempt
    assert len(fake.calls()) >= 2
    assert f"(after {len(fake.calls())} attempts" in caught.value.message


def test_a_permanent_error_is_not_repeated(fake):
    fake.script({"stderr": 'Error: INSTALLATION FAILED: Deployment.apps "x" is invalid: spec.replicas: Invalid value\n',
                 "code": 1})
    with pytest.raises(ClusterError, match="is invalid"):
        adapter(fake).upgrade("gpu-operator", CHART, {}, "gpu-operator", timeout="300s")
    assert len(fake.calls()) == 1


def test_an_upgrade_is_repeated_after_a_transient_error_with_what_is_left_of_its_timeout(fake):
    fake.script({"stderr": "Error: failed to install CRD crds/nvidia.com_clusterpolicies.yaml: the server is "
                           "currently unable to handle the request\n", "code": 1, "sleep": 1.2},
                {"stdout": RELEASE_JSON})
    result = adapter(fake).upgrade("gpu-operator", CHART, {"a": 1}, "gpu-operator", timeout="300s")
    assert result["info"]["status"] == "deployed"
    first, second = upgrades(fake)
    timeout = [int(c["argv"][c["argv"].index("--timeout") + 1].rstrip("s")) for c in (first, second)]
    assert timeout[0] == 300 and timeout[1] < 300
    assert first["stdin"] == second["stdin"]


def test_an_upgrade_is_repeated_a_bounded_number_of_times(fake):
    fake.script({"stderr": "Error: UPGRADE FAILED: failed to create resource: Patch \"https://10.0.0.1:6443/apis/apps/"
                           "v1/namespaces/gpu-operator/deployments/gpu-operator\": read tcp 10.0.0.9:51234->10.0.0.1:"
                           "6443: read: connection reset by peer\n", "code": 1})
    with pytest.raises(ClusterError, match=r"connection reset by peer \(after 10 attempts in \d+ s\)"):
        adapter(fake).upgrade("gpu-operator", CHART, {}, "gpu-operator", timeout="900s")
    assert len(fake.calls()) == helm_module.UPGRADE_ATTEMPTS == 10


UNREACHABLE = ("Error: kubernetes cluster unreachable: Get \"https://10.0.0.1:6443/version\": dial tcp 10.0.0.1:6443: "
               "connect: connection refused\n")


def test_attempts_that_never_reached_the_cluster_do_not_count(fake):
    """helm checks that the cluster is reachable before it changes anything: an outage longer than five attempts'
    backoff is ridden out (issue 11: a 20 s outage in the middle of a run)."""
    fake.script(*[{"stderr": UNREACHABLE, "code": 1}] * 12, {"stdout": RELEASE_JSON})
    adapter(fake).upgrade("gpu-operator", CHART, {}, "gpu-operator", timeout="900s")
    assert len(upgrades(fake)) == 13 > helm_module.UPGRADE_ATTEMPTS


def test_a_cluster_that_stays_unreachable_is_given_up_after_a_minute(fake, monkeypatch):
    monkeypatch.setattr(helm_module, "UNREACHED_DEADLINE", 0.5)
    fake.script({"stderr": UNREACHABLE, "code": 1, "sleep": 0.05})
    started = time.monotonic()
    with pytest.raises(ClusterError, match=r"kubernetes cluster unreachable: .*connection refused \(after \d+ "
                                           r"attempts? in \d+ s\)"):
        adapter(fake).upgrade("gpu-operator", CHART, {}, "gpu-operator", timeout="900s")
    assert time.monotonic() - started < 10


def test_an_upgrade_that_finds_the_release_pending_is_not_repeated(fake):
    fake.script({"stderr": PENDING + "\n", "code": 1})
    with pytest.raises(ClusterError) as caught:
        adapter(fake).upgrade("gpu-operator", CHART, {}, "gpu-operator", timeout="300s")
    assert len(fake.calls()) == 1
    assert PENDING in caught.value.message


def test_a_release_its_own_failed_attempt_left_pending_is_recovered_and_the_upgrade_goes_on(fake):
    """Attempt 1 fails on a 503 and helm cannot record the failure (the release stays pending-install); attempt 2
    finds the lock. That pending state is our own: it is cleared as the next run would (a first install that never
    finished is uninstalled) and the upgrade goes on."""
    fake.script({"stderr": "Error: UPGRADE FAILED: failed to create resource: the server is currently unable to "
                           "handle the request\n", "code": 1},
                {"stderr": PENDING + "\n", "code": 1},
                {"stdout": json.dumps([{"revision": 1, "status": "pending-install"}])},
                {"stdout": 'release "gpu-operator" uninstalled\n'},
                {"stdout": RELEASE_JSON})
    result = adapter(fake).upgrade("gpu-operator", CHART, {}, "gpu-operator", timeout="300s")
    assert result["info"]["status"] == "deployed"
    assert [c["argv"][0] for c in fake.calls()] == ["upgrade", "upgrade", "history", "uninstall", "upgrade",
                                                    "status"]


def test_a_success_helm_could_not_record_is_recovered_and_repeated(fake):
    """helm exits 0 when only its last write, the release record's status, failed ("failed to record the
    release"): the record is read back, and a release left pending is recovered and upgraded once more."""
    pending = json.dumps({"name": "gpu-operator", "info": {"status": "pending-install"}})
    fake.script({"stdout": RELEASE_JSON, "stderr": 'level=ERROR msg="failed to record the release" error="Put '
                                                   '...: read: connection reset by peer"\n'},
                {"stdout": pending},
                {"stdout": json.dumps([{"revision": 1, "status": "pending-install"}])},
                {"stdout": 'release "gpu-operator" uninstalled\n'},
                {"stdout": RELEASE_JSON})
    result = adapter(fake).upgrade("gpu-operator", CHART, {}, "gpu-operator", timeout="300s")
    assert result["info"]["status"] == "deployed"
    assert [c["argv"][0] for c in fake.calls()] == ["upgrade", "status", "history", "uninstall", "upgrade",
                                                    "status"]


def test_a_release_helm_cannot_record_twice_is_an_error_that_says_so(fake):
    pending = json.dumps({"name": "gpu-operator", "info": {"status": "pending-upgrade"}})
    fake.script({"stdout": RELEASE_JSON}, {"stdout": pending},
                {"stdout": json.dumps([{"revision": 1, "status": "deployed"},
                                       {"revision": 2, "status": "pending-upgrade"}])},
                {"stdout": "Rollback was a success!\n"}, {"stdout": RELEASE_JSON}, {"stdout": pending})
    with pytest.raises(ClusterError, match="could not record the release, which is pending-upgrade"):
        adapter(fake).upgrade("gpu-operator", CHART, {}, "gpu-operator", timeout="300s")
    assert [c["argv"][0] for c in fake.calls()] == ["upgrade", "status", "history", "rollback", "upgrade", "status"]


def test_the_first_cause_is_named_when_a_repeat_trips_over_it(fake):
    """Attempt 1 fails on a 503 and leaves the release pending; attempt 2 only sees the lock, and clearing it fails
    for good. The error names the 503, and says what the repeat found."""
    fake.script({"stderr": "Error: UPGRADE FAILED: failed to create resource: the server is currently unable to "
                           "handle the request\n", "code": 1},
                {"stderr": PENDING + "\n", "code": 1},
                {"stderr": 'Error: secrets is forbidden: User "ci" cannot list resource "secrets"\n', "code": 1})
    with pytest.raises(ClusterError) as caught:
        adapter(fake).upgrade("gpu-operator", CHART, {}, "gpu-operator", timeout="300s")
    message = caught.value.message
    assert [c["argv"][0] for c in fake.calls()] == ["upgrade", "upgrade", "history"]
    assert message.startswith("helm upgrade --install gpu-operator failed: Error: UPGRADE FAILED: failed to create "
                              "resource: the server is currently unable to handle the request")
    assert "another operation" in message


def test_a_permanent_error_after_transient_ones_names_both(fake):
    fake.script({"stderr": UNAVAILABLE + "\n", "code": 1},
                {"stderr": 'Error: UPGRADE FAILED: Deployment.apps "x" is invalid: spec.replicas: Invalid value\n',
                 "code": 1})
    with pytest.raises(ClusterError) as caught:
        adapter(fake).upgrade("gpu-operator", CHART, {}, "gpu-operator", timeout="300s")
    assert caught.value.message.startswith('helm upgrade --install gpu-operator failed: Error: UPGRADE FAILED: '
                                           'Deployment.apps "x" is invalid')
    # The seconds depend on the machine's load; the attempt count and the first error do not.
    assert re.search(r"\(after 2 attempts in \d+ s; the first failed with: " +
                     re.escape(UNAVAILABLE.removeprefix("Error: ")) + r"\)", caught.value.message)


def test_a_hook_whose_status_could_not_be_read_is_repeated(fake):
    fake.script({"stderr": "Error: UPGRADE FAILED: pre-upgrade hooks failed: resource ClusterRole//gpu-operator-"
                           "upgrade-crd-hook-role not ready. status: Unknown, message: \n", "code": 1},
                {"stdout": RELEASE_JSON})
    adapter(fake).upgrade("gpu-operator", CHART, {}, "gpu-operator", timeout="300s")
    assert len(upgrades(fake)) == 2


def test_an_upgrade_whose_wait_ran_out_is_not_repeated(fake):
    fake.script({"stderr": "Error: UPGRADE FAILED: context deadline exceeded\n", "code": 1})
    with pytest.raises(ClusterError, match="context deadline exceeded"):
        adapter(fake).upgrade("gpu-operator", CHART, {}, "gpu-operator", timeout="300s")
    assert len(fake.calls()) == 1


def test_a_hung_read_is_stopped_at_its_time_limit_and_leaves_no_process(fake):
    fake.script({"sleep": 60, "ignore_term": True})
    started = time.monotonic()
    with pytest.raises(ClusterError, match=r"did not finish within 1 s"):
        adapter(fake, read_attempt_timeout=1, read_deadline=2.5).status("gpu-operator", "gpu-operator")
    assert time.monotonic() - started < 20  # 2 attempts, each 1 s + SIGTERM ignored for the 3 s grace
    for call in fake.calls():
        assert not _running(call["pid"]), f"stand-in helm {call['pid']} survived"
    assert not interrupts.running()


def test_a_missing_release_is_none_false_or_release_not_found(fake):
    fake.script({"stderr": "Error: release: not found\n", "code": 1})
    helm = adapter(fake)
    assert helm.status("gpu-operator", "gpu-operator") is None
    assert helm.uninstall("gpu-operator", "gpu-operator") is False
    with pytest.raises(ReleaseNotFound):
        helm.manifest("gpu-operator", "gpu-operator")
    assert len(fake.calls()) == 3  # never repeated


@pytest.mark.unit
def test_durations():
    assert [seconds(v) for v in ("900s", "10m", "1h30m", "2m3.5s", "45", 30)] == [900, 600, 5400, 123.5, 45, 30]


CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from gpu_bootstrap.core import interrupts
    from gpu_bootstrap.adapters.helm import Helm
    interrupts.install()
    try:
        Helm(Path("/nonexistent"), executable=sys.argv[1]).status("gpu-operator", "gpu-operator")
    except KeyboardInterrupt:
        sys.exit(interrupts.exit_code())
""")


def test_a_helm_that_ignores_sigterm_is_killed_and_we_still_exit_within_5_s(fake, tmp_path):
    fake.script({"sleep": 120, "ignore_term": True, "pidfile": "helm.pid"})
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen([sys.executable, str(script), str(fake.path)], cwd=ROOT,
                             env=tool_env(), stderr=subprocess.PIPE, text=True)
    pidfile = fake.folder / "helm.pid"
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline and child.poll() is None, "the stand-in helm never started"
        time.sleep(0.02)
    helm_pid = int(pidfile.read_text())
    time.sleep(0.2)  # let it install its SIG_IGN
    with Stall() as stall:  # the CPU a busy machine withheld meanwhile stretches the bound (tests/tools.py)
        sent = time.monotonic()
        child.send_signal(signal.SIGTERM)
        _out, err = child.communicate(timeout=30)
        took = time.monotonic() - sent
    assert child.returncode == 143, err
    assert took < 5 + stall.late, f"exited {took:.1f} s after SIGTERM (the machine withheld {stall.late:.1f} s)"
    assert not _running(helm_pid), "the stand-in helm survived"


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
