"""Stand-ins for what runs on a real cluster's GPU nodes, for the emulator tests: a dcgm-exporter per node serving
the scenario's exporter output (tests/monitoring/scenario.py says where its format comes from), and a real
Prometheus on 127.0.0.1 that scrapes them the way the gpu-operator's ServiceMonitor makes Prometheus scrape: job
nvidia-dcgm-exporter, honor_labels, and the relabelings gpu-bootstrap gives the ServiceMonitor (translated from the
ServiceMonitor's fields to Prometheus' own), applied to the target labels the Prometheus Operator would set
(namespace, pod and container of the exporter pod, __meta_kubernetes_pod_node_name).
"""
from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from tests.monitoring import scenario
from tests.tools import tool


class StandInExporter:
    """GET /metrics -> the scenario node's exporter output, reporting `hostname` as its node name."""

    def __init__(self, node: str, as_node: str, pods: bool = True):
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                if exporter.down:
                    self.send_error(503)
                    return
                body = scenario.exporter_text(node, int(time.time()), exporter.pods, as_node).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.pods = pods
        self.down = False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def fail(self) -> None:
        """Answer every scrape 503 while keeping the port: a stopped server frees its port, and another test's
        server on another worker may bind it and answer Prometheus' scrapes with 200."""
        self.down = True

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def prometheus_relabelings(service_monitor_relabelings: list[dict]) -> list[dict]:
    """A ServiceMonitor endpoint's relabelings (camelCase) as Prometheus relabel_configs."""
    out = []
    for relabel in service_monitor_relabelings:
        item = {_snake(k): v for k, v in relabel.items()}
        if "action" in item:
            item["action"] = item["action"].lower()
        out.append(item)
    return out


def scrape_config(exporters: dict[str, StandInExporter], service_monitor: dict, operator_namespace: str) -> str:
    """prometheus.yml scraping each node's stand-in the way the DCGM ServiceMonitor would have it scraped."""
    endpoint = service_monitor["spec"]["endpoints"][0]
    targets = []
    for node, exporter in sorted(exporters.items()):
        targets.append({"targets": [exporter.address],
                        "labels": {"__meta_kubernetes_pod_node_name": node, "namespace": operator_namespace,
                                   "pod": f"nvidia-dcgm-exporter-{node[-5:]}", "container": "nvidia-dcgm-exporter",
                                   "service": "nvidia-dcgm-exporter", "endpoint": endpoint["port"]}})
    job = {"job_name": service_monitor["metadata"]["labels"].get("app", "nvidia-dcgm-exporter"),
           "scrape_interval": "1s", "scrape_timeout": "1s", "honor_labels": bool(endpoint.get("honorLabels")),
           "metrics_path": endpoint.get("path", "/metrics"), "static_configs": targets,
           "relabel_configs": prometheus_relabelings(endpoint.get("relabelings") or [])}
    return yaml.safe_dump({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                           "scrape_configs": [job]}, sort_keys=False)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalPrometheus:
    """A real prometheus server on 127.0.0.1 (stopped by the fixture that started it)."""

    def __init__(self, folder: Path, config: str, data: Path | None = None):
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (folder / "prometheus.yml").write_text(config)
        self.log = (folder / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [tool("prometheus"), f"--config.file={folder / 'prometheus.yml'}",
             f"--storage.tsdb.path={data or folder / 'data'}", "--storage.tsdb.retention.time=100y",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).read()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"prometheus did not start: {(folder / 'prometheus.log').read_text()}")
                time.sleep(0.2)

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr}
        if at is not None:
            params["time"] = str(at)
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=30) as r:
            answer = json.loads(r.read())
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        params = {"query": expr, "start": str(start), "end": str(end), "step": str(step)}
        with urllib.request.urlopen(f"{self.url}/api/v1/query_range?{urllib.parse.urlencode(params)}",
                                    timeout=60) as r:
            answer = json.loads(r.read())
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def reload(self, config: str, wait_for: str = "") -> None:
        """New prometheus.yml, applied with SIGHUP (as the Prometheus Operator's config reloader does)."""
        (self.folder / "prometheus.yml").write_text(config)
        self.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while wait_for:
            with urllib.request.urlopen(f"{self.url}/api/v1/status/config", timeout=5) as r:
                if wait_for in json.loads(r.read())["data"]["yaml"]:
                    return
            assert time.monotonic() < deadline, "prometheus did not load its new config"
            time.sleep(0.2)

    def wait_for(self, expr: str, check, timeout: float = 60) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if check(result) or time.monotonic() > deadline:
                return result
            time.sleep(0.5)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
