"""The DRA half of the gpu-operator step (gpu_operator.allocation: dra): NVIDIA's DRA driver as a second release
beside the operator, whose device plugin is then off. Not a step of its own: the operator must stop its device plugin
before the DRA driver serves a node's GPUs, and a move back must remove the DRA driver before the device plugin
returns, so one step orders both (a node must never serve nvidia.com/gpu from both).
"""
from __future__ import annotations

from dataclasses import dataclass

from gpu_bootstrap.adapters import charts
from gpu_bootstrap.core import catalogue, dra
from gpu_bootstrap.core.objects import differences
from gpu_bootstrap.core.refs import Chart
from gpu_bootstrap.pipeline.step import Change, Ref, Verb
from gpu_bootstrap.security.rbac_rules import (APPLY, CLUSTER, DOCTOR, HELM, READ, RUN, WRITE, chart_needs,
    chart_rbac_needs, need)
from gpu_bootstrap.render import dra_driver as render
from gpu_bootstrap.render.values import ValuesPlan, get_path
from gpu_bootstrap.security import pod_security
from gpu_bootstrap.steps.gpu_operator_release import release_state

CHART = "dra-driver-nvidia-gpu"
SWITCH_FLAG = "--allow-allocation-change"
EXPORTER_ROLE = "gpu-bootstrap-dcgm-exporter-dra"  # ours: the operator's exporter reads ResourceSlices
EXPORTER_ACCOUNT = "nvidia-dcgm-exporter"  # the gpu-operator's own ServiceAccount for its DCGM exporter
EXPORTER_WHY = ("the DCGM exporter names the pod of a DRA GPU only by reading ResourceSlices (the kubelet reports DRA "
                "devices by pool and device, not by GPU UUID); gpu-operator v26.7's ClusterPolicy grants it pods only")


@dataclass(frozen=True)
class DraFacts:
    chart: Chart
    version: str
    values: ValuesPlan
    release: dict  # as the operator's: up_to_date, reason, installed, pending
    namespace_plan: object = None  # security.pod_security.NamespaceDecision: its Pod Security label (privileged)


PRIVILEGED_WHY = "the DRA driver's kubelet plugin prepares GPUs on the host (privileged, host paths)"


def facts(ctx, plan: ValuesPlan, status: dict | None) -> DraFacts:
    """What the DRA driver's release is and should be, from the operator's values `plan` and its helm `status`."""
    found, version = chart(ctx)
    values = render.derive(plan, ctx.config, ctx.server_version(), list(ctx.options.playbook))
    section = ctx.config.gpu_operator.dra_driver
    release = release_state(ctx, status, found, version, values.merged if ctx.node_facts.reports() else None,
                            section.release, section.namespace)
    ns_plan = pod_security.decide(section.namespace, ctx.kube.get("v1", "Namespace", section.namespace),
                                  pod_security.PRIVILEGED, PRIVILEGED_WHY, "the DRA driver's namespace")
    return DraFacts(found, version, values, release, ns_plan)


def chart(ctx) -> tuple[Chart, str]:
    """The DRA driver's chart and version: a local chart's own, else the pinned one or the catalogue's default.
    Raises ValueError naming the field when a local chart cannot be read or does not match the pin."""
    section = ctx.config.gpu_operator.dra_driver
    if charts.is_local(section.chart):
        meta = charts.local_chart_metadata(section.chart)
        if meta is None:
            raise ValueError(f"gpu_operator.dra_driver.chart {section.chart} is neither a chart directory nor a .tgz")
        version = str(meta.get("version", ""))
        if section.version and section.version.lstrip("v") != version.lstrip("v"):
            raise ValueError(f"gpu_operator.dra_driver.version {section.version} does not match the local chart "
                             f"{section.chart} (version {version})")
        return Chart(section.chart, None, None), version
    version = section.version or catalogue.chart_default(CHART) or ""
    if section.repository.startswith("oci://"):  # helm takes an OCI chart as one reference, never with --repo
        return Chart(f"{section.repository.rstrip('/')}/{section.chart}", None, version), version
    return Chart(section.chart, section.repository, version), version


def release_status(ctx, selector: str) -> tuple[dict | None, bool]:
    """(helm status of the DRA driver's release, whether it is ours). Outside dra mode it is read only where its
    namespace is gpu-bootstrap's (created for it): a cluster that never ran DRA costs no read, and the roles of
    device-plugin mode need none."""
    section = ctx.config.gpu_operator
    dra_section = section.dra_driver
    if section.allocation != "dra":
        namespace = ctx.kube.get("v1", "Namespace", dra_section.namespace)
        if not namespace or (namespace["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") != \
                "gpu-bootstrap" or dra_section.namespace == section.namespace:
            return None, False
    status = ctx.helm.status(dra_section.release, dra_section.namespace)
    ours = status is not None and ctx.helm.labelled(dra_section.release, dra_section.namespace, selector)
    return status, ours


def device_plugin_on(deployed: dict | None) -> bool:
    """Whether a deployed gpu-operator release runs its device plugin (the chart's default is on)."""
    return deployed is not None and get_path(deployed, "devicePlugin.enabled", True) is not False


def switch_refusal(ctx, operator_status: dict | None, dra_ours: bool) -> str | None:
    """A move between allocation modes on a running cluster, refused unless the flag allows it."""
    section = ctx.config.gpu_operator
    if ctx.options.allow_allocation_change:
        return None
    deployed = (operator_status or {}).get("config") if operator_status else None
    if section.allocation == "dra" and operator_status is not None and device_plugin_on(deployed):
        return (f"gpu_operator.allocation: dra, but the running {section.release} serves GPUs through its device "
                f"plugin: moving a running cluster to DRA stops the device plugin on every GPU node (pods waiting for "
                f"GPUs wait until the DRA driver publishes them; running pods keep theirs) — rerun with "
                f"{SWITCH_FLAG} to move it, or set allocation: device-plugin")
    if section.allocation == "device-plugin" and dra_ours:
        return (f"gpu_operator.allocation: device-plugin, but gpu-bootstrap's DRA driver "
                f"({section.dra_driver.namespace}/{section.dra_driver.release}) serves the GPUs: moving back removes "
                f"it before the device plugin returns (claims of running pods stay; new pods wait meanwhile) — rerun "
                f"with {SWITCH_FLAG} to move it, or set allocation: dra")
    return None


def foreign_driver(device_classes: list[dict], release: str, namespace: str) -> list[str]:
    """NVIDIA's DRA driver installed another way (by hand, another release, the operator's GPUCluster): the
    DeviceClasses of its driver (`gpu.nvidia.com`, `mig.nvidia.com`, ...) that helm's release `namespace/release`
    does not hold. Installing ours beside them would fail on them in helm, or publish every GPU twice."""
    found = []
    for device_class in device_classes:
        meta = device_class.get("metadata") or {}
        notes = meta.get("annotations") or {}
        holder = (notes.get("meta.helm.sh/release-namespace"), notes.get("meta.helm.sh/release-name"))
        if not meta.get("name", "").endswith(".nvidia.com") or holder == (namespace, release):
            continue
        found.append(f"{meta['name']} (helm release {holder[0]}/{holder[1]})" if holder[1] else
                     f"{meta['name']} (not from a helm release)")
    return sorted(found)


def foreign_driver_refusal(ctx) -> str | None:
    """Why the driver is not installed where one runs already (foreign_driver), or None."""
    section = ctx.config.gpu_operator.dra_driver
    other = foreign_driver(ctx.kube.list(dra.API_VERSION, "DeviceClass"), section.release, section.namespace)
    if not other:
        return None
    return (f"NVIDIA's DRA driver is installed already, not by gpu-bootstrap: DeviceClass {', '.join(other[:3])}; a "
            f"second driver would fail on its DeviceClasses or publish every GPU twice — uninstall that driver first "
            f"(gpu-bootstrap installs and manages its own), or use allocation: device-plugin")


def foreign_capacity(advertising: list[str], operator_status: dict | None) -> list[str]:
    """GPU nodes that advertise nvidia.com/gpu (`advertising`) from a device plugin that is not the operator's (which
    this step turns off): DRA must not serve them as well."""
    return [] if operator_status is not None else sorted(advertising)


def upgrade_change(ctx, facts: DraFacts, labels: dict) -> Change:
    """`labels`: the release's metadata labels (who manages it)."""
    section = ctx.config.gpu_operator.dra_driver
    action = "install" if facts.release["installed"] is None else facts.release["reason"]
    body = {"release": section.release, "namespace": section.namespace,
            "chart": {"ref": facts.chart.ref, "repo": facts.chart.repo, "version": facts.chart.version},
            "chart_version": facts.version, "values": facts.values.merged, "derived": facts.values.explain(),
            "warnings": facts.values.warnings, "kube_version": ctx.server_version(),
            "timeout": f"{ctx.config.gpu_operator.wait_timeout}s", "labels": dict(labels),
            "chart_field": "gpu_operator.dra_driver.chart",
            # its crds/ (ComputeDomain, ComputeDomainClique) are the gpu-operator chart's too, which this step applies
            # before the operator: one owner, or the two versions would replace each other on every run
            "skip_crds": True}
    return Change(Verb.HELM_UPGRADE, Ref.release(section.release, section.namespace),
                  f"{action}: NVIDIA DRA driver {facts.version}",
                  "gpu_operator.allocation: dra (the chart beside the operator's ClusterPolicy, not the experimental "
                  "GPUCluster, which a running cluster cannot move to and whose device class serves no nvidia.com/gpu "
                  "requests)", body, details=tuple(facts.values.explain()))


def uninstall_change(ctx, why: str) -> Change:
    section = ctx.config.gpu_operator.dra_driver
    return Change(Verb.HELM_UNINSTALL, Ref.release(section.release, section.namespace),
                  f"uninstall {section.release}", why,
                  {"release": section.release, "namespace": section.namespace,
                   "timeout": f"{ctx.config.gpu_operator.wait_timeout}s"})


def problems(ctx, gpu_counts: dict[str, int | None]) -> list[str]:
    """What keeps DRA from serving the GPU nodes: the kubelet plugin not ready there, or a node whose ResourceSlices
    do not hold the GPUs preflight found (`gpu_counts`: node -> GPUs found, None when unknown)."""
    section = ctx.config.gpu_operator.dra_driver
    out = []
    plugins = [ds for ds in ctx.kube.list("apps/v1", "DaemonSet", section.namespace)
               if ds["metadata"]["name"].endswith("kubelet-plugin")]
    if not plugins:
        out.append(f"the DRA driver's kubelet plugin DaemonSet is not in {section.namespace} yet")
    for ds in plugins:
        status = ds.get("status") or {}
        desired, ready = status.get("desiredNumberScheduled", 0), status.get("numberReady", 0)
        if desired < len(gpu_counts) or ready < desired:
            out.append(f"{ds['metadata']['name']} is ready on {ready} of {len(gpu_counts)} GPU nodes "
                       f"(kubectl -n {section.namespace} describe daemonset {ds['metadata']['name']})")
    published = dra.gpu_devices_by_node(ctx.kube.list(dra.API_VERSION, "ResourceSlice"))
    for name, expected in sorted(gpu_counts.items()):
        found = published.get(name, 0)
        if not found:
            out.append(f"{name} publishes no GPU in a ResourceSlice yet (driver {dra.GPU_DRIVER})")
        elif expected is not None and found != expected:
            out.append(f"{name} publishes {found} GPU(s) in its ResourceSlices, but preflight found {expected}: "
                       f"kubectl -n {section.namespace} logs of its kubelet plugin say which it could not prepare")
    return out


def exporter_objects(namespace: str, labels: dict) -> list[dict]:
    """The ClusterRole and binding that let the operator's DCGM exporter read ResourceSlices (allocation: dra)."""
    rbac = "rbac.authorization.k8s.io/v1"
    return [{"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": EXPORTER_ROLE, "labels": dict(labels)},
             "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
                        "verbs": ["get", "list", "watch"]}]},
            {"apiVersion": rbac, "kind": "ClusterRoleBinding",
             "metadata": {"name": EXPORTER_ROLE, "labels": dict(labels)},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": EXPORTER_ROLE},
             "subjects": [{"kind": "ServiceAccount", "name": EXPORTER_ACCOUNT, "namespace": namespace}]}]


SLICE_POLICY = "gpu-bootstrap-dra-resourceslices"
SLICE_POLICY_WHY = ("the chart's own ResourceSlice policy never applies: it names ServiceAccount <fullname>-service-account, "
                    "but the kubelet plugin runs as <fullname>-service-account-kubeletplugin (chart v0.5.0), so one "
                    "node's plugin, or a token stolen from it, could rewrite every node's GPUs; this one names the "
                    "plugin's account")


def plugin_account(release: str, values: dict) -> str:
    """The DRA kubelet plugin's ServiceAccount, by the chart's own naming (templates/_helpers.tpl: fullname,
    serviceAccountName; kubeletplugin.yaml adds -kubeletplugin)."""
    chart = values.get("nameOverride") or CHART
    if values.get("fullnameOverride"):
        full = str(values["fullnameOverride"])[:63].rstrip("-")
    else:
        full = (release if chart in release else f"{release}-{chart}")[:63].rstrip("-")
    account = (values.get("serviceAccount") or {}).get("name") or f"{full}-service-account"
    return f"{account}-kubeletplugin"


def slice_policy_objects(namespace: str, release: str, values: dict, labels: dict) -> list[dict]:
    """A ValidatingAdmissionPolicy and binding that let the DRA kubelet plugin write only its own node's
    ResourceSlices (by the node its token's pod runs on). Where ComputeDomains are on, slices for all nodes or a
    node selector stay allowed, as upstream's policy means them to."""
    user = f"system:serviceaccount:{namespace}:{plugin_account(release, values)}"
    which = "(request.operation == 'DELETE' ? oldObject : object).spec"
    own_node = "variables.userNodeName == variables.objectNodeName"
    if ((values.get("resources") or {}).get("computeDomains") or {}).get("enabled"):
        own_node += f" || {which}.?allNodes.orValue(false) == true || {which}.?nodeSelector.orValue(null) != null"
    admission = "admissionregistration.k8s.io/v1"
    policy = {"apiVersion": admission, "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": SLICE_POLICY, "labels": dict(labels)},
              "spec": {"failurePolicy": "Fail",
                       "matchConstraints": {"resourceRules": [{
                           "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
                           "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"]}]},
                       "matchConditions": [{"name": "dra-kubelet-plugin",
                                            "expression": f"request.userInfo.username == '{user}'"}],
                       "variables": [
                           {"name": "userNodeName", "expression":
                               "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"},
                           {"name": "objectNodeName", "expression": f"{which}.?nodeName.orValue('')"}],
                       "validations": [
                           {"expression": "variables.userNodeName != ''",
                            "message": "the DRA kubelet plugin must write ResourceSlices from a pod on a node (its "
                                       "token names no node)"},
                           {"expression": own_node, "messageExpression":
                               "'the DRA kubelet plugin on node ' + variables.userNodeName + ' may write only that "
                               "node\\'s ResourceSlices (gpu-bootstrap)'"}]}}
    binding = {"apiVersion": admission, "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": SLICE_POLICY, "labels": dict(labels)},
               "spec": {"policyName": SLICE_POLICY, "validationActions": ["Deny"]}}
    return [policy, binding]


def owned_objects(ctx, values: dict, labels: dict) -> list[dict]:
    """Ours beside the DRA driver: the DCGM exporter's ResourceSlice reader and the plugin's ResourceSlice policy."""
    section = ctx.config.gpu_operator
    return [*exporter_objects(section.namespace, labels),
            *slice_policy_objects(section.dra_driver.namespace, section.dra_driver.release, values, labels)]


def owned_changes(ctx, values: dict, labels: dict) -> list[Change]:
    """Apply ours where missing or different."""
    out = []
    for obj in owned_objects(ctx, values, labels):
        ref = Ref.of(obj)
        live = ctx.kube.get(ref.api_version, ref.kind, ref.name)
        why = SLICE_POLICY_WHY if obj["metadata"]["name"] == SLICE_POLICY else EXPORTER_WHY
        if live is None or differences(obj, live):
            out.append(Change(Verb.APPLY, ref, "create" if live is None else "update", why, obj))
    return out


def owned_removals(ctx, labels: dict) -> list[Change]:
    """teardown, or a move back to the device plugin: ours, where they exist and carry our labels."""
    out = []
    for obj in reversed(owned_objects(ctx, ctx.config.gpu_operator.dra_driver.values, labels)):
        ref = Ref.of(obj)
        live = ctx.kube.get(ref.api_version, ref.kind, ref.name)
        if live is not None and all((live["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items()):
            out.append(Change(Verb.DELETE, ref, "remove", "made by gpu-bootstrap beside the DRA driver"))
    return out


def rbac_needs(config) -> dict:
    """What the gpu-operator step adds in DRA mode (gpu_operator.allocation: dra): the DRA driver's release."""
    return {
        READ: [*chart_needs("dra-driver", "dra", ("get", "list"))],
        WRITE: [*chart_needs("dra-driver", "dra", APPLY),
                *chart_rbac_needs("dra-driver", config.gpu_operator.dra_driver.release, "dra"),
                need("rbac.authorization.k8s.io", "clusterroles", "bind escalate", CLUSTER,
                     ("gpu-bootstrap-dcgm-exporter-dra",),
                     why="gpu-operator: the DCGM exporter's ResourceSlice reader (allocation: dra)")],
        RUN: [*chart_needs("dra-driver", "dra", HELM), need("apps", "daemonsets", "list", "dra"),
              need("resource.k8s.io", "resourceslices", "list",
                   why="gpu-operator: each GPU node publishes its GPUs (allocation: dra)")],
        DOCTOR: []}
