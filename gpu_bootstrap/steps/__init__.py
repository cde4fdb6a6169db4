"""The step registry: id -> implementation, imported only when a playbook uses it. The order lives in playbooks/.

A step id mapped to None is known but not implemented in this version: a playbook naming it is refused clearly.

One file per step, each a pipeline.step.Step: check (read real state), plan (pure), verify, undo_plan.

May import: core, security, render, probes, adapters, pipeline.
"""
from __future__ import annotations

import importlib

REGISTRY: dict[str, str | None] = {
    "preflight": "gpu_bootstrap.steps.preflight:Preflight",
    "node-prep": "gpu_bootstrap.steps.node_prep:NodePrep",
    "gpu-pools": "gpu_bootstrap.steps.gpu_pools:GpuPools",
    "gpu-operator": "gpu_bootstrap.steps.gpu_operator:GpuOperator",
    "binpack-scheduler": "gpu_bootstrap.steps.binpack_scheduler:BinpackScheduler",
    "admission-opa": "gpu_bootstrap.steps.admission_opa:AdmissionOpa",
    "admission": "gpu_bootstrap.steps.admission:Admission",
    "monitoring": "gpu_bootstrap.steps.monitoring:Monitoring",
    "validate": "gpu_bootstrap.steps.validate:Validate",
}


def implemented() -> list[str]:
    return [step_id for step_id, where in REGISTRY.items() if where]


def load_step(step_id: str):
    module_name, _, class_name = REGISTRY[step_id].partition(":")
    return getattr(importlib.import_module(module_name), class_name)()
