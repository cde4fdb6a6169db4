"""Fuzzing the config file through the real CLI (`up --dry-run --offline`, in-process): random YAML-able documents,
mutated copies of examples/*.yaml and byte-level damage. Whatever the file holds, the answer is a plan (exit 0), a
step's own typed failure (exit 1, e.g. a release not validated for the Kubernetes version), or exit 2 naming the file
(with its line when there is one) and the field; never a traceback or an internal error.

Deterministic (derandomize=True, no example database) and bounded, so that CI runs the same examples every time."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings, strategies as st
from pydantic import BaseModel
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.core.config import Config
from tests.tools import FUZZ_EXAMPLES

pytestmark = pytest.mark.unit  # host-free: the fast loop (pytest -m unit)

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


def _field_names(model: type[BaseModel], names: set) -> set:
    for name, field in model.model_fields.items():
        names.add(field.alias or name)
        for arg in (getattr(field.annotation, "__args__", ()) or (field.annotation,)):
            for inner in (getattr(arg, "__args__", ()) or (arg,)):
                if isinstance(inner, type) and issubclass(inner, BaseModel) and inner is not model:
                    _field_names(inner, names)
    return names


KEYS = sorted(_field_names(Config, set()))
SCALARS = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=12) |
           st.sampled_from(["", "~", "-1", "0", "1e400", "node5", "node 6", "10.0.0.1", "::1", "root", "v24.6.2",
                            "v26.7.0", "auto", "none", "time-slicing", "mig", "MostAllocated",
                            "RequestedToCapacityRatio", "nvidia.com/gpu", "NoSchedule", "all", "sample", "strict",
                            "accept-new", "/", "./charts/x.tgz", "a" * 300]))
KEY = st.sampled_from(KEYS) | st.text(max_size=8)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEY, inner, max_size=4),
                      max_leaves=16)
DOCUMENTS = st.dictionaries(KEY, VALUES, max_size=6) | VALUES


def plan(tmp_path: Path, content: bytes):
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_bytes(content)
    result = runner.invoke(app, ["up", "--dry-run", "--offline", "--allow-incomplete", "--kube-version", "1.24", "-c", str(config),
                                 "--log-file", str(tmp_path / "log")])
    return config, result


def check(config: Path, result) -> None:
    output = result.output
    assert "Traceback" not in output and "internal error" not in output, output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 1, 2), (result.exit_code, output)
    error = next((line for line in output.splitlines() if line.startswith("error: ")), "")
    if result.exit_code == 1:
        assert re.match(r"error: \[[a-z-]+\] ", error), output  # a step failed, and says which
    if result.exit_code == 2:
        # the file, its line when the problem is at one, and what is wrong: `FILE:LINE: field.path: message`
        assert re.match(rf"error: {re.escape(str(config))}(:\d+)?: \S", error), output


def dump(document) -> bytes:
    return yaml.safe_dump(document, allow_unicode=True, sort_keys=False).encode()


@FUZZ
@given(document=DOCUMENTS)
@example(document={"nodes": [{"name": "node5", "port": 1e400}]})
@example(document={"nodes": [{"name": "node5"}], "scheduler": {"shape": [{"utilization": -1, "score": 11}]}})
def test_random_documents_are_planned_or_refused_by_field(tmp_path, document):
    check(*plan(tmp_path, dump(document)))


def _paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, path + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, path + (index,))


@st.composite
def mutated_examples(draw):
    document = yaml.safe_load(draw(st.sampled_from(EXAMPLES)).read_text())
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(document))))
        if not path:
            document = draw(VALUES) if draw(st.booleans()) else document
            continue
        parent = document
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "add", "wrap"]))
        if action == "replace":
            parent[path[-1]] = draw(VALUES)
        elif action == "delete":
            del parent[path[-1]]
        elif action == "wrap":
            parent[path[-1]] = [parent[path[-1]]] if draw(st.booleans()) else {"x": parent[path[-1]]}
        elif isinstance(parent[path[-1]], dict):
            parent[path[-1]][draw(KEY)] = draw(VALUES)
        elif isinstance(parent[path[-1]], list):
            parent[path[-1]].append(draw(VALUES))
    return document


@FUZZ
@given(document=mutated_examples())
def test_mutated_examples_are_planned_or_refused_by_field(tmp_path, document):
    check(*plan(tmp_path, dump(document)))


@st.composite
def damaged_examples(draw):
    data = bytearray(draw(st.sampled_from(EXAMPLES)).read_bytes())
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["insert", "delete", "byte"]))
        if action == "insert":
            data[at:at] = draw(st.sampled_from([b":", b"-", b" ", b"\n", b"\t", b"[", b"{", b"&a ", b"*a", b"!!",
                                                b"'", b'"', b"#", b"\xff", b"\xc3", b"\x00"]) | st.binary(max_size=6))
        elif action == "delete":
            del data[at:at + draw(st.integers(1, 40))]
        elif at < len(data):
            data[at] = draw(st.integers(0, 255))
    return bytes(data)


@FUZZ
@given(content=damaged_examples())
@example(content=b"nodes: &a [*a]\n")
@example(content=b"nodes: [{name: node5}]\ngpu_operator:\n  values: &v {x: *v}\n")
@example(content=b"nodes: " + b"[" * 5000 + b"]" * 5000 + b"\n")
@example(content=b"nodes:\n  - name: node5\n# caf\xe9\n")
def test_damaged_example_files_are_planned_or_refused_with_their_line(tmp_path, content):
    check(*plan(tmp_path, content))


@pytest.mark.parametrize("content, message", [
    (b"nodes: &a [*a]\n", "gpu-bootstrap.yaml:1: nodes[0]: a YAML alias refers to a node that contains it"),
    (b"nodes: [{name: node5}]\ngpu_operator:\n  values: &v {x: *v}\n",
     "gpu-bootstrap.yaml:3: gpu_operator.values.x: a YAML alias refers to a node that contains it"),
    (b"nodes: " + b"[" * 5000 + b"]" * 5000 + b"\n", "gpu-bootstrap.yaml: the YAML is nested too deeply"),
    (b"nodes:\n  - name: node5\n# caf\xe9\n", "gpu-bootstrap.yaml:3: the config file is not UTF-8 text (byte 0xe9"),
], ids=["self-alias", "values-alias", "deep", "latin-1"])
def test_what_the_fuzzing_found_is_exit_2_with_file_line_and_field(tmp_path, content, message):
    _, result = plan(tmp_path, content)
    assert result.exit_code == 2 and message in result.output, result.output


def test_aliases_that_do_not_loop_still_work(tmp_path):
    _, result = plan(tmp_path, b"nodes:\n  - &n {name: node5}\nnode_prep:\n  labels: &l {team: ml}\n"
                               b"validate:\n  nodes: all\n")
    assert result.exit_code in (0, 1) and "internal error" not in result.output, result.output
