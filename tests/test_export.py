"""`gpu-bootstrap export` through the CLI, checked by the engines' own schemas and real tools: the Argo CD
Application, Flux HelmRelease/HelmRepository/Kustomization/GitRepository and cert-manager CRDs read from their Go
modules (scripts/install-test-tools puts them in .tools/schemas), every chart's exported values rendered by the real
helm with the real chart (../shared/charts), the images of a rendered export compared with `images`, and the
refusals (unknown facts, a generated CA, a local chart for a remote engine, a folder that is not ours).

helmfile publishes no schema (its module has none), so helmfile.yaml is checked for what helmfile needs: known keys,
each `needs` naming a release before it, each values file and local chart folder present.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.core.schemas import crd_schemas, problems
from tests.conftest import chart
from tests import planted
from tests.nodes.reports import write_report
from tests.tools import TOOLS_BIN, tool_env, missing, run, tool
from tests.toy_step import written_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SCHEMAS = TOOLS_BIN.parent / "schemas"
runner = CliRunner()
# example -> (its GPU nodes, the Kubernetes versions exported for, whether its webhook CA is generated)
CASES = {"fleet-gitops.yaml": (["gpu-a1", "gpu-a2"], ["1.31", "1.37"], False),
         "minimal.yaml": (["gpu-node-1", "gpu-node-2"], ["1.31", "1.37"], True),
         "three-gpu-nodes.yaml": (["node5", "node6", "node7"], ["1.24", "1.30"], True)}  # its operator: 1.23-1.30
LOCAL_CHARTS = {("gpu-operator", "v25.10.1"), ("gpu-operator", "v26.7.0"), ("kube-prometheus-stack", "88.5.3")}


def invoke(*args: str, tmp_path: Path):
    return runner.invoke(app, [*args, "--log-file", str(tmp_path / "log")])


def export(tmp_path: Path, engine: str, config: Path, kube: str, report: Path, *more: str, out: Path | None = None):
    out = out or tmp_path / engine
    args = ["export", "--format", engine, "-o", str(out), "-c", str(config), "--offline", "--kube-version", kube,
            "--preflight-report", str(report), *more]
    if engine == "argocd":
        args += ["--repo-url", "https://git.example.com/fleet.git", "--repo-path", "clusters/prod/gpu"]
    return invoke(*args, tmp_path=tmp_path), out


def engine_schemas() -> dict:
    files = sorted(SCHEMAS.glob("*/*.yaml"))
    if not files:
        missing(f"the GitOps engines' CRDs are not in {SCHEMAS}")
    return crd_schemas([d for f in files for d in yaml.safe_load_all(f.read_text()) if d])


def unknown_fields(obj, schema: dict, path: str = "") -> list[str]:
    """Fields the schema does not name (the API server's strict field validation refuses them; jsonschema alone
    would not, as CRD schemas rarely close their objects)."""
    if schema.get("x-kubernetes-preserve-unknown-fields") or not isinstance(obj, (dict, list)):
        return []
    if isinstance(obj, list):
        return [f for index, item in enumerate(obj) for f in unknown_fields(item, schema.get("items") or {},
                                                                            f"{path}[{index}]")]
    properties = schema.get("properties")
    if properties is None:
        extra = schema.get("additionalProperties")
        return [f for key, value in obj.items() for f in unknown_fields(value, extra, f"{path}.{key}")] \
            if isinstance(extra, dict) else []
    found = []
    for key, value in obj.items():
        if key not in properties:
            if not (path == "" and key in ("apiVersion", "kind", "metadata")):
                found.append(f"{path}.{key}".lstrip("."))
            continue
        found += unknown_fields(value, properties[key], f"{path}.{key}")
    return found


def documents(folder: Path) -> list[tuple[Path, dict]]:
    from gpu_bootstrap.adapters.helm import _CrdLoader  # a rendered chart's CRDs hold a bare `=` (YAML 1.2)
    return [(path, doc) for path in sorted(folder.rglob("*.yaml")) if "templates" not in path.parts
            for doc in yaml.load_all(path.read_text(), Loader=_CrdLoader) if isinstance(doc, dict) and "kind" in doc]


def built_units(folder: Path, engine: str, home: Path) -> dict[str, list[dict]]:
    """Each unit of our objects as the engine builds it: `kubectl kustomize` (Argo CD, Flux and `apply -k` run
    kustomize on the folder) or, for helmfile, `helm template` of the unit's local chart."""
    built = {}
    for unit in sorted(p for p in folder.iterdir() if p.is_dir() and step_of_unit(p.name)):
        if engine == "helmfile":
            if not (unit / "Chart.yaml").is_file():
                continue
            command = [tool("helm"), "template", unit.name, str(unit)]
        elif (unit / "helmrelease.yaml").is_file():
            continue  # flux: a chart's unit (its HelmRepository and HelmRelease), not our objects
        else:
            command = [tool("kubectl"), "kustomize", str(unit)]
        result = run(command, tool_env(home), 120, False)
        assert result.returncode == 0, f"{unit.name}: {result.stderr[-2000:]}"
        from gpu_bootstrap.adapters.helm import _CrdLoader  # a rendered chart's CRDs hold a bare `=` (YAML 1.2)
        built[unit.name] = [d for d in yaml.load_all(result.stdout, Loader=_CrdLoader) if d]
    return built


def planned_objects(tmp_path: Path, config: Path, report: Path, kube: str) -> list[dict]:
    """The objects `up` applies (its --render-dir), but the validation run's, which stays a command."""
    render = tmp_path / "render"
    result = invoke("up", "--dry-run", "--offline", "-c", str(config), "--kube-version", kube, "--preflight-report",
                    str(report), "--render-dir", str(render), "--allow-incomplete", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    return [yaml.safe_load(p.read_text()) for p in sorted(render.glob("*/*-apply-*.yaml"))
            if not p.parent.name.endswith("validate")]


def releases_of(folder: Path, engine: str) -> list[tuple[str, str, str, dict]]:
    """(chart, version, namespace, values) of each chart the export carries."""
    found = []
    for path, doc in documents(folder):
        if doc.get("kind") == "HelmRelease":
            spec = doc["spec"]
            found.append((spec["chart"]["spec"]["chart"], spec["chart"]["spec"]["version"], spec["targetNamespace"],
                          spec["values"]))
        elif doc.get("kind") == "Application" and "chart" in doc["spec"]["source"]:
            source = doc["spec"]["source"]
            found.append((source["chart"], source["targetRevision"], doc["spec"]["destination"]["namespace"],
                          source["helm"]["valuesObject"]))
    if engine == "helmfile":
        document = yaml.safe_load((folder / "helmfile.yaml").read_text())
        for release in document["releases"]:
            if "/" in release["chart"] and not release["chart"].startswith("./"):
                values = yaml.safe_load((folder / release["values"][0]).read_text())
                found.append((release["chart"].split("/")[-1], release["version"], release["namespace"], values))
    return found


def check_helmfile(folder: Path) -> None:
    document = yaml.safe_load((folder / "helmfile.yaml").read_text())
    assert set(document) <= {"helmDefaults", "repositories", "releases"}, document.keys()
    seen, repos = set(), {r["name"] for r in document.get("repositories", [])}
    for release in document["releases"]:
        assert set(release) <= {"name", "namespace", "chart", "version", "values", "labels", "needs"}, release
        for need in release.get("needs", []):
            assert need in seen, f"{release['name']} needs {need}, which comes later or not at all"
        seen.add(f"{release['namespace']}/{release['name']}")
        if release["chart"].startswith("./"):
            assert list((folder / release["chart"]).glob("*.yaml")), release["chart"]
        else:
            assert release["chart"].split("/")[0] in repos, release["chart"]
        for values in release.get("values", []):
            assert (folder / values).is_file(), values


def check_schemas(folder: Path, schemas: dict) -> int:
    """Every document of a kind whose CRD we have is valid against it; returns how many were checked."""
    checked = 0
    for path, doc in documents(folder):
        schema = schemas.get((doc.get("apiVersion"), doc.get("kind")))
        if schema is None:
            continue
        found = problems(doc, schema) + [f"{f}: not in the schema" for f in unknown_fields(doc, schema)]
        assert not found, f"{path.relative_to(folder)} ({doc['kind']}): {found}"
        checked += 1
    return checked


@pytest.fixture(scope="module")
def rendered_values(tmp_path_factory):
    """(chart, version, values) -> helm template's exit, once per distinct values (the formats share them)."""
    cache: dict[str, str] = {}
    home = tmp_path_factory.mktemp("helm-home")

    def render(name: str, version: str, namespace: str, values: dict, kube: str) -> None:
        key = json.dumps([name, version, namespace, values, kube], sort_keys=True)
        if key in cache:
            return
        values_file = home / f"values-{len(cache)}.yaml"
        values_file.write_text(yaml.safe_dump(values))
        archive = chart(f"{name}-{version}.tgz")
        result = run([tool("helm"), "template", name, str(archive), "--namespace", namespace, "--kube-version",
                      kube, "--values", str(values_file)], tool_env(home), 180, False)
        assert result.returncode == 0, f"{name} {version}: helm template refused the exported values:\n" \
                                       f"{result.stderr[-2000:]}"
        cache[key] = "ok"
    return render


@pytest.mark.tools
@pytest.mark.slow
@pytest.mark.parametrize("example, kube", [(e, k) for e, (_n, kubes, _g) in CASES.items() for k in kubes])
def test_every_format_of_an_example_passes_the_engines_schemas_and_its_values_render(example, kube, tmp_path,
                                                                                      rendered_values):
    nodes, _kubes, generated = CASES[example]
    report = write_report(tmp_path / "report.json", nodes)
    schemas = engine_schemas()
    skip = ["--skip", "admission-opa,admission"] if generated else []
    for engine in ("argocd", "flux", "helmfile"):
        result, out = export(tmp_path, engine, EXAMPLES / example, kube, report, *skip)
        assert result.exit_code == 0, result.output
        checked = check_schemas(out, schemas)
        engine_docs = {"argocd": "Application", "flux": "Kustomization"}.get(engine)
        if engine_docs:
            kinds = {doc["kind"] for _p, doc in documents(out)}
            assert engine_docs in kinds and checked >= 6, (engine, kinds, checked)
        if engine == "helmfile":
            check_helmfile(out)
        releases = releases_of(out, engine)
        assert {r[0] for r in releases} == {"gpu-operator", "kube-prometheus-stack"}, releases
        for name, version, namespace, values in releases:
            if (name, version) in LOCAL_CHARTS:  # the 1.24 example's v24.6.2 has no archive here
                rendered_values(name, version, namespace, values, kube)
        readme = (out / "README.md").read_text()
        assert "gpu-bootstrap up --only node-prep,validate" in readme


def fleet_config(tmp_path: Path, local_charts: bool) -> Path:
    """The fleet example with secrets planted in its monitoring values, every kind where users put it
    (tests/planted.py)."""
    config = yaml.safe_load((EXAMPLES / "fleet-gitops.yaml").read_text())
    config["monitoring"]["values"] = planted.monitoring_values()
    if local_charts:
        config["gpu_operator"] = {"chart": str(chart("gpu-operator-v26.7.0.tgz"))}
        config["monitoring"]["chart"] = str(chart("kube-prometheus-stack-88.5.3.tgz"))
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.tools
@pytest.mark.slow
def test_no_planted_secret_reaches_any_format_and_each_says_where_it_comes_back_from(tmp_path, helm_on_path):
    """Every kind of planted secret (tests/planted.py) is in no file of any format (found before: a webhook URL's
    token, --x-password= flags, env entries, base64 PEM, htpasswd lines, user:pass strings and docker config JSON
    went to Git), the files are private, and the README names every left-out path with where it comes back from:
    flux's Secret (valuesFrom, one values document), helmfile's file outside the bundle, argocd's secret source."""
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    expected = {"grafana.adminPassword", "grafana.env.GF_DATABASE_PASSWORD",
                "grafana.grafana\\.ini.database.password", "alertmanager.config.receivers[0].webhook_configs[0].url",
                "alertmanager.config.receivers[0].webhook_configs[1].url", "prometheusOperator.extraArgs[0]",
                "notes.a", "notes.b", "notes.c", "notes.d", "notes.e",
                # the second review's (issue 54): Alertmanager's own secret fields whatever the value looks like,
                # Grafana's secureJsonData, an --auth= flag, a DSN's password, curl -u, a Vault token
                "alertmanager.config.receivers[0].webhook_configs[2].url",
                "alertmanager.config.receivers[0].slack_configs[0].api_url",
                "alertmanager.config.receivers[0].pagerduty_configs[0].routing_key",
                "grafana.additionalDataSources[0].secureJsonData.password", "prometheusOperator.extraArgs[1]",
                "notes.f", "notes.g", "notes.h"}
    for engine, local in (("argocd", False), ("flux", False), ("helmfile", False), ("manifests", True)):
        result, out = export(tmp_path, engine, fleet_config(tmp_path, local), "1.33", report)
        assert result.exit_code == 0, result.output
        assert planted.files_with_secrets(out) == {}, engine
        assert not planted.leaked(result.output), engine
        for path in out.rglob("*"):
            assert path.stat().st_mode & 0o077 == 0, f"{path} is readable by others"
        readme = (out / "README.md").read_text()
        assert all(f"`{path}`" in readme for path in expected), (engine, readme)
        assert "<secret: grafana.adminPassword>" in readme
    release = next(doc for _p, doc in documents(tmp_path / "flux") if doc["kind"] == "HelmRelease"
                   and doc["metadata"]["name"] == "kube-prometheus-stack")
    assert release["spec"]["valuesFrom"] == [{"kind": "Secret", "name": "kube-prometheus-stack-secret-values",
                                              "valuesKey": "values.yaml"}]
    assert "grafana.ini" in release["spec"]["values"]["grafana"]  # the dotted key's other values stay
    helmfile = yaml.safe_load((tmp_path / "helmfile" / "helmfile.yaml").read_text())
    stack = next(r for r in helmfile["releases"] if r["name"] == "kube-prometheus-stack")
    assert stack["values"] == ["values/kube-prometheus-stack.yaml",
                               "../gpu-bootstrap-secret-values/kube-prometheus-stack.yaml"]


@pytest.mark.tools
@pytest.mark.slow
def test_a_rendered_export_holds_exactly_the_images_that_images_lists(tmp_path, helm_on_path):
    """The manifests format renders the charts (CRDs included): the images of every document in DIR, read as
    `images` reads a render (containers, operator arguments, the ClusterPolicy's operands), are `images`' list."""
    from gpu_bootstrap.app import images as image_list
    from gpu_bootstrap.probes.report import load
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    config = fleet_config(tmp_path, local_charts=True)
    result, out = export(tmp_path, "manifests", config, "1.33", report)
    assert result.exit_code == 0, result.output
    listed = invoke("images", "--offline", "--kube-version", "1.33", "--preflight-report", str(report), "-c",
                    str(config), "-o", "json", tmp_path=tmp_path)
    assert listed.exit_code == 0, listed.output
    # the imperative steps' images (the in-cluster probe's, the validation pods') come with their commands
    wanted = {i["image"] for i in json.loads(listed.stdout)["images"]
              if not all(who.startswith(("gpu-bootstrap preflight", "gpu-bootstrap validate")) for who in i["pulled_by"])}
    by_step: dict[str, list] = {}
    for path, doc in documents(out):
        unit = path.relative_to(out).parts[0] if len(path.relative_to(out).parts) > 1 else ""
        by_step.setdefault(step_of_unit(unit), []).append((path.name, doc))
    found = image_list.collect(by_step, load(report, ["gpu-a1", "gpu-a2"]), True, "auto", None, {})
    assert set(found.images) == wanted, sorted(set(found.images) ^ wanted)
    assert len(wanted) >= 15, wanted


def step_of_unit(unit: str) -> str:
    """The step a unit's folder belongs to (bundle.unit_id: the step's id, then the release or a number)."""
    from gpu_bootstrap.steps import known
    return max((step for step in known() if unit == step or unit.startswith(step + "-")), key=len, default="")


# --- refusals --------------------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_a_generated_webhook_ca_is_refused_naming_the_cert_manager_setting_and_nothing_is_written(tmp_path):
    report = write_report(tmp_path / "report.json", ["gpu-node-1", "gpu-node-2"])
    result, out = export(tmp_path, "flux", EXAMPLES / "minimal.yaml", "1.33", report)
    assert result.exit_code == 2, result.output
    assert "cannot live in Git" in result.output and "admission.certificates: cert-manager" in result.output
    assert "--certificates cert-manager" in result.output
    assert not out.exists()


@pytest.mark.unit
def test_unknown_node_facts_are_refused_naming_the_values_they_decide(tmp_path):
    out = tmp_path / "out"
    result = invoke("export", "--format", "helmfile", "-o", str(out), "-c", str(EXAMPLES / "fleet-gitops.yaml"),
                    "--offline", tmp_path=tmp_path)
    assert result.exit_code == 2, result.output
    assert "gpu-operator: driver.enabled" in result.output and "gpu-operator: toolkit.enabled" in result.output
    assert "--preflight-report" in result.output and not out.exists()


@pytest.mark.unit
def test_an_unreachable_node_fails_the_export_instead_of_guessing(tmp_path):
    """A node whose facts could not be read (its SSH check failed in the report) is unknown, not absent."""
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    document = json.loads(report.read_text())
    document["nodes"][1]["checks"] = [{"id": "ssh", "status": "fail", "message": "connection refused"}] + [
        {"id": i, "status": "skip", "message": "skipped: no SSH session"}
        for i in ("nvidia-driver", "nouveau", "container-runtime", "nvidia-container-toolkit")]
    report.write_text(json.dumps(document))
    result, out = export(tmp_path, "flux", EXAMPLES / "fleet-gitops.yaml", "1.33", report)
    assert result.exit_code != 0, result.output
    assert "gpu-a2" in result.output and not out.exists()


@pytest.mark.tools
def test_a_local_chart_is_refused_for_argocd_and_flux(tmp_path):
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    config = yaml.safe_load((EXAMPLES / "fleet-gitops.yaml").read_text())
    config["gpu_operator"] = {"chart": str(chart("gpu-operator-v26.7.0.tgz"))}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    for engine in ("argocd", "flux"):
        result, out = export(tmp_path, engine, path, "1.33", report)
        assert result.exit_code == 2, result.output
        assert "gpu_operator.chart" in result.output and "local file" in result.output and not out.exists()


@pytest.mark.tools
@pytest.mark.parametrize("section, field", [
    ("dra_driver", "gpu_operator.dra_driver.chart"),  # the gpu-operator step's second release
    ("kueue", "queues.kueue.chart"),
])
def test_a_refused_local_chart_names_the_field_that_set_it(tmp_path, section, field):
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    config = yaml.safe_load((EXAMPLES / "fleet-gitops.yaml").read_text())
    if section == "dra_driver":
        config["gpu_operator"] = {"allocation": "dra", "dra_driver": {"chart": str(chart("dra-driver-nvidia-gpu-0.5.0"))}}
    else:
        from tests.localcluster.cluster import binaries, require
        require("kueue-chart")
        config["queues"] = {"kueue": {"chart": str(binaries()["kueue-chart"])},
                            "teams": [{"name": "research", "namespaces": ["research"], "gpus": 8}]}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    result, out = export(tmp_path, "argocd", path, "1.35", report)
    assert result.exit_code == 2, result.output
    assert f"set {field}" in result.output and "local file" in result.output and not out.exists(), result.output


def up_config(tmp_path: Path) -> Path:
    """A config as `up` runs it from a machine without a chart repository: local chart archives, a generated CA."""
    config = yaml.safe_load((EXAMPLES / "minimal.yaml").read_text())
    config["gpu_operator"] = {**(config.get("gpu_operator") or {}), "chart": str(chart("gpu-operator-v26.7.0.tgz"))}
    config["monitoring"] = {**(config.get("monitoring") or {}),
                            "chart": str(chart("kube-prometheus-stack-88.5.3.tgz"))}
    path = tmp_path / "up.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.tools
@pytest.mark.parametrize("engine", ["argocd", "flux"])
def test_the_config_up_uses_serves_git_with_overrides_that_the_readme_lists(tmp_path, engine):
    """Issue 56: one config for `up` (local archives, a generated CA) and for Git: --chart-repository default takes
    each local chart from its section's repository at the archive's own version, --certificates cert-manager swaps
    the CA; the bundle's README lists both. Without them the same config is refused, naming the flags."""
    report = write_report(tmp_path / "report.json", ["gpu-node-1", "gpu-node-2"])
    config = up_config(tmp_path)
    refused, out = export(tmp_path, engine, config, "1.33", report, out=tmp_path / "refused")
    assert refused.exit_code == 2 and "--certificates cert-manager" in refused.output and not out.exists()
    result, out = export(tmp_path, engine, config, "1.33", report, "--chart-repository", "default",
                         "--certificates", "cert-manager")
    assert result.exit_code == 0, result.output
    charts = {(name, version) for name, version, _ns, _values in releases_of(out, engine)}
    assert {("gpu-operator", "v26.7.0"), ("kube-prometheus-stack", "88.5.3")} <= charts, charts
    overridden = (out / "README.md").read_text().split("## Overridden for this export", 1)[1].split("## ", 1)[0]
    assert f"`gpu_operator.chart` | {chart('gpu-operator-v26.7.0.tgz')} | https://helm.ngc.nvidia.com/nvidia " \
           f"gpu-operator v26.7.0 | `--chart-repository default`" in overridden, overridden
    assert "`monitoring.chart`" in overridden and "prometheus-community.github.io/helm-charts" in overridden
    assert "`admission.certificates` | generated | cert-manager | `--certificates cert-manager`" in overridden
    assert "overridden for this export: gpu_operator.chart" in result.output
    assert any(o.get("kind") == "Certificate" for _path, o in documents(out))  # cert-manager issues it
    assert yaml.safe_load(config.read_text())["gpu_operator"]["chart"].endswith(".tgz")  # the config is unchanged


@pytest.mark.unit
def test_a_bundle_with_nothing_overridden_says_so(tmp_path):
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    result, out = export(tmp_path, "helmfile", EXAMPLES / "fleet-gitops.yaml", "1.33", report)
    assert result.exit_code == 0, result.output
    assert "## Overridden for this export\n\nNothing: the bundle uses the config's settings as they are." in \
        (out / "README.md").read_text()


@pytest.mark.unit
@pytest.mark.parametrize("given, said", [
    ("nosuch=default", "--chart-repository nosuch=default: 'nosuch' is not a config section with a chart"),
    ("monitoring=ftp://charts.example.com", "is neither 'default' nor a repository URL"),
    ("https://charts.example.com", "a URL needs the section it is for"),
])
def test_a_bad_override_is_exit_2_naming_the_flag_and_nothing_is_written(tmp_path, given, said):
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    result, out = export(tmp_path, "flux", EXAMPLES / "fleet-gitops.yaml", "1.33", report, "--chart-repository",
                         given)
    assert result.exit_code == 2 and said in result.output, result.output
    assert not out.exists()


@pytest.mark.unit
def test_a_section_given_a_mirror_takes_its_chart_from_there(tmp_path):
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    result, out = export(tmp_path, "helmfile", EXAMPLES / "fleet-gitops.yaml", "1.33", report,
                         "--chart-repository", "monitoring=https://charts.mirror.example.com/prom/")
    assert result.exit_code == 0, result.output
    document = yaml.safe_load((out / "helmfile.yaml").read_text())
    assert "https://charts.mirror.example.com/prom" in [r["url"] for r in document["repositories"]], document
    assert "`--chart-repository monitoring=https://charts.mirror.example.com/prom/`" in (out / "README.md").read_text()


@pytest.mark.unit
def test_argocd_needs_the_repository_url(tmp_path):
    result = invoke("export", "--format", "argocd", "-o", str(tmp_path / "o"), "-c",
                    str(EXAMPLES / "fleet-gitops.yaml"), "--offline", tmp_path=tmp_path)
    assert result.exit_code == 2 and "--repo-url" in result.output, result.output


@pytest.mark.unit
def test_a_folder_of_other_files_is_refused_and_a_second_export_replaces_only_its_own_files(tmp_path):
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    out = tmp_path / "gpu"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result, _ = export(tmp_path, "flux", EXAMPLES / "fleet-gitops.yaml", "1.33", report, out=out)
    assert result.exit_code == 2 and "not empty" in result.output, result.output
    (out / "notes.txt").unlink()
    result, _ = export(tmp_path, "flux", EXAMPLES / "fleet-gitops.yaml", "1.33", report, out=out)
    assert result.exit_code == 0, result.output
    (out / "notes.txt").write_text("mine, added after")
    assert (out / "admission").is_dir()
    result, _ = export(tmp_path, "flux", EXAMPLES / "fleet-gitops.yaml", "1.33", report, "--skip", "admission",
                       out=out)
    assert result.exit_code == 0, result.output
    assert not (out / "admission").exists(), "the unit left out stayed"
    assert (out / "notes.txt").read_text() == "mine, added after"
    kustomizations = yaml.safe_load_all((out / "flux" / "kustomizations.yaml").read_text())
    assert "gpu-bootstrap-admission" not in {k["metadata"]["name"] for k in kustomizations}


@pytest.mark.unit
def test_units_keep_the_playbook_order_and_charts_come_after_their_namespace(tmp_path):
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    result, out = export(tmp_path, "argocd", EXAMPLES / "fleet-gitops.yaml", "1.33", report)
    assert result.exit_code == 0, result.output
    apps = {doc["metadata"]["name"]: doc for _p, doc in documents(out / "argocd" / "apps")}
    waves = sorted((int(a["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"]), name)
                   for name, a in apps.items() if written_for([step_of_unit(name.removeprefix("gpu-bootstrap-"))]))
    assert [name for _w, name in waves] == [
        "gpu-bootstrap-monitoring", "gpu-bootstrap-monitoring-kube-prometheus-stack", "gpu-bootstrap-monitoring-2",
        "gpu-bootstrap-gpu-operator", "gpu-bootstrap-gpu-operator-gpu-operator", "gpu-bootstrap-binpack-scheduler",
        "gpu-bootstrap-admission-opa", "gpu-bootstrap-admission"]
    assert apps["gpu-bootstrap-monitoring-kube-prometheus-stack"]["spec"]["source"]["chart"] == "kube-prometheus-stack"
    assert apps["gpu-bootstrap-binpack-scheduler"]["spec"]["source"]["path"] == "clusters/prod/gpu/binpack-scheduler"
    operator = (out / "argocd" / "apps" / "gpu-operator-gpu-operator.yaml").read_text()
    assert "#   driver.enabled=false  ← gpu-a1, gpu-a2: driver" in operator  # each derived value with its reason
    webhook = yaml.safe_load((out / "admission" / "01-mutatingwebhookconfiguration-gpu-bootstrap-gpu-pods.yaml")
                             .read_text())
    assert webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "gpu-bootstrap-admission/opa-serving"
    assert webhook["metadata"]["annotations"]["gpu-bootstrap.io/exported-to"] == "argocd"
    assert "caBundle" not in webhook["webhooks"][0]["clientConfig"]
    kinds = [doc["kind"] for _p, doc in documents(out / "admission-opa")]
    assert {"Issuer", "Certificate"} <= set(kinds) and "Secret" not in kinds


@pytest.mark.tools
def test_every_unit_builds_into_exactly_the_objects_up_applies_with_the_policy_kept_as_files(tmp_path, helm_on_path):
    """Found: the OPA policy was one escaped string in a ConfigMap, which nobody can review in a pull request. Now
    a ConfigMap of files is those files plus a kustomize configMapGenerator (argocd, flux, manifests) or a local
    chart's .Files (helmfile). Each unit is built by the real tools the engines run (kubectl's kustomize, helm) and
    compared with what `up` would apply: the same objects, byte for byte the same policy, and the alert rules' own
    `{{ $labels }}` templates not read as Helm's."""
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    config = EXAMPLES / "fleet-gitops.yaml"
    wanted = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
              for o in planned_objects(tmp_path, config, report, "1.33")}
    policy = wanted[("ConfigMap", "gpu-bootstrap-admission", "opa-policy")]["data"]
    for engine in ("argocd", "flux", "helmfile"):
        result, out = export(tmp_path, engine, config, "1.33", report)
        assert result.exit_code == 0, result.output
        assert (out / "admission-opa" / ("files" if engine == "helmfile" else "") / "opa-policy" /
                "gpu-pods.rego").read_text() == policy["gpu-pods.rego"]
        package = next(line for line in policy["gpu-pods.rego"].splitlines() if line.startswith("package "))
        assert package.startswith("package ") and package not in "".join(p.read_text() for p in out.rglob("*.yaml"))
        built = {}
        for objects in built_units(out, engine, tmp_path).values():
            for obj in objects:
                obj["metadata"].get("annotations", {}).pop("gpu-bootstrap.io/exported-to")
                if not obj["metadata"]["annotations"]:
                    del obj["metadata"]["annotations"]
                built[(obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])] = obj
        assert set(built) == set(wanted), (engine, set(built) ^ set(wanted))
        for key, obj in wanted.items():
            assert built[key] == obj, (engine, key)


@pytest.mark.unit
def test_argocd_settings_reach_every_application_and_the_health_patch_comes_with_them(tmp_path):
    """Found: `project: default`, `namespace: argocd` and automated prune/selfHeal were fixed, and the README's
    "a wave syncs once the one before is healthy" was untrue: Argo CD stopped assessing an Application's health in
    1.8, so app-of-apps waves do not wait. Now the three are flags, and the bundle carries the documented argocd-cm
    health check (its Lua checked by tests/test_argocd_health.py where Argo CD's own code can be built), with the
    README saying to apply it first."""
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    result, out = export(tmp_path, "argocd", EXAMPLES / "fleet-gitops.yaml", "1.33", report, "--argocd-namespace",
                         "gitops", "--argocd-project", "platform", "--no-auto-sync")
    assert result.exit_code == 0, result.output
    apps = [doc for _p, doc in documents(out / "argocd") if doc.get("kind") == "Application"]
    assert len([a for a in apps if written_for([step_of_unit(a["metadata"]["name"].removeprefix("gpu-bootstrap-"))])
                or a["metadata"]["name"] == "gpu-bootstrap"]) == 9
    for app_ in apps:
        assert app_["metadata"]["namespace"] == "gitops" and app_["spec"]["project"] == "platform", app_
        assert "automated" not in app_["spec"]["syncPolicy"], app_
    patch = yaml.safe_load((out / "argocd" / "argocd-cm-application-health.yaml").read_text())
    assert set(patch) == {"data"} and 'hs.status = "Progressing"' in \
        patch["data"]["resource.customizations.health.argoproj.io_Application"]
    readme = (out / "README.md").read_text()
    assert "kubectl -n gitops patch configmap argocd-cm" in (out / "argocd" / "argocd-cm-application-health.yaml") \
        .read_text()
    assert "argocd-cm-application-health.yaml` into argocd-cm" in readme and "--no-auto-sync" in readme
    assert "AppProject `platform` must allow" in readme and "cert-manager" in readme
    default, out2 = export(tmp_path, "argocd", EXAMPLES / "fleet-gitops.yaml", "1.33", report, out=tmp_path / "d")
    assert default.exit_code == 0, default.output
    assert all(d["spec"]["syncPolicy"]["automated"] == {"prune": True, "selfHeal": True}
               for _p, d in documents(out2 / "argocd") if d.get("kind") == "Application")


@pytest.mark.unit
@pytest.mark.parametrize("engine, args, said", [
    ("flux", ["--no-auto-sync"], "--no-auto-sync: only for --format argocd, not flux"),
    ("helmfile", ["--argocd-project", "x"], "--argocd-project: only for --format argocd"),
    ("argocd", ["--argocd-namespace", "Argo_CD"], "--argocd-namespace: 'Argo_CD' must be a lowercase DNS label"),
    ("argocd", ["--argocd-project", "a b"], "--argocd-project: 'a b' must be a lowercase DNS subdomain"),
])
def test_argocd_settings_are_checked_before_anything_is_written(tmp_path, engine, args, said):
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    result, out = export(tmp_path, engine, EXAMPLES / "fleet-gitops.yaml", "1.33", report, *args)
    assert result.exit_code == 2 and said in result.output, result.output
    assert not out.exists()


@pytest.mark.unit
@pytest.mark.parametrize("engine, needs", [
    ("argocd", ["Argo CD 2.8 or later", "cert-manager (its CRDs and its CA injector), before unit admission-opa"]),
    ("flux", ["Flux 2.3 or later", "GitRepository `flux-system/flux-system`", "cert-manager"]),
    ("helmfile", ["helm-diff plugin", "cert-manager"]),
])
def test_every_bundle_readme_lists_what_must_exist_before_it_syncs(tmp_path, engine, needs):
    """Found: cert-manager is needed by the admission units, but no bundle README said so."""
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    config = tmp_path / "fleet.yaml"
    document = yaml.safe_load((EXAMPLES / "fleet-gitops.yaml").read_text())
    document.setdefault("monitoring", {})["values"] = {"grafana": {"adminPassword": "hunter2-not-in-git"}}
    config.write_text(yaml.safe_dump(document))
    result, out = export(tmp_path, engine, config, "1.33", report)
    assert result.exit_code == 0, result.output
    readme = (out / "README.md").read_text()
    before = readme.split("## Before you sync", 1)[1].split("## Units", 1)[0]
    for need in needs + ["The secret values of `kube-prometheus-stack`"]:
        assert need in before, (need, before)


# --- mirror lists ----------------------------------------------------------------------------------------------------
@pytest.mark.tools
@pytest.mark.slow
def test_images_for_hauler_zarf_and_skopeo_list_the_same_images_and_parse_as_their_formats(tmp_path, helm_on_path):
    import jsonschema
    from gpu_bootstrap.core.catalogue import parse
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    config = fleet_config(tmp_path, local_charts=True)
    common = ["--offline", "--kube-version", "1.33", "--preflight-report", str(report), "-c", str(config)]
    listed = invoke("images", *common, "-o", "json", tmp_path=tmp_path)
    assert listed.exit_code == 0, listed.output
    sources = {i["source"] for i in json.loads(listed.stdout)["images"]}
    out = {}
    for engine in ("hauler", "zarf", "skopeo"):
        result = invoke("images", *common, "-o", engine, tmp_path=tmp_path)
        assert result.exit_code == 0, result.output
        out[engine] = list(yaml.safe_load_all(result.stdout))  # the comments go: skopeo reads the data
        # Found: the air-gap bundle listed images but no charts. Each names both charts and their sums' standing
        assert "# chart gpu-operator/gpu-operator:" in result.stdout and "a local archive" in result.stdout
    hauler, files = out["hauler"]
    out = {engine: documents[0] for engine, documents in out.items()}
    assert out["hauler"]["apiVersion"] == "content.hauler.cattle.io/v1" and out["hauler"]["kind"] == "Images"
    assert {i["name"] for i in out["hauler"]["spec"]["images"]} == sources
    archives = {str(chart("gpu-operator-v26.7.0.tgz")), str(chart("kube-prometheus-stack-88.5.3.tgz"))}
    assert files["kind"] == "Files" and {f["path"] for f in files["spec"]["files"]} == archives
    zarf_schema = next(SCHEMAS.glob("*zarf*/zarf.schema.json"), None)
    if zarf_schema is None:
        missing("Zarf's package schema is not in .tools/schemas")
    jsonschema.validate(out["zarf"], json.loads(zarf_schema.read_text()))
    assert set(out["zarf"]["components"][0]["images"]) == sources
    charts = out["zarf"]["components"][1]
    assert charts["required"] is False and {c["localPath"] for c in charts["charts"]} == archives
    # skopeo itself reads the sync file: with --debug it names every repository and tag before copying (which
    # fails here, with no registry to reach)
    sync = tmp_path / "sync.yaml"
    sync.write_text(yaml.safe_dump(out["skopeo"]))
    read = run([tool("skopeo"), "--debug", "sync", "--src", "yaml", "--dest", "dir", str(sync),
                str(tmp_path / "copy")], tool_env(tmp_path), 120, False)
    processed = set()
    for line in read.stderr.splitlines():
        if 'msg="Processing repo"' in line:
            fields = dict(part.split("=", 1) for part in line.split() if "=" in part and not part.startswith("msg"))
            processed.add(f"{fields['registry']}/{fields['repo']}")
    wanted = {f"{parse(s).host}/{parse(s).path if '/' in parse(s).path or parse(s).registry else 'library/' + parse(s).path}"
              for s in sources}
    assert processed == wanted, sorted(processed ^ wanted)
    assert "Failed to unmarshal" not in read.stderr


@pytest.mark.unit
def test_hauler_and_zarf_carry_the_charts_from_their_repositories_with_what_their_sums_are():
    """The charts of a plan (what `up` installs) in each mirroring tool's format: Hauler's Charts, Zarf's optional
    charts component, a comment per chart saying whether the catalogue's sum is the repository's own."""
    from gpu_bootstrap import __version__
    from gpu_bootstrap.app.export import mirror
    from gpu_bootstrap.app.images import ChartUse, ImageList
    found = ImageList(charts=[
        ChartUse("gpu-operator/gpu-operator", "gpu-operator", "https://helm.ngc.nvidia.com/nvidia", "v26.7.0",
                 "ab" * 32, False),
        ChartUse("monitoring/kube-prometheus-stack", "oci://mirror.example/charts/kube-prometheus-stack", None,
                 "88.5.3", "cd" * 32, True)])
    found.add("nvcr.io/nvidia/gpu-operator:v26.7.0", None, "gpu-operator chart")
    images, charts = yaml.safe_load_all(mirror.hauler(found))
    assert charts["kind"] == "Charts" and charts["spec"]["charts"] == [
        {"name": "gpu-operator", "repoURL": "https://helm.ngc.nvidia.com/nvidia", "version": "v26.7.0"},
        {"name": "kube-prometheus-stack", "repoURL": "oci://mirror.example/charts", "version": "88.5.3"}]
    text = mirror.zarf(found, __version__)
    component = yaml.safe_load(text)["components"][1]
    assert component["charts"][0] == {"name": "gpu-operator", "namespace": "gpu-operator",
                                      "releaseName": "gpu-operator", "url": "https://helm.ngc.nvidia.com/nvidia",
                                      "repoName": "gpu-operator", "version": "v26.7.0"}
    assert component["charts"][1]["url"] == "oci://mirror.example/charts/kube-prometheus-stack"
    assert "not read from the repository's index" in text and "read from the repository's index: helm pull is " \
                                                              "checked against it" in text


# --- online: the cluster's version and nodes ------------------------------------------------------------------------
@pytest.fixture
def emulator_options():
    return {"kube_version": "1.33.4", "gpu_nodes": ["gpu-1", "gpu-2"], "cpu_nodes": ["cpu-1"]}


def test_an_online_export_of_karpenter_pools_reads_the_cluster_and_takes_pool_nodes_facts_from_their_pools(
        cluster, tmp_path):
    """examples/karpenter-pools.yaml against the emulator: its GPU nodes are the ones the `nodes` selector matches
    (labelled by Karpenter with their pool), so their facts are the pools' (an al2023 pool: the operator installs the
    driver; Bottlerocket: the OS brings it). The export reads the cluster's version and nodes and writes nothing
    to it."""
    cluster.kubectl("label", "node", "gpu-1", "karpenter.sh/nodepool=gpu")
    cluster.kubectl("label", "node", "gpu-2", "karpenter.sh/nodepool=gpu-bottlerocket")
    config = yaml.safe_load((EXAMPLES / "karpenter-pools.yaml").read_text())
    config["cluster"] = {"kubeconfig": str(cluster.kubeconfig)}
    config["admission"] = {"certificates": "cert-manager"}
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump(config))
    cluster.emu.requests.clear()
    out = tmp_path / "flux"
    result = invoke("export", "--format", "flux", "-o", str(out), "-c", str(path), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert cluster.emu.requests.writes(include_dry_run=True) == []
    assert "Kubernetes 1.33.4" in (out / "README.md").read_text()
    pools = {doc["kind"]: doc for _p, doc in documents(out / "gpu-pools")}
    assert {"NodePool", "EC2NodeClass"} <= set(pools), sorted(pools)
    operator = (out / "gpu-operator-gpu-operator" / "helmrelease.yaml").read_text()
    assert "driver.enabled=true  ← every GPU node (gpu-1, gpu-2) is a pool node" in operator, operator[:1500]


def engine_names(out: Path) -> set[str]:
    """Every Application, Kustomization and HelmRelease an export holds, by kind and name."""
    names = set()
    for _path, doc in documents(out):
        if doc.get("kind") in ("Application", "Kustomization", "HelmRelease") and \
                doc.get("apiVersion", "").split("/")[0] in ("argoproj.io", "kustomize.toolkit.fluxcd.io",
                                                            "helm.toolkit.fluxcd.io"):
            names.add((doc["kind"], doc["metadata"]["name"]))
    return names


@pytest.mark.unit
@pytest.mark.parametrize("position", [0, 4, -1], ids=["first", "middle", "last"])
def test_a_step_inserted_in_the_playbook_renames_no_unit_and_prunes_nothing(tmp_path, monkeypatch, position):
    """Units were named by their place (`05b-gpu-operator`): a version that inserted a step renamed every later
    Application, and Argo CD's resources finalizer made the next sync's prune a cascading delete of the
    gpu-operator and the monitoring stack. Names now come from the step and release alone."""
    from tests.toy_step import TOY, inserted, playbook_with_toy
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    with inserted(monkeypatch):
        toy_playbook, plain = playbook_with_toy(tmp_path, position), playbook_with_toy(tmp_path, None)
        for engine in ("argocd", "flux"):
            result, out = export(tmp_path, engine, EXAMPLES / "fleet-gitops.yaml", "1.33", report, "--playbook",
                                 str(plain))
            assert result.exit_code == 0, result.output
            before = engine_names(out)
            result, _ = export(tmp_path, engine, EXAMPLES / "fleet-gitops.yaml", "1.33", report,
                               "--playbook", str(toy_playbook), out=out)
            assert result.exit_code == 0, result.output
            after = engine_names(out)
            assert before < after and {name for _kind, name in after - before} == {f"gpu-bootstrap-{TOY}"}, \
                (engine, sorted(before ^ after))
            assert "units of the export this one replaced are gone" not in result.output
            result, _ = export(tmp_path, engine, EXAMPLES / "fleet-gitops.yaml", "1.33", report, "--playbook",
                               str(plain), out=out)
            assert f"units of the export this one replaced are gone: {TOY}" in result.output, result.output
