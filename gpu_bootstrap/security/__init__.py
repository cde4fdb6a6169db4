"""The security model's code: secrets never leave a Secret or a 0600 file (redact.py), no key left behind in a
temp folder (tempfiles.py), output folders no planted link can redirect (outdir.py), the Pod Security profile of our
pods and namespaces (pod_security.py), the checks that a hardened cluster admits our pods (hardening.py), the
least-privilege roles of each command (rbac.py) and the admission policies that keep the dry identities dry
(identity_policy.py).
docs/security.md is the model in words.

May import: core.
"""
