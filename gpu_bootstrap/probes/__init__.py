"""Node preflight: what each GPU node has (driver, GPUs, container runtime, NVIDIA toolkit), read over SSH.

script.py says what runs on the node, parse.py and checks.py turn its output into checks (pure), and
probe_nodes() fans the one script out to every node.
"""
from __future__ import annotations

from .checks import PASS, WARN, NodeCheck, NodeReport, evaluate, unreachable
from .script import build, command_timeout, new_marker, split


def probe_nodes(ssh, names: list[str] | None = None) -> list[NodeReport]:
    """Run the probe script on every node (bounded parallelism). A node that fails never holds up the others."""
    from ..adapters.ssh import SshFailure, quiet_paramiko

    quiet_paramiko()
    marker = new_marker()
    timeout = command_timeout(ssh.config.command_timeout)
    script = build(marker, timeout)

    def probe(target) -> NodeReport:
        result, note = ssh.run_script(target, script)
        report = evaluate(target.name, split(result.stdout, marker), marker, timeout)
        ssh_check = report.check("ssh")
        if note and ssh_check.status == PASS:
            ssh_check.status, ssh_check.message = WARN, f"{ssh_check.message}; {note}"
        return report

    outcomes = ssh.fan_out(probe, names)
    return [outcome if isinstance(outcome, NodeReport) else unreachable(name, str(outcome))
            for name, outcome in outcomes.items()]


__all__ = ["NodeCheck", "NodeReport", "probe_nodes"]
