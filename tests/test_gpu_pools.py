"""gpu-pools: Karpenter v1 NodePools and EC2NodeClasses whose nodes arrive with node-prep's taint and labels.

* renders (a plan without a cluster) validate against Karpenter's released v1 CRD schemas (tests/data/karpenter,
  see its README for version and source), for al2023 and Bottlerocket pools;
* on the Kubernetes API emulator with those CRDs installed (applied by the real kubectl): `up` creates the pools,
  a second `up` changes nothing, teardown removes ours and leaves a NodePool someone else made; without the CRDs
  the step refuses, saying what to do;
* bad `pools` input is one error naming the field and its line, exit 2.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_bootstrap.core import schemas
from gpu_bootstrap.cli.commands import app
from tests.nodes.reports import write_report
from tests.tools import wait_established

runner = CliRunner()
DATA = Path(__file__).resolve().parent / "data" / "karpenter"
CRDS = ("karpenter.sh_nodepools.yaml", "karpenter.k8s.aws_ec2nodeclasses.yaml", "karpenter.kwok.sh_kwoknodeclasses.yaml")
NODES = ["gpu-1", "gpu-2"]
POOLS = """pools:
  - name: gpu
    role: KarpenterNodeRole-demo
    discovery_tag: demo
    requirements: {instance_families: [g6, p5], gpu_names: [l4, h100], capacity_types: [on-demand, spot]}
    disruption: {consolidate_after: 30m, budgets: [{nodes: "1"}, {nodes: "0", schedule: "0 9 * * mon-fri", duration: 8h}]}
  - name: gpu-bottlerocket
    role: KarpenterNodeRole-demo
    discovery_tag: demo
    ami_family: bottlerocket
    limits: {nvidia.com/gpu: 16, cpu: 512}
    expire_after: Never
"""
ONLY_POOLS = ["--skip", "monitoring,gpu-operator,binpack-scheduler,admission-opa,admission,validate"]


def crds() -> list[dict]:
    return [yaml.safe_load((DATA / name).read_text()) for name in CRDS]


def write_config(tmp_path: Path, body: str, kubeconfig: Path | None = None) -> Path:
    path = tmp_path / "gpu-bootstrap.yaml"
    cluster = f"cluster: {{kubeconfig: {kubeconfig}}}\n" if kubeconfig else ""
    path.write_text(cluster + "nodes:\n" + "".join(f"  - name: {n}\n" for n in NODES) + body)
    return path


def invoke(*args: str, tmp_path: Path):
    result = runner.invoke(app, [*args, "-o", "json", "--log-file", str(tmp_path / "log")])
    return result, json.loads(result.stdout) if result.stdout.startswith("{") else None


def step(document: dict, step_id: str) -> dict:
    return next(s for s in document["steps"] if s["id"] == step_id)


def render(tmp_path: Path, body: str = POOLS) -> list[dict]:
    out = tmp_path / "out"
    result, document = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(write_config(tmp_path, body)),
                              "--only", "node-prep,gpu-pools", "--render-dir", str(out), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert step(document, "gpu-pools")["status"] == "planned"
    return [yaml.safe_load(p.read_text()) for p in sorted((out / "gpu-pools").glob("*-apply-*.yaml"))]


@pytest.mark.unit
def test_a_plan_made_without_a_cluster_says_karpenter_was_not_checked(tmp_path):
    """With no cluster, whether Karpenter's CRDs are installed is unknown: the plan renders for karpenter.sh/v1 and
    says it could not check, instead of refusing as if they were absent."""
    result, document = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(write_config(tmp_path, POOLS)),
                              "--only", "node-prep,gpu-pools", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    pools = step(document, "gpu-pools")
    assert pools["status"] == "planned"
    assert "Karpenter's CRDs not checked (no cluster to ask whether it serves" in pools["message"], pools
    assert "4 object(s) to create" in pools["message"]


@pytest.mark.unit
def test_the_offline_adapter_answers_a_crds_discovery_as_unknown():
    from gpu_bootstrap.adapters.offline import OfflineKube
    from gpu_bootstrap.core.errors import ClusterError, Unknown
    from gpu_bootstrap.core.objects import served
    kube = OfflineKube(["gpu-1"], "1.33")
    with pytest.raises(Unknown, match="NodePool in karpenter.sh/v1"):
        served(kube, "karpenter.sh/v1", "NodePool")
    assert served(kube, "apps/v1", "Deployment")
    assert not served(kube, "admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy")  # not before 1.36
    assert not isinstance(Unknown("x"), ClusterError)  # nothing that maps a refusal to "absent" can take it


# --- renders against the released CRD schemas -----------------------------------------------------------------------
@pytest.mark.unit
def test_rendered_pools_are_valid_karpenter_v1_objects(tmp_path):
    documents = render(tmp_path)
    assert [(d["kind"], d["metadata"]["name"]) for d in documents] == [
        ("EC2NodeClass", "gpu"), ("NodePool", "gpu"), ("EC2NodeClass", "gpu-bottlerocket"),
        ("NodePool", "gpu-bottlerocket")]
    known = schemas.crd_schemas(crds())
    for document in documents:
        assert schemas.problems(document, known[(document["apiVersion"], document["kind"])]) == [], document
    families = {d["metadata"]["name"]: d["spec"]["amiSelectorTerms"] for d in documents if d["kind"] == "EC2NodeClass"}
    assert families == {"gpu": [{"alias": "al2023@latest"}], "gpu-bottlerocket": [{"alias": "bottlerocket@latest"}]}


KWOK_POOL = """pools:
  - name: sim
    cloud: kwok
    requirements: {gpu_count: 8, gpu_names: [h100], instance_families: [gpu]}
    limits: {nvidia.com/gpu: 16}
"""


@pytest.mark.unit
def test_a_kwok_pool_differs_from_an_aws_pool_only_in_its_node_class_and_instance_labels(tmp_path):
    """One NodePool rendering: the same pool on KWOK and on AWS differs in the node class it names and the domain
    of the instance GPU labels it selects on, nothing else; both are valid against Karpenter's CRDs."""
    (tmp_path / "kwok").mkdir()
    (tmp_path / "aws").mkdir()
    kwok = render(tmp_path / "kwok", KWOK_POOL)
    aws = render(tmp_path / "aws", KWOK_POOL.replace("cloud: kwok", "role: r\n    discovery_tag: d"))
    known = schemas.crd_schemas(crds())
    for document in kwok + aws:
        assert schemas.problems(document, known[(document["apiVersion"], document["kind"])]) == [], document
    assert [(d["apiVersion"], d["kind"]) for d in kwok] == [("karpenter.kwok.sh/v1alpha1", "KWOKNodeClass"),
                                                            ("karpenter.sh/v1", "NodePool")]
    assert kwok[0]["spec"] == {}
    kwok_pool, aws_pool = kwok[1], aws[1]
    assert kwok_pool["spec"]["template"]["spec"]["nodeClassRef"] == {
        "group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "sim"}
    requirements = kwok_pool["spec"]["template"]["spec"]["requirements"]
    assert {r["key"]: r["values"] for r in requirements if "kwok" in r["key"]} == {
        "kwok.gpu-bootstrap.io/instance-gpu-count": ["7"], "kwok.gpu-bootstrap.io/instance-gpu-manufacturer": ["nvidia"],
        "karpenter.kwok.sh/instance-family": ["gpu"], "kwok.gpu-bootstrap.io/instance-gpu-name": ["h100"]}
    # the KWOK chart's NodePool CRD (Karpenter v1.14.1) refuses any other key of the provider's own domain
    allowed = {"karpenter.kwok.sh/kwoknodeclass", "karpenter.kwok.sh/instance-cpu", "karpenter.kwok.sh/instance-memory",
               "karpenter.kwok.sh/instance-family", "karpenter.kwok.sh/instance-size"}
    assert {r["key"] for r in requirements if r["key"].startswith("karpenter.kwok.sh/")} <= allowed
    as_aws = json.loads(json.dumps(kwok_pool).replace("kwok.gpu-bootstrap.io", "karpenter.k8s.aws")
                        .replace("karpenter.kwok.sh", "karpenter.k8s.aws").replace("KWOKNodeClass", "EC2NodeClass"))
    assert as_aws == aws_pool


@pytest.mark.unit
def test_the_schemas_catch_what_karpenter_refuses(tmp_path):
    """The validation above can fail: a pool Karpenter would refuse is refused by the kept schemas too."""
    pool = next(d for d in render(tmp_path) if d["kind"] == "NodePool")
    known = schemas.crd_schemas(crds())[("karpenter.sh/v1", "NodePool")]
    pool["spec"]["disruption"]["consolidationPolicy"] = "WhenUnderutilized"  # Karpenter v1beta1's value
    pool["spec"]["template"]["spec"]["expireAfter"] = "30 days"
    assert [p.split(":")[0] for p in schemas.problems(pool, known)] == [
        "spec.disruption.consolidationPolicy", "spec.template.spec.expireAfter"]


@pytest.mark.unit
def test_node_templates_carry_exactly_what_node_prep_applies(tmp_path):
    body = POOLS + "node_prep:\n  taint: {key: example.com/gpu, value: 'yes', effect: NoExecute}\n" \
                   "  labels: {team: ml}\n"
    documents = render(tmp_path, body)
    patch = yaml.safe_load(next((tmp_path / "out" / "node-prep").glob("*-patch-node-gpu-1.yaml")).read_text())
    node_prep_taint = patch["spec"]["taints"]
    node_prep_labels = {k: v for k, v in patch["metadata"]["labels"].items()}
    pools = {d["metadata"]["name"]: d["spec"]["template"] for d in documents if d["kind"] == "NodePool"}
    assert pools["gpu"]["spec"]["taints"] == node_prep_taint == [
        {"key": "example.com/gpu", "value": "yes", "effect": "NoExecute"}]
    assert node_prep_labels == {"nvidia.com/gpu.present": "true", "team": "ml"}
    operands = {"nvidia.com/gpu.deploy.driver": "false", "nvidia.com/gpu.deploy.container-toolkit": "false"}
    assert pools["gpu"]["metadata"]["labels"] == {**node_prep_labels, **operands}
    assert pools["gpu-bottlerocket"]["metadata"]["labels"] == {
        **node_prep_labels, **operands, "nvidia.com/gpu.deploy.device-plugin": "false"}


@pytest.mark.unit
def test_disruption_never_consolidates_busy_gpu_nodes(tmp_path):
    pool = next(d for d in render(tmp_path) if d["kind"] == "NodePool")
    assert pool["spec"]["disruption"] == {
        "consolidationPolicy": "WhenEmpty", "consolidateAfter": "30m",
        "budgets": [{"nodes": "1"}, {"nodes": "0", "schedule": "0 9 * * mon-fri", "duration": "8h"}]}
    assert pool["spec"]["limits"] == {"nvidia.com/gpu": "8"}
    assert pool["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpu-bootstrap",
                                          "app.kubernetes.io/component": "gpu-pools"}
    text = (tmp_path / "out" / "gpu-pools" / "02-apply-nodepool-gpu.yaml").read_text()
    assert "#   disruption WhenEmpty after 30m  ← a node running GPU pods is never consolidated" in text


@pytest.mark.unit
def test_no_pools_no_op(tmp_path):
    result, document = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(write_config(tmp_path, "")),
                              tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert step(document, "gpu-pools") == {"id": "gpu-pools", "status": "skipped", "changes": 0,
                                           "message": "no pools configured"}


@pytest.mark.parametrize("body, expected", [
    ("pools:\n  - name: gpu\n    role: r\n    discovery_tag: demo\n    limits: {cpu: 10}\n",
     ":8: pools[0].limits: must cap nvidia.com/gpu"),
    ("pools:\n  - name: gpu\n    role: r\n    discovery_tag: demo\n    expire_after: 30 days\n",
     ":8: pools[0].expire_after: '30 days' is not a Karpenter duration"),
    ("pools:\n  - name: gpu\n    role: r\n", ":5: pools[0].discovery_tag: required key is missing"),
    ("pools:\n  - name: gpu\n    role: r\n    discovery_tag: d\n    ami_family: ubuntu\n",
     ":8: pools[0].ami_family: must be 'al2023' or 'bottlerocket'"),
    ("pools:\n  - name: gpu\n    role: r\n    discovery_tag: d\n    disruption: {budgets: [{nodes: '0', "
     "schedule: '@daily'}]}\n", ":8: pools[0].disruption.budgets[0]: schedule and duration go together"),
    ("pools:\n  - name: gpu\n    cloud: kwok\n    volume_size: 100Gi\n",
     ":7: pools[0].volume_size: an EC2NodeClass field, not used with cloud kwok"),
    ("pools:\n  - name: gpu\n    cloud: gce\n", ":6: pools[0].cloud: must be 'aws' or 'kwok'"),
    ("gpu_operator: {allocation: dra}\npools:\n  - name: gpu\n    cloud: kwok\n",
     ":6: pools[0]: autoscaled pools cannot serve gpu_operator.allocation: dra: Karpenter 1.14 does not provision"),
    ("node_prep: {labels: {karpenter.sh/team: ml}}\npools:\n  - name: gpu\n    role: r\n    discovery_tag: d\n",
     ":4: node_prep.labels: 'karpenter.sh/team' cannot go on a Karpenter node template"),
])
@pytest.mark.unit
def test_bad_pools_name_the_field_and_line(tmp_path, body, expected):
    config = write_config(tmp_path, body)
    result = runner.invoke(app, ["up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(config), "--log-file",
                                 str(tmp_path / "log")])
    assert result.exit_code == 2
    assert f"{config}{expected}" in " ".join(result.output.split()), result.output


# --- on the emulator ----------------------------------------------------------------------------------------------------
@pytest.fixture
def emulator_options():
    return {"kube_version": "1.33.2", "gpu_nodes": NODES, "cpu_nodes": ["cpu-1"]}


def install_crds(cluster) -> None:
    for name in CRDS:
        cluster.kubectl("apply", "--server-side", "-f", str(DATA / name), timeout=120)
    wait_established(lambda name: json.loads(cluster.kubectl("get", f"crd/{name}", "-o", "json").stdout),
                     "nodepools.karpenter.sh", "ec2nodeclasses.karpenter.k8s.aws")


def up(cluster, tmp_path: Path, body: str = POOLS, *extra: str):
    config = write_config(tmp_path, body, cluster.kubeconfig)
    report = write_report(tmp_path / "report.json", NODES)
    return invoke("up", "-c", str(config), "--preflight-report", str(report), *ONLY_POOLS, *extra, tmp_path=tmp_path)


def pools_served(cluster) -> bool:
    return cluster.kubectl("get", "nodepools", check=False).returncode == 0


def pools(cluster) -> dict:
    return {kind: sorted(o["metadata"]["name"] for o in cluster.emu.list(kind))
            for kind in ("nodepools", "ec2nodeclasses")}


@pytest.mark.tools
def test_up_creates_the_pools_and_teardown_removes_only_ours(cluster, tmp_path):
    install_crds(cluster)
    theirs = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "general"},
              "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                                               "name": "default"}, "requirements": []}}}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(theirs))
    result, document = up(cluster, tmp_path)
    assert result.exit_code == 0, result.output
    assert step(document, "gpu-pools")["status"] == "applied" and step(document, "gpu-pools")["changes"] == 4
    assert pools(cluster) == {"nodepools": ["general", "gpu", "gpu-bottlerocket"],
                              "ec2nodeclasses": ["gpu", "gpu-bottlerocket"]}
    live = cluster.emu.get("nodepools", "gpu")
    assert live["spec"]["template"]["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    result, document = up(cluster, tmp_path)
    assert result.exit_code == 0 and step(document, "gpu-pools")["status"] == "unchanged", result.output
    config = write_config(tmp_path, POOLS, cluster.kubeconfig)
    result, document = invoke("teardown", "-c", str(config), "--yes", *ONLY_POOLS, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert step(document, "gpu-pools")["status"] == "undone" and step(document, "gpu-pools")["changes"] == 4
    assert pools(cluster) == {"nodepools": ["general"], "ec2nodeclasses": []}


@pytest.mark.tools
def test_a_dry_run_is_validated_by_the_api_server_and_stores_nothing(cluster, tmp_path):
    install_crds(cluster)
    before = pools(cluster)
    result, document = up(cluster, tmp_path, POOLS, "--dry-run")
    assert result.exit_code == 0, result.output
    assert step(document, "gpu-pools")["status"] == "planned" and step(document, "gpu-pools")["changes"] == 4
    assert pools(cluster) == before == {"nodepools": [], "ec2nodeclasses": []}


@pytest.mark.tools
def test_a_pool_dropped_from_the_config_is_removed_and_a_name_clash_is_refused(cluster, tmp_path):
    install_crds(cluster)
    assert up(cluster, tmp_path)[0].exit_code == 0
    result, document = up(cluster, tmp_path, POOLS.split("  - name: gpu-bottlerocket")[0])
    assert result.exit_code == 0, result.output
    assert pools(cluster) == {"nodepools": ["gpu"], "ec2nodeclasses": ["gpu"]}
    cluster.kubectl("label", "nodepool", "gpu", "app.kubernetes.io/managed-by-")  # now it is someone else's
    result, document = up(cluster, tmp_path)
    assert result.exit_code == 1
    assert document["error"].startswith("[gpu-pools] NodePool gpu exist(s) and gpu-bootstrap did not create them")
    result, document = up(cluster, tmp_path, "")  # no pools: what is still ours goes, what is not stays
    assert result.exit_code == 0 and step(document, "gpu-pools")["status"] == "applied", result.output
    assert pools(cluster) == {"nodepools": ["gpu"], "ec2nodeclasses": []}


@pytest.mark.tools
def test_without_karpenter_crds_the_step_refuses_and_says_what_to_do(cluster, tmp_path):
    result, document = up(cluster, tmp_path)
    assert result.exit_code == 1
    message = document["error"]
    assert message.startswith("[gpu-pools] Karpenter's CRDs are not installed (the cluster serves no EC2NodeClass "
                              "karpenter.k8s.aws/v1 and no NodePool karpenter.sh/v1): install Karpenter first"), message
    assert pools_served(cluster) is False and cluster.emu.list("nodes", label_selector="nvidia.com/gpu.present") == []
    result, document = up(cluster, tmp_path, POOLS, "--dry-run")  # a plan against this cluster says the same
    assert result.exit_code == 1 and "install Karpenter first" in step(document, "gpu-pools")["message"]
    result, document = up(cluster, tmp_path, "")
    assert result.exit_code == 0 and step(document, "gpu-pools")["status"] == "skipped", result.output


# --- Bottlerocket: the operator leaves the driver, toolkit and device plugin to the OS -------------------------------
@pytest.mark.unit
def test_bottlerocket_pools_keep_the_operators_driver_and_device_plugin_off_and_the_plan_says_why(tmp_path):
    body = POOLS + "gpu_operator: {sharing: {mode: time-slicing}}\n"
    out = tmp_path / "out"
    result, document = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(write_config(tmp_path, body)), "--only",
                              "gpu-pools,gpu-operator", "--render-dir", str(out), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    release = yaml.safe_load((out / "gpu-operator" / "release.yaml").read_text())
    derived = [line for line in release["derived_values"] if line.startswith("pools:gpu-bottlerocket:")]
    template = yaml.safe_load((out / "gpu-pools" / "04-apply-nodepool-gpu-bottlerocket.yaml").read_text())
    labels = template["spec"]["template"]["metadata"]["labels"]
    assert [line.split("=")[0] for line in derived] == [
        f"pools:gpu-bottlerocket:{key}" for key, value in labels.items() if key.startswith("nvidia.com/gpu.deploy.")]
    assert all(line.split("  ← ")[0].endswith('="false"') for line in derived)
    assert "bottlerocket #4309" in derived[0] and "operator skips that operand there" in derived[0]
    values = yaml.safe_load((out / "gpu-operator" / "values.yaml").read_text())
    assert "pools:gpu-bottlerocket:nvidia.com/gpu.deploy.driver" not in json.dumps(values)  # labels, not values
    assert any("does not run on Bottlerocket pool(s) gpu-bottlerocket" in w for w in release["warnings"])


@pytest.mark.unit
def test_al2023_pools_keep_only_the_operators_driver_and_toolkit_off(tmp_path):
    body = POOLS.split("  - name: gpu-bottlerocket")[0]
    out = tmp_path / "out"
    result, _ = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(write_config(tmp_path, body)), "--only",
                       "gpu-pools,gpu-operator", "--render-dir", str(out), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    release = yaml.safe_load((out / "gpu-operator" / "release.yaml").read_text())
    assert [line.split("  ← ")[0] for line in release["derived_values"] if line.startswith("pools:")] == [
        'pools:gpu:nvidia.com/gpu.deploy.driver="false"', 'pools:gpu:nvidia.com/gpu.deploy.container-toolkit="false"']
    template = yaml.safe_load((out / "gpu-pools" / "02-apply-nodepool-gpu.yaml").read_text())
    assert "nvidia.com/gpu.deploy.device-plugin" not in template["spec"]["template"]["metadata"]["labels"]


# --- doctor -------------------------------------------------------------------------------------------------------------
def doctor(cluster, tmp_path: Path, body: str = POOLS) -> list[dict]:
    playbook = tmp_path / "pools-only.yaml"
    playbook.write_text("name: pools-only\nsteps: [gpu-pools]\n")
    config = write_config(tmp_path, body, cluster.kubeconfig)
    result = runner.invoke(app, ["doctor", "-c", str(config), "--no-nodes", "--playbook", str(playbook), "-o", "json",
                                 "--log-file", str(tmp_path / "log")])
    return [c for c in json.loads(result.stdout)["checks"] if c["id"] == "gpu-pools"]


def mark_ready(cluster, name: str) -> None:
    status = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                                         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    cluster.kubectl("patch", "nodepool", name, "--subresource=status", "--type=merge", "-p", json.dumps(status))


@pytest.mark.tools
def test_doctor_reports_pool_readiness_unprepared_pool_nodes_and_pods_karpenter_cannot_see(cluster, tmp_path):
    install_crds(cluster)
    assert up(cluster, tmp_path)[0].exit_code == 0
    mark_ready(cluster, "gpu")
    cluster.emu.add_node("ip-10-0-1-5", gpus=1, labels={"karpenter.sh/nodepool": "gpu",
                                                        "nvidia.com/gpu.present": "true"},
                         taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    cluster.emu.add_node("ip-10-0-1-6", gpus=1, labels={"karpenter.sh/nodepool": "gpu"})  # launched before the taint
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waits", "namespace": "default"},
           "spec": {"schedulerName": "gpu-binpack-scheduler", "containers": [
               {"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))  # no scheduler of that name runs: never marked
    checks = doctor(cluster, tmp_path)
    assert [c["status"] for c in checks] == ["pass", "warn", "warn", "warn"], checks
    assert checks[1]["message"].startswith("NodePool(s) not Ready: gpu-bottlerocket (Karpenter has not reported")
    assert checks[2]["message"].startswith("pool node(s) not prepared: ip-10-0-1-6 lacks nvidia.com/gpu.present=true, "
                                           "taint nvidia.com/gpu=present:NoSchedule")
    assert checks[3]["message"] == ("default/waits pending on gpu-binpack-scheduler but not marked Unschedulable, so "
                                    "Karpenter does not see them (is the binpack-scheduler running?)")
    mark_ready(cluster, "gpu-bottlerocket")
    cluster.kubectl("delete", "node", "ip-10-0-1-6")
    cluster.emu.register_scheduler("gpu-binpack-scheduler")  # now the pod is marked; it still lacks the toleration
    cluster.emu.settle()
    checks = doctor(cluster, tmp_path)
    assert [c["status"] for c in checks] == ["pass", "pass", "pass", "warn"], checks
    assert checks[2]["message"] == "1 pool node(s), all with node-prep's taint and labels"
    assert checks[3]["message"] == ("default/waits do not tolerate nvidia.com/gpu=present:NoSchedule, so no pool node "
                                    "can take them")


# --- nodes as a label selector ------------------------------------------------------------------------------------------
@pytest.mark.tools
def test_a_node_that_joins_from_a_pool_is_a_gpu_node_with_its_pools_facts(cluster, tmp_path):
    """`nodes: karpenter.sh/nodepool=gpu`: the node Karpenter launched is found by its label, prepared by node-prep
    (here it arrived without the template's taint, as if launched before the pool carried it), never probed over
    SSH, and its facts come from the pool definition, not "absent"."""
    install_crds(cluster)
    cluster.emu.add_node("ip-10-0-1-7", gpus=1, labels={"karpenter.sh/nodepool": "gpu"})
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text(f"cluster: {{kubeconfig: {cluster.kubeconfig}}}\nnodes: karpenter.sh/nodepool=gpu\n" + POOLS)
    result, document = invoke("up", "-c", str(config), *ONLY_POOLS, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert step(document, "preflight")["status"] == "probed"
    assert "pool definitions for 1 node(s) the selector matched" in step(document, "preflight")["message"]
    assert step(document, "node-prep")["message"] == "1 GPU node(s) tainted and labelled"
    node = cluster.emu.get("nodes", "ip-10-0-1-7")
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in node["spec"]["taints"]
    for name in NODES:  # the emulator's other GPU nodes are not selected: left alone
        assert "nvidia.com/gpu.present" not in (cluster.emu.get("nodes", name)["metadata"].get("labels") or {})
    result = runner.invoke(app, ["doctor", "-c", str(config), "--no-nodes", "-o", "json", "--log-file",
                                 str(tmp_path / "log")])
    [report] = json.loads(result.stdout)["nodes"]
    ssh = report["checks"][0]
    assert (report["name"], ssh["status"]) == ("ip-10-0-1-7", "skip")
    assert ssh["message"] == ("not probed over SSH: launched by Karpenter pool gpu; facts from the pool definition "
                              "(the EKS AL2023 NVIDIA AMI)")


@pytest.mark.unit
def test_a_bad_nodes_selector_names_the_field(tmp_path):
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text("ssh: {user: root}\nnodes: karpenter.sh/nodepool=gpu pool\n")
    result = runner.invoke(app, ["up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(config), "--log-file",
                                 str(tmp_path / "log")])
    assert result.exit_code == 2
    assert f"{config}:2: nodes: 'karpenter.sh/nodepool=gpu pool' is not a label selector" in " ".join(
        result.output.split()), result.output


@pytest.mark.unit
def test_a_selector_no_node_matches_yet_plans_the_pools(tmp_path):
    result, document = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(Path(__file__).resolve().parent.parent /
                                                                        "examples" / "karpenter-pools.yaml"),
                              tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert step(document, "node-prep")["message"] == (
        "no node matches nodes: karpenter.sh/nodepool in (gpu,gpu-bottlerocket) yet (nodes launched from `pools` "
        "arrive with the taint and labels)")
    assert step(document, "gpu-pools")["status"] == "planned"


@pytest.mark.unit
def test_without_node_prep_labels_nfd_follows_an_equality_selector(tmp_path):
    config = tmp_path / "gpu-bootstrap.yaml"
    config.write_text("nodes: karpenter.sh/nodepool=gpu\nnode_prep: {gpu_present_label: false}\n" + POOLS)
    out = tmp_path / "out"
    result, _ = invoke("up", "--dry-run", "--offline", "--allow-incomplete", "-c", str(config), "--only", "node-prep,gpu-operator",
                       "--render-dir", str(out), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    values = yaml.safe_load((out / "gpu-operator" / "values.yaml").read_text())
    assert values["node-feature-discovery"]["worker"]["nodeSelector"] == {"karpenter.sh/nodepool": "gpu"}


@pytest.mark.tools
@pytest.mark.parametrize("limit, share", [("16", 100), ("12008", 0)])
def test_pools_that_can_take_the_cluster_past_1500_nodes_get_the_adaptive_share_from_the_start(cluster, tmp_path,
                                                                                                  limit, share):
    """The cluster has 3 nodes now; a pool of 8-GPU nodes whose limit allows 1,501 of them could take it past 1,500,
    so the scheduler `up` renders scores kube-scheduler's adaptive share from the start (one allowing 2: every node)."""
    install_crds(cluster)
    body = POOLS.replace("    limits: {nvidia.com/gpu: 16, cpu: 512}\n", "").replace(
        "  - name: gpu\n", f"  - name: gpu\n    limits: {{nvidia.com/gpu: {limit}}}\n").replace(
        "instance_families: [g6, p5]", "gpu_count: 8, instance_families: [g6, p5]")
    config = write_config(tmp_path, body, cluster.kubeconfig)
    out = tmp_path / "out"
    result, _document = invoke("up", "--dry-run", "-c", str(config), "--preflight-report",
                               str(write_report(tmp_path / "report.json", NODES)), "--only",
                               "binpack-scheduler,gpu-pools", "--render-dir", str(out), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    rendered = next(yaml.safe_load(p.read_text()) for p in (out / "binpack-scheduler").glob("*configmap*.yaml"))
    assert yaml.safe_load(rendered["data"]["config.yaml"])["percentageOfNodesToScore"] == share
