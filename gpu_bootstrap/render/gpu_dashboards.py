"""The GPU dashboards, built with Grafana's typed SDK (grafana-foundation-sdk) instead of hand-written JSON.

Every panel's queries are declared once as `Query(expr, by)`: `by` names the labels the panel groups by (namespace,
pod, node, ...), which tests/test_monitoring_prometheus.py checks against a real Prometheus loaded with synthetic
DCGM and kube-state-metrics series: each query must return data carrying those labels.
Pure: built at plan time, no cluster.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from grafana_foundation_sdk.builders import bargauge, dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
GPU = 'resource="nvidia_com_gpu"'
BUSY_PERCENT = 10  # a GPU counts as busy when its 5-minute average utilisation is at least this

# GPUs held by pods that are bound to a node and not finished (kube-state-metrics keeps requests of every pod)
HELD = (f'(kube_pod_container_resource_requests{{{GPU}, node!="", namespace=~"$namespace"}} '
        f'unless on (namespace, pod) (kube_pod_status_phase{{phase=~"Succeeded|Failed"}} == 1))')
HELD_ALL = HELD.replace(', namespace=~"$namespace"', "")
ALLOCATABLE_BY_NODE = f'sum by (node) (kube_node_status_allocatable{{{GPU}}})'
HELD_BY_NODE = f"sum by (node) ({HELD_ALL})"
FREE_BY_NODE = f"({ALLOCATABLE_BY_NODE} - ({HELD_BY_NODE} or {ALLOCATABLE_BY_NODE} * 0))"
GPU_REQUESTS = 'resource=~"nvidia_com_gpu|nvidia_com_gpu_shared|nvidia_com_mig_.+"'
PENDING_GPU_PODS = (f'(max by (namespace, pod) (kube_pod_status_phase{{phase="Pending", namespace=~"$namespace"}} '
                    f'== 1) and on (namespace, pod) (max by (namespace, pod) '
                    f'(kube_pod_container_resource_requests{{{GPU_REQUESTS}}}) > 0))')
UNSCHEDULABLE_GPU_PODS = (f'(max by (namespace, pod) (kube_pod_status_unschedulable{{namespace=~"$namespace"}} == 1) '
                          f'and on (namespace, pod) (max by (namespace, pod) '
                          f'(kube_pod_container_resource_requests{{{GPU_REQUESTS}}}) > 0))')
PENDING_ALL = PENDING_GPU_PODS.replace(', namespace=~"$namespace"', "")
POD_SERIES = 'namespace=~"$namespace", pod=~"$pod", pod!=""'


@dataclass(frozen=True)
class Query:
    expr: str
    by: tuple[str, ...] = ()  # labels every returned series must carry (what the panel groups by)
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    kind: str  # stat | timeseries | table | bargauge
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = ""
    width: int = 12
    height: int = 8


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    description: str
    variables: tuple[str, ...]  # namespace, pod, node
    panels: tuple[Panel, ...]


def _by(*labels: str) -> str:
    return " ".join("{{" + label + "}}" for label in labels)


BOARDS = (
    Board("gpu-bootstrap-overview", "GPU cluster overview",
          "How many GPUs the cluster has, how many pods hold, how many are busy, by model; which nodes have room.",
          (), (
              Panel("stat", "GPUs allocatable", "Sum of nvidia.com/gpu the nodes advertise (kube-state-metrics).",
                    (Query(f"sum(kube_node_status_allocatable{{{GPU}}})", instant=True),), width=6, height=5),
              Panel("stat", "GPUs allocated", "GPUs requested by pods bound to a node that have not finished.",
                    (Query(f"sum({HELD_ALL})", instant=True),), width=6, height=5),
              Panel("stat", "GPUs busy", f"GPUs whose 5-minute average utilisation is at least {BUSY_PERCENT} % "
                                         f"(DCGM_FI_DEV_GPU_UTIL).",
                    (Query(f"count(avg_over_time(DCGM_FI_DEV_GPU_UTIL[5m]) >= {BUSY_PERCENT})", instant=True),),
                    width=6, height=5),
              Panel("stat", "GPU pods pending", "Pods requesting GPUs that no node has taken yet.",
                    (Query(f"count({PENDING_ALL})", instant=True),),
                    width=6, height=5),
              Panel("timeseries", "Allocatable, allocated and busy GPUs", "The three numbers above over time.",
                    (Query(f"sum(kube_node_status_allocatable{{{GPU}}})", legend="allocatable"),
                     Query(f"sum({HELD_ALL})", legend="allocated"),
                     Query(f"count(avg_over_time(DCGM_FI_DEV_GPU_UTIL[5m]) >= {BUSY_PERCENT})", legend="busy")),
                    width=24),
              Panel("table", "GPUs by model", "Per GPU model (the exporter's modelName): GPUs seen, held by a pod "
                                              "(the exporter names the pod), busy.",
                    (Query("count by (modelName) (DCGM_FI_DEV_GPU_UTIL)", ("modelName",), instant=True),
                     Query('count by (modelName) (DCGM_FI_DEV_GPU_UTIL{pod!=""})', ("modelName",), instant=True),
                     Query(f"count by (modelName) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[5m]) >= {BUSY_PERCENT})",
                           ("modelName",), instant=True)), width=12),
              Panel("table", "Allocatable GPUs by node product label", "nvidia.com/gpu.product as GPU feature "
                                                                       "discovery labels the node.",
                    (Query(f"sum by (label_nvidia_com_gpu_product) (kube_node_status_allocatable{{{GPU}}} "
                           f"* on (node) group_left (label_nvidia_com_gpu_product) kube_node_labels)",
                           ("label_nvidia_com_gpu_product",), instant=True),), width=12),
              Panel("bargauge", "Free GPUs per node", "Which GPU nodes still have room: allocatable minus "
                                                       "allocated.",
                    (Query(FREE_BY_NODE, ("node",), _by("node"), instant=True),), width=24),
          )),
    Board("gpu-bootstrap-namespaces", "GPU use by namespace",
          "Which namespace holds how many GPUs and how hard it uses them.", ("namespace",), (
              Panel("timeseries", "GPUs requested", "GPUs held by the namespace's running pods.",
                    (Query(f"sum by (namespace) ({HELD})", ("namespace",), _by("namespace")),)),
              Panel("timeseries", "GPU utilisation", "Average DCGM_FI_DEV_GPU_UTIL of the GPUs the namespace's pods "
                                                     "hold.",
                    (Query('avg by (namespace) (DCGM_FI_DEV_GPU_UTIL{namespace=~"$namespace", namespace!=""})',
                           ("namespace",), _by("namespace")),), unit="percent"),
              Panel("timeseries", "GPU memory used", "Framebuffer used by the namespace's pods.",
                    (Query('sum by (namespace) (DCGM_FI_DEV_FB_USED{namespace=~"$namespace", namespace!=""})',
                           ("namespace",), _by("namespace")),), unit="decmbytes"),
              Panel("timeseries", "GPU power", "Power draw of the GPUs the namespace's pods hold.",
                    (Query('sum by (namespace) (DCGM_FI_DEV_POWER_USAGE{namespace=~"$namespace", namespace!=""})',
                           ("namespace",), _by("namespace")),), unit="watt"),
              Panel("timeseries", "Tensor core activity", "Average DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (0-1).",
                    (Query('avg by (namespace) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{namespace=~"$namespace", '
                           'namespace!=""})', ("namespace",), _by("namespace")),), unit="percentunit"),
              Panel("table", "GPU pods pending", "Pods requesting GPUs that are still Pending.",
                    (Query(f"count by (namespace) ({PENDING_GPU_PODS})", ("namespace",), instant=True),)),
          )),
    Board("gpu-bootstrap-pods", "GPU use by pod",
          "Which pod holds which GPUs, and how hard it uses them.", ("namespace", "pod"), (
              Panel("timeseries", "GPU utilisation", "Average utilisation of the GPUs each pod holds.",
                    (Query(f"avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{{{POD_SERIES}}})", ("namespace", "pod"),
                           _by("namespace", "pod")),), unit="percent"),
              Panel("timeseries", "GPU memory used", "Framebuffer used by each pod.",
                    (Query(f"sum by (namespace, pod) (DCGM_FI_DEV_FB_USED{{{POD_SERIES}}})", ("namespace", "pod"),
                           _by("namespace", "pod")),), unit="decmbytes"),
              Panel("timeseries", "GPU power", "Power draw of the GPUs each pod holds.",
                    (Query(f"sum by (namespace, pod) (DCGM_FI_DEV_POWER_USAGE{{{POD_SERIES}}})",
                           ("namespace", "pod"), _by("namespace", "pod")),), unit="watt"),
              Panel("table", "GPUs held", "Per pod: the node and the number of GPUs the exporter attributes to it.",
                    (Query(f"count by (namespace, pod, node) (DCGM_FI_DEV_GPU_UTIL{{{POD_SERIES}}})",
                           ("namespace", "pod", "node"), instant=True),)),
              Panel("table", "GPUs requested", "Per pod: GPUs requested (kube-state-metrics) and the node.",
                    (Query(f'sum by (namespace, pod, node) (kube_pod_container_resource_requests{{{GPU}, '
                           f'namespace=~"$namespace", pod=~"$pod", node!=""}})', ("namespace", "pod", "node"),
                           instant=True),)),
          )),
    Board("gpu-bootstrap-nodes", "GPU nodes",
          "Per node and GPU: utilisation, framebuffer, temperature, power, the last XID, and which pod holds it.",
          ("node",), (
              Panel("timeseries", "GPU utilisation", "DCGM_FI_DEV_GPU_UTIL per GPU.",
                    (Query('max by (node, gpu) (DCGM_FI_DEV_GPU_UTIL{node=~"$node"})', ("node", "gpu"),
                           f"{_by('node')} GPU {_by('gpu')}"),), unit="percent"),
              Panel("timeseries", "Framebuffer used", "Used / (used + free) per GPU.",
                    (Query('max by (node, gpu) (DCGM_FI_DEV_FB_USED{node=~"$node"} / (DCGM_FI_DEV_FB_USED'
                           '{node=~"$node"} + DCGM_FI_DEV_FB_FREE{node=~"$node"}) * 100)', ("node", "gpu"),
                           f"{_by('node')} GPU {_by('gpu')}"),), unit="percent"),
              Panel("timeseries", "Temperature", "DCGM_FI_DEV_GPU_TEMP per GPU.",
                    (Query('max by (node, gpu) (DCGM_FI_DEV_GPU_TEMP{node=~"$node"})', ("node", "gpu"),
                           f"{_by('node')} GPU {_by('gpu')}"),), unit="celsius"),
              Panel("timeseries", "Power", "DCGM_FI_DEV_POWER_USAGE per GPU.",
                    (Query('max by (node, gpu) (DCGM_FI_DEV_POWER_USAGE{node=~"$node"})', ("node", "gpu"),
                           f"{_by('node')} GPU {_by('gpu')}"),), unit="watt"),
              Panel("table", "Last XID per GPU", "DCGM_FI_DEV_XID_ERRORS is the last XID the driver reported (0: "
                                                 "none).",
                    (Query('max by (node, gpu) (DCGM_FI_DEV_XID_ERRORS{node=~"$node"})', ("node", "gpu"),
                           instant=True),)),
              Panel("table", "Who holds each GPU", "The pod the exporter attributes each GPU to.",
                    (Query('max by (node, gpu, namespace, pod) (DCGM_FI_DEV_GPU_UTIL{node=~"$node", pod!=""})',
                           ("node", "gpu", "namespace", "pod"), instant=True),)),
          )),
    Board("gpu-bootstrap-allocation", "GPU allocation and fragmentation",
          "Free GPUs per node, how scattered they are, and the GPU pods waiting for a node (kube-state-metrics).",
          ("namespace",), (
              Panel("bargauge", "Free GPUs per node", "Allocatable minus held by unfinished pods.",
                    (Query(FREE_BY_NODE, ("node",), _by("node"), instant=True),)),
              Panel("table", "Nodes by number of free GPUs", "How many nodes have 0, 1, ... free GPUs: many nodes "
                                                             "with a few free GPUs each is fragmentation.",
                    (Query(f'count_values("free_gpus", {FREE_BY_NODE})', ("free_gpus",), instant=True),)),
              Panel("stat", "Largest pod that fits", "The most GPUs free on a single node.",
                    (Query(f"max({FREE_BY_NODE})", instant=True),), width=6, height=5),
              Panel("stat", "Free GPUs on partly used nodes", "Free GPUs on nodes where some GPUs are held: what "
                                                              "packing leaves scattered.",
                    (Query(f"sum({FREE_BY_NODE} and on (node) ({HELD_BY_NODE} > 0))", instant=True),),
                    width=6, height=5),
              Panel("timeseries", "GPUs held by namespace", "Stacked: who holds the cluster's GPUs.",
                    (Query(f"sum by (namespace) ({HELD})", ("namespace",), _by("namespace")),)),
              Panel("table", "GPU pods pending", "GPU pods not yet on a node. kube-state-metrics does not export "
                                                 "spec.schedulerName, so this lists every pending GPU pod; with the "
                                                 "admission step they all name the bin-packing scheduler.",
                    (Query(PENDING_GPU_PODS, ("namespace", "pod"), instant=True),)),
              Panel("timeseries", "GPU pods unschedulable", "Pods the scheduler reported it cannot place.",
                    (Query(f"count by (namespace) ({UNSCHEDULABLE_GPU_PODS})", ("namespace",), _by("namespace")),)),
          )),
)


def _variable(name: str) -> dashboard.QueryVariable:
    sources = {"namespace": f'label_values(kube_pod_container_resource_requests{{{GPU}}}, namespace)',
               "pod": f'label_values(kube_pod_container_resource_requests{{{GPU}, namespace=~"$namespace"}}, pod)',
               "node": f'label_values(kube_node_status_allocatable{{{GPU}}}, node)'}
    return (dashboard.QueryVariable(name).label(name.capitalize()).datasource(DS).query(sources[name])
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*"))


def _panel(panel: Panel):
    builder = {"stat": stat.Panel, "timeseries": timeseries.Panel, "table": table.Panel,
               "bargauge": bargauge.Panel}[panel.kind]()
    builder = builder.title(panel.title).description(panel.description).datasource(DS).span(panel.width) \
        .height(panel.height)
    if panel.unit:
        builder = builder.unit(panel.unit)
    if panel.kind in ("stat", "bargauge"):
        builder = builder.no_value("0")
    for index, query in enumerate(panel.queries):
        target = prometheus.Dataquery().expr(query.expr).ref_id(chr(ord("A") + index))
        if query.legend:
            target = target.legend_format(query.legend)
        if query.instant:
            target = target.instant()
        if panel.kind == "table":
            target = target.format(PromQueryFormat.TABLE)
        builder = builder.with_target(target)
    return builder


def build(board: Board) -> dict:
    builder = (dashboard.Dashboard(board.title).uid(board.uid).description(board.description)
               .tags(["gpu", "gpu-bootstrap"]).refresh("30s").time("now-6h", "now").timezone("browser")
               .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")))
    for name in board.variables:
        builder = builder.with_variable(_variable(name))
    for panel in board.panels:
        builder = builder.with_panel(_panel(panel))
    return json.loads(json.dumps(builder.build(), cls=JSONEncoder))


@functools.lru_cache(maxsize=1)
def _built() -> tuple[tuple[str, str], ...]:
    return tuple((board.uid, json.dumps(build(board), sort_keys=True)) for board in BOARDS)


def dashboards() -> list[tuple[str, dict]]:
    """(uid, dashboard JSON model) for every board."""
    return [(uid, json.loads(text)) for uid, text in _built()]


def queries() -> list[tuple[str, str, Query]]:
    """(dashboard uid, panel title, query) for every query of every panel."""
    return [(board.uid, panel.title, query) for board in BOARDS for panel in board.panels for query in panel.queries]


__all__ = ["BOARDS", "Board", "Panel", "Query", "build", "dashboards", "queries"]
