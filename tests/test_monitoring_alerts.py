"""The GPU alerts, proved with the real promtool: `promtool check rules` on the rendered PrometheusRule, and
`promtool test rules` cases (tests/monitoring/alerts-test.yaml) that make every alert fire and keep it silent."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.render import gpu_alerts
from gpu_bootstrap.render import monitoring as render
from tests.tools import run, tool

pytestmark = pytest.mark.tools
CASES = Path(__file__).resolve().parent / "monitoring" / "alerts-test.yaml"
WORKLOAD_CASES = CASES.parent / "workload-rules-test.yaml"


def rendered_rule() -> dict:
    section = cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}]}).monitoring
    return render.prometheus_rule(render.install_target(section, "test"))


def write_rules(folder: Path, annotations: bool = True) -> Path:
    groups = rendered_rule()["spec"]["groups"]
    if not annotations:
        for rule in groups[0]["rules"]:
            rule.pop("annotations")
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def test_promtool_check_rules_passes_on_the_rendered_prometheus_rule(tmp_path):
    result = run([tool("promtool"), "check", "rules", str(write_rules(tmp_path))], {})
    assert f"SUCCESS: {len(gpu_alerts.rules()) + len(gpu_alerts.workload_rules())} rules found" in result.stdout


@pytest.mark.unit
def test_every_alert_has_a_runbook_line_and_a_severity():
    for rule in gpu_alerts.rules():
        assert rule["annotations"]["runbook"].strip() and "\n" not in rule["annotations"]["runbook"], rule["alert"]
        assert rule["labels"]["severity"] in ("info", "warning", "critical")
    assert len({r["alert"] for r in gpu_alerts.rules()}) == 11


@pytest.mark.unit
def test_every_alert_has_cases_that_fire_it_and_keep_it_silent():
    cases = yaml.safe_load(CASES.read_text())["tests"]
    fired, silent = set(), set()
    for case in cases:
        for check in case["alert_rule_test"]:
            (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {r["alert"] for r in gpu_alerts.rules()}
    assert fired == names and silent == names


def test_promtool_test_rules_fires_and_silences_every_alert(tmp_path):
    write_rules(tmp_path, annotations=False)
    shutil.copy(CASES, tmp_path / "alerts-test.yaml")
    result = run([tool("promtool"), "test", "rules", str(tmp_path / "alerts-test.yaml")], {}, check=False)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_promtool_test_rules_records_gpu_use_per_pod_and_per_workload(tmp_path):
    """The per-pod and per-workload series a ScaledObject scales on (monitoring.workload_gpu_rules), cases in
    tests/monitoring/workload-rules-test.yaml: averaged and summed per pod, joined per workload on
    kube-prometheus-stack's pod-owner series, GPUs no pod holds and DCGM's blank values left out."""
    write_rules(tmp_path, annotations=False)
    shutil.copy(WORKLOAD_CASES, tmp_path / "workload-rules-test.yaml")
    result = run([tool("promtool"), "test", "rules", str(tmp_path / "workload-rules-test.yaml")], {}, check=False)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_a_workload_rule_that_averages_gpus_instead_of_pods_fails_the_cases(tmp_path):
    """The cases can fail: averaging a workload's GPUs (80, 40, 20: 46.7) instead of its pods (60, 20: 40)."""
    path = write_rules(tmp_path, annotations=False)
    document = yaml.safe_load(path.read_text())
    [recorded] = [r for r in document["groups"][1]["rules"] if r["record"].startswith("namespace_workload:dcgm_gpu")]
    assert "(namespace_pod:dcgm_gpu_utilization:avg * on" in recorded["expr"]
    recorded["expr"] = recorded["expr"].replace("(namespace_pod:dcgm_gpu_utilization:avg * on",
                                                "(DCGM_FI_DEV_GPU_UTIL * on")
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    shutil.copy(WORKLOAD_CASES, tmp_path / "workload-rules-test.yaml")
    result = run([tool("promtool"), "test", "rules", str(tmp_path / "workload-rules-test.yaml")], {}, check=False)
    assert result.returncode != 0 and "namespace_workload:dcgm_gpu_utilization:avg" in result.stdout + result.stderr


@pytest.mark.unit
def test_the_workload_rules_are_an_option_of_the_monitoring_step():
    section = cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}],
                                         "monitoring": {"workload_gpu_rules": False}}).monitoring
    without = render.prometheus_rule(render.install_target(section, "test"),
                                     gpu_alerts.AlertSettings(workload_rules=False))
    assert [g["name"] for g in without["spec"]["groups"]] == ["gpu-bootstrap.gpu"]
    assert [g["name"] for g in rendered_rule()["spec"]["groups"]] == ["gpu-bootstrap.gpu",
                                                                      "gpu-bootstrap.gpu-workloads"]


def test_a_changed_threshold_fails_the_cases(tmp_path):
    """The cases can fail: the same rules with the hot threshold moved to 95 C no longer pass."""
    path = write_rules(tmp_path, annotations=False)
    path.write_text(path.read_text().replace("> 85 < 1000", "> 95 < 1000"))
    shutil.copy(CASES, tmp_path / "alerts-test.yaml")
    result = run([tool("promtool"), "test", "rules", str(tmp_path / "alerts-test.yaml")], {}, check=False)
    assert result.returncode != 0 and "GpuTooHot" in result.stdout + result.stderr


def test_annotations_render_with_the_series_labels(tmp_path):
    write_rules(tmp_path)
    hot = next(r for r in gpu_alerts.rules() if r["alert"] == "GpuTooHot")
    case = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": 'DCGM_FI_DEV_GPU_TEMP{node="gpu-1",gpu="2",UUID="GPU-2"}', "values": "91x10"}],
        "alert_rule_test": [{"eval_time": "8m", "alertname": "GpuTooHot", "exp_alerts": [{
            "exp_labels": {"severity": "warning", "node": "gpu-1", "gpu": "2", "UUID": "GPU-2"},
            "exp_annotations": {"summary": "GPU 2 on gpu-1 is at 91 °C",
                                "description": hot["annotations"]["description"],
                                "runbook": hot["annotations"]["runbook"]}}]}]}]}
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case, allow_unicode=True))
    result = run([tool("promtool"), "test", "rules", str(tmp_path / "case.yaml")], {}, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def pending_case(rules_file: str, eval_times: dict[str, list[dict]]) -> dict:
    """A GPU pod waiting for the bin-packing scheduler from 0m; the scheduler reports it unschedulable from 30m."""
    pod = 'namespace="ml",pod="wait-0",uid="u1"'
    return {"rule_files": [rules_file], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": f'kube_pod_scheduler{{{pod},name="gpu-binpack-scheduler"}}', "values": "1x120"},
            {"series": f'kube_pod_status_phase{{{pod},phase="Pending"}}', "values": "1x120"},
            {"series": f'kube_pod_info{{{pod},node=""}}', "values": "1x120"},
            {"series": 'kube_pod_container_resource_requests{namespace="ml",pod="wait-0",container="c",'
                       'resource="nvidia_com_gpu",unit="integer"}', "values": "1x120"},
            {"series": f"kube_pod_status_unschedulable{{{pod}}}", "values": "_x29 1x90"}],
        "alert_rule_test": [{"eval_time": at, "alertname": "GpuPodsPendingOnBinpackScheduler", "exp_alerts": exp}
                            for at, exp in eval_times.items()]}]}


def test_the_pending_pod_alert_says_whether_the_scheduler_looked_at_the_pod(tmp_path):
    """The reason is in the description: never looked at (is the scheduler running?) until 30m, then the
    scheduler's own verdict (no node fits)."""
    write_rules(tmp_path)
    rule = next(r for r in gpu_alerts.rules() if r["alert"] == "GpuPodsPendingOnBinpackScheduler")
    fixed = {"summary": "GPU pod ml/wait-0 has waited 15m for gpu-binpack-scheduler", "runbook":
             rule["annotations"]["runbook"]}
    unseen = "No scheduler has looked at the pod: gpu-binpack-scheduler is not running, not leading, or stuck."
    no_room = ("gpu-binpack-scheduler looked at the pod and found no node for it (its event says which check "
               "failed on each node).")
    case = pending_case("rules.yaml", {
        "20m": [{"exp_labels": {"severity": "warning", "namespace": "ml", "pod": "wait-0"},
                 "exp_annotations": {**fixed, "description": unseen}}],
        "45m": [{"exp_labels": {"severity": "warning", "namespace": "ml", "pod": "wait-0"},
                 "exp_annotations": {**fixed, "description": no_room}}]})
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    result = run([tool("promtool"), "test", "rules", str(tmp_path / "case.yaml")], {}, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_pending_duration_comes_from_the_config(tmp_path):
    """monitoring.alerts.gpu_pod_pending_for: 1h -> silent at 45 minutes, firing at 61."""
    config = cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}],
                                        "monitoring": {"alerts": {"gpu_pod_pending_for": "1h"}}})
    groups = gpu_alerts.groups(gpu_alerts.settings_from(config))
    for rule in groups[0]["rules"]:
        rule.pop("annotations")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    case = pending_case("rules.yaml", {"45m": None, "61m": [
        {"exp_labels": {"severity": "warning", "namespace": "ml", "pod": "wait-0"}}]})
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    result = run([tool("promtool"), "test", "rules", str(tmp_path / "case.yaml")], {}, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.unit
def test_a_pending_duration_that_is_no_prometheus_duration_is_refused():
    with pytest.raises(ValueError, match="gpu_pod_pending_for"):
        cfg.Config.model_validate({"nodes": [{"name": "gpu-1"}], "monitoring": {"alerts": {"gpu_pod_pending_for":
                                                                                             "15 minutes"}}})


@pytest.mark.unit
def test_the_scaledobject_example_scales_on_a_series_the_rules_record():
    """examples/pods/gpu-utilization-scaledobject.yaml names the per-workload series with all three of its labels,
    and targets the Deployment beside it."""
    example = Path(__file__).resolve().parents[1] / "examples" / "pods" / "gpu-utilization-scaledobject.yaml"
    deployment, scaled = yaml.safe_load_all(example.read_text())
    [trigger] = scaled["spec"]["triggers"]
    recorded = {r["record"] for r in gpu_alerts.workload_rules()}
    name = trigger["metadata"]["query"].split("{")[0]
    assert name in recorded and name.startswith("namespace_workload:")
    for label in ("namespace=", "workload=", "workload_type="):
        assert label in trigger["metadata"]["query"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
