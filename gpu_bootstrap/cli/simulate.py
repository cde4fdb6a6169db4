"""The `gpu-bootstrap simulate` command's flags (kept out of commands.py, which stays thin): no cluster needed but with
--from-cluster; the work in sim/command.py, the screen in simulate_view.py."""
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer import Option

from gpu_bootstrap.cli.common import Output, options_from, run
from gpu_bootstrap.cli.common import command as _command


class Track(str, Enum):
    A = "A"
    B = "B"


def register(app: typer.Typer) -> None:
    @_command(app, "config", "kubeconfig", "context", "output", "verbose", "log_file")
    def simulate(common, pods: Annotated[Optional[Path], Option("--pods", metavar="CSV", help=(
            "Pod list in the Alibaba openb format (name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...); an "
            "optional node_affinity column holds a pod's required node affinity, e.g. "
            "\"nvidia.com/gpu.memory>40000\"."))] = None,
                 nodes: Annotated[Optional[Path], Option("--nodes", metavar="CSV", help=(
                     "Node inventory in the openb format (sn,cpu_milli,memory_mib,gpu,model); an optional labels "
                     "column holds node labels (key=value,...)."))] = None,
                 from_cluster: Annotated[bool, Option("--from-cluster", help=(
                     "Use the live cluster's schedulable nodes and what their pods already request, instead of "
                     "--nodes."))] = False,
                 set_: Annotated[Optional[list[str]], Option("--set", metavar="KEY=VALUE", help=(
                     "Try a scheduler setting without editing the config, e.g. --set strategy=RequestedToCapacityRatio "
                     "(repeatable)."))] = None,
                 track: Annotated[Track, Option("--track", help=(
                     "A: whole-GPU pods only (what kube-scheduler sees exactly). B: every pod, fractional GPUs rounded "
                     "up to one."))] = Track.A,
                 seeds: Annotated[int, Option("--seeds", min=1, max=100, help="Random seeds (42, 43, ...); medians are "
                                                                             "reported.")] = 5,
                 tune: Annotated[float, Option("--tune", help=(
                     "Arrivals stop at this multiple of the GPU capacity."))] = 1.3,
                 policy: Annotated[Optional[list[str]], Option("--policy", metavar="NAME", help=(
                     "Also compare a built-in policy: random, blog-recipe (repeatable)."))] = None,
                 default_nodes_to_score: Annotated[int, Option("--default-nodes-to-score", metavar="PCT", help=(
                     "percentageOfNodesToScore for the default profile (100: every node; 0: adaptive)."))] = 100,
                 departures: Annotated[float, Option("--departures", metavar="P", help=(
                     "Churn: after each arrival a random running pod leaves with this probability."))] = 0.0,
                 workers: Annotated[Optional[int], Option("--workers", min=1, help=(
                     "Processes (default: one per core)."))] = None,
                 plot_file: Annotated[Optional[Path], Option("--plot", metavar="FILE.png", help=(
                     "Draw GPU allocation against arrived demand for each policy (needs matplotlib)."))] = None,
                 sharing: Annotated[bool, Option("--sharing", help=(
                     "GPUs the trace's GPU pods need: whole GPUs, shared (milli-GPU) under each FGD-paper policy, and "
                     "time-slicing with --replicas per GPU and the device plugin's distributed/packed "
                     "allocation."))] = False,
                 shapes: Annotated[bool, Option("--shapes", help=(
                     "Instead of a trace: inference pods (1 GPU, 500m, 1 Gi), light 2-GPU pods, a light 1/2/4-GPU mix "
                     "and training pods (1 GPU, 8 cpu, 64 Gi), each at 25/50/75 % of the GPUs of the nodes with the "
                     "most GPUs (taken empty), and how many of those nodes stay whole against the ideal. "
                     "kube-scheduler's default samples nodes as deployed with --default-nodes-to-score 0."))] = False,
                 replicas: Annotated[int, Option("--replicas", metavar="N", help=(
                     "Time-slicing replicas per GPU for --sharing (as gpu_operator.sharing.replicas).")
                 )] = 4,
                 kube_version: Annotated[Optional[str], Option("--kube-version", metavar="X.Y", help=(
                     "The kube-scheduler version to model (its scoring changed in 1.36: BalancedAllocation scores the "
                     "change a pod makes to a node's balance). Default: the cluster's with --from-cluster, else 1.33."
                 ))] = None,
                 autoscale: Annotated[bool, Option("--autoscale", help=(
                     "Replay the trace's pods at their own times (creation_time, deletion_time) on nodes an autoscaler "
                     "adds when a pod fits nowhere (the inventory's largest GPU node shape) and removes once empty for "
                     "--consolidate-after, as a NodePool of `pools` does; report the node-hours each profile costs."
                 ))] = False,
                 consolidate_after: Annotated[str, Option("--consolidate-after", metavar="DURATION", help=(
                     "With --autoscale: how long a node stays empty before it is removed (your pool's "
                     "disruption.consolidate_after; the pools' default is 10m)."))] = "10m") -> None:
        """Replay a GPU workload trace onto nodes with kube-scheduler's scoring: the default profile against the
        bin-packing profile `up` deploys (from your config's `scheduler` section), before you deploy it.

        With --shapes, no trace: pods of four typical shapes arrive instead, and what counts is how many whole GPU nodes
        each profile leaves empty for whole-node jobs, against the fewest nodes the pods fit on.

        With --autoscale, the cluster grows and shrinks: the trace's pods arrive and leave at their own times, a node is
        added when a pod fits on none and removed after --consolidate-after empty (pods are never moved), and what
        counts is node-hours, the bill: a packing profile lets the emptiest nodes drain and go.

        Pods are drawn at random from --pods until their GPU requests reach --tune x the GPUs, then placed one by one.
        Reported per policy (medians over seeds): GPUs allocated at 100% and 130% arrived, fragmentation failures
        (a pod rejected although enough GPUs were free in total), when the first one came, stranded GPUs, and free
        8-GPU nodes; with an offline first-fit-decreasing reference.

        [bold]Examples[/]

          gpu-bootstrap simulate --nodes N.csv --pods P.csv
          gpu-bootstrap simulate --nodes N.csv --pods P.csv --track B --plot p.png
          gpu-bootstrap simulate --from-cluster --pods P.csv --set fit_weight=2
          gpu-bootstrap simulate --nodes N.csv --pods P.csv --sharing --replicas 4
          gpu-bootstrap simulate --nodes N.csv --shapes --kube-version 1.35
          gpu-bootstrap simulate --nodes N.csv --pods P.csv --autoscale --consolidate-after 10m
        """
        from gpu_bootstrap.sim.command import SimOptions
        if kube_version is not None and not re.fullmatch(r"v?1\.\d+(\.\d+)?", kube_version):
            raise typer.BadParameter(f"{kube_version!r} is not a Kubernetes version (e.g. 1.36 or 1.37.2)",
                                     param_hint="--kube-version")
        if (shapes or autoscale) and plot_file:
            raise typer.BadParameter("--plot draws a trace's replay; --shapes and --autoscale print a table",
                                     param_hint="--plot")
        sim_options = SimOptions(pods, nodes, from_cluster, list(set_ or []), track.value, seeds, tune,
                                 list(policy or []), default_nodes_to_score, departures, workers, sharing, replicas,
                                 kube_version.removeprefix("v") if kube_version else None, shapes, autoscale,
                                 consolidate_after)

        def body():
            from gpu_bootstrap.app import commands as application
            from gpu_bootstrap.cli.simulate_view import show_simulation
            show_simulation(lambda progress=None: application.simulate(sim_options, options_from(common), progress),
                            common["output"] == Output.json, plot_file)

        run("simulate", common, body)
