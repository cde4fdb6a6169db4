"""Authentication by bearer token and RBAC authorization, as kube-apiserver's RBAC authorizer decides them.

The emulator's own credentials (its client certificate and `Emulator.token`) stay cluster-admin. A token made with
`Emulator.add_token(user)` authenticates as that user (a ServiceAccount's "system:serviceaccount:<ns>:<name>" or any
user name), and its every request is authorized against the ClusterRoles, Roles and their bindings stored in the
emulator: allowed when a ClusterRoleBinding, or a RoleBinding in the request's namespace, binds a role with a rule
matching the request's API group, resource (with subresource, e.g. "services/proxy"), verb and name. Denied requests
get the API server's 403 wording:
  pods "x" is forbidden: User "u" cannot get resource "pods" in API group "" in the namespace "ns"
Discovery, /version, /openapi and SelfSubjectAccessReview are open to every authenticated user (as the default
system:discovery, system:public-info-viewer and system:basic-user roles make them). Not emulated: aggregated
ClusterRoles, and RBAC's escalation check on creating roles and bindings.
"""
from __future__ import annotations

from dataclasses import dataclass, field

RBAC = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = field(default=("system:authenticated",))

    @staticmethod
    def of(name: str) -> "User":
        groups = ["system:authenticated"]
        if name.startswith("system:serviceaccount:"):
            namespace = name.split(":")[2]
            groups += ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
        return User(name, tuple(groups))


@dataclass(frozen=True)
class Attributes:
    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def full_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def _bound(subjects: list[dict], user: User, binding_namespace: str) -> bool:
    for subject in subjects or []:
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "User" and name == user.name:
            return True
        if kind == "Group" and name in user.groups:
            return True
        if kind == "ServiceAccount" and user.name == \
                f"system:serviceaccount:{subject.get('namespace') or binding_namespace}:{name}":
            return True
    return False


def _matches(rule: dict, attributes: Attributes) -> bool:
    def has(values, wanted):
        return "*" in (values or []) or wanted in (values or [])
    if not has(rule.get("verbs"), attributes.verb) or not has(rule.get("apiGroups"), attributes.group):
        return False
    resources = rule.get("resources") or []
    if not (has(resources, attributes.full_resource) or
            (attributes.subresource and f"*/{attributes.subresource}" in resources) or
            (not attributes.subresource and "*" in resources) or (attributes.subresource and "*" in resources)):
        return False
    names = rule.get("resourceNames") or []
    return not names or attributes.name in names


def allowed(store, table, user: User, attributes: Attributes) -> bool:
    """Does any binding give `user` a rule matching `attributes`?"""
    def role(kind: str, name: str, namespace: str) -> dict | None:
        resource = "clusterroles" if kind == "ClusterRole" else "roles"
        return store.find(table.lookup(RBAC, "v1", resource), None if kind == "ClusterRole" else namespace, name)

    bindings = [(b, "") for b in store.list(table.lookup(RBAC, "v1", "clusterrolebindings"))[0]]
    if attributes.namespace:
        bindings += [(b, attributes.namespace) for b in store.list(table.lookup(RBAC, "v1", "rolebindings"),
                                                                   attributes.namespace)[0]]
    for binding, namespace in bindings:
        if not _bound(binding.get("subjects"), user, namespace):
            continue
        ref = binding.get("roleRef") or {}
        found = role(ref.get("kind", ""), ref.get("name", ""), namespace)
        if found and any(_matches(rule, attributes) for rule in found.get("rules") or []):
            return True
    return False


def forbidden_message(user: User, attributes: Attributes) -> str:
    what = f"{attributes.resource}.{attributes.group}" if attributes.group else attributes.resource
    named = f'{what} "{attributes.name}"' if attributes.name else what
    where = f'in the namespace "{attributes.namespace}"' if attributes.namespace else "at the cluster scope"
    return (f'{named} is forbidden: User "{user.name}" cannot {attributes.verb} resource "{attributes.full_resource}" '
            f'in API group "{attributes.group}" {where}')
