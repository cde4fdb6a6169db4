"""The machinery every step runs in: the step interface and its data (step.py), the one typed context of config
and adapters (context.py), the gate every change passes (gate.py), the runner (runner.py), the cluster-side
checkpoint (checkpoint.py), the run lock (lock.py), the --render-dir writer (render_dir.py) and the chart CRDs helper
(chart_crds.py). It knows no step by name and no command.

May import: core, security, render, probes, adapters.
"""
