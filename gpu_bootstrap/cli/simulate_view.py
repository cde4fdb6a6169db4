"""What `gpu-bootstrap simulate` shows: its tables and notes for people (a trace's replay, the shapes, sharing,
autoscaled nodes), its JSON, and the replay's plot."""
from __future__ import annotations

from pathlib import Path

from gpu_bootstrap.cli.ui import console, escape, print_json


def show_simulation(run, as_json: bool, plot_file: Path | None) -> None:
    """Run a simulation (with a progress bar for people) and show its table, notes and plot, or its JSON."""
    if as_json:
        document = run()
    else:
        from rich.progress import Progress
        with Progress(transient=True, console=console(stderr=True)) as bar:
            task = bar.add_task("simulating", total=None)
            document = run(progress=lambda: bar.advance(task))
    if plot_file:
        plot(document, plot_file)
    if as_json:
        print_json(document if {"sharing", "shapes", "autoscale"} & set(document) else
                   document | {"policies": [{k: v for k, v in p.items() if k != "curve"}
                                            for p in document["policies"]]})
        return
    out = console()
    if "shapes" in document:
        out.print(shapes_table(document["shapes"]))
        for line in shapes_notes(document["shapes"]):
            out.print(escape(line))
        return
    if "autoscale" in document:
        out.print(autoscale_table(document["autoscale"]))
        for line in autoscale_notes(document["autoscale"]):
            out.print(escape(line))
        return
    if "sharing" in document:
        out.print(sharing_table(document))
        for line in sharing_notes(document):
            out.print(escape(line))
        return
    out.print(table(document))
    for line in notes(document):
        out.print(escape(line))
    if plot_file:
        out.print(f"plot: {escape(str(plot_file))}")


def _pct(value) -> str:
    return "never" if value is None else f"{value:.2f}"


def table(document: dict):
    from rich.table import Table
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


def sharing_table(document: dict):
    from rich.table import Table
    pods = document["pods"]
    grid = Table(title=f"GPUs needed by {pods['gpu_pods']} GPU pods ({pods['fractional_pods']} fractional, "
                       f"{pods['gpu_equivalents']:g} GPU-equivalents), median of {document['seeds']} seed(s), on "
                       f"{document['inventory']['gpus']} GPUs", title_justify="left")
    for column in ("setup", "GPUs in use", "saved vs whole", "unplaced pods", "split pods"):
        grid.add_column(column, justify="left" if column == "setup" else "right")
    whole = document["sharing"][0]["gpus_in_use"]
    for row in document["sharing"]:
        grid.add_row(escape(row["setup"]), f"{row['gpus_in_use']:g}", f"{whole - row['gpus_in_use']:g}",
                     f"{row['unplaced_pods']:g}", f"{row['split_pods']:g}")
    return grid


def shapes_table(shapes: dict):
    """One row per shape and load; per policy the whole nodes left empty against the ideal, short of the target
    in red."""
    from rich.table import Table
    grid = Table(title=f"Whole {shapes['gpus_per_node']}-GPU nodes left empty, of {shapes['nodes']}, median of "
                       f"{shapes['seeds']} seed(s)", title_justify="left")
    names = [p["name"] for p in shapes["policies"]]
    for column in ("shape", "load", "ideal", *names):
        grid.add_column(escape(column), justify="left" if column == "shape" else "right")
    for row in shapes["rows"]:
        cells = []
        for name in names:
            cell = row["policies"][name]
            share = "100" if cell["share_pct"] >= 100 else f"{cell['share_pct']:.1f}"
            text = f"{cell['empty']:g} ({share} %)" + (f", {cell['unplaced']} unplaced"
                                                                       if cell["unplaced"] else "")
            cells.append(text if cell["share_pct"] >= shapes["target_share_pct"] else f"[red]{text}[/]")
        grid.add_row(row["shape"], f"{row['load_pct']} %", str(row["ideal"]), *cells)
    return grid


def autoscale_table(run: dict):
    """One row per profile: node-hours (and against the baseline), nodes launched, most nodes up at once."""
    from rich.table import Table
    instance = run["instance"]
    grid = Table(title=f"Autoscaled {instance['gpus']}-GPU nodes ({instance['cpu_milli'] // 1000} cpu, "
                       f"{instance['memory_mib'] // 1024} Gi), empty ones removed after {run['consolidate_after']}; "
                       f"median of {run['seeds']} seed(s)", title_justify="left")
    for column in ("policy", "node-hours", f"vs {run['baseline']}", "nodes launched", "most nodes up"):
        grid.add_column(escape(column), justify="left" if column == "policy" else "right")
    for policy in run["policies"]:
        change = policy["vs_baseline_pct"]
        shown = "-" if policy["name"] == run["baseline"] else (f"[green]{change:+.1f} %[/]" if change < 0 else
                                                                f"{change:+.1f} %")
        grid.add_row(escape(policy["name"]), f"{policy['node_hours']:,.1f}", shown, f"{policy['nodes_launched']:g}",
                     f"{policy['peak_nodes']:g}")
    return grid


def autoscale_notes(run: dict) -> list[str]:
    lines = [f"{run['pods'] - run['unplaceable']} GPU pods of {run['pods_file']} over {run['span_hours']:,} h, at "
             f"most {run['most_pods_at_once']} at once; no scheduler can go below {run['floor_node_hours']:,} "
             f"node-hours (their GPU-hours / {run['instance']['gpus']})."]
    if run["unplaceable"]:
        lines.append(f"{run['unplaceable']} pod(s) fit no node of this shape (more GPUs, cpu or memory, another GPU "
                     f"model, or a node affinity it does not meet): left out.")
    lines.append("a node is added the moment a pod fits on none (a real launch takes a minute or so, the same for "
                 "every profile) and removed once empty for the consolidation time; running pods are never moved "
                 "(consolidationPolicy WhenEmpty, as our NodePools). benchmarks/autoscale_real.py measures it on "
                 "the real Karpenter.")
    lines += [f"{p['name']}: {p['profile']}" for p in run["policies"]]
    return lines + [f"note: {note}" for note in run.get("notes") or []]


def shapes_notes(shapes: dict) -> list[str]:
    lines = [f"{name}: {what}" for name, what in shapes["shape_names"].items()]
    lines.append(f"pods of one shape arrive at random until the load's share of the GPUs is asked for; ideal: the "
                 f"nodes left empty when they take the fewest nodes they fit on. A bin-packing profile should keep "
                 f"{shapes['target_share_pct']:g} % of it: those nodes are what a whole-node job needs.")
    lines += [f"{p['name']}: {p['profile']}" for p in shapes["policies"]]
    short = sorted({name for row in shapes["rows"] for name, cell in row["policies"].items()
                    if cell["share_pct"] < shapes["target_share_pct"]})
    lines.append(f"short of {shapes['target_share_pct']:g} % somewhere: {', '.join(short)}" if short else
                 f"every policy keeps {shapes['target_share_pct']:g} % of the ideal everywhere")
    return lines + [f"note: {note}" for note in shapes.get("notes") or []]


def sharing_notes(document: dict) -> list[str]:
    return [f"whole GPUs: a fractional pod takes a whole GPU, placed by {document['scheduler']} "
            f"({document['profile']}); {document['pods']['gpus_if_whole']} GPUs if every pod is placed.",
            "shared: the FGD paper's milli-GPU model (a share of one GPU, GPU memory not modelled) under each policy; "
            "only FGD-style schedulers (a custom scheduler or extender) can place pods this way.",
            f"time-slicing x{document['replicas']}: the device plugin advertises {document['replicas']} replicas per "
            f"GPU, a pod asks ceil(share x {document['replicas']}) of them, {document['scheduler']} places them; "
            "distributed (default) or packed (device plugin v0.20.0+, gpu-operator v26.7.0+) picks the GPUs. "
            "split pods: replicas on more GPUs than the pod asked for (it sees several GPUs, a share of each)."]


def notes(document: dict) -> list[str]:
    lines = ["alloc % @N: GPUs allocated, % of capacity, when N% of it had arrived. 1st frag: arrived % at the first "
             "pod rejected although enough GPUs were free in total; frag 1/2/4/8: such rejections by pod size up to "
             "100%. At 100%: stranded = free GPUs on nodes whose cpu or memory cannot take the smallest GPU pod, "
             "free/used = free GPUs on partly used nodes, free 8-GPU = untouched 8-GPU nodes."]
    lines += [f"{p['name']}: {p['profile']}" for p in document["policies"]]
    lines += [f"note: {note}" for note in document["inventory"].get("notes") or []]
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
