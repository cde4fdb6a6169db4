"""The emulator's API tests against the real API server: the `api` and `emu` the tests use, backed by the local cluster.

`RealApi` speaks to kube-apiserver as tests.conftest.Api speaks to the emulator (exact requests, the admin's client
certificate). `RealEmu` answers what the API tests ask of the emulator object (get, list, settle, address) through the
API itself. Each test gets a namespace of its own, and the tests, written for the emulator's `default`, are moved
there: "/namespaces/default/" in a path and "namespace": "default" in a body become that namespace, and the answers
are moved back, so a test cannot tell. Cluster-scoped objects a test creates (CRDs, namespaces) are deleted after it.

`settle()` has no controller loop to wait for here: it waits until nothing in the test's namespace (and no object of
the kinds the test touched) has changed for SETTLED seconds, as a person watching `kubectl get -w` would.
"""
from __future__ import annotations

import http.client
import json
import secrets
import ssl
import time
from dataclasses import dataclass, field

from tests.conftest import Response
from tests.localcluster.rest import Verbs

SETTLED = 2.0  # seconds without a change that count as settled
SETTLE_TIMEOUT = 60.0


class RealApi(Verbs):
    def __init__(self, cluster, namespace: str, auth: str = "cert", created: list | None = None,
                 touched: dict | None = None):
        self.cluster, self.namespace = cluster, namespace
        self.context = ssl.create_default_context(cafile=str(cluster.ca))
        self.headers = {}
        if auth == "cert":
            self.context.load_cert_chain(str(cluster.pki / "admin.crt"), str(cluster.pki / "admin.key"))
        self.created = created if created is not None else []  # cluster-scoped paths created, for clean-up
        self.touched = touched if touched is not None else {}  # node path -> the node as it was, to put back

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.cluster.ports['apiserver']}"

    def moved(self, path: str) -> str:
        return self._to(path)

    def back(self, data: bytes) -> bytes:
        return self._back(data)

    # the namespace move, both ways
    def _to(self, text: str) -> str:
        return text.replace("/namespaces/default/", f"/namespaces/{self.namespace}/").replace(
            "/namespaces/default?", f"/namespaces/{self.namespace}?").replace(
            '"namespace": "default"', f'"namespace": "{self.namespace}"').replace(
            '"namespace":"default"', f'"namespace":"{self.namespace}"')

    def _back(self, data: bytes) -> bytes:
        return data.replace(self.namespace.encode(), b"default")

    def request(self, method: str, path: str, body=None, content_type: str = "application/json",
                accept: str = "application/json", headers: dict | None = None) -> Response:
        path = self._to(path)
        node = path.split("?")[0].removesuffix("/status")
        if method in ("PUT", "PATCH", "DELETE") and node.startswith("/api/v1/nodes/") and node not in self.touched:
            # the nodes are the whole cluster's (the live suite's too): remember each as it was before a test's write
            self.touched[node] = self.request("GET", node).json
        if path.endswith("/namespaces/default"):
            path = path[: -len("default")] + self.namespace
        if body is None or isinstance(body, bytes):
            payload = body if body is None or b"namespace" not in body else self._to(body.decode()).encode()
        else:
            payload = self._to(json.dumps(body)).encode()
        all_headers = {"Accept": accept, **self.headers, **(headers or {})}
        if payload is not None:
            all_headers["Content-Type"] = content_type
        connection = http.client.HTTPSConnection("127.0.0.1", self.cluster.ports["apiserver"], context=self.context,
                                                 timeout=60)
        connection.request(method, path, body=payload, headers=all_headers)
        response = connection.getresponse()
        data = response.read()
        connection.close()
        if method == "POST" and response.status == 201 and "/namespaces/" not in path.split("?")[0] + "/":
            self.created.append(path.split("?")[0] + "/" + json.loads(data)["metadata"]["name"])
            if path.split("?")[0].endswith("/customresourcedefinitions") and "dryRun" not in path:
                self._await_established(json.loads(data))
        elif method == "POST" and response.status == 201 and path.split("?")[0] == "/api/v1/namespaces":
            self.created.append(f"/api/v1/namespaces/{json.loads(data)['metadata']['name']}")
        return Response(response.status, dict(response.getheaders()), self._back(data))

    def _await_established(self, crd: dict, timeout: float = 60) -> None:
        """What a real client does after creating a CRD (kubectl wait --for=condition=Established): the emulator
        serves the resource at once, the real server once the CRD is Established and its handler installed."""
        spec = crd["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("served", True))
        scope = f"namespaces/{self.namespace}/" if spec.get("scope") == "Namespaced" else ""
        collection = f"/apis/{spec['group']}/{version}/{scope}{spec['names']['plural']}"
        deadline = time.monotonic() + timeout
        while self.request("GET", collection).status != 200:
            assert time.monotonic() < deadline, f"CRD {crd['metadata']['name']} was not served within {timeout:.0f}s"
            time.sleep(0.1)


@dataclass
class RealEmu:
    cluster: object
    namespace: str
    created: list = field(default_factory=list)
    touched: dict = field(default_factory=dict)
    _paths: dict = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.cluster.ports['apiserver']}"

    @property
    def kube_version(self) -> str:
        return self.cluster.version.lstrip("v")

    def api(self, auth: str = "cert") -> RealApi:
        return RealApi(self.cluster, self.namespace, auth, self.created, self.touched)

    def _discover(self) -> None:
        api = self.api()
        self._paths.clear()
        for item in api.get("/api/v1").json["resources"]:
            self._paths.setdefault(item["name"], ("/api/v1", item["namespaced"]))
        for group in api.get("/apis").json["groups"]:
            version = "/apis/" + group["preferredVersion"]["groupVersion"]
            answer = api.get(version)
            if answer.status != 200:  # a group going away (its CRD being deleted)
                continue
            for item in answer.json.get("resources") or []:
                self._paths.setdefault(item["name"], (version, item["namespaced"]))
                self._paths.setdefault(f"{item['name']}.{group['name']}", (version, item["namespaced"]))

    def resource_path(self, resource: str, namespace: str | None) -> str:
        """The collection path of a resource named as the emulator names it (plural, or plural.group); discovery
        is read again for a name it does not know yet (a CRD registered since)."""
        if resource not in self._paths:
            self._discover()
        if resource not in self._paths:
            raise KeyError(f"the API server serves no resource {resource!r}")
        prefix, namespaced = self._paths[resource]
        plural = resource.split(".")[0]
        return f"{prefix}/namespaces/{namespace}/{plural}" if namespaced and namespace else f"{prefix}/{plural}"

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict | None:
        answer = self.api().get(f"{self.resource_path(resource, namespace)}/{name}")
        if answer.status == 404:
            return None
        assert answer.status == 200, answer
        return answer.json

    def list(self, resource: str, namespace: str | None = None, label_selector: str = "") -> list[dict]:
        query = f"?labelSelector={label_selector}" if label_selector else ""
        answer = self.api().get(f"{self.resource_path(resource, namespace)}{query}")
        assert answer.status == 200, answer
        return answer.json["items"]

    def _fingerprint(self) -> tuple:
        """The resourceVersions of everything in the test's namespace, in the namespaces it made, and of the
        cluster-scoped objects it made."""
        api = self.api()
        seen = []
        namespaces = ["default"] + [p.rsplit("/", 1)[1] for p in self.created if p.startswith("/api/v1/namespaces/")]
        for namespace in namespaces:
            for resource in ("configmaps", "pods", "replicasets", "deployments", "daemonsets", "statefulsets",
                             "jobs", "services", "endpointslices", "secrets", "serviceaccounts"):
                try:
                    path = self.resource_path(resource, namespace)
                except KeyError:
                    continue
                answer = api.get(path)
                if answer.status == 200:
                    seen.append(tuple(sorted((i["metadata"]["name"], i["metadata"]["resourceVersion"])
                                             for i in answer.json["items"])))
        for path in list(self.created):
            answer = api.get(path)
            seen.append((path, answer.status, answer.json["metadata"]["resourceVersion"] if answer.status == 200
                         else ""))
        return tuple(seen)

    def _namespace_work_pending(self) -> bool:
        """A namespace the test made is Terminating and the namespace controller still has work there: an object
        it has not marked for deletion yet, or no object left at all (it has yet to remove its finalizer). Its
        rounds come later than SETTLED. Only objects held by their own finalizers leave it waiting for others."""
        api = self.api()
        for path in [p for p in self.created if p.startswith("/api/v1/namespaces/")]:
            answer = api.get(path)
            if answer.status != 200 or not answer.json["metadata"].get("deletionTimestamp"):
                continue
            namespace = path.rsplit("/", 1)[1]
            items = []
            for resource in ("configmaps", "secrets", "pods", "deployments", "replicasets", "serviceaccounts"):
                listing = api.get(self.resource_path(resource, namespace))
                if listing.status == 200:
                    items += listing.json["items"]
            if not items or any(not i["metadata"].get("deletionTimestamp") for i in items):
                return True
        return False

    def settle(self, timeout: float = SETTLE_TIMEOUT) -> bool:
        deadline = time.monotonic() + timeout
        last, since = self._fingerprint(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.25)
            now = self._fingerprint()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= SETTLED and not self._namespace_work_pending():
                return True
        return False

    def cleanup(self) -> None:
        api = self.api()
        for path in reversed(self.created):
            api.delete(path)
        for path, before in self.touched.items():  # labels, annotations, taints and status as they were
            for attempt in range(10):
                now = api.get(path).json
                now["metadata"]["labels"] = before["metadata"].get("labels") or {}
                now["metadata"]["annotations"] = before["metadata"].get("annotations") or {}
                now["spec"] = before["spec"]
                if api.put(path, now).status == 409:
                    continue
                now = api.get(path).json
                now["status"]["capacity"] = before["status"]["capacity"]
                now["status"]["allocatable"] = before["status"]["allocatable"]
                if api.put(f"{path}/status", now).status != 409:
                    break
        api.delete(f"/api/v1/namespaces/{self.namespace}")


def new_namespace(cluster) -> RealEmu:
    emu = RealEmu(cluster, f"kubeapi-{secrets.token_hex(4)}")
    answer = emu.api().post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": emu.namespace}})
    assert answer.status == 201, answer
    emu.created.clear()  # the namespace itself is removed last, by cleanup()
    # The emulator's `default` holds both from the start; here two controllers make them a moment after the
    # namespace, and a test that lists or watches the namespace's ConfigMaps must not race the second.
    deadline = time.monotonic() + 30
    for made in ("serviceaccounts/default", "configmaps/kube-root-ca.crt"):
        while emu.api().get(f"/api/v1/namespaces/default/{made}").status != 200:
            assert time.monotonic() < deadline, f"the namespace's {made} was never made"
            time.sleep(0.1)
    return emu
