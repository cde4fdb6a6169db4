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
  ServiceMonitor the gpu-operator stand-in made.
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


def dcgm_exporter(pod_ip: str, node: str, gpus: int) -> int:
    lines = []
    for name, kind, value in DCGM_FAMILIES:
        lines += [f"# HELP {name} {name} (local-cluster stand-in).", f"# TYPE {name} {kind}"]
        for index in range(gpus):
            labels = {"gpu": str(index), "UUID": f"GPU-{node}-{index:04d}", "device": f"nvidia{index}",
                      "modelName": "NVIDIA A100-SXM4-80GB", "Hostname": node}
            rendered = ",".join(f'{k}={json.dumps(v)}' for k, v in labels.items())
            lines.append(f"{name}{{{rendered}}} {value(index)}")
    body = ("\n".join(lines) + "\n").encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
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
    return dcgm_exporter(options.pod_ip, options.node, options.gpus)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
