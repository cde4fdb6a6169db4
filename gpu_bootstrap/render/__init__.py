"""Pure rendering: every manifest, values file, policy, dashboard and alert we write, from the config and the
facts a step read. No I/O, no adapter: each function is table-tested without a host. One module per thing rendered:
node_prep.py, gpu_pools.py, gpu_operator_values.py (with values.py, the derived-value record), crds.py,
scheduler.py, admission.py, admission_policy.py (Rego and CEL), certificates.py, monitoring.py, gpu_alerts.py,
gpu_dashboards.py; live_diff.py compares a render with live objects and versions_table.py writes
docs/supported-versions.md's tables. Pod Security profiles live in security/pod_security.py.

May import: core, security.
"""
