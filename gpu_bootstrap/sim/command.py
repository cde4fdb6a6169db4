"""What `gpu-bootstrap simulate` does, without the flag parsing: choose the inputs and profiles, run, present."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpu_bootstrap.core.errors import ConfigError, UsageError
from gpu_bootstrap.sim import gap_closed, run, scoring, trace

BUILTIN_POLICIES = {"random": scoring.RANDOM_PROFILE, "blog-recipe": scoring.BLOG_PROFILE}


@dataclass
class SimOptions:
    pods: Path | None
    nodes: Path | None = None
    from_cluster: bool = False
    sets: list[str] = field(default_factory=list)
    track: str = "A"
    seeds: int = 5
    tune: float = 1.3
    policies: list[str] = field(default_factory=list)
    default_percentage: int = 100
    departures: float = 0.0
    workers: int | None = None
    sharing: bool = False  # --sharing: GPUs needed whole vs shared (sim/deployable.py)
    replicas: int = 4  # --replicas: time-slicing replicas per GPU for the deployable setup
    kube_version: str | None = None  # --kube-version: the kube-scheduler whose scoring is modelled
    shapes: bool = False  # --shapes: the workload-shape benchmark (sim/shapes.py) instead of the trace
    autoscale: bool = False  # --autoscale: the trace's own times on nodes an autoscaler adds and removes
    consolidate_after: str = "10m"  # --consolidate-after: how long a node stays empty before it is removed


def with_sets(options: SimOptions, settings):
    """The scheduler section of the config (or its defaults), with --set KEY=VALUE applied."""
    from gpu_bootstrap.core import config as config_module
    if options.sets:
        from pydantic import ValidationError
        data = settings.model_dump(exclude_unset=True)  # unset stays unset: the version's default profile
        for item in options.sets:
            key, sep, value = item.partition("=")
            key = key.strip().removeprefix("scheduler.")
            if not sep or key not in config_module.SchedulerConfig.model_fields:
                raise UsageError(f"--set {item!r}: expected KEY=VALUE with KEY a scheduler setting",
                                 f"e.g. --set strategy=RequestedToCapacityRatio; settings: "
                                 f"{', '.join(config_module.SchedulerConfig.model_fields)}")
            data[key] = yaml.safe_load(value)
        try:
            settings = config_module.SchedulerConfig.model_validate(data)
        except ValidationError as error:
            first = error.errors()[0]
            raise UsageError(f"--set: scheduler.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    return settings


def profiles(options: SimOptions, settings, kube_version: str, node_count: int) -> list[scoring.Profile]:
    """kube-scheduler's default profile and ours as `up` renders it for a cluster of `node_count` nodes, then the
    built-in policies asked for."""
    from gpu_bootstrap.render import scheduler as render
    default = dataclasses.replace(scoring.DEFAULT_PROFILE, percentage_of_nodes_to_score=options.default_percentage,
                                  balanced_by_change=scoring.balanced_by_change(kube_version))
    ours = scoring.profile_from_config(render.scheduler_configuration(settings, kube_version, node_count), 0,
                                       kube_version)
    chosen = [default, ours]
    for name in options.policies:
        if name not in BUILTIN_POLICIES:
            raise UsageError(f"--policy {name!r} is not a built-in policy", f"choose from "
                                                                           f"{', '.join(BUILTIN_POLICIES)}")
        if all(p.name != name for p in chosen):
            chosen.append(BUILTIN_POLICIES[name])
    return chosen


def validate(options: SimOptions) -> None:
    if bool(options.nodes) == bool(options.from_cluster):
        raise UsageError("give the nodes with exactly one of --nodes FILE or --from-cluster")
    if options.shapes and (options.pods or options.sharing):
        raise UsageError("--shapes places its own pods: leave out --pods and --sharing",
                         "run the trace (--pods) and the shapes (--shapes) as two commands")
    if options.autoscale and (options.shapes or options.sharing):
        raise UsageError("--autoscale replays the trace's pods at their own times: leave out --shapes and --sharing")
    if options.autoscale:
        from gpu_bootstrap.core.config.fields import parse_age
        try:
            if parse_age(options.consolidate_after) <= 0:
                raise ValueError(f"{options.consolidate_after!r}: a node must stay empty for some time")
        except ValueError as error:
            raise UsageError(f"--consolidate-after: {error}", "e.g. 10m (the pools' default), 30s, 1h") from None
    if not options.shapes and options.pods is None:
        raise UsageError("give the pods to replay with --pods CSV, or --shapes for the workload-shape benchmark")
    if options.track not in ("A", "B"):
        raise UsageError(f"--track {options.track!r}: choose A (whole-GPU pods) or B (all pods, fractions rounded "
                         f"up)")
    if not 1 <= options.seeds <= 100:
        raise UsageError(f"--seeds {options.seeds}: choose between 1 and 100")
    if not 1.0 <= options.tune <= 3.0:
        raise UsageError(f"--tune {options.tune}: arrived demand must end between 1.0 and 3.0 x capacity")
    if not 0.0 <= options.departures < 1.0:
        raise UsageError(f"--departures {options.departures}: a probability per arrival, from 0 up to 1")
    if not 0 <= options.default_percentage <= 100:
        raise UsageError("--default-nodes-to-score: a percentage, 0 (adaptive) to 100")
    if not 2 <= options.replicas <= 256:
        raise UsageError(f"--replicas {options.replicas}: time-slicing replicas per GPU, from 2 to 256 (as "
                         f"gpu_operator.sharing.replicas)")
    if options.sharing and options.from_cluster:
        raise UsageError("--sharing needs --nodes FILE: the GPU shares of a live cluster's running pods are not known",
                         "export the nodes to the openb CSV format, or run without --sharing")


def simulate(options: SimOptions, settings, kube=None, progress=None) -> dict:
    """Replay the trace with the scheduler `settings` (the config's section); `kube` reads the live cluster for
    --from-cluster."""
    from gpu_bootstrap.core.versions import DEFAULT_KUBE_VERSION, server_version
    validate(options)
    settings = with_sets(options, settings)
    pods = trace.load_pods(options.pods) if options.pods else []
    used = None
    notes: list[str] = []
    kube_version = options.kube_version or DEFAULT_KUBE_VERSION
    if options.from_cluster:
        kube_version = options.kube_version or server_version(kube.version()) or DEFAULT_KUBE_VERSION
        counted = DraCounted(kube)
        nodes, used = trace.cluster_snapshot(counted)  # one Pod per running pod: defaults count per container
        source = f"cluster {kube.host}"
        if not any(n.gpus for n in nodes):
            raise ConfigError("no schedulable node of the cluster advertises nvidia.com/gpu or publishes GPUs "
                              "through NVIDIA's DRA driver" + "".join(f"; {note}" for note in counted.notes),
                              "is the gpu-operator's device plugin (or the DRA driver) running? (gpu-bootstrap doctor)")
        notes = counted.notes  # the DRA GPUs could not be read: the report says so, it does not guess
    else:
        nodes = trace.load_nodes(options.nodes)
        source = str(options.nodes)
    if options.autoscale:
        return simulate_autoscale(options, nodes, pods, settings, kube_version, source, progress, notes)
    chosen = profiles(options, settings, kube_version, len(nodes))
    if options.shapes:
        return simulate_shapes(options, nodes, chosen, source, kube_version, progress, notes)
    if options.sharing:
        return simulate_sharing(options, nodes, pods, chosen[1], source)
    try:
        document = run(nodes, pods, chosen, options.track, options.seeds, options.tune, used, options.departures,
                       options.workers, progress)
    except ValueError as error:
        raise ConfigError(f"{options.pods}: {error}", "track B includes fractional GPU pods") from None
    document["inventory"]["source"] = source
    document["inventory"]["notes"] = notes
    document["population"]["source"] = str(options.pods)
    document["gap_closed_pct"] = gap_closed(document, settings.name)
    document["scheduler"] = settings.name
    return document


def simulate_sharing(options: SimOptions, nodes, pods: list[dict], profile: scoring.Profile, source: str) -> dict:
    """`simulate --sharing`: GPUs needed whole, shared under each policy, and with time-slicing (deployable.py)."""
    try:
        from gpu_bootstrap.sim import deployable, sharing
    except ImportError:
        raise UsageError("--sharing needs numpy", "pip install 'gpu-bootstrap[sim]'") from None
    try:
        document = deployable.report(nodes, sharing.share_pods(pods), profile, options.replicas, options.seeds)
    except ValueError as error:
        raise ConfigError(f"{options.pods}: {error}", "--sharing compares the GPU pods of the trace") from None
    document["inventory"]["source"] = source
    document["pods"]["source"] = str(options.pods)
    return document


class DraCounted:
    """The cluster's nodes and pods with the GPUs NVIDIA's DRA driver serves counted like device-plugin GPUs
    (core/dra.counted), answering `list` as the Kubernetes adapter does."""

    def __init__(self, kube):
        from gpu_bootstrap.core import dra
        self.notes: list[str] = []
        self.nodes, self.pods = dra.counted(kube, kube.list("v1", "Node"), kube.list("v1", "Pod"), self.notes)

    def list(self, api_version: str, kind: str, *_args, **_kwargs) -> list[dict]:
        return {"Node": self.nodes, "Pod": self.pods}[kind]


def simulate_shapes(options: SimOptions, nodes, chosen: list[scoring.Profile], source: str, kube_version: str,
                    progress=None, notes: list[str] = ()) -> dict:
    """`simulate --shapes`: inference, light and training pods at 25/50/75 % of the GPUs on the inventory's nodes
    with the most GPUs (taken empty: what is running now is left out), whole nodes left empty against the ideal."""
    from gpu_bootstrap.sim import FIRST_SEED, shapes
    biggest = shapes.largest_gpu_nodes(nodes)
    if not biggest:
        raise ConfigError(f"no node of {source} has a GPU", "the shapes are GPU pods: give an inventory with GPU nodes")
    seeds = list(range(FIRST_SEED, FIRST_SEED + options.seeds))
    document = shapes.report(biggest, chosen, seeds, workers=options.workers, progress=progress)
    document["shapes"] |= {"source": source, "kube_version": kube_version, "notes": list(notes)}
    return document


def simulate_autoscale(options: SimOptions, nodes, pods: list[dict], settings, kube_version: str, source: str,
                       progress=None, notes: list[str] = ()) -> dict:
    """`simulate --autoscale`: the trace's pods at their own times on nodes of the inventory's largest GPU shape,
    added when a pod fits nowhere and removed after --consolidate-after empty; node-hours per profile."""
    from gpu_bootstrap.core.config.fields import parse_age
    from gpu_bootstrap.sim import FIRST_SEED, autoscale
    timed = autoscale.timed(pods, options.track)
    if not timed:
        raise ConfigError(f"{options.pods}: no GPU pod has both creation_time and deletion_time",
                          f"--autoscale replays pods at their times: give the openb columns "
                          f"{', '.join(trace.TIME_COLUMNS)} (seconds)")
    if not any(n.gpus for n in nodes):
        raise ConfigError(f"no node of {source} has a GPU", "the autoscaler adds nodes of the inventory's largest "
                                                             "GPU shape: give an inventory with GPU nodes")
    instance = autoscale.instance_type(nodes)
    after = parse_age(options.consolidate_after)
    # ours as `up` renders it for the most nodes this trace can have up at once
    chosen = profiles(options, settings, kube_version, autoscale.most_at_once(timed))
    seeds = list(range(FIRST_SEED, FIRST_SEED + options.seeds))
    document = autoscale.report(timed, instance, chosen, seeds, after, progress)
    document["autoscale"] |= {"source": source, "pods_file": str(options.pods), "kube_version": kube_version,
                              "consolidate_after": options.consolidate_after, "notes": list(notes)}
    return document
