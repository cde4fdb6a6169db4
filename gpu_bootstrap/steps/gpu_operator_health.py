"""The gpu-operator's operands on the GPU nodes, as `verify` and `doctor` judge them: which operand pods fail, on which
node, with the fix NVIDIA's issues give for each; and where a driver upgrade is stuck (the upgrade controller's
states and their timeouts). Pure: nodes, pods, DaemonSets and events in, problems as sentences out."""
from __future__ import annotations

from gpu_bootstrap.core.objects import pod_ready, pod_state

GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
OPERAND_FIXES = {
    "nvidia-driver-daemonset": "if the driver is already on the host set gpu_operator.driver_management: host "
                               "(NVIDIA/gpu-operator#126); if it cannot build against the kernel, install the kernel "
                               "headers or use precompiled drivers (#85); logs: -c nvidia-driver-ctr",
    "nvidia-container-toolkit-daemonset": "the toolkit cannot configure the runtime: check toolkit.env "
                                          "CONTAINERD_CONFIG / CONTAINERD_SOCKET against `gpu-bootstrap doctor` (#473); "
                                          "logs: -c nvidia-container-toolkit-ctr",
    "nvidia-operator-validator": "it waits for the driver and the toolkit: fix those pods first (#280); logs: "
                                 "-c driver-validation, -c toolkit-validation",
    "nvidia-device-plugin-daemonset": "usually waiting for the toolkit ('no runtime for \"nvidia\" is configured', "
                                      "#432): check the toolkit pod and the runtime config",
    "gpu-feature-discovery": "it waits for the device plugin",
    "nvidia-dcgm-exporter": "it needs a working driver; check the driver pod",
    "nvidia-mig-manager": "some GPUs need a reboot to change MIG mode (#668); logs: -c nvidia-mig-manager",
}


def gpu_resources(node: dict) -> int:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    total = 0
    for name, amount in allocatable.items():
        if name.startswith(GPU_RESOURCE_PREFIXES):
            try:
                total += int(str(amount))
            except ValueError:
                continue
    return total


def operand_problems(daemonsets: list[dict], pods: list[dict], nodes: dict[str, dict | None],
                     namespace: str, dra: bool = False) -> list[str]:
    """Pure: what keeps the operator's operands from being ready on the GPU nodes (empty when all is well). `dra`:
    allocation dra, where no device plugin runs and the GPUs are not node capacity (the DRA driver's own check
    follows)."""
    problems = []
    marker = "nvidia-operator-validator" if dra else "nvidia-device-plugin"
    if not any(ds["metadata"]["name"].startswith(marker) for ds in daemonsets):
        problems.append(f"the operator has not created its operands yet (no {marker} DaemonSet): check "
                        f"the gpu-operator pod in {namespace} and its ClusterPolicy")
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node not in nodes or pod_ready(pod):
            continue
        operand = _operand_of(pod)
        fix = OPERAND_FIXES.get(operand, "kubectl describe pod for the reason")
        problems.append(f"{operand} on {node} is {pod_state(pod)}: {fix} "
                        f"(kubectl -n {namespace} logs {pod['metadata']['name']})")
    for ds in daemonsets:
        status = ds.get("status") or {}
        name = ds["metadata"]["name"]
        desired = status.get("desiredNumberScheduled", 0)
        meant = meant_for(ds, nodes)
        if desired < meant and name.startswith("nvidia-device-plugin"):
            problems.append(f"{name} is scheduled on {desired} of {meant} GPU nodes: do its "
                            f"tolerations cover the node taint (daemonsets.tolerations), and are the nodes labelled?")
        # Pods that were never created are in no pod list: only the DaemonSet's own counts show them (the real API
        # server refused every pod of an operand whose ServiceAccount was missing, while the nodes already
        # advertised GPUs from an earlier device plugin, and this check passed).
        ready, current = status.get("numberReady", 0), status.get("currentNumberScheduled", 0)
        if ready < desired and current < desired:
            problems.append(f"{name} has {current} of {desired} pod(s): the DaemonSet cannot create the rest "
                            f"(kubectl -n {namespace} describe daemonset {name} shows why, e.g. FailedCreate)")
    for name, node in sorted(nodes.items()):
        if node is None:
            problems.append(f"{name} is not a node of the cluster")
        elif not dra and not gpu_resources(node):
            problems.append(f"{name} advertises no nvidia.com/gpu yet: the device plugin is not running there")
    return problems


DEPLOY_LABEL = "nvidia.com/gpu.deploy."  # the operator's own per-operand switches on each GPU node


def meant_for(daemonset: dict, nodes: dict[str, dict | None]) -> int:
    """How many of the GPU nodes an operand is meant for: those its nodeSelector matches, the operator's own
    gpu.deploy.* switches left out (a node that lacks them is one the operator has not labelled yet, which the
    shortfall should show). The real controller's MPS control daemon selects nvidia.com/mps.capable=true, which
    GPU feature discovery sets only where MPS sharing is configured: on other nodes it is meant to run nowhere."""
    selector = ((daemonset.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeSelector") or {}
    wanted = {k: v for k, v in selector.items() if not k.startswith(DEPLOY_LABEL)}
    return sum(1 for node in nodes.values() if node is not None and
               all(((node.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in wanted.items()))


UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_STARTED = {  # states the upgrade controller stamps with their start time (unix seconds)
    "validation-required": "nvidia.com/gpu-driver-upgrade-validation-start-time",
    "wait-for-jobs-required": "nvidia.com/gpu-driver-upgrade-wait-for-pod-completion-start-time",
}
VALIDATION_TIMEOUT = 600  # the upgrade controller fails validation after 10 minutes (hard-coded upstream)
SLACK = 120  # the controller's own reconcile interval on top of each timeout


def driver_upgrade_problems(nodes: dict[str, dict | None], events: list[dict], policy, namespace: str,
                            now: float) -> list[str]:
    """Pure: nodes whose driver upgrade failed, or that have stayed in one state longer than its timeout allows
    (from the controller's start-time annotation, else from its latest GPUDriverUpgrade event on the node; a state
    whose start is unknown is not called stuck)."""
    limits = {"validation-required": VALIDATION_TIMEOUT,
              "wait-for-jobs-required": policy.wait_for_jobs_timeout,
              "pod-deletion-required": policy.gpu_pod_deletion_timeout,
              "drain-required": policy.drain_timeout if policy.drain else 0}
    problems = []
    for name, node in sorted(nodes.items()):
        meta = (node or {}).get("metadata") or {}
        state = (meta.get("labels") or {}).get(UPGRADE_STATE)
        if state == "upgrade-failed":
            problems.append(f"the driver upgrade failed on {name}: read the nvidia-driver-daemonset pod's log there "
                            f"and the nvidia-operator-validator's init containers (kubectl -n {namespace} get pods -o "
                            f"wide --field-selector spec.nodeName={name}); once fixed, label the node "
                            f"{UPGRADE_STATE}=upgrade-required to retry")
            continue
        limit = limits.get(state or "", 0)
        since = _state_since(name, state, meta.get("annotations") or {}, events) if limit else None
        if since is not None and now - since > limit + SLACK:
            problems.append(f"{name} has been in driver upgrade state {state} for {int((now - since) // 60)} min, "
                            f"longer than its {limit}s timeout: kubectl describe node {name} (events), and the "
                            f"pods on it that the upgrade waits for (gpu_operator.driver_upgrade)")
    return problems


def _state_since(name: str, state: str, annotations: dict, events: list[dict]) -> float | None:
    stamp = annotations.get(UPGRADE_STARTED.get(state, ""), "")
    if stamp.isdigit():
        return float(stamp)
    from gpu_bootstrap.core.objects import parse_time
    times = [parse_time(e.get("lastTimestamp") or e.get("eventTime") or (e.get("metadata") or {}).get(
        "creationTimestamp")) for e in events
        if (e.get("involvedObject") or {}).get("name") == name and f"[{state}]" in (e.get("message") or "")]
    times = [t for t in times if t is not None]
    return max(times).timestamp() if times else None


def _operand_of(pod: dict) -> str:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "DaemonSet":
            return ref.get("name", "")
    return pod["metadata"]["name"].rsplit("-", 1)[0]
