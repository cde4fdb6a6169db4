"""Facts remembered between runs: when the facts an earlier run recorded may stand for a node this run could not
read, and when the record must be written again. Pure: times are passed in, nothing is read here.

Recorded facts stand for a node only when (1) they are younger than `preflight.max_facts_age`, and (2) the node is
still the one they were read from: the same machine (status.nodeInfo.machineID) in the same boot (bootID). A node
replaced under the same name, or rebooted (a new driver or runtime may have come with the boot), is unknown until it
is read again: unknown, never "absent" and never yesterday's facts.
"""
from __future__ import annotations

import copy
import datetime as _dt

from gpu_bootstrap.probes.checks import PASS, WARN, NodeReport

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
def stamp(now: float) -> str:
    return _dt.datetime.fromtimestamp(now, _dt.timezone.utc).strftime(TIME_FORMAT)


def seconds_since(read_at: str, now: float) -> float | None:
    try:
        then = _dt.datetime.strptime(read_at, TIME_FORMAT).replace(tzinfo=_dt.timezone.utc).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, now - then)


def describe_age(seconds: float) -> str:
    """45s, 12m, 3h5m, 2d4h: the two largest units, as people read an age."""
    seconds = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size or (unit == "s" and not parts):
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
        if len(parts) == 2:
            break
    return "".join(parts)


def identity(node: dict | None) -> dict:
    """The Node's identity as its kubelet reports it: {'boot_id', 'machine_id'} (those it has)."""
    info = ((node or {}).get("status") or {}).get("nodeInfo") or {}
    found = {"boot_id": info.get("bootID"), "machine_id": info.get("machineID")}
    return {key: str(value) for key, value in found.items() if value}


def identity_change(recorded: dict, current: dict | None) -> str | None:
    """Why facts bound to `recorded` are not the facts of the node now (`current`; None: unread), or None."""
    if not recorded.get("boot_id") and not recorded.get("machine_id"):
        return "they were recorded without the node's identity (boot ID, machine ID), so they cannot be bound to it"
    if current is None:
        return "the node's identity cannot be read now (its Node object could not be read)"
    if not current:
        return "the node's identity cannot be read now (no Node of that name, or no bootID in its status)"
    if recorded.get("machine_id") and recorded.get("machine_id") != current.get("machine_id"):
        return (f"its machine ID changed ({_short(recorded.get('machine_id'))} -> {_short(current.get('machine_id'))}):"
                f" another machine has this name now")
    if recorded.get("boot_id") and recorded.get("boot_id") != current.get("boot_id"):
        return (f"its boot ID changed ({_short(recorded.get('boot_id'))} -> {_short(current.get('boot_id'))}): the "
                f"node rebooted or was replaced since, and its driver or runtime may have changed with it")
    return None


def _short(value) -> str:
    return str(value or "none")[:8]


def refusal(report: NodeReport, current: dict | None, now: float, max_age: int) -> str | None:
    """Why recorded facts may not stand for the node now, or None."""
    if max_age <= 0:
        return "preflight.max_facts_age is 0s (recorded facts are never reused)"
    age = seconds_since(report.read_at, now)
    if age is None:
        return "they carry no time they were read at"
    if age > max_age:
        return (f"they were read {describe_age(age)} ago, more than preflight.max_facts_age "
                f"({describe_age(max_age)})")
    return identity_change(report.identity, current)


def stand_in(recorded: NodeReport | None, unread: NodeReport, current: dict | None, now: float, max_age: int,
             where: str) -> NodeReport:
    """The report for a node this run could not read (`unread`, ssh failed): its recorded facts when they may stand
    for it, marked as such (ssh warns, with why it was not read and how old the facts are); else `unread`, saying why
    the recorded facts may not stand in."""
    reason = unread.check("ssh").message
    if recorded is None or not recorded.read:
        return _noted(unread, f"no facts recorded for it ({where})")
    problem = refusal(recorded, current, now, max_age)
    if problem:
        return _noted(unread, f"its recorded facts ({where}) are refused: {problem}")
    used = copy.deepcopy(recorded)
    used.came_from = "recorded"
    ssh = used.check("ssh")
    if ssh.status == PASS:
        ssh.status = WARN
    age = describe_age(seconds_since(recorded.read_at, now) or 0)
    ssh.message = (f"not read now ({reason}); using its facts read {age} ago"
                   f"{' over ' + recorded.source if recorded.source else ''} ({where}, same boot)")
    return used


def _noted(report: NodeReport, note: str) -> NodeReport:
    noted = copy.deepcopy(report)
    ssh = noted.check("ssh")
    ssh.message = f"{ssh.message}; {note}"
    return noted


def record_stale(recorded: dict[str, NodeReport] | None, reports: dict[str, NodeReport], now: float,
                 max_age: int) -> str | None:
    """Why the facts read in this run must be recorded again, or None: there is no record, a node read now is not in
    it (or with other facts, or another identity), or its facts there are past half their allowed age (so that a
    cluster run every few days never loses them). Nodes not read now keep their entry as it is; a report's facts
    are as old as the report says, so rewriting them would not make them younger."""
    if recorded is None:
        return "no facts are recorded yet"
    for name, report in reports.items():
        if not report.read or report.came_from == "recorded":
            continue
        entry = recorded.get(name)
        if entry is None or not entry.read:
            return f"{name} has no recorded facts"
        if {c.id: c.data for c in entry.checks} != {c.id: c.data for c in report.checks}:
            return f"{name}'s facts changed"
        if entry.identity != report.identity:
            return f"{name}'s identity changed"
        age = seconds_since(entry.read_at, now)
        if report.came_from != "report" and (age is None or age > max_age / 2):  # a report is as old as it is
            return f"{name}'s recorded facts are past half of preflight.max_facts_age"
    return None


def describe_source(report: NodeReport, now: float) -> str:
    """Where a node's facts in this run came from, for the doctor's table: ssh, cluster (read now), report (a saved
    or hand-written one), recorded (with their age), pool (a Karpenter pool's definition), or not read."""
    if report.came_from == "recorded":
        age = seconds_since(report.read_at, now)
        return f"recorded, {describe_age(age)} old" if age is not None else "recorded"
    if report.came_from == "report":
        return "report"
    if any(c.id == "ssh" and c.data.get("pool") for c in report.checks):
        return "pool"
    if not report.read:
        return f"{report.source}: not read" if report.source else "not read"
    return report.source or "?"
