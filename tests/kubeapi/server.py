"""HTTPS front end: authentication, routing, content negotiation, watch streaming, faults, and the request log."""
from __future__ import annotations

import json
import select
import socket
import ssl
import struct
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from . import discovery, protobuf, tables
from .requestlog import Request
from .resources import ResourceType
from .store import WriteOptions
from .util import ApiError, dumps, jcopy

PATCH_TYPES = {"application/apply-patch+yaml": "apply", "application/apply-patch+cbor": "apply",
               "application/merge-patch+json": "merge", "application/strategic-merge-patch+json": "strategic",
               "application/json-patch+json": "json"}
TABLE_CONTENT_TYPE = "application/json;as=Table;v=v1;g=meta.k8s.io"
DEFAULT_WATCH_SECONDS = 1800


class EmulatorHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address, emulator, ssl_context: ssl.SSLContext):
        self.emulator = emulator
        self.ssl_context = ssl_context
        self.open_watches: set = set()
        super().__init__(address, Handler)

    def finish_request(self, request, client_address):
        # The TLS handshake runs here, in the connection's own thread, so a slow client cannot stall accept().
        try:
            request.settimeout(30)
            tls = self.ssl_context.wrap_socket(request, server_side=True)
            tls.settimeout(None)
        except (ssl.SSLError, OSError):
            return
        self.RequestHandlerClass(tls, client_address, self)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes; Nagle would add ~40 ms each
    server: EmulatorHTTPServer

    def log_message(self, format, *args):  # noqa: A002 - the request log replaces stderr noise
        pass

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")

    def do_PUT(self):
        self._serve("PUT")

    def do_PATCH(self):
        self._serve("PATCH")

    def do_DELETE(self):
        self._serve("DELETE")

    # --- plumbing ---------------------------------------------------------------------------------------------------
    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _serve(self, method: str) -> None:
        emulator = self.server.emulator
        split = urlsplit(self.path)
        path = unquote(split.path).rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        body = self._read_body()
        record = Request(method, path, query, self.headers.get("Content-Type", ""), self.headers.get("User-Agent", ""),
                         dry_run=query.get("dryRun") == "All", body=body)
        emulator.requests.add(record)
        self._record = record
        self._warnings: list[str] = []
        started = record.started = time.monotonic()
        try:
            fault = emulator.faults.pick(method, path, split.query)
            if fault is not None:
                if fault.observe is not None:
                    fault.observe(record)
                if fault.action is not None:
                    fault.action()
                if fault.delay:
                    time.sleep(fault.delay)
                if fault.reset:
                    record.status = -1
                    self._reset()
                    return
                if fault.status:
                    self._send_json(fault.status, ApiError(fault.status, fault.message).status(), fault.headers)
                    return
            self._authenticate()
            self._route(method, path, query, body)
        except ApiError as error:
            self._send_json(error.code, error.status())
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.close_connection = True
        except Exception as error:  # noqa: BLE001 - an emulator bug must surface as a 500, like a server bug
            import traceback
            traceback.print_exc()
            self._send_json(500, ApiError(500, f"emulator internal error: {error!r}").status())
        finally:
            record.duration = time.monotonic() - started

    def _reset(self) -> None:
        self.close_connection = True
        try:
            raw = self.connection
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            raw.close()
        except OSError:
            pass

    def _authenticate(self) -> None:
        """The emulator's own certificate and token are cluster-admin (self._user None); a token made with
        Emulator.add_token is its user, whose requests RBAC authorizes (tests/kubeapi/rbac.py)."""
        emulator = self.server.emulator
        self._user = None
        if self.connection.getpeercert():
            return
        header = self.headers.get("Authorization", "")
        if header == f"Bearer {emulator.token}":
            return
        if header.startswith("Bearer ") and (name := emulator.rbac_tokens.get(header[len("Bearer "):])):
            from .rbac import User
            self._user = User.of(name)
            return
        if not header:
            # kube-apiserver's default --anonymous-auth=true: no credentials at all is the user system:anonymous,
            # whom RBAC then refuses (403); only credentials that fail are a 401 (found with the real API server)
            from .rbac import User
            self._user = User("system:anonymous", ("system:unauthenticated",))
            return
        raise ApiError(401, "Unauthorized")

    def _authorize(self, verb: str, group: str, resource: str, subresource: str = "", namespace: str | None = None,
                   name: str = "") -> None:
        from .rbac import Attributes, allowed, forbidden_message
        emulator = self.server.emulator
        attributes = self._record.access = Attributes(verb, group, resource, subresource, namespace or "", name)
        if self._user is None:
            return
        if not allowed(emulator.store, emulator.table, self._user, attributes):
            raise ApiError(403, forbidden_message(self._user, attributes), "Forbidden",
                           {"name": name, "group": group, "kind": resource} if name else
                           {"group": group, "kind": resource})

    def _send(self, code: int, payload: bytes, content_type: str, extra: dict | None = None) -> None:
        self._record.status = code
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Audit-Id", str(uuid.uuid4()))
        self.send_header("Cache-Control", "no-cache, private")
        for warning in self._warnings:
            self.send_header("Warning", f'299 - "{warning}"')
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(payload)

    def _send_json(self, code: int, obj, extra: dict | None = None) -> None:
        self._send(code, dumps(obj), "application/json", extra)

    def _accept(self) -> str:
        return self.headers.get("Accept", "") or "application/json"

    def _wants_table(self) -> bool:
        return "as=Table" in self._accept()

    def _check_acceptable(self) -> None:
        accept = self._accept()
        if "json" not in accept and "*/*" not in accept and "yaml" not in accept:
            raise ApiError(406, f"only the following media types are accepted: application/json, "
                                f"application/yaml (asked for {accept})")

    # --- routing ------------------------------------------------------------------------------------------------------
    def _route(self, method: str, path: str, query: dict, body: bytes) -> None:
        emulator = self.server.emulator
        segments = [s for s in path.split("/") if s]
        if method == "GET" and self._route_static(path, segments, query):
            return
        if len(segments) >= 7 and segments[:3] == ["api", "v1", "namespaces"] and segments[4] == "services" and \
                segments[6] == "proxy":
            self._authorize(_verb(method, segments[5], "", query), "", "services", "proxy", segments[3], segments[5])
            return self._proxy(method, segments[3], segments[5], "/".join(segments[7:]), body)
        if segments[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", segments[2:]
        elif len(segments) >= 3 and segments[0] == "apis":
            group, version, rest = segments[1], segments[2], segments[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        if not rest:
            raise ApiError(405, f"{method} is not supported here", "MethodNotAllowed")
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
            namespace, rest = rest[1], rest[2:]
        rt = emulator.table.lookup(group, version, rest[0])
        if rt is None or (namespace is not None and not rt.namespaced):
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if len(rest) > 3 or (sub and sub not in rt.subresources):
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        self._record.verb = _verb(method, name, sub, query)
        if self._record.verb not in rt.verbs and not sub:
            raise ApiError(405, f"the server does not allow this method on the requested resource", "MethodNotAllowed")
        if rt.kind == "SelfSubjectAccessReview":
            self._record.verb = "selfsubjectaccessreview"
            return self._access_review(self._decode(body))
        self._authorize(self._record.verb, group, rt.plural, sub, namespace, name)
        if self._user is not None and body and self._record.verb in ("create", "update", "patch") and \
                rt.group == "admissionregistration.k8s.io":
            from . import param_authz  # reading a policy's parameters is asked of whoever writes it
            old = self.server.emulator.store.find(rt, None, name) if name else None
            param_authz.check(self.server.emulator, self._user, rt, self._decode(body), old)
        handler = getattr(self, f"_{self._record.verb}")
        return handler(rt, namespace, name, sub, query, body)

    def _route_static(self, path: str, segments: list[str], query: dict) -> bool:
        emulator = self.server.emulator
        accept = self._accept()
        if path == "/version":
            self._send_json(200, discovery.version_info(emulator.kube_version))
        elif path in ("/healthz", "/readyz", "/livez"):
            self._send(200, b"ok", "text/plain; charset=utf-8")
        elif path in ("/api", "/apis"):
            legacy = path == "/api"
            version = discovery.aggregated_version(accept, emulator.kube_minor)
            if version:
                doc = discovery.aggregated(emulator.table, legacy, version)
                self._send(200, dumps(doc), f"application/json;g=apidiscovery.k8s.io;v={version};"
                                            f"as=APIGroupDiscoveryList")
            elif legacy:
                self._send_json(200, discovery.api_versions(emulator.address))
            else:
                self._send_json(200, discovery.api_group_list(emulator.table))
        elif path == "/api/v1" or (len(segments) == 3 and segments[0] == "apis"):
            group, version = ("", "v1") if path == "/api/v1" else (segments[1], segments[2])
            doc = discovery.resource_list(emulator.table, group, version)
            if doc is None:
                raise ApiError(404, "the server could not find the requested resource", "NotFound")
            self._send_json(200, doc)
        elif len(segments) == 2 and segments[0] == "apis":
            doc = discovery.api_group(emulator.table, segments[1])
            if doc is None:
                raise ApiError(404, "the server could not find the requested resource", "NotFound")
            self._send_json(200, doc)
        elif path == "/openapi/v2":
            # An empty protobuf document: clients find no schema and leave validation to the server (DELIBERATE: the
            # real server sends the whole spec; its Content-Type is the real one)
            self._send(200, b"", "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
        elif path == "/openapi/v3":
            self._send_json(200, emulator.openapi.index())
        elif path.startswith("/openapi/v3/"):
            key = path[len("/openapi/v3/"):]
            parts = key.split("/")
            group, version = ("", parts[1]) if parts[0] == "api" else (parts[1] if len(parts) > 2 else "", parts[-1])
            found = emulator.openapi.document(group, version)
            if found is None:
                raise ApiError(404, "the server could not find the requested resource", "NotFound")
            body, digest = found
            self._send(200, body, "application/json", {"Etag": f'"{digest}"'})
        else:
            return False
        self._record.verb = "discovery"
        return True

    # --- bodies -----------------------------------------------------------------------------------------------------
    def _decode(self, body: bytes):
        content_type = self.headers.get("Content-Type", "application/json").split(";")[0].strip()
        if not body:
            raise ApiError(400, "the request body is empty")
        if content_type == "application/vnd.kubernetes.protobuf":
            return protobuf.decode(body)
        if content_type in ("application/json", "application/merge-patch+json", "application/json-patch+json",
                            "application/strategic-merge-patch+json", ""):
            try:
                return json.loads(body)
            except ValueError as error:
                raise ApiError(400, f"couldn't decode the request body as JSON: {error}")
        if content_type in ("application/yaml", "application/apply-patch+yaml"):
            try:
                return json.loads(body)
            except ValueError:
                try:
                    return yaml.safe_load(body)
                except yaml.YAMLError as error:
                    raise ApiError(400, f"error converting YAML to JSON: {error}")
        raise ApiError(415, f"the body of the request was in an unknown format - accepted media types include: "
                            f"application/json, application/yaml, application/vnd.kubernetes.protobuf "
                            f"(got {content_type})", "UnsupportedMediaType")

    def _options(self, query: dict, sub: str = "", manager_default: str = "") -> WriteOptions:
        dry_run = query.get("dryRun", "")
        if dry_run not in ("", "All"):
            raise ApiError(400, f'dryRun: Unsupported value: "{dry_run}": supported values: "All"')
        validation = query.get("fieldValidation", "Warn") or "Warn"
        if validation not in ("Strict", "Warn", "Ignore"):
            raise ApiError(400, f"fieldValidation: Unsupported value: {validation!r}")
        manager = query.get("fieldManager", "") or manager_default
        return WriteOptions(manager=manager, dry_run=dry_run == "All", field_validation=validation,
                            warnings=self._warnings, subresource=sub, force=query.get("force") == "true")

    def _default_manager(self) -> str:
        agent = self.headers.get("User-Agent", "unknown")
        return agent.split("/")[0] or "unknown"

    def _present(self, rt: ResourceType, obj: dict, code: int = 200) -> None:
        self._check_acceptable()
        if self._wants_table() and obj.get("kind") not in ("Status",):
            include = self._query_include()
            self._send(code, dumps(tables.table(rt, [obj], include, obj["metadata"].get("resourceVersion", ""))),
                       TABLE_CONTENT_TYPE)
        else:
            self._send_json(code, obj)

    def _query_include(self) -> str:
        query = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}
        return query.get("includeObject", "Metadata")

    # --- verbs ---------------------------------------------------------------------------------------------------------
    def _get(self, rt, namespace, name, sub, query, body) -> None:
        store = self.server.emulator.store
        obj = store.get(rt, namespace, name)
        if sub == "log":
            return self._log(obj, query)
        if sub == "scale":
            return self._send_json(200, _scale_of(obj))
        self._present(rt, obj)

    def _list(self, rt, namespace, name, sub, query, body) -> None:
        store = self.server.emulator.store
        _check_list_rv(store, query)
        items, rv, remaining, token = store.list(rt, namespace, query.get("labelSelector", ""),
                                                 query.get("fieldSelector", ""), int(query.get("limit") or 0),
                                                 query.get("continue", ""))
        self._check_acceptable()
        if self._wants_table():
            doc = tables.table(rt, items, query.get("includeObject", "Metadata"), rv, token, remaining)
            return self._send(200, dumps(doc), TABLE_CONTENT_TYPE)
        if not rt.custom:
            items = [{k: v for k, v in item.items() if k not in ("apiVersion", "kind")} for item in items]
        metadata = {"resourceVersion": rv}
        if token:
            metadata["continue"] = token
            metadata["remainingItemCount"] = remaining
        self._send_json(200, {"kind": rt.list_kind or f"{rt.kind}List", "apiVersion": rt.api_version,
                              "metadata": metadata, "items": items})

    def _create(self, rt, namespace, name, sub, query, body) -> None:
        store = self.server.emulator.store
        if name and sub == "binding":
            return self._bind(rt, namespace, name, self._decode(body), query)
        if name and sub == "eviction":
            store.delete(rt, namespace, name, {}, query.get("dryRun") == "All")
            return self._send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                         "code": 201})
        if name:
            raise ApiError(405, "POST is not supported on an item", "MethodNotAllowed")
        obj = self._decode(body)
        if not isinstance(obj, dict):
            raise ApiError(400, "the request body must be a JSON object")
        _check_kind(rt, obj)
        options = self._options(query, manager_default=self._default_manager())
        obj = self._admit(rt, namespace, obj, None, "CREATE", options)
        if rt.kind == "Pod":
            self._pod_security(namespace, obj)
        created = store.create(rt, namespace, obj, options)
        self._present(rt, created, 201)

    def _admit(self, rt, namespace, obj: dict, old: dict | None, operation: str, options: WriteOptions) -> dict:
        """The admission chain (tests/kubeapi/admission.py): mutating webhooks, then object validation (a dry-run
        write), then ValidatingAdmissionPolicies and validating webhooks. Returns the object to store."""
        chain = self.server.emulator.admission
        if options.subresource or not chain.applies(rt):
            return obj
        user = self._user_info()
        obj = chain.mutate(rt, namespace, obj, old, operation, options.dry_run, user)
        store = self.server.emulator.store
        preview_options = WriteOptions(manager=options.manager, dry_run=True, field_validation=options.field_validation,
                                       warnings=[])
        if old is None:
            preview = store.create(rt, namespace, obj, preview_options)
            obj.setdefault("metadata", {})["name"] = preview["metadata"]["name"]  # generateName: keep the one admitted
        else:
            preview = store.update(rt, namespace, old["metadata"]["name"], obj, preview_options)
        chain.validate(rt, namespace, preview, old, operation, options.dry_run, user)
        return obj

    def _user_info(self) -> dict | None:
        """The requester admission sees: whom the client impersonates (kubectl --as / --as-group), else the admin
        (None). The emulator's one credential is an admin's, which may impersonate anyone."""
        name = self.headers.get("Impersonate-User")
        if not name:
            return None
        groups = self.headers.get_all("Impersonate-Group") or []
        return {"username": name, "groups": [*groups, "system:authenticated"]}
    def _pod_security(self, namespace: str, pod: dict) -> None:
        """Pod Security Admission for a pod created in a namespace labelled pod-security.kubernetes.io/enforce
        (tests/kubeapi/pod_security.py); the pods controllers create are not checked (as for a cluster whose
        workloads were admitted before the label)."""
        from .pod_security import admit
        emulator = self.server.emulator
        live = emulator.store.find(emulator.table.lookup("", "v1", "namespaces"), None, namespace)
        if (message := admit(live, pod)) is not None:
            raise ApiError(403, message, "Forbidden", {"name": (pod.get("metadata") or {}).get("name", ""),
                                                       "kind": "pods"})

    def _update(self, rt, namespace, name, sub, query, body) -> None:
        store = self.server.emulator.store
        obj = self._decode(body)
        if sub == "scale":
            return self._update_scale(rt, namespace, name, obj, query)
        _check_kind(rt, obj)
        options = self._options(query, sub, self._default_manager())
        if not sub and self.server.emulator.admission.applies(rt):
            obj = self._admit(rt, namespace, obj, jcopy(store.get(rt, namespace, name)), "UPDATE", options)
        updated = store.update(rt, namespace, name, obj, options)
        self._present(rt, updated)

    def _patch(self, rt, namespace, name, sub, query, body) -> None:
        store = self.server.emulator.store
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip()
        patch_type = PATCH_TYPES.get(content_type)
        if patch_type is None:
            raise ApiError(415, f"the body of the request was in an unknown format - accepted media types include: "
                                f"{', '.join(PATCH_TYPES)}", "UnsupportedMediaType")
        document = self._decode(body)
        if sub == "scale":
            current = _scale_of(store.get(rt, namespace, name))
            from .patches import json_patch, merge_patch
            scaled = json_patch(current, document) if patch_type == "json" else merge_patch(current, document)
            return self._update_scale(rt, namespace, name, scaled, query)
        manager = self._default_manager() if patch_type != "apply" else ""
        obj, created = store.patch(rt, namespace, name, patch_type, document, self._options(query, sub, manager))
        self._present(rt, obj, 201 if created else 200)

    def _delete(self, rt, namespace, name, sub, query, body) -> None:
        store = self.server.emulator.store
        options = self._delete_options(query, body)
        result = store.delete(rt, namespace, name, options, options.get("dryRun") == ["All"])
        self._present(rt, result)

    def _deletecollection(self, rt, namespace, name, sub, query, body) -> None:
        store = self.server.emulator.store
        options = self._delete_options(query, body)
        items = store.delete_collection(rt, namespace, query.get("labelSelector", ""), query.get("fieldSelector", ""),
                                        options, options.get("dryRun") == ["All"])
        self._send_json(200, {"kind": rt.list_kind or f"{rt.kind}List", "apiVersion": rt.api_version,
                              "metadata": {"resourceVersion": str(store.rv)}, "items": items})

    def _delete_options(self, query: dict, body: bytes) -> dict:
        """As kube-apiserver reads them (handlers/delete.go): from the body when there is one, and then the query
        is not read at all (a dryRun=All query beside a body deletes for real); else from the query."""
        if body:
            options = self._decode(body)
        else:
            options = {key: query[key] for key in ("propagationPolicy", "gracePeriodSeconds") if key in query}
            if query.get("dryRun"):
                options["dryRun"] = [query["dryRun"]]
        dry_run = options.get("dryRun") or []
        if any(value != "All" for value in dry_run):
            raise ApiError(400, f'dryRun: Unsupported value: "{dry_run[0]}": supported values: "All"')
        self._record.dry_run = dry_run == ["All"]  # what the request log calls a dry run is what the server did
        policy = options.get("propagationPolicy")
        if policy not in (None, "", "Orphan", "Background", "Foreground"):
            raise ApiError(400, f'propagationPolicy: Unsupported value: "{policy}"')
        return options

    # --- the service proxy ------------------------------------------------------------------------------------------
    def _proxy(self, method: str, namespace: str, service: str, rest: str, body: bytes) -> None:
        """/api/v1/namespaces/{ns}/services/[scheme:]{name}[:port]/proxy/{path}: like the API server, forward to the
        Service's endpoint. Its one endpoint is what a test registered (Emulator.proxy_service); without one, 503
        'no endpoints available', as for a Service whose pods are not ready."""
        import urllib.error
        import urllib.request
        emulator = self.server.emulator
        self._record.verb = "proxy"
        parts = service.split(":")
        name, port = (parts[0], "") if len(parts) == 1 else (parts[-2], parts[-1]) if len(parts) == 3 else \
            (parts[0], parts[1])
        svc = emulator.store.find(emulator.table.lookup("", "v1", "services"), namespace, name)
        if svc is None:
            raise ApiError(404, f'services "{name}" not found', "NotFound",
                           {"name": name, "kind": "services"})
        ports = (svc.get("spec") or {}).get("ports") or []
        if port and not any(port in (str(p.get("port")), p.get("name")) for p in ports):
            raise ApiError(503, f'no endpoints available for service "{service}"', "ServiceUnavailable")
        target = emulator.service_proxies.get((namespace, name))
        if target is None:
            raise ApiError(503, f'no endpoints available for service "{service}"', "ServiceUnavailable")
        raw_query = urlsplit(self.path).query
        url = f"{target.rstrip('/')}/{rest}" + (f"?{raw_query}" if raw_query else "")
        headers = {"Accept": self._accept()}
        if body:
            headers["Content-Type"] = self.headers.get("Content-Type", "application/octet-stream")
        request = urllib.request.Request(url, data=body or None, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                code, data, kind = response.status, response.read(), response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as error:
            code, data, kind = error.code, error.read(), error.headers.get("Content-Type", "")
        except (urllib.error.URLError, OSError) as error:
            raise ApiError(503, f"error trying to reach service: {getattr(error, 'reason', error)}",
                           "ServiceUnavailable")
        self._send(code, data, kind or "application/octet-stream")

    # --- subresources --------------------------------------------------------------------------------------------
    def _log(self, pod: dict, query: dict) -> None:
        store = self.server.emulator.store
        containers = [c["name"] for c in pod["spec"].get("containers", [])]
        container = query.get("container") or (containers[0] if len(containers) == 1 else "")
        if not container:
            raise ApiError(400, f"a container name must be specified for pod {pod['metadata']['name']}, choose one "
                                f"of: [{' '.join(containers)}]")
        if container not in containers:
            raise ApiError(400, f"container {container} is not valid for pod {pod['metadata']['name']}")
        if pod.get("status", {}).get("phase", "Pending") == "Pending":
            raise ApiError(400, f'container "{container}" in pod "{pod["metadata"]["name"]}" is waiting to start: '
                                f"ContainerCreating")
        text = store.pod_logs.get((pod["metadata"]["namespace"], pod["metadata"]["name"], container), "")
        if query.get("tailLines"):
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(query["tailLines"]):])
        self._send(200, text.encode(), "text/plain")

    def _bind(self, rt, namespace, name, binding: dict, query: dict) -> None:
        self.server.emulator.store.bind(rt, namespace, name, (binding.get("target") or {}).get("name", ""),
                                        dry_run=bool(self._options(query).dry_run))
        self._send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})

    def _update_scale(self, rt, namespace, name, scale: dict, query: dict) -> None:
        store = self.server.emulator.store
        obj = jcopy(store.get(rt, namespace, name))
        obj["spec"]["replicas"] = (scale.get("spec") or {}).get("replicas", 0)
        updated = store.update(rt, namespace, name, obj, self._options(query, manager_default=self._default_manager()))
        self._send_json(200, _scale_of(updated))

    def _access_review(self, review: dict) -> None:
        emulator = self.server.emulator
        attributes = (review.get("spec") or {}).get("resourceAttributes") or {}
        denied = any(all(attributes.get(k) == v for k, v in rule.items()) for rule in emulator.store.denied_access)
        if self._user is not None and not denied:
            from .rbac import Attributes, allowed
            denied = not allowed(emulator.store, emulator.table, self._user, Attributes(
                attributes.get("verb", ""), attributes.get("group", ""), attributes.get("resource", ""),
                attributes.get("subresource", ""), attributes.get("namespace", ""), attributes.get("name", "")))
        review = {**review, "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "metadata": {"creationTimestamp": None}, "status": {"allowed": not denied}}
        if denied:
            review["status"]["reason"] = "denied by the emulator's access rules"
        self._record.status = 201
        self._send_json(201, review)

    # --- watch -------------------------------------------------------------------------------------------------------
    def _watch(self, rt, namespace, name, sub, query, body) -> None:
        store = self.server.emulator.store
        self._check_acceptable()
        send_initial = query.get("sendInitialEvents") == "true"
        if send_initial and query.get("resourceVersionMatch") != "NotOlderThan":
            raise ApiError(400, "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the "
                                "WatchList feature gate is enabled and resourceVersionMatch is NotOlderThan")
        field_selector = query.get("fieldSelector", "")
        if name:
            field_selector = ",".join(s for s in (field_selector, f"metadata.name={name}") if s)
        timeout = float(query.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
        try:
            watcher, initial = store.watch(rt, namespace, query.get("labelSelector", ""), field_selector,
                                           query.get("resourceVersion", ""), send_initial)
        except ApiError as error:
            if error.code != 410:
                raise
            self._start_stream()
            self._write_event({"type": "ERROR", "object": error.status()})
            self._end_stream()
            return
        self.server.open_watches.add(watcher)
        try:
            self._start_stream()
            for kind, obj in initial:
                self._write_event(self._event(rt, kind, obj))
            if send_initial:
                bookmark = {"kind": rt.kind, "apiVersion": rt.api_version,
                            "metadata": {"resourceVersion": str(store.rv),
                                         "annotations": {"k8s.io/initial-events-end": "true"}}}
                self._write_event({"type": "BOOKMARK", "object": bookmark})
            self._pump(rt, watcher, time.monotonic() + timeout)
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True
        finally:
            store.unwatch(watcher)
            self.server.open_watches.discard(watcher)

    def _pump(self, rt, watcher, deadline: float) -> None:
        import queue
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                item = watcher.queue.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                if self._client_gone():
                    raise ConnectionResetError("watch client went away")
                continue
            if item is None:
                return
            kind, obj = item
            self._write_event(self._event(rt, kind, obj))

    def _client_gone(self) -> bool:
        try:
            readable, _w, _x = select.select([self.connection], [], [], 0)
            if readable:
                return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError, ssl.SSLError):
            return True
        return False

    def _event(self, rt, kind: str, obj: dict) -> dict:
        if self._wants_table():
            obj = tables.table(rt, [obj], self._query_include() if "includeObject" in self.path else "Object",
                               obj["metadata"].get("resourceVersion", ""))
        return {"type": kind, "object": obj}

    def _start_stream(self) -> None:
        self._record.status = 200
        self.send_response(200)
        self.send_header("Content-Type", TABLE_CONTENT_TYPE if self._wants_table() else "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.flush()

    def _write_event(self, event: dict) -> None:
        payload = dumps(event) + b"\n"
        self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _verb(method: str, name: str, sub: str, query: dict) -> str:
    if method == "GET":
        if query.get("watch") in ("true", "1"):
            return "watch"
        return "get" if name else "list"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    return "delete" if name else "deletecollection"


def _check_kind(rt: ResourceType, obj: dict) -> None:
    kind, api_version = obj.get("kind"), obj.get("apiVersion")
    if kind and kind != rt.kind:
        raise ApiError(400, f"the API version in the data ({api_version}) does not match the expected API version "
                            f"({rt.api_version})" if api_version != rt.api_version else
                       f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})")
    if api_version and api_version != rt.api_version:
        raise ApiError(400, f"the API version in the data ({api_version}) does not match the expected API version "
                            f"({rt.api_version})")


def _check_list_rv(store, query: dict) -> None:
    rv, match = query.get("resourceVersion", ""), query.get("resourceVersionMatch", "")
    if not rv or rv == "0":
        return
    try:
        wanted = int(rv)
    except ValueError:
        raise ApiError(400, f"invalid resource version {rv!r}")
    if wanted > store.rv:
        raise ApiError(504, f"Too large resource version: {wanted}, current: {store.rv}", "Timeout")
    if match == "Exact" and wanted < store.compacted_rv:
        raise ApiError(410, f"too old resource version: {wanted} ({store.compacted_rv})", "Expired")


def _scale_of(obj: dict) -> dict:
    selector = (obj.get("spec", {}).get("selector") or {}).get("matchLabels") or {}
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: obj["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                         "creationTimestamp") if k in obj["metadata"]},
            "spec": {"replicas": obj.get("spec", {}).get("replicas", 0)},
            "status": {"replicas": obj.get("status", {}).get("replicas", 0),
                       "selector": ",".join(f"{k}={v}" for k, v in sorted(selector.items()))}}


def ssl_context(pki) -> ssl.SSLContext:
    import os
    import tempfile
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory() as folder:
        cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
        with open(cert, "w") as handle:
            handle.write(pki.server_cert_pem)
        with open(key, "w") as handle:
            handle.write(pki.server_key_pem)
        context.load_cert_chain(cert, key)
    context.load_verify_locations(cadata=pki.ca_pem)
    context.verify_mode = ssl.CERT_OPTIONAL
    return context
