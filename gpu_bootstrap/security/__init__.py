"""The security model's code: secrets never leave a Secret or a 0600 file (redact.py), no key left behind in a
temp folder (tempfiles.py), the Pod Security profile of our pods and namespaces (pod_security.py), the checks that a
hardened cluster admits our pods (hardening.py), and the least-privilege roles of each command (rbac.py).
docs/security.md is the model in words.

May import: core.
"""
