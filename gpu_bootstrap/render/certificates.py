"""The webhook's certificates: a CA of our own and a serving certificate for the webhook Service, kept only in a
Secret (type kubernetes.io/tls plus ca.crt). Pure: the clock and the randomness are inputs (`now`, `seed`), so a
test can issue with a clock near expiry and get the same keys again from the same seed.

Keys are ECDSA P-256 derived from the seed; certificates carry SANs <svc>.<ns>.svc and <svc>.<ns>.svc.cluster.local.
A rotation issues a new CA and serving certificate together; while the switch runs, ca.crt (and so the webhook's
caBundle) holds the new CA first and the old one after it, so a replica still serving the old certificate is trusted
too. The CA's private key is used once to sign and never stored anywhere.
"""
from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import hmac
from dataclasses import dataclass

TLS_CERT, TLS_KEY, CA_CERT = "tls.crt", "tls.key", "ca.crt"
SERVING_DAYS = 365
CA_DAYS = SERVING_DAYS + 30  # the CA outlives the certificate it signs
BACKDATE = _dt.timedelta(minutes=5)  # clocks in a cluster are never exactly in step


@dataclass(frozen=True)
class Issued:
    ca_pem: str
    cert_pem: str
    key_pem: str  # the serving key: goes into the Secret and nowhere else

    def __repr__(self) -> str:  # a key must never reach a log through a repr
        return f"Issued(cert={fingerprint(self.cert_pem)}, key=<redacted>)"


@dataclass(frozen=True)
class CertInfo:
    not_before: _dt.datetime
    not_after: _dt.datetime
    sans: tuple[str, ...]
    issuer: str
    subject: str
    fingerprint: str


def sans(service: str, namespace: str) -> list[str]:
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def _derive(seed: bytes, label: str) -> int:
    return int.from_bytes(hmac.new(seed, label.encode(), hashlib.sha256).digest(), "big")


def _key(seed: bytes, label: str):
    from cryptography.hazmat.primitives.asymmetric import ec
    order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # P-256's group order
    return ec.derive_private_key(_derive(seed, label) % (order - 1) + 1, ec.SECP256R1())


def issue(service: str, namespace: str, now: _dt.datetime, seed: bytes, days: int = SERVING_DAYS) -> Issued:
    """A new CA and a serving certificate for the Service, valid from `now` (backdated a few minutes)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if len(seed) < 16:
        raise ValueError("the seed must hold at least 16 random bytes")
    start = now - BACKDATE
    ca_key, key = _key(seed, "ca"), _key(seed, "serving")
    ca_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpu-bootstrap"),
                         x509.NameAttribute(NameOID.COMMON_NAME,
                                            f"gpu-bootstrap admission CA {now.strftime('%Y-%m-%dT%H:%M:%SZ')}")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(_derive(seed, "ca-serial") >> 97).not_valid_before(start)
          .not_valid_after(start + _dt.timedelta(days=days + (CA_DAYS - SERVING_DAYS)))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    names = sans(service, namespace)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(_derive(seed, "serving-serial") >> 97).not_valid_before(start)
            .not_valid_after(start + _dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    return Issued(ca.public_bytes(pem).decode(), cert.public_bytes(pem).decode(), key_pem)


# --- reading what a Secret holds ------------------------------------------------------------------------------------
def split_bundle(bundle: str) -> list[str]:
    """The PEM certificates in a bundle, in order."""
    marker = "-----END CERTIFICATE-----"
    return [part.strip() + "\n" + marker + "\n" for part in bundle.split(marker) if "BEGIN CERTIFICATE" in part]


def join_bundle(certificates: list[str]) -> str:
    seen, out = set(), []
    for cert in certificates:
        key = cert.strip()
        if key and key not in seen:
            seen.add(key)
            out.append(key + "\n")
    return "".join(out)


def fingerprint(cert_pem: str) -> str:
    """A short digest of what the certificate says (its to-be-signed part): the same clock and seed give the same
    fingerprint, although ECDSA signs with a fresh nonce each time."""
    from cryptography import x509
    try:
        signed = x509.load_pem_x509_certificate(cert_pem.encode()).tbs_certificate_bytes
    except ValueError:
        signed = cert_pem.strip().encode()
    return hashlib.sha256(signed).hexdigest()[:16]


def inspect(cert_pem: str) -> CertInfo:
    """Dates, SANs, issuer and subject of a PEM certificate. Raises ValueError for anything unreadable."""
    from cryptography import x509
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    try:
        names = tuple(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                      .get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        names = ()
    return CertInfo(cert.not_valid_before_utc, cert.not_valid_after_utc, names, cert.issuer.rfc4514_string(),
                    cert.subject.rfc4514_string(), fingerprint(cert_pem))


def signed_by(cert_pem: str, ca_pem: str) -> bool:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        ca = x509.load_pem_x509_certificate(ca_pem.encode())
        cert.verify_directly_issued_by(ca)
        return True
    except (ValueError, TypeError, InvalidSignature):
        return False


def key_matches(cert_pem: str, key_pem: str) -> bool:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except (ValueError, TypeError):
        return False
    public = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return cert.public_key().public_bytes(*public) == key.public_key().public_bytes(*public)


@dataclass(frozen=True)
class Stored:
    """What the Secret holds, decoded (never shown: the key stays in here)."""

    cert_pem: str
    key_pem: str
    ca_bundle: str

    def __repr__(self) -> str:
        return f"Stored(cert={fingerprint(self.cert_pem)}, key=<redacted>, cas={len(split_bundle(self.ca_bundle))})"

    @classmethod
    def from_secret(cls, secret: dict | None) -> "Stored | None":
        data = (secret or {}).get("data") or {}
        try:
            values = [base64.b64decode(data[k]).decode() for k in (TLS_CERT, TLS_KEY, CA_CERT)]
        except (KeyError, ValueError, UnicodeDecodeError):
            return None
        return cls(*values)

    @property
    def signer(self) -> str | None:
        """The CA in the bundle that signed the serving certificate."""
        return next((ca for ca in split_bundle(self.ca_bundle) if signed_by(self.cert_pem, ca)), None)


def renewal_reason(stored: Stored | None, service: str, namespace: str, now: _dt.datetime,
                   rotate_before_days: int) -> str | None:
    """Why the Secret's certificate must be replaced, or None when it can be kept as it is."""
    if stored is None:
        return "no certificate yet"
    try:
        info = inspect(stored.cert_pem)
    except ValueError:
        return "the stored certificate cannot be read"
    if not key_matches(stored.cert_pem, stored.key_pem):
        return "the stored key does not belong to the certificate"
    if stored.signer is None:
        return "no CA in ca.crt signed the certificate"
    if sorted(info.sans) != sorted(sans(service, namespace)):
        return f"its names {', '.join(info.sans) or '(none)'} are not the Service's {', '.join(sans(service, namespace))}"
    left = info.not_after - now
    if left <= _dt.timedelta(days=rotate_before_days):
        return f"it expires {info.not_after:%Y-%m-%d} (within rotate_before_days: {rotate_before_days})"
    if info.not_before > now + BACKDATE:
        return "it is not valid yet (clock skew?)"
    return None


def days_left(cert_pem: str, now: _dt.datetime) -> float:
    return (inspect(cert_pem).not_after - now).total_seconds() / 86400


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
