"""What `gpu-bootstrap simulate` does, without the flag parsing: choose the inputs and profiles, run, present."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import ConfigError, UsageError
from . import gap_closed, run, scoring, trace

BUILTIN_POLICIES = {"random": scoring.RANDOM_PROFILE, "blog-recipe": scoring.BLOG_PROFILE}


@dataclass
class SimOptions:
    pods: Path
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


def with_sets(options: SimOptions, settings):
    """The scheduler section of the config (or its defaults), with --set KEY=VALUE applied."""
    from .. import config as config_module
    if options.sets:
        from pydantic import ValidationError
        data = settings.model_dump()
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


def profiles(options: SimOptions, settings, kube_version: str) -> list[scoring.Profile]:
    from ..render import scheduler as render
    default = dataclasses.replace(scoring.DEFAULT_PROFILE, percentage_of_nodes_to_score=options.default_percentage)
    ours = scoring.profile_from_config(render.scheduler_configuration(settings, kube_version))
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


def simulate(options: SimOptions, settings, kube=None, progress=None) -> dict:
    """Replay the trace with the scheduler `settings` (the config's section); `kube` reads the live cluster for
    --from-cluster."""
    from ..versions import DEFAULT_KUBE_VERSION, server_version
    validate(options)
    settings = with_sets(options, settings)
    pods = trace.load_pods(options.pods)
    used = None
    kube_version = DEFAULT_KUBE_VERSION
    if options.from_cluster:
        kube_version = server_version(kube.version()) or DEFAULT_KUBE_VERSION
        nodes, used = trace.cluster_inventory(kube)
        source = f"cluster {kube.host}"
        if not any(n.gpus for n in nodes):
            raise ConfigError("no schedulable node of the cluster advertises nvidia.com/gpu",
                              "is the gpu-operator's device plugin running? (gpu-bootstrap doctor)")
    else:
        nodes = trace.load_nodes(options.nodes)
        source = str(options.nodes)
    chosen = profiles(options, settings, kube_version)
    try:
        document = run(nodes, pods, chosen, options.track, options.seeds, options.tune, used, options.departures,
                       options.workers, progress)
    except ValueError as error:
        raise ConfigError(f"{options.pods}: {error}", "track B includes fractional GPU pods") from None
    document["inventory"]["source"] = source
    document["population"]["source"] = str(options.pods)
    document["gap_closed_pct"] = gap_closed(document, settings.name)
    document["scheduler"] = settings.name
    return document


# --- presenting ------------------------------------------------------------------------------------------------------
def _pct(value) -> str:
    return "never" if value is None else f"{value:.2f}"


def table(document: dict):
    from rich.table import Table
    from ..ui import escape
    sizes = ("1", "2", "4", "8")
    grid = Table(title=f"GPU packing, track {document['track']}, median of {document['seeds']} seed(s) "
                       f"({document['inventory']['gpus']} GPUs on {document['inventory']['gpu_nodes']} nodes)",
                 title_justify="left")
    for column in ("policy", "alloc %\n@100", "alloc %\n@130", "1st frag\narrived %", "frag fails\n1/2/4/8",
                   "stranded\nGPUs", "free GPUs\nused nodes", "free\n8-GPU nodes"):
        grid.add_column(column, justify="left" if column == "policy" else "right",
                        overflow="fold" if column == "policy" else "ellipsis")
    for policy in document["policies"]:
        frag = "/".join(f"{policy['frag_failures'].get(s, 0):g}" for s in sizes)
        grid.add_row(escape(policy["name"]), _pct(policy["alloc_pct_at_100"]), _pct(policy["alloc_pct_at_130"]),
                     _pct(policy["first_frag_failure_pct"]), frag, f"{policy['stranded_gpus']:g}",
                     f"{policy['partial_free_gpus']:g}", f"{policy['free_8gpu_nodes']:g}")
    offline = document["bounds"]["offline_ffd"]
    grid.add_row("offline reference (FFD)", _pct(offline["alloc_pct_at_100"]), _pct(offline["alloc_pct_at_130"]),
                 "", "", "", "", "", style="dim")
    grid.add_row("aggregate bound", "100.00", "100.00", "", "", "", "", "", style="dim")
    return grid


def notes(document: dict) -> list[str]:
    lines = ["alloc % @N: GPUs allocated, % of capacity, when N% of it had arrived. 1st frag: arrived % at the first "
             "pod rejected although enough GPUs were free in total; frag 1/2/4/8: such rejections by pod size up to "
             "100%. At 100%: stranded = free GPUs on nodes whose cpu or memory cannot take the smallest GPU pod, "
             "free/used = free GPUs on partly used nodes, free 8-GPU = untouched 8-GPU nodes."]
    lines += [f"{p['name']}: {p['profile']}" for p in document["policies"]]
    if document.get("gap_closed_pct") is not None:
        lines.append(f"{document['scheduler']} closes {document['gap_closed_pct']:.1f}% of the gap between the "
                     f"default profile and the offline reference at 100% arrived")
    speed = document["speed"]
    lines.append(f"{document['arrivals_per_seed']:g} arrivals per seed; {speed['pods_per_second']} pods placed per "
                 f"second per worker; {speed['seconds']}s on {speed['workers']} worker(s)")
    return lines


def plot(document: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib", "pip install 'gpu-bootstrap[plot]'") from None
    figure, axes = plt.subplots(figsize=(8, 5))
    top = 100.0 * document["tune"]
    axes.plot([0, 100, top], [0, 100, 100], color="grey", linestyle=":", label="aggregate bound")
    for policy in document["policies"]:
        arrived, allocated = zip(*policy["curve"]) if policy["curve"] else ((), ())
        axes.plot(arrived, allocated, label=policy["name"])
    axes.set_xlabel("arrived GPU demand, % of capacity")
    axes.set_ylabel("GPUs allocated, % of capacity")
    axes.set_title(f"GPU packing, track {document['track']} (first seed)")
    axes.set_xlim(0, top)
    axes.set_ylim(0, 102)
    axes.legend(loc="lower right")
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=120)
    except OSError as error:
        raise UsageError(f"--plot {path}: {error.strerror}") from None
    finally:
        plt.close(figure)
