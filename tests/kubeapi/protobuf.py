"""Kubernetes protobuf bodies (application/vnd.kubernetes.protobuf) for the kinds clients send that way.

The wire format is the `k8s\\x00` magic followed by a runtime.Unknown message whose `raw` field holds the typed
object. Helm writes its release Secrets like this and sends DeleteOptions this way; tests encode with `encode`.
Field numbers are those of k8s.io/api generated.proto.
"""
from __future__ import annotations

import base64
import datetime as _dt

from .util import ApiError

MAGIC = b"k8s\x00"

# message -> {field number: (name, kind)}; kind is a scalar type, a message name, or ("map", key, value) /
# ("repeated", kind).
MESSAGES: dict[str, dict[int, tuple]] = {
    "Unknown": {1: ("typeMeta", "TypeMeta"), 2: ("raw", "bytes"), 3: ("contentEncoding", "string"),
                4: ("contentType", "string")},
    "TypeMeta": {1: ("apiVersion", "string"), 2: ("kind", "string")},
    "ObjectMeta": {1: ("name", "string"), 2: ("generateName", "string"), 3: ("namespace", "string"),
                   4: ("selfLink", "string"), 5: ("uid", "string"), 6: ("resourceVersion", "string"),
                   7: ("generation", "int64"), 8: ("creationTimestamp", "Time"), 9: ("deletionTimestamp", "Time"),
                   10: ("deletionGracePeriodSeconds", "int64"), 11: ("labels", ("map", "string", "string")),
                   12: ("annotations", ("map", "string", "string")),
                   13: ("ownerReferences", ("repeated", "OwnerReference")),
                   14: ("finalizers", ("repeated", "string"))},
    "OwnerReference": {1: ("kind", "string"), 3: ("name", "string"), 4: ("uid", "string"),
                       5: ("apiVersion", "string"), 6: ("controller", "bool"), 7: ("blockOwnerDeletion", "bool")},
    "Time": {1: ("seconds", "int64"), 2: ("nanos", "int32")},
    "Secret": {1: ("metadata", "ObjectMeta"), 2: ("data", ("map", "string", "bytes")), 3: ("type", "string"),
               4: ("stringData", ("map", "string", "string")), 5: ("immutable", "bool")},
    "ConfigMap": {1: ("metadata", "ObjectMeta"), 2: ("data", ("map", "string", "string")),
                  3: ("binaryData", ("map", "string", "bytes")), 4: ("immutable", "bool")},
    "Namespace": {1: ("metadata", "ObjectMeta"), 2: ("spec", "NamespaceSpec"), 3: ("status", "NamespaceStatus")},
    "NamespaceSpec": {1: ("finalizers", ("repeated", "string"))},
    "NamespaceStatus": {1: ("phase", "string")},
    "ServiceAccount": {1: ("metadata", "ObjectMeta"), 2: ("secrets", ("repeated", "ObjectReference")),
                       3: ("imagePullSecrets", ("repeated", "LocalObjectReference")),
                       4: ("automountServiceAccountToken", "bool")},
    "ObjectReference": {1: ("kind", "string"), 2: ("namespace", "string"), 3: ("name", "string"),
                        4: ("uid", "string"), 5: ("apiVersion", "string"), 6: ("resourceVersion", "string"),
                        7: ("fieldPath", "string")},
    "LocalObjectReference": {1: ("name", "string")},
    "DeleteOptions": {1: ("gracePeriodSeconds", "int64"), 2: ("preconditions", "Preconditions"),
                      3: ("orphanDependents", "bool"), 4: ("propagationPolicy", "string"),
                      5: ("dryRun", ("repeated", "string"))},
    "Preconditions": {1: ("uid", "string"), 2: ("resourceVersion", "string")},
}
TOP_LEVEL = {"Secret", "ConfigMap", "Namespace", "ServiceAccount", "DeleteOptions"}


# --- wire format -----------------------------------------------------------------------------------------------------
def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ApiError(400, "protobuf: truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes):
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ApiError(400, f"protobuf: unsupported wire type {wire}")
        yield number, wire, value


def _scalar(kind: str, value):
    if kind == "string":
        return value.decode()
    if kind == "bytes":
        return base64.b64encode(value).decode()
    if kind == "bool":
        return bool(value)
    if kind in ("int64", "int32"):
        return value - (1 << 64) if value >= 1 << 63 else value
    raise ApiError(400, f"protobuf: unknown scalar {kind}")


def decode_message(name: str, data: bytes) -> dict:
    spec = MESSAGES[name]
    out: dict = {}
    for number, _wire, value in _fields(data):
        if number not in spec:
            continue
        field_name, kind = spec[number]
        if isinstance(kind, tuple) and kind[0] == "map":
            entry = {n: v for n, _w, v in _fields(value)}
            key = _scalar(kind[1], entry.get(1, b""))
            out.setdefault(field_name, {})[key] = _decode_value(kind[2], entry.get(2, b""))
        elif isinstance(kind, tuple) and kind[0] == "repeated":
            out.setdefault(field_name, []).append(_decode_value(kind[1], value))
        else:
            out[field_name] = _decode_value(kind, value)
    return out


def _decode_value(kind: str, value):
    if kind == "Time":
        seconds = decode_message("Time", value).get("seconds", 0)
        return _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if kind in MESSAGES:
        return decode_message(kind, value)
    return _scalar(kind, value)


def decode(body: bytes) -> dict:
    """Decode a k8s protobuf envelope into the JSON form of the object."""
    if not body.startswith(MAGIC):
        raise ApiError(400, "protobuf: missing k8s magic prefix")
    unknown = decode_message("Unknown", body[len(MAGIC):])
    type_meta = unknown.get("typeMeta", {})
    kind = type_meta.get("kind", "")
    if kind not in TOP_LEVEL:
        raise ApiError(415, f"the body of kind {kind or '<none>'} is not accepted as protobuf by this server")
    raw = base64.b64decode(unknown.get("raw", ""))
    obj = decode_message(kind, raw)
    return {"apiVersion": type_meta.get("apiVersion", "v1"), "kind": kind, **obj}


# --- encoding (used by tests to send what helm sends) ---------------------------------------------------------------
def _encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, wire: int, payload: bytes | int) -> bytes:
    key = _encode_varint(number << 3 | wire)
    if wire == 0:
        return key + _encode_varint(payload)
    return key + _encode_varint(len(payload)) + payload


def encode_message(name: str, obj: dict) -> bytes:
    by_name = {field_name: (number, kind) for number, (field_name, kind) in MESSAGES[name].items()}
    out = bytearray()
    for key, value in obj.items():
        if key not in by_name or value is None:
            continue
        number, kind = by_name[key]
        if isinstance(kind, tuple) and kind[0] == "map":
            for k, v in value.items():
                entry = _encode_value(1, kind[1], k) + _encode_value(2, kind[2], v)
                out += _field(number, 2, entry)
        elif isinstance(kind, tuple) and kind[0] == "repeated":
            for item in value:
                out += _encode_value(number, kind[1], item)
        else:
            out += _encode_value(number, kind, value)
    return bytes(out)


def _encode_value(number: int, kind: str, value) -> bytes:
    if kind == "string":
        return _field(number, 2, value.encode())
    if kind == "bytes":
        return _field(number, 2, base64.b64decode(value))
    if kind in ("bool", "int64", "int32"):
        return _field(number, 0, int(value))
    if kind == "Time":
        seconds = int(_dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.timezone.utc).timestamp())
        return _field(number, 2, encode_message("Time", {"seconds": seconds}))
    return _field(number, 2, encode_message(kind, value))


def encode(obj: dict) -> bytes:
    kind = obj["kind"]
    raw = encode_message(kind, {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")})
    envelope = encode_message("Unknown", {"typeMeta": {"apiVersion": obj.get("apiVersion", "v1"), "kind": kind},
                                          "raw": base64.b64encode(raw).decode()})
    return MAGIC + envelope
