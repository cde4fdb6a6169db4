"""When the facts an earlier run recorded may stand for a node this run could not read (probes/recorded.py), and the
doctor table that says where each node's facts came from. Pure: no host, times passed in."""
from __future__ import annotations

import dataclasses

import pytest

from gpu_bootstrap.core.config.fields import parse_age
from gpu_bootstrap.probes import recorded
from gpu_bootstrap.probes.checks import FAIL, WARN, NodeReport, unreachable
from tests.nodes.reports import healthy_node

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
HOUR = 3600
BOOT = {"boot_id": "b0a1b2c3-1111", "machine_id": "m0a1b2c3"}
WEEK = parse_age("7d")


def facts(read_ago: float = HOUR, identity: dict | None = None, source: str = "cluster") -> NodeReport:
    report = NodeReport.from_json(healthy_node("gpu-1"))
    report.read_at, report.identity, report.source = recorded.stamp(NOW - read_ago), dict(BOOT if identity is None else identity), source
    return report


UNREAD = unreachable("gpu-1", "unknown: the probe did not finish within preflight.timeout (5s)", how="no probe result")


def test_ages_are_read_as_people_write_them():
    assert [parse_age(t) for t in ("7d", "36h", "1d12h", "30m", "0s", "2w")] == [
        7 * 86400, 36 * HOUR, 36 * HOUR, 1800, 0, 14 * 86400]
    for bad in ("7", "7 days", "-1d", "1.5h", "", "7D"):
        with pytest.raises(ValueError, match="is not an age"):
            parse_age(bad)
    assert [recorded.describe_age(s) for s in (5, 700, 2 * HOUR + 300, 3 * 86400 + 4 * HOUR + 59)] == [
        "5s", "11m40s", "2h5m", "3d4h"]


def test_young_facts_of_the_same_boot_stand_in_marked_as_recorded_with_why_the_node_was_not_read():
    used = recorded.stand_in(facts(2 * HOUR), UNREAD, dict(BOOT), NOW, WEEK, "recorded by preflight at T from x")
    assert used.came_from == "recorded" and used.read and used.ok
    ssh = used.check("ssh")
    assert ssh.status == WARN
    assert ssh.message == ("not read now (unknown: the probe did not finish within preflight.timeout (5s)); using its "
                           "facts read 2h ago over cluster (recorded by preflight at T from x, same boot)")
    assert {c.id: c.data for c in used.checks if c.id != "ssh"} == \
        {c.id: c.data for c in facts().checks if c.id != "ssh"}  # the facts themselves, unchanged
    assert used.read_at == facts(2 * HOUR).read_at  # their age is kept: recording them again never makes them young


@pytest.mark.parametrize("record, current, max_age, why", [
    (facts(8 * 86400), BOOT, WEEK, "they were read 8d ago, more than preflight.max_facts_age (7d)"),
    (facts(), BOOT, 0, "preflight.max_facts_age is 0s (recorded facts are never reused)"),
    (facts(), {**BOOT, "boot_id": "ffff0000-2222"}, WEEK, "its boot ID changed (b0a1b2c3 -> ffff0000): the node "
                                                          "rebooted or was replaced since"),
    (facts(), {"boot_id": "ffff0000", "machine_id": "99999999"}, WEEK, "its machine ID changed (m0a1b2c3 -> 99999999):"
                                                                       " another machine has this name now"),
    (facts(), {}, WEEK, "no Node of that name, or no bootID in its status"),
    (facts(), None, WEEK, "its Node object could not be read"),
    (facts(identity={}), BOOT, WEEK, "they were recorded without the node's identity"),
    (dataclasses.replace(facts(), read_at=""), BOOT, WEEK, "they carry no time they were read at"),
])
def test_facts_that_may_not_be_the_nodes_leave_it_unknown_saying_why(record, current, max_age, why):
    kept = recorded.stand_in(record, UNREAD, current, NOW, max_age, "recorded by preflight at T")
    assert not kept.read and kept.came_from == ""
    assert kept.check("ssh").status == FAIL
    message = kept.check("ssh").message
    assert message.startswith("unknown: the probe did not finish") and "are refused: " in message and why in message


def test_no_record_or_an_unknown_recorded_node_leaves_it_unknown():
    for record in (None, unreachable("gpu-1", "refused")):
        kept = recorded.stand_in(record, UNREAD, dict(BOOT), NOW, WEEK, "none recorded by an earlier preflight")
        assert not kept.read and "no facts recorded for it (none recorded by an earlier preflight)" in \
            kept.check("ssh").message


def read_now(identity: dict | None = None) -> NodeReport:
    return facts(0, identity)


@pytest.mark.parametrize("record, reports, stale", [
    (None, {"gpu-1": read_now()}, "no facts are recorded yet"),
    ({}, {"gpu-1": read_now()}, "gpu-1 has no recorded facts"),
    ({"gpu-1": facts(HOUR)}, {"gpu-1": read_now()}, None),  # young and the same: no write on a second run
    ({"gpu-1": facts(4 * 86400)}, {"gpu-1": read_now()}, "past half of preflight.max_facts_age"),
    ({"gpu-1": facts(HOUR, {"boot_id": "x"})}, {"gpu-1": read_now()}, "gpu-1's identity changed"),
    ({"gpu-1": unreachable("gpu-1", "x")}, {"gpu-1": read_now()}, "gpu-1 has no recorded facts"),
    # a node not read now keeps its entry as it is (its age is its own)
    ({"gpu-1": facts(5 * 86400)}, {"gpu-1": dataclasses.replace(facts(5 * 86400), came_from="recorded")}, None),
    # a report is as old as it says: recording it again would not make it younger
    ({"gpu-1": facts(5 * 86400)}, {"gpu-1": dataclasses.replace(facts(5 * 86400), came_from="report")}, None),
])
def test_the_record_is_written_again_only_when_it_must_be(record, reports, stale):
    found = recorded.record_stale(record, reports, NOW, WEEK)
    assert (found is None) == (stale is None) and (stale is None or stale in found), found


def test_changed_facts_are_recorded_again():
    changed = read_now()
    changed.check("nvidia-driver").data["driver_version"] = "999.1"
    assert recorded.record_stale({"gpu-1": facts(HOUR)}, {"gpu-1": changed}, NOW, WEEK) == "gpu-1's facts changed"


def test_the_node_identity_is_what_its_kubelet_reports():
    node = {"status": {"nodeInfo": {"bootID": "b", "machineID": "m", "systemUUID": "u"}}}
    assert recorded.identity(node) == {"boot_id": "b", "machine_id": "m"}
    assert recorded.identity({"status": {"nodeInfo": {"bootID": "", "machineID": "m"}}}) == {"machine_id": "m"}
    assert recorded.identity(None) == recorded.identity({}) == {}


@pytest.mark.parametrize("report, shown", [
    (facts(0, source="ssh"), "ssh"),
    (facts(0, source="cluster"), "cluster"),
    (dataclasses.replace(facts(0), came_from="report"), "report"),
    (dataclasses.replace(facts(3 * HOUR), came_from="recorded"), "recorded, 3h old"),
    (dataclasses.replace(unreachable("gpu-1", "refused"), source="cluster"), "cluster: not read"),
])
def test_doctor_names_where_each_nodes_facts_came_from(report, shown):
    assert recorded.describe_source(report, NOW) == shown


def test_the_doctor_table_has_a_facts_column_and_no_ssh_column_for_facts_read_through_the_cluster(capsys,
                                                                                                 monkeypatch):
    from gpu_bootstrap.cli.ui import doctor_tables
    monkeypatch.setenv("COLUMNS", "220")  # a wide terminal: each header on one line
    used = recorded.stand_in(facts(2 * HOUR), UNREAD, dict(BOOT), NOW, WEEK, "recorded")
    doctor_tables([], [facts(0, source="cluster"), used])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "node" in line and "facts from" in line)
    assert " ssh " not in header and " os " in header
    assert "cluster" in out and "recorded," in out


def test_a_report_states_when_and_from_which_boot_its_facts_were_read(tmp_path):
    """A report `doctor -o json` writes carries read_at and identity; the schema takes them, and a hand-written one
    without them."""
    from gpu_bootstrap.probes import report as saved
    document = saved.document([facts(0, source="ssh")])
    assert saved.schema_problem(document) is None
    document["nodes"][0]["read_at"] = "yesterday"
    assert "read_at" in saved.schema_problem(document)
    document["nodes"][0]["read_at"] = recorded.stamp(NOW)
    document["nodes"][0]["identity"] = {"boot": "x"}
    assert "identity" in saved.schema_problem(document)
