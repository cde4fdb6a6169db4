"""The real KEDA on the local cluster: its operator and its metrics adapter (github.com/kedacore/keda/v2 v2.21.0,
built by scripts/install-test-tools from scripts/gomod/keda), run out of cluster against the local API server.

* The operator watches ScaledObjects, makes their HorizontalPodAutoscalers and evaluates their triggers (its
  Prometheus scaler queries a real Prometheus); it serves the trigger values to the adapter over mutual-TLS gRPC on
  127.0.0.1.
* The adapter serves external.metrics.k8s.io to the API server, which reaches it as it reaches any aggregated API:
  the APIService v1beta1.external.metrics.k8s.io names the Service keda/keda-metrics-apiserver, whose one endpoint
  (a selector-less Service with an EndpointSlice, as the chart's Service would have once its pod runs) is an address
  of this cluster's pod network, routed to this machine, where the adapter listens. The API server verifies the
  adapter's certificate against the APIService's caBundle and the Service's DNS name, as on a real cluster.

What differs from KEDA installed by its chart: both processes use the admin's kubeconfig (in a cluster each has
its ServiceAccount and the chart's RBAC), and the certificates are made here (the chart's operator makes and
rotates them itself, `--enable-cert-rotation`); one certificate serves and authenticates both ends, as KEDA's own
kedaorg-certs Secret does.
"""
from __future__ import annotations

import base64
import ipaddress
from pathlib import Path

from tests.localcluster import pki

NAMESPACE = "keda"
ADAPTER_SERVICE = "keda-metrics-apiserver"
OPERATOR_SERVICE = "keda-operator"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
CRDS = ("scaledobjects.keda.sh", "scaledjobs.keda.sh", "triggerauthentications.keda.sh",
        "clustertriggerauthentications.keda.sh")
PORTS = ("keda-grpc", "keda-metrics", "keda-health", "keda-adapter", "keda-adapter-metrics")


def adapter_address(network: str) -> str:
    """An address of the cluster's first /24 that no node takes (nodes take .10 onwards): the adapter's
    endpoint. Not loopback: the API server refuses loopback addresses in EndpointSlices."""
    return str(ipaddress.ip_network(network).network_address + 250)


def certificates(folder: Path, address: str) -> Path:
    """ca.crt, tls.crt and tls.key in `folder`, as KEDA reads them from its --cert-dir: one certificate for both
    gRPC ends (server and client auth) and for the adapter's serving side (the Service's DNS names)."""
    folder.mkdir(mode=0o700, exist_ok=True)
    authority = pki.Authority(folder, "ca")
    hosts = (f"{ADAPTER_SERVICE}.{NAMESPACE}.svc", f"{ADAPTER_SERVICE}.{NAMESPACE}.svc.cluster.local",
             f"{OPERATOR_SERVICE}.{NAMESPACE}.svc", f"{OPERATOR_SERVICE}.{NAMESPACE}.svc.cluster.local",
             "127.0.0.1", address)
    authority.issue("tls", "keda", organizations=("KEDAORG",), hosts=hosts, server=True, client=True)
    return folder


def operator_command(binary: Path, ports: dict, certs: Path) -> list[str]:
    """The operator's own ports on loopback (in a pod: :8080, :8081, :9666), no leader election (one replica)."""
    return [str(binary), f"--metrics-bind-address=127.0.0.1:{ports['keda-metrics']}",
            f"--health-probe-bind-address=127.0.0.1:{ports['keda-health']}",
            f"--metrics-service-bind-address=127.0.0.1:{ports['keda-grpc']}", f"--cert-dir={certs}",
            "--leader-elect=false", "--zap-log-level=info", "--zap-encoder=console"]


def adapter_command(binary: Path, ports: dict, certs: Path, kubeconfig: Path, address: str) -> list[str]:
    """The adapter as the chart starts it (TLS from --cert-dir, the operator's gRPC address), with its
    delegated authentication and authorization through the kubeconfig (in a pod: its ServiceAccount)."""
    return [str(binary), f"--bind-address={address}", f"--secure-port={ports['keda-adapter']}",
            f"--cert-dir={certs}", f"--tls-cert-file={certs / 'tls.crt'}",
            f"--tls-private-key-file={certs / 'tls.key'}", f"--lister-kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            f"--metrics-service-address=127.0.0.1:{ports['keda-grpc']}", f"--port={ports['keda-adapter-metrics']}",
            "--zap-log-level=info", "--zap-encoder=console"]


def environment(base: dict, kubeconfig: Path) -> dict:
    """Every namespace watched; KEDA's own objects in `keda` (what the chart's pod has from its namespace)."""
    return {**base, "KUBECONFIG": str(kubeconfig), "WATCH_NAMESPACE": "", "POD_NAMESPACE": NAMESPACE,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE}


def api_objects(address: str, port: int, ca_pem: bytes) -> list[tuple[str, dict]]:
    """(collection path, object): the namespace, the adapter's Service with its one endpoint, and the APIService
    that sends external.metrics.k8s.io to it (what the chart renders, the endpoint being this machine)."""
    labels = {"app.kubernetes.io/name": ADAPTER_SERVICE, "app.kubernetes.io/part-of": "keda-operator"}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": ADAPTER_SERVICE, "labels": labels},
               "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port, "protocol": "TCP"}]}}
    slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
              "metadata": {"name": f"{ADAPTER_SERVICE}-local",
                           "labels": {"kubernetes.io/service-name": ADAPTER_SERVICE,
                                      "endpointslice.kubernetes.io/managed-by": "local-cluster"}},
              "addressType": "IPv4", "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
              "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}
    api_service = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                   "metadata": {"name": API_SERVICE, "labels": labels},
                   "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1",
                            "service": {"namespace": NAMESPACE, "name": ADAPTER_SERVICE, "port": 443},
                            "caBundle": base64.b64encode(ca_pem).decode(), "groupPriorityMinimum": 100,
                            "versionPriority": 100}}
    return [("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}),
            (f"/api/v1/namespaces/{NAMESPACE}/services", service),
            (f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices", slice_),
            ("/apis/apiregistration.k8s.io/v1/apiservices", api_service)]


def api_service_available(api) -> bool:
    """The aggregator reached the adapter (its discovery answered through the Service's endpoint)."""
    found = api.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{API_SERVICE}")
    return any(c["type"] == "Available" and c["status"] == "True"
               for c in (found.get("status") or {}).get("conditions") or [])
