"""The step registry: id -> implementation, imported only when a playbook uses it."""
from __future__ import annotations

import importlib

# Every step id the tool knows, in pipeline order. Only implemented ones can appear in a playbook.
KNOWN_STEPS = ("preflight", "node-prep", "gpu-operator", "binpack-scheduler", "admission", "monitoring", "validate")
IMPLEMENTATIONS = {
    "preflight": "gpu_bootstrap.steps.preflight:Preflight",
    "node-prep": "gpu_bootstrap.steps.node_prep:NodePrep",
    "gpu-operator": "gpu_bootstrap.steps.gpu_operator:GpuOperator",
    "binpack-scheduler": "gpu_bootstrap.steps.binpack_scheduler:BinpackScheduler",
    "validate": "gpu_bootstrap.steps.validate:Validate",
}


def load_step(step_id: str):
    module_name, _, class_name = IMPLEMENTATIONS[step_id].partition(":")
    return getattr(importlib.import_module(module_name), class_name)()
