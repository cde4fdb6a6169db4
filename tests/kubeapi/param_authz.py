"""What the API server asks of whoever writes an admission policy with parameters (pkg/registry/admissionregistration,
its authz.go files): a ValidatingAdmissionPolicy or MutatingAdmissionPolicy with a `paramKind` needs `get` on that
kind in every namespace; a binding with a `paramRef` needs `get` on the named param (`list` when it selects), in
paramRef.namespace or, without one, in every namespace. Refused: a 422 naming spec.paramKind / spec.paramRef.
system:masters (the emulator's own credentials) skips the check, as it skips RBAC's escalation checks."""
from __future__ import annotations

from .util import invalid

GROUP = "admissionregistration.k8s.io"
POLICIES = ("validatingadmissionpolicies", "mutatingadmissionpolicies")
BINDINGS = {  # a binding's plural -> its policies' plural
"validatingadmissionpolicybindings": "validatingadmissionpolicies",
            "mutatingadmissionpolicybindings": "mutatingadmissionpolicies"}


def check(emulator, user, rt, obj: dict, old: dict | None) -> None:
    """Raise the real server's 422 when `user` may not read the parameters `obj` (a policy or binding) refers to."""
    from .rbac import Attributes, allowed
    if user is None or rt.group != GROUP or rt.plural not in (*POLICIES, *BINDINGS) or not isinstance(obj, dict):
        return
    spec, old_spec = obj.get("spec") or {}, (old or {}).get("spec") or {}
    name = (obj.get("metadata") or {}).get("name", "")
    if rt.plural in POLICIES:
        kind = spec.get("paramKind")
        if not kind or kind == old_spec.get("paramKind"):
            return
        resource, group = _resource(emulator, kind)
        if not allowed(emulator.store, emulator.table, user, Attributes("get", group, resource, "", "*", "*")):
            raise invalid(rt, name, [("FieldValueForbidden", "spec.paramKind",
                                      f'Forbidden: user {_shown(user)} must have "get" permission on all objects '
                                      f'of the referenced paramKind (kind={kind.get("kind")}, '
                                      f'apiVersion={kind.get("apiVersion")})')])
        return
    ref = spec.get("paramRef")
    if not ref or (ref == old_spec.get("paramRef") and spec.get("policyName") == old_spec.get("policyName")):
        return
    policy = emulator.store.objects.get((GROUP, BINDINGS[rt.plural]), {}).get(("", spec.get("policyName", "")))
    kind = ((policy or {}).get("spec") or {}).get("paramKind") or {}
    resource, group = _resource(emulator, kind) if kind else ("*", "*")
    verb = "get" if ref.get("name") else "list"
    if not allowed(emulator.store, emulator.table, user,
                   Attributes(verb, group, resource, "", ref.get("namespace") or "", ref.get("name") or "")):
        raise invalid(rt, name, [("FieldValueForbidden", "spec.paramRef",
                                  f'Forbidden: user {_shown(user)} does not have "{verb}" permission on the object '
                                  f'referenced by paramRef')])


def _resource(emulator, kind: dict) -> tuple[str, str]:
    api_version = kind.get("apiVersion", "")
    found = emulator.table.for_kind(api_version, kind.get("kind", ""))
    group = api_version.rpartition("/")[0] if "/" in api_version else ""
    return (found.plural if found else "*"), (found.group if found else group or "*")


def _shown(user) -> str:
    """The user as the real server prints it in these messages (Go's %v of its user.Info)."""
    return f'&{{{user.name}  [{" ".join(user.groups)}] map[]}}'
