"""The local cluster's certificates and keys: one CA for serving and client certificates, a service-account key.

Everything is written 0600 into the cluster's folder; nothing here is a secret outside this test cluster.
"""
from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=30)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes) -> Path:
    path.touch(mode=0o600)
    path.write_bytes(data)
    path.chmod(0o600)
    return path


class Authority:
    """A CA that signs the cluster's serving and client certificates."""

    def __init__(self, folder: Path, name: str = "gpu-bootstrap-local-cluster-ca"):
        self.folder = folder
        self.key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID_FOR)
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.cert_path = _write(folder / f"{name}.crt", self.cert.public_bytes(serialization.Encoding.PEM))
        _write(folder / f"{name}.key", _pem_key(self.key))

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, name: str, common_name: str, organizations: tuple[str, ...] = (), hosts: tuple[str, ...] = (),
              server: bool = False, client: bool = False) -> tuple[Path, Path]:
        """A certificate and key, written as NAME.crt and NAME.key; hosts become DNS or IP SANs."""
        key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + ([ExtendedKeyUsageOID.CLIENT_AUTH]
                                                                            if client else [])
        builder = (x509.CertificateBuilder().subject_name(x509.Name(attributes)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID_FOR)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if hosts:
            builder = builder.add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return (_write(self.folder / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM)),
                _write(self.folder / f"{name}.key", _pem_key(key)))


def _san(host: str):
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def service_account_key(folder: Path) -> tuple[Path, Path]:
    """The key the API server signs service-account tokens with, and its public half that verifies them."""
    key = _key()
    private = _write(folder / "sa.key", _pem_key(key))
    public = _write(folder / "sa.pub", key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public
