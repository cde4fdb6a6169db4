"""The monitoring plan's branches the step tables left open: a pinned chart version the table does not know is
installed under its own number (no release line to name), and an object that differs is updated, not created."""
from __future__ import annotations

import dataclasses

import pytest

from gpu_bootstrap.core import versions
from gpu_bootstrap.core.refs import Ref, Verb
from gpu_bootstrap.render import monitoring as monitoring_render
from gpu_bootstrap.steps.monitoring import Monitoring
from tests.test_step_plans import check_of, config, context, monitoring_facts

pytestmark = pytest.mark.unit

NOT_INSTALLED = {"up_to_date": False, "reason": "not installed", "installed": None}


def test_a_pinned_version_outside_the_table_is_installed_under_its_own_number():
    conf = config(monitoring={"version": "99.1.0"})
    target = monitoring_render.install_target(conf.monitoring, "why")
    pin = versions.check_pin(versions.catalogue("kube-prometheus-stack"), "99.1.0", "1.24.0")
    assert pin.release is None  # the case under test: no release line to show
    facts = dataclasses.replace(monitoring_facts(conf, target, NOT_INSTALLED, {}), version="99.1.0", choice=pin)
    [helm] = Monitoring().plan(context(conf), check_of(facts))
    assert (helm.verb, helm.summary, helm.reason) == (Verb.HELM_UPGRADE, "install: kube-prometheus-stack 99.1.0",
                                                      pin.reason)
    without = dataclasses.replace(facts, choice=None)
    [helm] = Monitoring().plan(context(conf), check_of(without))
    assert (helm.summary, helm.reason) == ("install: kube-prometheus-stack 99.1.0", "")


@pytest.mark.parametrize("why, summary", [("missing", "create"), ("differs at spec.groups", "update")])
def test_a_drifted_object_is_created_or_updated(why, summary):
    conf = config()
    target = monitoring_render.install_target(conf.monitoring, "why")
    desired = monitoring_render.objects(target)
    rule = Ref.of(desired[0])
    facts = monitoring_facts(conf, target, {"up_to_date": True, "reason": "", "installed": "72.9.1"}, {rule: why})
    [change] = Monitoring().plan(context(conf), check_of(facts))
    assert (change.verb, change.target, change.summary, change.reason) == (
        Verb.APPLY, rule, summary, f"{why}; labelled for install mode ({target.prometheus})")
