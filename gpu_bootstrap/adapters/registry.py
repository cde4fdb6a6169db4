"""The OCI distribution API, for `images --check` and doctor: is a manifest in the registry (a HEAD on
/v2/<name>/manifests/<tag or digest>)? Credentials come from the user's docker config file ($DOCKER_CONFIG/config.json,
else ~/.docker/config.json), Basic or Bearer (the token service named by the registry's challenge); they are sent
to that registry only and never printed or logged.
"""
from __future__ import annotations

import base64
import ipaddress
import json
import logging
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gpu_bootstrap.core.errors import ClusterError, ConfigError
from gpu_bootstrap.core.catalogue import parse

log = logging.getLogger("gpu_bootstrap.registry")

ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json"])
TIMEOUT = 10.0  # seconds for one request


class RegistryError(ClusterError):
    """The registry is down, unreachable or refuses us: exit 1, naming the registry."""


def docker_config_path(environ: dict | None = None) -> Path:
    environ = os.environ if environ is None else environ
    folder = environ.get("DOCKER_CONFIG")
    return Path(folder) / "config.json" if folder else Path("~/.docker/config.json").expanduser()


def credentials(host: str, environ: dict | None = None) -> tuple[str, str] | None:
    """(user, password) for `host` from the docker config file, or None. A credential helper (credsStore,
    credHelpers) is not run: its secrets stay with it."""
    path = docker_config_path(environ)
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"docker config {path} cannot be read: {type(error).__name__}",
                          "fix the file, or move it away to check without credentials") from None
    auths = document.get("auths") or {}
    entry = next((auths[key] for key in auths if _host_of(key) == host), None)
    if not isinstance(entry, dict):
        return None
    if entry.get("auth"):
        try:
            user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            raise ConfigError(f"docker config {path}: the auth of {host} is not base64 user:password") from None
        return user, password
    if entry.get("username"):
        return entry["username"], entry.get("password", "")
    if entry.get("identitytoken"):
        return "<token>", entry["identitytoken"]
    return None


def _host_of(key: str) -> str:
    """'https://index.docker.io/v1/' -> 'docker.io'; 'reg.local:5000' -> itself."""
    host = re.sub(r"^[a-z]+://", "", key).split("/")[0]
    return "docker.io" if host in ("index.docker.io", "registry-1.docker.io") else host


def is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0].strip("[]") if not host.startswith("[") or "]:" in host else host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass
class Answer:
    status: int
    headers: dict


class Registry:
    """One registry host; `plain_http` (or a loopback host, as docker does) speaks HTTP instead of HTTPS."""

    def __init__(self, host: str, plain_http: bool = False, environ: dict | None = None, timeout: float = TIMEOUT):
        self.host = host
        self.scheme = "http" if plain_http or is_loopback(host) else "https"
        self.timeout = timeout
        self._credentials = credentials(host, environ)
        self._tokens: dict[str, str] = {}

    def _request(self, method: str, url: str, headers: dict) -> Answer:
        request = urllib.request.Request(url, method=method, headers=headers)
        opener = urllib.request.build_opener(_NoRedirectAuth())
        try:
            with opener.open(request, timeout=self.timeout) as response:
                return Answer(response.status, dict(response.headers))
        except urllib.error.HTTPError as error:
            return Answer(error.code, dict(error.headers or {}))
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise RegistryError(f"registry {self.host} is unreachable ({self.scheme}): {reason}",
                                "start it or fix registry.mirror; for a plain-HTTP mirror set registry.plain_http: "
                                "true") from None

    def has(self, reference: str) -> bool:
        """Is the manifest of `reference` (on this registry) there? Raises RegistryError when the registry is
        unreachable or refuses (401/403 after authenticating, 5xx)."""
        parsed = parse(reference)
        target = parsed.digest or parsed.tag or "latest"
        url = f"{self.scheme}://{self.host}/v2/{parsed.path}/manifests/{urllib.parse.quote(target, safe=':')}"
        headers = {"Accept": ACCEPT, **self._authorization(parsed.path)}
        answer = self._request("HEAD", url, headers)
        if answer.status == 401 and self._authenticate(answer.headers, parsed.path):
            answer = self._request("HEAD", url, {"Accept": ACCEPT, **self._authorization(parsed.path)})
        if answer.status == 200:
            return True
        if answer.status == 404:
            return False
        if answer.status in (401, 403):
            creds = "with the credentials of your docker config" if self._credentials else \
                f"without credentials (none for {self.host} in {docker_config_path()})"
            raise RegistryError(f"registry {self.host} refuses {parsed.path} ({answer.status}) {creds}",
                                f"docker login {self.host}, or check the account's pull rights")
        raise RegistryError(f"registry {self.host} answered {answer.status} for {parsed.path}",
                            "check the registry's health and log")

    def _authorization(self, path: str) -> dict:
        if path in self._tokens:
            return {"Authorization": self._tokens[path]}
        return {}

    def _authenticate(self, headers: dict, path: str) -> bool:
        """Answer the registry's challenge (Basic, or Bearer from its token service) once; False when we cannot."""
        challenge = next((v for k, v in headers.items() if k.lower() == "www-authenticate"), "")
        if self._credentials is None and not challenge.lower().startswith("bearer"):
            return False
        if challenge.lower().startswith("basic"):
            user, password = self._credentials
            self._tokens[path] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
            return True
        if challenge.lower().startswith("bearer"):
            params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
            realm = params.pop("realm", "")
            if not realm.startswith(("https://", "http://")):
                return False
            query = {"service": params.get("service", ""), "scope": f"repository:{path}:pull"}
            headers = {}
            if self._credentials is not None:
                user, password = self._credentials
                headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
            request = urllib.request.Request(f"{realm}?{urllib.parse.urlencode(query)}", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    body = json.loads(response.read() or b"{}")
            except (urllib.error.URLError, OSError, ValueError):
                return False
            token = body.get("token") or body.get("access_token")
            if not token:
                return False
            self._tokens[path] = f"Bearer {token}"
            return True
        return False


class _NoRedirectAuth(urllib.request.HTTPRedirectHandler):
    """Follow a registry's redirects without carrying our Authorization header to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.headers.pop("Authorization", None)
            new.unredirected_hdrs.pop("Authorization", None)
        return new


def check(references: list[str], plain_http: bool = False, environ: dict | None = None) -> dict[str, bool]:
    """reference -> present, for references on any registry (one client per registry host)."""
    clients: dict[str, Registry] = {}
    found = {}
    for reference in references:
        host = parse(reference).host
        client = clients.setdefault(host, Registry(host, plain_http, environ))
        found[reference] = client.has(reference)
    return found
