"""Pod Security Admission, as the API server's built-in plugin evaluates it: the Pod Security Standards (baseline and
restricted, version "latest" as of Kubernetes 1.33, https://kubernetes.io/docs/concepts/security/pod-security-standards/)
checked for a pod created in a namespace labelled pod-security.kubernetes.io/enforce=<level>.

`violations(spec, metadata, level)` lists each failed rule with the API server's wording (the check name, then what
is wrong), so a test can check a pod template against a profile too. The emulator calls `admit` on every pod create
(dry runs included) and refuses a violating pod with 403 Forbidden, worded like the real plugin:
  pods "x" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false (...), ...
"""
from __future__ import annotations

ENFORCE = "pod-security.kubernetes.io/enforce"
LEVELS = ("privileged", "baseline", "restricted")

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _containers(spec: dict) -> list[tuple[str, dict]]:
    return [(kind, c) for kind in ("initContainers", "containers", "ephemeralContainers")
            for c in spec.get(kind) or []]


def _sc(obj: dict) -> dict:
    return obj.get("securityContext") or {}


def _names(found: list[str], what: str = "container") -> str:
    quoted = ", ".join(f'"{n}"' for n in found)
    return f"{what}{'s' if len(found) > 1 else ''} {quoted}"


def baseline(spec: dict, metadata: dict) -> list[str]:
    out, containers, pod_sc = [], _containers(spec), _sc(spec)
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess") or any(
            (_sc(c).get("windowsOptions") or {}).get("hostProcess") for _k, c in containers):
        out.append("hostProcess (pod or containers must not set securityContext.windowsOptions.hostProcess=true)")
    hosts = [f"{f}={'true'}" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    if hosts:
        out.append(f"host namespaces ({', '.join(hosts)})")
    if found := [c["name"] for _k, c in containers if _sc(c).get("privileged")]:
        out.append(f"privileged ({_names(found)} must not set securityContext.privileged=true)")
    added = {c["name"]: [a for a in (_sc(c).get("capabilities") or {}).get("add") or []
                         if a not in BASELINE_CAPABILITIES] for _k, c in containers}
    if found := {n: a for n, a in added.items() if a}:
        out.append("non-default capabilities (" + "; ".join(
            f'container "{n}" must not include {", ".join(map(repr, a))} in securityContext.capabilities.add'
            for n, a in found.items()) + ")")
    if found := [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]:
        out.append(f"hostPath volumes ({_names(found, 'volume')})")
    if found := [c["name"] for _k, c in containers if any(p.get("hostPort") for p in c.get("ports") or [])]:
        out.append(f"hostPort ({_names(found)} use hostPort)")
    profiles = [(n, _sc(n_obj).get("appArmorProfile")) for n, n_obj in [("pod", spec)] + [
        (c["name"], c) for _k, c in containers]]
    annotations = [v for k, v in (metadata.get("annotations") or {}).items() if k.startswith(APPARMOR_ANNOTATION)]
    if any(p and p.get("type") not in ("RuntimeDefault", "Localhost") for _n, p in profiles) or any(
            v != "runtime/default" and not v.startswith("localhost/") for v in annotations):
        out.append("forbidden AppArmor profile")
    selinux = [o for o in [pod_sc.get("seLinuxOptions")] + [_sc(c).get("seLinuxOptions") for _k, c in containers] if o]
    if any(o.get("type", "") not in SELINUX_TYPES or o.get("user") or o.get("role") for o in selinux):
        out.append("seLinuxOptions (forbidden type, user or role)")
    if found := [c["name"] for _k, c in containers if _sc(c).get("procMount") not in (None, "Default")]:
        out.append(f"procMount ({_names(found)} must not set securityContext.procMount)")
    seccomp = [(pod_sc.get("seccompProfile") or {}).get("type")] + [
        (_sc(c).get("seccompProfile") or {}).get("type") for _k, c in containers]
    if "Unconfined" in seccomp:
        out.append('seccompProfile (seccompProfile.type must not be "Unconfined")')
    if found := [s["name"] for s in pod_sc.get("sysctls") or [] if s.get("name") not in SAFE_SYSCTLS]:
        out.append(f"forbidden sysctls ({', '.join(found)})")
    return out


# Baseline checks a restricted one replaces (the plugin's OverrideCheckIDs): it reports the stricter one alone.
OVERRIDDEN = ("non-default capabilities", "hostPath volumes", "seccompProfile")


def restricted(spec: dict, metadata: dict) -> list[str]:
    containers, pod_sc = _containers(spec), _sc(spec)
    out = [v for v in baseline(spec, metadata) if not v.startswith(OVERRIDDEN)]
    if found := [v["name"] for v in spec.get("volumes") or []
                 if not any(key in RESTRICTED_VOLUMES for key in v if key != "name")]:
        out.append(f"restricted volume types ({_names(found, 'volume')} use a type restricted allows not)")
    if found := [c["name"] for _k, c in containers if _sc(c).get("allowPrivilegeEscalation") is not False]:
        out.append(f"allowPrivilegeEscalation != false ({_names(found)} must set "
                   f"securityContext.allowPrivilegeEscalation=false)")
    caps = []
    for _k, c in containers:
        capabilities = _sc(c).get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []) or any(
                a != "NET_BIND_SERVICE" for a in capabilities.get("add") or []):
            caps.append(c["name"])
    if caps:
        out.append(f'unrestricted capabilities ({_names(caps)} must set securityContext.capabilities.drop=["ALL"]; '
                   f'only NET_BIND_SERVICE may be added)')
    pod_non_root = pod_sc.get("runAsNonRoot")
    explicit_false = [c["name"] for _k, c in containers if _sc(c).get("runAsNonRoot") is False]
    unset = [c["name"] for _k, c in containers if _sc(c).get("runAsNonRoot") is None]
    if pod_non_root is False or explicit_false or (pod_non_root is not True and unset):
        out.append(f"runAsNonRoot != true (pod or {_names(explicit_false or unset)} must set "
                   f"securityContext.runAsNonRoot=true)")
    if pod_sc.get("runAsUser") == 0 or any(_sc(c).get("runAsUser") == 0 for _k, c in containers):
        out.append("runAsUser=0 (pod and containers must not set runAsUser=0)")
    allowed = ("RuntimeDefault", "Localhost")
    pod_type = (pod_sc.get("seccompProfile") or {}).get("type")
    bad = [c["name"] for _k, c in containers if (t := (_sc(c).get("seccompProfile") or {}).get("type")) is not None
           and t not in allowed]
    missing = [c["name"] for _k, c in containers if (_sc(c).get("seccompProfile") or {}).get("type") is None]
    if (pod_type is not None and pod_type not in allowed) or bad or (pod_type is None and missing):
        out.append(f'seccompProfile (pod or {_names(bad or missing)} must set securityContext.seccompProfile.type to '
                   f'"RuntimeDefault" or "Localhost")')
    return out


def violations(spec: dict, metadata: dict | None = None, level: str = "restricted") -> list[str]:
    """The Pod Security Standards rules a pod spec fails at `level` (empty: it passes)."""
    metadata = metadata or {}
    if level == "privileged":
        return []
    return restricted(spec, metadata) if level == "restricted" else baseline(spec, metadata)


def template_of(obj: dict) -> tuple[dict, dict] | None:
    """(spec, metadata) of a Pod, or of the pod template of a workload (Deployment, DaemonSet, Job, CronJob...)."""
    kind = obj.get("kind")
    if kind == "Pod":
        return obj.get("spec") or {}, obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if kind == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    template = spec.get("template")
    if isinstance(template, dict) and "spec" in template:
        return template.get("spec") or {}, template.get("metadata") or {}
    return None


def enforced_level(namespace: dict | None) -> str:
    level = ((namespace or {}).get("metadata", {}).get("labels") or {}).get(ENFORCE, "privileged")
    return level if level in LEVELS else "restricted"  # an unknown level: the strictest (the API server's default)


def admit(namespace: dict | None, pod: dict) -> str | None:
    """None when the namespace's enforce level admits the pod, else the API server's Forbidden message."""
    level = enforced_level(namespace)
    found = violations(pod.get("spec") or {}, pod.get("metadata") or {}, level)
    if not found:
        return None
    name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName", "")
    return f'pods "{name}" is forbidden: violates PodSecurity "{level}:latest": {", ".join(found)}'
