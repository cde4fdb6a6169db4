"""Saved node facts: the preflight record's ConfigMap, reading it back (no record, an unreadable one, a good one),
and `--preflight-report FILE` with every kind of bad file named with what is wrong."""
from __future__ import annotations

import dataclasses
import json

import pytest

from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.probes import report
from gpu_bootstrap.probes.checks import NodeCheck, NodeReport, unreachable

pytestmark = pytest.mark.unit

HOW = "write one with: gpu-bootstrap doctor -o json > report.json"
SCHEMA = ("its format: docs/preflight-report.schema.json (examples/preflight-report.json is one); write one with: "
          "gpu-bootstrap doctor -o json > report.json")


def good(name: str) -> NodeReport:
    """A node as doctor reports it: all five checks, each with the facts it read."""
    from tests.nodes.reports import healthy_node
    return NodeReport.from_json(healthy_node(name, gpus=1))


def test_the_record_is_our_configmap_with_the_facts_their_source_and_time():
    reports = {"b": good("b"), "a": unreachable("a", "refused")}
    manifest = report.record_manifest(reports, "ssh", "2026-11-23T12:00:00Z")
    assert manifest == {"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "gpu-bootstrap-node-facts", "namespace": "gpu-bootstrap",
                                     "labels": {"app.kubernetes.io/managed-by": "gpu-bootstrap"}},
                        "data": {"nodes.json": json.dumps(report.document([reports["b"], reports["a"]]),
                                                          sort_keys=True),
                                 "source": "ssh", "time": "2026-11-23T12:00:00Z"}}
    assert manifest["data"]["nodes.json"].startswith('{"nodes": [{"checks": [{"data": {"arch": "x86_64", ')
    assert (report.RECORD_NAMESPACE, report.RECORD_NAME) == ("gpu-bootstrap", "gpu-bootstrap-node-facts")


def test_the_record_reads_back_with_where_it_came_from():
    reports = {"b": good("b"), "a": unreachable("a", "refused")}
    found, source = report.recorded_facts(report.record_manifest(reports, "r.json", "T"))
    # each node's facts carry when they were read: a record from before they did gives them the record's time
    assert (found, source) == ({name: dataclasses.replace(r, read_at="T") for name, r in reports.items()},
                               "recorded by preflight at T from r.json")
    partial = {"data": {"nodes.json": json.dumps(report.document([good("b")]))}}
    assert report.recorded_facts(partial) == ({"b": good("b")}, "recorded by preflight at ? from ?")


@pytest.mark.parametrize("config_map", [None, {}, {"data": None}, {"data": {"source": "ssh", "time": "T"}}])
def test_no_record_gives_no_facts_and_no_source(config_map):
    """The caller then says 'no facts recorded by an earlier preflight' (not 'recorded … at ? from ?')."""
    assert report.recorded_facts(config_map) == ({}, "")


@pytest.mark.parametrize("text", ["not json", "[]", '{"nodes": [{"checks": []}]}', '{"nodes": [{"name": "a", '
                                                                                   '"checks": [{"id": "ssh"}]}]}'])
def test_an_unreadable_record_gives_no_facts(text):
    assert report.recorded_facts({"data": {"nodes.json": text, "source": "ssh", "time": "T"}}) == ({}, "")


def test_an_empty_record_has_no_node_but_says_where_it_came_from():
    assert report.recorded_facts({"data": {"nodes.json": '{"nodes": null}', "source": "ssh", "time": "T"}}) == (
        {}, "recorded by preflight at T from ssh")


def write(tmp_path, content) -> str:
    path = tmp_path / "report.json"
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return str(path)


def test_a_report_gives_the_wanted_nodes_in_the_order_asked(tmp_path):
    doc = report.document([good("a"), good("b"), unreachable("c", "refused")])
    assert doc["ok"] is False and report.document([good("a")])["ok"] is True
    loaded = report.load(write(tmp_path, doc), ["c", "a"])
    assert list(loaded) == ["c", "a"] and loaded == {"c": unreachable("c", "refused"), "a": good("a")}


@pytest.mark.parametrize("content, message, hint", [
    (b'{\n\n\xff"nodes": []}', "preflight report {path}:3 is not UTF-8 text (byte 0xff at offset 3)", HOW),
    (b"\n\xfe", "preflight report {path}:2 is not UTF-8 text (byte 0xfe at offset 1)", HOW),
    (b"{nodes", "preflight report {path} is not valid JSON: Expecting property name enclosed in double quotes: "
                "line 1 column 2 (char 1)", ""),
    ([], "preflight report {path}: expected the output of 'gpu-bootstrap doctor -o json' (an object with a 'nodes' "
         "list)", SCHEMA),
    ({"nodes": {"a": 1}}, "preflight report {path}: expected the output of 'gpu-bootstrap doctor -o json' (an object "
                          "with a 'nodes' list)", SCHEMA),
    ({"nodes": [good("a").to_json(), ["not", "a", "node"]]},
     "preflight report {path}: nodes[1]: ['not', 'a', 'node'] is not of type 'object'", SCHEMA),
    ({"nodes": [{**good("a").to_json(), "name": 7}]}, "preflight report {path}: nodes[0].name: 7 is not of type "
                                                     "'string'", SCHEMA),
    ({"nodes": [{"name": "a", "checks": [*good("a").to_json()["checks"], {"id": "gpu-count", "status": "pass"}]}]},
     "preflight report {path}: nodes[0].checks[5].id (gpu-count, pass): 'gpu-count' is not one of ['ssh', "
     "'nvidia-driver', 'nouveau', 'container-runtime', 'nvidia-container-toolkit']", SCHEMA),
    ({"nodes": [{"name": "a", "checks": good("a").to_json()["checks"][:2]}]},
     "preflight report {path}: nodes[0].checks: no nouveau check (every node has all of ssh, nvidia-driver, nouveau, "
     "container-runtime, nvidia-container-toolkit)", SCHEMA),
    # found: a hand-written report whose checks carried no facts was taken, then the plan asked for the report
    ({"nodes": [{"name": "a", "checks": [{**c, "data": {}} for c in good("a").to_json()["checks"]]}]},
     "preflight report {path}: nodes[0].checks[0].data (ssh, pass): 'arch' is a required property", SCHEMA),
])
def test_a_bad_report_is_one_error_saying_what_is_wrong(tmp_path, content, message, hint):
    path = write(tmp_path, content)
    with pytest.raises(ConfigError) as raised:
        report.load(path, ["a", "b", "c"])
    assert (raised.value.message, raised.value.hint) == (message.format(path=path), hint)


@pytest.mark.parametrize("held, wanted, message, hint", [
    # found by a new user: a typo in `nodes` was met with "run doctor again", while the report was right
    (["gpu-1", "gpu-2", "gpu3"], ["gpu-1", "gpu-3"], "has no facts for gpu-3 (it has: gpu-1, gpu-2, gpu3)",
     "did you mean gpu-3 -> gpu3? fix the name in `nodes` (the report names nodes as the cluster does); a node the "
     "report does not know yet needs a fresh one: gpu-bootstrap doctor -o json > {path}"),
    (["a"], ["a", "b", "c"], "has no facts for b, c (it has: a)",
     "a node added since the report was written needs a fresh one: gpu-bootstrap doctor -o json > {path} (with every "
     "configured node); a node that is not in the cluster: fix `nodes` in the config"),
])
def test_a_node_the_report_lacks_is_told_apart_from_a_typo(tmp_path, held, wanted, message, hint):
    path = write(tmp_path, {"nodes": [good(name).to_json() for name in held]})
    with pytest.raises(ConfigError) as raised:
        report.load(path, wanted)
    assert (raised.value.message, raised.value.hint) == (f"preflight report {path} {message}", hint.format(path=path))


def test_a_missing_or_unreadable_report_file(tmp_path):
    with pytest.raises(ConfigError) as raised:
        report.load(tmp_path / "absent.json", ["a"])
    assert (raised.value.message, raised.value.hint) == (f"preflight report {tmp_path / 'absent.json'} not found", HOW)
    with pytest.raises(ConfigError) as raised:
        report.load(tmp_path, ["a"])  # a directory: the OS's own words
    assert raised.value.message == f"cannot read the preflight report {tmp_path}: Is a directory"


def test_the_sample_report_is_one_the_schema_and_the_loader_take():
    """examples/preflight-report.json (README's first command reads it) validates against the published schema
    (docs/preflight-report.schema.json, written by scripts/generate-docs from report.schema()) and loads."""
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    sample = root / "examples" / "preflight-report.json"
    assert report.schema_problem(json.loads(sample.read_text())) is None
    assert json.loads((root / "docs" / "preflight-report.schema.json").read_text()) == report.schema()
    assert list(report.load(sample, ["node5", "node6", "node7"])) == ["node5", "node6", "node7"]


def _doctor(tmp_path, *args: str):
    from typer.testing import CliRunner
    from gpu_bootstrap.cli.commands import app
    config = tmp_path / "gpu-bootstrap.yaml"
    # addresses no SSH could reach (TEST-NET-1): only the report can answer for these nodes
    config.write_text("nodes:\n  - {name: a, address: 192.0.2.1}\n  - {name: b, address: 192.0.2.2}\n")
    return CliRunner().invoke(app, ["doctor", "-c", str(config), "--log-file", str(tmp_path / "log"), *args])


def test_doctor_takes_the_nodes_facts_from_a_report(tmp_path):
    """Found by a new user: doctor's own advice said "pass --preflight-report FILE", and doctor had no such flag."""
    path = write(tmp_path, {"nodes": [good("a").to_json(), good("b").to_json()]})
    result = _doctor(tmp_path, "--no-cluster", "--preflight-report", str(path), "-o", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [n["name"] for n in document["nodes"]] == ["a", "b"] and document["ok"] is True
    # the report is checked as up checks it: a node it lacks is bad input
    path = write(tmp_path, {"nodes": [good("a").to_json()]})
    refused = _doctor(tmp_path, "--no-cluster", "--preflight-report", str(path))
    assert refused.exit_code == 2 and "has no facts for b (it has: a)" in refused.output


@pytest.mark.parametrize("flag", [["--via", "ssh"], ["--no-nodes"]])
def test_doctor_refuses_a_report_beside_a_way_to_read_the_nodes(tmp_path, flag):
    path = write(tmp_path, {"nodes": [good("a").to_json(), good("b").to_json()]})
    result = _doctor(tmp_path, "--no-cluster", "--preflight-report", str(path), *flag)
    assert result.exit_code == 2 and f"so {flag[0]} has nothing to do" in result.output


def _preflight_page() -> str:
    from pathlib import Path
    return (Path(__file__).resolve().parent.parent / "docs" / "steps" / "preflight.md").read_text()


def test_every_outcome_of_the_cluster_probe_is_in_the_docs_table_with_its_fix():
    """Found by a new user: a probe failure the docs' table of outcomes did not list. Each reason the probe can give
    (probes/incluster.py), up to its first variable part, is a row of docs/steps/preflight.md's table."""
    import re
    from pathlib import Path
    source = (Path(__file__).resolve().parent.parent / "gpu_bootstrap" / "probes" / "incluster.py").read_text()
    reasons = re.findall(r'(?:reason=|return \(?)f?"(the [^"]*)"', source)
    prefixes = {re.split(r"[({:]", reason)[0].strip() for reason in reasons}
    assert len(prefixes) >= 12, prefixes
    rows = [line for line in _preflight_page().splitlines() if line.startswith("| `the ")]
    missing = [p for p in sorted(prefixes) if not any(p in row for row in rows)]
    assert missing == []
    assert all(row.count("|") >= 3 and row.rsplit("|", 2)[1].strip() for row in rows)  # each with what to do


def test_the_hand_written_report_in_the_docs_is_one_the_loader_and_a_plan_take(tmp_path):
    from typer.testing import CliRunner
    from gpu_bootstrap.cli.commands import app
    page = _preflight_page()
    block = page[page.index("### Writing a report by hand"):]
    block = block[block.index("```json\n") + len("```json\n"):]
    document = json.loads(block[:block.index("```")])
    path = write(tmp_path, document)
    facts = report.load(path, ["gpu-7"])["gpu-7"]
    assert [c.status for c in facts.checks] == ["pass", "warn", "pass", "pass", "warn"]
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text("nodes: [{name: gpu-7}]\n")
    result = CliRunner().invoke(app, ["up", "--dry-run", "--offline", "--kube-version", "1.33", "-c", str(config),
                                      "--preflight-report", path, "-o", "json", "--log-file", str(tmp_path / "log"),
                                      "--allow-incomplete"])
    plan = json.loads(result.stdout)
    operator = next(s for s in plan["steps"] if s["id"] == "gpu-operator")
    assert operator["status"] == "planned" and plan["incomplete"] == [], plan  # every value decided from the facts
