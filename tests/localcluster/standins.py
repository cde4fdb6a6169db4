"""Stand-ins the agent runs for containers that cannot run here, each doing the one job the tests rely on.

* certgen: kube-webhook-certgen (kube-prometheus-stack's admission Jobs). Its module is refused by the Go module
  proxy, so this does its two commands as documented upstream: `create --host=A,B --namespace=NS --secret-name=S`
  makes a CA and a serving certificate for the hosts into Secret S (keys ca, cert, key) unless it exists;
  `patch --webhook-name=W --namespace=NS --secret-name=S [--patch-failure-policy=P]` puts the CA into the caBundle of
  every webhook of the Mutating and Validating configurations named W (and their failurePolicy). It talks to the API
  server as the pod's ServiceAccount (its projected token), so the chart's RBAC for the Job is what is tested.
* cuda-sample: NVIDIA's CUDA vectorAdd sample (the validate step's pods) needs a GPU. This prints what the sample
  prints when it passes and exits 0; what it shows is the step's plumbing (pods placed by the bin-packing scheduler,
  their end and their logs read through the real API server from the agent's kubelet endpoint), never a GPU.
* dcgm-exporter: NVIDIA's DCGM exporter needs GPUs. This serves the metric families the dashboards and alerts read,
  for the node's GPUs, on the pod's address and port 9400, so Prometheus scrapes a real target through the
  ServiceMonitor the gpu-operator stand-in made. By default every GPU is idle and held by no pod. When a test has
  written a GPU load file into the cluster's folder (set_gpu_load), the exporter also does what the real one does in
  Kubernetes mode: each GPU a pod on its node holds carries that pod's namespace, pod and container labels (the
  kubelet's pod-resources API, which assigns devices, stands in as: the node's running GPU pods, each given the
  lowest free GPU indices when first seen), and DCGM_FI_DEV_GPU_UTIL of a pod's GPUs is the utilization of the
  file's first rule that matches the pod (namespace and labels), else 0. The file is read at every scrape.
"""
from __future__ import annotations

import argparse
import base64
import datetime
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.localcluster.rest import ApiError, Rest


def pod_api(volumes: Path) -> Rest:
    import os
    token_files = sorted(volumes.glob("*/token"))
    if not token_files:
        sys.exit("standin: the pod mounts no service-account token")
    folder = token_files[0].parent
    return Rest(os.environ["KUBERNETES_SERVICE_HOST"], int(os.environ["KUBERNETES_SERVICE_PORT"]),
                folder / "ca.crt", token=token_files[0].read_text().strip(), agent="kube-webhook-certgen")


def certgen(args: list[str], volumes: Path) -> int:
    parser = argparse.ArgumentParser(prog="kube-webhook-certgen")
    parser.add_argument("command", choices=["create", "patch"])
    parser.add_argument("--host", default="")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--secret-name", required=True)
    parser.add_argument("--webhook-name", default="")
    parser.add_argument("--patch-failure-policy", default="")
    parser.add_argument("--patch-mutating", default="true")
    parser.add_argument("--patch-validating", default="true")
    options, _rest = parser.parse_known_args(args)
    api = pod_api(volumes)
    path = f"/api/v1/namespaces/{options.namespace}/secrets/{options.secret_name}"
    if options.command == "create":
        try:
            api.get(path)
            print(f"secret {options.secret_name} exists; nothing to do", flush=True)
            return 0
        except ApiError as error:
            if error.status != 404:
                raise
        ca, cert, key = _certificates([h for h in options.host.split(",") if h])
        api.create(f"/api/v1/namespaces/{options.namespace}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": options.secret_name},
            "data": {"ca": _b64(ca), "cert": _b64(cert), "key": _b64(key)}})
        print(f"created secret {options.secret_name}", flush=True)
        return 0
    ca = api.get(path)["data"]["ca"]
    for kind, wanted in (("mutatingwebhookconfigurations", options.patch_mutating),
                         ("validatingwebhookconfigurations", options.patch_validating)):
        if wanted != "true":
            continue
        resource = f"/apis/admissionregistration.k8s.io/v1/{kind}/{options.webhook_name}"
        try:
            config = api.get(resource)
        except ApiError as error:
            if error.status == 404:
                continue
            raise
        for webhook in config.get("webhooks") or []:
            webhook.setdefault("clientConfig", {})["caBundle"] = ca
            if options.patch_failure_policy:
                webhook["failurePolicy"] = options.patch_failure_policy
        api.request("PUT", resource, config)
        print(f"patched {kind}/{options.webhook_name}", flush=True)
    return 0


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _certificates(hosts: list[str]) -> tuple[bytes, bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nil1")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=365))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nil2")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return (ca.public_bytes(pem), cert.public_bytes(pem),
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


DCGM_FAMILIES = (  # (name, type, value for GPU i)
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", lambda i: 0),
    ("DCGM_FI_DEV_FB_USED", "gauge", lambda i: 0),
    ("DCGM_FI_DEV_FB_FREE", "gauge", lambda i: 81559),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", lambda i: 34),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", lambda i: 61.5),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", lambda i: 0),
)


GPU_LOAD_FILE = "dcgm-gpu-load.json"  # in the cluster's folder: {"rules": [{namespace, labels, utilization}]}


def set_gpu_load(cluster_folder: Path, rules: list[dict]) -> None:
    """What the DCGM stand-ins report from their next scrape on: each rule {"namespace": NS, "labels": {K: V},
    "utilization": PERCENT} sets the utilization of the GPUs held by the pods it matches (written atomically)."""
    partial = cluster_folder / f".{GPU_LOAD_FILE}.partial"
    partial.write_text(json.dumps({"rules": rules}))
    partial.replace(cluster_folder / GPU_LOAD_FILE)


def dcgm_body(node: str, gpus: int, holders: dict | None = None) -> bytes:
    """The exporter's page; `holders`: GPU index -> (namespace, pod, container, utilization) of the pod holding it."""
    lines = []
    for name, kind, value in DCGM_FAMILIES:
        lines += [f"# HELP {name} {name} (local-cluster stand-in).", f"# TYPE {name} {kind}"]
        for index in range(gpus):
            labels = {"gpu": str(index), "UUID": f"GPU-{node}-{index:04d}", "device": f"nvidia{index}",
                      "modelName": "NVIDIA A100-SXM4-80GB", "Hostname": node}
            sample = value(index)
            if holders and index in holders:
                namespace, pod, container, utilization = holders[index]
                labels.update({"container": container, "namespace": namespace, "pod": pod})
                sample = utilization if name == "DCGM_FI_DEV_GPU_UTIL" else sample
            rendered = ",".join(f'{k}={json.dumps(v)}' for k, v in labels.items())
            lines.append(f"{name}{{{rendered}}} {sample}")
    return ("\n".join(lines) + "\n").encode()


class PodResources:
    """The kubelet's pod-resources API, played from the API server: which running pod on the node holds which GPU.
    A pod keeps the indices it was given while it runs; a new pod takes the lowest free ones."""

    def __init__(self, volumes: Path, node: str, gpus: int):
        self.cluster = volumes.resolve().parents[2]  # <cluster>/pods/<namespace>_<pod>/volumes (agent.py)
        self.node, self.gpus = node, gpus
        self.held: dict[str, list[int]] = {}  # pod uid -> GPU indices

    def rules(self) -> list[dict] | None:
        try:
            return json.loads((self.cluster / GPU_LOAD_FILE).read_text())["rules"]
        except (OSError, ValueError, KeyError):
            return None

    def api(self) -> Rest:
        import os
        state = json.loads((self.cluster / "cluster.json").read_text())
        pki = self.cluster / "pki"
        return Rest(os.environ.get("KUBERNETES_SERVICE_HOST", "127.0.0.1"), int(state["ports"]["apiserver"]),
                    pki / "ca.crt", pki / "admin.crt", pki / "admin.key", agent="dcgm-exporter-standin")

    def holders(self, rules: list[dict]) -> dict:
        pods = [p for p in self.api().get("/api/v1/pods", fieldSelector=f"spec.nodeName={self.node}")["items"]
                if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
        pods.sort(key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
        alive = {p["metadata"]["uid"] for p in pods}
        self.held = {uid: indices for uid, indices in self.held.items() if uid in alive}
        found = {}
        for pod in pods:
            container, wanted = _gpu_container(pod)
            if not wanted:
                continue
            uid = pod["metadata"]["uid"]
            if uid not in self.held:
                taken = {i for indices in self.held.values() for i in indices}
                self.held[uid] = [i for i in range(self.gpus) if i not in taken][:wanted]
            utilization = _utilization(pod, rules)
            for index in self.held[uid]:
                found[index] = (pod["metadata"]["namespace"], pod["metadata"]["name"], container, utilization)
        return found


def _gpu_container(pod: dict) -> tuple[str, int]:
    """The first container that asks for GPUs, and how many GPUs the pod's containers ask for."""
    first, total = "", 0
    for container in pod["spec"].get("containers") or []:
        count = int(((container.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0) or 0)
        if count and not first:
            first = container["name"]
        total += count
    return first, total


def _utilization(pod: dict, rules: list[dict]) -> float:
    labels = pod["metadata"].get("labels") or {}
    for rule in rules:
        if rule.get("namespace") in (None, pod["metadata"]["namespace"]) and \
                all(labels.get(k) == v for k, v in (rule.get("labels") or {}).items()):
            return rule["utilization"]
    return 0


def dcgm_exporter(pod_ip: str, node: str, gpus: int, volumes: Path) -> int:
    idle = dcgm_body(node, gpus)
    resources = PodResources(volumes, node, gpus)

    def page() -> bytes:
        rules = resources.rules()
        return idle if rules is None else dcgm_body(node, gpus, resources.holders(rules))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = page()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    ThreadingHTTPServer((pod_ip, 9400), Handler).serve_forever()
    return 0


VECTOR_ADD = """[Vector addition of 50000 elements]
Copy input data from the host memory to the CUDA device
CUDA kernel launch with 196 blocks of 256 threads
Copy output data from the CUDA device to the host memory
Test PASSED
Done
"""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="standins")
    parser.add_argument("which", choices=["certgen", "dcgm-exporter", "cuda-sample"])
    parser.add_argument("--pod-ip", required=True)
    parser.add_argument("--node", default="")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--volumes", type=Path, required=True)
    ours, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    options = parser.parse_args(ours)
    if options.which == "certgen":
        return certgen([a for a in rest if not a.endswith("kube-webhook-certgen")], options.volumes)
    if options.which == "cuda-sample":
        sys.stdout.write(VECTOR_ADD)
        return 0
    return dcgm_exporter(options.pod_ip, options.node, options.gpus, options.volumes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
