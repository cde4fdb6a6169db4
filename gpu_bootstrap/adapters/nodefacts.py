"""The node-facts service: every GPU node's facts (driver, GPUs, runtime, toolkit), read once per run and shared by
`doctor`, the preflight step and every step whose plan depends on them.

Sources behind one interface, each saying where its facts came from (`source`): probed now over SSH
(`ProbedNodes`) or through the cluster (`ClusterProbedNodes`), read from a saved `doctor -o json` (`ReportedNodes`),
or none at all (`NoNodeFacts`: an offline plan or `doctor --no-nodes`), which says why. Online, `WithRecordedFacts`
wraps the source: it binds what was read to the node's boot and machine, and gives a node that could not be read the
facts the last successful preflight recorded in the cluster, when they may stand for it (probes/recorded.py). A node
that could not be read comes back as a report whose ssh check failed: unknown, which no step takes for "no driver".
The probing itself (script, parsers, checks) lives in the pure probes/ package; only the fan-out is here.
"""
from __future__ import annotations

from pathlib import Path

from gpu_bootstrap.core.errors import GpuBootstrapError
from gpu_bootstrap.probes.checks import PASS, WARN, NodeReport, evaluate, unreachable
from gpu_bootstrap.probes.script import build, command_timeout, new_marker, split


class NodeFactsSource:
    """reports(names) -> {node name: NodeReport}, in the order asked; `source` says where they came from."""

    source = ""

    def __init__(self, names: list[str]):
        self.names = list(names)
        self._cache: dict[str, NodeReport] = {}

    def select(self, names: list[str]) -> None:
        """Narrow the nodes every later reports() call covers (doctor --nodes)."""
        self.names = list(names)

    def reports(self, names: list[str] | None = None) -> dict[str, NodeReport]:
        wanted = list(names) if names is not None else self.names
        missing = [name for name in wanted if name not in self._cache]
        if missing:
            self._cache.update(self._read(missing))
        return {name: self._cache[name] for name in wanted if name in self._cache}

    def _read(self, names: list[str]) -> dict[str, NodeReport]:
        raise NotImplementedError

    def recorded_now(self):
        """The facts recorded in the cluster (None: none, or unreadable); False where this run keeps no record."""
        return False

    def close(self) -> None:
        pass


class NoNodeFacts(NodeFactsSource):
    """No facts can be read in this run; `why` tells the user how to give some."""

    def __init__(self, names: list[str], source: str, why: str):
        super().__init__(names)
        self.source = source
        self.why = why

    def _read(self, names: list[str]) -> dict[str, NodeReport]:
        return {}


class ReportedNodes(NodeFactsSource):
    """Facts from a saved `gpu-bootstrap doctor -o json` (up --preflight-report FILE)."""

    def __init__(self, names: list[str], path: Path):
        super().__init__(names)
        self.path = Path(path)
        self.source = str(path)

    def _read(self, names: list[str]) -> dict[str, NodeReport]:
        from gpu_bootstrap.probes import report
        found = report.load(self.path, names)
        for entry in found.values():
            entry.came_from = "report"
        return found


class NotRead(NodeFactsSource):
    """No node is read in this run (preflight left out): every node is unknown, saying why; WithRecordedFacts gives
    each the facts an earlier run recorded, where they may stand for it."""

    source = "not read (preflight left out)"

    def __init__(self, names: list[str], why: str):
        super().__init__(names)
        self.why = why

    def _read(self, names: list[str]) -> dict[str, NodeReport]:
        return {name: unreachable(name, self.why, how="not read") for name in names}


def recorded_only(names: list[str], kube, max_age: int) -> "WithRecordedFacts":
    """A run that leaves preflight out (`--skip preflight`, `--only gpu-operator`): the recorded facts alone."""
    return WithRecordedFacts(NotRead(names, "not read in this run (preflight left out: drop --skip preflight / add "
                                            "it to --only, or pass --preflight-report FILE)"), kube, max_age)


class WithRecordedFacts(NodeFactsSource):
    """`inner`'s facts, stamped with when they were read and the node's identity then (its Node's bootID and
    machineID); for a node `inner` could not read, the facts the last successful preflight recorded in the cluster,
    when they may stand for it (probes/recorded.py: young enough, same machine, same boot), marked as recorded.
    A record or a Node that cannot be read leaves the node unknown, never absent."""

    MANY = 64  # nodes read one by one up to this many; above, one list of every Node

    def __init__(self, inner: NodeFactsSource, kube, max_age: int, clock=None):
        import time
        super().__init__(inner.names)
        self.inner, self.kube, self.max_age = inner, kube, max_age
        self.clock = clock or time.time
        self.ssh = getattr(inner, "ssh", None)
        self.why = getattr(inner, "why", "")
        self.path = getattr(inner, "path", None)
        self.recorded_for: list[str] = []
        self.record: dict[str, NodeReport] | None = None  # the record as read (None: none, or unreadable)
        self.record_note = ""

    @property
    def source(self) -> str:
        if not self.recorded_for:
            return self.inner.source
        return f"{self.inner.source}; recorded facts for {', '.join(self.recorded_for)} ({self.record_note})"

    def select(self, names: list[str]) -> None:
        super().select(names)
        self.inner.select(names)

    def _read(self, names: list[str]) -> dict[str, NodeReport]:
        from gpu_bootstrap.probes import recorded
        found = self.inner.reports(names)
        identities = self._identities(names)
        now = self.clock()
        reports = {}
        for name, report in found.items():
            current = identities.get(name) if identities is not None else None
            if report.read:
                reports[name] = self._stamped(report, current, now)
            else:
                reports[name] = recorded.stand_in(self._recorded().get(name), report, current, now, self.max_age,
                                                  self.record_note)
                if reports[name].came_from == "recorded":
                    self.recorded_for.append(name)
        return reports

    def _stamped(self, report: NodeReport, current: dict | None, now: float) -> NodeReport:
        """Facts read now (or given by a report): when, and from which boot. A report that names another boot of
        the node than the one running now is refused, as recorded facts would be."""
        from gpu_bootstrap.probes import recorded
        if report.identity and current is not None and (change := recorded.identity_change(report.identity, current)):
            return unreachable(report.name, f"the facts given for it are not this node's: {change}; read it again "
                                            f"(gpu-bootstrap doctor -o json)", how="facts refused")
        report.read_at = report.read_at or recorded.stamp(now)
        report.identity = report.identity or dict(current or {})
        return report

    def _identities(self, names: list[str]) -> dict[str, dict] | None:
        """Each node's identity now ({} where it has none or no Node); None when the Nodes could not be read."""
        from gpu_bootstrap.probes.recorded import identity
        try:
            if len(names) <= self.MANY:
                return {name: identity(self.kube.get("v1", "Node", name)) for name in names}
            nodes = {n["metadata"]["name"]: n for n in self.kube.list("v1", "Node")}
            return {name: identity(nodes.get(name)) for name in names}
        except GpuBootstrapError:  # unknown identity: nothing recorded may stand in, nothing read is bound
            return None

    def _recorded(self) -> dict[str, NodeReport]:
        """The last successful preflight's record, read once (on the first node that needs it)."""
        if self.record is None and not self.record_note:
            from gpu_bootstrap.probes.report import RECORD_NAME, RECORD_NAMESPACE, recorded_facts
            try:
                found, note = recorded_facts(self.kube.get("v1", "ConfigMap", RECORD_NAME, RECORD_NAMESPACE))
                self.record, self.record_note = (found, note) if note else (None, "none recorded by an earlier "
                                                                                  "preflight")
            except GpuBootstrapError as error:  # the API failed: the facts are unknown, not absent
                self.record_note = f"the record could not be read: {error.message}"
        return self.record or {}

    def recorded_now(self) -> dict[str, NodeReport] | None:
        """The record as it is in the cluster (None: none, or unreadable), for preflight to tell whether it must be
        written again."""
        self._recorded()
        return self.record

    def close(self) -> None:
        self.inner.close()


class ProbedNodes(NodeFactsSource):
    """Facts probed now: the one probe script fanned out over SSH to every node at once (bounded parallelism). A node
    that fails never holds up the others; it comes back as an unreachable report that says why."""

    source = "ssh"

    def __init__(self, names: list[str], ssh):
        super().__init__(names)
        self.ssh = ssh

    def _read(self, names: list[str]) -> dict[str, NodeReport]:
        from gpu_bootstrap.adapters.ssh import quiet_paramiko

        quiet_paramiko()
        marker = new_marker()
        timeout = command_timeout(self.ssh.config.command_timeout)
        script = build(marker, timeout)

        def probe(target) -> NodeReport:
            result, note = self.ssh.run_script(target, script)
            report = evaluate(target.name, split(result.stdout, marker), marker, timeout)
            ssh_check = report.check("ssh")
            if note and ssh_check.status == PASS:
                ssh_check.status, ssh_check.message = WARN, f"{ssh_check.message}; {note}"
            report.source = "ssh"
            return report

        outcomes = self.ssh.fan_out(probe, names)
        reports = {name: outcome if isinstance(outcome, NodeReport) else unreachable(name, str(outcome))
                   for name, outcome in outcomes.items()}
        for report in reports.values():
            report.source = "ssh"
        return reports

    def close(self) -> None:
        self.ssh.close()


class ClusterProbedNodes(NodeFactsSource):
    """Facts probed now through the cluster: the same probe script, run by a pod on every node (no SSH;
    docs/steps/preflight.md, "Preflight without SSH"). A node whose probe did not finish comes back unknown with the
    reason read from its pod, never as "no driver"."""

    source = "cluster"

    def __init__(self, names: list[str], kube, preflight, registry=None):
        super().__init__(names)
        self.kube = kube
        self.preflight = preflight
        self.registry = registry  # registry.mirror / pull_secret: the probe pulls from the mirror like our other pods

    def _read(self, names: list[str]) -> dict[str, NodeReport]:
        from gpu_bootstrap.adapters.cluster_probe import ClusterProbe, ProbeRefused
        marker = new_marker()
        timeout = command_timeout(self.preflight.timeout)
        try:
            outcomes = ClusterProbe(self.kube, self.preflight.image, self.preflight.timeout, self.registry).run(
                names, build(marker, timeout))
        except ProbeRefused as refused:  # RBAC, a policy, Pod Security: every node unknown, with the reason
            reports = {name: unreachable(name, f"unknown: {refused.one_line()}", how="no probe result")
                       for name in names}
            for report in reports.values():
                report.source = "cluster"
            return reports
        reports = {}
        for name in names:
            outcome = outcomes[name]
            if outcome.finished:
                report = evaluate(name, split(outcome.output, marker), marker, timeout)
            else:
                report = unreachable(name, f"unknown: {outcome.reason}", how="no probe result")
            report.source = "cluster"
            reports[name] = report
        return reports


class WithPoolNodes(NodeFactsSource):
    """`inner`'s facts for the nodes it can reach, and for nodes the `nodes` selector matched (not probed over SSH):
    the facts of the configured pool that launched them, or unknown when no pool of ours did."""

    def __init__(self, inner: NodeFactsSource, config):
        super().__init__([*inner.names, *(n for n in config.selected_nodes if n not in inner.names)])
        self.inner = inner
        self.selected = config.selected_nodes
        self.pools = {p.name: p for p in config.pools}
        self.ssh = getattr(inner, "ssh", None)
        self.why = getattr(inner, "why", "")

    @property
    def source(self) -> str:
        return f"{self.inner.source}; pool definitions for {len(self.selected)} node(s) the selector matched"

    def select(self, names: list[str]) -> None:
        super().select(names)
        self.inner.select([n for n in names if n not in self.selected])

    def _read(self, names: list[str]) -> dict[str, NodeReport]:
        from gpu_bootstrap.probes.checks import from_pool
        found = self.inner.reports([n for n in names if n not in self.selected])
        for name in (n for n in names if n in self.selected):
            pool = self.pools.get(self.selected[name])
            found[name] = from_pool(name, pool.name, pool.ami_family) if pool else unreachable(
                name, "matched by the `nodes` selector but not launched by a pool in `pools`, and not listed with "
                      "an SSH address: its facts are unknown (list it under nodes, or pass --preflight-report)")
        return found

    def recorded_now(self):
        return self.inner.recorded_now()

    def close(self) -> None:
        self.inner.close()
