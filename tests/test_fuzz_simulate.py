"""Fuzzing `gpu-bootstrap simulate`'s CSV inputs through the real CLI (in-process, one seed, one worker): random
bytes, random rows of plausible and absurd cells, missing and extra columns, huge numbers and non-UTF-8 bytes. The
answer is a report (exit 0) or exit 2 naming the file and, when a row is at fault, its line; never a traceback.

Deterministic (derandomize=True, no example database) and bounded, so that CI runs the same examples every time."""
from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings, strategies as st
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.sim.trace import NODE_COLUMNS, POD_COLUMNS
import pytest
from tests.tools import FUZZ_EXAMPLES

pytestmark = pytest.mark.unit  # host-free: the fast loop (pytest -m unit)

runner = CliRunner()
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
GOOD_NODES = b"sn,cpu_milli,memory_mib,gpu,model\nn-0,96000,393216,8,G2\nn-1,16000,122880,2,T4\n"
GOOD_PODS = b"name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np-0,4000,16384,1,1000,\np-1,8000,32768,2,1000,\n"
WHOLE_FILE = ("no node in the list has a GPU", "the pod list is empty", "has no GPU pods for this track",
              "larger than 32 MiB")

CELLS = (st.sampled_from(["", "0", "1", "2", "8", "64", "65", "1000", "1001", "-1", "-0", "0.5", "1.5", "1e3", "1e12",
                          "1e400", "-1e400", "nan", "inf", "-inf", "0x10", "1_000", " 8 ", "\u0668", "G2", "T4|G2",
                          "|", "x", "99999999999999999999999999"]) |
         st.integers(-10 ** 30, 10 ** 30).map(str) | st.text(max_size=6))


@st.composite
def csv_files(draw, columns: tuple) -> bytes:
    header = list(columns)
    if draw(st.booleans()):  # missing, extra or reordered columns
        header = draw(st.lists(st.sampled_from([*columns, "qos", "extra", ""]), max_size=8, unique=True))
    rows = draw(st.lists(st.lists(CELLS, min_size=0, max_size=len(header) + 1), max_size=6))
    text = "\n".join(",".join(row) for row in [header, *rows]) + draw(st.sampled_from(["", "\n", "\r\n"]))
    data = bytearray(text.encode())
    if draw(st.integers(0, 4)) == 0:  # a byte that is not UTF-8 (or a BOM) somewhere
        data[draw(st.integers(0, len(data))):0] = draw(st.sampled_from([b"\xff", b"\xe9", b"\xc3", b"\x80", b"\x00",
                                                                         b"\xef\xbb\xbf"]))
    return bytes(data)


def simulate(tmp_path: Path, nodes: bytes, pods: bytes, *extra: str):
    node_file, pod_file = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    node_file.write_bytes(nodes)
    pod_file.write_bytes(pods)
    result = runner.invoke(app, ["simulate", "--nodes", str(node_file), "--pods", str(pod_file), "--seeds", "1",
                                 "--workers", "1", "-o", "json", *extra, "--log-file", str(tmp_path / "log")])
    output = result.output
    assert "Traceback" not in output and "internal error" not in output, output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 2), (result.exit_code, output)
    if result.exit_code == 0:
        assert json.loads(result.stdout)["inventory"]["gpus"] > 0
        return
    error = next(line for line in output.splitlines() if line.startswith("error: "))
    files = f"({re.escape(str(node_file))}|{re.escape(str(pod_file))})"
    if any(text in error for text in WHOLE_FILE):
        assert re.match(rf"error: {files}: ", error), error
    else:
        assert re.match(rf"error: {files}:\d+: ", error), error  # the row's line, then what is wrong with it


@FUZZ
@given(nodes=csv_files(NODE_COLUMNS), track=st.sampled_from(["A", "B"]))
@example(nodes=GOOD_NODES + b"n-2,96000,393216,100000000,G2\n", track="A")
@example(nodes=GOOD_NODES + b"n-2,96000,393216,8,G2,\"" + b"x" * 200_000 + b"\"\n", track="A")
@example(nodes=GOOD_NODES + b"n-2,96000,1e400,8,G2\n", track="A")
@example(nodes=GOOD_NODES + b"n-2,0,0,8,G2\n", track="B")
def test_random_node_lists(tmp_path, nodes, track):
    simulate(tmp_path, nodes, GOOD_PODS, "--track", track)


@FUZZ
@given(pods=csv_files(POD_COLUMNS), track=st.sampled_from(["A", "B"]))
@example(pods=GOOD_PODS + b"p-2,1000,1024,1e400,1000,\n", track="A")
@example(pods=GOOD_PODS + b"p-2\n", track="A")
@example(pods=GOOD_PODS + b"p-2,0,0,64,1,G9\n", track="B")
def test_random_pod_lists(tmp_path, pods, track):
    simulate(tmp_path, GOOD_NODES, pods, "--track", track)


@FUZZ
@given(which=st.sampled_from(["nodes", "pods"]), content=st.binary(max_size=3000))
@example(which="pods", content=bytes(range(256)))
def test_random_bytes(tmp_path, which, content):
    simulate(tmp_path, content if which == "nodes" else GOOD_NODES, content if which == "pods" else GOOD_PODS)
