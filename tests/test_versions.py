"""The release catalogues and the one version rule every chart follows (gpu_bootstrap/core/versions.py): the data files,
the choice of the newest line that fits, its reason, the refusal with the nearest lines and the ways out, pins, and
kube-prometheus-stack through the same code."""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.core import versions
from gpu_bootstrap.render import versions_table
from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.core.errors import EXIT_USAGE, ConfigError
from gpu_bootstrap.core.paths import DATA
from gpu_bootstrap.core.versions import Catalogue, Release, UnsupportedVersion, check_pin, choose
from tests.tools import tool_env

OPERATOR = versions.catalogue("gpu-operator")
KPS = versions.catalogue("kube-prometheus-stack")
runner = CliRunner()

# The table as NVIDIA's platform-support documentation gives it (narrower range where sources disagree).
GPU_OPERATOR_TABLE = {
    "26.7": ("v26.7.0", (1, 33), (1, 37)),
    "26.3": ("v26.3.3", (1, 32), (1, 35)),
    "25.10": ("v25.10.1", (1, 30), (1, 34)),
    "25.3": ("v25.3.4", (1, 29), (1, 32)),
    "24.9": ("v24.9.2", (1, 24), (1, 31)),
    "24.6": ("v24.6.2", (1, 23), (1, 30)),
}


# --- parsing ----------------------------------------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("text, expected", [
    ("1.31", "1.31.0"), ("v1.31.2", "1.31.2"), (" 1.24.17 ", "1.24.17"), ("1.31.4+k3s1", "1.31.4"),
    ("v1.30.5+rke2r1", "1.30.5"), ("1.31.4-eks-2d5f260", "1.31.4"), ("v1.29.10-gke.1227000", "1.29.10"),
])
def test_kube_versions_with_distribution_suffixes(text, expected):
    assert versions.normalize_kube_version(text) == expected


@pytest.mark.unit
@pytest.mark.parametrize("text", ["one.two", "1", "1.31-eks", "1.31.4 extra", "1.31.4+", ""])
def test_not_kube_versions(text):
    with pytest.raises(ValueError):
        versions.normalize_kube_version(text)


# --- the data files ---------------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_the_gpu_operator_table_has_every_line_from_24_6_to_26_7():
    assert {r.line: (r.version, r.kube_min, r.kube_max) for r in OPERATOR.releases} == GPU_OPERATOR_TABLE
    assert [r.line for r in OPERATOR.releases] == list(GPU_OPERATOR_TABLE)  # newest first


@pytest.mark.unit
def test_every_row_names_its_source_and_its_latest_belongs_to_its_line():
    for cat in (OPERATOR, KPS):
        for release in cat.releases:
            assert release.source and release.minors(), release
            assert cat.line_of(release.version) is release


@pytest.mark.unit
def test_the_file_says_where_sources_disagree():
    notes = {r.line: r.note for r in OPERATOR.releases}
    for line in ("26.3", "25.10", "25.3"):  # widened by a later patch: narrower range kept, the other in the note
        assert "Narrower range chosen" in notes[line], line
    assert "1.33-1.36" in notes["26.7"] and "narrower reading" in notes["26.7"]
    assert "1.23" in notes["24.6"]


@pytest.mark.unit
def test_the_data_file_is_what_the_catalogue_reads():
    rows = yaml.safe_load((DATA / "gpu-operator-versions.yaml").read_text())
    assert [(r["line"], r["kubernetes"]["min"], r["kubernetes"]["max"]) for r in rows] == [
        (line, f"{low[0]}.{low[1]}", f"{high[0]}.{high[1]}") for line, (_v, low, high) in GPU_OPERATOR_TABLE.items()]


@pytest.mark.unit
@pytest.mark.parametrize("row, problem", [
    ({"line": "1.0", "latest": "v1.0.0", "kubernetes": {"min": "1.20", "max": "1.21"}}, "line, latest and source"),
    ({"line": "1.0", "latest": "v1.0.0", "source": "s"}, "exactly one of"),
    ({"line": "1.0", "latest": "v1.0.0", "source": "s", "kubernetes": {"min": "1.20", "max": "1.21"},
      "kube_version": ">=1.20.0"}, "exactly one of"),
    ({"line": "1.0", "latest": "v1.0.0", "source": "s", "kubernetes": {"min": "1.22", "max": "1.21"}}, "is above"),
])
def test_a_malformed_row_is_named(row, problem):
    with pytest.raises(ValueError, match=problem):
        versions._release(row, "x-versions.yaml")


# --- the rule: the newest line that fits ------------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("minor, line", [
    (23, "24.6"), (24, "24.9"), (25, "24.9"), (28, "24.9"), (29, "25.3"), (30, "25.10"), (31, "25.10"), (32, "26.3"),
    (33, "26.7"), (35, "26.7"), (37, "26.7"),
])
def test_the_default_is_the_newest_line_validated_for_the_cluster(minor, line):
    choice = choose(OPERATOR, f"1.{minor}.4")
    assert (choice.release.line, choice.version, choice.validated, choice.warning) == (
        line, GPU_OPERATOR_TABLE[line][0], True, "")


@pytest.mark.unit
def test_the_reason_states_the_rule():
    assert choose(OPERATOR, "1.32.2").reason == "newest release NVIDIA validated for Kubernetes 1.32 (1.32-1.35)"
    assert choose(OPERATOR, "1.31.4").reason == "newest release NVIDIA validated for Kubernetes 1.31 (1.30-1.34)"


@pytest.mark.unit
def test_a_version_outside_every_range_is_refused_with_the_nearest_lines_and_the_ways_out():
    with pytest.raises(UnsupportedVersion) as refused:
        choose(OPERATOR, "1.22.0")
    error = refused.value
    assert isinstance(error, ConfigError) and error.exit_code == EXIT_USAGE == 2
    assert error.message == ("no gpu-operator release in gpu-bootstrap's table is validated for Kubernetes 1.22.0; "
                             "the nearest lines are none for older Kubernetes and v24.6.x (validated for 1.23-1.30) "
                             "for newer")
    assert error.hint == ("pin gpu_operator.version to a release you have tested, or set "
                          "gpu_operator.skip_version_check: true to install v24.6.2 at your own risk")
    with pytest.raises(UnsupportedVersion, match=r"nearest lines are v26\.7\.x \(validated for 1\.33-1\.37\) for "
                                                 r"older Kubernetes and none for newer"):
        choose(OPERATOR, "1.38.1")


@pytest.mark.unit
def test_skipping_the_check_installs_the_nearest_line_with_a_warning():
    old = choose(OPERATOR, "1.22.3", skip_check=True)
    new = choose(OPERATOR, "1.38.0", skip_check=True)
    assert (old.version, old.validated, new.version, new.validated) == ("v24.6.2", False, "v26.7.0", False)
    assert "at your own risk (gpu_operator.skip_version_check: true)" in old.reason and old.warning
    assert choose(OPERATOR, "1.30.1", skip_check=True) == choose(OPERATOR, "1.30.1")  # nothing skipped when it fits


def catalogue(*rows: tuple[str, tuple[int, int], tuple[int, int]]) -> Catalogue:
    releases = tuple(Release(line, f"v{line}.0", "test", low, high) for line, low, high in rows)
    return Catalogue("thing", "thing", "newest release validated for Kubernetes {kube}", "is validated for", releases)


@pytest.mark.unit
def test_the_nearest_lines_on_both_sides_of_a_gap():
    gap = catalogue(("3.0", (1, 26), (1, 28)), ("2.0", (1, 25), (1, 30)), ("1.0", (1, 20), (1, 22)))
    below, above = gap.nearest("1.24.0")
    assert (below.line, above.line) == ("1.0", "2.0")  # the oldest newer Kubernetes: 1.25 (2.0), not 1.26 (3.0)
    with pytest.raises(UnsupportedVersion, match=r"nearest lines are v1\.0\.x \(validated for 1\.20-1\.22\) for "
                                                 r"older Kubernetes and v2\.0\.x \(validated for 1\.25-1\.30\)"):
        choose(gap, "1.23.0")
    assert choose(gap, "1.23.0", skip_check=True).version == "v1.0.0"  # a tie goes to the older side
    assert choose(gap, "1.24.0", skip_check=True).version == "v2.0.0"  # one minor away, against two


# --- pins -------------------------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_a_pinned_release_in_range_is_accepted_with_its_range():
    choice = check_pin(OPERATOR, "v24.6.1", "1.24.9")
    assert (choice.release.line, choice.version, choice.validated) == ("24.6", "v24.6.1", True)
    assert choice.reason == "pinned by gpu_operator.version; v24.6.x: validated for 1.23-1.30"


@pytest.mark.unit
def test_a_pinned_release_out_of_range_is_refused_naming_what_fits():
    with pytest.raises(UnsupportedVersion) as refused:
        check_pin(OPERATOR, "v24.6.2", "1.32.2")
    assert refused.value.message == ("gpu-operator v24.6.2 is validated for Kubernetes 1.23-1.30, but the cluster runs "
                                     "1.32.2; releases that fit: v26.3.3 (validated for 1.32-1.35), v25.10.1 "
                                     "(validated for 1.30-1.34), v25.3.4 (validated for 1.29-1.32)")
    assert "gpu_operator.skip_version_check: true" in refused.value.hint
    with pytest.raises(UnsupportedVersion, match="no release in gpu-bootstrap's table is validated for it; the "
                                                 "nearest lines are v26.7.x"):
        check_pin(OPERATOR, "v24.6.2", "1.38.0")
    skipped = check_pin(OPERATOR, "v24.6.2", "1.32.2", skip_check=True)
    assert (skipped.version, skipped.validated) == ("v24.6.2", False) and "installed anyway" in skipped.warning


@pytest.mark.unit
def test_a_release_missing_from_the_table_falls_back_to_its_charts_constraint():
    unknown = check_pin(OPERATOR, "v27.1.0", "1.38.0")
    assert (unknown.release, unknown.validated) == (None, False) and "not checked" in unknown.warning
    allowed = check_pin(OPERATOR, "v27.1.0", "1.38.0", ">=1.34.0-0")
    assert "kubeVersion >=1.34.0-0 admits 1.38" in allowed.reason
    with pytest.raises(UnsupportedVersion, match=r"gpu-operator v27\.1\.0 requires Kubernetes >=1\.34\.0-0, but the "
                                                 r"cluster runs 1\.33\.1; releases that fit: v26\.7\.0"):
        check_pin(OPERATOR, "v27.1.0", "1.33.1", ">=1.34.0-0")


# --- the same rule for kube-prometheus-stack --------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("kube, version", [
    ("1.19.0", "72.9.1"), ("1.24.17", "72.9.1"), ("1.24.0-eks-1", "72.9.1"), ("1.25.0", "88.5.3"), ("1.31.4", "88.5.3"),
    ("1.37.2", "88.5.3"),
])
def test_kube_prometheus_stack_follows_the_same_rule(kube, version):
    choice = choose(KPS, kube)
    assert choice.version == version and choice.validated
    assert choice.reason.startswith(f"newest release whose kubeVersion admits Kubernetes {kube[:4]}")


@pytest.mark.unit
def test_kube_prometheus_stack_refuses_what_no_chart_admits():
    with pytest.raises(UnsupportedVersion) as refused:
        choose(KPS, "1.18.20")
    assert refused.value.one_line() == (
        "no kube-prometheus-stack release in gpu-bootstrap's table admits Kubernetes 1.18.20; the nearest lines are "
        "none for older Kubernetes and 72.x (kubeVersion >=1.19.0-0) for newer — pin monitoring.version to a release "
        "you have tested, or set monitoring.skip_version_check: true to install 72.9.1 at your own risk")


@pytest.mark.unit
def test_the_kube_prometheus_stack_row_is_the_local_charts_own_constraint():
    from tests.conftest import chart
    with tarfile.open(chart("kube-prometheus-stack-88.5.3.tgz")) as archive:
        meta = yaml.safe_load(archive.extractfile("kube-prometheus-stack/Chart.yaml").read())
    row = KPS.line_of(meta["version"])
    assert (row.version, row.constraint) == (meta["version"], meta["kubeVersion"])


# --- through the CLI --------------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_a_refusal_is_exit_2_with_the_message_and_no_traceback(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("nodes: [{name: gpu-1}]\n")
    result = runner.invoke(app, ["up", "--dry-run", "--offline", "--kube-version", "1.22", "-c", str(config),
                                 "-o", "json", "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 2, result.output
    document = json.loads(result.stdout)
    assert document["error"].startswith("[gpu-operator] no gpu-operator release in gpu-bootstrap's table is validated "
                                        "for Kubernetes 1.22.0; the nearest lines are none for older Kubernetes and "
                                        "v24.6.x (validated for 1.23-1.30) for newer — pin gpu_operator.version")
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)  # typer.Exit(2), no crash


@pytest.mark.tools
@pytest.mark.parametrize("emulator_options", [{"kube_version": "1.31.4", "gpu_nodes": ["node5"]}])
def test_doctor_reports_a_refused_release_as_a_failed_check(cluster, tmp_path):
    """doctor does not stop at the refusal `up` makes (exit 2): it is one failed check among the others."""
    from tests.conftest import chart
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}}}\nnodes: [{{name: node5}}]\n"
                      f"gpu_operator: {{chart: {chart('gpu-operator-v26.7.0.tgz')}}}\n")
    result = runner.invoke(app, ["doctor", "-c", str(config), "--no-nodes", "-o", "json", "--log-file",
                                 str(tmp_path / "log")])
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert [c["status"] for c in document["checks"] if c["id"] == "cluster"] == ["pass", "pass"]  # API, permissions
    checks = {c["id"]: c for c in document["checks"]}
    assert checks["gpu-operator"]["status"] == "fail"
    assert checks["gpu-operator"]["message"].startswith(
        "gpu-operator v26.7.0 is validated for Kubernetes 1.33-1.37, but the cluster runs 1.31.4; releases that fit: "
        "v25.10.1 (validated for 1.30-1.34)")
    assert "skip_version_check" in checks["gpu-operator"]["message"]


# --- the docs' "Supported versions" --------------------------------------------------------------------------------
DOCS = Path(__file__).resolve().parent.parent / "docs"
README = DOCS / "supported-versions.md"
BEGIN, END = "<!-- supported-versions:begin -->\n", "<!-- supported-versions:end -->"


@pytest.mark.unit
def test_the_docs_tables_are_generated_from_the_data_files():
    text = README.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    section = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    assert section == versions_table.markdown(), \
        "docs/supported-versions.md drifted: paste `python -m gpu_bootstrap.render.versions_table`"
    for release in OPERATOR.releases + KPS.releases:
        assert f"| {release.label} | {release.version} | {release.range} | {release.source} |" in section


@pytest.mark.unit
def test_the_docs_show_the_plan_line_and_the_refusal_as_they_are():
    text = "\n".join(page.read_text() for page in sorted(DOCS.rglob("*.md")))
    choice = choose(OPERATOR, "1.32.2")
    assert f"install: gpu-operator {choice.release.label} ({choice.version})  ← {choice.reason}\n" in text
    with pytest.raises(UnsupportedVersion) as refused:
        choose(OPERATOR, "1.22.0")
    assert f"error: [gpu-operator] {refused.value.one_line()}\n" in text


def test_the_markdown_command():
    done = subprocess.run([sys.executable, "-m", "gpu_bootstrap.render.versions_table"], capture_output=True,
                          text=True, cwd=DOCS.parent, timeout=60, env=tool_env())
    assert done.returncode == 0 and done.stdout == versions_table.markdown()


@pytest.mark.unit
@pytest.mark.parametrize("component, server, problem", [
    ("1.31.4", "1.31.9", ""), ("1.30.14", "1.31.2", ""), ("1.31.9", "1.31.2", ""),
    ("1.32.0", "1.31.9", "newer than the API server"), ("1.29.15", "1.31.2", "more than one minor older")])
def test_skew_policy_never_newer_at_most_one_minor_older(component, server, problem):
    found = versions.skew_problem("kube-scheduler", component, server)
    assert (problem in found) if problem else found == ""
