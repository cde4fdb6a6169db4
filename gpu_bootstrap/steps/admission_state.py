"""What both admission steps read of the cluster: whether the bin-packing scheduler runs (admission steers GPU pods
only to one that does), the admission policy that follows from it, and the helpers that compare our objects with the
live ones."""
from __future__ import annotations

import datetime as _dt

from gpu_bootstrap.core.errors import ClusterError, Unreachable
from gpu_bootstrap.core.objects import differences
from gpu_bootstrap.pipeline.step import Ref
from gpu_bootstrap.render import admission as render
from gpu_bootstrap.render import admission_policy as policy_render
from gpu_bootstrap.steps.node_prep import gpu_taint

GROUP = render.GROUP
MAP_VERSIONS = (f"{GROUP}/v1", f"{GROUP}/v1beta1")
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def steering(ctx) -> tuple[bool, str]:
    """(steer GPU pods to the bin-packing scheduler?, why). Only to a scheduler that runs: its Deployment has an
    available replica and one of its pods holds the leader Lease, or this very run deploys it before admission (its
    changes went through the gate; the run stops before admission if it does not come up). Otherwise (skipped,
    not yet ready, gone) GPU pods keep their scheduler: steered to a scheduler that does not run, they would wait
    for good."""
    from gpu_bootstrap.steps.binpack_scheduler import BinpackScheduler
    section = ctx.config.scheduler
    if not section.enabled:
        return False, "scheduler.enabled is false: no bin-packing scheduler to steer GPU pods to"
    if any(step == "binpack-scheduler" for step, _change in getattr(ctx.gate, "submitted", ())):
        return True, f"this run deploys {section.name} before admission"
    deployment = ctx.kube.get("apps/v1", "Deployment", section.name, section.namespace)
    if deployment is None:
        return False, f"{section.name} is not deployed (no Deployment {section.namespace}/{section.name})"
    if not (deployment.get("status") or {}).get("availableReplicas"):
        return False, f"{section.name} has no available replica yet"
    pods = ctx.kube.list("v1", "Pod", section.namespace, label_selector=f"app.kubernetes.io/name={section.name}")
    leader = BinpackScheduler()._leader(ctx, pods)
    if leader is None:
        return False, f"no pod of {section.name} holds its Lease {section.namespace}/{section.lease}"
    return True, f"{section.name} runs (leader {leader})"


def policy_for(ctx) -> tuple[policy_render.Policy, str]:
    """The admission policy for this cluster now: steering only to a scheduler that runs, and the GPU taint's
    toleration when this playbook taints the GPU nodes. The second value says why it does not steer ('' when it
    does)."""
    steer, why = steering(ctx)
    policy = policy_render.of(ctx.config, steer, gpu_taint(ctx.config, ctx.options.playbook))
    return policy, "" if steer else (f"GPU pods are not steered: {why}; they keep their scheduler"
                                     + (" and get the GPU taint's toleration" if policy.toleration and
                                        ctx.config.admission.mode == "mutate" else "")
                                     + " (gpu-bootstrap up steers them once it runs)")


def utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _same_object(ref: Ref) -> tuple:
    """An object is one object whatever version it is read at (a MutatingAdmissionPolicy is served as v1 and, with
    the beta switched on, as v1beta1 too)."""
    return ref.api_version.rpartition("/")[0], ref.kind, ref.name, ref.namespace


def owned_refs(kube, kinds, namespace: str | None, exclude: set) -> list[Ref]:
    """Our objects of these (apiVersion, kind)s that are not in `exclude`, each once, whichever versions serve it."""
    found, seen = [], {_same_object(ref) for ref in exclude}
    for api_version, kind in kinds:
        try:
            items = kube.list(api_version, kind, namespace, label_selector=render.OWNED_SELECTOR)
        except Unreachable:
            raise
        except ClusterError as error:
            if (api_version, kind) == ("v1", "Secret") and error.status == 403:
                continue  # dry runs and doctor read no Secret: a leftover one is up's to find
            if error.status:
                raise
            continue  # a kind this cluster does not serve holds nothing of ours
        for obj in items:
            ref = Ref(api_version, kind, obj["metadata"]["name"], obj["metadata"].get("namespace"))
            if _same_object(ref) not in seen:
                seen.add(_same_object(ref))
                found.append(ref)
    return found


def object_drift(kube, desired: list[dict]) -> dict:
    drift = {}
    for obj in desired:
        ref = Ref.of(obj)
        live = kube.get(ref.api_version, ref.kind, ref.name, ref.namespace)
        if live is None:
            drift[ref] = "missing"
        elif paths := differences(obj, live):
            drift[ref] = "differs at " + ", ".join(paths[:3])
    return drift


# --- admission-opa ----------------------------------------------------------------------------------------------------
