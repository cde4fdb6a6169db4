"""The JSON Schema of gpu-bootstrap.yaml (generated from the config models; tests/test_docs.py checks the copy
published in docs/): every example config validates against it, what the loader refuses the schema refuses too, and
`init` writes it beside the config with the `# yaml-language-server: $schema=` line editors read."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.cli.commands import app

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parent.parent
CONFIGS = [p for p in sorted((ROOT / "examples").glob("*.yaml"))
           if isinstance(yaml.safe_load(p.read_text()), dict) and "nodes" in yaml.safe_load(p.read_text())]


@pytest.mark.parametrize("example", CONFIGS, ids=lambda p: p.name)
def test_every_example_config_validates_against_the_schema(example):
    jsonschema.validate(yaml.safe_load(example.read_text()), cfg.json_schema())


def test_the_init_config_validates_and_a_typo_does_not():
    document = yaml.safe_load(cfg.EXAMPLE)
    validator = jsonschema.Draft202012Validator(cfg.json_schema())
    assert list(validator.iter_errors(document)) == []
    document["admission"]["certificats"] = "cert-manager"  # extra="forbid": the loader refuses it too
    errors = [e.message for e in validator.iter_errors(document)]
    assert any("certificats" in e for e in errors), errors
    assert "nodes" in cfg.json_schema()["required"]
    described = cfg.json_schema()["$defs"]["AdmissionConfig"]["properties"]["engine"]
    assert described["default"] == "opa" and "OPA webhook" in described["description"]


def test_init_writes_the_schema_beside_the_config_and_names_it(tmp_path):
    path = tmp_path / "cluster-a" / "gpu-bootstrap.yaml"
    path.parent.mkdir()
    result = CliRunner().invoke(app, ["init", str(path)])
    assert result.exit_code == 0, result.output
    first = path.read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=./gpu-bootstrap.schema.json"
    schema = json.loads((path.parent / "gpu-bootstrap.schema.json").read_text())
    from gpu_bootstrap.steps import config_model
    model = config_model()  # the built-in sections and those the steps bring
    assert schema == json.loads(json.dumps(cfg.json_schema(model)))
    cfg.load(path, environ={}, model=model)  # still a valid config
