#!/usr/bin/env python3
"""How fast `gpu-bootstrap doctor` checks many nodes, next to Ansible running the same probe commands on the same
nodes in the same run.

Nodes: real OpenSSH sshd on 127.0.0.1, one per node, chrooted into a healthy 8×H100 tree (tests/nodes). The peer
is `ansible all -m raw -a <the same probe script>` (ansible-core, its default forks 5, and forks 50), which uses the
OpenSSH client. Both start cold (a new process, new connections). Needs root (sshd chroot) and the bench extra:
pip install -e '.[bench]'.

Target: doctor on 50 nodes <= 1.5 s and >= 5x faster than Ansible with default forks (same run).

Usage: sudo python benchmarks/doctor_fanout.py [--nodes 50] [--runs 3]
"""
from __future__ import annotations

import argparse
import base64
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_bootstrap.probes import script  # noqa: E402
from tests.nodes import scenarios  # noqa: E402
from tests.nodes.farm import NodeFarm  # noqa: E402


def timed(command: list[str], env: dict, expect: str, count: int) -> float:
    """Wall time of one cold run; `expect` must appear `count` times in stdout, so a fast failure cannot pass."""
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    if result.returncode not in (0, 1) or result.stdout.count(expect) != count:
        raise SystemExit(f"{command[0]} failed ({result.returncode}): {result.stdout[-600:]} {result.stderr[-600:]}")
    return elapsed


def doctor_command(config: Path, names: list[str] | None = None) -> list[str]:
    command = [shutil.which("gpu-bootstrap") or sys.executable, "doctor", "-c", str(config), "--no-cluster", "-o",
               "json"]
    if not shutil.which("gpu-bootstrap"):
        command[1:1] = ["-m", "gpu_bootstrap"]
    if names:
        command += ["--nodes", ",".join(names)]
    return command


def ansible_inventory(farm: NodeFarm, folder: Path, names: list[str]) -> Path:
    lines = ["[gpu]"]
    for name in names:
        node = farm.nodes[name]
        lines.append(f"{name} ansible_host=127.0.0.1 ansible_port={node.port} ansible_user=root "
                     f"ansible_ssh_private_key_file={farm.client_key}")
    path = folder / f"inventory-{len(names)}.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def ansible_command(inventory: Path, probe: Path, forks: int) -> list[str]:
    """`ansible -m raw` running the same probe script on every node. The script travels base64-encoded and is
    decoded on the node into `sh`: Ansible splits a raw command's text as shell words and templates it with Jinja, and
    the probe's comments hold apostrophes and its docker call a `{{.Server.Version}}` format, which either step would
    break (ansible-core 2.18 and 2.19 stop with "failed at splitting arguments")."""
    encoded = base64.b64encode(probe.read_bytes()).decode()
    return [shutil.which("ansible"), "gpu", "-i", str(inventory), "-m", "raw", "-a",
            f"printf %s {encoded} | base64 -d | sh", "--forks", str(forks)]


FLOOR = """
import sys, yaml
sys.modules.setdefault("invoke", None)
import paramiko
from concurrent.futures import ThreadPoolExecutor
config = yaml.safe_load(open(sys.argv[1]))
keys, pkey = paramiko.HostKeys(config["ssh"]["known_hosts"]), paramiko.Ed25519Key(filename=config["ssh"]["identity_file"])
script = open(sys.argv[2], "rb").read()
def one(node):
    name = f"[127.0.0.1]:{node['port']}"
    client = paramiko.SSHClient()
    for kind, key in (keys.lookup(name) or {}).items():
        client.get_host_keys().add(name, kind, key)
    client.connect("127.0.0.1", node["port"], username="root", pkey=pkey, look_for_keys=False, allow_agent=False)
    channel = client.get_transport().open_session()
    channel.exec_command("sh -s"); channel.sendall(script); channel.shutdown_write()
    out = b"".join(iter(lambda: channel.recv(65536), b""))
    channel.recv_exit_status(); client.close()
    return out
with ThreadPoolExecutor(32) as pool:
    for out in pool.map(one, config["nodes"]):
        print('"id": "nvidia-driver"' if b"nvidia-smi" in out else "missing")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if not shutil.which("ansible"):
        raise SystemExit("ansible is not installed: pip install -e '.[bench]'")
    # As installed: pip compiles the package's bytecode at install time, but this checkout may run with
    # PYTHONDONTWRITEBYTECODE=1, which would make every cold start compile gpu_bootstrap from source (~0.1 s).
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "gpu_bootstrap")], check=True,
                   stdout=subprocess.DEVNULL)
    farm = NodeFarm()
    folder = Path(tempfile.mkdtemp(prefix="doctor-fanout-"))
    try:
        names = [f"node{i:03d}" for i in range(args.nodes)]
        for name in names:
            farm.add(name, scenarios.healthy_h100)
        known_hosts = farm.known_hosts(folder / "known_hosts")
        config = farm.config_yaml(folder / "gpu-bootstrap.yaml", known_hosts)
        probe = folder / "probe.sh"
        probe.write_text(script.build(script.new_marker()))
        inventory = ansible_inventory(farm, folder, names)
        env = dict(os.environ, ANSIBLE_HOST_KEY_CHECKING="True", ANSIBLE_STDOUT_CALLBACK="minimal",
                   ANSIBLE_SSH_ARGS=f"-o UserKnownHostsFile={known_hosts} -o ControlMaster=auto "
                                    f"-o ControlPersist=60s -o ControlPath={folder}/cp-%C",
                   ANSIBLE_LOCAL_TEMP=str(folder / "ansible-tmp"), NO_COLOR="1")
        figures = {}
        one = ansible_inventory(farm, folder, names[:1])
        # (label, command, what each node's success prints, how many nodes)
        plan = [("doctor, 1 node", doctor_command(config, names[:1]), '"id": "nvidia-driver"', 1),
                (f"doctor, {args.nodes} nodes", doctor_command(config), '"id": "nvidia-driver"', args.nodes),
                # the floor: the same script over paramiko with nothing else (no CLI, config, checks or report)
                (f"bare paramiko fan-out, {args.nodes} nodes", [sys.executable, "-c", FLOOR, str(config), str(probe)],
                 '"id": "nvidia-driver"', args.nodes),
                (f"ansible -m raw, {args.nodes} nodes, forks 5 (default)", ansible_command(inventory, probe, 5),
                 "| CHANGED | rc=0", args.nodes),
                (f"ansible -m raw, {args.nodes} nodes, forks 50", ansible_command(inventory, probe, 50),
                 "| CHANGED | rc=0", args.nodes),
                ("ansible -m raw, 1 node", ansible_command(one, probe, 5), "| CHANGED | rc=0", 1)]
        for label, command, expect, count in plan:
            samples = []
            for _ in range(args.runs):
                for control in folder.glob("cp-*"):
                    control.unlink()  # cold: no persisted SSH connections from the previous run
                samples.append(timed(command, env, expect, count))
            figures[label] = statistics.median(samples)
            print(f"  {label:<52} median {figures[label]:6.2f} s  (runs: "
                  f"{', '.join(f'{s:.2f}' for s in samples)})", flush=True)
        doctor_all = figures[f"doctor, {args.nodes} nodes"]
        forks5 = figures[f"ansible -m raw, {args.nodes} nodes, forks 5 (default)"]
        forks50 = figures[f"ansible -m raw, {args.nodes} nodes, forks 50"]
        print(f"doctor, {args.nodes} nodes: {doctor_all:.2f} s (target <= 1.5 s: "
              f"{'met' if doctor_all <= 1.5 else 'MISSED'})")
        print(f"doctor vs ansible forks 5:  {forks5 / doctor_all:.1f}x faster (target >= 5x: "
              f"{'met' if forks5 / doctor_all >= 5 else 'MISSED'})")
        floor = figures[f"bare paramiko fan-out, {args.nodes} nodes"]
        print(f"doctor's own cost above the bare fan-out: {doctor_all - floor:.2f} s (start-up, config, checks)")
        print(f"doctor vs ansible forks 50: {forks50 / doctor_all:.1f}x faster (target > 1x: "
              f"{'met' if forks50 > doctor_all else 'MISSED'})")
    finally:
        farm.close()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
