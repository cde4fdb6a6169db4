"""The simulator's inputs read directly (no replay): every limit accepted exactly at its value and refused one
above, empty and fractional values, the models a pod allows, files that are not there, a byte-order mark before
bad bytes; Kubernetes quantities as numbers and as exact whole units rounded up; pods and nodes from API objects
(a limit standing in for a request, sidecars, overhead, the GPU model label)."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpu_bootstrap.core.errors import ConfigError
from gpu_bootstrap.sim import trace
from gpu_bootstrap.sim.engine import Node, Pod

pytestmark = pytest.mark.unit

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"


def write(tmp_path: Path, text, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def refusal(call, *args) -> str:
    with pytest.raises(ConfigError) as raised:
        call(*args)
    return raised.value.message.replace(str(args[0]), "F")


def test_nodes_at_every_limit_are_read(tmp_path):
    rows = "a,10000000,67108864,64,H100\nb, 1.9 ,0,0,\nc,1000,1000,1\n"
    assert trace.load_nodes(write(tmp_path, NODE_HEADER + rows)) == [
        Node("a", 10_000_000, 67_108_864, 64, "H100", (("nvidia.com/gpu.product", "H100"),)),  # the model is a label
        Node("b", 1, 0, 0, ""), Node("c", 1000, 1000, 1, "")]


@pytest.mark.parametrize("row, message", [
    ("a,10000001,1,1,", "F:2: column cpu_milli is '10000001', more than the limit 10,000,000"),
    ("a,1,67108865,1,", "F:2: column memory_mib is '67108865', more than the limit 67,108,864"),
    ("a,1,1,65,", "F:2: column gpu is '65', more than the limit 64"),
    ("a,1,1,-1,", "F:2: column gpu is negative ('-1')"),
    ("a,1,1,eight,", "F:2: column gpu is 'eight', not a number"),
    ("a,1,1,," , "F:2: column gpu is '', not a number"),
    ("a,1,1,0,", "F: no node in the list has a GPU"),
])
def test_a_bad_node_row_is_refused_with_its_line(tmp_path, row, message):
    assert refusal(trace.load_nodes, write(tmp_path, NODE_HEADER + row + "\n")) == message


def test_gpus_in_all_up_to_the_limit_are_read(tmp_path):
    full = trace.MAX_TOTAL_GPUS // 64
    rows = "".join(f"n{i},1,1,64,\n" for i in range(full)) + f"last,1,1,{trace.MAX_TOTAL_GPUS - 64 * full},\n"
    assert sum(n.gpus for n in trace.load_nodes(write(tmp_path, NODE_HEADER + rows))) == 100_000


def test_pods_read_with_their_models_and_an_empty_share(tmp_path):
    rows = "p,1000,10,1,1000,A100|H100|\nq,0,0,0,,\nr,1,1,2,500,|\n"
    untimed = {"start": None, "end": None}  # a list without openb's time columns (simulate --autoscale needs them)
    assert trace.load_pods(write(tmp_path, POD_HEADER + rows)) == [
        {"name": "p", "cpu_milli": 1000, "memory_mib": 10, "num_gpu": 1, "gpu_milli": 1000,
         "models": frozenset({"A100", "H100"}), "affinity": None, **untimed},
        {"name": "q", "cpu_milli": 0, "memory_mib": 0, "num_gpu": 0, "gpu_milli": 0, "models": None, "affinity": None,
         **untimed},
        {"name": "r", "cpu_milli": 1, "memory_mib": 1, "num_gpu": 2, "gpu_milli": 500, "models": None,
         "affinity": None, **untimed}]


@pytest.mark.parametrize("text, message", [
    (POD_HEADER, "F: the pod list is empty"),
    ("name,cpu_milli\np,1\n", "F:1: the pod list lacks column(s) memory_mib, num_gpu, gpu_milli, gpu_spec"),
    (POD_HEADER + "p,1,1,1,1001,\n", "F:2: column gpu_milli is '1001', more than one GPU (1000)"),
    (POD_HEADER + "p,1,1,1,-5,\n", "F:2: column gpu_milli is negative ('-5')"),
    (POD_HEADER + "p,1,1,65,1000,\n", "F:2: column num_gpu is '65', more than the limit 64"),
    (POD_HEADER + "p,1,1,1,inf,\n", "F:2: column gpu_milli is 'inf', not a finite number"),
    (POD_HEADER + "p," + "1" * 50 + ",1,1,1000,\n", "F:2: column cpu_milli is '" + "1" * 40 + "...', more than the "
                                                   "limit 10,000,000"),
    (POD_HEADER + "p," + "1" * 40 + ",1,1,1000,\n", "F:2: column cpu_milli is '" + "1" * 40 + "', more than the "
                                                   "limit 10,000,000"),
    (POD_HEADER + "p," + "1" * 41 + ",1,1,1000,\n", "F:2: column cpu_milli is '" + "1" * 40 + "...', more than the "
                                                   "limit 10,000,000"),
])
def test_a_bad_pod_list_is_refused_with_its_line(tmp_path, text, message):
    assert refusal(trace.load_pods, write(tmp_path, text)) == message


def test_a_file_that_cannot_be_read_or_is_not_utf8_after_a_byte_order_mark(tmp_path):
    assert refusal(trace.load_pods, tmp_path) == "cannot read the pod list F: Is a directory"
    bad = write(tmp_path, b"\xef\xbb\xbf" + POD_HEADER.encode() + b"p,1,1,1,\xff\n")
    assert refusal(trace.load_pods, bad) == "F:2: the pod list is not UTF-8 text (byte 0xff at offset 64)"
    blank_first = write(tmp_path, b"\n\xfe", "blank.csv")
    assert refusal(trace.load_pods, blank_first) == "F:2: the pod list is not UTF-8 text (byte 0xfe at offset 1)"


@pytest.mark.parametrize("text, number", [
    ("2", 2.0), ("100m", 100 * 1e-3), ("1Ki", 1024.0), ("3Mi", 3 * 2.0 ** 20), ("1.5Gi", 1.5 * 2 ** 30),
    ("1Ti", 2.0 ** 40), ("1Pi", 2.0 ** 50), ("1Ei", 2.0 ** 60), ("3k", 3000.0), ("2M", 2e6), ("2G", 2e9),
    ("2T", 2e12), ("2P", 2e15), ("1E", 1e18), (" 250u ", 250 * 1e-6), ("7n", 7 * 1e-9), (5, 5.0)])
def test_quantities_as_numbers(text, number):
    assert trace.quantity(text) == number


@pytest.mark.parametrize("text, milli, whole", [
    ("100m", True, 100), ("1", True, 1000), ("0.5", False, 1), ("1.0001", False, 2), ("1Mi", False, 2 ** 20),
    ("1e3", False, 1000), ("1E", False, 10 ** 18), ("1n", True, 1), ("2Gi", False, 2 ** 31), (0, False, 0),
    ("1.5k", True, 1_500_000), ("1Ki", False, 1024), ("1Ti", False, 2 ** 40), ("1Pi", False, 2 ** 50),
    ("1Ei", False, 2 ** 60), ("1u", True, 1), ("1500u", True, 2), ("2M", False, 2 * 10 ** 6),
    ("3G", False, 3 * 10 ** 9),
    ("1T", False, 10 ** 12), ("1P", False, 10 ** 15), ("7", False, 7)])
def test_amounts_are_exact_and_rounded_up(text, milli, whole):
    assert trace.amount(text, milli=milli) == whole


def test_a_pod_spec_counts_limits_sidecars_init_containers_and_overhead():
    spec = {"containers": [{"resources": {"limits": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1"}}},
                           {"resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "4"}}}],
            "initContainers": [{"restartPolicy": "Always", "resources": {"requests": {"cpu": "100m",
                                                                                      "memory": "64Mi"}}},
                               {"resources": {"requests": {"cpu": "8", "memory": "2Gi"}}}],
            "overhead": {"cpu": "50m", "memory": "16Mi"}}
    pod = trace.pod_from_spec(spec)
    # app containers 2 + 0.5 cores plus the sidecar 0.1 = 2.6; the init container needs 8 + the sidecar before it
    assert (pod.cpu, pod.memory, pod.gpus) == (8100 + 50, 2048 + 64 + 16, 1)
    assert (pod.nonzero_cpu, pod.nonzero_memory) == (8100 + 50, 2048 + 64 + 16)
    assert trace.pod_requests(spec) == (8150, 2128, 1)
    bare = trace.pod_from_spec({"containers": [{}]}, extended="example.com/gpu", models=frozenset({"A"}))
    assert bare == Pod(0, 0, 0, frozenset({"A"}), 100, 200)
    in_bytes = trace.pod_from_spec({"containers": [{"resources": {"requests": {"memory": "1Ki",
                                                                              "example.com/gpu": 2}}}]},
                                   memory_unit=1, extended="example.com/gpu")
    assert (in_bytes.memory, in_bytes.gpus, in_bytes.nonzero_memory) == (1024, 2, 1024)


@pytest.mark.parametrize("labels, model", [
    ({"nvidia.com/gpu.product": "H100", "nvidia.com/gpu.model": "other"}, "H100"),
    ({"nvidia.com/gpu.product": "", "nvidia.com/gpu.model": "A100"}, "A100"),
    ({}, ""), (None, "")])
def test_a_node_object_gives_its_allocatable_and_gpu_model(labels, model):
    node = {"metadata": {"name": "n", "labels": labels},
            "status": {"allocatable": {"cpu": "7910m", "memory": "32Gi", "nvidia.com/gpu": "4"}}}
    assert trace.node_from_object(node) == Node("n", 7910, 32768, 4, model, tuple(sorted((labels or {}).items())))
    assert trace.node_from_object({"metadata": {"name": "e"}}) == Node("e", 0, 0, 0, "")


def test_a_file_of_exactly_the_size_limit_is_read(tmp_path):
    """32 MiB to the byte: rows whose gpu_spec is padded with blanks (under the csv module's field limit)."""
    row = "p,1,1,1,1000," + " " * 100_000 + "\n"
    count, rest = divmod(trace.MAX_FILE_BYTES - len(POD_HEADER), len(row))
    text = POD_HEADER + row * count + "p,1,1,1,1000," + " " * (rest - len("p,1,1,1,1000,\n")) + "\n"
    assert len(text.encode()) == trace.MAX_FILE_BYTES
    assert len(trace.load_pods(write(tmp_path, text))) == count + 1


def test_a_malformed_quantity_is_refused_not_read_as_another():
    import decimal
    with pytest.raises(decimal.InvalidOperation):
        trace.amount("1mm")
    with pytest.raises(ValueError):
        trace.quantity("1mm")


def test_a_node_object_without_memory_has_none_in_any_unit():
    assert trace.node_from_object({"metadata": {"name": "e"}}, memory_unit=1) == Node("e", 0, 0, 0, "")
