"""The real helm v4 (pinned v4.1.4 from .tools/bin) installing the real charts into the emulator."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import chart

pytestmark = [pytest.mark.tools, pytest.mark.slow]


@pytest.fixture
def gpu_operator_chart():
    return chart("gpu-operator-v26.7.0.tgz")


@pytest.fixture
def kps_chart():
    return chart("kube-prometheus-stack-88.5.3.tgz")


def rendered(cluster, release: str, chart, namespace: str, *values: str) -> set[tuple[str, str, str]]:
    """(kind, namespace, name) of everything `helm template` renders, minus hooks (helm deletes those)."""
    out = cluster.helm("template", release, str(chart), "-n", namespace, "--kube-version", "1.31.0", *values).stdout
    keys = set()
    for doc in yaml.safe_load_all(out):
        if not doc or "helm.sh/hook" in (doc["metadata"].get("annotations") or {}):
            continue
        keys.add((doc["kind"], doc["metadata"].get("namespace", namespace) if _namespaced(cluster, doc) else "",
                  doc["metadata"]["name"]))
    return keys


def _namespaced(cluster, doc) -> bool:
    rt = cluster.emu.table.for_kind(doc["apiVersion"], doc["kind"])
    return rt is None or rt.namespaced


def stored(cluster, release: str) -> set[tuple[str, str, str]]:
    keys = set()
    for rt, obj in cluster.emu.store.all_objects():
        annotations = obj["metadata"].get("annotations") or {}
        if annotations.get("meta.helm.sh/release-name") == release and rt.kind != "CustomResourceDefinition":
            keys.add((rt.kind, obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))
    return keys


def test_gpu_operator_install_upgrade_rollback_uninstall(cluster, gpu_operator_chart):
    GPU_OPERATOR = gpu_operator_chart
    probe = "operator.annotations.probe"
    cluster.helm("upgrade", "--install", "gpu-operator", str(GPU_OPERATOR), "-n", "gpu-operator", "--create-namespace",
                 "--wait", "--timeout", "120s", "--set", f"{probe}=one")
    assert stored(cluster, "gpu-operator") == rendered(cluster, "gpu-operator", GPU_OPERATOR, "gpu-operator",
                                                       "--set", f"{probe}=one")
    crds = {c["metadata"]["name"] for c in cluster.emu.list("customresourcedefinitions")}
    assert {"clusterpolicies.nvidia.com", "nodefeaturerules.nfd.k8s-sigs.io"} <= crds
    releases = json.loads(cluster.helm("list", "-A", "-o", "json").stdout)
    assert [(r["name"], r["status"]) for r in releases] == [("gpu-operator", "deployed")]
    assert "kind: ClusterPolicy" in cluster.helm("get", "manifest", "gpu-operator", "-n", "gpu-operator").stdout

    def annotations():
        deploy = cluster.emu.get("deployments", "gpu-operator", "gpu-operator")
        return deploy["spec"]["template"]["metadata"].get("annotations") or {}

    assert annotations()["probe"] == "one"
    cluster.helm("upgrade", "gpu-operator", str(GPU_OPERATOR), "-n", "gpu-operator", "--wait", "--timeout", "120s",
                 "--set", f"{probe}=two")
    assert annotations()["probe"] == "two"
    cluster.helm("upgrade", "gpu-operator", str(GPU_OPERATOR), "-n", "gpu-operator", "--wait", "--timeout", "120s",
                 "--reset-values")
    assert "probe" not in annotations() and annotations()["openshift.io/scc"] == "restricted-readonly"
    cluster.helm("rollback", "gpu-operator", "1", "-n", "gpu-operator", "--wait", "--timeout", "120s")
    assert annotations()["probe"] == "one"
    history = json.loads(cluster.helm("history", "gpu-operator", "-n", "gpu-operator", "-o", "json").stdout)
    assert [h["revision"] for h in history] == [1, 2, 3, 4] and history[-1]["status"] == "deployed"

    cluster.helm("uninstall", "gpu-operator", "-n", "gpu-operator", "--wait", "--timeout", "120s")
    cluster.emu.settle()
    assert stored(cluster, "gpu-operator") == set()
    assert json.loads(cluster.helm("list", "-A", "-o", "json").stdout) == []
    assert "clusterpolicies.nvidia.com" in {c["metadata"]["name"] for c in cluster.emu.list("customresourcedefinitions")}


def test_kube_prometheus_stack_installs_with_wait_and_uninstalls(cluster, kps_chart):
    KPS = kps_chart
    cluster.helm("upgrade", "--install", "kps", str(KPS), "-n", "mon", "--create-namespace", "--wait",
                 "--timeout", "180s")
    assert stored(cluster, "kps") == rendered(cluster, "kps", KPS, "mon")
    deployments = cluster.emu.list("deployments", "mon")
    assert deployments and all(
        any(c["type"] == "Available" and c["status"] == "True" for c in d["status"]["conditions"]) for d in deployments)
    assert cluster.emu.get("daemonsets", "kps-prometheus-node-exporter", "mon")["status"]["numberReady"] == 3
    status = cluster.helm("status", "kps", "-n", "mon").stdout
    assert "STATUS: deployed" in status
    cluster.helm("uninstall", "kps", "-n", "mon", "--wait", "--timeout", "120s")
    cluster.emu.settle()
    assert stored(cluster, "kps") == set()
