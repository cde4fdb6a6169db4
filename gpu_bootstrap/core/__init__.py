"""The floor every other part stands on: typed errors and exit codes (errors.py), signals and child processes
(interrupts.py), references to objects and releases (refs.py), pure helpers over Kubernetes objects (objects.py),
where data lives (paths.py and data/), the supported-version catalogues (versions.py), the image catalogue
(catalogue.py), the outcome of a check (outcomes.py), the custom resources' schemas (schemas.py) and the typed
config (config/).

May import: nothing else of gpu_bootstrap.
"""
