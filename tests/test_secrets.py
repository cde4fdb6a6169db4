"""Secrets never leave the cluster: plans print the paths of the user's values, not the values; a render dir
redacts Secret data and secret-looking values and is private (0700 folders, 0600 files); the log carries none.

The end-to-end test runs the CI example's own plan script (examples/ci/github-actions.yaml) with the real helm and
real charts, then a verbose run with a log file, and greps every output for three planted secrets."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpu_bootstrap.security import redact
from gpu_bootstrap.pipeline.render_dir import RenderDir, prepare
from gpu_bootstrap.core.refs import Ref, Verb
from gpu_bootstrap.pipeline.step import Change
from gpu_bootstrap.render import gpu_operator_values, monitoring
from tests.conftest import chart
from tests.tools import pinned_path, tool_env

ROOT = Path(__file__).resolve().parent.parent
PLANTED = ("PLANTED-NGC-KEY-7f3a", "PLANTED-GRAFANA-PW-91c2", "T00000000/B00000000/PLANTEDslack5d1e")


def planted_config(folder: Path) -> Path:
    config = folder / "gpu-bootstrap.yaml"
    config.write_text(yaml.safe_dump({
        "nodes": [{"name": "gpu-node-1"}, {"name": "gpu-node-2"}],
        "gpu_operator": {"chart": str(chart("gpu-operator-v26.7.0.tgz")),
                         "values": {"ngc": {"apiKey": PLANTED[0]}, "driver": {"enabled": False}}},
        "monitoring": {"mode": "install", "chart": str(chart("kube-prometheus-stack-88.5.3.tgz")), "values": {
            "grafana": {"adminPassword": PLANTED[1]},
            "alertmanager": {"config": {"route": {"receiver": "slack"}, "receivers": [
                {"name": "slack", "slack_configs": [{"api_url": f"https://hooks.slack.com/services/{PLANTED[2]}",
                                                     "channel": "#gpu"}]}]}}}},
    }))
    return config


def hits(text: str) -> list[str]:
    return [secret for secret in PLANTED if secret in text]


def files_with_secrets(folder: Path) -> dict[str, list[str]]:
    return {str(p.relative_to(folder)): found for p in folder.rglob("*") if p.is_file()
            if (found := hits(p.read_text(errors="replace")))}


def cli_shim(folder: Path) -> Path:
    """`gpu-bootstrap` on PATH as the CI example calls it: this checkout's CLI."""
    shim = folder / "bin" / "gpu-bootstrap"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m gpu_bootstrap \"$@\"\n")
    shim.chmod(0o755)
    return shim.parent


def ci_plan_script() -> str:
    workflow = yaml.safe_load((ROOT / "examples" / "ci" / "github-actions.yaml").read_text())
    return next(step["run"] for step in workflow["jobs"]["plan"]["steps"] if step.get("name", "").startswith("Plan"))


@pytest.mark.tools
@pytest.mark.usefixtures("helm_on_path")
def test_no_planted_secret_in_any_output_of_a_dry_run(tmp_path):
    """The CI example's plan step, then a -vv run with --log-file: stdout, stderr, the log files (the given one
    and the default one under $XDG_STATE_HOME), plan.json and every file of the render dirs hold 0 of 3 secrets."""
    work = tmp_path / "repo"
    work.mkdir()
    planted_config(work)
    env = tool_env(PATH=pinned_path(f"{cli_shim(tmp_path)}{os.pathsep}{os.environ['PATH']}"), NO_COLOR="1",
                   XDG_STATE_HOME=str(tmp_path / "state"))
    ci = subprocess.run(["bash", "-e", "-c", ci_plan_script()], cwd=work, env=env, capture_output=True, text=True,
                        timeout=300)
    assert ci.returncode == 0, ci.stderr
    verbose = subprocess.run([sys.executable, "-m", "gpu_bootstrap", "up", "--dry-run", "--offline", "--allow-incomplete", "-c",
                              str(work / "gpu-bootstrap.yaml"), "--render-dir", str(tmp_path / "verbose"), "-vv",
                              "--log-file", str(tmp_path / "run.log")], cwd=work, env=env, capture_output=True,
                             text=True, timeout=300)
    assert verbose.returncode == 0, verbose.stderr
    # the plans did render the secrets' homes: otherwise 0 hits would prove nothing
    assert "grafana.adminPassword  ← your monitoring.values (value not shown)" in verbose.stdout
    assert "ngc.apiKey  ← your gpu_operator.values (value not shown)" in verbose.stdout
    manifests = (work / "rendered" / "monitoring" / "manifests.yaml").read_text()
    assert "admin-password: <redacted>" in manifests and "alertmanager.yaml: <redacted>" in manifests
    values = yaml.safe_load((work / "rendered" / "monitoring" / "values.yaml").read_text())
    assert values["alertmanager"]["config"]["receivers"][0]["slack_configs"][0] == {
        "api_url": "https://hooks.slack.com/services/<redacted>", "channel": "#gpu"}
    outputs = {"ci stdout": ci.stdout, "ci stderr": ci.stderr, "stdout": verbose.stdout, "stderr": verbose.stderr,
               "log": (tmp_path / "run.log").read_text()}
    outputs.update({f"default log {p.name}": p.read_text() for p in (tmp_path / "state").rglob("*.log")})
    assert len(outputs) >= 6 and "helm template" in outputs["log"]
    assert {name: hits(text) for name, text in outputs.items() if hits(text)} == {}
    assert files_with_secrets(work) == {"gpu-bootstrap.yaml": list(PLANTED)}  # only where the user put them
    assert files_with_secrets(tmp_path / "verbose") == {}
    assert stat.S_IMODE((work / "plan.json").stat().st_mode) == 0o600  # the CI example's umask 077
    for root in (work / "rendered", tmp_path / "verbose"):
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        for path in root.rglob("*"):
            assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path


# --- host-free: the rules ------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_plans_show_the_paths_of_the_users_values_not_the_values():
    lines = [gpu_operator_values.user_value_line("grafana.adminPassword", "hunter2", "monitoring.values"),
             gpu_operator_values.user_value_line("a.list", ["x"], "monitoring.values"),
             gpu_operator_values.user_value_line("port", 3000, "monitoring.values"),
             gpu_operator_values.user_value_line("driver.enabled", True, "gpu_operator.values")]
    assert lines == ["grafana.adminPassword  ← your monitoring.values (value not shown)",
                     "a.list  ← your monitoring.values (value not shown)",
                     "port  ← your monitoring.values (value not shown)",
                     "driver.enabled=true  ← your gpu_operator.values"]  # a boolean hides nothing


@pytest.mark.unit
def test_a_derived_value_kept_from_a_running_release_is_redacted():
    derived = gpu_operator_values.Derived("driver", {"enabled": True, "licensingConfig": {"nlsToken": "s3cr3t"}},
                                          "kept from the running release")
    assert "s3cr3t" not in derived.line() and '"nlsToken":"<redacted>"' in derived.line()
    # a restarting value that is not an on/off switch is named, never shown
    assert gpu_operator_values.restarts({"toolkit": {"env": [{"name": "REG_PASSWORD", "value": "s3cr3t"}]}},
                                        {"toolkit": {"env": []}}) == ["toolkit.env: changes"]


@pytest.mark.unit
def test_monitoring_plan_lines_name_the_users_section():
    from gpu_bootstrap.core.config import MonitoringConfig
    plan = monitoring.stack_values(MonitoringConfig(values={"grafana": {"adminPassword": "pw"}}))
    assert "grafana.adminPassword  ← your monitoring.values (value not shown)" in monitoring.explain(plan)
    assert not any("pw" in line.split("←")[0] for line in monitoring.explain(plan))


@pytest.mark.unit
@pytest.mark.parametrize("key, secret", [
    ("adminPassword", True), ("apiKey", True), ("api_key", True), ("bearer_token", True), ("credentials", True),
    ("routing_key", True), ("service_key", True), ("client-key-data", True), ("privateKey", True),
    ("password_file", False), ("existingSecret", False), ("secretName", False), ("key", False),
    ("topologyKey", False), ("httpTokens", False), ("tokenExpirationSeconds", False), ("createSecret", False), ("pass", True)])
def test_which_keys_hold_secrets(key, secret):
    assert redact.secret_key(key) is secret


@pytest.mark.unit
def test_tree_redacts_by_key_env_style_pairs_and_secret_data_and_keeps_the_rest():
    values = {"grafana": {"adminPassword": "pw", "admin": {"existingSecret": "grafana-admin"}, "password2": ""},
              "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "value": "x"}],
              "env": [{"name": "NGC_API_KEY", "value": "k"}, {"name": "LOG_LEVEL", "value": "debug"}],
              "port": 3000, "token": None, "secret": {"enabled": True}}
    assert redact.tree(values) == {
        "grafana": {"adminPassword": "<redacted>", "admin": {"existingSecret": "grafana-admin"}, "password2": ""},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "value": "x"}],
        "env": [{"name": "NGC_API_KEY", "value": "<redacted>"}, {"name": "LOG_LEVEL", "value": "debug"}],
        "port": 3000, "token": None, "secret": {"enabled": True}}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"tls.key": "LS0t"},
              "stringData": {"config.yaml": "a: b"}}
    assert redact.tree(secret) == {**secret, "data": {"tls.key": "<redacted>"},
                                   "stringData": {"config.yaml": "<redacted>"}}
    assert values["grafana"]["adminPassword"] == "pw"  # a copy: what goes to helm is untouched


@pytest.mark.unit
def test_tree_redacts_any_scalar_under_a_secret_key_but_booleans():
    values = {"grafana": {"adminPassword": 73195824, "enabled": True}, "ngc": {"apiKey": 1234567890},
              "auth": {"token": 1.5, "passwordAuth": False}, "headers": {"Authorization": "Bearer abc"},
              "env": [{"name": "DB_PASSWORD", "value": 4242}], "replicas": 3}
    assert redact.tree(values) == {
        "grafana": {"adminPassword": "<redacted>", "enabled": True}, "ngc": {"apiKey": "<redacted>"},
        "auth": {"token": "<redacted>", "passwordAuth": False}, "headers": {"Authorization": "<redacted>"},
        "env": [{"name": "DB_PASSWORD", "value": "<redacted>"}], "replicas": 3}


@pytest.mark.unit
@pytest.mark.parametrize("given, shown", [
    ("https://hooks.slack.com/services/T0/B0/abc", "https://hooks.slack.com/services/<redacted>"),
    ("see https://discord.com/api/webhooks/1/x now", "see https://discord.com/api/webhooks/<redacted> now"),
    ("https://user:hunter2@charts.example.com/x", "https://user:<redacted>@charts.example.com/x"),
    ("https://h/x?a=1&token=abc&b=2", "https://h/x?a=1&token=<redacted>&b=2"),
    ("xoxb-123456789012-abcdefghijkl", "xoxb-<redacted>"), ("nvapi-abcdefghijklmnopqrstuvwxyz", "nvapi-<redacted>"),
    ("-----BEGIN EC PRIVATE KEY-----\nMHcC\n-----END EC PRIVATE KEY-----",
     "-----BEGIN EC PRIVATE KEY-----<redacted>-----END EC PRIVATE KEY-----"),
    ("[security]\nadmin_password = hunter2\nadmin_user = admin", "[security]\nadmin_password = <redacted>\n"
                                                                 "admin_user = admin"),
    ('{"apiKey": "abc", "url": "x"}', '{"apiKey": "<redacted>", "url": "x"}'),
    ("password: {{ .Values.x }}\ntoken: ''", "password: {{ .Values.x }}\ntoken: ''"),  # templates, empties
    ("token := input.identity\nallow if token == 1", "token := input.identity\nallow if token == 1"),  # Rego
    ("https://charts.example.com/stable", "https://charts.example.com/stable"),
    # nested inline maps and JSON: the scan goes inside them
    ('{"stringData":{"password":"x"}}', '{"stringData":{"password":"<redacted>"}}'),
    ("values: {grafana: {adminPassword: x}}", "values: {grafana: {adminPassword: <redacted>}}"),
    ('[{"name": "a", "auth": {"token": "t1"}}]', '[{"name": "a", "auth": {"token": "<redacted>"}}]'),
    ("Authorization: Bearer abc.def", "Authorization: <redacted>"),
    ('{"headers": {"authorization": "Basic dXNlcjpwdw=="}}', '{"headers": {"authorization": "<redacted>"}}'),
    ("expr: sum(DCGM_FI_DEV_GPU_UTIL) by (node)", "expr: sum(DCGM_FI_DEV_GPU_UTIL) by (node)"),
    # a whole key-and-value in one pair of quotes after other text: a curl command, an error quoting a header
    ('curl -H "Authorization: Bearer abc.def" https://x', 'curl -H "Authorization: <redacted>" https://x'),
    ("failed: header 'authorization: Basic dXNlcjpwdw==' refused", "failed: header 'authorization: <redacted>' "
                                                                   "refused"),
    ('run "password=hunter2" now', 'run "password=<redacted>" now'),
    ('say "name: bob" and "password: $PW"', 'say "name: bob" and "password: $PW"'),  # not a secret; a placeholder
])
def test_text_redacts_secret_looking_values(given, shown):
    assert redact.text(given) == shown


@pytest.mark.unit
def test_manifests_keep_untouched_documents_verbatim_and_rewrite_only_those_with_secrets():
    stream = ("---\n# Source: c/templates/cm.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: \"c\"\n"
              "data:\n  a: \"1\"\n"
              "---\n# Source: c/templates/secret.yaml\napiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n"
              "data:\n  admin-password: aHVudGVyMg==\n")
    out = redact.manifests(stream)
    documents = out.split("---")
    assert documents[1] == "\n# Source: c/templates/cm.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n" \
                           "  name: \"c\"\ndata:\n  a: \"1\"\n"
    assert documents[2].startswith("\n# Source: c/templates/secret.yaml\n# secret values redacted by gpu-bootstrap")
    assert [d for d in yaml.safe_load_all(out) if d][1]["data"] == {"admin-password": "<redacted>"}
    assert "aHVudGVyMg" not in out


@pytest.mark.unit
def test_render_dir_is_private_and_redacts_values_and_release(tmp_path):
    """0700 folders and 0600 files whatever the umask; values.yaml and release.yaml redacted."""
    old = os.umask(0o022)
    try:
        root = tmp_path / "render"
        prepare(root, ["monitoring"])
        render = RenderDir(root, ["monitoring"], helm=None)
        body = {"release": "r", "namespace": "n", "chart": {"ref": "/nonexistent.tgz"}, "chart_version": "1",
                "kube_version": "1.31.0", "values": {"grafana": {"adminPassword": "pw-1"}},
                "derived": ["x=1  ← y"], "warnings": ["repo https://u:pw-2@charts.example.com"]}
        render.write("monitoring", Change(Verb.HELM_UPGRADE, Ref("helm", "release", "r", "n"), "install",
                                          body=body))
    finally:
        os.umask(old)
    folder = root / "monitoring"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {
        name: 0o600 for name in ("01-helm-upgrade-release-r.yaml", "plan.txt", "values.yaml", "release.yaml",
                                 "manifests-not-rendered.txt")}
    assert yaml.safe_load((folder / "values.yaml").read_text()) == {"grafana": {"adminPassword": "<redacted>"}}
    assert not [p for p in folder.iterdir() if "pw-1" in p.read_text() or "pw-2" in p.read_text()]


@pytest.mark.unit
@pytest.mark.parametrize("section", [{"values": "adminPassword: hunter2x"},  # a string, not a mapping
                                     {"valuez": {"grafana": {"adminPassword": "hunter2x"}}}])  # a misspelled block
def test_a_config_error_and_its_logged_traceback_quote_no_input_value(section):
    """The CLI logs a ConfigError with its traceback: pydantic's ValidationError (which quotes each input value)
    must not ride along as its context."""
    import traceback
    from pathlib import PurePath
    from gpu_bootstrap.core import config as cfg
    from gpu_bootstrap.core.errors import ConfigError
    with pytest.raises(ConfigError) as caught:
        cfg.validate({"nodes": [{"name": "gpu-1"}], "monitoring": section}, cfg.Source(PurePath("c.yaml"), {}))
    logged = "".join(traceback.format_exception(caught.value))
    assert "monitoring.valu" in logged and "hunter2x" not in logged, logged  # short: pydantic would quote it whole


def test_image_pull_secrets_name_a_secret_and_are_kept():
    """imagePullSecrets (registry.pull_secret) holds the names of Secrets, not their data: a render must keep them,
    or the mirrored manifests would be written without the secret the pods pull with."""
    from gpu_bootstrap.security import redact
    spec = {"imagePullSecrets": [{"name": "regcred"}], "pullSecrets": ["regcred"], "adminPassword": "x"}
    assert redact.tree(spec) == {"imagePullSecrets": [{"name": "regcred"}], "pullSecrets": ["regcred"],
                                 "adminPassword": redact.REDACTED}


@pytest.mark.tools
@pytest.mark.usefixtures("helm_on_path")
def test_no_planted_secret_of_any_kind_in_a_plan_its_log_or_its_render_dir(tmp_path):
    """Every kind of planted secret (tests/planted.py: key, env, ini under the dotted `grafana.ini`, webhook URLs
    with a token in path and query, a --x-password= flag, PEM plain and base64, htpasswd, user:pass, docker config
    JSON) appears in no plan line (text and -o json), no log and no render dir file, though helm rendered the
    chart with all of them (the ini's ConfigMap, the env entry, the operator's flag)."""
    from tests import planted
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text(yaml.safe_dump({
        "nodes": [{"name": "gpu-node-1"}],
        "monitoring": {"mode": "install", "chart": str(chart("kube-prometheus-stack-88.5.3.tgz")),
                       "values": planted.monitoring_values()}}))
    outputs = {}
    for output in ("text", "json"):
        run = subprocess.run([sys.executable, "-m", "gpu_bootstrap", "up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(config),
                              "--kube-version", "1.33", "--render-dir", str(tmp_path / output), "-vv", "-o", output,
                              "--log-file", str(tmp_path / f"{output}.log")], capture_output=True, text=True,
                             timeout=300, env=tool_env(NO_COLOR="1", COLUMNS="200"))
        assert run.returncode == 0, run.stderr
        outputs.update({f"{output} stdout": run.stdout, f"{output} stderr": run.stderr,
                        f"{output} log": (tmp_path / f"{output}.log").read_text()})
    assert "grafana.grafana\\.ini.database.password  ← your monitoring.values (value not shown)" in outputs["text stdout"]
    manifests = (tmp_path / "text" / "monitoring" / "manifests.yaml").read_text()
    assert "GF_DATABASE_PASSWORD" in manifests and "--x-password=<redacted>" in manifests  # rendered, then redacted
    assert {name: planted.leaked(text) for name, text in outputs.items() if planted.leaked(text)} == {}
    assert planted.files_with_secrets(tmp_path / "text") == planted.files_with_secrets(tmp_path / "json") == {}


@pytest.mark.unit
@pytest.mark.parametrize("example", ["minimal.yaml", "fleet-gitops.yaml", "three-gpu-nodes.yaml"])
def test_our_own_objects_hold_nothing_the_rules_would_redact(example):
    """The rules by value must not bite our own objects: found, a role name (`system:kube-scheduler`) and a recording
    rule's name read as `user:password` strings, which broke the exported ClusterRoleBindings and PrometheusRules.
    Every object a plan of each example applies (but Secrets and the charts' values) is left as it is."""
    import dataclasses

    from gpu_bootstrap.app import commands as app
    from gpu_bootstrap.core.refs import Verb as V
    from tests.nodes.reports import write_report
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        names = {"minimal.yaml": ["gpu-node-1", "gpu-node-2"], "fleet-gitops.yaml": ["gpu-a1", "gpu-a2"],
                 "three-gpu-nodes.yaml": ["node5", "node6", "node7"]}[example]
        report = write_report(Path(folder) / "report.json", names)
        options = dataclasses.replace(app.Options(config=ROOT / "examples" / example), dry_run=True, offline=True,
                                      kube_version="1.30" if example == "three-gpu-nodes.yaml" else "1.33",
                                      preflight_report=report)
        ctx, runner, _playbook = app.build(options, app.LogReporter())
        try:
            runner.up()
        finally:
            ctx.close()
    changed = [f"{step}: {change.target}" for step, change in ctx.gate.submitted
               if V(change.verb) in (V.APPLY, V.CREATE, V.PATCH) and isinstance(change.body, dict)
               and change.body.get("kind") != "Secret" and redact.tree(change.body) != change.body]
    assert len(ctx.gate.submitted) > 20 and changed == [], changed


@pytest.mark.unit
def test_a_render_dirs_values_hide_what_an_export_leaves_out_and_keep_the_rest():
    """values.yaml in a render dir shows every value an export would leave out (tests/planted.py's kinds) as
    <redacted>, the part of a URL the screen's rules hide, and everything else as it is."""
    from gpu_bootstrap.security import secret_values
    from tests import planted
    values = planted.monitoring_values()
    values["grafana"]["grafana.ini"]["server"] = {"domain": "grafana.example.com"}
    shown = secret_values.hidden(values)
    assert planted.leaked(yaml.safe_dump(shown)) == []
    assert shown["grafana"]["grafana.ini"]["server"] == {"domain": "grafana.example.com"}
    assert shown["grafana"]["grafana.ini"]["database"] == {"type": "postgres", "password": "<redacted>"}
    assert shown["alertmanager"]["config"]["receivers"][0]["webhook_configs"][0]["url"] == \
        "https://alerts.example.com/hooks/<redacted>"
    # schema first: the webhook whose secret segment is short, Slack's api_url, PagerDuty's routing_key, whatever
    # their values look like (Alertmanager types them secrets); the screen's partial hiding where it has one
    receiver = shown["alertmanager"]["config"]["receivers"][0]
    assert receiver["webhook_configs"][2]["url"] == "<redacted>"
    assert receiver["slack_configs"][0] == {"api_url": "https://hooks.slack.com/services/<redacted>", "channel": "#gpu"}
    assert receiver["pagerduty_configs"][0]["routing_key"] == "<redacted>"
    assert shown["grafana"]["additionalDataSources"][0]["secureJsonData"] == {"password": "<redacted>"}
    assert shown["grafana"]["additionalDataSources"][0]["url"] == "db.example.com:5432"  # not a secret: kept
    _kept, paths, _skeleton = secret_values.split(values)
    assert len(paths) == 19, paths  # the first review's 11 and the second's 8 (tests/planted.py)
