"""A small REST client for the local cluster's own plumbing (nodes, tokens, the agent's watches).

The standard library only, so the scripts that start a cluster need nothing installed: HTTPS with the cluster's CA,
a client certificate or a bearer token, JSON in and out.
"""
from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from pathlib import Path


class ApiError(Exception):
    def __init__(self, status: int, body: str, method: str, path: str):
        super().__init__(f"{method} {path} -> {status}: {body[:500]}")
        self.status, self.body = status, body


class Rest:
    def __init__(self, host: str, port: int, ca: Path, cert: Path | None = None, key: Path | None = None,
                 token: str | None = None, agent: str = "local-cluster"):
        self.host, self.port, self.token, self.agent = host, port, token, agent
        self.context = ssl.create_default_context(cafile=str(ca))
        if cert is not None:
            self.context.load_cert_chain(str(cert), str(key))

    def _connection(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=timeout)

    def request(self, method: str, path: str, body=None, content_type: str = "application/json",
                params: dict | None = None, timeout: float = 30):
        if params:
            path = f"{path}?{urllib.parse.urlencode(params)}"
        headers = {"Accept": "application/json", "User-Agent": self.agent}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            headers["Content-Type"] = content_type
        connection = self._connection(timeout)
        try:
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            text = response.read().decode()
        finally:
            connection.close()
        if response.status >= 300:
            raise ApiError(response.status, text, method, path)
        return json.loads(text) if text.startswith(("{", "[")) else text

    def get(self, path: str, **params):
        return self.request("GET", path, params=params or None)

    def create(self, path: str, body: dict):
        return self.request("POST", path, body)

    def patch(self, path: str, body: dict, kind: str = "merge"):
        types = {"merge": "application/merge-patch+json", "strategic": "application/strategic-merge-patch+json"}
        return self.request("PATCH", path, body, content_type=types[kind])

    def apply(self, path: str, body: dict, manager: str):
        return self.request("PATCH", path, body, content_type="application/apply-patch+yaml",
                            params={"fieldManager": manager, "force": "true"})

    def delete(self, path: str, missing_ok: bool = True):
        try:
            return self.request("DELETE", path)
        except ApiError as error:
            if error.status == 404 and missing_ok:
                return None
            raise

    def watch(self, path: str, resource_version: str, timeout: int = 60, **selectors):
        """Yields (type, object) of one watch request until the server ends it (timeoutSeconds). `selectors`:
        labelSelector, fieldSelector."""
        params = {"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(timeout), **selectors}
        headers = {"Accept": "application/json", "User-Agent": self.agent}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        connection = self._connection(timeout + 30)
        try:
            connection.request("GET", f"{path}?{urllib.parse.urlencode(params)}", headers=headers)
            response = connection.getresponse()
            if response.status >= 300:
                raise ApiError(response.status, response.read().decode(), "WATCH", path)
            while True:
                line = response.readline()
                if not line:
                    return
                if line.strip():
                    event = json.loads(line)
                    yield event["type"], event["object"]
        finally:
            connection.close()


class Verbs:
    """get/post/put/patch/delete over a `request(method, path, body, content_type=..., **kw)` (the raw API clients
    of tests/conftest.py and tests/localcluster/facade.py)."""

    PATCH_TYPES = {"merge": "application/merge-patch+json", "strategic": "application/strategic-merge-patch+json",
                   "json": "application/json-patch+json", "apply": "application/apply-patch+yaml"}

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def put(self, path, body, **kw):
        return self.request("PUT", path, body, **kw)

    def patch(self, path, body, patch_type: str = "merge", **kw):
        return self.request("PATCH", path, body, content_type=self.PATCH_TYPES[patch_type], **kw)

    def delete(self, path, body=None, **kw):
        return self.request("DELETE", path, body, **kw)
