"""gpu-bootstrap.yaml: the typed config, its loader, and errors that name the field and the file line.

Precedence for the cluster and ssh keys: command-line flag > GPU_BOOTSTRAP_* environment variable > file > default.

- fields.py: the base Section, shared patterns and validators, label selectors, the catalogue's default images;
- sections.py: the cluster, SSH, nodes and each step's section; pools.py: Karpenter pools and the registry mirror;
- model.py: Config, the whole file; loading.py: reading, environment overrides, errors with lines;
- example.py: the JSON Schema and the example `init` writes.

Pure but for reading the file (loading.py). Everything is imported from here: `from gpu_bootstrap.core.config import X`.
"""
from gpu_bootstrap.core.config.fields import *  # noqa: F403
from gpu_bootstrap.core.config.fields import _catalogued  # noqa: F401
from gpu_bootstrap.core.config.sections import *  # noqa: F403
from gpu_bootstrap.core.config.pools import *  # noqa: F403
from gpu_bootstrap.core.config.model import *  # noqa: F403
from gpu_bootstrap.core.config.loading import *  # noqa: F403
from gpu_bootstrap.core.config.example import *  # noqa: F403
