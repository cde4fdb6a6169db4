"""Every step's plan() as a table: the facts its check read go in, the exact changes come out.

No emulator, no sshd, no helm: plan() is pure, so the context given here has a config and the run's options and no
adapter at all (kube, helm and node facts are None); a plan that reached for one would fail these tests.
"""
from __future__ import annotations

import base64
import datetime
import json

import pytest

from gpu_bootstrap.core import config as cfg
from gpu_bootstrap.core import versions
from gpu_bootstrap.pipeline.context import Context, RunOptions
from gpu_bootstrap.probes.checks import NodeCheck, NodeReport
from gpu_bootstrap.core.refs import Chart, Ref, Verb
from gpu_bootstrap.render import gpu_operator_values as values_render
from gpu_bootstrap.security import pod_security
from gpu_bootstrap.render import scheduler as scheduler_render
from gpu_bootstrap.core.outcomes import FAIL, PASS, SKIP, WARN
from gpu_bootstrap.render import admission as admission_render
from gpu_bootstrap.render import certificates as certs
from gpu_bootstrap.steps.admission import Admission, AdmissionFacts
from gpu_bootstrap.steps.admission_opa import AdmissionOpa, OpaFacts, decide
from gpu_bootstrap.steps.binpack_scheduler import BinpackScheduler, SchedulerFacts
from gpu_bootstrap.steps.gpu_operator import GpuOperator, OperatorFacts
from gpu_bootstrap.steps.monitoring import Monitoring, MonitoringFacts
from gpu_bootstrap.render import monitoring as monitoring_render
from gpu_bootstrap.steps import shipped
from gpu_bootstrap.steps.node_prep import NodePrep, NodePrepFacts
from gpu_bootstrap.steps.preflight import Preflight, judge
from gpu_bootstrap.steps.validate import Validate, ValidateFacts, pinned_to

PLAYBOOK = shipped()  # the steps this version ships, in the default playbook's order
NODE_PREP_RECORD = "gpu-bootstrap.io/node-prep"


def config(**sections) -> cfg.Config:
    return cfg.Config.model_validate({"nodes": [{"name": "node5"}, {"name": "node6"}], **sections})


def context(conf: cfg.Config, playbook=PLAYBOOK) -> Context:
    return Context(config=conf, kube=None, helm=None, node_facts=None, gate=None, reporter=None,
                   options=RunOptions(playbook=tuple(playbook)))


def node(name: str, labels=None, taints=None, annotations=None, version="41") -> dict:
    meta = {"name": name, "labels": dict(labels or {}), "resourceVersion": version}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": {"taints": list(taints or [])}}


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


# --- preflight ---------------------------------------------------------------------------------------------------------
def report(name: str, **statuses) -> NodeReport:
    ids = ("ssh", "nvidia-driver", "nouveau", "container-runtime", "nvidia-container-toolkit")
    return NodeReport(name, [NodeCheck(i, statuses.get(i.replace("-", "_"), PASS), f"{i} message") for i in ids])


@pytest.mark.unit
@pytest.mark.parametrize("reports, source, status, message", [
    ({}, "none (offline)", SKIP, "no node facts in an offline run"),
    ({"node5": report("node5")}, "ssh", PASS, "1 GPU node(s) checked (ssh)"),
    ({"node5": report("node5", nouveau=WARN), "node6": report("node6")}, "r.json", PASS,
     "2 GPU node(s) checked (r.json), 1 warning(s) (see 'gpu-bootstrap doctor')"),
    ({"node5": report("node5", nvidia_driver=FAIL)}, "ssh", FAIL,
     "1 node check(s) failed — node5: nvidia-driver: nvidia-driver message"),
])
def test_preflight_judges_the_reports_and_plans_nothing(reports, source, status, message):
    check = judge(reports, source, "no node facts in an offline run")
    assert (check.status, check.message) == (status, message)
    assert check.done is (status != FAIL)
    assert Preflight().plan(context(config()), check) == []


# --- node-prep ---------------------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_node_prep_taints_labels_and_pins_what_it_read():
    nodes = {"node5": node("node5", version="7"), "node6": node("node6", labels={"nvidia.com/gpu.present": "true"},
                                                                taints=[GPU_TAINT],
                                                                annotations={NODE_PREP_RECORD: json.dumps({
                                                                    "labels": {"nvidia.com/gpu.present": {
                                                                        "set": "true", "prev": None}},
                                                                    "taint": GPU_TAINT, "replaced": None},
                                                                    sort_keys=True, separators=(",", ":"))})}
    changes = NodePrep().plan(context(config()), check_of(NodePrepFacts(nodes)))
    record = {"labels": {"nvidia.com/gpu.present": {"prev": None, "set": "true"}}, "replaced": None,
              "taint": GPU_TAINT}
    assert changes == [Change_(Verb.PATCH, Ref.node("node5"),
                               "label nvidia.com/gpu.present=true, taints [nvidia.com/gpu=present:NoSchedule]",
                               "the node lacks the wanted GPU taint/labels",
                               {"metadata": {"labels": {"nvidia.com/gpu.present": "true"},
                                             "annotations": {NODE_PREP_RECORD: json.dumps(record, sort_keys=True,
                                                                                separators=(",", ":"))},
                                             "resourceVersion": "7"},
                                "spec": {"taints": [GPU_TAINT]}})]


@pytest.mark.unit
def test_node_prep_keeps_a_users_taint_beside_ours():
    user = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    changes = NodePrep().plan(context(config(node_prep={"gpu_present_label": False})),
                              check_of(NodePrepFacts({"node5": node("node5", taints=[user])})))
    assert [c.body["spec"]["taints"] for c in changes] == [[user, GPU_TAINT]]


@pytest.mark.unit
def test_node_prep_with_the_taint_turned_off_removes_only_ours():
    record = json.dumps({"labels": {}, "taint": GPU_TAINT, "replaced": None}, sort_keys=True, separators=(",", ":"))
    user = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    tainted = node("node5", taints=[user, GPU_TAINT], annotations={NODE_PREP_RECORD: record})
    changes = NodePrep().plan(context(config(node_prep={"taint": None, "gpu_present_label": False})),
                              check_of(NodePrepFacts({"node5": tainted})))
    assert [(c.summary, c.body["spec"]["taints"], c.body["metadata"]["annotations"]) for c in changes] == [
        ("taints [dedicated=ml:NoSchedule]", [user], {NODE_PREP_RECORD: None})]


@pytest.mark.unit
def test_node_prep_plans_nothing_for_prepared_nodes():
    prepared = NodePrep().plan(context(config()), check_of(NodePrepFacts({})))
    assert prepared == []


# --- gpu-operator --------------------------------------------------------------------------------------------------------
def operator_facts(conf, release: dict, labels=None) -> OperatorFacts:
    plan = values_render.derive([], conf, "v26.7.0", list(PLAYBOOK))
    nodes = {"node5": node("node5", version="12"), "node6": node("node6", version="13")}
    choice = versions.choose(versions.catalogue("gpu-operator"), "1.33.0")
    return OperatorFacts(Chart("gpu-operator", "https://helm.ngc.nvidia.com/nvidia", choice.version), choice.version,
                         plan, nodes, dict(labels or {}), release, "1.33.0", choice)


@pytest.mark.unit
def test_gpu_operator_installs_with_one_derived_value_a_line():
    conf = config()
    facts = operator_facts(conf, {"up_to_date": False, "reason": "not installed", "installed": None})
    [change] = GpuOperator().plan(context(conf), check_of(facts))
    assert (change.verb, change.target, change.summary, change.reason) == (
        Verb.HELM_UPGRADE, Ref("helm", "release", "gpu-operator", "gpu-operator"),
        "install: gpu-operator v26.7.x (v26.7.0)", "newest release NVIDIA validated for Kubernetes 1.33 (1.33-1.37)")
    assert list(change.details) == facts.values.explain() and len(change.details) >= 3
    assert all("←" in line and "\n" not in line for line in change.details)
    assert change.body["values"] == facts.values.merged and change.body["kube_version"] == "1.33.0"
    assert change.body["chart"] == {"ref": "gpu-operator", "repo": "https://helm.ngc.nvidia.com/nvidia",
                                    "version": "v26.7.0"}


@pytest.mark.unit
def test_gpu_operator_clears_a_pending_release_before_upgrading_and_labels_first():
    conf = config()
    labels = {"node6": {"metadata": {"labels": {"nvidia.com/gpu.deploy.driver": "false"}}}}
    facts = operator_facts(conf, {"up_to_date": False, "reason": "release is pending-upgrade", "installed": "v26.7.0",
                                  "pending": "pending-upgrade"}, labels)
    changes = GpuOperator().plan(context(conf), check_of(facts))
    assert [(c.verb, str(c.target), c.summary) for c in changes] == [
        (Verb.PATCH, "Node node6", "label nvidia.com/gpu.deploy.driver=false"),
        (Verb.HELM_RECOVER, "release gpu-operator/gpu-operator", "clear the pending-upgrade state"),
        (Verb.HELM_UPGRADE, "release gpu-operator/gpu-operator",
         "release is pending-upgrade: gpu-operator v26.7.x (v26.7.0)"),
    ]
    assert changes[0].body["metadata"]["resourceVersion"] == "13"


@pytest.mark.unit
def test_gpu_operator_up_to_date_plans_nothing():
    conf = config()
    facts = operator_facts(conf, {"up_to_date": True, "reason": "up to date", "installed": "v26.7.0"})
    assert GpuOperator().plan(context(conf), check_of(facts)) == []


# --- binpack-scheduler -----------------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_binpack_scheduler_creates_updates_and_removes_exactly_the_drifted_objects():
    conf = config()
    desired = scheduler_render.manifests(conf.scheduler, "1.33.0")
    refs = [Ref.of(obj) for obj in desired]
    gone = Ref("apps/v1", "Deployment", "old-scheduler", "kube-system")
    facts = SchedulerFacts(desired, {refs[0]: "missing", refs[-1]: "differs at spec.maxUnavailable"}, [gone])
    changes = BinpackScheduler().plan(context(conf), check_of(facts))
    assert [(c.verb, c.target, c.summary, c.reason) for c in changes] == [
        (Verb.APPLY, refs[0], "create", "missing"),
        (Verb.APPLY, refs[-1], "update", "differs at spec.maxUnavailable"),
        (Verb.DELETE, gone, "remove", "no longer wanted by the config"),
    ]
    assert changes[0].body is desired[0] and changes[2].body is None


@pytest.mark.unit
def test_binpack_scheduler_without_drift_plans_nothing():
    conf = config()
    facts = SchedulerFacts(scheduler_render.manifests(conf.scheduler, "1.33.0"), {}, [])
    assert BinpackScheduler().plan(context(conf), check_of(facts)) == []


# --- validate --------------------------------------------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("playbook, nodes, scheduler, pods", [
    (PLAYBOOK, "all", "gpu-binpack-scheduler", ["node5", "node6"]),
    (PLAYBOOK, "sample", "gpu-binpack-scheduler", ["node5"]),
    (("preflight", "node-prep", "gpu-operator", "validate"), 2, None, ["node5", "node6"]),
])
def test_validate_runs_one_pod_per_chosen_node_after_removing_leftovers(playbook, nodes, scheduler, pods):
    conf = config(validate={"nodes": nodes})
    missing = pod_security.decide("gpu-bootstrap", None, pod_security.RESTRICTED, "validation pods run there")
    changes = Validate().plan(context(conf, playbook), check_of(ValidateFacts(("gpu-bootstrap-validate-old",),
                                                                              missing, (), scheduler)))
    assert changes[0].body["metadata"]["labels"][pod_security.ENFORCE] == "restricted"
    assert [(c.verb, str(c.target)) for c in changes] == [
        (Verb.APPLY, "Namespace gpu-bootstrap"),
        (Verb.DELETE, "Pod gpu-bootstrap/gpu-bootstrap-validate-old"),
        *[(Verb.CREATE, f"Pod gpu-bootstrap/gpu-bootstrap-validate-{n}") for n in pods]]
    for change, name in zip(changes[2:], pods):
        spec = change.body["spec"]
        assert spec.get("schedulerName") == scheduler
        assert spec["affinity"] == pinned_to(name) and "nodeSelector" not in spec  # by name: hostname labels vary
        assert spec["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


@pytest.mark.unit
def test_validate_in_dra_mode_adds_a_pod_whose_gpu_comes_from_a_claim_template():
    """allocation: dra: every node's pod still asks for nvidia.com/gpu (served through the driver's DeviceClass), and
    the first node runs one more whose GPU comes from a ResourceClaimTemplate; leftovers go pods first."""
    conf = config(validate={"nodes": "all"}, gpu_operator={"allocation": "dra"})
    facts = ValidateFacts(("gpu-bootstrap-validate-claim-old",), None, ("gpu-bootstrap-validate-gpu",),
                          "gpu-binpack-scheduler")
    changes = Validate().plan(context(conf, ("gpu-operator", "binpack-scheduler", "validate")), check_of(facts))
    first = conf.nodes[0].name
    assert [(c.verb, str(c.target)) for c in changes] == [
        (Verb.DELETE, "Pod gpu-bootstrap/gpu-bootstrap-validate-claim-old"),
        (Verb.DELETE, "ResourceClaimTemplate gpu-bootstrap/gpu-bootstrap-validate-gpu"),
        *[(Verb.CREATE, f"Pod gpu-bootstrap/gpu-bootstrap-validate-{n.name}") for n in conf.nodes],
        (Verb.CREATE, "ResourceClaimTemplate gpu-bootstrap/gpu-bootstrap-validate-gpu"),
        (Verb.CREATE, f"Pod gpu-bootstrap/gpu-bootstrap-validate-claim-{first}")]
    template, pod = changes[-2].body, changes[-1].body
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert template["spec"]["spec"]["devices"]["requests"] == [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}]
    spec = pod["spec"]
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "gpu-bootstrap-validate-gpu"}]
    assert spec["containers"][0]["resources"] == {"claims": [{"name": "gpu"}]}  # no nvidia.com/gpu: the claim's GPU
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [first]}]}]}
    assert spec["schedulerName"] == conf.scheduler.name
    for change in changes[2:-2]:
        assert change.body["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}


@pytest.mark.unit
def test_validate_with_the_device_plugin_makes_no_claim_template():
    changes = Validate().plan(context(config(validate={"nodes": "all"})), check_of(ValidateFacts((), None)))
    assert all(c.target.kind == "Pod" for c in changes)


# --- admission-opa and admission --------------------------------------------------------------------------------------
NOW = datetime.datetime(2026, 11, 23, tzinfo=datetime.timezone.utc)
SEED = bytes(range(32))


def opa_facts(conf, stored=None, webhook=None, rolled_out=None, namespace="missing", now=NOW):
    cert = decide(conf, stored, now, SEED, rolled_out)
    objects = AdmissionOpa()._objects(context(conf), cert.tls_hash, [])
    drift = {} if stored else {Ref.of(o): "missing"
                               for o in objects}
    return OpaFacts(namespace, objects, drift, [], stored, rolled_out, webhook, now, SEED)


@pytest.mark.unit
def test_admission_opa_creates_its_namespace_a_new_certificate_and_the_server_in_order():
    conf = config()
    changes = AdmissionOpa().plan(context(conf), check_of(opa_facts(conf)))
    assert [(c.verb, str(c.target), c.summary) for c in changes] == [
        (Verb.APPLY, "Namespace gpu-bootstrap-admission", "create"),
        (Verb.APPLY, "Secret gpu-bootstrap-admission/opa-tls", "create"),
        (Verb.APPLY, "ServiceAccount gpu-bootstrap-admission/opa", "create"),
        (Verb.APPLY, "ConfigMap gpu-bootstrap-admission/opa-policy", "create"),
        (Verb.APPLY, "Deployment gpu-bootstrap-admission/opa", "create"),
        (Verb.APPLY, "Service gpu-bootstrap-admission/opa", "create"),
        (Verb.APPLY, "NetworkPolicy gpu-bootstrap-admission/opa", "create"),
        (Verb.APPLY, "PodDisruptionBudget gpu-bootstrap-admission/opa", "create")]
    secret = changes[1].body
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert all("PRIVATE" not in line for c in changes for line in (c.describe(), *c.details))
    tls_hash = changes[4].body["spec"]["template"]["metadata"]["annotations"][admission_render.TLS_HASH]
    assert tls_hash == certs.fingerprint(certs.Stored.from_secret(secret).cert_pem)


@pytest.mark.unit
def test_admission_opa_rerun_reuses_the_secret_and_plans_nothing():
    conf = config()
    stored = certs.Stored.from_secret(decide(conf, None, NOW, SEED, None).secret)
    assert AdmissionOpa().plan(context(conf), check_of(opa_facts(conf, stored, namespace="ours"))) == []


@pytest.mark.unit
def test_admission_opa_rotation_first_makes_the_webhook_trust_both_cas():
    conf = config()
    stored = certs.Stored.from_secret(decide(conf, None, NOW, SEED, None).secret)
    later = NOW + datetime.timedelta(days=350)
    facts = opa_facts(conf, stored, webhook=("MutatingWebhookConfiguration", stored.ca_bundle), namespace="ours",
                      now=later)
    facts = OpaFacts(facts.namespace, facts.objects, {Ref.of(facts.objects[2]): "differs at spec.template.metadata.annotations"}, [],
        stored, None, facts.webhook, later, SEED)
    changes = AdmissionOpa().plan(context(conf), check_of(facts))
    assert [(c.verb, str(c.target), c.summary) for c in changes] == [
        (Verb.PATCH, "MutatingWebhookConfiguration gpu-bootstrap-gpu-pods", "trust the new CA beside the old one"),
        (Verb.APPLY, "Secret gpu-bootstrap-admission/opa-tls", "rotate"),
        (Verb.APPLY, "Deployment gpu-bootstrap-admission/opa", "update")]
    bundle = base64.b64decode(changes[0].body[1]["value"]).decode()
    assert len(certs.split_bundle(bundle)) == 2 and stored.signer.strip() in bundle
    assert changes[0].patch_type == "json" and changes[0].body[0]["op"] == "test"


@pytest.mark.unit
def test_admission_applies_drifted_objects_and_removes_the_other_mode():
    conf = config(admission={"mode": "enforce"})
    desired = [admission_render.webhook_configuration(conf, "1.31.0", "CA")] + admission_render.validating_policy(conf)
    refs = [Ref.of(o) for o in desired]
    old = Ref("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "gpu-bootstrap-gpu-pods")
    facts = AdmissionFacts(desired, {refs[0]: "missing", refs[2]: "missing"}, [old])
    changes = Admission().plan(context(conf), check_of(facts))
    assert [(c.verb, c.target, c.summary) for c in changes] == [
        (Verb.APPLY, refs[0], "create"), (Verb.APPLY, refs[2], "create"), (Verb.DELETE, old, "remove")]
    assert refs[0].kind == "ValidatingWebhookConfiguration"
    assert Admission().plan(context(conf), check_of(AdmissionFacts(desired, {}, []))) == []


# --- monitoring ----------------------------------------------------------------------------------------------------------
def monitoring_facts(conf, target, release: dict, drift=None, leftovers=()) -> MonitoringFacts:
    desired = monitoring_render.objects(target)
    drift = {Ref.of(o): "missing" for o in desired} if drift is None else drift
    choice = versions.choose(versions.catalogue("kube-prometheus-stack"), "1.24.0")
    install = target.mode == "install"
    return MonitoringFacts(target, desired, drift, list(leftovers), target.scrape_values("15s"), "1.24.0",
                           Chart("kube-prometheus-stack", "https://prometheus-community.github.io/helm-charts",
                                 choice.version) if install else None, choice.version if install else "",
                           choice if install else None,
                           monitoring_render.stack_values(conf.monitoring) if install else None, release)


@pytest.mark.unit
def test_monitoring_installs_the_stack_for_the_clusters_kubernetes_then_our_objects():
    conf = config()
    target = monitoring_render.install_target(conf.monitoring, "monitoring.mode: auto: no Prometheus Operator")
    facts = monitoring_facts(conf, target, {"up_to_date": False, "reason": "not installed", "installed": None})
    changes = Monitoring().plan(context(conf), check_of(facts))
    assert [(c.verb, str(c.target)) for c in changes] == [
        (Verb.HELM_UPGRADE, "release monitoring/kube-prometheus-stack"),
        (Verb.APPLY, "PrometheusRule monitoring/gpu-bootstrap-gpu-alerts"),
        *[(Verb.APPLY, f"ConfigMap monitoring/gpu-bootstrap-dashboard-{n}")
          for n in ("overview", "namespaces", "pods", "nodes", "allocation")]]
    helm = changes[0]
    assert (helm.summary, helm.reason) == ("install: kube-prometheus-stack 72.x (72.9.1)",
                                           "newest release whose kubeVersion admits Kubernetes 1.24 "
                                           "(kubeVersion >=1.19.0-0)")
    assert helm.details[0] == "monitoring.mode: auto: no Prometheus Operator"
    # the DCGM exporter's ServiceMonitor values are the gpu-operator step's: that plan shows them, once
    assert not any(line.startswith("dcgmExporter.serviceMonitor=") for line in helm.details)
    assert helm.body["values"]["gpuBootstrap"] == {"installedBy": "gpu-bootstrap"}


@pytest.mark.unit
def test_monitoring_attach_installs_nothing_and_says_what_it_found():
    conf = config(monitoring={"mode": "attach"})
    found = {"metadata": {"name": "k8s", "namespace": "obs"},
             "spec": {"serviceMonitorSelector": {"matchLabels": {"team": "gpu"}}, "ruleSelector": {},
                      "serviceMonitorNamespaceSelector": {}, "ruleNamespaceSelector": {}}}
    target = monitoring_render.attach_target(found, {}, [], "gpu-operator", "monitoring.mode: attach")
    gone = Ref("v1", "ConfigMap", "gpu-bootstrap-dashboard-old", "elsewhere")
    facts = monitoring_facts(conf, target, {}, leftovers=[gone])
    changes = Monitoring().plan(context(conf), check_of(facts))
    assert Verb.HELM_UPGRADE not in {c.verb for c in changes}
    assert changes[0].target == Ref("monitoring.coreos.com/v1", "PrometheusRule", "gpu-bootstrap-gpu-alerts", "obs")
    assert "serviceMonitorSelector team=gpu → the DCGM ServiceMonitor gets team=gpu" in changes[0].details
    assert changes[-1] == Change_(Verb.DELETE, gone, "remove", "no longer wanted by the config", None)


@pytest.mark.unit
def test_monitoring_up_to_date_plans_nothing_and_a_pending_release_is_recovered_first():
    conf = config()
    target = monitoring_render.install_target(conf.monitoring, "why")
    done = monitoring_facts(conf, target, {"up_to_date": True, "reason": "up to date", "installed": "72.9.1"}, {})
    assert Monitoring().plan(context(conf), check_of(done)) == []
    pending = monitoring_facts(conf, target, {"up_to_date": False, "reason": "release is pending-install",
                                              "installed": "72.9.1", "pending": "pending-install"}, {})
    assert [c.verb for c in Monitoring().plan(context(conf), check_of(pending))] == [Verb.HELM_RECOVER,
                                                                                    Verb.HELM_UPGRADE]


# --- helpers -----------------------------------------------------------------------------------------------------------------
def check_of(facts):
    from gpu_bootstrap.pipeline.step import Check
    return Check(WARN, "", facts=facts)


def Change_(verb, target, summary, reason, body):  # noqa: N802 - reads like the dataclass it builds
    from gpu_bootstrap.pipeline.step import Change
    return Change(verb, target, summary, reason, body)
