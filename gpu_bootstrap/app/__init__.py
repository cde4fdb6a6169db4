"""The application layer: one place per command, between the thin CLI and the pipeline. commands.py builds the
context and runs up, doctor, teardown, simulate and init; rbac.py prints `rbac`'s roles and policies; playbook.py
reads playbooks/*.yaml and --only/--skip; status.py gathers `status`; images.py lists `images`; export/ writes
`export` and the mirror lists. Nothing here
prints: the CLI presents what these return.

May import: core, security, render, probes, adapters, sim, pipeline, steps.
"""
