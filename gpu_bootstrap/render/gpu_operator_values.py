"""gpu-operator values in three layers: our tuned base (values/gpu-operator.yaml), values derived from what
preflight found on the nodes, then the user's gpu_operator.values. Pure: facts and config in, values out, with the
reason for every derived value, or a Refusal when the facts rule out any working install.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpu_bootstrap.core.config import selector_equalities
from gpu_bootstrap.core import catalogue as images
from gpu_bootstrap.core.objects import deep_merge
from gpu_bootstrap.core.paths import data_path
from gpu_bootstrap.core.versions import version_tuple
from gpu_bootstrap.render.values import Derived, ValuesPlan, get_path, set_path, user_value_line  # noqa: F401 - re-exported

MIG_CAPABLE = re.compile(r"A100|A30|A800|H100|H200|H800|H20|GH200|B100|B200|GB200|B300|RTX PRO 6000 Blackwell")
NRI_MIN_OPERATOR = (26, 3, 0)
NRI_MIN_CONTAINERD = (1, 7, 30)


class Refusal(Exception):
    """The facts rule out a working install; nothing is installed. message says why, fix what to do."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.message = message
        self.fix = fix


class Unknown(Refusal):
    """Facts the values depend on could not be read, and no deployed release says what to keep."""


FACT_DEPENDENT = ("driver", "toolkit", "cdi")  # the subtrees derived from node facts
CONTROL_PLANE_TOLERATION = {"key": "node-role.kubernetes.io/control-plane", "operator": "Equal", "value": "",
                            "effect": "NoSchedule"}  # the chart's own default for the operator and NFD's master
NO_FACTS = "no node facts"  # the reason of a value the chart's default decided for want of node facts
RESTARTING = ("driver.enabled", "toolkit.enabled", "toolkit.env", "cdi.enabled", "cdi.nriPluginEnabled")


# --- facts ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeFacts:
    name: str
    driver: str | None
    gpus: tuple[str, ...]
    nouveau: bool
    runtime: str | None
    distribution: str
    runtime_version: str | None
    config_path: str | None
    socket: str | None
    toolkit_installed: bool
    toolkit_version: str | None
    toolkit_configured: bool
    toolkit_default: bool
    unknown: str = ""  # why nothing could be read from this node: its facts are unknown, not absent
    pool: str = ""  # launched from this pool of ours: facts from its definition, operands set by its node template


def facts_from_reports(reports: dict) -> list[NodeFacts]:
    """NodeReport objects (preflight) -> the facts the values depend on. A node whose ssh check failed has unknown
    facts: it is never taken for a node without a driver or a runtime."""
    out = []
    for name, report in sorted(reports.items()):
        ssh = next((c for c in report.checks if c.id == "ssh"), None)
        if ssh is None or ssh.status == "fail":
            out.append(NodeFacts(name, None, (), False, None, "standard", None, None, None, False, None, False, False,
                                 unknown=(ssh.message if ssh else "no facts") or "no facts"))
            continue
        data = {c.id: c.data or {} for c in report.checks}
        pool = str((ssh.data or {}).get("pool") or "")
        driver, runtime, toolkit = data.get("nvidia-driver", {}), data.get("container-runtime", {}), \
            data.get("nvidia-container-toolkit", {})
        out.append(NodeFacts(
            name, driver.get("driver_version"), tuple(g.get("name", "") for g in driver.get("gpus") or []),
            bool(data.get("nouveau", {}).get("loaded")), runtime.get("runtime"),
            runtime.get("distribution") or "standard", runtime.get("version"), runtime.get("config_path"),
            runtime.get("socket"), bool(toolkit.get("installed")), toolkit.get("version"),
            bool(toolkit.get("runtime_configured")), bool(toolkit.get("default_runtime")), pool=pool))
    return out


def _nodes(names) -> str:
    names = sorted(names)
    return ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:3])} and {len(names) - 3} more"


# --- layers -----------------------------------------------------------------------------------------------------------
def base_values() -> dict:
    return yaml.safe_load(data_path("values", "gpu-operator.yaml").read_text()) or {}


def derive(facts: list[NodeFacts], config, operator_version: str, playbook_steps: list[str],
           deployed: dict | None = None, no_room: bool = False, scrape: dict | None = None,
           chart_values: dict | None = None, service_monitors: bool = True) -> ValuesPlan:
    """`scrape`: the DCGM exporter's ServiceMonitor values the monitoring step decided (steps.monitoring.dcgm_scrape:
    labels that the Prometheus it installs or attaches to selects); None with monitoring in the playbook means its
    install-mode values. `deployed`: the values of the release that runs now (None when none does). With a node's
    facts unknown, the fact-dependent values of a running release are kept as they are; with no release running,
    that is refused. `no_room`: tainting the GPU nodes leaves no other node, so the operator's own pods must
    tolerate the taint. `service_monitors`: False when the cluster serves no ServiceMonitor CRD and no monitoring
    step runs before this one to bring it."""
    section = config.gpu_operator
    base = base_values()
    derived: list[Derived] = []
    labels: dict[str, dict[str, str]] = {}
    warnings: list[str] = []
    pooled = [f for f in facts if f.pool]  # their operands follow their pool's node template, not these values
    facts = [f for f in facts if not f.pool]
    unknown = [f for f in facts if f.unknown]
    if pooled and not facts:
        _only_pool_nodes(pooled, section, derived)
    elif unknown:
        warnings.append(_keep_deployed(unknown, deployed, derived))
        facts = [f for f in facts if not f.unknown]
    else:
        _driver(facts, section, derived, labels, warnings)
        _toolkit(facts, section, operator_version, derived, warnings)
    if not unknown:  # unknown facts: the running release's toolkit and cdi are kept whole
        _device_access(section, operator_version, derived, warnings)
    _placement(config, base, playbook_steps, derived, no_room)
    _sharing(facts, config, derived, labels, warnings)
    _pool_operands(config, playbook_steps, derived, warnings)
    _dcgm_scrape(config, playbook_steps, scrape, derived, service_monitors)
    _allocation(section, derived)
    derived += [Derived(path, value, why) for path, value, why in images.gpu_operator_values(
        getattr(config, "registry", None), chart_values)]
    tree: dict = {}
    for item in derived:
        set_path(tree, item.path, item.value)
    merged = deep_merge(deep_merge(base, tree), section.values)
    return ValuesPlan(base, derived, dict(section.values), merged, labels, warnings)


def _allocation(section, derived: list) -> None:
    """allocation: dra turns the device plugin off (NVIDIA's DRA driver, render/dra_driver.py, serves the GPUs)."""
    if section.allocation == "dra":
        derived.append(Derived("devicePlugin.enabled", False,
                               "gpu_operator.allocation: dra: NVIDIA's DRA driver serves the GPUs, and a node must never "
                               "serve nvidia.com/gpu from a device plugin as well (the scheduler would count its GPUs "
                               "twice)"))
        derived.append(Derived("dcgmExporter.env", [{"name": "KUBERNETES_ENABLE_DRA", "value": "true"}],
                               "gpu_operator.allocation: dra: the DCGM exporter maps DRA GPUs to their pods (it reads "
                               "ResourceSlices, which gpu-bootstrap's ClusterRole gpu-bootstrap-dcgm-exporter-dra "
                               "lets it)"))


def _dcgm_scrape(config, playbook_steps, scrape: dict | None, derived: list, service_monitors: bool) -> None:
    """dcgmExporter.serviceMonitor: the monitoring step's values (one source: render.monitoring.dcgm_service_monitor),
    or off when no monitoring step runs, or when nothing serves ServiceMonitors: NVIDIA's controller then keeps the
    ClusterPolicy notReady for good (ServiceMonitor() in controllers/object_controls.go, seen on the real controller:
    tests/test_gpu_operator_real.py)."""
    from gpu_bootstrap.render.monitoring import dcgm_service_monitor
    monitoring = "monitoring" in playbook_steps and config.monitoring.enabled
    if not monitoring:
        derived.append(Derived("dcgmExporter.serviceMonitor.enabled", False,
                               "no monitoring step in the playbook, so no Prometheus to scrape it"))
        return
    if not service_monitors:
        derived.append(Derived("dcgmExporter.serviceMonitor.enabled", False,
                               "the monitoring step does not run now and the cluster serves no ServiceMonitor CRD: "
                               "with it on, the operator keeps the ClusterPolicy notReady ('Install Prometheus and "
                               "necessary CRDs'); run the monitoring step to have the exporter scraped"))
        return
    section = config.monitoring
    values = scrape or dcgm_service_monitor(section.scrape_interval, {"release": section.release})
    labels = ", ".join(f"{k}={v}" for k, v in sorted(values["additionalLabels"].items())) or "none"
    derived.append(Derived("dcgmExporter.serviceMonitor", values,
                           f"the monitoring step: scraped every {values['interval']}, labels {labels} so the "
                           f"Prometheus selects it, honorLabels keeps the exporter's namespace/pod, every series "
                           f"gets node"))


def _keep_deployed(unknown: list[NodeFacts], deployed: dict | None, derived: list) -> str:
    why = "; ".join(f"{f.name}: {f.unknown}" for f in unknown[:4]) + (" …" if len(unknown) > 4 else "")
    if deployed is None:
        raise Unknown(f"the facts of {_nodes(f.name for f in unknown)} could not be read ({why}), and whether the "
                      f"operator must install the driver and the toolkit depends on them",
                      "make the nodes reachable over SSH (gpu-bootstrap doctor), or pass --preflight-report FILE "
                      "with their facts")
    kept = f"the facts of {_nodes(f.name for f in unknown)} are unknown ({why})"
    for key in FACT_DEPENDENT:
        if key in deployed:
            derived.append(Derived(key, deployed[key], f"kept from the running release: {kept}"))
    return f"{kept}: the driver and toolkit values of the running release are kept"


def restarts(deployed: dict, merged: dict) -> list[str]:
    """The values of a running release whose change restarts the operands on every GPU node, as they would change
    ('driver.enabled: false → true')."""
    found = []
    for path in RESTARTING:
        old, new = _lookup(deployed, path), _lookup(merged, path)
        if old != new:
            found.append(f"{path}: {json.dumps(old)} → {json.dumps(new)}" if _switches(old, new) else f"{path}: changes")
    return found


def _switches(*values) -> bool:
    """On/off values (true, false, unset), which a plan may show: they carry nothing to hide."""
    return all(value is None or isinstance(value, bool) for value in values)


def _lookup(tree: dict, path: str):
    return get_path(tree, path, None)


def _only_pool_nodes(pooled, section, derived) -> None:
    why = (f"every GPU node ({_nodes(f.name for f in pooled)}) is a pool node, whose template keeps the operator's "
           f"driver and toolkit off it; the chart's default for GPU nodes that join otherwise")
    derived.append(Derived("driver.enabled", section.driver_management != "host", why))
    derived.append(Derived("toolkit.enabled", True, why))


def _driver(facts, section, derived, labels, warnings) -> None:
    mode = section.driver_management
    if not facts:
        enabled = mode != "host"
        derived.append(Derived("driver.enabled", enabled, f"{NO_FACTS} (offline without --preflight-report): "
                                                          + ("the chart's default" if enabled else
                                                             "gpu_operator.driver_management: host")))
        if enabled:
            _driver_upgrade(section.driver_upgrade, derived)
        return
    with_driver = [f for f in facts if f.driver]
    without = [f for f in facts if not f.driver]
    versions = sorted({f.driver for f in with_driver})
    if mode == "auto":
        if with_driver and without:
            raise Refusal(f"the NVIDIA driver is pre-installed on {_nodes(f.name for f in with_driver)} but missing "
                          f"on {_nodes(f.name for f in without)}; the operator installs it on every GPU node or none",
                          "set gpu_operator.driver_management: per-node (the operator installs it only where it is "
                          "missing), or install the same driver everywhere")
        mode = "host" if with_driver else "operator"
        because = (f"{_nodes(f.name for f in with_driver)}: driver {', '.join(versions)} pre-installed" if with_driver
                   else f"no NVIDIA driver on {_nodes(f.name for f in without)}")
    else:
        because = f"gpu_operator.driver_management: {mode}"
    if mode == "host":
        derived.append(Derived("driver.enabled", False, because))
        if without:
            warnings.append(f"no NVIDIA driver on {_nodes(f.name for f in without)}: GPU pods cannot run there until "
                            f"you install one")
        return
    derived.append(Derived("driver.enabled", True, because))
    _driver_upgrade(section.driver_upgrade, derived)
    installs_on = [f for f in facts if mode == "operator" or not f.driver]
    if mode == "per-node":
        for f in with_driver:
            labels.setdefault(f.name, {})["nvidia.com/gpu.deploy.driver"] = "false"
        if with_driver:
            derived.append(Derived("nodes:nvidia.com/gpu.deploy.driver", "false",
                                   f"{_nodes(f.name for f in with_driver)}: driver pre-installed, so the operator "
                                   f"leaves it alone there"))
    elif with_driver:
        warnings.append(f"{_nodes(f.name for f in with_driver)} already have driver {', '.join(versions)}: the "
                        f"operator's driver container will not start there until it is removed")
    blocked = [f.name for f in installs_on if f.nouveau]
    if blocked:
        raise Refusal(f"nouveau is loaded on {_nodes(blocked)}, where the operator would install the NVIDIA driver",
                      "blacklist nouveau (echo 'blacklist nouveau' | sudo tee /etc/modprobe.d/blacklist-nouveau.conf; "
                      "sudo update-initramfs -u) and reboot those nodes")


def _driver_upgrade(policy, derived) -> None:
    """driver.upgradePolicy, each value with why (where the operator installs the driver; a pre-installed driver is
    the host's to upgrade)."""
    where = "gpu_operator.driver_upgrade"
    if not policy.auto:
        derived.append(Derived("driver.upgradePolicy.autoUpgrade", False,
                               f"{where}.auto: false: nodes upgrade only when you label them "
                               f"nvidia.com/gpu-driver-upgrade-state=upgrade-required"))
        return
    parallel = "every node at once" if policy.max_parallel == 0 else         "one node at a time" if policy.max_parallel == 1 else f"{policy.max_parallel} nodes at a time"
    evict = (f"GPU pods are evicted and get {policy.gpu_pod_deletion_timeout}s to exit"
             if policy.gpu_pod_deletion_timeout else "GPU pods are evicted and waited for without limit")
    if policy.force_gpu_pod_deletion:
        evict += ", pods no controller owns too"
    drain = (f"the whole node is drained ({policy.drain_timeout}s)" if policy.drain else
             "the node is not drained: only its GPU pods stop")
    derived += [
        Derived("driver.upgradePolicy.autoUpgrade", True, f"{where}.auto: the operator rolls a new driver out"),
        Derived("driver.upgradePolicy.maxParallelUpgrades", policy.max_parallel,
                f"{where}.max_parallel: {parallel}"),
        Derived("driver.upgradePolicy.maxUnavailable",  # int-or-string: a bare number must be an int
                int(policy.max_unavailable) if policy.max_unavailable.isdigit() else policy.max_unavailable,
                f"{where}.max_unavailable: at most {policy.max_unavailable} of the GPU nodes unavailable at once"),
        Derived("driver.upgradePolicy.waitForCompletion",
                {"timeoutSeconds": policy.wait_for_jobs_timeout, "podSelector": policy.wait_for_jobs_selector},
                f"{where}.wait_for_jobs_*: " + (f"pods matching {policy.wait_for_jobs_selector!r} may finish first"
                                               if policy.wait_for_jobs_selector else "no jobs are waited for")),
        Derived("driver.upgradePolicy.gpuPodDeletion",
                {"force": policy.force_gpu_pod_deletion, "timeoutSeconds": policy.gpu_pod_deletion_timeout,
                 "deleteEmptyDir": policy.delete_empty_dir}, f"{where}: {evict}"),
        Derived("driver.upgradePolicy.drain",
                {"enable": policy.drain, "force": False, "podSelector": "",
                 "timeoutSeconds": policy.drain_timeout, "deleteEmptyDir": policy.delete_empty_dir},
                f"{where}.drain: {drain}"),
    ]


def _toolkit(facts, section, operator_version, derived, warnings) -> None:
    if not facts:
        derived.append(Derived("toolkit.enabled", True, f"{NO_FACTS} (offline without --preflight-report): the "
                                                        "chart's default"))
        return
    ready = [f for f in facts if f.toolkit_installed and f.toolkit_configured and f.toolkit_default]
    if len(ready) == len(facts):
        versions = sorted({f.toolkit_version or "?" for f in ready})
        derived.append(Derived("toolkit.enabled", False, f"{_nodes(f.name for f in ready)}: toolkit "
                                                         f"{', '.join(versions)} with nvidia as the default runtime"))
        return
    not_ready = [f.name for f in facts if f not in ready]
    derived.append(Derived("toolkit.enabled", True, f"{_nodes(not_ready)}: no nvidia default runtime"))
    setups = {f.name: (f.runtime, f.distribution, f.config_path, f.socket) for f in facts}
    runtimes = set(setups.values())
    if section.runtime_integration == "nri":
        _nri(facts, operator_version, derived)
        return
    if len(runtimes) > 1 and "env" not in (section.values.get("toolkit") or {}):
        groups = "; ".join(f"{r[0]} ({r[1]}) {r[2]}: {_nodes(n for n, s in setups.items() if s == r)}"
                           for r in sorted(runtimes, key=str))
        raise Refusal(f"the GPU nodes use different container runtime setups ({groups}), but the toolkit's paths "
                      f"(toolkit.env) apply to every node",
                      "make the nodes uniform, or set gpu_operator.values.toolkit.env yourself")
    runtime, distribution, config_path, socket = next(iter(runtimes))
    which = f"{_nodes(f.name for f in facts)}: {runtime}" + (f" ({distribution})" if distribution != "standard" else "")
    if runtime == "containerd":
        env = [{"name": "CONTAINERD_CONFIG", "value": config_path}, {"name": "CONTAINERD_SOCKET", "value": socket}]
        if distribution != "standard":
            env.append({"name": "RUNTIME_CONFIG_SOURCE", "value": "file"})
        derived.append(Derived("toolkit.env", env, f"{which}, config {config_path}, socket {socket}"))
    elif runtime == "cri-o":
        derived.append(Derived("toolkit.env", [], f"{which}: the toolkit configures CRI-O through drop-in files"))
    elif runtime == "docker":
        warnings.append("docker (cri-dockerd) nodes: current gpu-operator releases support containerd and CRI-O; "
                        "plan a move to containerd")
        derived.append(Derived("toolkit.env", [{"name": "DOCKER_CONFIG", "value": config_path or
                                                "/etc/docker/daemon.json"}], which))


# GPUs only for pods given them (docs/security.md, render/device_access.py for admission's half): NVIDIA's runtime hands
# a container every GPU its NVIDIA_VISIBLE_DEVICES names, and by default it honours the variable in unprivileged
# containers too (the toolkit's accept-nvidia-visible-devices-envvar-when-unprivileged, default true). Read from the
# upstream sources at each line's release tag (NVIDIA/gpu-operator controllers/object_controls.go, deployments/
# gpu-operator/values.yaml; NVIDIA/nvidia-container-toolkit; NVIDIA/k8s-device-plugin).
CDI_BY_DEFAULT = (25, 10, 0)  # CDIConfigSpec.IsEnabled() is true when unset from v25.10.0 (false up to v25.3.x)
ENVVAR_UNPRIVILEGED = "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED"
AS_VOLUME_MOUNTS = "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS"
DEVICE_LIST_STRATEGY = "DEVICE_LIST_STRATEGY"


def device_access_paths(operator_version: str) -> dict[str, Any]:
    """path -> value of the settings `_device_access` derives for this operator line (where the toolkit is ours)."""
    if version_tuple(operator_version) >= CDI_BY_DEFAULT:
        return {"cdi.enabled": True, f"toolkit.env[{ENVVAR_UNPRIVILEGED}]": "false"}
    return {"cdi.enabled": False, f"toolkit.env[{ENVVAR_UNPRIVILEGED}]": "false",
            f"toolkit.env[{AS_VOLUME_MOUNTS}]": "true", f"devicePlugin.env[{DEVICE_LIST_STRATEGY}]": "volume-mounts"}


def _device_access(section, operator_version, derived, warnings) -> None:
    """Make the runtime ignore NVIDIA_VISIBLE_DEVICES in unprivileged containers, and hand GPUs another way: by CDI
    from v25.10 (the operator's default there), by volume mounts before it. Only where the operator installs the
    toolkit: a pre-installed toolkit's setting is the host's (doctor reads it from each node's config)."""
    if not next((d.value for d in reversed(derived) if d.path == "toolkit.enabled"), True):
        return  # the host's toolkit: doctor reads its setting (probes/checks.py, nvidia-container-toolkit)
    cdi = version_tuple(operator_version) >= CDI_BY_DEFAULT
    nri = any(d.path == "cdi.nriPluginEnabled" and d.value for d in derived)
    line = ".".join(str(n) for n in version_tuple(operator_version)[:2])
    unprivileged = (f"gpu-operator {line}: the toolkit (every release: {ENVVAR_UNPRIVILEGED}, default true, "
                    f"nvidia-container-toolkit toolkit.go / nvidia-ctk-installer) writes "
                    f"accept-nvidia-visible-devices-envvar-when-unprivileged=false, so an unprivileged container "
                    f"that names GPUs in NVIDIA_VISIBLE_DEVICES (its own, or its image's) gets none; the operator "
                    f"sets no ACCEPT_* variable itself, so this entry reaches the toolkit")
    if cdi or nri:
        if not nri:
            derived.append(Derived("cdi.enabled", True, f"gpu-operator {line}: CDI (the default from 25.10, "
                                                         f"CDIConfigSpec.IsEnabled): the device plugin hands GPUs "
                                                         f"by CDI (DEVICE_LIST_STRATEGY cdi-annotations,cdi-cri, "
                                                         f"transformDevicePluginCtrForCDI), never by the variable"))
        derived.append(Derived(f"toolkit.env[{ENVVAR_UNPRIVILEGED}]", "false", unprivileged))
    else:
        derived.append(Derived("cdi.enabled", False, f"gpu-operator {line}: CDI off (its default before 25.10): on "
                                                     f"24.6 and 24.9 the operator overwrites devicePlugin.env's "
                                                     f"DEVICE_LIST_STRATEGY when CDI is on (object_controls.go "
                                                     f"transformDevicePlugin), so GPUs go by volume mounts instead"))
        derived.append(Derived(f"toolkit.env[{ENVVAR_UNPRIVILEGED}]", "false", unprivileged))
        derived.append(Derived(f"toolkit.env[{AS_VOLUME_MOUNTS}]", "true",
                               f"gpu-operator {line}: the toolkit takes the GPUs the device plugin names as volume "
                               f"mounts under /var/run/nvidia-container-devices (not gated by the variable's "
                               f"setting), so GPU pods keep their GPUs"))
        derived.append(Derived(f"devicePlugin.env[{DEVICE_LIST_STRATEGY}]", "volume-mounts",
                               f"gpu-operator {line}: the device plugin's default strategy envvar would hand GPUs "
                               f"through the variable the toolkit now ignores in unprivileged containers; "
                               f"volume-mounts hands them as mounts (user env wins from 25.3; on 24.x only with CDI "
                               f"off)"))
    for list_path in ("toolkit.env", "devicePlugin.env"):
        if get_path(section.values, list_path, None) is not None:
            warnings.append(f"gpu_operator.values sets {list_path}, which replaces the list gpu-bootstrap derives: "
                            f"keep {', '.join(k.split('[')[1][:-1] for k in device_access_paths(operator_version) if k.startswith(list_path + '['))} "
                            f"in it, or GPUs are reachable through NVIDIA_VISIBLE_DEVICES again")


def _nri(facts, operator_version, derived) -> None:
    if version_tuple(operator_version) < NRI_MIN_OPERATOR:
        raise Refusal(f"runtime_integration: nri needs gpu-operator v26.3.0 or newer (this is {operator_version})",
                      "pin gpu_operator.version to v26.3.0+ or use runtime_integration: auto")
    old = [f"{f.name} ({f.runtime} {f.runtime_version})" for f in facts
           if f.runtime != "containerd" or version_tuple(f.runtime_version) < NRI_MIN_CONTAINERD]
    if old:
        raise Refusal(f"runtime_integration: nri needs containerd 1.7.30 or newer on every GPU node: {_nodes(old)}",
                      "upgrade containerd, or use runtime_integration: auto")
    derived.append(Derived("cdi.enabled", True, "runtime_integration: nri"))
    derived.append(Derived("cdi.nriPluginEnabled", True, f"operator {operator_version}, containerd >= 1.7.30 on "
                                                         f"{_nodes(f.name for f in facts)}: no runtime config paths"))


def _placement(config, base, playbook_steps, derived, no_room: bool = False) -> None:
    taint = config.node_prep.taint if config.node_prep.enabled and "node-prep" in playbook_steps else None
    if taint is not None and no_room:
        toleration = {"key": taint.key, "operator": "Exists", "effect": taint.effect}
        why = (f"no node stays untainted, schedulable and Ready once the GPU nodes carry {taint}: the operator's "
               f"own pods must tolerate it")
        for path in ("operator.tolerations", "node-feature-discovery.master.tolerations"):
            derived.append(Derived(path, [CONTROL_PLANE_TOLERATION, toleration], why))
        derived.append(Derived("node-feature-discovery.gc.tolerations", [toleration], why))
    if taint is not None:
        default = base.get("daemonsets", {}).get("tolerations") or []
        toleration = {"key": taint.key, "operator": "Exists", "effect": taint.effect}
        if toleration not in default:
            derived.append(Derived("daemonsets.tolerations", default + [toleration],
                                   f"node_prep.taint {taint}: operands must run on the tainted GPU nodes"))
            derived.append(Derived("node-feature-discovery.worker.tolerations", [
                {"key": "node-role.kubernetes.io/control-plane", "operator": "Equal", "value": "",
                 "effect": "NoSchedule"}, {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                toleration], f"node_prep.taint {taint}: NFD must see the tainted GPU nodes"))
    if config.node_prep.enabled and config.node_prep.gpu_present_label and "node-prep" in playbook_steps:
        derived.append(Derived("node-feature-discovery.worker.nodeSelector", {"nvidia.com/gpu.present": "true"},
                               "node-prep labels the GPU nodes, so NFD need not run on the others"))
    elif config.node_selector and (labels := selector_equalities(config.node_selector)):
        derived.append(Derived("node-feature-discovery.worker.nodeSelector", labels,
                               f"nodes: {config.node_selector}: NFD runs on the selected GPU nodes only"))


def _sharing(facts, config, derived, labels, warnings) -> None:
    sharing = config.gpu_operator.sharing
    names = [n.name for n in config.nodes]
    if sharing.mode == "time-slicing":
        data = {"default": _time_slicing(sharing, sharing.replicas)}
        for profile, replicas in sorted(sharing.profiles.items()):
            data[profile] = _time_slicing(sharing, replicas)
        for node, profile in sharing.node_profiles.items():
            if node not in names:
                raise Refusal(f"sharing.node_profiles names {node!r}, which is not a configured GPU node",
                              f"use one of: {', '.join(names)}")
            if profile not in data:
                raise Refusal(f"sharing.node_profiles: {node} uses profile {profile!r}, which sharing.profiles does "
                              f"not define", f"define it in sharing.profiles (known: {', '.join(sorted(data))})")
            labels.setdefault(node, {})["nvidia.com/device-plugin.config"] = profile
        digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:8]
        derived.append(Derived("devicePlugin.config", {"create": True, "name": f"time-slicing-{digest}",
                                                       "default": "default", "data": data},
                               f"sharing: time-slicing, {sharing.replicas} pods per GPU (the name follows the content, "
                               f"so an edit restarts the device plugin: NVIDIA/gpu-operator#1144)"))
    elif sharing.mode == "mig":
        derived.append(Derived("mig.strategy", sharing.mig_strategy, "sharing: mig"))
        for node in names:
            labels.setdefault(node, {})["nvidia.com/mig.config"] = sharing.mig_node_configs.get(node,
                                                                                               sharing.mig_config)
        derived.append(Derived("nodes:nvidia.com/mig.config", sharing.mig_config, "sharing: mig (per-node values from "
                                                                                  "sharing.mig_node_configs)"))
        for f in facts:
            unable = sorted({g for g in f.gpus if not MIG_CAPABLE.search(g)})
            if unable:
                warnings.append(f"{f.name}: {', '.join(unable)} cannot be partitioned with MIG; the MIG manager will "
                                f"leave it whole")


def _pool_operands(config, playbook_steps, derived, warnings) -> None:
    """Nodes launched from our pools bring the driver and the NVIDIA runtime (Bottlerocket: its device plugin too):
    the operator skips those operands on nodes labelled nvidia.com/gpu.deploy.<operand>=false, which each pool's node
    template sets. Said here, with the reason, because it shapes what the operator deploys where."""
    from gpu_bootstrap.render.gpu_pools import IMAGE_OPERAND_LABELS, IMAGE_REASON
    if not config.pools or "gpu-pools" not in playbook_steps:
        return
    for pool in config.pools:
        for label, value in IMAGE_OPERAND_LABELS[pool.ami_family].items():
            derived.append(Derived(f"pools:{pool.name}:{label}", value,
                                   f"{IMAGE_REASON[pool.ami_family]}: NodePool {pool.name} labels its nodes so the "
                                   f"operator skips that operand there"))
    bottlerocket = [p.name for p in config.pools if p.ami_family == "bottlerocket"]
    if bottlerocket and config.gpu_operator.sharing.mode != "none":
        warnings.append(f"sharing: {config.gpu_operator.sharing.mode} is configured through the operator's device "
                        f"plugin, which does not run on Bottlerocket pool(s) {', '.join(bottlerocket)}: set sharing "
                        f"there in Bottlerocket's own settings (settings.kubelet-device-plugins.nvidia)")


def _time_slicing(sharing, replicas: int) -> str:
    return yaml.safe_dump({"version": "v1", "flags": {"migStrategy": "none"}, "sharing": {"timeSlicing": {
        "renameByDefault": sharing.rename_by_default, "failRequestsGreaterThanOne":
            sharing.fail_requests_greater_than_one, "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}},
        sort_keys=False)


# --- trees ------------------------------------------------------------------------------------------------------------
