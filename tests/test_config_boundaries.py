"""The config contract at its edges: every numeric and length boundary on both sides, every default, the user's extra
labels, home-directory expansion checked exactly, and the parts of an error message (where, field, hint)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.core import catalogue as images
from gpu_bootstrap.core.errors import ConfigError

pytestmark = pytest.mark.unit

NODES = [{"name": "a"}]


def validate(**sections) -> cfg.Config:
    return cfg.validate({"nodes": NODES, **sections}, cfg.Source(None, {}))


def refusal(document, source: cfg.Source | None = None) -> str:
    with pytest.raises(ConfigError) as refused:
        cfg.validate(document, source or cfg.Source(None, {}))
    return refused.value.message


def nested(path: str, value) -> dict:
    """'ssh.port' -> {'nodes': NODES, 'ssh': {'port': value}}; 'nodes.port' sets it on the one node."""
    parts = path.split(".")
    if parts[0] == "nodes":
        return {"nodes": [{"name": "a", parts[1]: value}]}
    document: dict = {"nodes": NODES}
    current = document
    for part in parts[:-1]:
        current = current.setdefault(part, {})
    current[parts[-1]] = value
    return document


def read_back(config: cfg.Config, path: str):
    """The value the validated config holds at 'ssh.port' / 'nodes.port' (the one node) / 'validate.timeout'."""
    current = config.nodes[0] if path.startswith("nodes.") else config
    for part in path.split(".")[1 if path.startswith("nodes.") else 0:]:
        current = getattr(current, "validation" if part == "validate" else part)
    return current


# field, the lowest and highest accepted values (one below / above is refused)
BOUNDS = [
    ("ssh.port", 1, 65535), ("nodes.port", 1, 65535), ("ssh.parallelism", 1, 512),
    ("gpu_operator.sharing.replicas", 2, 256), ("gpu_operator.wait_timeout", 10, 7200),
    ("monitoring.wait_timeout", 10, 7200), ("scheduler.fit_weight", 1, 100),
    ("scheduler.balanced_allocation_weight", 0, 100), ("scheduler.percentage_of_nodes_to_score", 0, 100),
    ("scheduler.replicas", 1, 10), ("scheduler.wait_timeout", 10, 3600), ("admission.opa.replicas", 1, 10),
    ("admission.rotate_before_days", 1, 3650), ("admission.wait_timeout", 10, 3600), ("validate.timeout", 10, 3600),
]


@pytest.mark.parametrize("path, low, high", BOUNDS, ids=[b[0] for b in BOUNDS])
def test_numeric_bounds_accept_the_edges_and_refuse_one_beyond(path, low, high):
    for accepted in (low, high):
        assert read_back(cfg.validate(nested(path, accepted), cfg.Source(None, {})), path) == accepted
    for refused in (low - 1, high + 1):
        message = refusal(nested(path, refused))
        assert message.startswith(f"<config>: {path.replace('nodes.', 'nodes[0].')}: "), message


@pytest.mark.parametrize("path, high", [("ssh.connect_timeout", 300), ("ssh.command_timeout", 3600)])
def test_timeouts_are_above_zero_and_at_most_their_limit(path, high):
    for accepted in (0.001, high):
        cfg.validate(nested(path, accepted), cfg.Source(None, {}))
    for refused in (0, high + 0.001):
        assert path in refusal(nested(path, refused))


@pytest.mark.parametrize("points, accepted", [
    ([{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}], True),
    ([{"utilization": -1, "score": 0}], False), ([{"utilization": 101, "score": 0}], False),
    ([{"utilization": 0, "score": -1}], False), ([{"utilization": 0, "score": 11}], False),
    ([{"utilization": 50, "score": 5}], True), ([], False),
    ([{"utilization": 10, "score": 1}, {"utilization": 9, "score": 2}], False),
    ([{"utilization": 10, "score": 1}, {"utilization": 10, "score": 2}], False),
])
def test_the_scoring_shape(points, accepted):
    document = nested("scheduler.shape", points)
    if accepted:
        assert [p.utilization for p in cfg.validate(document, cfg.Source(None, {})).scheduler.shape] == \
            [p["utilization"] for p in points]
    else:
        assert "scheduler.shape" in refusal(document)


@pytest.mark.parametrize("weights, accepted", [
    ({"nvidia.com/gpu": 1}, True), ({"nvidia.com/gpu": 100}, True), ({"nvidia.com/gpu": 0}, False),
    ({"nvidia.com/gpu": 101}, False), ({"cpu": 1, "memory": 1}, True), ({"bad name!": 1}, False), ({}, False),
])
def test_resource_weights(weights, accepted):
    document = nested("scheduler.resource_weights", weights)
    if accepted:
        assert cfg.validate(document, cfg.Source(None, {})).scheduler.resource_weights == weights
    else:
        assert "scheduler.resource_weights" in refusal(document)


@pytest.mark.parametrize("profiles, accepted", [
    ({"big": 2}, True), ({"big": 256}, True), ({"big": 1}, False), ({"big": 257}, False), ({"-bad": 4}, False),
])
def test_time_slicing_profiles(profiles, accepted):
    document = nested("gpu_operator.sharing.profiles", profiles)
    if accepted:
        assert cfg.validate(document, cfg.Source(None, {})).gpu_operator.sharing.profiles == profiles
    else:
        assert "gpu_operator.sharing.profiles" in refusal(document)


LABEL_63 = "a" * 63
# field, longest accepted value, shortest refused value of the same form
LENGTHS = [
    ("node_prep.taint.key", "k" * 63, "k" * 64),
    ("node_prep.taint.key", "p" * 253 + "/k", "p" * 254 + "/k"),
    ("node_prep.taint.value", "v" * 63, "v" * 64),
    ("gpu_operator.release", "r" * 53, "r" * 54),
    ("monitoring.namespace", "n" * 53, "n" * 54),
    ("scheduler.name", "s" * 63, "s" * 64),
    ("scheduler.lease_name", "l" * 63, "l" * 64),
    ("scheduler.namespace", "n" * 53, "n" * 54),
    ("admission.opa.namespace", "n" * 53, "n" * 54),
    ("admission.exempt_namespaces", ["n" * 63], ["n" * 64]),
    ("monitoring.storage.storage_class", "c" * 253, "c" * 254),
    ("monitoring.prometheus", "ns/" + "p" * 253, "ns/" + "p" * 254),
    ("admission.opa.image", "o" * 255, "o" * 256),
    ("gpu_operator.sharing.mig_config", "m" * 63, "m" * 64),
]


@pytest.mark.parametrize("path, longest, too_long", LENGTHS, ids=[f"{p}-{len(str(a))}" for p, a, _ in LENGTHS])
def test_lengths_accept_the_longest_and_refuse_one_more(path, longest, too_long):
    assert read_back(cfg.validate(nested(path, longest), cfg.Source(None, {})), path) == longest
    assert path in refusal(nested(path, too_long))


@pytest.mark.parametrize("key, value, accepted", [
    (LABEL_63, "x", True), ("a" * 64, "x", False), ("x", LABEL_63, True), ("x", "a" * 64, False),
    ("example.com/" + LABEL_63, "", True), ("Example.com/x", "x", False), ("/x", "x", False), ("x", "-x", False),
])
def test_extra_label_keys_and_values(key, value, accepted):
    document = nested("node_prep.labels", {key: value})
    if accepted:
        assert cfg.validate(document, cfg.Source(None, {})).node_prep.labels == {key: value}
    else:
        assert "node_prep.labels" in refusal(document)


@pytest.mark.parametrize("name, accepted", [("n" * 253, True), ("n" * 254, False), ("a.b-c", True), ("A", False)])
def test_node_name_length_and_form(name, accepted):
    document = {"nodes": [{"name": name}]}
    if accepted:
        assert cfg.validate(document, cfg.Source(None, {})).nodes[0].name == name
    else:
        assert "nodes[0].name" in refusal(document)


@pytest.mark.parametrize("address, accepted", [
    ("10.0.0.1", True), ("fe80::1", True), ("Node-1.example.com", True), ("h" * 253, True), ("h" * 254, False),
    ("-bad", False),
])
def test_node_addresses(address, accepted):
    document = {"nodes": [{"name": "a", "address": address}]}
    if accepted:
        assert cfg.validate(document, cfg.Source(None, {})).nodes[0].ssh_address == address
    else:
        assert "nodes[0].address" in refusal(document)


@pytest.mark.parametrize("path, value, accepted", [
    ("gpu_operator.version", "v26.7.0", True), ("gpu_operator.version", "25.3", True),
    ("gpu_operator.version", "latest", False), ("monitoring.version", "88.5.3-rc.1", True),
    ("monitoring.retention", "2w", True), ("monitoring.retention", "15", False),
    ("monitoring.scrape_interval", "1m30s", True), ("monitoring.scrape_interval", "fast", False),
    ("monitoring.storage.size", "50Gi", True), ("monitoring.storage.size", "1.5T", True),
    ("monitoring.storage.size", "lots", False), ("monitoring.storage.storage_class", "Bad_Class", False),
    ("monitoring.prometheus", "monitoring/k8s", True), ("monitoring.prometheus", "k8s", False),
    ("monitoring.prometheus", "Mon/k8s", False),
    ("scheduler.image_tag", "v1.31.0-custom", True), ("scheduler.image_tag", "-bad", False),
    ("scheduler.name", "default-scheduler", False), ("scheduler.lease_name", "default-scheduler", False),
    ("admission.opa.image", "mirror.example.com/opa:1.4.2", True), ("admission.opa.image", "Bad Image", False),
    ("admission.exempt_namespaces", ["team-a"], True), ("admission.exempt_namespaces", ["Team"], False),
    ("gpu_operator.sharing.node_profiles", {"a": "big"}, True),
    ("gpu_operator.sharing.node_profiles", {"A!": "big"}, False),
    ("gpu_operator.sharing.mig_node_configs", {"a": "-x"}, False),
    ("ssh.user", "ubuntu", True), ("ssh.user", "Root", False), ("nodes.user", "ec2-user", True),
    ("nodes.user", "bad user", False),
])
def test_formats(path, value, accepted):
    document = nested(path, value)
    if accepted:
        assert read_back(cfg.validate(document, cfg.Source(None, {})), path) == value
    else:
        assert path.replace("nodes.", "nodes[0].") in refusal(document)


def test_every_default():
    config = validate()
    assert config.model_dump(mode="json", by_alias=True, exclude={"ssh": {"identity_file", "known_hosts"}}) == {
        "cluster": {"kubeconfig": None, "context": None, "adopt_namespaces": []},
        "ssh": {"user": "root", "port": 22, "host_key_policy": "strict", "connect_timeout": 10.0,
                "command_timeout": 60.0, "parallelism": 32},
        "nodes": [{"name": "a", "address": None, "port": None, "user": None, "identity_file": None}],
        "node_prep": {"enabled": True, "taint": {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                      "gpu_present_label": True, "labels": {}},
        "gpu_operator": {"enabled": True, "chart": "gpu-operator", "repository": "https://helm.ngc.nvidia.com/nvidia",
                         "version": None, "release": "gpu-operator", "namespace": "gpu-operator", "values": {},
                         "allocation": "device-plugin",
                         "dra_driver": {"chart": "dra-driver-nvidia-gpu",
                                        "repository": "oci://registry.k8s.io/dra-driver-nvidia/charts",
                                        "version": None, "release": "dra-driver-nvidia-gpu",
                                        "namespace": "dra-driver-nvidia-gpu", "values": {}},
                         "driver_management": "auto", "runtime_integration": "auto",
                         "sharing": {"mode": "none", "replicas": 4, "rename_by_default": False,
                                     "fail_requests_greater_than_one": False, "profiles": {}, "node_profiles": {},
                                     "mig_strategy": "single", "mig_config": "all-1g.10gb", "mig_node_configs": {}},
                         "wait_timeout": 900, "skip_version_check": False, "adopt": False,
                         "driver_upgrade": {"auto": True, "max_parallel": 1, "max_unavailable": "25%",
                                            "gpu_pod_deletion_timeout": 300, "force_gpu_pod_deletion": False,
                                            "delete_empty_dir": False, "wait_for_jobs_timeout": 0,
                                            "wait_for_jobs_selector": "", "drain": False, "drain_timeout": 300},
                         "allow_downgrade": False},
        "scheduler": {"enabled": True, "name": "gpu-binpack-scheduler", "namespace": "kube-system",
                      "strategy": "RequestedToCapacityRatio", "resource_weights": {"nvidia.com/gpu": 100},
                      "shape": [{"utilization": 0, "score": 0}, {"utilization": 50, "score": 1},
                                {"utilization": 100, "score": 10}],
                      "fit_weight": 3, "balanced_allocation_weight": 1,
                      "balanced_allocation_resources": ["cpu", "memory", "nvidia.com/gpu"],
                      "percentage_of_nodes_to_score": None,
                      "replicas": 2, "image": "registry.k8s.io/kube-scheduler", "image_tag": None,
                      "lease_name": None, "wait_timeout": 300},
        "admission": {"enabled": True, "engine": "opa", "mode": "mutate", "exempt_namespaces": [],
                      "override_other_schedulers": False, "device_access": True,
                      "opa": {"image": images.default("opa"), "replicas": 2,
                              "namespace": "gpu-bootstrap-admission"},
                      "certificates": "generated", "rotate_before_days": 30, "wait_timeout": 300},
        "monitoring": {"enabled": True, "mode": "auto", "chart": "kube-prometheus-stack",
                       "repository": "https://prometheus-community.github.io/helm-charts", "version": None,
                       "release": "kube-prometheus-stack", "namespace": "monitoring", "values": {},
                       "retention": "15d", "storage": None, "grafana": {"enabled": True}, "prometheus": None,
                       "scrape_interval": "15s", "wait_timeout": 600, "skip_version_check": False,
                       "alerts": {"gpu_pod_pending_for": "15m"}, "workload_gpu_rules": True, "allow_downgrade": False},
        "validate": {"enabled": True, "image": images.default("cuda-sample"), "nodes": "all",
                     "namespace": "gpu-bootstrap", "timeout": 300},
        "preflight": {"via": "auto", "image": images.default("busybox"), "timeout": 120, "max_facts_age": "7d"},
        "pools": [], "registry": {"mirror": None, "pull_secret": None, "plain_http": False},
    }
    home = Path(os.path.expanduser("~"))
    assert (config.ssh.identity_file, config.ssh.known_hosts) == (home / ".ssh/id_ed25519", home / ".ssh/known_hosts")
    assert config.scheduler.lease == "gpu-binpack-scheduler"
    assert validate(scheduler={"lease_name": "mine"}).scheduler.lease == "mine"


def test_paths_expand_to_exactly_the_home_directory():
    home = Path(os.path.expanduser("~"))
    config = validate(cluster={"kubeconfig": "~/kc"}, ssh={"identity_file": "~/id", "known_hosts": "/abs/kh"})
    assert config.cluster.kubeconfig == home / "kc"
    assert (config.ssh.identity_file, config.ssh.known_hosts) == (home / "id", Path("/abs/kh"))
    node = cfg.validate({"nodes": [{"name": "a", "identity_file": "~/n"}]}, cfg.Source(None, {})).nodes[0]
    assert node.identity_file == home / "n"
    assert validate(ssh={"identity_file": None}).ssh.identity_file is None


def test_the_users_extra_labels_join_the_gpu_label():
    assert validate(node_prep={"labels": {"team": "ml"}}).node_prep.wanted_labels() == {
        "nvidia.com/gpu.present": "true", "team": "ml"}
    assert validate(node_prep={"labels": {"team": "ml"}, "gpu_present_label": False}).node_prep.wanted_labels() == {
        "team": "ml"}


@pytest.mark.parametrize("taint, text, as_taint", [
    ({}, "nvidia.com/gpu=present:NoSchedule", {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}),
    ({"key": "gpu", "value": "", "effect": "NoExecute"}, "gpu:NoExecute", {"key": "gpu", "effect": "NoExecute"}),
])
def test_a_taint_as_text_and_as_kubernetes_writes_it(taint, text, as_taint):
    section = validate(node_prep={"taint": taint}).node_prep.taint
    assert (str(section), section.as_taint()) == (text, as_taint)


@pytest.mark.parametrize("document", [[1, 2], "nodes", 3])
def test_a_config_that_is_not_a_mapping_is_refused_as_a_whole(document):
    assert refusal(document, cfg.Source(Path("c.yaml"), {(): 1})) == \
        "c.yaml:1: the config must be a mapping of sections (cluster, ssh, nodes, ...)"


def test_an_empty_document_is_an_empty_mapping():
    assert "nodes: required key is missing" in refusal(None)


def test_an_unknown_key_names_the_likely_one_and_lists_the_keys_allowed_there():
    assert refusal({"nodes": NODES, "ssh": {"usr": "x"}}) == (
        "<config>: ssh.usr: unknown key: did you mean user? (allowed here: command_timeout, connect_timeout, "
        "host_key_policy, identity_file, known_hosts, parallelism, port, user)")
    assert refusal({"nodes": [{"name": "a", "nam": "b"}]}) == (
        "<config>: nodes[0].nam: unknown key: did you mean name? (allowed here: address, identity_file, name, port, "
        "user)")
    assert refusal({"nodes": NODES, "admission": {"opa": {"x": 1}}}) == (
        "<config>: admission.opa.x: unknown key (allowed here: image, namespace, replicas)")  # nothing close
    assert refusal({"nodes": NODES, "nope": 1}).startswith("<config>: nope: unknown key (allowed here: admission, ")
    # found by a new user: the section's name without its underscore
    assert refusal({"nodes": NODES, "nodeprep": {}}).startswith(
        "<config>: nodeprep: unknown key: did you mean node_prep? (allowed here: admission, ")


def test_each_problem_is_one_line_naming_where_it_came_from(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("nodes:\n  - name: a\nssh:\n  port: 70000\n  user: Bad\n")
    with pytest.raises(ConfigError) as refused:
        cfg.load(path, environ={"GPU_BOOTSTRAP_SSH_HOST_KEY_POLICY": "yolo"},
                 overrides={("cluster", "context"): 5})
    lines = refused.value.message.splitlines()
    assert len(lines) == 4
    assert f"{path}:4: ssh.port: must be less than or equal to 65535" in lines
    assert f"{path}:5: ssh.user: 'Bad' is not a valid user name" in lines
    assert "environment variable GPU_BOOTSTRAP_SSH_HOST_KEY_POLICY: ssh.host_key_policy: must be 'strict' or " \
           "'accept-new'" in lines
    assert "flag --context: cluster.context: must be a valid string (got int)" in lines
    assert refused.value.hint == "fix the config file and run again (nothing was changed)"


def test_flags_fill_a_section_written_empty(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("cluster:\nnodes:\n  - name: a\n")
    assert cfg.load(path, environ={}, overrides={("cluster", "context"): "ctx", ("ssh", "user"): None}) \
        .cluster.context == "ctx"


def test_the_environment_is_ignored_for_a_section_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("ssh: [1]\nnodes:\n  - name: a\n")
    with pytest.raises(ConfigError) as refused:
        cfg.load(path, environ={"GPU_BOOTSTRAP_SSH_USER": "x"})
    assert f"{path}:1: ssh:" in refused.value.message


def test_a_node_listed_twice_is_named_at_its_second_entry():
    assert refusal({"nodes": [{"name": "a"}, {"name": "b"}, {"name": "a"}]}) == \
        "<config>: nodes[2].name: node 'a' is listed twice"


@pytest.mark.parametrize("loc, text", [(("nodes", 0, "name"), "nodes[0].name"), ((), ""), (("ssh",), "ssh"),
                                       (("a", "b", 2), "a.b[2]")])
def test_describe_loc(loc, text):
    assert cfg.describe_loc(loc) == text


def test_a_location_falls_back_to_its_nearest_known_parent():
    source = cfg.Source(Path("f.yaml"), {("ssh",): 3, ("ssh", "port"): "--port", ("cluster",): "GPU_X"})
    assert source.locate(("ssh", "user")) == "f.yaml:3"
    assert source.locate(["ssh", "user"]) == "f.yaml:3"  # any sequence: pydantic's loc, or a list
    assert source.locate(("ssh", "port")) == "flag --port"
    assert source.locate(("cluster", "context")) == "environment variable GPU_X"
    assert source.locate(("other",)) == "f.yaml"
    assert cfg.Source(None, {}).locate(("x",)) == "<config>"


def test_load_sections_reads_only_the_scheduler_and_cluster(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("scheduler: {fit_weight: 7}\nother_section: ignored\n")
    scheduler, cluster = cfg.load_sections(path, environ={"GPU_BOOTSTRAP_CONTEXT": "env-ctx"})
    assert (scheduler.fit_weight, cluster.context) == (7, "env-ctx")
    with pytest.raises(ConfigError, match="not found"):
        cfg.load_sections(tmp_path / "missing.yaml", environ={})


def test_a_config_path_that_is_a_directory_or_not_utf8(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        cfg.load(tmp_path, environ={})
    path = tmp_path / "c.yaml"
    path.write_bytes(b"nodes:\n  - name: \xff\n")
    with pytest.raises(ConfigError) as refused:
        cfg.load(path, environ={})
    assert refused.value.message == f"{path}:2: the config file is not UTF-8 text (byte 0xff at offset 17)"


# field, how many characters of a long bad value the message quotes (so a pasted blob cannot flood the terminal)
QUOTED = [("nodes.name", 60), ("nodes.address", 60), ("node_prep.taint.key", 80), ("node_prep.taint.value", 80),
          ("ssh.user", 40), ("monitoring.storage.size", 40), ("monitoring.storage.storage_class", 60),
          ("monitoring.retention", 40), ("monitoring.scrape_interval", 40), ("monitoring.prometheus", 80),
          ("admission.opa.image", 80)]


@pytest.mark.parametrize("path, kept", QUOTED, ids=[q[0] for q in QUOTED])
def test_a_long_bad_value_is_quoted_cut_short(path, kept):
    value = "X" * 300
    document = {"nodes": [{"name": value}]} if path == "nodes.name" else nested(path, value)
    message = refusal(document)
    assert f"'{'X' * kept}' " in message and "X" * (kept + 1) not in message


def test_sections_cannot_be_changed_after_loading():
    config = validate()
    with pytest.raises(ValueError):
        config.ssh.port = 2222
    with pytest.raises(ValueError):
        config.scheduler.replicas = 5


def test_the_whole_config_is_frozen_and_its_validate_section_has_a_python_name():
    config = cfg.Config(nodes=[{"name": "a"}], validation={"timeout": 20})
    assert config.validation.timeout == 20
    with pytest.raises(ValueError):
        config.nodes = []


def test_a_node_is_found_by_its_name():
    config = cfg.validate({"nodes": [{"name": "a"}, {"name": "b", "port": 2222}]}, cfg.Source(None, {}))
    assert (config.node("b").name, config.node("b").port, config.node("a").port) == ("b", 2222, None)


def test_a_yaml_syntax_error_is_one_line_with_the_problem_only():
    with pytest.raises(ConfigError) as refused:
        cfg.parse_yaml("nodes: [a\n", Path("c.yaml"))
    assert refused.value.message == "c.yaml:2: YAML syntax error: expected ',' or ']', but got '<stream end>'"


def test_a_value_on_the_lines_below_its_key_is_located_at_the_key():
    with pytest.raises(ConfigError) as refused:
        cfg.validate(*cfg.parse_yaml("nodes:\n  - name: a\nssh:\n  port:\n    - 1\n", Path("c.yaml")))
    assert refused.value.message == "c.yaml:4: ssh.port: must be a valid integer (got list)"


def test_aliases_that_share_nodes_are_walked_once_each():
    # 40 levels, each naming the one below twice: 2**40 paths, but only 40 distinct nodes to look at
    levels = ["a0: &a0 [x]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 40)]
    data, source = cfg.parse_yaml("\n".join(levels) + "\nnodes: [{name: n}]\n", Path("c.yaml"))
    assert source.locate(("a39",)) == "c.yaml:40" and len(data) == 41


def test_load_takes_a_string_path_and_defaults_to_the_file_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as refused:
        cfg.load(None, environ={})
    assert refused.value.message == "config file gpu-bootstrap.yaml not found"
    (tmp_path / "gpu-bootstrap.yaml").write_text("nodes: [{name: here}]\n")
    assert cfg.load(None, environ={}).nodes[0].name == "here"
    assert cfg.load(str(tmp_path / "gpu-bootstrap.yaml"), environ={}).nodes[0].name == "here"


def test_load_sections_without_a_file_gives_the_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scheduler, cluster = cfg.load_sections(None, environ={})
    assert (scheduler.name, cluster.context) == ("gpu-binpack-scheduler", None)
    (tmp_path / "s.yaml").write_text("scheduler: {replicas: 3}\n")
    assert cfg.load_sections(str(tmp_path / "s.yaml"), environ={})[0].replicas == 3


def test_a_non_utf8_byte_after_a_leading_newline_is_on_line_two(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"\nnodes: \xff\n")
    with pytest.raises(ConfigError) as refused:
        cfg.load(path, environ={})
    assert refused.value.message.startswith(f"{path}:2: the config file is not UTF-8 text (byte 0xff at offset 8)")
