"""`simulate --sharing`: the GPUs a trace needs when every GPU pod takes whole GPUs, when GPUs are shared under each
of the FGD artifact's policies (sharing.py, an idealised milli-GPU model), and under a setup one can deploy today:
NVIDIA device-plugin time-slicing with N replicas per GPU, placed by kube-scheduler's bin-packing profile.

Time-slicing, as the device plugin does it (NVIDIA/k8s-device-plugin):
- each physical GPU is advertised as N `nvidia.com/gpu` replicas; kube-scheduler counts replicas only, so a pod asks
  for whole replicas: here ⌈gpu_milli·N/1000⌉ of them for a share, N per whole GPU (what it takes to hold its share);
- the kubelet asks the plugin which replicas to hand out (GetPreferredAllocation). The plugin takes them one at a
  time (internal/rm/allocate.go greedyAlloc): `distributed` (the default) from the GPU with the fewest replicas
  allocated, `packed` from the one with the most; ties go to the GPU this request has used least, then (here) the
  lowest-numbered. `packed` (--shared-devices-allocation-policy, PR #1621) exists from device plugin v0.20.0, which
  gpu-operator v26.7.0 ships; gpu-operator v25.10.1 ships v0.18.1, which has `distributed` only;
- replicas carry no isolation: a pod whose replicas land on several GPUs sees several GPUs ("split" below).
CPU-only pods are left out: GPU nodes are tainted, so they never compete for them.
"""
from __future__ import annotations

import math
import random
import statistics

from gpu_bootstrap.sim import FIRST_SEED, engine, sharing
from gpu_bootstrap.sim.scoring import Profile

DEVICE_PLUGIN_POLICIES = ("distributed", "packed")


def allocate_replicas(allocated: list[int], replicas: int, needed: int, policy: str = "distributed") -> list[int]:
    """The physical GPUs (one per replica) the device plugin hands out for `needed` replicas, given the replicas
    already allocated on each GPU of the node (greedyAlloc with the policy's comparator)."""
    counts, picked, out = list(allocated), [0] * len(allocated), []
    sign = -1 if policy == "packed" else 1
    for _ in range(needed):
        candidates = [g for g, used in enumerate(counts) if used < replicas]
        if not candidates:
            raise ValueError("not enough available replicas on the node")
        gpu = min(candidates, key=lambda g: (sign * counts[g], picked[g], g))
        counts[gpu] += 1
        picked[gpu] += 1
        out.append(gpu)
    return out


def replicas_for(pod: sharing.SharePod, replicas: int) -> int:
    if pod.fractional:
        return math.ceil(pod.gpu_milli * replicas / sharing.MILLI)
    return pod.num_gpu * replicas


def whole_gpus(nodes, order: list[sharing.SharePod], profile: Profile, seed: int) -> dict:
    """Every GPU pod takes whole GPUs (a share rounded up to one), placed by kube-scheduler with `profile`."""
    scheduler = engine.Scheduler(engine.Cluster(nodes), profile, random.Random(seed))
    in_use = unplaced = 0
    for pod in order:
        if scheduler.place(engine.Pod(pod.cpu, pod.memory, pod.num_gpu, pod.models)) is None:
            unplaced += 1
        else:
            in_use += pod.num_gpu
    return {"gpus_in_use": in_use, "unplaced_pods": unplaced, "split_pods": 0}


def shared(nodes, order: list[sharing.SharePod], policy: str, seed: int, typical) -> dict:
    """The idealised milli-GPU model under one of the artifact's policies."""
    cluster = sharing.ShareCluster(nodes)
    scheduler = sharing.ShareScheduler(cluster, policy, random.Random(seed), typical)
    unplaced = sum(1 for pod in order if scheduler.place(pod) is None)
    return {"gpus_in_use": cluster.gpus_in_use(), "unplaced_pods": unplaced, "split_pods": 0}


def time_slicing(nodes, order: list[sharing.SharePod], replicas: int, profile: Profile, policy: str,
                 seed: int) -> dict:
    """Time-slicing with `replicas` per GPU: kube-scheduler places replica counts, the device plugin picks GPUs."""
    replicated = [engine.Node(n.name, n.cpu, n.memory, n.gpus * replicas, n.model, n.labels) for n in nodes]
    scheduler = engine.Scheduler(engine.Cluster(replicated), profile, random.Random(seed))
    allocated = [[0] * n.gpus for n in nodes]
    unplaced = split = 0
    for pod in order:
        wanted = replicas_for(pod, replicas)
        index = scheduler.place(engine.Pod(pod.cpu, pod.memory, wanted, pod.models))
        if index is None:
            unplaced += 1
            continue
        gpus = allocate_replicas(allocated[index], replicas, wanted, policy)
        for gpu in gpus:
            allocated[index][gpu] += 1
        if len(set(gpus)) > max(pod.num_gpu, 1):
            split += 1
    in_use = sum(1 for node in allocated for count in node if count)
    return {"gpus_in_use": in_use, "unplaced_pods": unplaced, "split_pods": split}


def report(nodes, pods: list[sharing.SharePod], profile: Profile, replicas: int = 4, seeds: int = 5,
           policies=sharing.POLICIES) -> dict:
    """Every GPU pod of the trace placed once, in a seeded random order; medians over the seeds."""
    gpu_pods = [p for p in pods if p.num_gpu]
    if not gpu_pods:
        raise ValueError("the pod list has no GPU pods")
    typical = sharing.typical_pods(pods)
    setups: dict[str, list[dict]] = {}
    for seed in range(FIRST_SEED, FIRST_SEED + seeds):
        order = list(gpu_pods)
        random.Random(seed).shuffle(order)
        setups.setdefault("whole GPUs", []).append(whole_gpus(nodes, order, profile, seed))
        for policy in policies:
            setups.setdefault(f"shared: {policy}", []).append(shared(nodes, order, policy, seed, typical))
        for plugin in DEVICE_PLUGIN_POLICIES:
            setups.setdefault(f"time-slicing x{replicas}, {plugin}", []).append(
                time_slicing(nodes, order, replicas, profile, plugin, seed))
    rows = [{"setup": name, **{key: statistics.median(run[key] for run in runs) for key in runs[0]}}
            for name, runs in setups.items()]
    fractional = [p for p in gpu_pods if p.fractional]
    return {
        "sharing": rows,
        "pods": {"gpu_pods": len(gpu_pods), "fractional_pods": len(fractional),
                 "gpus_if_whole": sum(p.num_gpu for p in gpu_pods),
                 "gpu_equivalents": round(sum(p.total_milli for p in gpu_pods) / sharing.MILLI, 2)},
        "inventory": {"nodes": len(nodes), "gpu_nodes": sum(1 for n in nodes if n.gpus),
                      "gpus": sum(n.gpus for n in nodes)},
        "replicas": replicas, "seeds": seeds, "profile": profile.describe(), "scheduler": profile.name,
    }
