"""A throwaway PKI for the emulator: a CA, a server certificate for 127.0.0.1/localhost and an admin client
certificate (O=system:masters), all ECDSA P-256 so that generating them is fast."""
from __future__ import annotations

import datetime as _dt
import functools
import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True)
class Pki:
    ca_pem: str
    server_cert_pem: str
    server_key_pem: str
    client_cert_pem: str
    client_key_pem: str


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> str:
    from cryptography.hazmat.primitives import serialization
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _cert(subject_cn: str, key, issuer_name, issuer_key, *, ca: bool, org: str = "", sans=(), client=False):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]
    if org:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    subject = x509.Name(attributes)
    now = _dt.datetime.now(_dt.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name or subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - _dt.timedelta(minutes=5)).not_valid_after(now + _dt.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False),
                                        critical=True)
    else:
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


@functools.lru_cache(maxsize=1)
def generate() -> Pki:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    ca_key = _key()
    ca = _cert("kubeapi-emulator-ca", ca_key, None, None, ca=True)
    server_key = _key()
    sans = (x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost"),
            x509.DNSName("kubernetes.default.svc"))
    server = _cert("kube-apiserver", server_key, ca.subject, ca_key, ca=False, sans=sans)
    client_key = _key()
    client = _cert("emulator-admin", client_key, ca.subject, ca_key, ca=False, org="system:masters", client=True)
    pem = serialization.Encoding.PEM
    return Pki(ca.public_bytes(pem).decode(), server.public_bytes(pem).decode(), _pem_key(server_key),
               client.public_bytes(pem).decode(), _pem_key(client_key))
