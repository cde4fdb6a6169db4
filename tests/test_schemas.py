"""Custom resources against their CRD's OpenAPI v3 schema, client-side: a table of documents in, problems out."""
from __future__ import annotations

import pytest

from gpu_bootstrap.core import schemas

pytestmark = pytest.mark.unit  # host-free: the fast loop (pytest -m unit)

CRD = {"spec": {"group": "example.com", "names": {"kind": "Widget"}, "versions": [
    {"name": "v1", "served": True, "schema": {"openAPIV3Schema": {
        "type": "object", "properties": {"spec": {"type": "object", "required": ["size"], "properties": {
            "size": {"type": "integer", "minimum": 1},
            "port": {"x-kubernetes-int-or-string": True},
            "note": {"type": "string", "nullable": True},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "mode": {"type": "string", "enum": ["a", "b"]}}}}}}},
    {"name": "v0", "served": False, "schema": {"openAPIV3Schema": {"type": "object"}}}]}}


def widget(**spec) -> dict:
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec}


def test_the_schemas_of_served_versions_are_found():
    assert list(schemas.crd_schemas([CRD])) == [("example.com/v1", "Widget")]


@pytest.mark.parametrize("spec, expected", [
    ({"size": 2}, []),
    ({"size": 2, "port": "http", "note": None, "free": {"anything": [1]}, "mode": "a"}, []),
    ({"size": 2, "port": 8080}, []),
    ({}, ["spec: 'size' is a required property"]),
    ({"size": 0}, ["spec.size: 0 is less than the minimum of 1"]),
    ({"size": "two"}, ["spec.size: 'two' is not of type 'integer'"]),
    ({"size": 1, "mode": "c"}, ["spec.mode: 'c' is not one of ['a', 'b']"]),
    ({"size": 1, "port": 1.5}, ["spec.port: 1.5 is not valid under any of the given schemas"]),
])
def test_a_custom_resource_is_checked_against_its_crd(spec, expected):
    schema = schemas.crd_schemas([CRD])[("example.com/v1", "Widget")]
    assert schemas.problems(widget(**spec), schema) == expected


def test_the_kinds_an_api_server_does_not_serve_are_read_from_helms_error():
    message = ('Error: unable to build kubernetes objects from release manifest: [resource mapping not found for name: '
               '"cluster-policy" namespace: "" from "": no matches for kind "ClusterPolicy" in version '
               '"nvidia.com/v1"\nensure CRDs are installed first, no matches for kind "NVIDIADriver" in version '
               '"nvidia.com/v1alpha1"]')
    assert schemas.kinds_without_crds(message) == [("nvidia.com/v1", "ClusterPolicy"),
                                                    ("nvidia.com/v1alpha1", "NVIDIADriver")]
    assert schemas.kinds_without_crds("Error: timed out") == []


DEFAULTED = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
    "operator": {"type": "object", "required": ["defaultRuntime"], "properties": {
        "defaultRuntime": {"type": "string", "default": "docker", "enum": ["docker", "crio", "containerd"]}}},
    "migManager": {"type": "object", "properties": {"config": {"type": "object", "properties": {
        "name": {"type": "string"}, "default": {"type": "string", "default": "all-disabled"}}}}},
    "note": {"type": "string", "nullable": True}}}}}


@pytest.mark.parametrize("spec, expected", [
    # the gpu-operator 25.3 chart's ClusterPolicy, as the real API server accepted it: a default fills the required
    # field, and a null of a non-nullable field is dropped before validation
    ({"operator": {}, "migManager": {"config": {"name": None}}}, []),
    ({"operator": {"defaultRuntime": "podman"}}, ["spec.operator.defaultRuntime: 'podman' is not one of"]),
    ({"note": None}, []),
    ({"migManager": {"config": {"name": 3}}}, ["spec.migManager.config.name: 3 is not of type 'string'"]),
])
def test_nulls_are_dropped_and_defaults_applied_before_validating_as_the_api_server_does(spec, expected):
    found = schemas.problems({"spec": spec}, DEFAULTED)
    assert len(found) == len(expected) and all(f.startswith(e) for f, e in zip(found, expected)), found
    served = schemas.as_served({"spec": {"operator": {}, "migManager": {"config": {"name": None}}}}, DEFAULTED)
    assert served == {"spec": {"operator": {"defaultRuntime": "docker"},
                               "migManager": {"config": {"default": "all-disabled"}}}}
