"""The outside world: the Kubernetes API (kube.py), Helm (helm.py, relay.py), SSH (ssh.py), node facts over SSH
or an in-cluster probe pod (nodefacts.py, cluster_probe.py), container registries (registry.py), the offline stand-ins
of a dry run (offline.py), chart files (charts.py), the retry rule's backoff (backoff.py) and helm for an identity
that may not read Secrets (secretless.py). Steps reach the Kubernetes, Helm, SSH and node-facts adapters
through the context (a convention the import test cannot see: it checks folders); charts.py they import directly.

May import: core, security, render, probes.
"""
