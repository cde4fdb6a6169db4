"""The monitoring step's offline render for Kubernetes 1.24, 1.25, 1.31 and 1.35, validated: our PrometheusRule
against the chart's own CRD schema, our dashboard ConfigMaps with kubernetes-validate (strict), and on 1.25-1.35 every
manifest `helm template` renders from the local kube-prometheus-stack 88.5.3 (built-in kinds with kubernetes-validate,
monitoring.coreos.com kinds against the chart's CRDs).

1.24: 88.x requires Kubernetes >= 1.25, so the plan picks 72.9.1 from the chart repository, which an offline run
cannot fetch (its manifests are not rendered: the step says so); our own objects are validated against the 1.25
schemas (kubernetes-validate ships none older), as the compatibility matrix does.
"""
from __future__ import annotations

import functools
import json
import tarfile
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from tests.conftest import chart
from tests.tools import tool

kubernetes_validate = pytest.importorskip("kubernetes_validate")
pytestmark = [pytest.mark.tools, pytest.mark.slow]
runner = CliRunner()


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml reads the chart's CRDs 5x faster
    """The chart's CRDs hold a bare `=` (YAML's value tag) in a description, which SafeLoader rejects."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


@functools.lru_cache(maxsize=1)
def crd_schemas() -> dict:
    schemas = {}
    with tarfile.open(chart("kube-prometheus-stack-88.5.3.tgz")) as archive:
        for member in archive.getmembers():
            if "/crds/crds/" in member.name and member.name.endswith(".yaml"):
                for crd in yaml.load_all(archive.extractfile(member).read(), Loader=_Loader):
                    for version in (crd or {}).get("spec", {}).get("versions", []):
                        schemas[(f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])] = \
                            version["schema"]["openAPIV3Schema"]
    return schemas


def _python_patterns(schema):
    """Go regexps put flags after the anchor ('^(?i)...'); Python wants them first."""
    if isinstance(schema, dict):
        return {k: (v.replace("^(?i)", "(?i)^", 1) if k == "pattern" and isinstance(v, str) else _python_patterns(v))
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [_python_patterns(v) for v in schema]
    return schema


def validate(doc: dict, minor: int) -> None:
    key = (doc["apiVersion"], doc["kind"])
    if key in crd_schemas():
        jsonschema.validate(doc, _python_patterns(crd_schemas()[key]))
    else:
        kubernetes_validate.validate(doc, f"1.{max(minor, 25)}", strict=True)


def documents(path: Path) -> list[dict]:
    text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("#"))
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(autouse=True)
def schemas_read_once(monkeypatch):
    """kubernetes-validate re-reads a schema file for every document; read each once."""
    monkeypatch.setattr(kubernetes_validate.utils, "schema_contents",
                        functools.lru_cache(maxsize=None)(kubernetes_validate.utils.schema_contents))


@pytest.mark.parametrize("minor", [24, 25, 31, 35])
def test_the_offline_render_validates(minor, tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_BOOTSTRAP_HELM", tool("helm"))
    monkeypatch.setenv("HELM_CACHE_HOME", str(tmp_path / "helm-cache"))
    monkeypatch.setenv("HELM_REPOSITORY_CONFIG", str(tmp_path / "repositories.yaml"))
    config = tmp_path / "gpu-bootstrap.yaml"
    local = f"\nmonitoring: {{chart: {chart('kube-prometheus-stack-88.5.3.tgz')}}}" if minor >= 25 else \
        "\nmonitoring: {repository: 'http://charts.invalid/offline'}"  # a name that never resolves (RFC 2606)
    config.write_text("nodes: [{name: gpu-1}, {name: gpu-2}]" + local + "\n")
    out = tmp_path / "out"
    # --allow-incomplete: 1.24's chart comes from a repository, which cannot be reached here. A refused connection
    # is transient to the helm adapter (90 s of retries); a name that does not resolve is not
    result = runner.invoke(app, ["up", "--dry-run", "--offline", "--allow-incomplete", "--kube-version",
                                 f"1.{minor}", "-c", str(config), "--only", "monitoring", "--render-dir", str(out), "-o", "json", "--log-file",
                                 str(tmp_path / "log")])
    assert result.exit_code == 0, result.output
    step = json.loads(result.stdout)["steps"][0]
    folder = out / "monitoring"
    release = yaml.safe_load((folder / "release.yaml").read_text())
    assert release["chart_version"] == ("72.9.1" if minor == 24 else "88.5.3")
    ours = [d for f in sorted(folder.glob("0*-apply-*.yaml")) for d in documents(f)]
    assert [d["kind"] for d in ours] == ["Namespace", "PrometheusRule"] + ["ConfigMap"] * 5  # ns: labelled (#23)
    for doc in ours:
        validate(doc, minor)
    if minor == 24:
        assert step["status"] == "incomplete" and "manifests not rendered" in step["message"]
        return
    assert step["status"] == "planned", step
    manifests = [d for d in yaml.safe_load_all((folder / "manifests.yaml").read_text()) if d]
    kinds = {d["kind"] for d in manifests}
    assert {"Prometheus", "Deployment", "DaemonSet", "ServiceMonitor", "PrometheusRule"} <= kinds
    for doc in manifests:
        validate(doc, minor)
    prometheus = next(d for d in manifests if d["kind"] == "Prometheus")
    assert prometheus["spec"]["serviceMonitorSelector"] == {} and prometheus["spec"]["retention"] == "15d"


@pytest.mark.unit
def test_an_invalid_object_fails_validation():
    """The validation can fail: a PrometheusRule whose rule lacks its expression is refused by the CRD schema."""
    from gpu_bootstrap.core import config as cfg
    from gpu_bootstrap.render import monitoring as render
    section = cfg.Config.model_validate({"nodes": [{"name": "a"}]}).monitoring
    rule = render.prometheus_rule(render.install_target(section, "why"))
    validate(rule, 31)
    rule["spec"]["groups"][0]["rules"][0].pop("expr")
    with pytest.raises(jsonschema.ValidationError):
        validate(rule, 31)
