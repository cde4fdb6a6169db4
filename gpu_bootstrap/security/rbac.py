"""Least-privilege RBAC for each command: `gpu-bootstrap rbac --for plan|dry-run|up|status|doctor|probe`.

The roles, from the least to the most, and what keeps each one to its job (docs/security.md has the table of
attacks each was put to on the real API server):
  status   lists nodes, pods, events, services (and DRA's slices and claims, Kueue's queues, Karpenter's
           NodePools); gets one ConfigMap by name (the scheduler's config); proxies only to the Prometheus Service it
           reads (resourceNames, in its namespace).
  plan     `up --dry-run=client`: get/list only, no Secrets, ConfigMaps only in the namespaces it plans; for a pull
           request's CI, which runs code anyone may propose.
  doctor   reads, and the server-side dry runs of its admission checks. RBAC cannot tell a dry run from a write, so
           the identity is kept dry by admission: a ValidatingAdmissionPolicy (identity_policy.py) denies every
           request of it whose dryRun is not true. No node probe (that is `probe`).
  dry-run  `up --dry-run`: the reads plus the writes `up` makes, kept dry the same way, so a token bound to it
           writes nothing for real. Admission does not run for the admission configuration kinds themselves
           (webhook configurations, admission policies and their bindings), so it holds no write on those: they
           are judged client-side, as the plan role judges them.
  probe    doctor plus the in-cluster node probe: privileged pods that run a script as root on every GPU
           node, so ROOT ON THE CONFIGURED GPU NODES, for trusted use; its policy lets it write for real only the
           probe's own namespaces (gpu-bootstrap-probe-*, exactly the probe's labels), their ConfigMap (this
           version's probe script) and the probe's pods (on the configured GPU nodes, its image and commands, the
           host's / read-only, no host namespaces). No role but up's reads Secret values in our namespaces.
  up       `up` itself: everything. It installs privileged node agents (the gpu-operator's driver and toolkit
           DaemonSets) and binds the charts' roles, so it is CLUSTER-ADMIN-EQUIVALENT: give it to an admin or a
           protected deploy job, as a short-lived token.

The rules come from the steps' declarations (each step's needs by phase, pipeline/step.py: Declaration), which the
caller hands in, and from the catalogue in rbac_rules.py (the pipeline around the steps, the charts' objects);
this module assembles them into each command's roles: the phases a command runs, the filters that keep the dry and
read-only identities to their job, and the merge into a ClusterRole and a Role per namespace.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from gpu_bootstrap.core.objects import STATE_KEY_SECRET, STATE_NAMESPACE
from gpu_bootstrap.security.rbac_rules import (
    CLUSTER, DOCTOR, READ, RUN, WRITE, Need, PrometheusService, cluster_probe_needs, need, pipeline_needs,
    probes_through_the_cluster, prometheus_service, status_needs)

COMMANDS = ("plan", "dry-run", "up", "status", "doctor", "probe")
DRY = ("dry-run", "doctor")  # identities an admission policy keeps dry (identity_policy.py)
PLAN_VERBS = ("get", "list")  # all the plan role may do (it never watches)
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection", "bind", "escalate")
ADMISSION_GROUP = "admissionregistration.k8s.io"
# the kinds admission does not run for (the API server exempts them from policies and webhooks alike, so nothing
# could keep a write of them dry): no dry identity may write them
ADMISSION_CONFIGURATION = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations",
                           "validatingadmissionpolicies", "validatingadmissionpolicybindings",
                           "mutatingadmissionpolicies", "mutatingadmissionpolicybindings")


class StepNeeds(Protocol):
    """What rbac reads of a step's declaration (pipeline/step.py: Declaration; security may not import it)."""
    id: str
    needs: Callable[[object], dict]  # config -> {phase: [Need]}
    dra_needs: Callable[[object], dict]  # what it adds when GPUs are allocated through DRA
    scopes: Callable[[object], dict]  # config -> {scope key: namespace} of its own


def namespaces(config, prometheus: PrometheusService | None = None) -> dict[str, str]:
    found = {"state": STATE_NAMESPACE, "probe-default": "default", "kube-system": "kube-system",
             # the scheduler's namespace: status reads its config there (node-free sections carry it too)
             "scheduler": config.scheduler.namespace if config is not None and hasattr(config, "scheduler")
             else "kube-system"}
    if config is not None and hasattr(config, "gpu_operator"):  # status reads only the node-free sections
        found.update({"operator": config.gpu_operator.namespace, "monitoring": config.monitoring.namespace,
                      "opa": config.admission.opa.namespace, "scheduler": config.scheduler.namespace,
                      "validation": config.validation.namespace, "dra": config.gpu_operator.dra_driver.namespace})
    if prometheus is not None:
        found["prometheus"] = prometheus.namespace
    return found


PHASE_WORDS = {READ: "its check", WRITE: "its changes", RUN: "up only", DOCTOR: "doctor's checks"}


def needs(command: str, config, steps: Sequence[StepNeeds], prometheus: PrometheusService | None = None,
          admission_policies: bool = True, both_allocations: bool = False) -> list[Need]:
    """What `command` uses for the enabled `steps` of the playbook (their declarations: steps.enabled()).
    `admission_policies`: the cluster serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (1.30+),
    which keeps the dry identities dry; without it doctor's identity goes without the dry-run pod creates of its
    admission checks (those checks say unknown)."""
    if command not in COMMANDS:
        raise ValueError(command)
    if command == "status":
        scheduler = config.scheduler.name if config is not None and hasattr(config, "scheduler") else None
        return status_needs(prometheus or prometheus_service(config), *([scheduler] if scheduler else []))
    phases = {"up": (READ, WRITE, RUN), "dry-run": (READ, WRITE), "plan": (READ,), "doctor": (READ, DOCTOR),
              "probe": (READ, DOCTOR)}[command]
    out = [n for phase in phases for n in pipeline_needs().get(phase, [])]
    # both_allocations (rbac --allow-allocation-change): moving a cluster between the device plugin and DRA also
    # removes the other mode's release and objects, whichever way the config now points
    dra = config is not None and hasattr(config, "gpu_operator") and (
        config.gpu_operator.allocation == "dra" or both_allocations)
    tables = [(step.id, step.needs(config)) for step in steps]
    tables += [(step.id, step.dra_needs(config)) for step in steps] if dra else []
    for step_id, table in tables:
        for phase in phases:
            out += [_origin(n, step_id, phase) for n in table.get(phase, [])]
    probing = command == "probe" or (command == "up" and probes_through_the_cluster(config))
    if "preflight" in [step.id for step in steps] and probing:
        out += cluster_probe_needs()  # the probe identity exists for it, whatever preflight.via says (doctor --via)
    if command == "plan":
        out = _read_only(out, config)
    if command in ("dry-run", "doctor", "probe"):
        out = _without_admission_configuration_writes(out)
        out = _proxy_to(prometheus or prometheus_service(config), out)
        out = _no_secret_values(out)
    if command == "doctor" and not admission_policies:
        out = [n for n in out if not (n.resources == ("pods",) and "create" in n.verbs)]
    return out


def _origin(item: Need, step: str, phase: str) -> Need:
    if item.why:
        return item
    return Need(item.group, item.resources, item.verbs, item.scope, item.names, f"{step}: {PHASE_WORDS[phase]}")


def _proxy_to(prometheus: PrometheusService, needs_: list[Need]) -> list[Need]:
    """The service proxy to the one Prometheus Service only (doctor's check that it scrapes the GPUs), never to
    every Service of the cluster."""
    out = []
    for item in needs_:
        if item.resources == ("services/proxy",) and not item.names:
            item = Need(item.group, item.resources, item.verbs, "prometheus", (prometheus.proxy_name,),
                        item.why + f" (Prometheus {prometheus.namespace}/{prometheus.proxy_name} only)")
        out.append(item)
    return out


def _without_admission_configuration_writes(needs_: list[Need]) -> list[Need]:
    """A dry identity holds no write on the kinds admission does not run for: nothing could keep it dry there."""
    out = []
    for item in needs_:
        if item.group == ADMISSION_GROUP and set(item.resources) & set(ADMISSION_CONFIGURATION):
            verbs = tuple(v for v in item.verbs if v not in WRITE_VERBS)
            if not verbs:
                continue
            item = Need(item.group, item.resources, verbs, item.scope, item.names, item.why)
        out.append(item)
    return out


def _no_secret_values(needs_: list[Need]) -> list[Need]:
    """No role but up's reads Secret values in our namespaces: helm's release records hold every chart value (the
    secret ones too), Grafana's admin password, Alertmanager's config, the webhook's TLS key. The one Secret left is
    the state record's fingerprint key, by name: without it nothing could be compared (adapters/secretless.py keeps
    dry runs and doctor to that, and says what they cannot show)."""
    out = []
    for item in needs_:
        resources = tuple(r for r in item.resources if r != "secrets")
        if resources:
            out.append(Need(item.group, resources, item.verbs, item.scope, item.names, item.why))
    return out + [need("", "secrets", "get", "state", (STATE_KEY_SECRET,),
                       why="the pipeline: the key of the state record's fingerprints (this Secret only)")]


def _read_only(needs_: list[Need], config) -> list[Need]:
    """The plan role: only get/list, nothing of Secrets (what the plan cannot read it says is unknown), and
    ConfigMaps only in the namespaces it plans (a cluster-wide read would show every ConfigMap of the cluster)."""
    out = []
    for item in needs_:
        resources = tuple(r for r in item.resources if r != "secrets")
        verbs = tuple(v for v in item.verbs if v in PLAN_VERBS)
        if not (resources and verbs):
            continue
        if "configmaps" in resources and item.scope == "scheduler" and not item.names:
            # the scheduler's namespace is kube-system by default, where aws-auth and kubeadm-config live: the plan
            # reads the scheduler's own ConfigMap by name, and says it could not look for leftovers there
            resources = tuple(r for r in resources if r != "configmaps")
            if not resources:
                continue
        if "configmaps" in resources and item.scope is CLUSTER:
            out += [Need("", ("configmaps",), verbs, where, item.names, item.why + " (in the namespaces it plans)")
                    for where in PLANNED_CONFIGMAPS]
            resources = tuple(r for r in resources if r != "configmaps")
            if not resources:
                continue
        out.append(Need(item.group, resources, verbs, item.scope, item.names, item.why))
    return out


PLANNED_CONFIGMAPS = ("state", "monitoring", "opa")  # namespace keys where our ConfigMaps live (the scheduler's: by
# name, see _read_only)


@dataclass(frozen=True)
class Rules:
    cluster: list[dict]  # the ClusterRole's rules
    namespaced: dict[str, list[dict]]  # namespace -> the Role's rules


def rules(command: str, config, steps: Sequence[StepNeeds], prometheus: PrometheusService | None = None,
          admission_policies: bool = True, both_allocations: bool = False) -> Rules:
    """The needs merged into RBAC rules: one per (API group, verbs), resources sorted; namespaced verbs a
    cluster-wide rule already grants are left out of the Roles. Each rule's `why` (a key the manifests turn into a
    comment) names the steps and checks that need it."""
    prometheus = prometheus or prometheus_service(config)
    # a step's own scope keys cannot rename a built-in one (tests/test_step_declarations.py keeps them apart)
    names = {**{key: namespace for step in steps for key, namespace in step.scopes(config).items()},
             **namespaces(config, prometheus)}
    wide: dict[tuple[str, str, tuple], dict[str, set]] = defaultdict(lambda: defaultdict(set))
    local: dict[str, dict] = defaultdict(lambda: defaultdict(lambda: defaultdict(set)))
    for item in needs(command, config, steps, prometheus, admission_policies, both_allocations):
        for resource in item.resources:
            target = wide if item.scope is CLUSTER else local[names[item.scope]]
            for verb in item.verbs:
                target[(item.group, resource, item.names)][verb].add(item.why)
    for namespace, found in local.items():
        for key in list(found):
            for verb in list(found[key]):
                if verb in wide.get(key, {}):
                    del found[key][verb]
            if not found[key]:
                del found[key]
    return Rules(_merge(wide), {ns: _merge(found) for ns, found in sorted(local.items()) if found})


def _merge(found: dict[tuple[str, str, tuple], dict[str, set]]) -> list[dict]:
    """One rule per (API group, verbs, resourceNames), its resources sorted; named access merges by name too."""
    grouped: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[str]] = defaultdict(list)
    whys: dict[tuple, set] = defaultdict(set)
    for (group, resource, names), verbs in sorted(found.items()):
        key = (group, tuple(sorted(verbs)), names)
        grouped[key].append(resource)
        whys[key].update(why for reasons in verbs.values() for why in reasons if why)
    rules_ = []
    for (group, verbs, names), resources in sorted(grouped.items()):
        rule = {"apiGroups": [group], "resources": sorted(resources)}
        if names:
            rule["resourceNames"] = list(names)
        rules_.append({**rule, "verbs": list(verbs), WHY: sorted(whys[(group, verbs, names)])})
    return rules_


WHY = "__why__"  # a rule's reasons: printed as a comment above it, never part of the object sent to a cluster


def without_reasons(rule_list: list[dict]) -> list[dict]:
    return [{k: v for k, v in rule.items() if k != WHY} for rule in rule_list]


def manifests(command: str, config, steps: Sequence[StepNeeds], service_account: str | None = None,
              prometheus: PrometheusService | None = None, admission_policies: bool = True,
              both_allocations: bool = False) -> list[dict]:
    """The ClusterRole, the Roles, and (given `namespace/name` of a ServiceAccount) their bindings. Rules keep
    their reasons under WHY (app/commands.py prints them as comments; without_reasons() drops them)."""
    found = rules(command, config, steps, prometheus, admission_policies, both_allocations)
    name = f"gpu-bootstrap-{command}"
    labels = {"app.kubernetes.io/managed-by": "gpu-bootstrap", "app.kubernetes.io/component": "rbac"}
    docs = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": name, "labels": labels}, "rules": found.cluster}]
    docs += [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
              "metadata": {"name": name, "namespace": namespace, "labels": labels}, "rules": role_rules}
             for namespace, role_rules in found.namespaced.items()]
    if service_account:
        sa_namespace, _, sa_name = service_account.partition("/")
        subject = [{"kind": "ServiceAccount", "name": sa_name, "namespace": sa_namespace}]
        ref = {"apiGroup": "rbac.authorization.k8s.io", "name": name}
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                     "metadata": {"name": name, "labels": labels}, "subjects": subject,
                     "roleRef": {**ref, "kind": "ClusterRole"}})
        docs += [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                  "metadata": {"name": name, "namespace": namespace, "labels": labels}, "subjects": subject,
                  "roleRef": {**ref, "kind": "Role"}} for namespace in found.namespaced]
    return docs
