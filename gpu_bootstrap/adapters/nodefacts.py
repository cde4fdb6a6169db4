"""The node-facts service: every GPU node's facts (driver, GPUs, runtime, toolkit), read once per run and shared by
`doctor`, the preflight step and every step whose plan depends on them.

Four sources behind one interface, each saying where its facts came from (`source`): probed now over SSH
(`ProbedNodes`), read from a saved `doctor -o json` (`ReportedNodes`), recorded in the cluster by the last
successful preflight (`RecordedNodes`, for runs that leave preflight out), or none at all (`NoNodeFacts`: an offline
plan or `doctor --no-nodes`), which says why. A node that could not be read comes back as a report whose ssh check
failed: unknown, which no step takes for "no driver". The probing itself (script, parsers, checks) lives in the pure
probes/ package; only the fan-out is here.
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
        return report.load(self.path, names)


class RecordedNodes(NodeFactsSource):
    """Facts the last successful preflight recorded in the cluster. A node it has no facts for is unknown."""

    def __init__(self, names: list[str], kube):
        super().__init__(names)
        self.kube = kube
        self.source = "recorded by preflight (none found)"

    def _read(self, names: list[str]) -> dict[str, NodeReport]:
        from gpu_bootstrap.probes.report import RECORD_NAME, RECORD_NAMESPACE, recorded_facts
        try:
            recorded, source = recorded_facts(self.kube.get("v1", "ConfigMap", RECORD_NAME, RECORD_NAMESPACE))
        except GpuBootstrapError as error:  # the API failed: the facts are unknown, not absent
            recorded, source = {}, f"the record could not be read: {error.message}"
        self.source = source or "no facts recorded by an earlier preflight"
        why = (f"no facts for this node: {self.source}; run preflight (drop --skip preflight / add it to --only) or "
               f"pass --preflight-report FILE")
        return {name: recorded.get(name) or unreachable(name, why) for name in names}


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

    def close(self) -> None:
        self.inner.close()
