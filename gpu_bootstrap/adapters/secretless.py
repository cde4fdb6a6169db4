"""helm and Kubernetes for an identity that may not read Secrets (the plan role, `up --dry-run=client`; and, since
the second security review, `up --dry-run` and `doctor`, whose roles read no Secret of ours either).

helm keeps each release's record (status, values, manifest) in a Secret of the release's namespace, so `helm status`
is refused to the plan role. This stands in for the reads a step makes and does everything else with the real helm
(rendering, chart downloads): a release is found by its live objects (helm's `meta.helm.sh/release-name` and
`-namespace` annotations on its Deployments and DaemonSets), its chart version by their `helm.sh/chart` (or, for
kube-prometheus-stack's own objects, `chart`) label, and
whether it is up to date by rendering the chart locally (`helm template`, no cluster access) with the values `up`
would install and comparing each rendered object with the live one (render/live_diff.py). Its values stay unknown
(status()["values_unknown"]), and what could not be compared (Secrets, hooks) is named, never taken as unchanged.
"""
from __future__ import annotations

import logging

import yaml

from gpu_bootstrap.core.errors import ClusterError, NotFound
from gpu_bootstrap.render import live_diff
from gpu_bootstrap.core.versions import server_version

log = logging.getLogger("gpu_bootstrap.secretless")
RELEASE_ANNOTATION = "meta.helm.sh/release-name"
NAMESPACE_ANNOTATION = "meta.helm.sh/release-namespace"
WORKLOADS = (("apps/v1", "Deployment"), ("apps/v1", "DaemonSet"))


class SecretlessHelm:
    reads_releases = False  # the gate validates a release object by object instead of helm's own dry run

    def __init__(self, helm, kube):
        self.helm = helm
        self.kube = kube
        self._version: str | None = None

    def __getattr__(self, name):  # rendering, chart downloads, show crds: the real helm, which needs no Secret
        return getattr(self.helm, name)

    def _objects(self, release: str, namespace: str) -> list[dict]:
        found = []
        for api_version, kind in WORKLOADS:
            for item in self.kube.list(api_version, kind, namespace):
                notes = (item.get("metadata") or {}).get("annotations") or {}
                if notes.get(RELEASE_ANNOTATION) == release and notes.get(NAMESPACE_ANNOTATION) == namespace:
                    found.append(item)
        return found

    def status(self, release: str, namespace: str) -> dict | None:
        """What can be known without the release's Secret: whether it is there, by its live objects."""
        if not self._objects(release, namespace):
            return None
        return {"name": release, "namespace": namespace, "info": {"status": "deployed"}, "values_unknown": True}

    def deployed_chart(self, release: str, namespace: str, version: str | None = None) -> str | None:
        """'<chart>-<version>' from the `helm.sh/chart` (or `chart`) labels of the release's workloads. Subcharts
        label theirs with their own chart, so with `version` (the one a plan wants) a label of that version is the
        answer; otherwise the one whose chart is named most like the release (gpu-operator's beside NFD's)."""
        labels = [(o.get("metadata") or {}).get("labels") or {} for o in self._objects(release, namespace)]
        charts = sorted({found.get("helm.sh/chart") or found.get("chart") for found in labels} - {None})
        if version:
            wanted = [c for c in charts if c.rsplit("-", 1)[-1].lstrip("v") == version.lstrip("v")]
            if wanted:
                return wanted[0]
        if len(charts) > 1:  # a subchart's own label beside the release's: the release's chart is named like it
            import os.path
            best = max(len(os.path.commonprefix([c.rsplit("-", 1)[0], release])) for c in charts)
            charts = [c for c in charts if len(os.path.commonprefix([c.rsplit("-", 1)[0], release])) == best]
        return charts[0] if len(charts) == 1 else None

    def labelled(self, release: str, namespace: str, selector: str) -> bool:
        """The release's own labels are in its Secret: taken as ours (the plan changes nothing either way)."""
        log.info("the labels of release %s/%s are in its Secret, unreadable here: taken as gpu-bootstrap's",
                 namespace, release)
        return True

    def live_differences(self, release: str, chart, values: dict, namespace: str) -> live_diff.Diff:
        """The chart rendered locally with `values`, compared with the live objects."""
        if self._version is None:
            self._version = server_version(self.kube.version())
        rendered = [d for d in yaml.safe_load_all(self.helm.template(release, chart, values, namespace,
                                                                      self._version)) if d]
        live, unreadable = {}, {}
        for doc in rendered:
            kind, ns, name = live_diff.key(doc)
            if kind in live_diff.SKIPPED_KINDS:
                continue
            try:
                namespaced = self.kube.resource(doc["apiVersion"], kind)[1]
            except ClusterError:
                namespaced = bool(ns)  # a kind the cluster does not serve: the object is missing
            ns = (ns or namespace) if namespaced else ""
            doc.setdefault("metadata", {})["namespace"] = ns or None
            try:
                live[(kind, ns, name)] = self.kube.get(doc["apiVersion"], kind, name, ns or None)
            except NotFound:
                live[(kind, ns, name)] = None
            except ClusterError as error:
                if error.status != 403:
                    raise
                unreadable[(kind, ns, name)] = f"{kind} {ns + '/' if ns else ''}{name} (not readable here)"
        diff = live_diff.compare([d for d in rendered if live_diff.key(d) not in unreadable], live, namespace)
        diff.not_compared += list(unreadable.values())
        return diff


class SecretlessKube:
    """The Kubernetes adapter for `up --dry-run` and `doctor`, which read no Secret values (docs/security.md): a
    read of a Secret is refused here, as RBAC refuses it to their roles, so an admin's dry run shows what the role's
    shows. `allowed` (name, namespace) pairs stay readable: the state record's fingerprint key, without which
    nothing could be compared. Everything else is the real adapter."""

    reads_secrets = False

    def __init__(self, kube, allowed: tuple[tuple[str, str], ...] = ()):
        self.kube = kube
        self.allowed = set(allowed)

    def __getattr__(self, name):
        return getattr(self.kube, name)

    def _refuse(self, name: str | None, namespace: str | None):
        where = f" in the namespace \"{namespace}\"" if namespace else ""
        what = f"secrets \"{name}\"" if name else "secrets"
        raise ClusterError(f"{what} is forbidden: dry runs and doctor read no Secret{where} (their roles hold no "
                           f"such read: a Secret's values would show)", status=403, reason="Forbidden")

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None, *args, **kwargs):
        if (api_version, kind) == ("v1", "Secret") and (name, namespace) not in self.allowed:
            self._refuse(name, namespace)
        return self.kube.get(api_version, kind, name, namespace, *args, **kwargs)

    def list(self, api_version: str, kind: str, namespace: str | None = None, *args, **kwargs):
        if (api_version, kind) == ("v1", "Secret"):
            self._refuse(None, namespace)
        return self.kube.list(api_version, kind, namespace, *args, **kwargs)
