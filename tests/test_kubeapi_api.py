"""The emulator's API semantics, checked over real HTTPS with exact requests (issue: emulator fidelity).

Each test names the apiserver behaviour it pins; removing that behaviour from the emulator makes it fail. Every test
also runs against the real kube-apiserver of the local cluster (the `real` parameter; tests/localcluster/facade.py
moves it into a namespace of its own): where the two disagree, the real one is right. Tests marked emulator_only
check the emulator's own machinery (its controllers switched off, its fault injection, its request log, its store)
or a Kubernetes version the local cluster does not run; each says which.
"""
from __future__ import annotations

import http.client
import json
import ssl
import time

import pytest

from tests.conftest import Api
from tests.kubeapi import protobuf
from tests.localcluster.facade import RealApi, RealEmu, new_namespace

CM = "/api/v1/namespaces/default/configmaps"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"


def configmap(name: str, data: dict | None = None, labels: dict | None = None) -> dict:
    meta = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data or {"k": "v"}}


def deployment(name: str, replicas: int = 1, image: str = "nginx:1.27", scheduler: str | None = None) -> dict:
    spec = {"containers": [{"name": "web", "image": image}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


BACKENDS = ["emulator", pytest.param("real", marks=pytest.mark.xdist_group("live-api"))]


@pytest.fixture(params=BACKENDS)
def emu(request, emulator_options):
    """The emulator, or the local cluster's real API server seen through the same interface (see the docstring)."""
    if request.param == "emulator":
        yield request.getfixturevalue("cluster").emu
        return
    marker = request.node.get_closest_marker("emulator_only")
    if marker is not None:
        pytest.skip(f"emulator only: {marker.args[0]}")
    from tests.conftest import local_cluster_wanted
    if not local_cluster_wanted():
        pytest.skip("the local cluster is not built (scripts/install-test-tools); GPU_BOOTSTRAP_LIVE_TARGET=emulator")
    real = new_namespace(request.getfixturevalue("local_cluster"))
    try:
        yield real
    finally:
        real.cleanup()


@pytest.fixture
def api(emu):
    return client(emu)


def client(emu, auth: str = "cert"):
    return emu.api(auth) if isinstance(emu, RealEmu) else Api(emu, auth=auth)


# --- authentication and TLS --------------------------------------------------------------------------------------
def test_requests_without_credentials_are_anonymous_and_wrong_ones_get_401(emu):
    """kube-apiserver's default --anonymous-auth=true: no credentials is the user system:anonymous, whom RBAC refuses;
    a token that authenticates nobody is a 401."""
    response = client(emu, auth="none").get("/api/v1/namespaces")
    assert response.status == 403
    assert response.json["kind"] == "Status" and response.json["reason"] == "Forbidden"
    assert response.json["message"] == ('namespaces is forbidden: User "system:anonymous" cannot list resource '
                                        '"namespaces" in API group "" at the cluster scope')
    wrong = client(emu, auth="none")
    wrong.headers["Authorization"] = "Bearer not-a-token"
    refused = wrong.get("/api/v1/namespaces")
    assert refused.status == 401 and refused.json["reason"] == "Unauthorized"


@pytest.mark.emulator_only("the emulator's own static bearer token (the real server's tokens are tested with "
                            "TokenRequest in tests/live)")
def test_bearer_token_and_client_certificate_both_authenticate(emu):
    assert Api(emu, auth="token").get("/api/v1/namespaces").status == 200
    assert Api(emu, auth="cert").get("/api/v1/namespaces").status == 200
    wrong = Api(emu, auth="none")
    wrong.headers["Authorization"] = "Bearer not-the-token"
    assert wrong.get("/api/v1/namespaces").status == 401


def test_server_certificate_only_verifies_against_the_emulator_ca(emu):
    host, port = emu.address.split(":")
    connection = http.client.HTTPSConnection(host, int(port), context=ssl.create_default_context(), timeout=5)
    with pytest.raises(ssl.SSLCertVerificationError):
        connection.request("GET", "/version")


# --- discovery and OpenAPI -----------------------------------------------------------------------------------------
@pytest.mark.emulator_only("a configured Kubernetes version (the local cluster runs one)")
@pytest.mark.parametrize("emulator_options", [{"kube_version": "1.29.4"}])
def test_version_reports_the_configured_kubernetes_version(api):
    info = api.get("/version").json
    assert (info["major"], info["minor"], info["gitVersion"]) == ("1", "29", "v1.29.4")


REQUIRED_GROUPS = ["apps", "batch", "rbac.authorization.k8s.io", "apiextensions.k8s.io", "admissionregistration.k8s.io",
                   "coordination.k8s.io", "policy", "scheduling.k8s.io", "storage.k8s.io", "networking.k8s.io"]


def test_legacy_discovery_lists_every_required_group(api):
    assert api.get("/api").json["versions"] == ["v1"]
    groups = {g["name"]: g["preferredVersion"]["version"] for g in api.get("/apis").json["groups"]}
    for group in REQUIRED_GROUPS:
        assert groups.get(group) == "v1", group
    resources = {r["name"]: r for r in api.get("/apis/apps/v1").json["resources"]}
    assert resources["deployments"]["kind"] == "Deployment" and "deployments/status" in resources
    assert resources["deployments"]["shortNames"] == ["deploy"]


AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"


def test_aggregated_discovery_is_served_from_1_30(api):
    response = api.get("/apis", accept=AGGREGATED)
    assert "as=APIGroupDiscoveryList" in response.headers["Content-Type"]
    names = [item["metadata"]["name"] for item in response.json["items"]]
    assert "apps" in names and "" not in names
    core = api.get("/api", accept=AGGREGATED).json["items"][0]
    nodes = next(r for r in core["versions"][0]["resources"] if r["resource"] == "nodes")
    assert nodes["scope"] == "Cluster" and nodes["responseKind"]["kind"] == "Node"


@pytest.mark.emulator_only("Kubernetes 1.24 (the local cluster runs one version)")
@pytest.mark.parametrize("emulator_options", [{"kube_version": "1.24.17"}])
def test_old_versions_answer_legacy_discovery_and_lack_newer_apis(api):
    response = api.get("/apis", accept=AGGREGATED)
    assert response.json["kind"] == "APIGroupList"
    admission = api.get("/apis/admissionregistration.k8s.io/v1").json["resources"]
    assert "validatingadmissionpolicies" not in {r["name"] for r in admission}


def test_openapi_v3_declares_field_validation_on_patch(api):
    index = api.get("/openapi/v3").json["paths"]
    document = api.get(index["apis/apps/v1"]["serverRelativeURL"]).json
    patch = document["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    containers = document["components"]["schemas"]["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]
    assert containers["x-kubernetes-patch-merge-key"] == "name"
    v2 = api.get("/openapi/v2", accept="application/com.github.proto-openapi.spec.v2@v1.0+protobuf")
    assert v2.status == 200
    assert v2.headers["Content-Type"] == "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
    # DELIBERATE: the emulator's OpenAPI v2 document is empty (its clients use v3); the real one is the whole spec
    assert (v2.data != b"") == isinstance(api, RealApi)


# --- create, read, update ---------------------------------------------------------------------------------------------
def test_create_returns_201_with_server_metadata_and_duplicates_409(api):
    created = api.post(CM, configmap("a"))
    assert created.status == 201
    meta = created.json["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and int(meta["resourceVersion"]) > 0
    assert meta["managedFields"][0]["manager"] == "Python-urllib" or meta["managedFields"][0]["operation"] == "Update"
    again = api.post(CM, configmap("a"))
    assert again.status == 409 and again.json["reason"] == "AlreadyExists"


def test_resource_versions_are_cluster_wide_and_monotonic(api):
    first = int(api.post(CM, configmap("a")).json["metadata"]["resourceVersion"])
    second = int(api.post("/api/v1/namespaces/kube-system/secrets",
                          {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}).json["metadata"][
                     "resourceVersion"])
    third = int(api.post(CM, configmap("b")).json["metadata"]["resourceVersion"])
    assert first < second < third


def test_generate_name_appends_a_random_suffix(api):
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "run-"}}
    names = {api.post(CM, body).json["metadata"]["name"] for _ in range(3)}
    assert len(names) == 3 and all(n.startswith("run-") and len(n) == 9 for n in names)


def test_put_with_a_stale_resource_version_is_a_conflict(api):
    created = api.post(CM, configmap("a")).json
    created["data"] = {"k": "2"}
    assert api.put(f"{CM}/a", created).status == 200
    created["data"] = {"k": "3"}
    stale = api.put(f"{CM}/a", created)
    assert stale.status == 409 and stale.json["reason"] == "Conflict"
    assert "the object has been modified" in stale.json["message"]


def test_errors_are_status_objects(api):
    for response in (api.get(f"{CM}/missing"), api.post(CM, {"kind": "ConfigMap", "metadata": {"name": "BAD_NAME"}}),
                     api.request("PATCH", f"{CM}/x", b"{}", content_type="text/plain")):
        assert response.json["kind"] == "Status" and response.json["status"] == "Failure", response
        assert response.json["code"] == response.status
    assert api.get(f"{CM}/missing").json["details"] == {"name": "missing", "kind": "configmaps"}  # "" group left out


def test_names_and_labels_are_validated(api):
    bad_name = api.post(CM, configmap("Not_Valid"))
    assert bad_name.status == 422 and bad_name.json["details"]["causes"][0]["field"] == "metadata.name"
    bad_label = api.post(CM, configmap("ok", labels={"k": "has space"}))
    assert bad_label.status == 422


# --- field validation ------------------------------------------------------------------------------------------------
def test_strict_field_validation_rejects_unknown_fields(api):
    body = deployment("web")
    body["spec"]["template"]["spec"]["containers"][0]["imagee"] = "typo"
    strict = api.post(f"{DEPLOYMENTS}?fieldValidation=Strict", body)
    assert strict.status == 400
    assert 'unknown field "spec.template.spec.containers[0].imagee"' in strict.json["message"]
    warned = api.post(DEPLOYMENTS, body)
    assert warned.status == 201 and "unknown field" in warned.headers.get("Warning", "")
    assert "imagee" not in json.dumps(warned.json)


def test_wrong_types_are_rejected_and_required_fields_enforced(api):
    body = deployment("web")
    body["spec"]["replicas"] = "two"
    assert api.post(DEPLOYMENTS, body).status == 400
    missing = deployment("web2")
    del missing["spec"]["selector"]
    response = api.post(DEPLOYMENTS, missing)
    assert response.status == 422 and "spec.selector: Required value" in response.json["message"]


# --- list, selectors, paging --------------------------------------------------------------------------------------
def test_label_selectors_equality_and_set_based(api):
    for name, labels in (("a", {"tier": "web", "env": "prod"}), ("b", {"tier": "db"}), ("c", {"tier": "cache"})):
        api.post(CM, configmap(name, labels=labels))

    def names(selector):
        from urllib.parse import quote
        return sorted(i["metadata"]["name"] for i in api.get(f"{CM}?labelSelector={quote(selector)}").json["items"])

    assert names("tier=web") == ["a"]
    assert names("tier!=web") == ["b", "c", "kube-root-ca.crt"]
    assert names("tier in (web,db)") == ["a", "b"]
    assert names("tier notin (web,db),tier") == ["c"]
    assert names("!env,tier") == ["b", "c"]
    assert names("env") == ["a"]


def test_field_selectors_on_name_namespace_and_node(api, emu):
    api.post(CM, configmap("a"))
    assert [i["metadata"]["name"] for i in api.get(f"{CM}?fieldSelector=metadata.name%3Da").json["items"]] == ["a"]
    all_ns = api.get("/api/v1/configmaps?fieldSelector=metadata.namespace%3Dkube-system").json["items"]
    assert {i["metadata"]["namespace"] for i in all_ns} == {"kube-system"}
    api.post("/api/v1/namespaces/default/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                                 "spec": {"nodeName": "gpu-2",
                                                          "containers": [{"name": "c", "image": "busybox"}]}})
    # in this namespace: on the real cluster, pods of other tests' namespaces (still terminating) share the node
    on_node = api.get("/api/v1/namespaces/default/pods?fieldSelector=spec.nodeName%3Dgpu-2").json["items"]
    assert [p["metadata"]["name"] for p in on_node] == ["p"]
    unsupported = api.get(f"{CM}?fieldSelector=data.k%3Dv")
    assert unsupported.status == 400, unsupported
    assert unsupported.json["message"] == '"data.k" is not a known field selector: only "metadata.name", ' \
                                          '"metadata.namespace"', unsupported


def test_limit_and_continue_page_through_a_list(api):
    for index in range(5):
        api.post(CM, configmap(f"page-{index}"))
    seen, token = [], ""
    while True:
        page = api.get(f"{CM}?limit=2" + (f"&continue={token}" if token else "")).json
        seen += [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue", "")
        if not token:
            break
        assert page["metadata"]["remainingItemCount"] > 0
    assert seen == sorted(seen) and len(seen) == 6 and len(set(seen)) == 6


def test_list_items_of_builtin_kinds_carry_no_type_meta(api):
    listing = api.get(CM).json
    assert listing["kind"] == "ConfigMapList" and listing["apiVersion"] == "v1"
    assert "kind" not in listing["items"][0]


def test_table_responses(api, emu):
    table = api.get("/api/v1/nodes?includeObject=Object", accept="application/json;as=Table;v=v1;g=meta.k8s.io").json
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]][:5] == ["Name", "Status", "Roles", "Age", "Version"]
    assert [row["cells"][0] for row in table["rows"]] == sorted(n["metadata"]["name"] for n in emu.list("nodes"))
    assert table["rows"][0]["object"]["kind"] == "Node"


# --- patches ---------------------------------------------------------------------------------------------------------
def test_merge_patch_sets_and_removes_keys(api):
    api.post(CM, configmap("a", {"x": "1", "y": "2"}))
    patched = api.patch(f"{CM}/a", {"data": {"x": None, "z": "3"}}, "merge").json
    assert patched["data"] == {"y": "2", "z": "3"}


def test_strategic_merge_patch_merges_containers_by_name_and_replaces_taints(api, emu):
    api.post(DEPLOYMENTS, {**deployment("web"), "spec": {**deployment("web")["spec"], "template": {
        "metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "nginx:1"}, {"name": "side", "image": "envoy:1"}]}}}})
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "side", "image": "envoy:2"}]}}}}
    result = api.patch(f"{DEPLOYMENTS}/web", patch, "strategic").json
    images = {c["name"]: c["image"] for c in result["spec"]["template"]["spec"]["containers"]}
    assert images == {"web": "nginx:1", "side": "envoy:2"}
    api.patch("/api/v1/nodes/gpu-1", {"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}}, "strategic")
    node = api.patch("/api/v1/nodes/gpu-1", {"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}},
                     "strategic").json
    assert [t["key"] for t in node["spec"]["taints"]] == ["b"]


def test_strategic_merge_patch_directives(api):
    api.post(DEPLOYMENTS, {**deployment("web"), "spec": {**deployment("web")["spec"], "template": {
        "metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "nginx:1"}, {"name": "side", "image": "envoy:1"}]}}}})
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "side", "$patch": "delete"}]}}}}
    result = api.patch(f"{DEPLOYMENTS}/web", patch, "strategic").json
    assert [c["name"] for c in result["spec"]["template"]["spec"]["containers"]] == ["web"]
    api.patch(f"{CM}", {}, "strategic")  # a patch on a collection is not a thing
    meta = {"metadata": {"finalizers": ["a/x"]}}
    api.post(CM, configmap("f"))
    api.patch(f"{CM}/f", meta, "strategic")
    merged = api.patch(f"{CM}/f", {"metadata": {"finalizers": ["b/y"]}}, "strategic").json
    assert merged["metadata"]["finalizers"] == ["b/y", "a/x"]  # a new patch item goes first (normalizeElementOrder)
    removed = api.patch(f"{CM}/f", {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a/x"]}}, "strategic").json
    assert removed["metadata"]["finalizers"] == ["b/y"]


def test_json_patch_operations_and_failed_test(api):
    api.post(CM, configmap("a", {"x": "1"}))
    result = api.patch(f"{CM}/a", [{"op": "add", "path": "/data/y", "value": "2"},
                                   {"op": "replace", "path": "/data/x", "value": "9"},
                                   {"op": "test", "path": "/data/y", "value": "2"}], "json").json
    assert result["data"] == {"x": "9", "y": "2"}
    failed = api.patch(f"{CM}/a", [{"op": "test", "path": "/data/x", "value": "nope"}], "json")
    assert failed.status == 422


# --- server-side apply -----------------------------------------------------------------------------------------------
def apply(api, path, body, manager="tester", force=False, **kw):
    query = f"?fieldManager={manager}" + ("&force=true" if force else "")
    return api.patch(path + query, body, "apply", **kw)


def test_apply_creates_when_missing_and_is_a_no_op_when_repeated(api):
    first = apply(api, f"{CM}/a", configmap("a", {"x": "1"}))
    assert first.status == 201
    second = apply(api, f"{CM}/a", configmap("a", {"x": "1"}))
    assert second.status == 200
    assert second.json["metadata"]["resourceVersion"] == first.json["metadata"]["resourceVersion"]
    entry = second.json["metadata"]["managedFields"][0]
    assert entry["manager"] == "tester" and entry["operation"] == "Apply"
    assert entry["fieldsV1"] == {"f:data": {"f:x": {}}}


def test_apply_prunes_fields_the_manager_stopped_setting(api):
    apply(api, f"{CM}/a", configmap("a", {"x": "1", "y": "2"}))
    result = apply(api, f"{CM}/a", configmap("a", {"x": "1"})).json
    assert result["data"] == {"x": "1"}


def test_apply_keeps_fields_other_managers_own(api):
    apply(api, f"{CM}/a", configmap("a", {"x": "1"}))
    api.patch(f"{CM}/a?fieldManager=someone-else", {"data": {"other": "keep"}}, "merge")
    result = apply(api, f"{CM}/a", configmap("a", {"x": "2"})).json
    assert result["data"] == {"x": "2", "other": "keep"}


def test_apply_conflicts_with_another_manager_unless_forced(api):
    apply(api, f"{CM}/a", configmap("a", {"x": "1"}), manager="first")
    conflict = apply(api, f"{CM}/a", configmap("a", {"x": "2"}), manager="second")
    assert conflict.status == 409
    assert 'conflict with "first"' in conflict.json["message"] and ".data.x" in conflict.json["message"]
    assert conflict.json["details"]["causes"][0]["reason"] == "FieldManagerConflict"
    forced = apply(api, f"{CM}/a", configmap("a", {"x": "2"}), manager="second", force=True).json
    assert forced["data"]["x"] == "2"
    owners = {m["manager"]: m["fieldsV1"] for m in forced["metadata"]["managedFields"]}
    assert "first" not in owners and owners["second"] == {"f:data": {"f:x": {}}}


def test_apply_with_the_same_value_shares_ownership_without_conflict(api):
    apply(api, f"{CM}/a", configmap("a", {"x": "1"}), manager="first")
    shared = apply(api, f"{CM}/a", configmap("a", {"x": "1"}), manager="second")
    assert shared.status == 200
    assert {m["manager"] for m in shared.json["metadata"]["managedFields"]} == {"first", "second"}


def test_apply_merges_associative_lists_by_key(api):
    body = deployment("web")
    apply(api, f"{DEPLOYMENTS}/web", body, manager="one")
    extra = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
             "spec": {"template": {"spec": {"containers": [{"name": "side", "image": "envoy:1"}]}}}}
    result = apply(api, f"{DEPLOYMENTS}/web", extra, manager="two").json
    assert [c["name"] for c in result["spec"]["template"]["spec"]["containers"]] == ["web", "side"]


def test_apply_requires_a_field_manager(api):
    response = api.patch(f"{CM}/a", configmap("a"), "apply")
    assert response.status == 422 and "fieldManager: Required value" in response.json["message"], response


# --- delete ----------------------------------------------------------------------------------------------------------
@pytest.mark.emulator_only("switches the emulator's garbage collector off to see the foregroundDeletion finalizer")
def test_delete_propagation_background_foreground_and_orphan(api, emu):
    for name in ("bg", "fg", "orphan"):
        api.post(DEPLOYMENTS, deployment(name))
    emu.settle()
    assert len(emu.list("replicasets", "default")) == 3
    api.delete(f"{DEPLOYMENTS}/bg", {"propagationPolicy": "Background"})
    emu.settle()
    assert not [rs for rs in emu.list("replicasets", "default") if rs["metadata"]["name"].startswith("bg-")]
    assert not [p for p in emu.list("pods", "default") if p["metadata"]["name"].startswith("bg-")]

    api.delete(f"{DEPLOYMENTS}/orphan", {"propagationPolicy": "Orphan"})
    emu.settle()
    orphaned = [rs for rs in emu.list("replicasets", "default") if rs["metadata"]["name"].startswith("orphan-")]
    assert len(orphaned) == 1 and not orphaned[0]["metadata"].get("ownerReferences")
    assert emu.get("deployments", "orphan", "default") is None

    emu.controllers.disable("gc")
    response = api.delete(f"{DEPLOYMENTS}/fg", {"propagationPolicy": "Foreground"})
    assert response.json["metadata"]["deletionTimestamp"]
    assert "foregroundDeletion" in emu.get("deployments", "fg", "default")["metadata"]["finalizers"]
    emu.controllers.enable("gc")
    emu.settle()
    assert emu.get("deployments", "fg", "default") is None
    assert not [rs for rs in emu.list("replicasets", "default") if rs["metadata"]["name"].startswith("fg-")]


def test_a_delete_reads_its_options_from_the_body_and_then_ignores_the_query(api):
    """handlers/delete.go: with a body, DeleteOptions come from it alone; the query (dryRun=All) is not read. A
    dry run sent as a query beside a body deletes for real; dryRun in the body does not. (gpu-bootstrap's own
    delete once sent the first, and a teardown --dry-run removed what it previewed.)"""
    for name in ("dry-in-body", "dry-in-query"):
        assert api.post(CM, configmap(name)).status == 201
    kept = api.request("DELETE", f"{CM}/dry-in-body", {"apiVersion": "v1", "kind": "DeleteOptions",
                                                        "propagationPolicy": "Background", "dryRun": ["All"]})
    assert kept.status == 200, kept
    assert api.request("GET", f"{CM}/dry-in-body").status == 200
    gone = api.request("DELETE", f"{CM}/dry-in-query?dryRun=All", {"propagationPolicy": "Background"})
    assert gone.status == 200, gone
    assert api.request("GET", f"{CM}/dry-in-query").status == 404
    assert api.request("DELETE", f"{CM}/dry-in-body?dryRun=All").status == 200  # no body: the query is read
    assert api.request("GET", f"{CM}/dry-in-body").status == 200


def test_finalizers_hold_an_object_until_removed(api, emu):
    api.post(CM, {**configmap("held"), "metadata": {"name": "held", "finalizers": ["example.com/hold"]}})
    deleted = api.delete(f"{CM}/held")
    assert deleted.status == 200 and deleted.json["metadata"]["deletionTimestamp"]
    assert emu.get("configmaps", "held", "default") is not None
    api.patch(f"{CM}/held", {"metadata": {"finalizers": None}}, "merge")
    assert emu.get("configmaps", "held", "default") is None


def test_namespace_deletion_cascades_and_blocks_new_content(api, emu):
    api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    emu.settle()
    api.post("/api/v1/namespaces/team/configmaps", configmap("c"))
    api.post("/api/v1/namespaces/team/configmaps", {**configmap("held"),
                                                    "metadata": {"name": "held", "finalizers": ["x.io/hold"]}})
    assert api.delete("/api/v1/namespaces/team").json["status"]["phase"] == "Terminating"
    emu.settle()
    blocked = api.post("/api/v1/namespaces/team/configmaps", configmap("late"))
    assert blocked.status == 403 and "being terminated" in blocked.json["message"]
    assert emu.get("configmaps", "c", "team") is None
    assert emu.get("namespaces", "team") is not None  # the finalizer on "held" keeps it Terminating
    api.patch("/api/v1/namespaces/team/configmaps/held", {"metadata": {"finalizers": None}}, "merge")
    emu.settle()
    assert emu.get("namespaces", "team") is None


def test_garbage_collection_follows_owner_references_as_they_change(api, emu):
    """The collector finds dependents through an index kept on every write: a dependent is collected with its owner,
    and one whose reference an update removed is not (the index must not answer with an owner it no longer names)."""
    owner = api.post(CM, configmap("owner")).json
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    for name in ("kept", "collected"):
        api.post(CM, {**configmap(name), "metadata": {"name": name, "ownerReferences": [ref]}})
    assert api.patch(f"{CM}/kept", {"metadata": {"ownerReferences": None}}, "merge").status == 200
    assert api.delete(f"{CM}/owner").status == 200
    emu.settle()
    assert emu.get("configmaps", "collected", "default") is None
    assert emu.get("configmaps", "kept", "default") is not None


@pytest.mark.emulator_only("switches the emulator's kubelet off")
def test_pod_binding_sets_the_node_and_the_scheduled_condition_in_one_write(api, emu):
    """pods/binding as the API server's BindingREST does it: nodeName and PodScheduled=True in one update (one new
    resourceVersion, one watch event), recorded under no field manager; a second binding is a 409."""
    emu.controllers.disable("kubelet")  # nothing but the binding writes the pod
    pods = "/api/v1/namespaces/default/pods"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waiting"},
           "spec": {"schedulerName": "nobody-serves-this", "containers": [{"name": "c", "image": "busybox"}]}}
    created = api.post(pods, pod).json
    emu.settle()
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "waiting"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": emu.list("nodes")[0]["metadata"]["name"]}}
    assert api.post(f"{pods}/waiting/binding?dryRun=All", binding).status == 201
    assert emu.get("pods", "waiting", "default")["spec"].get("nodeName") is None
    before = int(emu.get("pods", "waiting", "default")["metadata"]["resourceVersion"])
    assert api.post(f"{pods}/waiting/binding", binding).status == 201
    bound = emu.get("pods", "waiting", "default")
    assert bound["spec"]["nodeName"] == binding["target"]["name"]
    assert int(bound["metadata"]["resourceVersion"]) == before + 1
    assert [c["status"] for c in bound["status"]["conditions"] if c["type"] == "PodScheduled"] == ["True"]
    assert bound["metadata"]["managedFields"] == created["metadata"]["managedFields"]
    again = api.post(f"{pods}/waiting/binding", binding)
    assert again.status == 409 and "already assigned" in again.json["message"]
    assert api.post(f"{pods}/nobody/binding", {**binding, "metadata": {"name": "nobody"}}).status == 404


def test_creating_in_a_missing_namespace_is_404(api):
    response = api.post("/api/v1/namespaces/nope/configmaps", configmap("a"))
    assert response.status == 404 and 'namespaces "nope" not found' in response.json["message"]


def test_a_pod_naming_a_missing_service_account_is_refused(api):
    """The ServiceAccount admission plugin (found with the real API server, where a stand-in's DaemonSets named
    accounts nobody had made, and every one of their pods was refused)."""
    pods = "/api/v1/namespaces/default/pods"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "plugin-"},
           "spec": {"serviceAccountName": "nobody", "containers": [{"name": "c", "image": "busybox"}]}}
    refused = api.post(pods, pod)
    assert refused.status == 403, refused
    assert refused.json["message"] == ('pods "plugin-" is forbidden: error looking up service account '
                                       'default/nobody: serviceaccount "nobody" not found')
    api.post("/api/v1/namespaces/default/serviceaccounts",
             {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody"}})
    assert api.post(pods, pod).status == 201


# --- dry run ---------------------------------------------------------------------------------------------------------------
@pytest.mark.emulator_only("reads the emulator store's resourceVersion counter")
def test_dry_run_validates_every_write_but_stores_nothing(api, emu):
    api.post(CM, configmap("real", {"x": "1"}))
    before = emu.store.rv
    assert api.post(f"{CM}?dryRun=All", configmap("ghost")).status == 201
    assert api.post(f"{CM}?dryRun=All", configmap("Bad_Name")).status == 422
    assert api.patch(f"{CM}/real?dryRun=All", {"data": {"x": "2"}}, "merge").json["data"]["x"] == "2"
    current = api.get(f"{CM}/real").json
    assert api.put(f"{CM}/real?dryRun=All", {**current, "data": {"x": "3"}}).json["data"]["x"] == "3"
    assert apply(api, f"{CM}/ghost2", configmap("ghost2")).status == 201
    api.delete(f"{CM}/ghost2")
    before = emu.store.rv
    assert api.request("PATCH", f"{CM}/applied?fieldManager=t&dryRun=All", json.dumps(configmap("applied")).encode(),
                       content_type="application/apply-patch+yaml").status == 201
    assert api.delete(f"{CM}/real?dryRun=All").status == 200
    assert emu.store.rv == before
    assert emu.get("configmaps", "ghost", "default") is None and emu.get("configmaps", "applied", "default") is None
    assert emu.get("configmaps", "real", "default")["data"] == {"x": "1"}
    assert api.post(f"{CM}?dryRun=Some", configmap("x")).status == 400


# --- status subresource and generation ------------------------------------------------------------------------------
@pytest.mark.emulator_only("switches the emulator's controllers off")
def test_status_subresource_separates_spec_and_status_writes(api, emu):
    emu.controllers.disable("deployment")
    created = api.post(DEPLOYMENTS, deployment("web")).json
    assert created["metadata"]["generation"] == 1 and "status" not in created
    created["status"] = {"replicas": 5}
    created["spec"]["replicas"] = 3
    updated = api.put(f"{DEPLOYMENTS}/web", created).json
    assert updated["spec"]["replicas"] == 3 and updated.get("status") is None
    assert updated["metadata"]["generation"] == 2
    updated["status"] = {"replicas": 7}
    updated["spec"]["replicas"] = 9
    status = api.put(f"{DEPLOYMENTS}/web/status", updated).json
    assert status["status"]["replicas"] == 7 and status["spec"]["replicas"] == 3
    assert status["metadata"]["generation"] == 2
    labelled = api.patch(f"{DEPLOYMENTS}/web", {"metadata": {"labels": {"a": "b"}}}, "merge").json
    assert labelled["metadata"]["generation"] == 2


# --- protobuf ------------------------------------------------------------------------------------------------------------
def test_protobuf_secret_configmap_and_delete_options(api, emu):
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "sh.helm.release.v1.demo.v1", "labels": {"owner": "helm", "name": "demo"}},
              "type": "helm.sh/release.v1", "data": {"release": "aGVsbG8="}}
    created = api.post("/api/v1/namespaces/default/secrets", protobuf.encode(secret),
                       content_type="application/vnd.kubernetes.protobuf",
                       accept="application/vnd.kubernetes.protobuf,application/json")
    assert created.status == 201, created
    stored = emu.get("secrets", "sh.helm.release.v1.demo.v1", "default")
    assert stored["type"] == "helm.sh/release.v1" and stored["data"] == {"release": "aGVsbG8="}
    assert stored["metadata"]["labels"] == {"owner": "helm", "name": "demo"}
    api.post(CM, protobuf.encode({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pb"},
                                  "data": {"a": "b"}}), content_type="application/vnd.kubernetes.protobuf")
    assert emu.get("configmaps", "pb", "default")["data"] == {"a": "b"}
    options = protobuf.encode({"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"})
    assert api.delete(f"{CM}/pb", options, content_type="application/vnd.kubernetes.protobuf").status == 200
    assert emu.get("configmaps", "pb", "default") is None
    only_protobuf = api.get(CM, accept="application/vnd.kubernetes.protobuf")
    if isinstance(emu, RealEmu):
        assert only_protobuf.status == 200
        assert only_protobuf.headers["Content-Type"] == "application/vnd.kubernetes.protobuf"
    else:  # DELIBERATE: the emulator reads protobuf but answers in JSON only, so it refuses a protobuf-only Accept
        assert only_protobuf.status == 406


# --- CRDs ----------------------------------------------------------------------------------------------------------------
WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {"group": "example.com", "scope": "Namespaced",
             "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
             "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                           "additionalPrinterColumns": [{"name": "Size", "type": "integer",
                                                         "jsonPath": ".spec.size"}],
                           "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                               "spec": {"type": "object", "properties": {
                                   "size": {"type": "integer", "default": 1},
                                   "tags": {"type": "array", "items": {"type": "string"}}}},
                               "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}]}}


def test_crd_registers_its_resource_and_becomes_established(api, emu):
    assert api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", WIDGET_CRD).status == 201
    emu.settle()
    crd = api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com").json
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    assert "example.com" in {g["name"] for g in api.get("/apis").json["groups"]}
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"tags": ["a"]}}
    created = api.post("/apis/example.com/v1/namespaces/default/widgets", widget)
    assert created.status == 201 and created.json["spec"]["size"] == 1  # schema default applied
    listing = api.get("/apis/example.com/v1/namespaces/default/widgets").json
    assert listing["items"][0]["kind"] == "Widget"
    table = api.get("/apis/example.com/v1/namespaces/default/widgets", accept="application/json;as=Table;v=v1;"
                                                                             "g=meta.k8s.io").json
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Size"] and table["rows"][0]["cells"] == ["w", 1]


def test_custom_resources_are_validated_and_pruned_by_their_schema(api, emu):
    api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", WIDGET_CRD)
    path = "/apis/example.com/v1/namespaces/default/widgets"
    bad_type = api.post(path, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
                               "spec": {"size": "big"}})
    assert bad_type.status == 422 and "spec.size" in bad_type.json["message"]
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"colour": "red"}}
    assert api.post(f"{path}?fieldValidation=Strict", unknown).status == 400
    pruned = api.post(path, unknown).json
    assert "colour" not in pruned["spec"]
    assert api.patch(f"{path}/w", {"spec": {"size": 2}}, "strategic").status == 415


def test_deleting_a_crd_removes_its_objects_and_its_api(api, emu):
    api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", WIDGET_CRD)
    api.post("/apis/example.com/v1/namespaces/default/widgets",
             {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
    api.delete("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
    emu.settle()
    assert api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com").status == 404
    assert api.get("/apis/example.com/v1/namespaces/default/widgets").status == 404
    assert "example.com" not in {g["name"] for g in api.get("/apis").json["groups"]}


# --- watches ---------------------------------------------------------------------------------------------------------------
class WatchStream:
    """Reads a chunked watch response event by event."""

    def __init__(self, api: Api, path: str, accept: str = "application/json"):
        real = isinstance(api, RealApi)
        host, port = (api.address if real else api.emu.address).split(":")
        self.back = api.back if real else (lambda data: data)
        self.connection = http.client.HTTPSConnection(host, int(port), context=api.context, timeout=10)
        self.connection.request("GET", api.moved(path) if real else path, headers={"Accept": accept})
        self.response = self.connection.getresponse()

    def next(self) -> dict:
        return json.loads(self.back(self.response.readline()))

    def close(self):
        self.connection.close()


def test_watch_from_a_resource_version_sees_later_events_only(api):
    first = api.post(CM, configmap("before")).json
    stream = WatchStream(api, f"{CM}?watch=true&resourceVersion={first['metadata']['resourceVersion']}")
    api.post(CM, configmap("after"))
    api.patch(f"{CM}/after", {"data": {"k": "2"}}, "merge")
    api.delete(f"{CM}/after")
    events = [stream.next() for _ in range(3)]
    stream.close()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "after"), ("MODIFIED", "after"), ("DELETED", "after")]


def test_watch_list_sends_initial_events_then_the_end_bookmark(api):
    api.post(CM, configmap("one"))
    stream = WatchStream(api, f"{CM}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
                              f"&allowWatchBookmarks=true")
    events = [stream.next() for _ in range(3)]
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    assert events[2]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    api.post(CM, configmap("two"))
    assert stream.next()["object"]["metadata"]["name"] == "two"
    stream.close()


@pytest.mark.emulator_only("compacts the emulator's store")
def test_watch_from_a_compacted_resource_version_answers_410(api, emu):
    old = api.post(CM, configmap("a")).json["metadata"]["resourceVersion"]
    api.post(CM, configmap("b"))
    emu.store.compact()
    stream = WatchStream(api, f"{CM}?watch=true&resourceVersion={old}")
    event = stream.next()
    stream.close()
    assert event["type"] == "ERROR" and event["object"]["code"] == 410


def test_label_filtered_watch_sees_objects_leave_the_selection(api):
    api.post(CM, configmap("a", labels={"watch": "me"}))
    rv = api.get(CM).json["metadata"]["resourceVersion"]
    stream = WatchStream(api, f"{CM}?watch=true&resourceVersion={rv}&labelSelector=watch%3Dme")
    api.patch(f"{CM}/a", {"metadata": {"labels": {"watch": None}}}, "merge")
    event = stream.next()
    stream.close()
    assert event["type"] == "DELETED" and event["object"]["metadata"]["name"] == "a"


def test_watch_ends_at_timeout_seconds(api):
    started = time.monotonic()
    response = api.get(f"{CM}?watch=true&timeoutSeconds=1&resourceVersion=0")
    assert response.status == 200 and 1 <= time.monotonic() - started < 5


# --- controllers --------------------------------------------------------------------------------------------------------
@pytest.mark.emulator_only("the emulator's seeded nodes")
def test_nodes_are_seeded_with_capacity_labels_and_addresses(emu):
    gpu, cpu = emu.get("nodes", "gpu-1"), emu.get("nodes", "cpu-1")
    assert gpu["status"]["allocatable"]["nvidia.com/gpu"] == "8" and "nvidia.com/gpu" not in cpu["status"]["capacity"]
    for node in (gpu, cpu):
        assert {"cpu", "memory", "pods"} <= set(node["status"]["allocatable"])
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == node["metadata"]["name"]
        assert {a["type"] for a in node["status"]["addresses"]} == {"InternalIP", "Hostname"}


def test_deployment_becomes_available_through_replicaset_and_pods(api, emu):
    api.post(DEPLOYMENTS, deployment("web", replicas=2))
    emu.settle()
    deploy = emu.get("deployments", "web", "default")
    conditions = {c["type"]: (c["status"], c["reason"]) for c in deploy["status"]["conditions"]}
    assert conditions == {"Available": ("True", "MinimumReplicasAvailable"),
                          "Progressing": ("True", "NewReplicaSetAvailable")}
    assert deploy["status"]["readyReplicas"] == 2 and deploy["status"]["observedGeneration"] == 1
    [rs] = emu.list("replicasets", "default")
    assert rs["metadata"]["ownerReferences"][0]["controller"] is True
    pods = emu.list("pods", "default")
    assert len(pods) == 2 and all(p["status"]["phase"] == "Running" and p["spec"]["nodeName"] for p in pods)


def test_daemonset_places_pods_only_on_matching_tolerated_nodes(api, emu):
    api.patch("/api/v1/nodes/gpu-2", {"spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present",
                                                           "effect": "NoSchedule"}]}}, "strategic")
    ds = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
          "spec": {"selector": {"matchLabels": {"app": "agent"}},
                   "template": {"metadata": {"labels": {"app": "agent"}},
                                "spec": {"nodeSelector": {"kubernetes.io/os": "linux"},
                                         "containers": [{"name": "a", "image": "agent:1"}]}}}}
    api.post("/apis/apps/v1/namespaces/default/daemonsets", ds)
    emu.settle()
    # Counted from the nodes as they are: on the real cluster a deployment may have tainted gpu-1 too.
    untainted = [n for n in emu.list("nodes") if not any(
        t.get("effect") in ("NoSchedule", "NoExecute") for t in n["spec"].get("taints") or [])]
    gpu_only = [n for n in emu.list("nodes") if n["spec"].get("taints") and all(
        t["key"] == "nvidia.com/gpu" for t in n["spec"]["taints"] if t.get("effect") in ("NoSchedule", "NoExecute"))]
    assert "gpu-2" not in {n["metadata"]["name"] for n in untainted}
    status = emu.get("daemonsets", "agent", "default")["status"]
    assert status["desiredNumberScheduled"] == len(untainted) and status["numberReady"] == len(untainted)
    ds["spec"]["template"]["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    api.put("/apis/apps/v1/namespaces/default/daemonsets/agent",
            {**ds, "metadata": {"name": "agent", "resourceVersion": emu.get("daemonsets", "agent", "default")[
                "metadata"]["resourceVersion"]}})
    emu.settle()
    assert emu.get("daemonsets", "agent", "default")["status"]["numberReady"] == len(untainted) + len(gpu_only)


def test_a_node_field_selector_names_exactly_one_node(api, emu):
    """ValidateNodeFieldSelectorRequirement: matchFields on metadata.name takes one value with In (several nodes are
    several terms, ORed). The node probe's DaemonSet once listed all its nodes in one term, which the real API
    server refused."""
    def daemonset(terms):
        return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "pinned"},
                "spec": {"selector": {"matchLabels": {"app": "pinned"}},
                         "template": {"metadata": {"labels": {"app": "pinned"}},
                                      "spec": {"affinity": {"nodeAffinity": {
                                          "requiredDuringSchedulingIgnoredDuringExecution": {
                                              "nodeSelectorTerms": terms}}},
                                          "tolerations": [{"operator": "Exists"}],
                                          "containers": [{"name": "a", "image": "agent:1"}]}}}}

    def field(*names):
        return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": list(names)}]}
    response = api.post("/apis/apps/v1/namespaces/default/daemonsets", daemonset([field("gpu-1", "cpu-1")]))
    assert response.status == 422, response.json
    assert response.json["details"]["causes"] == [{
        "reason": "FieldValueRequired", "field": "spec.template.spec.affinity.nodeAffinity."
        "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].values",
        "message": "Required value: must be only one value when `operator` is 'In' or 'NotIn' for node field "
                   "selector"}]
    assert api.post("/apis/apps/v1/namespaces/default/daemonsets",
                    daemonset([field("gpu-1"), field("cpu-1")])).status == 201
    emu.settle()
    pods = [p for p in emu.list("pods", "default") if p["metadata"]["name"].startswith("pinned-")]
    assert sorted(p["spec"].get("nodeName") for p in pods) == ["cpu-1", "gpu-1"]


def test_statefulset_and_job_controllers(api, emu):
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
           "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                    "template": {"metadata": {"labels": {"app": "db"}},
                                 "spec": {"containers": [{"name": "db", "image": "postgres:16"}]}}}}
    api.post("/apis/apps/v1/namespaces/default/statefulsets", sts)
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "once"},
           "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "bb"}]}}}}
    api.post("/apis/batch/v1/namespaces/default/jobs", job)
    emu.settle()
    assert emu.get("statefulsets", "db", "default")["status"]["readyReplicas"] == 2
    assert {p["metadata"]["name"] for p in emu.list("pods", "default") if p["metadata"]["name"].startswith("db-")} == \
        {"db-0", "db-1"}
    conditions = {c["type"]: c["status"] for c in emu.get("jobs", "once", "default")["status"]["conditions"]}
    assert conditions["Complete"] == "True"


@pytest.mark.emulator_only("registers a scheduler in the emulator")
def test_pods_stay_pending_until_their_scheduler_exists(api, emu):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-pod"},
           "spec": {"schedulerName": "gpu-binpack-scheduler",
                    "containers": [{"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}
    api.post("/api/v1/namespaces/default/pods", pod)
    emu.settle()
    pending = emu.get("pods", "gpu-pod", "default")
    assert pending["status"]["phase"] == "Pending" and not pending["spec"].get("nodeName")
    emu.register_scheduler("gpu-binpack-scheduler")
    emu.settle()
    bound = emu.get("pods", "gpu-pod", "default")
    assert bound["spec"]["nodeName"] in ("gpu-1", "gpu-2") and bound["status"]["phase"] == "Running"


def test_scheduler_respects_resources_and_reports_why(api, emu):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "too-big"},
           "spec": {"containers": [{"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 9}}}]}}
    api.post("/api/v1/namespaces/default/pods", pod)
    emu.settle()
    condition = emu.get("pods", "too-big", "default")["status"]["conditions"][0]
    assert condition["reason"] == "Unschedulable" and "Insufficient nvidia.com/gpu" in condition["message"]


@pytest.mark.emulator_only("the emulator's controllers")
def test_controllers_can_be_switched_off(api, emu):
    emu.controllers.disable("deployment")
    api.post(DEPLOYMENTS, deployment("web"))
    emu.settle()
    assert emu.list("replicasets", "default") == []
    emu.controllers.enable("deployment")
    emu.settle()
    assert len(emu.list("replicasets", "default")) == 1


@pytest.mark.emulator_only("the emulator's kubelet")
def test_pod_logs_come_from_the_simulated_kubelet(api, emu):
    emu.controllers.pod_behaviour = lambda pod: {"log": "Test PASSED\n"}
    api.post("/api/v1/namespaces/default/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                                 "spec": {"restartPolicy": "Never",
                                                          "containers": [{"name": "c", "image": "vectoradd"}]}})
    emu.settle()
    log = api.get("/api/v1/namespaces/default/pods/p/log", accept="*/*")
    assert log.status == 200 and log.data == b"Test PASSED\n"


# --- fault injection ---------------------------------------------------------------------------------------------------
@pytest.mark.emulator_only("the emulator's fault injection")
def test_fault_returns_a_status_for_a_count_then_stops(api, emu):
    emu.faults.add("GET", r"/configmaps$", status=503, count=2, message="etcd is sad")
    codes = [api.get(CM).status for _ in range(3)]
    assert codes == [503, 503, 200]
    assert api.get("/api/v1/namespaces").status == 200


@pytest.mark.emulator_only("the emulator's fault injection")
def test_fault_after_and_delay(api, emu):
    emu.faults.add("GET", r"/configmaps$", delay=0.3, after=1, count=1)
    started = time.monotonic()
    api.get(CM)
    first = time.monotonic() - started
    started = time.monotonic()
    api.get(CM)
    second = time.monotonic() - started
    assert first < 0.3 <= second


@pytest.mark.emulator_only("the emulator's fault injection")
def test_fault_resets_the_connection(api, emu):
    emu.faults.add("POST", r"/configmaps$", reset=True)
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected, ssl.SSLError, OSError)):
        api.post(CM, configmap("a"))
    assert emu.get("configmaps", "a", "default") is None
    assert api.post(CM, configmap("a")).status == 201


@pytest.mark.emulator_only("the emulator's fault injection")
def test_fault_probability_fires_some_of_the_time(api, emu):
    emu.faults.add("GET", r"/configmaps$", status=500, count=None, probability=0.5)
    codes = [api.get(CM).status for _ in range(40)]
    assert 5 < codes.count(500) < 35


@pytest.mark.emulator_only("the emulator's request log")
def test_request_log_records_writes(api, emu):
    emu.requests.clear()
    api.get(CM)
    api.post(CM, configmap("a"))
    api.post(f"{CM}?dryRun=All", configmap("b"))
    writes = emu.requests.writes()
    assert [(w.method, w.path) for w in writes] == [("POST", CM)]
    assert len(emu.requests.writes(include_dry_run=True)) == 2
