"""Shared by the reliability tests (tests/test_kill_matrix.py, tests/test_fault_runs.py) and benchmarks/up_faults.py:
what "the cluster converged" means, helm's view of the release, helm processes left behind, and a way to freeze a
run at an exact request.

`view(emu)` is the cluster as a comparable dict: every stored object by (group/kind, namespace, name), with only
what legitimately differs between two runs that reached the same end state normalised away:

* metadata: uid, resourceVersion, creationTimestamp, managedFields, generation (the emulator's snapshot drops
  them) and the uid inside ownerReferences — assigned by the server, new for every object;
* status: dropped (conditions, observed generations, container ids and start times are the controllers' record of
  when things happened), except a Node's capacity and allocatable (whether the GPUs are advertised); the workloads'
  readiness is compared through their pods instead (below);
* every RFC 3339 timestamp left (lease times, the record time in annotations) becomes "<time>";
* objects a controller names with a random or hashed suffix, where another object mentions them (the scheduler's
  leader pod in the step's record) become "<a Pod of Deployment/NAME>";
* objects a controller names with a random or hashed suffix (Pods, ReplicaSets, EndpointSlices,
  ControllerRevisions whose controller is another object) are not compared by name but as a sorted list per owner
  ("made by Deployment/opa"): a pod's phase, readiness, deletion and, for DaemonSet pods, its node; a ReplicaSet's
  replicas and revision; an EndpointSlice's number of endpoints — so a missing, extra or unready pod still shows;
* gpu-bootstrap's checkpoint records: the record time and the number of changes dropped (a rerun applies fewer
  changes than a first run), applied/unchanged/probed shown as "done"; failed or interrupted records stay; the keyed
  fingerprint shown as "<keyed>" and the key's Secret by its length (both random per cluster: the secret-free
  `public` digest beside it still compares the inputs);
* gpu-bootstrap's node-facts record: its time, the path of the report it was read from and each node's read_at
  dropped, each node's identity shown by its keys (each run's cluster boots its nodes anew);
* the run lock: only whether it is held (and for how long a lease) is kept; acquire/renew times and
  leaseTransitions differ (a rerun after kill -9 takes the lease over); other leases' holder identities (a pod name
  plus a random id) become "<held>";
* generated certificates (issue 13): the bytes of the OPA CA and serving certificate (Secret opa-tls), the webhook's
  caBundle and the pod template's tls-hash annotation are new in every run; they are replaced by what must hold
  between them — the serving certificate is signed by the Secret's CA, the caBundle holds that CA (and how many
  certificates it holds), the tls-hash is the serving certificate's fingerprint;
* a Service's clusterIP(s): assigned by the server in the order Services are created, which a rerun changes;
* Grafana's admin password in kube-prometheus-stack's Secret and the Deployment's checksum of that Secret: the chart
  generates it when it installs (a rerun that installed the stack anew has another), and the rollout history of
  that Deployment (a rerun that upgrades a stopped install rolls it out once more: see GRAFANA_REPLICASETS);
* Nodes' bootID (random per emulator); helm's release Secrets (sh.helm.release.v1.*): one per revision, so their
  names and number depend on how many helm runs it took; replaced by one entry per release, the latest revision
  decoded: status, chart version, values, labels (minus helm's modifiedAt) and the manifest's documents.
"""
from __future__ import annotations

import base64
import gzip
import json
import os
import re
import threading
import time
from collections import defaultdict
from pathlib import Path

from tests.kubeapi.requestlog import WRITE_METHODS

STATE_NAMESPACE, STATE_NAME = "gpu-bootstrap", "gpu-bootstrap-state"  # pipeline/checkpoint.py
KEY_SECRET = "gpu-bootstrap-state-key"  # pipeline/checkpoint.py: the fingerprints' per-cluster key
FACTS_NAME = "gpu-bootstrap-node-facts"
LOCK_NAME = "gpu-bootstrap-lock"  # pipeline/lock.py
TLS_HASH = "gpu-bootstrap.io/tls-hash"  # render/admission.py
HELM_RELEASE_TYPE = "helm.sh/release.v1"
RELEASES = [("gpu-operator", "gpu-operator"), ("kube-prometheus-stack", "monitoring")]  # the default playbook's
# the chart generates Grafana's admin password at install (randAlphaNum, kept on upgrade through lookup): a run that
# installed the stack anew has another one, and the Deployment's checksum of that Secret differs with it
GRAFANA_SECRET = ("monitoring", "kube-prometheus-stack-grafana")
# ... and it renders that Secret differently when it installs (a new random value, quoted) and when it upgrades (the
# value it looked up): a rerun that upgrades the release a stopped install left changes the checksum once, and
# Grafana's Deployment rolls out once more. Its rollout history (revision, old ReplicaSets scaled to 0) is not compared.
GRAFANA_REPLICASETS = ("apps/ReplicaSet", GRAFANA_SECRET[0], f"made by Deployment/{GRAFANA_SECRET[1]}")
# kube-prometheus-stack without the parts nothing here looks at (alertmanager, node exporter, kube-state-metrics,
# the default rules and the control-plane ServiceMonitors): the same helm install of the same chart, half the objects
SLIM_STACK = ("{alertmanager: {enabled: false}, nodeExporter: {enabled: false}, kubeStateMetrics: {enabled: false}, "
              "defaultRules: {create: false}, kubeApiServer: {enabled: false}, kubelet: {enabled: false}, "
              "kubeControllerManager: {enabled: false}, coreDns: {enabled: false}, kubeEtcd: {enabled: false}, "
              "kubeScheduler: {enabled: false}, kubeProxy: {enabled: false}}")
PROMETHEUS_SERVICE = ("monitoring", "kube-prometheus-stack-prometheus")  # the chart's Service, as values/ name it
DONE = ("applied", "unchanged", "probed")
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
GENERATED_KINDS = ("/Pod", "apps/ReplicaSet", "discovery.k8s.io/EndpointSlice", "apps/ControllerRevision")
KEPT_METADATA = ("name", "namespace", "labels", "annotations", "finalizers", "ownerReferences", "deletionTimestamp")


# --- the comparable view ---------------------------------------------------------------------------------------------
def view(emu) -> dict:
    snapshot = emu.snapshot()
    out: dict = {}
    made: dict = defaultdict(list)
    releases: dict = defaultdict(list)
    generated: dict[str, str] = {}  # a generated name -> what it stands for, where other objects mention it
    for key, obj in snapshot.items():
        kind, namespace, name = key
        if kind == "/Secret" and obj.get("type") == HELM_RELEASE_TYPE:
            labels = obj["metadata"].get("labels") or {}
            releases[(namespace, labels.get("name", name))].append(obj)
            continue
        controller = _controller(obj)
        if kind in GENERATED_KINDS and controller is not None:
            owner = _top_owner(snapshot, namespace, controller)
            made[(kind, namespace, f"made by {owner}")].append(_summary(kind, obj, owner))
            generated[name] = f"<a {kind.split('/')[-1]} of {owner}>"
            continue
        out[key] = _normalise(key, obj, snapshot)
    mentions = re.compile("|".join(re.escape(n) for n in sorted(generated, key=len, reverse=True))) \
        if generated else None
    if mentions is not None:
        out = {key: _names(value, mentions, generated) for key, value in out.items()}
    for key, items in made.items():
        if key == GRAFANA_REPLICASETS:
            items = [{"replicas": item["replicas"]} for item in items if item["replicas"]]
        out[key] = sorted(items, key=lambda item: json.dumps(item, sort_keys=True))
    for (namespace, name), revisions in releases.items():
        out[("helm/release", namespace, name)] = _release(revisions)
    return out


def differences(expected: dict, actual: dict, limit: int = 12) -> list[str]:
    """What differs between two views, for people: missing and unexpected objects, then differing fields."""
    found = [f"missing: {'/'.join(filter(None, k))}" for k in sorted(set(expected) - set(actual))]
    found += [f"unexpected: {'/'.join(filter(None, k))}" for k in sorted(set(actual) - set(expected))]
    for key in sorted(set(expected) & set(actual)):
        for path, want, got in _diff(expected[key], actual[key]):
            found.append(f"{'/'.join(filter(None, key))}{path}: expected {want}, found {got}")
    if len(found) > limit:
        found = found[:limit] + [f"... and {len(found) - limit} more"]
    return found


def converged(emu, reference: dict, timeout: float = 30.0) -> list[str]:
    """Poll until the cluster's view equals the reference (controllers may still be finishing a rollout or a
    deletion); the differences left at the timeout, or []."""
    deadline = time.monotonic() + timeout
    while True:
        emu.settle(timeout=5)
        found = differences(reference, view(emu))
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


def _controller(obj: dict) -> dict | None:
    return next((o for o in obj["metadata"].get("ownerReferences") or [] if o.get("controller")), None)


def _top_owner(snapshot: dict, namespace: str, reference: dict) -> str:
    """Kind/name of the first owner in the controller chain that is not itself named by a controller (a pod's
    ReplicaSet's Deployment; a DaemonSet's pod's DaemonSet)."""
    for _depth in range(5):
        if reference["kind"] not in {kind.split("/")[-1] for kind in GENERATED_KINDS}:
            break
        found = [obj for k, obj in snapshot.items() if k[0].endswith("/" + reference["kind"]) and
                 k[1:] == (namespace, reference["name"])]
        parent = _controller(found[0]) if found else None
        if parent is None:
            break
        reference = parent
    return f"{reference['kind']}/{reference['name']}"


def _summary(kind: str, obj: dict, owner: str) -> dict:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    if kind == "/Pod":
        ready = next((c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        return {"phase": status.get("phase"), "ready": ready, "deleting": "deletionTimestamp" in meta,
                "node": spec.get("nodeName") if owner.startswith("DaemonSet/") else "-"}
    if kind == "apps/ReplicaSet":
        return {"replicas": spec.get("replicas"),
                "revision": (meta.get("annotations") or {}).get("deployment.kubernetes.io/revision")}
    if kind == "discovery.k8s.io/EndpointSlice":
        return {"endpoints": len(obj.get("endpoints") or [])}
    return {"kind": kind}


def _normalise(key: tuple, obj: dict, snapshot: dict) -> dict:
    kind, namespace, name = key
    meta = {k: v for k, v in obj["metadata"].items() if k in KEPT_METADATA}
    if meta.get("ownerReferences"):
        meta["ownerReferences"] = [{k: v for k, v in o.items() if k != "uid"} for o in meta["ownerReferences"]]
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}
    body["metadata"] = meta
    if kind == "/Node":
        status = obj.get("status") or {}
        body["status"] = {"capacity": status.get("capacity"), "allocatable": status.get("allocatable")}
    if kind == "/ConfigMap" and (namespace, name) == (STATE_NAMESPACE, STATE_NAME):
        body["data"] = {step: _record(text) for step, text in (obj.get("data") or {}).items()}
    if kind == "/ConfigMap" and (namespace, name) == (STATE_NAMESPACE, FACTS_NAME):
        body["data"] = {k: v for k, v in (obj.get("data") or {}).items() if k not in ("time", "source")}
        if "nodes.json" in body["data"]:
            body["data"]["nodes.json"] = _facts(body["data"]["nodes.json"])
    if kind == "coordination.k8s.io/Lease":
        spec = obj.get("spec") or {}
        if (namespace, name) == (STATE_NAMESPACE, LOCK_NAME):
            body["spec"] = {"holderIdentity": spec.get("holderIdentity") or None,
                            "leaseDurationSeconds": spec.get("leaseDurationSeconds")}
        else:
            body["spec"] = {**spec, "holderIdentity": "<held>" if spec.get("holderIdentity") else None}
    if kind == "/Secret" and (namespace, name) == (STATE_NAMESPACE, KEY_SECRET) and body.get("data"):
        body["data"] = {k: f"<{len(base64.b64decode(v))} random bytes>" for k, v in body["data"].items()}
    if kind == "/Secret" and body.get("data") and {"ca.crt", "tls.crt"} <= set(body["data"]):
        body["data"] = _certificates(body["data"])
    if kind.endswith("WebhookConfiguration"):
        body["webhooks"] = [_webhook(w, snapshot) for w in body.get("webhooks") or []]
    if kind == "/Service" and (body.get("spec") or {}).get("clusterIP") not in (None, "None"):
        body["spec"] = {**body["spec"], "clusterIP": "<assigned>", "clusterIPs": ["<assigned>"]}
    body = _chart_generated(kind, (namespace, name), body)
    if kind == "apps/Deployment":
        annotations = (((body.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations")
        if annotations and TLS_HASH in annotations:
            annotations[TLS_HASH] = _tls_hash(annotations[TLS_HASH], snapshot, namespace)
    return _times(body)


def _chart_generated(kind: str, where: tuple, body: dict) -> dict:
    """What a chart generates at install (GRAFANA_SECRET), in a stored object or a release's manifest document."""
    if where != GRAFANA_SECRET:
        return body
    if kind == "/Secret":
        return {**body, "data": {k: "<generated>" if k == "admin-password" else v
                                 for k, v in (body.get("data") or {}).items()}}
    annotations = (((body.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations")
    if kind == "apps/Deployment" and annotations and "checksum/secret" in annotations:
        annotations["checksum/secret"] = "<checksum of the generated Secret>"
        meta = body.get("metadata") or {}
        if "deployment.kubernetes.io/revision" in (meta.get("annotations") or {}):
            body["metadata"] = {**meta, "annotations": {k: v for k, v in meta["annotations"].items()
                                                        if k != "deployment.kubernetes.io/revision"}}
    return body


def _manifest_document(doc: dict, namespace: str) -> dict:
    group = doc.get("apiVersion", "").rpartition("/")[0]
    where = ((doc.get("metadata") or {}).get("namespace") or namespace, (doc.get("metadata") or {}).get("name"))
    return _chart_generated(f"{group}/{doc.get('kind')}", where, doc)


def _record(text: str) -> dict:
    try:
        record = json.loads(text)
    except ValueError:
        return {"unreadable": text}
    record.pop("time", None)
    record.pop("changes", None)
    if record.get("fingerprint"):  # an HMAC under the cluster's own random key: differs between clusters by design
        record["fingerprint"] = "<keyed>"
    if record.get("status") in DONE:
        record["status"] = "done"
    return record


def _times(value):
    if isinstance(value, dict):
        return {k: _times(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_times(v) for v in value]
    if isinstance(value, str) and TIMESTAMP.match(value):
        return "<time>"
    return value


def _names(value, pattern: re.Pattern, generated: dict):
    """Generated names mentioned in strings (e.g. the scheduler's leader pod in a record's message)."""
    if isinstance(value, dict):
        return {k: _names(v, pattern, generated) for k, v in value.items()}
    if isinstance(value, list):
        return [_names(v, pattern, generated) for v in value]
    if isinstance(value, str):
        return pattern.sub(lambda m: generated[m.group(0)], value)
    return value


def _pem_list(text: str) -> list[str]:
    return re.findall(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", text, re.S)


def _b64(text: str) -> str:
    try:
        return base64.b64decode(text).decode()
    except (ValueError, UnicodeDecodeError):
        return ""


def _facts(text: str) -> str:
    """The recorded node facts without when they were read, and with whether (not to which boot) they are bound:
    each run's cluster boots its nodes anew."""
    try:
        document = json.loads(text)
    except ValueError:
        return text
    for node in document.get("nodes") or []:
        node.pop("read_at", None)
        node["identity"] = sorted(node.get("identity") or {})
    return json.dumps(document, sort_keys=True)


def _certificates(data: dict) -> dict:
    """A TLS Secret with ca.crt: what must hold between its parts, not their bytes."""
    from cryptography import x509
    out = {k: "<generated>" for k in data}
    try:
        ca = x509.load_pem_x509_certificate(_b64(data["ca.crt"]).encode())
        serving = x509.load_pem_x509_certificate(_b64(data["tls.crt"]).encode())
        serving.verify_directly_issued_by(ca)
        out["tls.crt"] = "<signed by ca.crt>"
    except Exception as error:  # noqa: BLE001 - any failure is a difference to show
        out["tls.crt"] = f"<not signed by ca.crt: {error}>"
    return out


def _secret_pem(snapshot: dict, namespace: str, key: str) -> str:
    for (kind, ns, _name), obj in snapshot.items():
        if kind == "/Secret" and (not namespace or ns == namespace) and {"ca.crt", "tls.crt"} <= set(
                obj.get("data") or {}):
            return _b64(obj["data"][key])
    return ""


def _webhook(webhook: dict, snapshot: dict) -> dict:
    client = dict(webhook.get("clientConfig") or {})
    if client.get("caBundle"):
        bundle = _pem_list(_b64(client["caBundle"]))
        service = client.get("service") or {}
        ca = _pem_list(_secret_pem(snapshot, service.get("namespace", ""), "ca.crt"))
        holds = bool(ca) and ca[0].strip() in [b.strip() for b in bundle]
        among = "the Secret's CA among them" if holds else "NOT the Secret's CA"
        client["caBundle"] = f"<{len(bundle)} certificate(s), {among}>"
    return {**webhook, "clientConfig": client}


def _tls_hash(value: str, snapshot: dict, namespace: str) -> str:
    from gpu_bootstrap.render.certificates import fingerprint
    serving = _secret_pem(snapshot, namespace, "tls.crt")
    return "<fingerprint of the Secret's serving certificate>" if serving and fingerprint(serving) == value else \
        f"<{value}: not the Secret's serving certificate>"


def _release(revisions: list[dict]) -> dict:
    latest = max(revisions, key=lambda s: int((s["metadata"].get("labels") or {}).get("version", "0")))
    labels = {k: v for k, v in (latest["metadata"].get("labels") or {}).items()
              if k not in ("modifiedAt", "version")}
    try:
        release = json.loads(gzip.decompress(base64.b64decode(base64.b64decode(latest["data"]["release"]))))
    except (ValueError, OSError, KeyError) as error:
        return {"labels": labels, "unreadable": str(error)}
    import yaml
    manifest = sorted((_manifest_document(d, release.get("namespace") or "")
                       for d in yaml.safe_load_all(release.get("manifest") or "") if d),
                      key=lambda d: json.dumps(d, sort_keys=True))
    return {"labels": labels, "status": (release.get("info") or {}).get("status"),
            "chart": ((release.get("chart") or {}).get("metadata") or {}).get("version"),
            "values": release.get("config"), "manifest": manifest}


def _diff(want, got, path: str = ""):
    if isinstance(want, dict) and isinstance(got, dict):
        for key in sorted(set(want) | set(got), key=str):
            yield from _diff(want.get(key, "<absent>"), got.get(key, "<absent>"), f"{path}.{key}")
    elif isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for index, (a, b) in enumerate(zip(want, got)):
            yield from _diff(a, b, f"{path}[{index}]")
    elif want != got:
        yield path, _short(want), _short(got)


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 160 else text[:157] + "..."


# --- helm: its history, and processes left behind ---------------------------------------------------------------------
def helm_history(cluster, release: str = "gpu-operator", namespace: str = "gpu-operator") -> list[dict]:
    """`helm history` as helm shows it ([] when there is no release)."""
    result = cluster.helm("history", release, "-n", namespace, "-o", "json", check=False)
    if result.returncode != 0:
        assert "not found" in result.stderr, result.stderr
        return []
    return json.loads(result.stdout)


def serve_prometheus(emu, url: str) -> None:
    """The monitoring step verifies that Prometheus answers through the API server's service proxy: point the
    chart's Prometheus Service at a real local Prometheus (tests/monitoring/live.LocalPrometheus, one per module)."""
    emu.proxy_service(*PROMETHEUS_SERVICE, url)


def all_history_problems(cluster) -> list[str]:
    """history_problems() of every release the default playbook installs, each named."""
    return [f"{name}: {problem}" for name, namespace in RELEASES
            for problem in history_problems(helm_history(cluster, name, namespace))]


def helm_releases(cluster) -> list[tuple[str, str, str]]:
    """(name, namespace, status) of every release in any state (helm 4 has no `list --all`)."""
    result = cluster.helm("list", "-A", "--deployed", "--failed", "--pending", "--superseded", "--uninstalling",
                          "--uninstalled", "-o", "json")
    return sorted((r["name"], r["namespace"], r["status"]) for r in json.loads(result.stdout))


def history_problems(history: list[dict]) -> list[str]:
    """What "no failed or pending revision" can mean for a release whose failures a later run repaired: helm never
    rewrites history, so the latest revision must be `deployed` and no revision may be `pending-*` (that locks the
    release). helm 4 marks the revision right below a successful upgrade `superseded` even when it had failed (its
    description still says why, e.g. "failed: context canceled" after SIGTERM), but older failed revisions stay
    `failed` in the history: those are allowed below a deployed latest revision."""
    if not history:
        return ["no release"]
    problems = [f"revision {r['revision']} is {r['status']}" for r in history if r["status"].startswith("pending")]
    latest = max(history, key=lambda r: r["revision"])
    if latest["status"] != "deployed":
        problems.append(f"the latest revision {latest['revision']} is {latest['status']}, not deployed")
    return problems


def helm_processes(marker: str) -> list[str]:
    """Live helm processes (not zombies) whose command line or environment contains `marker` (a path of the test's
    own: its kubeconfig, or the folder its clients' HOME is in — helm that gpu-bootstrap runs is given the relay's
    kubeconfig, but inherits the environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = (entry / "environ").read_bytes() if argv and argv[0].endswith(b"helm") else b""
        except OSError:
            continue
        if argv and os.path.basename(argv[0].decode(errors="replace")) == "helm" and state != "Z" and \
                (marker.encode() in b" ".join(argv) or marker.encode() in environ):
            found.append(f"pid {entry.name}: {b' '.join(argv[:3]).decode(errors='replace')}")
    return found


def no_helm_within(marker: str, seconds: float) -> list[str]:
    """Poll until no helm process of this test is left; what is still there at the end."""
    deadline = time.monotonic() + seconds
    while (left := helm_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def wait_idle(emu, timeout: float = 30.0) -> None:
    """Until every request the emulator received has been answered (an abandoned request still lands)."""
    deadline = time.monotonic() + timeout
    while any(r.duration == 0.0 for r in emu.requests.all()):
        assert time.monotonic() < deadline, "the emulator is still serving requests"
        time.sleep(0.02)


# --- freezing a run at an exact request -------------------------------------------------------------------------------
class Hold:
    """Hold every API request from a trigger on: `trigger(request)` is asked for each request (before it is
    handled, so a checkpoint record written by the previous request is visible); from the first request for which
    it is true, the `nth` request and every later one wait until `release()`. The run is then frozen at a known
    point: at a step boundary, or inside a step, or inside helm. Installed as an emulator fault rule that answers
    nothing itself; it must be the first rule (the emulator asks rules in order)."""

    def __init__(self, emu, trigger, nth: int = 1, limit: float = 120.0):
        self.trigger, self.nth, self.limit = trigger, nth, limit
        self.armed = False
        self.seen = 0  # requests since the trigger, the triggering one included
        self.held: list = []  # the requests that were held
        self.holding = threading.Event()
        self._released = threading.Event()
        self._lock = threading.Lock()
        self.last_request = time.monotonic()  # when the run last asked the API anything: how it shows progress
        self.rule = emu.faults.add("*", ".*", count=None, observe=self._observe)

    def _observe(self, request) -> None:
        self.last_request = time.monotonic()
        with self._lock:
            if self._released.is_set():
                return
            if not self.armed:
                if not self.trigger(request):
                    return
                self.armed = True
            self.seen += 1
            if self.seen < self.nth:
                return
            self.held.append(request)
            self.holding.set()
        self._released.wait(self.limit)

    def wait(self, process, quiet: float = 120.0) -> None:
        """Until a request is held; fails when the run ends first (the point was never reached), or when it asked
        the API nothing for `quiet` seconds (stuck). A run that keeps asking may take as long as a loaded machine
        makes it: a late point (after admission) comes minutes in when CI's other workers hold the cores."""
        self.last_request = max(self.last_request, time.monotonic())
        while not self.holding.wait(0.05):
            if process.poll() is not None:
                out, err = process.communicate()
                raise AssertionError(f"the run ended (exit {process.returncode}) before the point was reached: "
                                     f"{err[-2000:]}")
            assert time.monotonic() - self.last_request < quiet, \
                f"the point was not reached: the run asked the API nothing for {quiet} s"

    def release(self) -> None:
        self._released.set()


def checkpoint_has(emu, step: str):
    """A trigger: the checkpoint holds a record of `step` (which a run writes when the step is done)."""
    def trigger(_request) -> bool:
        with emu.store.lock:
            config_map = emu.get("configmaps", STATE_NAME, STATE_NAMESPACE)
        return step in ((config_map or {}).get("data") or {})
    return trigger


def lock_taken(emu):
    """A trigger: the run lock has a holder."""
    def trigger(_request) -> bool:
        with emu.store.lock:
            lease = emu.get("leases", LOCK_NAME, STATE_NAMESPACE)
        return bool(((lease or {}).get("spec") or {}).get("holderIdentity"))
    return trigger


def helm_write(path_contains: str = "/"):
    """A trigger: a request from helm that changes something (not a dry run) at a path containing this."""
    def trigger(request) -> bool:
        return request.user_agent.startswith("Helm/") and request.method in WRITE_METHODS and \
            not request.dry_run and path_contains in request.path
    return trigger


# --- faults like a loaded or restarting API server --------------------------------------------------------------------
OVERLOADED = "the server is currently unable to handle the request"  # kube-apiserver's 503 message
THROTTLED = "Too many requests, please try again later."  # its 429 message (API priority and fairness)


def random_faults(emu, seed: int, rate: float = 0.10, retry_after: str = "1") -> list:
    """`rate` of all requests, on every path, fail: a third each answered 503 and 429 with Retry-After (as a
    kube-apiserver under load answers with API priority and fairness), a third with a TCP reset before the server
    handled them. Draws are seeded; the emulator asks the rules in order, so each later rule gets the conditional
    probability and the three shares are equal."""
    emu.faults.seed(seed)
    share = rate / 3
    return [emu.faults.add("*", ".*", count=None, probability=share, status=503, message=OVERLOADED,
                           headers={"Retry-After": retry_after}),
            emu.faults.add("*", ".*", count=None, probability=share / (1 - share), status=429, message=THROTTLED,
                           headers={"Retry-After": retry_after}),
            emu.faults.add("*", ".*", count=None, probability=share / (1 - 2 * share), reset=True)]


class Outage:
    """From the `after`-th request on, every request is answered 503 (no Retry-After: a load balancer in front of
    an API server that is down) for `seconds`; then the API is back."""

    def __init__(self, emu, after: int, seconds: float = 20.0):
        self.emu, self.seconds = emu, seconds
        self.started: float | None = None
        self.ended: float | None = None
        self.answered = 0
        self._timer: threading.Timer | None = None
        self.rule = emu.faults.add("*", ".*", count=None, after=after, status=503, message=OVERLOADED,
                                   observe=self._observe)

    def _observe(self, _request) -> None:
        self.answered += 1
        if self.started is None:
            self.started = time.monotonic()
            self._timer = threading.Timer(self.seconds, self.end)
            self._timer.daemon = True
            self._timer.start()

    def end(self) -> None:
        self.emu.faults.remove(self.rule)
        if self.ended is None and self.started is not None:
            self.ended = time.monotonic()
        if self._timer is not None:
            self._timer.cancel()


def write_config(folder: Path, kubeconfig: Path, nodes: list[str], wait_timeout: int) -> Path:
    """The config both reliability suites run: the given nodes, the real gpu-operator chart and the real
    kube-prometheus-stack chart in its slim form (SLIM_STACK)."""
    from tests.conftest import chart
    path = folder / "gpu-bootstrap.yaml"
    path.write_text(f"cluster: {{kubeconfig: {kubeconfig}}}\nnodes:\n" + "".join(f"  - name: {n}\n" for n in nodes) +
                    f"gpu_operator:\n  chart: {chart('gpu-operator-v26.7.0.tgz')}\n  wait_timeout: {wait_timeout}\n"
                    f"monitoring:\n  chart: {chart('kube-prometheus-stack-88.5.3.tgz')}\n"
                    f"  wait_timeout: {wait_timeout}\n  values: {SLIM_STACK}\n")
    return path
