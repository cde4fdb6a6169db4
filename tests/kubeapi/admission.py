"""The API server's admission chain for writes, in its plugin order: built-in mutating plugins, mutating webhooks,
then (after object validation) ValidatingAdmissionPolicies, then validating webhooks.

Webhooks are called for real: HTTPS to the Service's DNS name (<svc>.<ns>.svc), the server certificate verified
against the configuration's caBundle, an admission.k8s.io/v1 AdmissionReview, JSONPatch responses applied,
timeoutSeconds and failurePolicy honoured, rules, namespaceSelector, objectSelector and matchConditions (CEL, on a
real CEL runtime) matched. Services have no cluster network here: `route(namespace, service, port, host, local_port)`
says where a Service's port is served on this machine (the OPA stand-in routes its Service itself); a Service
without a route answers as one without endpoints does.

Who sent the request (the AdmissionReview's userInfo, CEL's request.userInfo) is the emulator's admin unless the
client impersonates someone, as kubectl --as/--as-group does (`Impersonate-User` / `Impersonate-Group` headers).

ValidatingAdmissionPolicy params (paramKind, paramRef by name or selector, in its namespace or the request's,
parameterNotFoundAction) are found as the API server finds them, and the policy is evaluated once per param.

Approximations (docs/testing.md): CREATE and UPDATE (PUT) run the chain, PATCH and DELETE do not; reinvocationPolicy,
MutatingAdmissionPolicy, audit annotations and warnings are not modelled; CEL sees untyped maps instead of
schema-typed objects.
"""
from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import threading
import time
import uuid
from dataclasses import dataclass

from . import cel, kinds
from .selectors import selector_object_matches
from .util import ApiError, jcopy

GROUP = "admissionregistration.k8s.io"
ADMIN = {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}
NOT_ADMITTED = {GROUP}  # configurations are never sent through webhooks (the recovery path must stay open)


@dataclass
class Call:
    webhook: str
    operation: str
    outcome: str  # allowed | patched | denied | error: ...
    seconds: float


class AdmissionChain:
    def __init__(self, emulator):
        self.emulator = emulator
        self.routes: dict[tuple[str, str, int], tuple[str, int]] = {}
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    # --- service routing -------------------------------------------------------------------------------------------
    def route(self, namespace: str, service: str, port: int, host: str, local_port: int) -> None:
        with self._lock:
            self.routes[(namespace, service, port)] = (host, local_port)

    def unroute(self, namespace: str, service: str, port: int | None = None) -> None:
        with self._lock:
            for key in [k for k in self.routes if k[:2] == (namespace, service) and port in (None, k[2])]:
                del self.routes[key]

    # --- the chain ----------------------------------------------------------------------------------------------------
    def applies(self, rt) -> bool:
        if rt.group in NOT_ADMITTED:
            return False
        objects = self.emulator.store.objects
        return any(objects.get((GROUP, plural)) for plural in (
            "mutatingwebhookconfigurations", "validatingwebhookconfigurations", "validatingadmissionpolicybindings"))

    def mutate(self, rt, namespace: str | None, obj: dict, old: dict | None, operation: str, dry_run: bool,
               user: dict | None = None) -> dict:
        """Defaulting and the built-in mutating plugins, then every matching mutating webhook (by configuration
        name, then webhook order). Returns the object to store."""
        obj = jcopy(obj)
        meta = obj.setdefault("metadata", {})
        if namespace and rt.namespaced:
            meta.setdefault("namespace", namespace)
        if rt.kind == "Pod" and old is None:
            kinds.default_pod_spec(obj.setdefault("spec", {}))
            kinds.admit_pod(obj, self.emulator.store.extended_resource_toleration)
            obj.pop("status", None)
        for config in self._configurations("mutatingwebhookconfigurations"):
            for hook in config.get("webhooks") or []:
                obj = self._call(hook, rt, namespace, obj, old, operation, dry_run, mutating=True, user=user)
        return obj

    def validate(self, rt, namespace: str | None, obj: dict, old: dict | None, operation: str, dry_run: bool,
                 user: dict | None = None) -> None:
        self._policies(rt, namespace, obj, old, operation, user, dry_run)
        for config in self._configurations("validatingwebhookconfigurations"):
            for hook in config.get("webhooks") or []:
                self._call(hook, rt, namespace, obj, old, operation, dry_run, mutating=False, user=user)

    def _configurations(self, plural: str) -> list[dict]:
        with self.emulator.store.lock:
            bucket = self.emulator.store.objects.get((GROUP, plural), {})
            return [jcopy(obj) for _key, obj in sorted(bucket.items())]

    # --- matching --------------------------------------------------------------------------------------------------
    def _rules_match(self, rules: list, rt, operation: str) -> bool:
        for rule in rules or []:
            if not ({"*", operation} & set(rule.get("operations") or [])):
                continue
            if not ({"*", rt.group} & set(rule.get("apiGroups") or [])):
                continue
            if not ({"*", rt.version} & set(rule.get("apiVersions") or [])):
                continue
            if not ({"*", rt.plural} & set(rule.get("resources") or [])):
                continue
            scope = rule.get("scope", "*")
            if scope == "*" or (scope == "Namespaced") == rt.namespaced:
                return True
        return False

    def _namespace_labels(self, rt, namespace: str | None, obj: dict) -> dict | None:
        if rt.kind == "Namespace":
            return (obj.get("metadata") or {}).get("labels") or {}
        if not rt.namespaced:
            return None  # cluster-scoped objects are not filtered by a namespaceSelector
        ns = self.emulator.store.objects.get(("", "namespaces"), {}).get(("", namespace))
        return ((ns or {}).get("metadata") or {}).get("labels") or {"kubernetes.io/metadata.name": namespace}

    def _selected(self, selectors: dict, rt, namespace, obj, old) -> bool:
        labels = self._namespace_labels(rt, namespace, obj)
        if labels is not None and not selector_object_matches(selectors.get("namespaceSelector") or {}, labels):
            return False
        object_selector = selectors.get("objectSelector") or {}
        candidates = [((o or {}).get("metadata") or {}).get("labels") or {} for o in (obj, old) if o is not None]
        return any(selector_object_matches(object_selector, labels) for labels in candidates)

    @staticmethod
    def _request(rt, namespace, obj, old, operation, dry_run, user: dict | None = None) -> dict:
        meta = obj.get("metadata") or {}
        return {"uid": str(uuid.uuid4()), "kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
                "resource": {"group": rt.group, "version": rt.version, "resource": rt.plural},
                "requestKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
                "requestResource": {"group": rt.group, "version": rt.version, "resource": rt.plural},
                "name": meta.get("name", ""), "namespace": namespace or "", "operation": operation,
                "userInfo": jcopy(user or ADMIN),
                "object": obj, "oldObject": old, "dryRun": dry_run,
                "options": {"apiVersion": "meta.k8s.io/v1",
                            "kind": "CreateOptions" if operation == "CREATE" else "UpdateOptions"}}

    def _conditions_hold(self, conditions, variables: dict, name: str, fail: bool) -> bool:
        """All matchConditions true. An evaluation error: skip under Ignore, reject under Fail."""
        for condition in conditions or []:
            try:
                if not cel.truth(condition["expression"], **variables):
                    return False
            except cel.CelError as error:
                if fail:
                    raise ApiError(500, f"Internal error occurred: failed to evaluate match condition "
                                        f"{condition.get('name')!r} of {name}: {error}", "InternalError")
                return False
        return True

    # --- webhooks --------------------------------------------------------------------------------------------------
    def _call(self, hook: dict, rt, namespace, obj, old, operation, dry_run, mutating: bool,
              user: dict | None = None) -> dict:
        name = hook.get("name", "")
        fail = hook.get("failurePolicy", "Fail") == "Fail"
        if not self._rules_match(hook.get("rules"), rt, operation) or \
                not self._selected(hook, rt, namespace, obj, old):
            return obj
        request = self._request(rt, namespace, obj, old, operation, dry_run, user)
        variables = {"object": obj, "oldObject": old, "request": request}
        if not self._conditions_hold(hook.get("matchConditions"), variables, f'webhook "{name}"', fail):
            return obj
        if dry_run and hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            raise ApiError(400, f'admission webhook "{name}" does not support dry run', "BadRequest")
        started = time.monotonic()
        try:
            review = self._post(hook, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                       "request": request})
            response = review.get("response") or {}
            if review.get("apiVersion") != "admission.k8s.io/v1" or review.get("kind") != "AdmissionReview":
                raise WebhookError(f"expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got "
                                   f"{review.get('apiVersion')}, Kind={review.get('kind')}")
            if response.get("uid") != request["uid"]:
                raise WebhookError(f"expected response.uid={request['uid']!r}, got {response.get('uid')!r}")
        except WebhookError as error:
            self._record(name, operation, f"error: {error}", started)
            if fail:
                raise ApiError(500, f'Internal error occurred: failed calling webhook "{name}": {error}',
                               "InternalError")
            return obj
        if not response.get("allowed"):
            self._record(name, operation, "denied", started)
            raise _denied(name, response.get("status") or {})
        patch = response.get("patch")
        if not patch:
            self._record(name, operation, "allowed", started)
            return obj
        if not mutating:
            raise ApiError(500, f'Internal error occurred: validating webhook "{name}" returned a patch',
                           "InternalError")
        from .patches import json_patch
        try:
            if response.get("patchType") != "JSONPatch":
                raise ValueError(f"unsupported patchType {response.get('patchType')!r}")
            patched = json_patch(jcopy(obj), json.loads(base64.b64decode(patch)))
        except (ValueError, ApiError) as error:
            self._record(name, operation, f"error: bad patch: {error}", started)
            if fail:
                raise ApiError(500, f'Internal error occurred: JSON Patch from webhook "{name}": {error}',
                               "InternalError")
            return obj
        self._record(name, operation, "patched", started)
        return patched

    def _record(self, name: str, operation: str, outcome: str, started: float) -> None:
        with self._lock:
            self.calls.append(Call(name, operation, outcome, time.monotonic() - started))

    def _post(self, hook: dict, review: dict) -> dict:
        client = hook.get("clientConfig") or {}
        timeout = float(hook.get("timeoutSeconds") or 10)
        if "service" in client:
            service = client["service"]
            port = int(service.get("port") or 443)
            server_name = f"{service['name']}.{service['namespace']}.svc"
            path = service.get("path") or "/"
            url = f"https://{server_name}:{port}{path}?timeout={int(timeout)}s"
            target = self.routes.get((service["namespace"], service["name"], port))
            if target is None:
                raise WebhookError(f'failed to call webhook: Post "{url}": no endpoints available for service '
                                   f'"{service["name"]}"')
        elif client.get("url"):
            from urllib.parse import urlsplit
            url = client["url"]
            split = urlsplit(url)
            server_name, path = split.hostname, (split.path or "/") + (f"?{split.query}" if split.query else "")
            target = (split.hostname, split.port or 443)
        else:
            raise WebhookError("the webhook's clientConfig has neither service nor url")
        context = ssl.create_default_context()
        bundle = client.get("caBundle")
        if bundle:
            try:
                context = ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
            except (ValueError, ssl.SSLError) as error:
                raise WebhookError(f"failed to call webhook: caBundle: {error}")
        try:
            sock = socket.create_connection(target, timeout=timeout)
            try:
                tls = context.wrap_socket(sock, server_hostname=server_name)
            except BaseException:
                sock.close()
                raise
            connection = http.client.HTTPConnection(server_name, timeout=timeout)
            connection.sock = tls
            payload = json.dumps(review).encode()
            connection.request("POST", path if "?" in path else f"{path}?timeout={int(timeout)}s", body=payload,
                               headers={"Content-Type": "application/json", "Accept": "application/json"})
            response = connection.getresponse()
            body = response.read()
            connection.close()
        except ssl.SSLCertVerificationError as error:
            raise WebhookError(f'failed to call webhook: Post "{url}": tls: failed to verify certificate: '
                               f'{error.verify_message}')
        except (socket.timeout, TimeoutError):
            raise WebhookError(f'failed to call webhook: Post "{url}": context deadline exceeded')
        except (OSError, ssl.SSLError, http.client.HTTPException) as error:
            raise WebhookError(f'failed to call webhook: Post "{url}": {error}')
        if response.status != 200:
            raise WebhookError(f"received invalid webhook response: HTTP {response.status}")
        try:
            return json.loads(body)
        except ValueError as error:
            raise WebhookError(f"received invalid webhook response: {error}")

    # --- ValidatingAdmissionPolicy -----------------------------------------------------------------------------------
    def _policies(self, rt, namespace, obj, old, operation, user: dict | None = None, dry_run: bool = False) -> None:
        store = self.emulator.store
        with store.lock:
            policies = {k[1]: jcopy(v) for k, v in store.objects.get((GROUP, "validatingadmissionpolicies"), {}).items()}
            bindings = [jcopy(v) for _k, v in sorted(store.objects.get(
                (GROUP, "validatingadmissionpolicybindings"), {}).items())]
        for binding in bindings:
            spec = binding.get("spec") or {}
            policy = policies.get(spec.get("policyName", ""))
            if policy is None:
                continue
            if not (policy.get("spec") or {}).get("paramKind"):
                self._evaluate_policy(policy, binding, rt, namespace, obj, old, operation, user, dry_run)
                continue
            for params in self._params(policy, binding, namespace, obj):
                self._evaluate_policy(policy, binding, rt, namespace, obj, old, operation, user, dry_run, params)

    def _params(self, policy: dict, binding: dict, namespace: str | None, obj: dict) -> list[dict]:
        """The parameter objects a binding selects, as the API server finds them: paramRef.name or its selector,
        in paramRef.namespace or else the request's own (for a namespaced paramKind). None found: the policy is not
        evaluated (parameterNotFoundAction Allow) or the request is denied (Deny)."""
        kind = policy["spec"]["paramKind"]
        ref = (binding.get("spec") or {}).get("paramRef") or {}
        prt = self.emulator.table.for_kind(kind.get("apiVersion", ""), kind.get("kind", ""))
        where = f"ValidatingAdmissionPolicy '{policy['metadata']['name']}' with binding '{binding['metadata']['name']}'"
        if prt is None:  # a paramKind that is not served: the policy is misconfigured, failurePolicy decides
            if policy["spec"].get("failurePolicy", "Fail") == "Fail":
                raise ApiError(403, f"{where}: failed to configure binding: paramKind {kind} is not served",
                               "Forbidden")
            return []
        in_namespace = (ref.get("namespace") or namespace) if prt.namespaced else None
        items = self.emulator.store.list(prt, in_namespace)[0]
        if ref.get("name"):
            found = [i for i in items if i["metadata"]["name"] == ref["name"]]
        else:
            found = [i for i in items if selector_object_matches(ref.get("selector") or {},
                                                                 i["metadata"].get("labels") or {})]
        if not found and ref.get("parameterNotFoundAction") == "Deny":
            name = (obj.get("metadata") or {}).get("name", "")
            raise ApiError(403, f'{where} denied request: no params found for policy binding with `Deny` '
                                f'parameterNotFoundAction', "Forbidden", {"name": name})
        return found

    def _evaluate_policy(self, policy, binding, rt, namespace, obj, old, operation, user=None,
                         dry_run: bool = False, params: dict | None = None) -> None:
        spec, binding_spec = policy.get("spec") or {}, binding.get("spec") or {}
        constraints = spec.get("matchConstraints") or {}
        if not self._rules_match([{**r, "scope": r.get("scope", "*")} for r in constraints.get("resourceRules") or []],
                                 rt, operation):
            return
        if not self._selected(constraints, rt, namespace, obj, old):
            return
        resources = binding_spec.get("matchResources")
        if resources and ((resources.get("resourceRules") and not self._rules_match(
                resources["resourceRules"], rt, operation)) or not self._selected(resources, rt, namespace, obj, old)):
            return
        fail = spec.get("failurePolicy", "Fail") == "Fail"
        request = self._request(rt, namespace, obj, old, operation, dry_run, user)
        ns_obj = self.emulator.store.objects.get(("", "namespaces"), {}).get(("", namespace)) if namespace else None
        variables = {"object": obj, "oldObject": old, "request": request, "namespaceObject": ns_obj, "params": params}
        name, binding_name = policy["metadata"]["name"], binding["metadata"]["name"]
        where = f"ValidatingAdmissionPolicy '{name}' with binding '{binding_name}'"
        computed = {}
        for variable in spec.get("variables") or []:
            try:
                computed[variable["name"]] = cel.evaluate(variable["expression"], **variables, variables=computed)
            except cel.CelError:
                computed[variable["name"]] = None
        variables["variables"] = computed
        if not self._conditions_hold(spec.get("matchConditions"), variables, where, fail):
            return
        actions = binding_spec.get("validationActions") or []
        for validation in spec.get("validations") or []:
            try:
                ok = cel.truth(validation["expression"], **variables)
                message = validation.get("message") or f"failed expression: {validation['expression']}"
                if not ok and validation.get("messageExpression"):
                    try:  # the API server's rule: a messageExpression that fails or is empty leaves the message
                        message = cel.evaluate(validation["messageExpression"], **variables) or message
                    except cel.CelError:
                        pass
            except cel.CelError as error:
                if not fail:
                    continue
                ok, message = False, f"expression '{validation['expression']}' resulted in error: {error}"
            if not ok and "Deny" in actions:
                reason = validation.get("reason") or "Invalid"
                code = {"Unauthorized": 401, "Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413}.get(
                    reason, 422)
                text = f"{where} denied request: {message}"
                obj_name = (obj.get("metadata") or {}).get("name", "")
                raise ApiError(code, f'{rt.plural} "{obj_name}" is forbidden: {text}', reason,
                               {"name": obj_name, "kind": rt.plural, "causes": [{"message": text}]})


class WebhookError(Exception):
    pass


def _denied(name: str, status: dict) -> ApiError:
    """apiserver's webhookerrors.ToStatusErr: at least 400 (403 by default), the message prefixed with the name."""
    code = status.get("code") or 0
    code = code if code >= 400 else 403
    denied_by = f'admission webhook "{name}" denied the request'
    if status.get("message"):
        message = f"{denied_by}: {status['message']}"
    elif status.get("reason"):
        message = f"{denied_by}: {status['reason']}"
    else:
        message = f"{denied_by} without explanation"
    return ApiError(code, message, status.get("reason", ""))
