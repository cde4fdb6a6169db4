"""A step is declared once (pipeline/step.py: Declaration, at the bottom of its module); every list of steps is
derived from the declarations. These tests fail when a derived list disagrees with them, or when a step's switch,
section or page is written somewhere else."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap import steps as registry
from gpu_bootstrap.app.playbook import load_playbook
from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.core.config import Config, load
from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.pipeline.step import Declaration, Step
from gpu_bootstrap.security import rbac, rbac_rules
from tests.toy_step import TOY, Toy, ToyConfig

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
STEPS = ROOT / "gpu_bootstrap" / "steps"


def config(**sections) -> Config:
    return Config.model_validate({"nodes": [{"name": "node5"}], **sections})


def test_every_shipped_step_is_declared_by_the_module_named_after_it():
    for step_id in registry.shipped():
        declaration = registry.declaration(step_id)
        assert isinstance(declaration, Declaration)
        assert declaration.id == step_id and issubclass(declaration.step, Step)
        assert declaration.step.__module__ == f"gpu_bootstrap.steps.{step_id.replace('-', '_')}"
        assert declaration.step.declaration is declaration  # Step.enabled follows the declared switch
        assert declaration.summary and declaration.title


def test_the_shipped_steps_are_the_ones_the_shipped_playbooks_name():
    named = []
    for path in sorted((ROOT / "playbooks").glob("*.yaml")):
        named += [s for s in yaml.safe_load(path.read_text())["steps"] if s not in named]
    assert sorted(registry.shipped()) == sorted(named)
    assert list(registry.shipped())[:len(load_playbook("default").steps)] == \
        [s for s in load_playbook("default").steps if s != TOY]


def test_every_module_that_declares_a_step_is_in_a_playbook():
    """A step module nobody can run is a list written twice (declared, but forgotten in the playbooks)."""
    declaring = sorted(path.stem.replace("_", "-") for path in STEPS.glob("*.py")
                       if "\nDECLARATION = declare(" in path.read_text())
    assert declaring == sorted(registry.shipped())


@pytest.mark.parametrize("name", ["gpu-operator-health", "monitoring-prometheus", "admission-state", "../app",
                                  "GPU-operator", "", "toy-labels-2", "steps"])
def test_a_module_that_declares_no_step_is_no_step(name):
    assert not registry.is_step(name)
    with pytest.raises(KeyError):
        registry.load_step(name)


def test_no_step_writes_its_switch_a_second_time():
    """The switch is the declaration's `enabled`: no step class defines its own enabled() beside it."""
    for declaration in registry.declarations(registry.shipped()):
        assert "enabled" not in vars(declaration.step), declaration.id


@pytest.mark.parametrize("sections, off", [
    ({}, set()),
    ({"node_prep": {"enabled": False}}, {"node-prep"}),
    ({"monitoring": {"enabled": False}, "validate": {"enabled": False}}, {"monitoring", "validate"}),
    ({"admission": {"engine": "vap"}}, {"admission-opa"}),
    ({"admission": {"enabled": False}}, {"admission-opa", "admission"}),
    ({"gpu_operator": {"enabled": False}, "scheduler": {"enabled": False}}, {"gpu-operator", "binpack-scheduler"}),
])
def test_the_runner_and_rbac_read_the_same_switch(sections, off):
    """What `up` runs (Step.enabled) and what `rbac` grants for (steps.enabled) come from one switch."""
    conf = config(**sections)
    playbook = load_playbook("default").steps
    granted = [d.id for d in registry.enabled(conf, playbook)]
    running = [s for s in playbook if registry.load_step(s).enabled(_Ctx(conf))]
    assert granted == running
    everything = [d.id for d in registry.enabled(config(), playbook)]  # (a step added off by default is off in both)
    assert set(everything) - set(granted) == off


class _Ctx:
    def __init__(self, conf):
        self.config = conf


def test_every_declared_section_is_a_key_of_the_config():
    keys = set(registry.config_model().keys())
    for declaration in registry.declarations():
        if declaration.section:
            assert declaration.section in keys, declaration.id


@pytest.mark.parametrize("sections", [
    {"pools": [{"name": "gpu", "role": "r", "discovery_tag": "t", "limits": {"nvidia.com/gpu": 8}},
               {"name": "sim", "cloud": "kwok"}]},
    {"gpu_operator": {"allocation": "dra"}},  # pools refuse DRA mode: each alone
])
def test_every_declared_need_has_a_known_phase_and_namespace(sections):
    conf = config(**sections)
    built_in = set(rbac.namespaces(conf)) | {"prometheus"}
    for declaration in registry.declarations():
        own = set(declaration.scopes(conf))
        assert not own & built_in, (declaration.id, own & built_in)  # a step's key never renames a built-in one
        scopes = built_in | own
        for table in (declaration.needs(conf), declaration.dra_needs(conf)):
            assert set(table) <= {rbac_rules.READ, rbac_rules.WRITE, rbac_rules.RUN, rbac_rules.DOCTOR}
            for need in (n for phase in table.values() for n in phase):
                assert need.scope is rbac_rules.CLUSTER or need.scope in scopes, (declaration.id, need)


def test_readme_and_the_docs_navigation_list_the_declared_steps_in_playbook_order():
    readme = (ROOT / "README.md").read_text()
    rows = [line.split("|")[1].strip().strip("`") for line in readme.splitlines()
            if line.startswith("| `") and line.count("|") == 4]
    declared = list(registry.shipped())
    assert rows[:len(declared)] == declared
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = next(item["Steps"] for item in nav if isinstance(item, dict) and "Steps" in item)
    assert [page for entry in pages for page in entry.values()] == \
        list(dict.fromkeys(d.page for d in registry.declarations(declared)))
    for declaration in registry.declarations(declared):
        assert (ROOT / "docs" / declaration.page).is_file(), declaration.page


def test_a_step_that_brings_its_section_extends_the_config(tmp_path, monkeypatch):
    """The toy step declares a section of its own (toy_labels): the config loaded for a run knows it, init's
    example writes it (a file the loader accepts), and a misspelling of it is refused naming the key."""
    monkeypatch.setitem(registry.ELSEWHERE, TOY, "tests.toy_step")
    model = registry.config_model()
    assert model is not Config and issubclass(model, Config)
    assert "toy_labels" not in registry.config_model(registry.shipped()).keys()
    path = tmp_path / "gpu-bootstrap.yaml"
    path.write_text("nodes: [{name: node5}]\ntoy_labels: {note: hello}\n")
    loaded = load(path, model=model)
    assert loaded.toy_labels == ToyConfig(note="hello")
    assert Toy.declaration.settings(loaded).note == "hello"
    assert Toy.declaration.settings(config()).note == "toy"  # a config built without the step's model: defaults
    with pytest.raises(ConfigError) as refused:
        load(path, model=Config)
    assert "toy_labels" in str(refused.value)
    path.write_text("nodes: [{name: node5}]\ntoy_label: {note: hello}\n")
    with pytest.raises(ConfigError) as misspelled:
        load(path, model=model)
    assert "toy_label" in str(misspelled.value) and "toy_labels" in str(misspelled.value)  # allowed keys named

    monkeypatch.chdir(tmp_path)
    written = CliRunner().invoke(app, ["init", "--force"])
    assert written.exit_code == 0, written.output
    example = (tmp_path / "gpu-bootstrap.yaml").read_text()
    assert "toy_labels:" in example and "note: \"toy\"" in example and "what the toy ConfigMap says" in example
    assert load(tmp_path / "gpu-bootstrap.yaml", model=model).toy_labels.note == "toy"
    schema = yaml.safe_load((tmp_path / "gpu-bootstrap.schema.json").read_text())
    assert "toy_labels" in schema["properties"]


def test_a_built_in_section_cannot_be_taken_by_a_step():
    with pytest.raises(ValueError, match="monitoring"):
        Config.extended({"monitoring": ToyConfig})


def test_rbac_grants_a_declared_step_what_it_declares(monkeypatch):
    monkeypatch.setitem(registry.ELSEWHERE, TOY, "tests.toy_step")
    conf = config(monitoring={"mode": "install"})  # (attaching, monitoring writes ConfigMaps cluster-wide)
    shipped = [s for s in load_playbook("default").steps if s != TOY]  # (GPU_BOOTSTRAP_TOY_STEP_AT inserts it)
    found = rbac.rules("up", conf, registry.declarations([*shipped, TOY]))
    state = found.namespaced["gpu-bootstrap"]
    assert any("configmaps" in r["resources"] and "delete" in r["verbs"] and
               any(w.startswith(TOY) for w in r[rbac.WHY]) for r in state)
    without = rbac.rules("up", conf, registry.declarations(shipped))
    assert not any(any(w.startswith(TOY) for w in r[rbac.WHY]) for r in without.namespaced["gpu-bootstrap"])


def test_no_layer_below_app_names_a_step_module():
    """core and security are handed the declarations; they import no step (their floors are below it)."""
    for floor in ("core", "security", "render", "probes", "adapters", "pipeline"):
        for path in (ROOT / "gpu_bootstrap" / floor).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    assert not node.module.startswith("gpu_bootstrap.steps"), (path, node.module)


def test_a_step_may_name_a_namespace_of_its_own_for_its_needs():
    """A need's scope is a key of rbac.namespaces(); a step whose section has a namespace declares its key
    (`scopes`), and its Role lands there, with no edit of security/rbac.py."""
    from dataclasses import replace
    from tests.toy_step import DECLARATION as toy
    own = replace(toy, needs=lambda config: {rbac_rules.WRITE: [rbac_rules.need("", "configmaps", rbac_rules.APPLY,
                                                                                 "toy")]},
                  scopes=lambda config: {"toy": "toy-namespace"})
    found = rbac.rules("up", config(), [own])
    assert [r["resources"] for r in found.namespaced["toy-namespace"]] == [["configmaps"]]
