"""`python -m gpu_bootstrap.render.versions_table` prints the tables of docs/supported-versions.md, and
nothing when the module is only imported."""
from __future__ import annotations

import importlib
import runpy
import sys

import pytest

from gpu_bootstrap.render import versions_table

pytestmark = pytest.mark.unit


def test_running_the_module_prints_the_tables_and_importing_it_prints_nothing(capsys):
    sys.modules.pop("gpu_bootstrap.render.versions_table", None)
    importlib.import_module("gpu_bootstrap.render.versions_table")
    assert capsys.readouterr().out == ""
    sys.modules.pop("gpu_bootstrap.render.versions_table", None)
    runpy.run_module("gpu_bootstrap.render.versions_table", run_name="__main__")
    printed = capsys.readouterr().out
    assert printed == versions_table.markdown() and "| 1.25 | " in printed
