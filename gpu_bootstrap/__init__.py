"""gpu-bootstrap: turns a Kubernetes cluster with NVIDIA GPU nodes into a GPU platform, in one resumable command.

The package, floor by floor (a folder imports only the floors below it, as its own docstring's "May import" line
says; tests/test_import_graph.py holds each folder to it and the whole package to no import circle):

- core/      the floor: errors, interruptions, refs, check outcomes, object helpers, paths, versions, schemas,
             the image catalogue, the config
- security/  redaction, the run's private temp folder, Pod Security profiles, the hardening checks, least-privilege RBAC
- render/    pure: every manifest and values file we write        probes/  pure: the node probe and its judgement
- adapters/  Kubernetes, Helm, SSH, node facts, registries        sim/     the scheduling simulator (`simulate`)
- pipeline/  the step interface, the context, the gate, the runner, the checkpoint, the lock, --render-dir
- steps/     one file per step; their order lives in playbooks/*.yaml
- app/       the application layer: one place per command (up, doctor, teardown, status, images, export, rbac, ...)
- cli/       the Typer app and its rich presentation; thin
"""

__version__ = "0.1.0.dev0"
