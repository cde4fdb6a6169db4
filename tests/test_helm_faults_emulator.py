"""The Helm adapter with the real helm against an API that fails: random 503s (seeded) on every request, a single
503 in the middle of an install, and a release left pending by a killed helm."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from gpu_bootstrap.adapters import helm as helm_module
from gpu_bootstrap.adapters.helm import Chart, Helm
from gpu_bootstrap.core.errors import ClusterError
from gpu_bootstrap.core.refs import Ref
from tests.conftest import chart
from tests.tools import tool

pytestmark = [pytest.mark.tools, pytest.mark.slow, pytest.mark.usefixtures("helm_on_path")]
UNAVAILABLE = "the server is currently unable to handle the request"
NS = "gpu-operator"
VALUES = {"driver": {"enabled": False}}


@pytest.fixture
def operator_chart() -> Chart:
    return Chart(str(chart("gpu-operator-v26.7.0.tgz")), None, None)


@pytest.fixture
def helm(cluster, monkeypatch) -> Helm:
    monkeypatch.setattr(helm_module, "BACKOFF_BASE", 0.2)
    monkeypatch.setattr(helm_module, "BACKOFF_CAP", 1.0)
    return Helm(cluster.kubeconfig, executable=tool("helm"))


def served(emu, status: int) -> int:
    return sum(1 for r in emu.requests.all() if r.status == status)


def test_reads_succeed_while_15_percent_of_requests_fail(cluster, helm, operator_chart):
    helm.upgrade("gpu-operator", operator_chart, VALUES, NS, wait=False, timeout="120s")
    cluster.emu.faults.add("*", ".*", status=503, count=None, probability=0.15, message=UNAVAILABLE)
    for _ in range(3):
        assert helm.status("gpu-operator", NS)["info"]["status"] == "deployed"
        assert helm.deployed_chart("gpu-operator", NS) == "gpu-operator-v26.7.0"
        assert helm.user_values("gpu-operator", NS) == VALUES
        assert "kind: ClusterPolicy" in helm.manifest("gpu-operator", NS)
        assert [r["status"] for r in helm.history("gpu-operator", NS)] == ["deployed"]
        assert helm.status("absent", NS) is None
    assert "kind: ClusterPolicy" in helm.dry_run_manifest("gpu-operator", operator_chart, VALUES, NS)
    assert served(cluster.emu, 503) > 0 and helm.retries > 0


def test_an_install_hit_by_a_503_is_repeated_and_lands(cluster, helm, operator_chart):
    cluster.emu.faults.add("PATCH", r"/customresourcedefinitions/clusterpolicies\.nvidia\.com$", status=503,
                           count=1, message=UNAVAILABLE)
    result = helm.upgrade("gpu-operator", operator_chart, VALUES, NS, wait=False, timeout="120s")
    assert result["info"]["status"] == "deployed"
    assert helm.attempts == 3 and helm.retries == 1 and served(cluster.emu, 503) == 1  # + the status read back


def test_an_install_helm_could_not_record_is_recovered_and_repeated(cluster, helm, operator_chart):
    """helm exits 0 when the install worked but its last write, the release record's status, failed: the
    adapter reads the status back, finds the release still pending-install, recovers it and installs once more."""
    record = cluster.emu.faults.add("PUT", r"/secrets/sh\.helm\.release\.v1\.gpu-operator\.v1$", reset=True,
                                    count=1)
    result = helm.upgrade("gpu-operator", operator_chart, VALUES, NS, wait=False, timeout="120s")
    assert record.fired == 1
    assert helm.attempts == 6  # upgrade, status (pending-install), history, uninstall, upgrade, status
    assert result["info"]["status"] == "deployed"
    assert [r["status"] for r in helm.history("gpu-operator", NS)] == ["deployed"]


def test_a_pending_release_is_not_upgraded_again_and_again(cluster, helm, operator_chart):
    """A helm killed mid-install leaves the release pending-install: repeating the upgrade cannot help."""
    cluster.emu.faults.add("PATCH", r"/deployments/gpu-operator$", delay=30, count=1)
    killed = subprocess.Popen([tool("helm"), "--kubeconfig", str(cluster.kubeconfig), "upgrade", "--install",
                               "gpu-operator", operator_chart.ref, "-n", NS, "--create-namespace"],
                              env=cluster.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not any(r.method == "PATCH" and r.path.endswith("/deployments/gpu-operator")
                  for r in cluster.emu.requests.all()):
        assert time.monotonic() < deadline and killed.poll() is None, "helm never reached the Deployment"
        time.sleep(0.05)
    killed.kill()
    killed.wait()
    status = json.loads(cluster.helm("status", "gpu-operator", "-n", NS, "-o", "json").stdout)
    assert status["info"]["status"] == "pending-install"
    with pytest.raises(ClusterError, match=r"another operation \(install/upgrade/rollback\) is in progress"):
        helm.upgrade("gpu-operator", operator_chart, VALUES, NS, wait=False, timeout="120s")
    assert helm.attempts == 1


def test_an_uninstall_that_could_not_delete_the_record_stays_ours_and_is_finished(cluster, helm, operator_chart):
    """helm uninstall deletes the objects, then the release record; when that last delete fails, the release stays
    `uninstalling`. It is still ours (teardown and up must not take it for someone else's), and recovering it
    finishes the uninstall."""
    managed = {"app.kubernetes.io/managed-by": "gpu-bootstrap"}
    helm.upgrade("gpu-operator", operator_chart, VALUES, NS, wait=False, timeout="120s", labels=managed)
    record = cluster.emu.faults.add("DELETE", r"/secrets/sh\.helm\.release\.v1\.gpu-operator\.v1$", reset=True,
                                    count=1)
    with pytest.raises(ClusterError, match="Failed to purge the release"):
        helm.uninstall("gpu-operator", NS, wait=False, timeout="60s")
    assert record.fired == 1
    assert helm.status("gpu-operator", NS)["info"]["status"] == "uninstalling"
    assert helm.labelled("gpu-operator", NS, "app.kubernetes.io/managed-by=gpu-bootstrap")
    assert helm.recover("gpu-operator", NS, "60s") == "finished the interrupted uninstall"
    assert helm.status("gpu-operator", NS) is None


def test_an_install_that_stopped_before_its_hooks_account_uninstalls_without_the_hooks(cluster, helm, operator_chart,
                                                                                       caplog):
    """The CI run that found it: kube-apiserver restarted while helm installed the gpu-operator chart, helm gave up
    on the ServiceAccount, and the teardown that followed waited 300 s on the chart's pre-delete hook Job, whose pods
    the ServiceAccount admission plugin refused. With the hook's account missing the uninstall skips the hooks (they
    could not run) and says so; with it present they run."""
    from gpu_bootstrap.adapters.kube import Kube
    kube = Kube(cluster.kubeconfig)
    with_kube = Helm(cluster.kubeconfig, executable=tool("helm"), kube=kube)
    account = Ref("v1", "ServiceAccount", "gpu-operator", NS)

    helm.upgrade("gpu-operator", operator_chart, VALUES, NS, wait=False, timeout="120s")
    kube.delete(account)
    assert with_kube.uninstall("gpu-operator", NS, timeout="60s")
    assert helm.status("gpu-operator", NS) is None
    assert "uninstalling without the hooks" in caplog.text and f"{NS}/gpu-operator" in caplog.text
    assert not hook_jobs_created(cluster.emu)

    caplog.clear()
    helm.upgrade("gpu-operator", operator_chart, VALUES, NS, wait=False, timeout="120s")
    assert with_kube.uninstall("gpu-operator", NS, timeout="120s")
    assert "uninstalling without the hooks" not in caplog.text
    assert hook_jobs_created(cluster.emu)


def hook_jobs_created(emu) -> bool:
    """helm 4 makes a hook by server-side apply (PATCH), helm 3 by POST."""
    return any(r.method in ("POST", "PATCH") and r.path.startswith(f"/apis/batch/v1/namespaces/{NS}/jobs")
               for r in emu.requests.all())
