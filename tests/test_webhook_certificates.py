"""The webhook certificates, read back with `cryptography`: the CA and serving certificates carry exactly the
constraints, key usages and criticality a TLS client checks, their validity is backdated five minutes and lasts 365
(+30 for the CA) days, keys and serials come from the seed as documented, a short seed is refused; the bundle, the
fingerprint, the readers and the renewal reasons at their boundaries."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import hmac

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpu_bootstrap.render import certificates as certs

pytestmark = pytest.mark.unit

NOW = _dt.datetime(2026, 11, 23, 12, 0, tzinfo=_dt.timezone.utc)
SEED = bytes(range(32))
P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
NAMES = ["opa.ns.svc", "opa.ns.svc.cluster.local"]


def derived(label: str) -> int:
    return int.from_bytes(hmac.new(SEED, label.encode(), hashlib.sha256).digest(), "big")


def load(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode())


def extensions(cert: x509.Certificate) -> dict:
    return {type(e.value): (e.value, e.critical) for e in cert.extensions}


def usage(sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=sign, crl_sign=sign,
                         encipher_only=False, decipher_only=False)


@pytest.fixture  # per test: the mutation tool credits lines run in a fixture to the test that set it up
def issued() -> certs.Issued:
    return certs.issue("opa", "ns", NOW, SEED)


def test_the_ca_is_a_critical_leaf_signing_ca_valid_395_days_from_five_minutes_ago(issued):
    ca = load(issued.ca_pem)
    start = NOW - _dt.timedelta(minutes=5)
    assert (ca.not_valid_before_utc, ca.not_valid_after_utc) == (start, start + _dt.timedelta(days=395))
    assert ca.serial_number == derived("ca-serial") >> 97
    key = ec.derive_private_key(derived("ca") % (P256_ORDER - 1) + 1, ec.SECP256R1()).public_key()
    assert ca.public_key() == key
    assert extensions(ca) == {
        x509.BasicConstraints: (x509.BasicConstraints(ca=True, path_length=0), True),
        x509.KeyUsage: (usage(True), True),
        x509.SubjectKeyIdentifier: (x509.SubjectKeyIdentifier.from_public_key(key), False)}
    assert ca.subject == ca.issuer == x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpu-bootstrap"),
        x509.NameAttribute(NameOID.COMMON_NAME, "gpu-bootstrap admission CA 2026-11-23T12:00:00Z")])


def test_the_serving_certificate_is_for_the_service_names_and_server_auth_only(issued):
    cert, ca = load(issued.cert_pem), load(issued.ca_pem)
    assert (cert.not_valid_before_utc, cert.not_valid_after_utc) == (
        NOW - _dt.timedelta(minutes=5), NOW - _dt.timedelta(minutes=5) + _dt.timedelta(days=365))
    assert cert.serial_number == derived("serving-serial") >> 97
    key = serialization.load_pem_private_key(issued.key_pem.encode(), password=None)
    assert key.private_numbers().private_value == derived("serving") % (P256_ORDER - 1) + 1
    assert cert.subject == x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "opa.ns.svc")])
    assert cert.issuer == ca.subject
    assert extensions(cert) == {
        x509.BasicConstraints: (x509.BasicConstraints(ca=False, path_length=None), True),
        x509.KeyUsage: (usage(False), True),
        x509.ExtendedKeyUsage: (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        x509.SubjectAlternativeName: (x509.SubjectAlternativeName([x509.DNSName(n) for n in NAMES]), False),
        x509.AuthorityKeyIdentifier: (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()), False)}


@pytest.mark.parametrize("length, refused", [(15, True), (16, False)])
def test_a_seed_shorter_than_16_bytes_is_refused(length, refused):
    if refused:
        with pytest.raises(ValueError, match="at least 16 random bytes"):
            certs.issue("opa", "ns", NOW, bytes(length))
    else:
        assert certs.key_matches(certs.issue("opa", "ns", NOW, bytes(length)).cert_pem,
                                 certs.issue("opa", "ns", NOW, bytes(length)).key_pem)


def test_the_bundle_keeps_each_certificate_once_in_order_and_drops_empty_ones():
    assert certs.join_bundle(["A\n", "", " B ", "A", "  "]) == "A\nB\n"


def test_the_fingerprint_of_text_that_is_no_certificate_is_of_the_text_itself(issued):
    assert certs.fingerprint("  not a certificate \n") == hashlib.sha256(b"not a certificate").hexdigest()[:16]
    tbs = load(issued.cert_pem).tbs_certificate_bytes
    assert certs.fingerprint(issued.cert_pem) == hashlib.sha256(tbs).hexdigest()[:16]


def test_inspect_reads_no_names_from_a_certificate_without_them(issued):
    info = certs.inspect(issued.ca_pem)
    assert info.sans == () and info.subject.startswith("CN=gpu-bootstrap admission CA")
    assert certs.inspect(issued.cert_pem).sans == tuple(NAMES)


def test_the_readers_answer_false_for_what_they_cannot_read(issued):
    assert certs.signed_by("garbage", issued.ca_pem) is False
    assert certs.signed_by(issued.cert_pem, issued.ca_pem) is True
    assert certs.key_matches(issued.cert_pem, "garbage") is False
    assert certs.key_matches(issued.ca_pem, issued.key_pem) is False


def test_what_holds_certificate_material_cannot_be_changed_after_the_fact(issued):
    info = certs.inspect(issued.cert_pem)
    stored = certs.Stored(issued.cert_pem, issued.key_pem, issued.ca_pem)
    for obj, name in ((issued, "key_pem"), (info, "sans"), (stored, "key_pem")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, "changed")


def self_signed_without_names() -> certs.Stored:
    key = ec.derive_private_key(12345, ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "no names")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(7).not_valid_before(NOW).not_valid_after(NOW + _dt.timedelta(days=90))
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return certs.Stored(pem, key_pem, pem)


def test_a_certificate_without_names_is_replaced_saying_so():
    assert certs.renewal_reason(self_signed_without_names(), "opa", "ns", NOW, 30) == (
        "its names (none) are not the Service's opa.ns.svc, opa.ns.svc.cluster.local")


EXPIRES = NOW - _dt.timedelta(minutes=5) + _dt.timedelta(days=365)


@pytest.mark.parametrize("now, reason", [
    (EXPIRES - _dt.timedelta(days=30), "it expires 2027-11-23 (within rotate_before_days: 30)"),
    (EXPIRES - _dt.timedelta(days=30, seconds=1), None),
    (NOW - _dt.timedelta(minutes=10), None),  # not_before is exactly now + the five minutes of backdating
    (NOW - _dt.timedelta(minutes=10, seconds=1), "it is not valid yet (clock skew?)"),
])
def test_renewal_at_the_boundaries_of_expiry_and_clock_skew(issued, now, reason):
    stored = certs.Stored(issued.cert_pem, issued.key_pem, issued.ca_pem)
    assert certs.renewal_reason(stored, "opa", "ns", now, 30) == reason


def test_days_left_counts_fractions_of_a_day(issued):
    assert certs.days_left(issued.cert_pem, NOW) == (_dt.timedelta(days=365) - _dt.timedelta(minutes=5)) \
        .total_seconds() / 86400
    assert certs.days_left(issued.cert_pem, EXPIRES - _dt.timedelta(hours=12)) == 0.5


@pytest.mark.parametrize("hmac_value, private_value", [
    (P256_ORDER - 2, P256_ORDER - 1),  # the largest key there is
    (P256_ORDER - 1, 1),  # wraps: never 0, never the group order (both invalid keys)
    (2 ** 256 - 1, (2 ** 256 - 1) % (P256_ORDER - 1) + 1),
])
def test_a_key_is_valid_for_every_hmac_value_even_the_largest(monkeypatch, hmac_value, private_value):
    """A fake HMAC: a seed whose HMAC lands this high is a 1-in-2^32 event no test can search for, so the value is
    put in its place (the serials take it too, and stay below 2^159 as X.509 requires)."""
    monkeypatch.setattr(certs, "_derive", lambda seed, label: hmac_value)
    issued = certs.issue("opa", "ns", NOW, SEED)
    key = serialization.load_pem_private_key(issued.key_pem.encode(), password=None)
    assert key.private_numbers().private_value == private_value
    assert certs.key_matches(issued.cert_pem, issued.key_pem) and certs.signed_by(issued.cert_pem, issued.ca_pem)
