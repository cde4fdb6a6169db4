"""How `gpu-bootstrap status` looks: one rich renderable per view (nodes, namespaces, pods), the pending GPU pods,
the fragmentation figures, idle GPUs and the --defrag plan. Data in (app/status.py's document), screen out."""
from __future__ import annotations

from gpu_bootstrap.cli.ui import escape

VIEWS = ("node", "namespace", "pod")


def _age(seconds: int | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _yes(value, yes: str = "yes", no: str = "[red]no[/]") -> str:
    return "?" if value is None else yes if value else no


def _extra(resources: dict, key: str = "allocatable") -> str:
    """MIG slices and shared GPUs: 'mig-1g.10gb 3/7' (requested/allocatable) or 'mig-1g.10gb 2'."""
    parts = []
    for name, value in resources.items():
        short = name.removeprefix("nvidia.com/")
        parts.append(f"{short} {value['requested']}/{value[key]}" if isinstance(value, dict) else f"{short} {value}")
    return ", ".join(parts)


def nodes_table(document: dict, wide: bool):
    from rich.table import Table
    totals = document["totals"]
    table = Table(title=f"GPU nodes: {totals['gpus_requested']}/{totals['gpus_allocatable']} GPUs requested, "
                        f"{totals['gpus_free']} free on {totals['gpu_nodes']} node(s)", title_justify="left")
    columns = ["node", "product", "GPU memory", "compute", "GPUs", "req", "free", "MIG / shared", "ready",
               "schedulable", "tainted"]
    columns += ["GPU pods", "cpu req/alloc", "memory req/alloc (GiB)"] if wide else []
    upgrading = any(node.get("driver_upgrade") for node in document["nodes"])
    columns += ["driver upgrade"] if upgrading else []  # only while the gpu-operator's upgrade controller works
    pooled = any(node.get("pool") for node in document["nodes"])
    columns += ["pool"] if pooled else []  # only where Karpenter launched some of the nodes
    for column in columns:
        table.add_column(column, overflow="fold",
                         justify="right" if column in ("GPUs", "req", "free", "GPU pods") else "left")
    for node in document["nodes"]:
        sharing = node["sharing"]
        extra = ", ".join(part for part in (_extra(node["resources"]), f"x{sharing['replicas']} "
                                            f"{sharing.get('strategy') or 'shared'}" if sharing else "") if part)
        memory, compute = node.get("gpu_memory_mib"), node.get("compute_capability")
        row = [escape(node["name"]), escape(node["product"] or "-"),
               f"{memory / 1024:.0f} GiB" if memory is not None else "-", compute or "-",
               str(node["gpus"]["allocatable"]),
               str(node["gpus"]["requested"]), str(node["gpus"]["free"]), escape(extra or "-"), _yes(node["ready"]),
               _yes(node["schedulable"], "yes", "[yellow]cordoned[/]"), _yes(node["tainted"], "yes", "no")]
        if wide:
            row += [str(node["gpu_pods"]),
                    f"{node['cpu']['requested_milli'] / 1000:g}/{node['cpu']['allocatable_milli'] / 1000:g}",
                    f"{node['memory']['requested_mib'] / 1024:.0f}/{node['memory']['allocatable_mib'] / 1024:.0f}"]
        if upgrading:
            state = node.get("driver_upgrade") or "-"
            row.append(f"[red]{state}[/]" if state == "upgrade-failed" else escape(state))
        if pooled:
            row.append(escape(node.get("pool") or "-"))
        table.add_row(*row)
    return table


def namespaces_table(document: dict, wide: bool):
    from rich.table import Table
    table = Table(title="GPUs by namespace", title_justify="left")
    for column in ("namespace", "GPU pods", "GPUs", "MIG / shared", "pending pods", "pending GPUs", "schedulers"):
        table.add_column(column, justify="left" if column in ("namespace", "MIG / shared", "schedulers") else "right")
    for row in document["namespaces"]:
        schedulers = ", ".join(f"{name} {count}" for name, count in sorted(row["schedulers"].items()))
        table.add_row(escape(row["name"]), str(row["gpu_pods"]), str(row["gpus"]),
                      escape(_extra(row["resources"]) or "-"), str(row["pending_pods"]), str(row["pending_gpus"]),
                      escape(schedulers or "-"))
    return table


def pods_table(document: dict, wide: bool):
    from rich.table import Table
    table = Table(title="GPU pods", title_justify="left")
    columns = ["namespace", "pod", "node", "GPUs", "MIG / shared", "scheduler", "age"] + (["phase", "owner"]
                                                                                          if wide else [])
    for column in columns:
        table.add_column(column, overflow="fold", justify="right" if column in ("GPUs", "age") else "left")
    for pod in document["pods"]:
        scheduler = f"[green]{escape(pod['scheduler'])}[/]" if pod["ours"] else escape(pod["scheduler"])
        row = [escape(pod["namespace"]), escape(pod["name"]), escape(pod["node"] or "-"), str(pod["gpus"]),
               escape(_extra(pod["resources"]) or "-"), scheduler, _age(pod["age_seconds"])]
        table.add_row(*(row + ([escape(pod["phase"]), escape(pod["owner"] or "-")] if wide else [])))
    return table


def pending_table(document: dict, wide: bool):
    from rich.table import Table
    table = Table(title=f"pending GPU pods ({len(document['pending'])})", title_justify="left")
    pooled = any(pod.get("pools") for pod in document["pending"])  # Karpenter's NodePools exist
    for column in ("namespace", "pod", "GPUs", "scheduler", "age", "why (PodScheduled / latest scheduling event)",
                   *(["NodePools"] if pooled else [])):
        table.add_column(column, overflow="fold")
    for pod in document["pending"]:
        event = pod["event"] or {}
        why = escape(pod["message"] or event.get("message") or f"no scheduler has looked at it yet (is "
                                                                 f"{pod['scheduler']} running?)")
        if wide and event.get("message") and event["message"] != pod["message"]:
            why += f"  [dim](latest event x{event.get('count', 1)}: {escape(event['message'])})[/]"
        if pod.get("stale"):  # its scheduler no longer runs: the reason is from before it stopped
            why = f"[bold]{escape(pod['scheduler'])} does not run[/]: nothing will schedule it [dim](stale: {why})[/]"
        mark = " (ours)" if pod["ours"] else ""
        pools = [f"{escape(name)}: {escape(said)}" for name, said in (pod.get("pools") or {}).items()]
        table.add_row(escape(pod["namespace"]), escape(pod["name"]), str(pod["gpus"]),
                      escape(pod["scheduler"] + mark), _age(pod["age_seconds"]), why,
                      *(["; ".join(pools) or "-"] if pooled else []))
    return table


def fragmentation_lines(document: dict) -> list[str]:
    f = document["fragmentation"]
    fits = ", ".join(f"{count} x {size}-GPU" for size, count in f["fits"].items())
    return [f"[bold]fragmentation[/]: {f['free_gpus']} free GPU(s); the largest request one node can take: "
            f"{f['largest_fit']} GPU(s); more pods that fit: {fits}",
            f"  {f['stranded_gpus']} GPU(s) stranded (their node's cpu or memory cannot take the smallest GPU pod, "
            f"{f['smallest_pod']['cpu_milli']}m / {f['smallest_pod']['memory_mib']} MiB); "
            f"{f['partial_free_gpus']} free on partly used nodes; wholly free nodes: {f['free_8gpu_nodes']} x 8-GPU, "
            f"{f['free_4gpu_nodes']} x 4-GPU"]


def utilisation_table(document: dict, wide: bool):
    """Per pod (per GPU with -o wide): mean utilisation over the window, and the allocated GPUs that sat idle."""
    from rich.table import Table
    use = document["utilisation"]
    idle = len(use["idle"])
    table = Table(title=f"GPU utilisation over {use['window']} from {use['prometheus']}: {idle} allocated GPU(s) "
                        f"idle (below {use['idle_below_pct']:g} %)", title_justify="left")
    for column in ("namespace", "pod", "node", "GPU" if wide else "GPUs", "mean %", "idle"):
        table.add_column(column, justify="right" if column in ("mean %", "GPUs") else "left")
    for row in use["gpus"] if wide else use["pods"]:
        idle_cell = ("[yellow]idle[/]" if row["idle"] else "") if wide else \
            (f"[yellow]{row['idle_gpus']} idle[/]" if row["idle_gpus"] else "")
        table.add_row(escape(row["namespace"]), escape(row["pod"]), escape(row["node"] or "-"),
                      escape(row["gpu"]) if wide else str(row["gpus"]), f"{row['mean_pct']:.1f}", idle_cell)
    return table


def defrag_lines(plan: dict) -> list[str]:
    lines = [f"[bold]defragmentation plan[/] (packing: {escape(plan['profile'])}; nothing was evicted) for GPU "
             f"request(s) {', '.join(map(str, plan['wanted'])) or 'none'}:"]
    for drain in plan["drains"]:
        lines.append(f"  free [bold]{escape(drain['node'])}[/] ({drain['gpus']} GPUs) by re-creating "
                     f"{len(drain['moves'])} pod(s):")
        lines += [f"    {escape(m['pod'])} ({m['gpus']} GPU) -> {escape(m['to'])}" for m in drain["moves"]]
    if not plan["drains"]:
        lines.append("  no node needs draining" if not plan["unmet"] else "  no node can be freed")
    if plan["unmet"]:
        lines.append(f"  [yellow]still without a node: request(s) of {', '.join(map(str, plan['unmet']))} GPU(s)[/]")
    lines += [f"  [dim]not drained: {escape(node)}: {escape(why)}[/]" for node, why in plan["skipped"].items()]
    if plan["commands"]:
        lines.append("  to carry it out:")
        lines += [f"    {escape(line)}" for line in plan["commands"]]
    return lines


def queues_table(section: dict, wide: bool):
    """The team queues (Kueue): quota, use, borrowed GPUs, and the workloads that wait with Kueue's reason."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text
    table = Table(title="GPU queues by team (Kueue)", title_justify="left")
    for column in ("team", "quota", "used", "borrowed", "admitted", "waiting", "active"):
        table.add_column(column, justify="left" if column in ("team", "active") else "right")
    for team in section["teams"]:
        table.add_row(escape(team["team"]), str(team["quota_gpus"]), str(team["used_gpus"]),
                      str(team["borrowed_gpus"]), str(team["admitted_workloads"]), str(team["pending_workloads"]),
                      "yes" if team["active"] else f"[red]no[/]: {escape(team['inactive_reason'] or '')}")
    lines = [f"  {escape(w['namespace'])}/{escape(w['owner'] or w['workload'])} ({w['gpus']} GPU) waits: "
             f"{escape(w['reason'])}" for w in section["waiting"]]
    if section["waiting_total"] > len(section["waiting"]):
        lines.append(f"  … and {section['waiting_total'] - len(section['waiting'])} more waiting")
    return Group(table, *[Text.from_markup(line) for line in lines])


def renderable(document: dict, by: str, wide: bool):
    """Everything `status` shows, as one rich Group (printed once, or redrawn by --watch)."""
    from rich.console import Group
    from rich.text import Text
    view = {"node": nodes_table, "namespace": namespaces_table, "pod": pods_table}[by]
    parts = [view(document, wide)]
    if document["pending"]:
        parts.append(pending_table(document, wide))
    parts += [Text.from_markup(line) for line in fragmentation_lines(document)]
    if document.get("queues"):
        parts.append(queues_table(document["queues"], wide))
    if document.get("utilisation"):
        parts.append(utilisation_table(document, wide) if document["utilisation"]["gpus"] else
                     Text(f"GPU utilisation: {document['utilisation']['note']}"))
    if document.get("defrag"):
        parts += [Text.from_markup(line) for line in defrag_lines(document["defrag"])]
    if document.get("notes"):
        parts += [Text.from_markup(f"[dim]{escape(note)}[/]") for note in document["notes"]]
    return Group(*parts)


def show(document: dict, by: str, wide: bool) -> None:
    from gpu_bootstrap.cli.ui import console
    console().print(renderable(document, by, wide))


def watch(produce, by: str, wide: bool, interval: float) -> None:
    """Redraw in place every `interval` seconds until Ctrl-C."""
    import time

    from rich.live import Live

    from gpu_bootstrap.cli.ui import console
    with Live(renderable(produce(), by, wide), console=console(), auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(renderable(produce(), by, wide), refresh=True)
        except KeyboardInterrupt:
            return
