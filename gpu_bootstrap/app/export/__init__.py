"""`gpu-bootstrap export` and the mirror lists of `images -o hauler|zarf|skopeo`: what `up` would apply, handed to the
GitOps engine or mirroring tool a team already runs.

- bundle.py: the changes of a fresh-install plan (the gate's record of an offline run) grouped into ordered units:
  our own objects as plain manifests, each chart as a release with its derived values, and what is not declarative
  (node taints and labels, the validation pods) as commands. Pure.
- formats.py: a bundle as files for one engine (Argo CD, Flux, helmfile, plain manifests). Pure.
- mirror.py: an image list as a Hauler manifest, a Zarf package's images or a skopeo sync file. Pure.

The three pure modules use core/, security/redact.py, render/ and the pipeline's data types and YAML writer, never
an adapter or the CLI. command.py is the application layer of `export`: it runs the offline plan through
app/commands.py's build() and writes DIR.
"""
