"""Object storage with the apiserver's write semantics, resourceVersions, watch fan-out and history."""
from __future__ import annotations

import base64
import json
import queue
import random
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field

from . import kinds, ssa
from .patches import json_patch, merge_patch, strategic_merge
from .resources import FIELD_SELECTORS, ResourceTable, ResourceType
from .schema import ANY, Schema, SchemaSet, crd_version_schema
from .selectors import fields_match, labels_match, parse_field_selector, parse_label_selector
from .util import ApiError, already_exists, conflict, invalid, jcopy, not_found, now
from .validation import Problems, check_metadata, clean

CRD_CLEANUP = "customresourcecleanup.apiextensions.k8s.io"
GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
SYSTEM_META = ("uid", "resourceVersion", "creationTimestamp", "generation", "deletionTimestamp",
               "deletionGracePeriodSeconds", "selfLink")


@dataclass
class Event:
    type: str  # ADDED, MODIFIED, DELETED
    group: str
    plural: str
    obj: dict
    old: dict | None
    rv: int


@dataclass(eq=False)
class Watcher:
    group: str
    plural: str
    namespace: str | None
    labels: list
    fields: list
    queue: "queue.Queue[tuple[str, dict] | None]" = field(default_factory=queue.Queue)

    def matches(self, obj: dict | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata", {})
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return labels_match(self.labels, meta.get("labels")) and fields_match(self.fields, obj)

    def offer(self, event: Event) -> None:
        now_in, was_in = self.matches(event.obj), self.matches(event.old)
        if event.type == "DELETED":
            if now_in or was_in:
                self.queue.put(("DELETED", event.obj))
        elif now_in and was_in:
            self.queue.put(("MODIFIED", event.obj))
        elif now_in:
            self.queue.put(("ADDED", event.obj))
        elif was_in:
            self.queue.put(("DELETED", event.obj))


@dataclass
class WriteOptions:
    manager: str = ""
    dry_run: bool = False
    field_validation: str = "Warn"  # Strict | Warn | Ignore
    warnings: list = field(default_factory=list)
    subresource: str = ""
    force: bool = False


class Store:
    def __init__(self, table: ResourceTable, schemas: SchemaSet, history_limit: int = 20000,
                 extended_resource_toleration: bool = False):
        self.lock = threading.RLock()
        self.table = table
        self.schemas = schemas
        self.objects: dict[tuple[str, str], dict[tuple[str, str], dict]] = {}
        self.rv = 1000
        self.history: deque[Event] = deque()
        self.history_limit = history_limit
        self.compacted_rv = self.rv
        self.watchers: list[Watcher] = []
        self.listeners: list = []
        self.allocator = kinds.Allocator()
        self.extended_resource_toleration = extended_resource_toleration
        self.pod_logs: dict[tuple[str, str, str], str] = {}
        self.denied_access: list[dict] = []  # SelfSubjectAccessReview answers: attribute matchers that are denied
        self._crd_schemas: dict[tuple, Schema] = {}
        # uid -> (group, plural, namespace, name), and owner uid -> its dependents' keys: the garbage collector asks
        # both for every deleted object, and a scan of every object each time is quadratic at 1,000s of pods.
        self._uids: dict[str, tuple[str, str, str, str]] = {}
        self._dependents: dict[str, set[tuple[str, str, str, str]]] = {}
        self._random = random.Random(7)
        self._admitted_as = ""  # the name admission sees on a create (before generateName is resolved)

    # --- reading ------------------------------------------------------------------------------------------------
    def bucket(self, rt: ResourceType) -> dict:
        return self.objects.setdefault(rt.group_resource, {})

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict:
        with self.lock:
            obj = self.bucket(rt).get((namespace or "", name))
            if obj is None:
                raise not_found(rt, name)
            return self._as_version(obj, rt)

    def find(self, rt: ResourceType, namespace: str | None, name: str) -> dict | None:
        with self.lock:
            obj = self.bucket(rt).get((namespace or "", name))
            return None if obj is None else self._as_version(obj, rt)

    def list(self, rt: ResourceType, namespace: str | None = None, label_selector: str = "", field_selector: str = "",
             limit: int = 0, continue_token: str = "") -> tuple[list[dict], str, int, str]:
        """Returns (items, resourceVersion, remainingItemCount or -1, continue token)."""
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, self._selectable(rt))
        with self.lock:
            start = self._decode_continue(continue_token) if continue_token else None
            keys = sorted(self.bucket(rt))
            items = []
            for key in keys:
                if start is not None and key <= start:
                    continue
                if namespace and key[0] != namespace:
                    continue
                obj = self.bucket(rt)[key]
                if labels_match(labels, obj["metadata"].get("labels")) and fields_match(fields, obj):
                    items.append(self._as_version(obj, rt))
            token, remaining = "", -1
            if limit and len(items) > limit:
                remaining = len(items) - limit
                items = items[:limit]
                last = items[-1]["metadata"]
                token = self._encode_continue((last.get("namespace", ""), last["name"]))
            return items, str(self.rv), remaining, token

    def _selectable(self, rt: ResourceType) -> tuple[str, ...]:
        return FIELD_SELECTORS.get(rt.group_resource, ()) + tuple(rt.selectable_fields)

    def _encode_continue(self, key: tuple[str, str]) -> str:
        raw = json.dumps({"v": "meta.k8s.io/v1", "rv": self.rv, "start": list(key)})
        return base64.urlsafe_b64encode(raw.encode()).decode()

    def _decode_continue(self, token: str) -> tuple[str, str]:
        try:
            data = json.loads(base64.urlsafe_b64decode(token.encode()))
            rv, start = int(data["rv"]), tuple(data["start"])
        except (ValueError, KeyError, TypeError):
            raise ApiError(400, "continue key is not valid: incorrect encoded start resourceVersion")
        if rv < self.compacted_rv:
            raise ApiError(410, "The provided continue parameter is too old to display a consistent list result. "
                                "You can start a new list without the continue parameter.", "Expired")
        return start

    def _as_version(self, obj: dict, rt: ResourceType) -> dict:
        """Custom resources are stored once and served at every version (conversion strategy None)."""
        if rt.custom and obj.get("apiVersion") != rt.api_version:
            return {**obj, "apiVersion": rt.api_version}
        return obj

    # --- schemas ----------------------------------------------------------------------------------------------------
    def schema_for(self, rt: ResourceType) -> Schema:
        if not rt.custom:
            return self.schemas.for_gvk(rt.group, rt.version, rt.kind) or ANY
        crd = self.bucket(self._crd_type()).get(("", rt.qualified))
        if crd is None:
            return ANY
        key = (rt.qualified, rt.version, crd["metadata"]["resourceVersion"])
        if key not in self._crd_schemas:
            self._crd_schemas[key] = crd_version_schema(crd, rt.version, self.schemas.object_meta())
        return self._crd_schemas[key]

    def _crd_type(self) -> ResourceType:
        return self.table.lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")

    # --- events -----------------------------------------------------------------------------------------------------
    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, event_type: str, rt: ResourceType, obj: dict, old: dict | None) -> None:
        self._index(event_type, rt, obj, old)
        event = Event(event_type, rt.group, rt.plural, obj, old, self.rv)
        self.history.append(event)
        while len(self.history) > self.history_limit:
            self.compacted_rv = self.history.popleft().rv
        for watcher in self.watchers:
            if watcher.group == rt.group and watcher.plural == rt.plural:
                watcher.offer(event)
        for listener in self.listeners:
            listener(event)

    def compact(self) -> None:
        """Forget all history, as etcd compaction does: older resourceVersions now answer 410 Gone."""
        with self.lock:
            self.history.clear()
            self.compacted_rv = self.rv

    def watch(self, rt: ResourceType, namespace: str | None, label_selector: str, field_selector: str,
              resource_version: str, send_initial: bool) -> tuple[Watcher, list[tuple[str, dict]]]:
        """Register a watcher; returns it with the events to send first (initial state or replayed history)."""
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, self._selectable(rt))
        watcher = Watcher(rt.group, rt.plural, namespace, labels, fields)
        with self.lock:
            if send_initial or resource_version in ("", "0"):
                initial = [("ADDED", self._as_version(obj, rt)) for _key, obj in sorted(self.bucket(rt).items())
                           if watcher.matches(obj)]
            else:
                try:
                    start = int(resource_version)
                except ValueError:
                    raise ApiError(400, f"invalid resource version {resource_version!r}")
                if start < self.compacted_rv:
                    raise ApiError(410, f"too old resource version: {start} ({self.compacted_rv})", "Expired")
                initial = []
                for event in self.history:
                    if event.rv > start and event.group == rt.group and event.plural == rt.plural:
                        probe = Watcher(rt.group, rt.plural, namespace, labels, fields, queue.Queue())
                        probe.offer(event)
                        while not probe.queue.empty():
                            kind, obj = probe.queue.get()
                            initial.append((kind, self._as_version(obj, rt)))
            self.watchers.append(watcher)
        return watcher, initial

    def unwatch(self, watcher: Watcher) -> None:
        with self.lock:
            if watcher in self.watchers:
                self.watchers.remove(watcher)

    # --- writing ----------------------------------------------------------------------------------------------------
    def create(self, rt: ResourceType, namespace: str | None, body: dict, opts: WriteOptions) -> dict:
        with self.lock:
            obj = jcopy(body)
            meta = obj.setdefault("metadata", {})
            self._check_namespace_scope(rt, namespace, meta)
            # Admission runs before the real server generates a name: its messages name the generateName.
            self._admitted_as = meta.get("name") or meta.get("generateName", "")
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + "".join(self._random.choice(GENERATE_ALPHABET)
                                                              for _ in range(5))
            name = meta.get("name", "")
            if (namespace or "", name) in self.bucket(rt) and name:
                raise already_exists(rt, name)
            self._check_namespace_open(rt, namespace)
            for key in SYSTEM_META:
                meta.pop(key, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            return self._write(rt, namespace, name, None, obj, opts, operation="Update")

    def update(self, rt: ResourceType, namespace: str | None, name: str, body: dict, opts: WriteOptions) -> dict:
        with self.lock:
            old = self.bucket(rt).get((namespace or "", name))
            if old is None:
                raise not_found(rt, name)
            obj = jcopy(body)
            meta = obj.setdefault("metadata", {})
            self._check_namespace_scope(rt, namespace, meta)
            if meta.get("name", name) != name:
                raise ApiError(400, f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                                    f"({name})")
            wanted_rv = meta.get("resourceVersion")
            if wanted_rv and wanted_rv != old["metadata"]["resourceVersion"]:
                raise conflict(rt, name, "the object has been modified; please apply your changes to the latest "
                                         "version and try again")
            self._keep_system_meta(meta, old)
            return self._write(rt, namespace, name, old, obj, opts, operation="Update")

    def patch(self, rt: ResourceType, namespace: str | None, name: str, patch_type: str, body,
              opts: WriteOptions) -> tuple[dict, bool]:
        """Returns (object, created)."""
        with self.lock:
            old = self.bucket(rt).get((namespace or "", name))
            schema = self.schema_for(rt)
            if patch_type == "apply":
                return self._apply(rt, namespace, name, old, body, schema, opts)
            if old is None:
                raise not_found(rt, name)
            current = jcopy(old)
            if patch_type == "merge":
                result = merge_patch(current, body)
            elif patch_type == "strategic":
                if rt.custom:
                    raise ApiError(415, "strategic merge patch is not supported for custom resources; use "
                                        "merge patch or server-side apply", "UnsupportedMediaType")
                result = strategic_merge(current, body, schema)
            elif patch_type == "json":
                result = json_patch(current, body)
            else:
                raise ApiError(415, f"unsupported patch type {patch_type}", "UnsupportedMediaType")
            if not isinstance(result, dict):
                raise ApiError(422, "the patched object is not a JSON object")
            meta = result.setdefault("metadata", {})
            wanted_rv = meta.get("resourceVersion")
            if wanted_rv and wanted_rv != old["metadata"]["resourceVersion"]:
                raise conflict(rt, name, "the object has been modified; please apply your changes to the latest "
                                         "version and try again")
            if meta.get("name", name) != name:
                raise ApiError(400, "metadata.name: the name may not be changed by a patch")
            self._keep_system_meta(meta, old)
            return self._write(rt, namespace, name, old, result, opts, operation="Update"), False

    def _apply(self, rt, namespace, name, old, body, schema, opts: WriteOptions) -> tuple[dict, bool]:
        if not opts.manager:
            raise ApiError(422, "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required "
                                "for apply patch", "Invalid")
        if not isinstance(body, dict):
            raise ApiError(400, "apply patch must be a single object")
        if body.get("kind") and body.get("kind") != rt.kind:
            raise ApiError(400, f"the kind {body.get('kind')!r} of the applied object does not match {rt.kind!r}")
        meta = body.get("metadata") or {}
        if meta.get("name", name) != name:
            raise ApiError(400, f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                                f"({name})")
        applied, _partial = self._validated(rt, jcopy(body), schema, opts)  # required fields: checked once merged
        if old is None:
            if opts.subresource:
                raise not_found(rt, name)
            self._check_namespace_open(rt, namespace)
            self._check_namespace_scope(rt, namespace, applied.setdefault("metadata", {}))
        applied.setdefault("metadata", {})["name"] = name
        merged = ssa.apply(old, applied, opts.manager, opts.force, schema, rt.api_version, now(), opts.subresource,
                           rt.has_status)
        merged["apiVersion"], merged["kind"] = rt.api_version, rt.kind
        meta = merged.setdefault("metadata", {})
        if namespace and rt.namespaced:
            meta["namespace"] = namespace
        if old is None:
            meta["uid"], meta["creationTimestamp"] = str(uuid.uuid4()), now()
            return self._write(rt, namespace, name, None, merged, opts, "Apply"), True
        self._keep_system_meta(meta, old)
        return self._write(rt, namespace, name, old, merged, opts, "Apply"), False

    def _keep_system_meta(self, meta: dict, old: dict) -> None:
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
            else:
                meta.pop(key, None)
        meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        if "namespace" in old["metadata"]:
            meta["namespace"] = old["metadata"]["namespace"]

    def _check_namespace_scope(self, rt: ResourceType, namespace: str | None, meta: dict) -> None:
        if rt.namespaced:
            if not namespace:
                raise ApiError(404, "the server could not find the requested resource", "NotFound")
            if (meta.get("namespace") or namespace) != namespace:
                raise ApiError(400, "the namespace of the provided object does not match the namespace sent on the "
                                    "request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)

    def _check_namespace_open(self, rt: ResourceType, namespace: str | None) -> None:
        if not rt.namespaced:
            return
        ns = self.objects.get(("", "namespaces"), {}).get(("", namespace))
        if ns is None:
            raise ApiError(404, f'namespaces "{namespace}" not found', "NotFound",
                           {"name": namespace, "kind": "namespaces"})
        if ns["metadata"].get("deletionTimestamp"):
            raise ApiError(403, f"{rt.plural} \"\" is forbidden: unable to create new content in namespace "
                                f"{namespace} because it is being terminated", "Forbidden",
                           {"causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace",
                                        "message": f"namespace {namespace} is being terminated"}]})

    def _validated(self, rt: ResourceType, obj: dict, schema: Schema, opts: WriteOptions) -> tuple[dict, list]:
        """Decode-time checks: types (400 for built-ins, 422 for custom), unknown fields per fieldValidation."""
        problems = Problems()
        name = (obj.get("metadata") or {}).get("name", "")
        cleaned = clean(obj, schema, "", problems, custom=rt.custom)
        if problems.type_errors:
            if rt.custom:
                raise invalid(rt, name, [("FieldValueTypeInvalid", path, f"Invalid value: \"{got}\": {path} in body "
                                                                         f"must be of type {expected}")
                                         for path, expected, got in problems.type_errors])
            path, expected, got = problems.type_errors[0]
            raise ApiError(400, f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: json: cannot '
                                f'unmarshal {got} into Go struct field .{path} of type {expected}', "BadRequest")
        if problems.unknown:
            unknown = ", ".join(f'unknown field "{path}"' for path in problems.unknown)
            if opts.field_validation == "Strict":
                raise ApiError(400, f"strict decoding error: {unknown}", "BadRequest")
            if opts.field_validation == "Warn":
                opts.warnings.extend(f'unknown field "{path}"' for path in problems.unknown)
        return cleaned, [(reason, path, message) for reason, path, message, _value in problems.invalid]

    def _service_account_exists(self, namespace: str | None, pod: dict) -> None:
        """The ServiceAccount admission plugin: a pod naming a ServiceAccount that does not exist is refused (the
        real API server found a stand-in's DaemonSets doing that). A missing `default` is let through on purpose: the
        real server refuses it only until its controller made it, a window the emulator's loop would only widen."""
        account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        if account == "default" or (namespace, account) in self.objects.get(("", "serviceaccounts"), {}):
            return
        raise ApiError(403, f'pods "{self._admitted_as}" is forbidden: error looking up '
                            f'service account {namespace}/{account}: serviceaccount "{account}" not found',
                       "Forbidden")

    def _write(self, rt: ResourceType, namespace: str | None, name: str, old: dict | None, obj: dict,
               opts: WriteOptions, operation: str) -> dict:
        """The shared tail of every write: validate, default, admit, track fields, then store and notify."""
        schema = self.schema_for(rt)
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        obj, causes = self._validated(rt, obj, schema, opts)
        obj = self._reset_fields(rt, old, obj, opts.subresource)
        kinds.default_object(obj, rt, self.allocator, old)
        if rt.kind == "Pod" and old is None:
            kinds.admit_pod(obj, self.extended_resource_toleration)
            self._service_account_exists(namespace, obj)
        meta = obj["metadata"]
        problems = Problems()
        check_metadata(meta, kinds.name_style(rt), problems)
        causes = causes + [(r, p, m) for r, p, m, _v in problems.invalid]
        causes += kinds.semantic_problems(obj)
        if old is not None:
            causes += kinds.immutable_violations(rt, old, obj)
        if causes:
            raise invalid(rt, name or meta.get("name", ""), causes)
        if operation != "Apply" and not self._client_set_managed_fields(old, obj):
            ssa.track_update(old, obj, opts.manager or "unknown", opts.subresource, rt.api_version, now(), schema,
                             rt.has_status)
        self._set_generation(rt, old, obj)
        if old is not None and obj == old:
            return old  # a no-op write changes nothing, not even the resourceVersion
        if old is not None and old["metadata"].get("deletionTimestamp") and not meta.get("finalizers"):
            return self._remove(rt, old, obj, opts.dry_run)
        if opts.dry_run:
            if old is None:
                meta.pop("resourceVersion", None)
            return obj
        meta["resourceVersion"] = self._next_rv()
        self.bucket(rt)[(namespace or "", meta["name"])] = obj
        if rt.kind == "CustomResourceDefinition":
            self._register_crd(obj)
        self._emit("ADDED" if old is None else "MODIFIED", rt, obj, old)
        return obj

    def _client_set_managed_fields(self, old: dict | None, new: dict) -> bool:
        """A client that writes managedFields itself (helm's rollback does) gets exactly what it wrote."""
        wanted = new["metadata"].get("managedFields")
        previous = (old or {}).get("metadata", {}).get("managedFields")
        if wanted is None or wanted == previous:
            return False
        if wanted == [{}] or wanted == []:
            new["metadata"].pop("managedFields", None)
        return True

    def _reset_fields(self, rt: ResourceType, old: dict | None, obj: dict, subresource: str) -> dict:
        if not rt.has_status:
            return obj
        if subresource == "status":
            if old is None:
                return obj
            # Stored objects are never edited in place, so the new one may share everything but its metadata (which
            # this write changes) and its status (the caller's) with the old: no copy of a 1,000-item spec per write.
            out = {**old, "metadata": dict(old["metadata"])}
            out["status"] = obj.get("status", {})
            out["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            if "managedFields" in obj.get("metadata", {}):
                out["metadata"]["managedFields"] = obj["metadata"]["managedFields"]
            return out
        if old is not None:
            if "status" in old:
                obj["status"] = jcopy(old["status"])
            else:
                obj.pop("status", None)
        elif rt.kind not in ("Node",):
            obj.pop("status", None)
        return obj

    def _set_generation(self, rt: ResourceType, old: dict | None, obj: dict) -> None:
        if not kinds.tracks_generation(rt):
            obj["metadata"].pop("generation", None)
            return
        if old is None:
            obj["metadata"]["generation"] = 1
            return
        generation = old["metadata"].get("generation", 1)
        ignored = ("metadata", "status")
        changed = {k: v for k, v in obj.items() if k not in ignored} != \
                  {k: v for k, v in old.items() if k not in ignored}
        obj["metadata"]["generation"] = generation + 1 if changed else generation

    def bind(self, rt: ResourceType, namespace: str, name: str, node: str, dry_run: bool = False) -> dict:
        """pods/binding, as the API server's BindingREST does it: one storage-level update that sets spec.nodeName
        and the PodScheduled=True condition together, with no field manager (a bound pod's managedFields name no
        scheduler); 409 when the pod is bound already."""
        with self.lock:
            old = self.bucket(rt).get((namespace or "", name))
            if old is None:
                raise not_found(rt, name)
            if old["spec"].get("nodeName"):
                raise ApiError(409, f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
                                    f'assigned to node "{old["spec"]["nodeName"]}"', "Conflict")
            if old["metadata"].get("deletionTimestamp"):
                raise ApiError(409, f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is being '
                                    f'deleted, cannot be assigned to a host', "Conflict")
            obj = {**old, "metadata": dict(old["metadata"]), "spec": {**old["spec"], "nodeName": node}}
            status = dict(old.get("status") or {})
            scheduled = {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now()}
            conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
            status["conditions"] = conditions + [scheduled]
            obj["status"] = status
            if dry_run:
                return obj
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self.bucket(rt)[(namespace or "", name)] = obj
            self._emit("MODIFIED", rt, obj, old)
            return obj

    # --- deleting -------------------------------------------------------------------------------------------------
    def delete(self, rt: ResourceType, namespace: str | None, name: str, options: dict | None = None,
               dry_run: bool = False) -> dict:
        options = options or {}
        with self.lock:
            obj = self.bucket(rt).get((namespace or "", name))
            if obj is None:
                raise not_found(rt, name)
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != obj["metadata"]["uid"]:
                raise conflict(rt, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in object "
                                         f"meta: {obj['metadata']['uid']}")
            if pre.get("resourceVersion") and pre["resourceVersion"] != obj["metadata"]["resourceVersion"]:
                raise conflict(rt, name, "the ResourceVersion in the precondition does not match the ResourceVersion "
                                         "in record. The object might have been modified")
            if obj["metadata"].get("deletionTimestamp"):
                return obj
            policy = options.get("propagationPolicy") or ("Orphan" if options.get("orphanDependents") else "")
            finalizers = list(obj["metadata"].get("finalizers") or [])
            if policy == "Foreground" and "foregroundDeletion" not in finalizers:
                finalizers.append("foregroundDeletion")
            if policy == "Orphan" and "orphan" not in finalizers:
                finalizers.append("orphan")
            if rt.kind == "CustomResourceDefinition" and CRD_CLEANUP not in finalizers:
                finalizers.append(CRD_CLEANUP)  # the apiserver deletes the custom objects first
            if rt.kind == "Namespace":
                return self._terminate_namespace(rt, obj, finalizers, dry_run)
            if finalizers:
                marked = jcopy(obj)
                marked["metadata"]["finalizers"] = finalizers
                marked["metadata"]["deletionTimestamp"] = now()
                marked["metadata"]["deletionGracePeriodSeconds"] = 0
                if dry_run:
                    return marked
                marked["metadata"]["resourceVersion"] = self._next_rv()
                self.bucket(rt)[(namespace or "", name)] = marked
                self._emit("MODIFIED", rt, marked, obj)
                return marked
            return self._remove(rt, obj, obj, dry_run)

    def _terminate_namespace(self, rt, obj, finalizers, dry_run) -> dict:
        marked = jcopy(obj)
        marked["metadata"]["deletionTimestamp"] = now()
        if finalizers:
            marked["metadata"]["finalizers"] = finalizers
        marked.setdefault("status", {})["phase"] = "Terminating"
        if dry_run:
            return marked
        marked["metadata"]["resourceVersion"] = self._next_rv()
        self.bucket(rt)[("", obj["metadata"]["name"])] = marked
        self._emit("MODIFIED", rt, marked, obj)
        return marked

    def _remove(self, rt: ResourceType, old: dict, final: dict, dry_run: bool) -> dict:
        if dry_run:
            return final
        meta = final["metadata"]
        self.bucket(rt).pop((meta.get("namespace", ""), meta["name"]), None)
        gone = {**final, "metadata": {**final["metadata"], "resourceVersion": self._next_rv()}}
        if rt.kind == "CustomResourceDefinition":
            self._unregister_crd(final)
        self._emit("DELETED", rt, gone, old)
        return gone

    def delete_collection(self, rt: ResourceType, namespace: str | None, label_selector: str, field_selector: str,
                          options: dict | None, dry_run: bool) -> list[dict]:
        items, _rv, _rem, _tok = self.list(rt, namespace, label_selector, field_selector)
        return [self.delete(rt, i["metadata"].get("namespace"), i["metadata"]["name"], options, dry_run)
                for i in items]

    # --- CRDs -------------------------------------------------------------------------------------------------------
    def _register_crd(self, crd: dict) -> None:
        spec = crd.get("spec", {})
        names, group = spec.get("names", {}), spec.get("group", "")
        self.table.remove_group_resource(group, names.get("plural", ""))
        for version in spec.get("versions") or []:
            if not version.get("served", True):
                continue
            columns = tuple(json.dumps(c, sort_keys=True) for c in version.get("additionalPrinterColumns") or ())
            selectable = tuple(f.get("jsonPath", "").lstrip(".") for f in version.get("selectableFields") or ())
            self.table.add(ResourceType(
                group, version["name"], names.get("plural", ""), names.get("kind", ""),
                spec.get("scope") == "Namespaced", tuple(names.get("shortNames") or ()),
                tuple(s for s in ("status", "scale") if s in (version.get("subresources") or {})),
                categories=tuple(names.get("categories") or ()), custom=True,
                singular=names.get("singular", ""), list_kind=names.get("listKind", ""),
                printer_columns=columns, selectable_fields=selectable))

    def _unregister_crd(self, crd: dict) -> None:
        spec = crd.get("spec", {})
        group, plural = spec.get("group", ""), spec.get("names", {}).get("plural", "")
        self.table.remove_group_resource(group, plural)
        self.objects.pop((group, plural), None)

    # --- uid and owner indexes (every stored change passes _emit) --------------------------------------------------
    def _index(self, event_type: str, rt: ResourceType, obj: dict, old: dict | None) -> None:
        meta = obj["metadata"]
        key = (rt.group, rt.plural, meta.get("namespace", ""), meta["name"])
        owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
        before = {ref.get("uid") for ref in ((old or {}).get("metadata") or {}).get("ownerReferences") or []}
        if event_type == "DELETED":
            if self._uids.get(meta.get("uid")) == key:
                del self._uids[meta["uid"]]
            owners, before = set(), owners | before
        else:
            self._uids[meta.get("uid")] = key
        for uid in before - owners:
            self._dependents.get(uid, set()).discard(key)
        for uid in owners:
            self._dependents.setdefault(uid, set()).add(key)

    def _located(self, key: tuple[str, str, str, str]) -> tuple[ResourceType | None, dict | None]:
        group, plural, namespace, name = key
        candidates = self.table.versions_of(group, plural)
        return (candidates[0] if candidates else None), self.objects.get((group, plural), {}).get((namespace, name))

    def by_uid(self, uid: str) -> dict | None:
        """The stored object with this uid (None once it is gone)."""
        with self.lock:
            key = self._uids.get(uid)
            obj = self._located(key)[1] if key else None
            return obj if obj is not None and obj["metadata"].get("uid") == uid else None

    def dependents(self, uid: str) -> list[tuple[ResourceType | None, dict]]:
        """Stored objects with an ownerReference to this uid."""
        with self.lock:
            out = []
            for key in sorted(self._dependents.get(uid, ())):
                rt, obj = self._located(key)
                if obj is not None and any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or []):
                    out.append((rt, obj))
            return out

    # --- helpers for controllers and tests ---------------------------------------------------------------------
    def all_objects(self) -> list[tuple[ResourceType | None, dict]]:
        with self.lock:
            out = []
            for (group, plural), bucket in self.objects.items():
                candidates = self.table.versions_of(group, plural)
                rt = candidates[0] if candidates else None
                out.extend((rt, obj) for obj in bucket.values())
            return out
