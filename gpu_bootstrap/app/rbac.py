"""The application layer of `gpu-bootstrap rbac`: what a command needs for the configured steps, as YAML an admin
applies. The roles come from security/rbac.py, the admission policies that hold the kept identities from
security/identity_policy.py; this module checks the input, asks the cluster's version where a policy depends on it,
and writes the header (what the role is, the namespaces to create first, each line quoted for a shell) and a comment
above each rule."""
from __future__ import annotations

from gpu_bootstrap.app.commands import Options, check_kubeconfig, load_config
from gpu_bootstrap.app.playbook import load_playbook
from gpu_bootstrap.core import config as config_module
from gpu_bootstrap.core.errors import GpuBootstrapError, UsageError


SERVICE_ACCOUNT = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?"


def rbac(options: Options, command: str, service_account: str | None = None, prometheus: str | None = None) -> str:
    """YAML: what `command` needs for the configured steps of the playbook: for the identities that must not write
    for real (dry-run, doctor, probe) first the admission policy that holds them (security/identity_policy.py), then
    the ClusterRole and Roles, each rule with a comment saying who needs it, and the bindings to `service_account`
    (namespace/name) when given. Every line meant for a shell is quoted."""
    import re

    from gpu_bootstrap.security import identity_policy
    from gpu_bootstrap import steps as registry
    from gpu_bootstrap.security import rbac as rbac_module
    if service_account is not None and not re.fullmatch(SERVICE_ACCOUNT, service_account):
        raise UsageError(f"--service-account {service_account!r} is not NAMESPACE/NAME of a ServiceAccount",
                         "e.g. --service-account ci/gpu-bootstrap")
    if prometheus is not None and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?"
                                                   r"(:[a-z0-9]([-a-z0-9]*[a-z0-9])?)?", prometheus):
        raise UsageError(f"--prometheus {prometheus!r} is not NAMESPACE/SERVICE[:PORT]",
                         "e.g. --prometheus monitoring/kube-prometheus-stack-prometheus:http-web")
    held = command in ("dry-run", "doctor", "probe")
    if held and service_account is None:
        raise UsageError(f"--for {command} needs --service-account NAMESPACE/NAME: the admission policy that keeps "
                         f"this identity {'dry' if command != 'probe' else 'to the node probe'} names it",
                         "e.g. --service-account ci/gpu-bootstrap-" + command)
    if command == "status":
        config, steps = config_module.load_node_free_sections(options.config), []
    else:
        config = load_config(options)
        steps = registry.enabled(config, load_playbook(options.playbook).steps)
    policies = identity_policy.served(_rbac_kube_version(options, command)) if held else True
    if not policies and command in ("dry-run", "probe"):
        raise UsageError(f"--for {command}: this cluster serves no ValidatingAdmissionPolicy (Kubernetes 1.30+), "
                         f"which is what keeps a {command} identity from writing for real (RBAC authorizes a dry "
                         f"run exactly like the write)",
                         "use --for plan (`up --dry-run=client`, read-only) there" if command == "dry-run" else
                         "read the nodes over SSH (preflight.via: ssh) or pass --preflight-report FILE")
    target = rbac_module.prometheus_service(config, prometheus)
    pins = probe_pins(config) if command == "probe" else None
    docs = identity_policy.manifests(command, service_account, pins) if held and policies else []
    docs += rbac_module.manifests(command, config, steps, service_account, target, policies,
                                  both_allocations=options.allow_allocation_change)
    return _rbac_header(command, config, [step.id for step in steps], docs, service_account, target, policies) \
        + _yaml_with_reasons(docs)


def probe_pins(config):
    """What the in-cluster node probe of this gpu-bootstrap makes for this config (probes/incluster.py, the probe
    script), for the probe identity's policy to admit exactly that."""
    from gpu_bootstrap.core.catalogue import locate, locate_pods
    from gpu_bootstrap.probes import incluster
    from gpu_bootstrap.probes.script import build, command_timeout
    from gpu_bootstrap.security.identity_policy import ProbePins
    registry = getattr(config, "registry", None)
    image = locate(config.preflight.image, registry)
    pod = locate_pods([incluster.pod_manifest("run", "node", 0, image)], registry)[0]
    marker = "@@gpu-bootstrap-0123456789abcdef@@"
    head, _, tail = build(marker, command_timeout(config.preflight.timeout)).partition(marker)
    labels = incluster.namespace_manifest("run", "owner", 0)["metadata"]["labels"]
    host = next(v for v in pod["spec"]["volumes"] if "hostPath" in v)
    script = incluster.script_manifest("run", "")
    return ProbePins(
        namespace_labels={k: v for k, v in labels.items() if k != incluster.RUN_LABEL}, run_label=incluster.RUN_LABEL,
        configmap=script["metadata"]["name"], script_key=next(iter(script["data"])), script_head=head,
        marker_pattern=r"@@gpu-bootstrap-[0-9a-f]{16}@@", marker_length=len(marker), script_tail=tail,
        nodes=tuple(n.name for n in config.nodes) if config.node_selector is None else None, image=image,
        init_commands=tuple(tuple(c["command"]) for c in pod["spec"]["initContainers"]),
        main_commands=tuple(tuple(c["command"]) for c in pod["spec"]["containers"]),
        host_volume=host["name"], host_path=host["hostPath"]["path"])


def _rbac_kube_version(options: Options, command: str) -> str:
    """--kube-version, else the cluster's own version (a read of /version); needed to know whether the cluster
    serves ValidatingAdmissionPolicy."""
    if options.kube_version:
        return options.kube_version
    from gpu_bootstrap.adapters.kube import Kube
    try:
        config = config_module.load_node_free_sections(options.config, overrides={
            ("cluster", "kubeconfig"): str(options.kubeconfig) if options.kubeconfig else None,
            ("cluster", "context"): options.context})
        kube = Kube(check_kubeconfig(config.cluster), config.cluster.context)
        from gpu_bootstrap.core.versions import server_version
        return server_version(kube.version())
    except GpuBootstrapError as error:
        raise UsageError(f"--for {command} needs the cluster's Kubernetes version (does it serve "
                         f"ValidatingAdmissionPolicy?), and the cluster could not be asked: {error.message}",
                         "pass --kube-version X.Y") from None


def _rbac_header(command: str, config, steps: list[str], docs: list[dict], service_account: str | None, prometheus,
                 policies: bool) -> str:
    import shlex

    from gpu_bootstrap.security import pod_security
    import textwrap

    def comment(text: str) -> list[str]:
        return textwrap.wrap(text, 116, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False)
    header = comment(f"gpu-bootstrap rbac --for {command}: the least `{_command_line(command)}` needs"
                     + (f" for the steps {', '.join(steps)}" if steps else "") + " (generated; no `*` in any role; "
                     "the comment above each rule says which step or check needs it).")
    for line in ROLE_WARNINGS[command](prometheus, policies):
        header += comment(line)
    if any(d["kind"] == "ValidatingAdmissionPolicy" for d in docs):
        header += comment("The ValidatingAdmissionPolicy and its binding come first: apply this file as a cluster "
                          "admin (kubectl apply -f FILE) before creating a token for the ServiceAccount.")
    else:
        header.append("# Apply as a cluster admin: kubectl apply -f FILE")
    if service_account and command in ("up", "dry-run", "probe", "doctor"):
        namespace, _, name = service_account.partition("/")
        header.append("# Hand the job a short-lived token, never a long-lived Secret: kubectl create token "
                      f"{shlex.quote(name)} -n {shlex.quote(namespace)} --duration=1h")
    missing = [d["metadata"]["namespace"] for d in docs if d["kind"] == "Role" and
               d["metadata"]["namespace"] not in ("default", "kube-system")]
    if missing:
        privileged = ({config.gpu_operator.namespace} if hasattr(config, "gpu_operator") else set()) | (
            {config.monitoring.namespace} if config.monitoring.mode != "attach" else set())
        header += comment("The Roles live in namespaces `up` creates. Before the first run, create those as "
                          "gpu-bootstrap's (so that up adopts and labels them):")
        for namespace in missing:
            level = pod_security.PRIVILEGED if namespace in privileged else pod_security.RESTRICTED
            quoted = shlex.quote(namespace)
            header.append(f"#   kubectl create namespace {quoted} && kubectl label namespace {quoted} "
                          f"{shlex.quote('app.kubernetes.io/managed-by=gpu-bootstrap')} "
                          f"{shlex.quote(f'{pod_security.ENFORCE}={level}')}")
    return "\n".join(header) + "\n"


def _yaml_with_reasons(docs: list[dict]) -> str:
    """The documents as YAML, each rule preceded by a comment naming the steps and checks that need it."""
    import textwrap

    import yaml

    from gpu_bootstrap.security.rbac import WHY
    out = []
    for doc in docs:
        if "rules" not in doc:
            out.append(yaml.safe_dump(doc, sort_keys=False))
            continue
        text = yaml.safe_dump({k: v for k, v in doc.items() if k != "rules"}, sort_keys=False) + "rules:\n"
        for rule in doc["rules"]:
            reasons = "; ".join(rule.get(WHY, []))
            text += "".join(f"{line}\n" for line in textwrap.wrap(
                f"for {reasons}", 116, initial_indent="# ", subsequent_indent="#   ", break_on_hyphens=False))
            text += yaml.safe_dump([{k: v for k, v in rule.items() if k != WHY}], sort_keys=False)
        out.append(text)
    return "---\n".join(out)


# What each role is, printed at the top of its YAML (docs/security.md says the same)
ROLE_WARNINGS = {
    "plan": lambda prometheus, policies: [
        "Read-only: get and list, no Secrets, ConfigMaps only in the namespaces it plans; no write, bind, escalate "
        "or impersonate. For a pull request's CI (code anyone may propose): `gpu-bootstrap up --dry-run=client` "
        "plans from the objects it can read and reports what it cannot read (a helm release's record is a "
        "Secret) as unknown."],
    "dry-run": lambda prometheus, policies: [
        "Kept dry: RBAC authorizes a server-side dry run exactly like the write, so these roles alone would let a "
        "token make those writes for real; the ValidatingAdmissionPolicy below denies every request of this "
        "identity that is not a dry run. It holds no write on webhook configurations or admission policies "
        "(admission does not run for them: `up --dry-run` judges those client-side). bind and escalate only on the "
        "roles our manifests and the charts bind (resourceNames); no delete, deletecollection or impersonate. For a "
        "trusted job (a main-branch pipeline); a pull request's CI gets --for plan."],
    "up": lambda prometheus, policies: [
        "CLUSTER-ADMIN-EQUIVALENT: `up` installs privileged node agents (the gpu-operator's driver and toolkit "
        "DaemonSets run as root on every GPU node) and binds the charts' roles, so whoever holds this can become "
        "cluster admin. Give it only to an admin or a protected deploy job (a protected environment with required "
        "reviewers), as a short-lived token (TokenRequest with a duration), never as a long-lived Secret."],
    "status": lambda prometheus, policies: [
        "Reads nodes, pods, events and Services; proxies only to the Prometheus Service "
        f"{prometheus.namespace}/{prometheus.proxy_name} (another Prometheus: --prometheus NAMESPACE/SERVICE:PORT)."],
    "doctor": lambda prometheus, policies: [
        "Reads, and the server-side dry runs of the admission checks; kept dry by the ValidatingAdmissionPolicy "
        "below, so it creates nothing for real. It does not run the in-cluster node probe (that is --for probe)."
        if policies else
        "Reads only: this cluster serves no ValidatingAdmissionPolicy (1.30+), which would keep the admission "
        "checks' dry-run pod creates dry, so those checks are left out (doctor says they could not be made)."],
    "probe": lambda prometheus, policies: [
        "ROOT ON THE CONFIGURED GPU NODES: doctor's role plus the in-cluster node probe, privileged pods that run "
        "a script as root in every GPU node's own shell. Its policy below lets it write for real only the probe's "
        "own namespaces (gpu-bootstrap-probe-*, with exactly the probe's labels), their ConfigMap holding this "
        "gpu-bootstrap version's probe script, and the probe's pods (on the configured GPU nodes, its image and "
        "commands, the host's / read-only, no host namespace), and nothing else but dry runs: regenerate it with "
        "the version that runs the probe. For trusted use only; SSH (preflight.via: ssh) or --preflight-report "
        "need no such identity."],
}


def _command_line(command: str) -> str:
    return {"dry-run": "gpu-bootstrap up --dry-run", "plan": "gpu-bootstrap up --dry-run=client",
            "probe": "gpu-bootstrap doctor (preflight through the cluster)"}.get(command, f"gpu-bootstrap {command}")
