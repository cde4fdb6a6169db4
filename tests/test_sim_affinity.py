"""Required node affinity in `simulate` (issue 16): GPU pods that ask for GPU memory, product or compute capability
are placed only on nodes whose labels allow them, by the same rules kube-scheduler's NodeAffinity filter applies, and
a pod refused because no *eligible* node has room is not counted as fragmentation.

Host-free: the affinity model, the trace columns, and `simulate` through the CLI on small written traces and on the
real openb trace (../shared/traces) rewritten with the new columns."""
from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
import yaml

from gpu_bootstrap.sim import affinity
from gpu_bootstrap.sim.affinity import NodeAffinity, Requirement
from tests.test_simulate_cli import POD_HEADER, simulate, trace

ROOT = Path(__file__).resolve().parent.parent
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0"}
A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "0"}
T4 = {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.memory": "15360",
      "nvidia.com/gpu.compute.major": "7", "nvidia.com/gpu.compute.minor": "5"}
BARE: dict = {}  # a node GPU feature discovery has not labelled


# --- the operators, as labels.Requirement.Matches ------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("operator, values, labels, expected", [
    ("In", ("a", "b"), {"k": "a"}, True), ("In", ("a", "b"), {"k": "c"}, False), ("In", ("a",), {}, False),
    ("NotIn", ("a", "b"), {"k": "c"}, True), ("NotIn", ("a",), {"k": "a"}, False), ("NotIn", ("a",), {}, True),
    ("Exists", (), {"k": ""}, True), ("Exists", (), {}, False),
    ("DoesNotExist", (), {}, True), ("DoesNotExist", (), {"k": "x"}, False),
    ("Gt", ("40000",), {"k": "81559"}, True), ("Gt", ("40000",), {"k": "40000"}, False),
    ("Gt", ("40000",), {"k": "15360"}, False), ("Gt", ("7",), {}, False), ("Gt", ("7",), {"k": "8.0"}, False),
    ("Gt", ("-1",), {"k": "0"}, True),
    ("Lt", ("8",), {"k": "7"}, True), ("Lt", ("8",), {"k": "8"}, False), ("Lt", ("8",), {"k": "nine"}, False),
    ("Lt", ("8",), {}, False),
])
def test_each_operator_matches_as_kubernetes_does(operator, values, labels, expected):
    assert Requirement("k", operator, values).matches(labels) is expected


@pytest.mark.unit
def test_terms_are_alternatives_and_an_empty_term_matches_nothing():
    memory = Requirement("nvidia.com/gpu.memory", "Gt", ("40000",))
    hopper = Requirement("nvidia.com/gpu.compute.major", "Gt", ("8",))
    both = NodeAffinity(((memory, hopper),))
    either = NodeAffinity(((hopper,), (memory,)))
    assert [both.matches(n) for n in (H100, A100, T4)] == [True, False, False]
    assert [either.matches(n) for n in (H100, A100, T4)] == [True, True, False]
    assert not NodeAffinity(((),)).matches(H100) and not NodeAffinity(()).matches(H100)
    assert NodeAffinity(((), (memory,))).matches(A100)


# --- the text trace files carry ------------------------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("text, expected", [
    ("nvidia.com/gpu.memory>40000", [[("nvidia.com/gpu.memory", "Gt", ("40000",))]]),
    ("nvidia.com/gpu.compute.major<8", [[("nvidia.com/gpu.compute.major", "Lt", ("8",))]]),
    ("nvidia.com/gpu.product=Tesla-T4", [[("nvidia.com/gpu.product", "In", ("Tesla-T4",))]]),
    ("nvidia.com/gpu.product==Tesla-T4", [[("nvidia.com/gpu.product", "In", ("Tesla-T4",))]]),
    ("nvidia.com/gpu.family!=volta", [[("nvidia.com/gpu.family", "NotIn", ("volta",))]]),
    ("nvidia.com/gpu.product in (NVIDIA-H100-80GB-HBM3, NVIDIA-H100-PCIe)",
     [[("nvidia.com/gpu.product", "In", ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"))]]),
    ("zone notin (a,b),nvidia.com/mig.capable,!example.com/reserved",
     [[("example.com/reserved", "DoesNotExist", ()), ("nvidia.com/mig.capable", "Exists", ()),
       ("zone", "NotIn", ("a", "b"))]]),  # a conjunction, in one canonical order
    ("b in (y,x,y),a=1", [[("a", "In", ("1",)), ("b", "In", ("x", "y"))]]),  # a set of values
    ("a>1 ; b=x", [[("a", "Gt", ("1",))], [("b", "In", ("x",))]]),
    ("  ", None), ("", None),
])
def test_the_trace_syntax_parses_to_requirements(text, expected):
    parsed = affinity.parse(text)
    if expected is None:
        assert parsed is None
        return
    assert [[(r.key, r.operator, r.values) for r in term] for term in parsed.terms] == expected
    assert affinity.parse(parsed.text()) == parsed  # what a report prints reads back as the same constraint


@pytest.mark.unit
@pytest.mark.parametrize("text, message", [
    ("nvidia.com/gpu.memory>40GB", "needs exactly one integer value"),
    ("nvidia.com/gpu.memory>", "needs exactly one integer value"),
    ("a in ()", "needs at least one value"),
    ("a=1 ;", "an empty term"),
    ("a=1,,b=2", "is not an expression"),
    ("Bad Key=1", "is not an expression"),
    ("-bad=1", "is not a label key"),
    ("a=has space", "is not an expression"),
    ("a=-x", "is not a label value"),
    ("a>1>2", "is not an expression"),
])
def test_bad_trace_constraints_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        affinity.parse(text)


@pytest.mark.unit
def test_node_labels_parse_and_are_validated():
    assert affinity.parse_labels("nvidia.com/gpu.memory=81559, nvidia.com/gpu.compute.major=9") == {
        "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.compute.major": "9"}
    assert affinity.parse_labels("") == {} and affinity.parse_labels("a=") == {"a": ""}
    for bad, message in (("a", "is not key=value"), ("a=b c", "is not a label value"), ("/a=1", "not a label key")):
        with pytest.raises(ValueError, match=message):
            affinity.parse_labels(bad)


# --- a Pod object: the example pods' constraints are the ones the trace syntax writes -----------------------------------
@pytest.mark.unit
def test_the_example_pods_constraints_read_the_same_as_their_trace_text():
    pods = {p["metadata"]["name"]: p for p in yaml.safe_load_all((ROOT / "examples/pods/gpu-spec-pods.yaml")
                                                                 .read_text()) if p}
    texts = {
        "cuda-at-least-40gb": "nvidia.com/gpu.memory>40000 ; karpenter.k8s.aws/instance-gpu-memory>40000",
        "cuda-on-h100": "nvidia.com/gpu.product in (NVIDIA-H100-80GB-HBM3,NVIDIA-H100-PCIe) ; "
                      "karpenter.k8s.aws/instance-gpu-name=h100",
        "cuda-compute-8-or-newer": "nvidia.com/gpu.compute.major>7 ; "
                                 "karpenter.k8s.aws/instance-gpu-name in (a10g,a100,h100,h200,l4,l40s)",
    }
    assert set(pods) == set(texts)
    for name, text in texts.items():
        assert affinity.from_pod_spec(pods[name]["spec"]) == affinity.parse(text), name
    admitted = {name: [affinity.parse(text).matches(n) for n in (H100, A100, T4, BARE)]
                for name, text in texts.items()}
    assert admitted == {"cuda-at-least-40gb": [True, True, False, False], "cuda-on-h100": [True, False, False, False],
                        "cuda-compute-8-or-newer": [True, True, False, False]}


@pytest.mark.unit
def test_a_pod_specs_node_selector_joins_every_required_term():
    spec = {"nodeSelector": {"pool": "gpu"}, "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40000"]}]},
            {"matchExpressions": []}]}}}}
    joined = affinity.parse("pool=gpu,nvidia.com/gpu.memory>40000").terms[0]
    assert affinity.from_pod_spec(spec) == NodeAffinity((joined, ()))  # the empty term stays empty: matches nothing
    assert affinity.from_pod_spec({"nodeSelector": {"pool": "gpu"}}) == affinity.parse("pool=gpu")
    assert affinity.from_pod_spec({"containers": []}) is None
    preferred_only = {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}}]}}}
    assert affinity.from_pod_spec(preferred_only) is None  # a preference filters nothing
    with pytest.raises(ValueError, match="must be a list"):
        affinity.from_pod_spec({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Gt", "values": "7"}]}]}}}})
    longest = ".".join(["x" * 63] * 3 + ["x" * 61])  # a DNS subdomain of 253 characters, labels of at most 63
    assert affinity.requirement(longest + "/name", "Exists").key == longest + "/name"
    for bad in (longest + "x/name", "x" * 64 + "/name", "name-" + "x" * 59):
        with pytest.raises(ValueError, match="is not a label key"):
            affinity.requirement(bad, "Exists")
    with pytest.raises(ValueError, match="matchFields"):
        affinity.from_pod_spec({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                    "values": ["n1"]}]}]}}}})


# --- simulate with constrained pods --------------------------------------------------------------------------------------
def _labels(labels: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def labelled_trace(tmp_path: Path, constraint: str) -> tuple[Path, Path]:
    """Four 8-GPU H100 nodes and four 8-GPU T4 nodes (GFD's labels in the labels column), and 1-GPU pods small
    enough that only GPUs run out; every pod carries `constraint` as its node_affinity."""
    nodes = tmp_path / "nodes.csv"
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model", "labels"])
    for index in range(4):
        writer.writerow([f"h100-{index}", 96000, 393216, 8, "H100", _labels(H100)])
        writer.writerow([f"t4-{index}", 96000, 393216, 8, "T4", _labels(T4)])
    nodes.write_text(out.getvalue())
    pods = tmp_path / "pods.csv"
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(POD_HEADER.strip().split(",") + ["node_affinity"])
    for index in range(20):
        writer.writerow([f"p-{index}", 1000, 4096, 1, 1000, "", "LS", "Running", 0, 1, 0, constraint])
    pods.write_text(out.getvalue())
    return nodes, pods


@pytest.mark.unit
@pytest.mark.parametrize("constraint, allocated", [
    ("nvidia.com/gpu.memory>40000", 50.0),  # only the H100s' 32 of 64 GPUs can be used
    ("nvidia.com/gpu.compute.major<8", 50.0),  # only the T4s'
    ("nvidia.com/gpu.product in (NVIDIA-H100-80GB-HBM3,Tesla-T4)", 100.0),
    ("nvidia.com/gpu.memory>90000", 0.0),  # no such GPU
    ("", 100.0),  # unconstrained
])
def test_constrained_pods_use_only_the_nodes_their_affinity_allows(tmp_path, constraint, allocated):
    nodes, pods = labelled_trace(tmp_path, constraint)
    result, document = simulate(tmp_path, "--nodes", str(nodes), "--pods", str(pods), "--seeds", "2",
                                "--workers", "1", "-o", "json")
    assert result.exit_code == 0, result.output
    assert document["population"]["constrained_pods"] == (20 if constraint else 0)
    for policy in document["policies"]:
        assert policy["alloc_pct_at_130"] == allocated, (policy["name"], constraint)
        # a pod refused because the GPUs it may use are gone is not fragmentation, whatever is free elsewhere
        assert set(policy["frag_failures_to_end"].values()) <= {0} and policy["first_frag_failure_pct"] is None
    assert document["bounds"]["offline_ffd"]["alloc_pct_at_130"] == allocated  # the reference obeys it too


@pytest.mark.unit
def test_bad_labels_or_affinity_in_a_trace_is_exit_2_naming_file_line_and_column(tmp_path):
    nodes, pods = labelled_trace(tmp_path, "nvidia.com/gpu.memory>40GB")
    result, _ = simulate(tmp_path, "--nodes", str(nodes), "--pods", str(pods), "--workers", "1")
    assert result.exit_code == 2
    assert f"{pods}:2: column node_affinity: nvidia.com/gpu.memory Gt needs exactly one integer value" in \
        " ".join(result.output.split())
    nodes, pods = labelled_trace(tmp_path, "nvidia.com/gpu.memory>40000")
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model,labels\nn-0,96000,393216,8,H100,gpu memory=8\n")
    result, _ = simulate(tmp_path, "--nodes", str(nodes), "--pods", str(pods), "--workers", "1")
    assert result.exit_code == 2
    assert f"{nodes}:2: column labels:" in " ".join(result.output.split())


@pytest.mark.unit
@pytest.mark.slow
def test_the_openb_gpuspec_trace_gives_the_same_figures_written_as_node_affinity(tmp_path):
    """The affinity-constrained trace excerpt: openb's gpuspec33 pod list (a third of its pods limited to GPU models
    by gpu_spec) rewritten so that each limit is a node_affinity on nvidia.com/gpu.product instead (the node list's
    model column is that label), on every fourth node of the openb inventory. Both routes through the filter must
    place every pod alike: same figures (benchmarks/packing_openb.py compares them on the whole inventory)."""
    rows = list(csv.DictReader(trace("openb_pod_list_gpuspec33.csv").open()))
    constrained = [r for r in rows if r["gpu_spec"]]
    assert len(constrained) > 1000  # the excerpt really is constrained
    rewritten = tmp_path / "gpuspec-as-affinity.csv"
    with rewritten.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, [*rows[0].keys(), "node_affinity"], lineterminator="\n")
        writer.writeheader()
        for row in rows:
            models = row["gpu_spec"].split("|") if row["gpu_spec"] else []
            writer.writerow({**row, "gpu_spec": "", "node_affinity": f"nvidia.com/gpu.product in "
                                                                     f"({','.join(models)})" if models else ""})
    every_fourth = trace("openb_node_list_gpu_node.csv").read_text().splitlines()
    nodes = tmp_path / "nodes-excerpt.csv"  # a quarter of the nodes, every model still there: a quick unit test
    nodes.write_text("\n".join(every_fourth[:1] + every_fourth[1::4]) + "\n")
    args = ("--nodes", str(nodes), "--seeds", "1", "--workers", "1", "-o", "json")
    by_spec = simulate(tmp_path, "--pods", str(trace("openb_pod_list_gpuspec33.csv")), *args)[1]
    by_affinity = simulate(tmp_path, "--pods", str(rewritten), *args)[1]
    models = {line.rsplit(",", 1)[1] for line in every_fourth[1::4]}
    assert {"G2", "G3", "T4", "P100", "V100M16", "V100M32"} <= models, models
    assert by_spec["population"] == {**by_affinity["population"], "source": by_spec["population"]["source"]}
    for spec_policy, affinity_policy in zip(by_spec["policies"], by_affinity["policies"]):
        assert {k: v for k, v in spec_policy.items() if k != "curve"} == \
            {k: v for k, v in affinity_policy.items() if k != "curve"}
    assert by_spec["bounds"] == by_affinity["bounds"]


# --- status --defrag: a re-created pod goes only where its node affinity lets it ---------------------------------------
@pytest.mark.unit
def test_defrag_moves_a_pod_only_to_nodes_its_affinity_allows():
    from gpu_bootstrap.sim import fragmentation, scoring
    from gpu_bootstrap.sim.engine import Node, Pod

    def node(name: str, labels: dict) -> Node:
        return Node(name, 96000, 393216, 8, labels["nvidia.com/gpu.product"], tuple(sorted(labels.items())))
    big_gpu = affinity.parse("nvidia.com/gpu.memory>40000")
    nodes = [node("h100-a", H100), node("t4-b", T4), node("h100-c", H100)]
    mover = Pod(1000, 4096, 2, affinity=big_gpu)
    profile = scoring.DEFAULT_PROFILE

    def plan(used_on_a: int):
        used = {"h100-a": Pod(0, 0, used_on_a), "t4-b": Pod(0, 0, 4), "h100-c": Pod(1000, 4096, 2)}
        pinned = {"h100-a": "ml/a has no controller", "t4-b": "ml/b has no controller"}
        return fragmentation.defrag(nodes, used, {"h100-c": [("ml/needs-h100", mover)]}, [8], profile, pinned)
    room_on_h100 = plan(used_on_a=6)  # h100-a has 2 free: the pod may go there (t4-b has 4 free, but not for it)
    assert [(d.node, [(m.pod, m.to) for m in d.moves]) for d in room_on_h100.drains] == [
        ("h100-c", [("ml/needs-h100", "h100-a")])]
    no_room = plan(used_on_a=7)  # 1 free on the other H100: the T4's 4 free GPUs do not count for this pod
    assert (no_room.drains, no_room.unmet) == ([], [8])


@pytest.mark.unit
def test_defrag_frees_a_node_the_pending_pod_may_use():
    """A pending 8-GPU pod that needs more than 40 GB per GPU: the least used node is a T4 (one GPU in use), but
    freeing it would not help that pod; the plan drains an H100 instead."""
    from gpu_bootstrap.sim import fragmentation, scoring
    from gpu_bootstrap.sim.engine import Node, Pod

    def node(name: str, labels: dict) -> Node:
        return Node(name, 96000, 393216, 8, labels["nvidia.com/gpu.product"], tuple(sorted(labels.items())))
    nodes = [node("t4-a", T4), node("h100-b", H100), node("h100-c", H100)]
    used = {"t4-a": Pod(1000, 4096, 1), "h100-b": Pod(1000, 4096, 2), "h100-c": Pod(0, 0, 4)}
    movable = {"t4-a": [("ml/small", Pod(1000, 4096, 1))], "h100-b": [("ml/pair", Pod(1000, 4096, 2))]}
    pinned = {"h100-c": "ml/c has no controller"}
    big = affinity.parse("nvidia.com/gpu.memory>40000")
    plain = fragmentation.defrag(nodes, used, movable, [8], scoring.DEFAULT_PROFILE, pinned)
    assert [d.node for d in plain.drains] == ["t4-a"]  # any node will do: the least used
    constrained = fragmentation.defrag(nodes, used, movable, [(8, big)], scoring.DEFAULT_PROFILE, pinned)
    assert [(d.node, [m.to for m in d.moves]) for d in constrained.drains] == [("h100-b", ["h100-c"])]
    assert (constrained.wanted, constrained.unmet) == ([8], [])
    nowhere = fragmentation.defrag(nodes, used, movable, [(8, affinity.parse("nvidia.com/gpu.memory>90000"))],
                                   scoring.DEFAULT_PROFILE, pinned)
    assert (nowhere.drains, nowhere.unmet) == ([], [8])


@pytest.mark.unit
def test_constraints_are_values_equal_only_to_the_same_constraint():
    memory = affinity.parse("nvidia.com/gpu.memory>40000")
    assert memory == affinity.parse(" nvidia.com/gpu.memory > 40000 ") and memory is affinity.parse(memory.text())
    assert memory != affinity.parse("nvidia.com/gpu.memory>30000") and memory != affinity.parse("a>40000")
    assert memory != NodeAffinity(memory.terms + ((),)) and memory != memory.terms and memory != "x"
    assert {memory: 1}[NodeAffinity(memory.terms)] == 1  # a copy finds the same cache entry
    with pytest.raises(AttributeError):  # frozen: a cached hash stays true to its terms
        memory.terms = ()


@pytest.mark.unit
@pytest.mark.parametrize("key, operator, values, message", [
    ("a", "Equals", ["1"], "operator 'Equals' is not one of In, NotIn, Exists, DoesNotExist, Gt, Lt"),
    ("a", "", None, "operator '' is not one of"),
    ("a", "Exists", ["x"], "a Exists takes no values"),
    ("a", "DoesNotExist", ["x"], "a DoesNotExist takes no values"),
    ("a", "Gt", ["1", "2"], "a Gt needs exactly one integer value"),
    ("a", "Lt", [], "a Lt needs exactly one integer value"),
    ("a", "NotIn", [], "a NotIn needs at least one value"),
])
def test_a_pod_specs_bad_requirement_is_refused_with_what_is_wrong(key, operator, values, message):
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": key, "operator": operator, **({} if values is None else {"values": values})}]}]}}}}
    with pytest.raises(ValueError, match=message):
        affinity.from_pod_spec(spec)


@pytest.mark.unit
def test_the_filter_answers_true_or_false_for_a_constrained_pod():
    from gpu_bootstrap.sim.engine import Cluster, Node, Pod
    cluster = Cluster([Node("h100", 96000, 393216, 8, "H100", tuple(sorted(H100.items()))),
                       Node("t4", 96000, 393216, 8, "T4", tuple(sorted(T4.items())))])
    big = Pod(1000, 4096, 1, affinity=affinity.parse("nvidia.com/gpu.memory>40000"))
    assert (cluster.fits(0, big), cluster.fits(1, big)) == (True, False) and cluster.fits(1, big) is False
    assert cluster.eligible(big.affinity) == [True, False] and cluster.free_gpus(affinity=big.affinity) == 8


@pytest.mark.unit
def test_a_live_snapshot_gives_the_schedulable_nodes_with_labels_and_what_runs_on_them():
    """cluster_snapshot reads through anything that lists like the Kubernetes adapter; status's Snapshot does, so no
    cluster is needed: cordoned nodes are left out, finished and unbound pods hold nothing, a bound pod counts."""
    from gpu_bootstrap.app.status import Snapshot
    from gpu_bootstrap.sim import trace as sim_trace
    from gpu_bootstrap.sim.engine import Node, Pod

    def node(name: str, labels: dict, cordoned: bool = False) -> dict:
        return {"metadata": {"name": name, "labels": labels}, "spec": {"unschedulable": True} if cordoned else {},
                "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"}}}

    def pod(name: str, node_name: str | None, phase: str) -> dict:
        return {"metadata": {"name": name, "namespace": "ml"}, "status": {"phase": phase},
                "spec": {**({"nodeName": node_name} if node_name else {}), "containers": [
                    {"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "2"}}}]}}
    snapshot = Snapshot([node("h100", H100), node("t4", T4, cordoned=True), {"metadata": {"name": "bare"}}],
                        [pod("run", "h100", "Running"), pod("done", "h100", "Succeeded"), pod("oom", "h100", "Failed"),
                         pod("wait", None, "Pending"), {"metadata": {"name": "odd"}}], [])
    nodes, running = sim_trace.cluster_snapshot(snapshot)
    assert nodes == [Node("h100", 8000, 65536, 8, H100["nvidia.com/gpu.product"], tuple(sorted(H100.items()))),
                     Node("bare", 0, 0, 0, "")]
    assert running == {"h100": [Pod(1000, 1024, 2)]}
    merged_nodes, merged = sim_trace.cluster_inventory(snapshot)
    assert merged_nodes == nodes and merged == {"h100": Pod(1000, 1024, 2)}
