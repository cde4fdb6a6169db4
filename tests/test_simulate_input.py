"""Bounded, UTF-8 input for `gpu-bootstrap simulate` and for saved preflight reports: bad files are exit 2 with the
file, the line and the field, never a traceback or an unbounded run. Through the real CLI, on real files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.sim import trace
from tests.conftest import SHARED
from tests.nodes.reports import healthy_node

pytestmark = pytest.mark.unit  # host-free: the fast loop (pytest -m unit)

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
GOOD_NODES = NODE_HEADER + "n-0,96000,393216,8,G2\nn-1,96000,393216,8,G2\n"
GOOD_PODS = POD_HEADER + "p-0,4000,16384,1,1000,\np-1,8000,32768,2,1000,\n"


def simulate(tmp_path: Path, nodes: Path, pods: Path):
    result = runner.invoke(app, ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1",
                                 "--workers", "1", "-o", "json", "--log-file", str(tmp_path / "log")])
    return result, " ".join(result.output.split())


def write(path: Path, content) -> Path:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def test_good_small_traces_still_run(tmp_path):
    result, _ = simulate(tmp_path, write(tmp_path / "n.csv", GOOD_NODES), write(tmp_path / "p.csv", GOOD_PODS))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["inventory"]["gpus"] == 16


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    result, _ = simulate(tmp_path, write(tmp_path / "n.csv", b"\xef\xbb\xbf" + GOOD_NODES.encode()),
                         write(tmp_path / "p.csv", GOOD_PODS))
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("which, content, message", [
    ("pods", bytes(range(256)) * 8, "p.csv:2: the pod list is not UTF-8 text (byte 0x80 at offset 128)"),
    ("nodes", GOOD_NODES.encode() + "n-\u00e9,1000,1000,1,G2\n".encode("latin-1"),
     "n.csv:4: the node list is not UTF-8 text (byte 0xe9"),
    ("pods", GOOD_PODS.encode("utf-16"), "p.csv:1: the pod list is not UTF-8 text (byte 0xff at offset 0)"),
], ids=["binary", "latin-1", "utf-16"])
def test_a_binary_or_non_utf8_trace_names_the_file_and_line(tmp_path, which, content, message):
    nodes, pods = write(tmp_path / "n.csv", GOOD_NODES), write(tmp_path / "p.csv", GOOD_PODS)
    write(nodes if which == "nodes" else pods, content)
    result, output = simulate(tmp_path, nodes, pods)
    assert result.exit_code == 2, result.output
    assert message in output and "internal error" not in output and "Traceback" not in output


@pytest.mark.parametrize("which, row, message", [
    ("nodes", "n-2,96000,393216,100000000,G2", "n.csv:4: column gpu is '100000000', more than the limit 64"),
    ("nodes", "n-2,96000,393216,65,G2", "n.csv:4: column gpu is '65', more than the limit 64"),
    ("nodes", "n-2,-96000,393216,8,G2", "n.csv:4: column cpu_milli is negative ('-96000')"),
    ("nodes", "n-2,96000,1e12,8,G2", "n.csv:4: column memory_mib is '1e12', more than the limit 67,108,864"),
    ("nodes", "n-2,1e400,393216,8,G2", "n.csv:4: column cpu_milli is '1e400', not a finite number"),
    ("nodes", "n-2,96000,nan,8,G2", "n.csv:4: column memory_mib is 'nan', not a finite number"),
    ("nodes", "n-2,96000", "n.csv:4: column memory_mib is missing (the row has too few fields)"),
    ("nodes", "n-2,96000,393216,8,G2,\"" + "x" * 200_000 + "\"", "n.csv:4: the node list is not valid CSV: field "
                                                                 "larger than field limit"),
    ("pods", "p-2,20000000,1024,1,1000,", "p.csv:4: column cpu_milli is '20000000', more than the limit 10,000,000"),
    ("pods", "p-2,1000,1024,128,1000,", "p.csv:4: column num_gpu is '128', more than the limit 64"),
    ("pods", "p-2,1000,1024,1,1500,", "p.csv:4: column gpu_milli is '1500', more than one GPU (1000)"),
    ("pods", "p-2,1000,1024," + "9" * 500 + ",1000,", "p.csv:4: column num_gpu is '9999999999999999999999999999999999"
                                                      "999999...', not a finite number"),
], ids=lambda value: value[:40] if isinstance(value, str) else None)
def test_absurd_values_name_the_file_line_and_column(tmp_path, which, row, message):
    nodes = write(tmp_path / "n.csv", GOOD_NODES + (row + "\n" if which == "nodes" else ""))
    pods = write(tmp_path / "p.csv", GOOD_PODS + (row + "\n" if which == "pods" else ""))
    result, output = simulate(tmp_path, nodes, pods)
    assert result.exit_code == 2, result.output
    assert message in output and "internal error" not in output and "Traceback" not in output


def test_too_many_node_rows_or_gpus_in_all_is_refused_before_any_replay(tmp_path):
    rows = trace.MAX_NODE_ROWS + 1
    nodes = write(tmp_path / "n.csv", NODE_HEADER + "".join(f"n-{i},1000,1024,0,\n" for i in range(rows)))
    result, output = simulate(tmp_path, nodes, write(tmp_path / "p.csv", GOOD_PODS))
    assert result.exit_code == 2
    assert f"n.csv:{rows + 1}: the node list has more than 10,000 rows" in output
    full = trace.MAX_TOTAL_GPUS // 64  # this many 64-GPU nodes are allowed, one more is not
    write(nodes, NODE_HEADER + "".join(f"n-{i},96000,393216,64,G2\n" for i in range(full + 1)))
    result, output = simulate(tmp_path, nodes, write(tmp_path / "p.csv", GOOD_PODS))
    assert result.exit_code == 2
    assert f"n.csv:{full + 2}: column gpu: the node list has more than 100,000 GPUs in all" in output


def test_a_trace_file_above_the_size_limit_is_refused_without_reading_it_all(tmp_path):
    pods = tmp_path / "p.csv"
    with pods.open("wb") as handle:
        handle.write(GOOD_PODS.encode())
        handle.truncate(trace.MAX_FILE_BYTES + 1)  # NUL padding: it would be a CSV error if it were parsed
    result, output = simulate(tmp_path, write(tmp_path / "n.csv", GOOD_NODES), pods)
    assert result.exit_code == 2
    assert "p.csv: the pod list is larger than 32 MiB" in output


@pytest.mark.parametrize("name", ["openb_node_list_gpu_node.csv", "openb_node_list_all_node.csv",
                                  "openb_pod_list_default.csv", "openb_pod_list_gpuspec33.csv"])
def test_the_real_openb_traces_are_within_the_limits(name):
    path = SHARED / "traces" / name
    if not path.exists():
        from tests.tools import missing
        missing(f"the openb trace {path} is not present")
    rows = trace.load_nodes(path) if "node" in name else trace.load_pods(path)
    assert len(rows) in (1213, 1523, 8152)


# --- saved preflight reports ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("content, message", [
    (b"\x89PNG\r\n\x1a\n\x00\x00", "report.json:1 is not UTF-8 text (byte 0x89 at offset 0)"),
    (json.dumps({"nodes": [healthy_node("gpu-node-1")]}, indent=1).encode().replace(b"Ubuntu", b"\xdcbuntu"),
     "report.json:9 is not UTF-8 text (byte 0xdc at offset 122)"),
    (b"[" * 100_000, "report.json is not valid JSON"),
    (json.dumps({"nodes": [{**healthy_node("gpu-node-1"), "name": ["gpu-node-1"]}]}).encode(),
     "report.json: nodes[0].name: ['gpu-node-1'] is not of type 'string'"),
], ids=["binary", "latin-1", "deep", "name-list"])
def test_a_binary_or_malformed_preflight_report_is_a_clear_config_error(tmp_path, content, message):
    report = write(tmp_path / "report.json", content)
    result = runner.invoke(app, ["up", "--dry-run", "--offline", "-c", str(ROOT / "examples" / "minimal.yaml"),
                                 "--preflight-report", str(report), "--log-file", str(tmp_path / "log")])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert message in output and "internal error" not in output and "Traceback" not in output
