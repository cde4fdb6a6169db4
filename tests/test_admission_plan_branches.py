"""The admission plans' branches the step tables left open: a kept certificate whose Secret drifted is rewritten
with the stored content, OPA objects no longer wanted are removed, and only the webhook configuration carries the
caBundle note (the backstop policies have no caBundle)."""
from __future__ import annotations

import dataclasses

import pytest

from gpu_bootstrap.core.refs import Ref, Verb
from gpu_bootstrap.render import admission as admission_render
from gpu_bootstrap.render import certificates as certs
from gpu_bootstrap.steps.admission import Admission, AdmissionFacts
from gpu_bootstrap.steps.admission_opa import AdmissionOpa, decide
from tests.test_step_plans import NOW, SEED, check_of, config, context, opa_facts

pytestmark = pytest.mark.unit

SECRET = Ref("v1", "Secret", "opa-tls", "gpu-bootstrap-admission")


def stored_certificate(conf) -> certs.Stored:
    return certs.Stored.from_secret(decide(conf, None, NOW, SEED, None).secret)


@pytest.mark.parametrize("drift, expected", [
    ({SECRET: "differs at metadata.labels"}, [(Verb.APPLY, SECRET, "update", "differs at metadata.labels")]),
    ({}, []),
])
def test_a_kept_certificate_whose_secret_drifted_is_written_back_unchanged(drift, expected):
    conf = config()
    stored = stored_certificate(conf)
    facts = dataclasses.replace(opa_facts(conf, stored, namespace="ours"), drift=drift)
    changes = AdmissionOpa().plan(context(conf), check_of(facts))
    assert [(c.verb, c.target, c.summary, c.reason) for c in changes] == expected
    for change in changes:  # the same certificate, key and CAs: nothing rotates, only the metadata is restored
        assert change.body == admission_render.tls_secret(conf, stored.cert_pem, stored.key_pem, stored.ca_bundle)


def test_opa_objects_no_longer_wanted_are_removed_after_the_rest():
    conf = config()
    stored = stored_certificate(conf)
    gone = [Ref("cert-manager.io/v1", "Issuer", "opa-ca", "gpu-bootstrap-admission"),
            Ref("cert-manager.io/v1", "Certificate", "opa", "gpu-bootstrap-admission")]
    facts = opa_facts(conf, stored, namespace="ours")
    facts = dataclasses.replace(facts, drift={Ref.of(facts.objects[0]): "missing"}, leftovers=gone)
    changes = AdmissionOpa().plan(context(conf), check_of(facts))
    assert [(c.verb, c.target, c.summary, c.reason) for c in changes] == [
        (Verb.APPLY, Ref.of(facts.objects[0]), "create", "missing"),
        (Verb.DELETE, gone[0], "remove", "no longer wanted by the config"),
        (Verb.DELETE, gone[1], "remove", "no longer wanted by the config")]


def test_only_the_webhook_configuration_carries_the_ca_bundle_note():
    conf = config(admission={"mode": "enforce"})
    desired = [admission_render.webhook_configuration(conf, "1.31.0", None)] + admission_render.validating_policy(conf)
    note = "caBundle: Secret gpu-bootstrap-admission/opa-tls does not exist yet"
    other = "this playbook does not deploy the bin-packing scheduler"
    facts = AdmissionFacts(desired, {Ref.of(o): "missing" for o in desired}, [], (other, note))
    changes = Admission().plan(context(conf), check_of(facts))
    assert [(c.target.kind, c.details) for c in changes] == [
        ("ValidatingWebhookConfiguration", (note,)),
        ("ValidatingAdmissionPolicy", ()),
        ("ValidatingAdmissionPolicyBinding", ())]
