"""Node preflight against real OpenSSH sshd nodes (one chrooted sshd per node, tests/nodes/farm.py)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.adapters.ssh import Ssh
from gpu_bootstrap.cli.commands import app
from tests.nodes import scenarios
from tests.nodes.farm import NodeFarm
from tests.tools import tool_env

pytestmark = pytest.mark.tools
ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture(scope="module")
def farm():
    farm = NodeFarm()
    for name, scenario in scenarios.SCENARIOS.items():
        farm.add(name, scenario)
    yield farm
    farm.close()


@pytest.fixture
def private_farm():
    farm = NodeFarm()
    yield farm
    farm.close()


def doctor(farm: NodeFarm, tmp_path: Path, *args: str, names=None, **config):
    known_hosts = config.pop("known_hosts", None) or farm.known_hosts(tmp_path / "known_hosts", names)
    path = farm.config_yaml(tmp_path / "gpu-bootstrap.yaml", known_hosts, names, **config)
    result = runner.invoke(app, ["doctor", "-c", str(path), "--no-cluster", "-o", "json", *args,
                                 "--log-file", str(tmp_path / "log")])
    return result, (json.loads(result.stdout) if result.stdout.startswith("{") else None)


@pytest.fixture(scope="module")
def report(farm, tmp_path_factory):
    result, document = doctor(farm, tmp_path_factory.mktemp("doctor"))
    assert document is not None, result.output
    return {node["name"]: {c["id"]: c for c in node["checks"]} for node in document["nodes"]}


H100_GPU = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "compute_capability": "9.0"}
EXPECTED = {
    # scenario: {check: status}, plus data fields to compare
    "healthy-h100": ({"ssh": "pass", "nvidia-driver": "pass", "nouveau": "pass", "container-runtime": "pass",
                      "nvidia-container-toolkit": "pass"},
                     {"nvidia-driver": {"driver_version": "550.54.15", "cuda_version": "12.4", "gpu_count": 8},
                      "container-runtime": {"runtime": "containerd", "version": "1.7.27",
                                            "config_path": "/etc/containerd/config.toml",
                                            "socket": "/run/containerd/containerd.sock"},
                      "nvidia-container-toolkit": {"installed": True, "version": "1.17.4", "runtime_configured": True,
                                                   "default_runtime": True}}),
    # 2,600 processes and 110 shims: the kubelet's and containerd's processes (the runtime endpoint, the config
    # containerd names) are still found, and the named config is read
    "busy-h100": ({"ssh": "pass", "nvidia-driver": "pass", "container-runtime": "pass",
                   "nvidia-container-toolkit": "pass"},
                  {"nvidia-driver": {"gpu_count": 8},
                   "container-runtime": {"runtime": "containerd", "socket": "/run/containerd/gpu-node.sock",
                                         "config_path": "/etc/containerd/gpu-node.toml"},
                   "nvidia-container-toolkit": {"runtime_configured": True, "default_runtime": True}}),
    "driver-missing": ({"nvidia-driver": "warn", "nvidia-container-toolkit": "warn"},
                       {"nvidia-driver": {"driver_version": None, "gpu_count": 0},
                        "nvidia-container-toolkit": {"installed": False, "runtime_configured": False}}),
    "driver-without-smi": ({"nvidia-driver": "warn"},
                           {"nvidia-driver": {"driver_version": "550.54.15", "source": "proc", "gpu_count": 0}}),
    "smi-without-driver": ({"nvidia-driver": "fail"}, {"nvidia-driver": {"driver_version": None}}),
    "nouveau": ({"nouveau": "fail", "nvidia-driver": "warn"}, {"nouveau": {"loaded": True}}),
    "k3s": ({"container-runtime": "pass", "nvidia-container-toolkit": "warn"},
            {"container-runtime": {"runtime": "containerd", "version": "1.7.23-k3s2", "distribution": "k3s",
                                   "config_path": "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
                                   "socket": "/run/k3s/containerd/containerd.sock"},
             "nvidia-container-toolkit": {"runtime_configured": True, "default_runtime": False}}),
    "rke2": ({"container-runtime": "pass", "nvidia-container-toolkit": "warn"},
             {"container-runtime": {"distribution": "rke2", "version": "1.7.23-k3s2",
                                    "config_path": "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
                                    "socket": "/run/k3s/containerd/containerd.sock"},
              "ssh": {"os_id": "rhel", "os_version": "9.4"}}),
    "microk8s": ({"nvidia-container-toolkit": "pass"},
                 {"container-runtime": {"distribution": "microk8s", "version": "1.6.28",
                                        "config_path": "/var/snap/microk8s/current/args/containerd-template.toml",
                                        "socket": "/var/snap/microk8s/common/run/containerd.sock"},
                  "nvidia-driver": {"gpu_count": 1}}),
    "crio": ({"container-runtime": "pass", "nvidia-container-toolkit": "pass"},
             {"container-runtime": {"runtime": "cri-o", "version": "1.30.4", "config_path": "/etc/crio/crio.conf",
                                    "socket": "/var/run/crio/crio.sock"},
              "nvidia-container-toolkit": {"default_runtime": True}}),
    "docker-nvidia-default": ({"container-runtime": "pass", "nvidia-container-toolkit": "pass"},
                              {"container-runtime": {"runtime": "docker", "version": "24.0.7",
                                                     "config_path": "/etc/docker/daemon.json",
                                                     "socket": "/var/run/cri-dockerd.sock"},
                               "nvidia-container-toolkit": {"default_runtime": True}}),
    "toolkit-not-configured": ({"nvidia-container-toolkit": "warn"},
                               {"nvidia-container-toolkit": {"installed": True, "runtime_configured": False,
                                                             "default_runtime": False}}),
    "t4": ({"nvidia-driver": "pass"}, {"nvidia-driver": {"driver_version": "535.183.01", "cuda_version": "12.2",
                                                         "gpu_count": 1, "first_gpu": {
                                                             "index": 0, "name": "Tesla T4", "memory_mib": 15360,
                                                             "compute_capability": "7.5"}}}),
    "a100x4": ({"nvidia-driver": "pass", "nvidia-container-toolkit": "pass"},
               {"nvidia-driver": {"gpu_count": 4, "first_gpu": {"index": 0, "name": "NVIDIA A100-SXM4-40GB",
                                                                "memory_mib": 40960, "compute_capability": "8.0"}},
                "container-runtime": {"version": "2.0.4"}}),
    # managed-node layouts: the driver in GKE COS's and Bottlerocket's own folders
    "gke-cos": ({"nvidia-driver": "pass", "nvidia-container-toolkit": "warn"},
                {"nvidia-driver": {"driver_version": "550.54.15", "gpu_count": 1, "source": "nvidia-smi"},
                 "ssh": {"os_id": "cos", "os_version": "117"},
                 "container-runtime": {"runtime": "containerd", "version": "1.7.24"}}),
    # no toolkit config at the known paths: whether it honours NVIDIA_VISIBLE_DEVICES is unknown, and unknown warns
    "bottlerocket": ({"nvidia-driver": "pass", "nvidia-container-toolkit": "warn"},
                     {"nvidia-driver": {"driver_version": "535.183.01", "gpu_count": 4, "source": "nvidia-smi"},
                      "ssh": {"os_id": "bottlerocket"},
                      "nvidia-container-toolkit": {"installed": True, "runtime_configured": True,
                                                   "default_runtime": True}}),
    "al2023-nvidia": ({"nvidia-driver": "pass", "nvidia-container-toolkit": "pass"},
                      {"ssh": {"os_id": "amzn", "os_version": "2023"}}),
    "toolkit-honours-envvar": ({"nvidia-container-toolkit": "warn"},
                               {"nvidia-container-toolkit": {"envvar_when_unprivileged": {
                                   "file": "/etc/nvidia-container-runtime/config.toml",
                                   "key": "accept-nvidia-visible-devices-envvar-when-unprivileged",
                                   "honoured": True}}}),
}


def test_a_toolkit_that_honours_the_variable_is_warned_about_naming_the_file_and_key(report):
    """The host's toolkit hands an unprivileged container the GPUs NVIDIA_VISIBLE_DEVICES names (its package's
    default): doctor says so, naming the file and the key; the same toolkit set to false passes."""
    message = report["toolkit-honours-envvar"]["nvidia-container-toolkit"]["message"]
    assert "/etc/nvidia-container-runtime/config.toml has accept-nvidia-visible-devices-envvar-when-unprivileged = " \
           "true" in message, message
    assert report["healthy-h100"]["nvidia-container-toolkit"]["data"]["envvar_when_unprivileged"]["honoured"] is False


@pytest.mark.parametrize("scenario", list(EXPECTED))
def test_scenario_checks_and_json_contract(report, scenario):
    statuses, data = EXPECTED[scenario]
    checks = report[scenario]
    assert list(checks) == ["ssh", "nvidia-driver", "nouveau", "container-runtime", "nvidia-container-toolkit"]
    for check_id, status in statuses.items():
        assert checks[check_id]["status"] == status, (check_id, checks[check_id]["message"])
    for check in checks.values():
        assert set(check) == {"id", "status", "message", "data"} and check["message"]
    driver = checks["nvidia-driver"]["data"]
    assert {"driver_version", "cuda_version", "gpus"} <= set(driver)
    assert {"runtime", "version", "config_path", "socket"} <= set(checks["container-runtime"]["data"])
    assert {"installed", "version", "runtime_configured", "default_runtime"} <= set(
        checks["nvidia-container-toolkit"]["data"])
    for check_id, fields in data.items():
        actual = dict(checks[check_id]["data"])
        actual["gpu_count"] = len(actual.get("gpus") or [])
        if actual.get("gpus"):
            actual["first_gpu"] = {k: v for k, v in actual["gpus"][0].items() if k != "uuid"}
        for key, value in fields.items():
            assert actual[key] == value, (scenario, check_id, key)
    for gpu in driver["gpus"]:
        assert set(gpu) == {"index", "name", "uuid", "memory_mib", "compute_capability"} and gpu["uuid"]


def test_healthy_gpus_carry_every_field(report):
    gpus = report["healthy-h100"]["nvidia-driver"]["data"]["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    assert {k: v for k, v in gpus[0].items() if k != "uuid"} == H100_GPU
    assert len({g["uuid"] for g in gpus}) == 8


def test_fail_messages_say_what_to_do(report):
    assert "blacklist" in report["nouveau"]["nouveau"]["message"]
    assert "modprobe nvidia" in report["smi-without-driver"]["nvidia-driver"]["message"]
    toolkit = report["toolkit-not-configured"]["nvidia-container-toolkit"]["message"]
    assert "nvidia-ctk runtime configure --runtime=containerd --config=/etc/containerd/config.toml" in toolkit
    assert "restart k3s" not in report["k3s"]["nvidia-container-toolkit"]["message"]


def test_exit_code_and_node_selection(farm, tmp_path):
    result, document = doctor(farm, tmp_path, "--nodes", "healthy-h100,crio")
    assert result.exit_code == 0 and [n["name"] for n in document["nodes"]] == ["healthy-h100", "crio"]
    assert document["ok"] is True
    failing, document = doctor(farm, tmp_path, "--nodes", "healthy-h100,nouveau")
    assert failing.exit_code == 1 and document["ok"] is False
    unknown = runner.invoke(app, ["doctor", "-c", str(tmp_path / "gpu-bootstrap.yaml"), "--no-cluster",
                                  "--nodes", "nope", "--log-file", str(tmp_path / "l")])
    assert unknown.exit_code == 2 and "--nodes: nope not in the config" in unknown.output


def test_text_output_is_a_node_table_with_the_problems_below(farm, tmp_path):
    known_hosts = farm.known_hosts(tmp_path / "kh", ["healthy-h100", "nouveau"])
    path = farm.config_yaml(tmp_path / "c.yaml", known_hosts, ["healthy-h100", "nouveau"])
    result = runner.invoke(app, ["doctor", "-c", str(path), "--no-cluster", "--log-file", str(tmp_path / "l")],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "GPU nodes" in result.output and "8×H100 80GB HBM3" in result.output
    assert "nouveau nouveau:" in result.output and "blacklist" in result.output


# --- host keys -------------------------------------------------------------------------------------------------------
def test_a_changed_host_key_runs_nothing_and_says_how_to_fix(private_farm, tmp_path):
    node = private_farm.add("node5", scenarios.healthy_h100)
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{node.port} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")
    result, document = doctor(private_farm, tmp_path, known_hosts=known_hosts)
    ssh = document["nodes"][0]["checks"][0]
    assert result.exit_code == 1 and ssh["status"] == "fail"
    assert "HOST KEY CHANGED" in ssh["message"] and str(known_hosts) in ssh["message"]
    assert f"ssh-keygen -R '[127.0.0.1]:{node.port}' -f {known_hosts}" in ssh["message"]
    assert all(c["status"] == "skip" for c in document["nodes"][0]["checks"][1:])
    assert node.sessions() == []


def test_strict_refuses_an_unknown_host_and_accept_new_records_it_once(private_farm, tmp_path):
    node = private_farm.add("node5", scenarios.healthy_h100)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    result, document = doctor(private_farm, tmp_path, known_hosts=known_hosts)
    message = document["nodes"][0]["checks"][0]["message"]
    assert result.exit_code == 1 and "is not in" in message and "accept-new" in message and node.sessions() == []
    accepted, _ = doctor(private_farm, tmp_path, known_hosts=known_hosts, policy="accept-new")
    assert accepted.exit_code == 0
    recorded = known_hosts.read_text()
    assert recorded == f"[127.0.0.1]:{node.port} {node.host_public_key}\n"
    strict_again, _ = doctor(private_farm, tmp_path, known_hosts=known_hosts)
    assert strict_again.exit_code == 0 and known_hosts.read_text() == recorded


def test_accept_new_never_accepts_a_changed_key(private_farm, tmp_path):
    node = private_farm.add("node5", scenarios.healthy_h100)
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known_hosts = tmp_path / "known_hosts"
    line = f"[127.0.0.1]:{node.port} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n"
    known_hosts.write_text(line)
    result, document = doctor(private_farm, tmp_path, known_hosts=known_hosts, policy="accept-new")
    assert result.exit_code == 1 and "HOST KEY CHANGED" in document["nodes"][0]["checks"][0]["message"]
    assert known_hosts.read_text() == line and node.sessions() == []


# --- failures stay per node, within the timeouts --------------------------------------------------------------------------
@pytest.mark.slow
def test_unreachable_refused_and_hung_nodes_fail_while_the_others_complete(private_farm, tmp_path):
    for name, scenario in (("healthy", scenarios.healthy_h100), ("stopped", scenarios.healthy_h100),
                           ("wrong-key", scenarios.healthy_h100), ("smi-hangs", scenarios.smi_hangs),
                           ("shell-hangs", scenarios.shell_hangs)):
        private_farm.add(name, scenario)
    private_farm.stop_node("stopped")
    wrong_key = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)], check=True)
    known_hosts = private_farm.known_hosts(tmp_path / "known_hosts")
    path = private_farm.config_yaml(tmp_path / "c.yaml", known_hosts, command_timeout=8, connect_timeout=3)
    text = path.read_text().replace("  - name: wrong-key\n", f"  - name: wrong-key\n    identity_file: {wrong_key}\n")
    path.write_text(text + "  - name: blackhole\n    address: 10.255.255.1\n")
    process = subprocess.run([sys.executable, "-m", "gpu_bootstrap", "doctor", "-c", str(path), "--no-cluster", "-o",
                              "json", "--log-file", str(tmp_path / "log")], capture_output=True, text=True,
                             cwd=ROOT, timeout=90, env=tool_env())
    assert process.returncode == 1, process.stderr
    nodes = {n["name"]: {c["id"]: c for c in n["checks"]} for n in json.loads(process.stdout)["nodes"]}
    assert all(c["status"] == "pass" for c in nodes["healthy"].values())
    assert "connection refused" in nodes["stopped"]["ssh"]["message"]
    assert "authentication refused" in nodes["wrong-key"]["ssh"]["message"]
    assert "did not answer within 2s" in nodes["smi-hangs"]["nvidia-driver"]["message"]
    assert nodes["smi-hangs"]["container-runtime"]["status"] == "pass"
    assert "did not finish within 8s" in nodes["shell-hangs"]["ssh"]["message"]
    assert nodes["blackhole"]["ssh"]["status"] == "fail"
    for name in ("stopped", "wrong-key", "shell-hangs", "blackhole"):
        assert nodes[name]["nvidia-driver"]["status"] == "skip"
    # unreachable, hung and healthy nodes alike: the document is a valid preflight report (`--preflight-report`)
    from gpu_bootstrap.probes.report import schema_problem
    assert schema_problem(json.loads(process.stdout)) is None


def test_doctors_json_is_a_preflight_report_its_schema_takes(farm, tmp_path):
    """Every scenario of the farm (healthy, no driver, nouveau, k3s, CRI-O, ...): `doctor -o json` validates against
    docs/preflight-report.schema.json, and `up --preflight-report` takes it."""
    from gpu_bootstrap.probes.report import schema_problem
    result, document = doctor(farm, tmp_path)
    assert document is not None and len(document["nodes"]) >= 5, result.output
    assert schema_problem(document) is None


# --- hostile values ------------------------------------------------------------------------------------------------------
def test_hostile_probe_output_is_data_never_executed(private_farm, tmp_path):
    node = private_farm.add("node5", scenarios.hostile_output)
    result, document = doctor(private_farm, tmp_path)
    gpus = document["nodes"][0]["checks"][1]["data"]["gpus"]
    assert [g["name"] for g in gpus] == [scenarios.HOSTILE_NAME] * 2
    assert not (node.root / "tmp" / "pwned").exists() and not (node.root / "tmp" / "pwned2").exists()
    assert not Path("/tmp/pwned").exists()
    text = runner.invoke(app, ["doctor", "-c", str(tmp_path / "gpu-bootstrap.yaml"), "--no-cluster",
                               "--log-file", str(tmp_path / "l")])
    assert not (node.root / "tmp" / "pwned").exists() and text.exit_code == 0


def test_the_remote_command_line_is_constant(private_farm, tmp_path):
    node = private_farm.add("node5", scenarios.healthy_h100)
    doctor(private_farm, tmp_path)
    assert node.sessions() == ["session -c sh -s"]


# --- non-root users, connection reuse, parallelism ---------------------------------------------------------------------
def test_a_non_root_user_goes_through_sudo_n(private_farm, tmp_path):
    node = private_farm.add("node5", scenarios.sudo_user)
    result, document = doctor(private_farm, tmp_path, user="nobody")
    assert result.exit_code == 0, result.output
    assert (node.root / "tmp" / "sudo.log").read_text() == "-n -- sh -s\n"
    assert document["nodes"][0]["checks"][1]["status"] == "pass"


def test_sudo_that_wants_a_password_falls_back_with_a_warning(private_farm, tmp_path):
    private_farm.add("node5", scenarios.sudo_refused)
    result, document = doctor(private_farm, tmp_path, user="nobody")
    assert document is not None, (result.exit_code, result.output, (tmp_path / "log").read_text()[-3000:]
                                  if (tmp_path / "log").exists() else "")
    ssh = document["nodes"][0]["checks"][0]
    assert ssh["status"] == "warn" and "passwordless sudo for nobody" in ssh["message"]
    assert document["nodes"][0]["checks"][1]["status"] == "pass"


def test_connections_are_reused_per_node(private_farm, tmp_path):
    node = private_farm.add("node5", scenarios.healthy_h100)
    config = cfg.load(private_farm.config_yaml(tmp_path / "c.yaml", private_farm.known_hosts(tmp_path / "kh")),
                      environ={})
    ssh = Ssh(config.ssh, config.nodes)
    target = ssh.targets["node5"]
    results = [ssh.run(target, ["sh", "-c", "echo $0", f"arg {n}; $(touch /tmp/x)"]).stdout for n in range(3)]
    ssh.close()
    assert results == [f"arg {n}; $(touch /tmp/x)\n" for n in range(3)]  # quoted: the argument arrives as is
    assert not (node.root / "tmp" / "x").exists()
    time.sleep(0.2)
    assert node.connections() == 1 and len(node.sessions()) == 3


def test_a_command_that_exits_without_reading_its_input_still_gives_its_result(private_farm, tmp_path):
    """As `sudo -n` does when it wants a password: it exits at once, and the script we send on stdin meets a closed
    channel (paramiko: 'Socket is closed'). The command's own exit status and output are the answer, not an error.
    4 MiB of input is more than the SSH window takes before the remote end must read, so the write always meets the
    closed channel."""
    private_farm.add("node5", scenarios.healthy_h100)
    config = cfg.load(private_farm.config_yaml(tmp_path / "c.yaml", private_farm.known_hosts(tmp_path / "kh")),
                      environ={})
    ssh = Ssh(config.ssh, config.nodes)
    try:
        result = ssh.run(ssh.targets["node5"], ["sh", "-c", "echo refused >&2; exit 3"], "#" * (4 * 2 ** 20))
    finally:
        ssh.close()
    assert (result.rc, result.stdout, result.stderr) == (3, "", "refused\n")


@pytest.mark.unit
def test_fan_out_is_bounded_by_parallelism():
    """Pure concurrency test of the fan-out (no SSH): never more than ssh.parallelism workers at once."""
    import threading
    config = cfg.validate({"ssh": {"parallelism": 3}, "nodes": [{"name": f"n{i}"} for i in range(12)]},
                          cfg.Source(None, {}))
    ssh = Ssh(config.ssh, config.nodes)
    lock, state = threading.Lock(), {"now": 0, "max": 0}

    def work(target):
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        time.sleep(0.05)
        with lock:
            state["now"] -= 1
        return target.name

    results = ssh.fan_out(work)
    assert sorted(results) == sorted(f"n{i}" for i in range(12)) and state["max"] == 3
