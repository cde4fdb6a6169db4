"""Saved preflight reports (the `nodes` part of `doctor -o json`) for tests whose nodes have no SSH."""
from __future__ import annotations

import json
from pathlib import Path


def healthy_node(name: str, gpus: int = 8, driver: str = "550.54.15") -> dict:
    gpu_list = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{name}-{i:04d}", "memory_mib": 81559,
                 "compute_capability": "9.0"} for i in range(gpus)]
    return {"name": name, "checks": [
        {"id": "ssh", "status": "pass", "message": "Ubuntu 22.04.5 LTS", "data": {
            "os": "Ubuntu 22.04.5 LTS", "os_id": "ubuntu", "os_version": "22.04", "kernel": "5.15.0-131-generic",
            "arch": "x86_64", "uid": "0"}},
        {"id": "nvidia-driver", "status": "pass", "message": f"driver {driver}", "data": {
            "driver_version": driver, "cuda_version": "12.4", "gpus": gpu_list, "source": "nvidia-smi",
            "open_kernel_module": False, "device_nodes": gpus}},
        {"id": "nouveau", "status": "pass", "message": "not loaded", "data": {"loaded": False}},
        {"id": "container-runtime", "status": "pass", "message": "containerd 1.7.27", "data": {
            "runtime": "containerd", "version": "1.7.27", "config_path": "/etc/containerd/config.toml",
            "socket": "/run/containerd/containerd.sock", "distribution": "standard"}},
        {"id": "nvidia-container-toolkit", "status": "pass", "message": "1.17.4", "data": {
            "installed": True, "version": "1.17.4", "runtime_configured": True, "default_runtime": True}}]}


def write_report(path: Path, names: list[str], **overrides) -> Path:
    path.write_text(json.dumps({"nodes": [healthy_node(n, **overrides) for n in names], "ok": True}, indent=1))
    return path
