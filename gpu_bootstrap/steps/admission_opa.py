"""admission-opa: deploy OPA as the admission webhook's server (its certificate in a Secret, its policy, the
Deployment, Service, NetworkPolicy and PDB) and verify it is ready, before `admission` points the API server at it
(steps/admission.py). Teardown runs in reverse: the webhook configuration goes first, OPA after it. With `engine:
vap` there is no server and this step is skipped.

The certificate: a CA and serving certificate of its own, kept only in a Secret, reused on re-runs, rotated before
expiry (render/certificates.py); the webhook trusts the old and the new CA while a rotation rolls out.
"""
from __future__ import annotations

import datetime as _dt
import os
import time
from dataclasses import dataclass, field

from gpu_bootstrap.core.catalogue import locate_pods, registry_inputs
from gpu_bootstrap.core.objects import differences, pod_ready, pod_state, toleration_for
from gpu_bootstrap.pipeline.step import FAIL, PASS, WARN, Change, Check, Ref, Step, Verb, declare
from gpu_bootstrap.security.rbac_rules import ADMISSION_KINDS, APPLY, DOCTOR, READ, RUN, WRITE, need, steering_needs
from gpu_bootstrap.render import admission as render
from gpu_bootstrap.render import admission_policy as policy_render
from gpu_bootstrap.render import certificates as certs
from gpu_bootstrap.security import pod_security
from gpu_bootstrap.steps.admission_state import GROUP, WEBHOOK_KINDS, object_drift, owned_refs, policy_for, \
    utc_now
from gpu_bootstrap.steps.node_prep import gpu_taint, no_room_warning

OPA_KINDS = (  # (apiVersion, kind) owned in OPA's namespace, in apply order
    ("v1", "ServiceAccount"), ("v1", "ConfigMap"), ("v1", "Secret"), ("apps/v1", "Deployment"), ("v1", "Service"),
    ("policy/v1", "PodDisruptionBudget"), ("networking.k8s.io/v1", "NetworkPolicy"),
    (render.CERT_MANAGER, "Issuer"), (render.CERT_MANAGER, "Certificate"),
)


@dataclass(frozen=True)
class Certificate:
    """The outcome of the certificate decision (pure, see `decide`)."""

    secret: dict | None  # the Secret to write (None: keep the stored one as it is)
    bundle: str  # the CAs the webhook must trust
    tls_hash: str  # the serving certificate's fingerprint (in the pod template)
    reason: str  # why the Secret is written ('' when it is kept)
    old_ca_kept: bool = False


@dataclass(frozen=True)
class OpaFacts:
    namespace: str  # "missing", "ours" or "theirs"
    objects: list  # the wanted objects besides the Namespace and the Secret, in apply order
    drift: dict
    leftovers: list
    stored: certs.Stored | None = field(repr=False, default=None)  # the Secret's content (generated mode)
    rolled_out: str | None = None  # the tls hash every OPA replica runs with, when the rollout is complete
    webhook: tuple[str, str] | None = None  # (kind, caBundle PEM) of our live webhook configuration
    now: _dt.datetime | None = None
    seed: bytes = field(repr=False, default=b"")
    kept_hash: str = ""  # the Secret was not read (dry runs, doctor): the certificate OPA runs with, by its hash


def decide(config, stored: certs.Stored | None, now: _dt.datetime, seed: bytes,
           rolled_out: str | None) -> Certificate:
    """Keep the stored certificate, or issue a new CA and serving certificate (rotation keeps the old CA trusted
    until every OPA replica serves the new one); drop the old CA once the rollout to the new one is complete."""
    namespace = config.admission.opa.namespace
    reason = certs.renewal_reason(stored, render.NAME, namespace, now, config.admission.rotate_before_days)
    if reason is None:
        signer = stored.signer
        bundle = stored.ca_bundle
        if len(certs.split_bundle(bundle)) > 1 and rolled_out == certs.fingerprint(stored.cert_pem):
            trimmed = certs.join_bundle([signer])
            return Certificate(render.tls_secret(config, stored.cert_pem, stored.key_pem, trimmed), trimmed,
                               certs.fingerprint(stored.cert_pem), "every replica serves the new certificate: the "
                                                                   "old CA is no longer trusted")
        return Certificate(None, bundle, certs.fingerprint(stored.cert_pem), "")
    issued = certs.issue(render.NAME, namespace, now, seed)
    keep_old = stored is not None and stored.signer is not None and now < certs.inspect(stored.cert_pem).not_after
    bundle = certs.join_bundle([issued.ca_pem] + ([stored.signer] if keep_old else []))
    return Certificate(render.tls_secret(config, issued.cert_pem, issued.key_pem, bundle), bundle,
                       certs.fingerprint(issued.cert_pem), reason, keep_old)


class AdmissionOpa(Step):
    id = "admission-opa"
    title = "Deploy OPA, the admission webhook's server"
    clock = staticmethod(utc_now)  # tests replace it with a clock near expiry
    entropy = staticmethod(lambda: os.urandom(32))


    def namespaces(self, ctx) -> list[str]:
        return [ctx.config.admission.opa.namespace]

    def inputs(self, ctx) -> dict:
        settings = ctx.config.admission
        return {"admission": settings.model_dump(mode="json"), "policy": policy_for(ctx)[0].__dict__,
                "kube": ctx.server_version(), **registry_inputs(ctx.config)}

    def _objects(self, ctx, tls_hash: str, nodes: list[dict], policy=None) -> list[dict]:
        """`nodes`: the cluster's nodes; when tainting the GPU nodes leaves none free, OPA tolerates the taint.
        `policy`: the admission policy OPA serves (admission_state.policy_for; by default, steering)."""
        config = ctx.config
        tolerate = None
        if no_room_warning(nodes, config, ctx.options.playbook):
            tolerate = toleration_for(gpu_taint(config, ctx.options.playbook))
        policy = policy or policy_render.of(config, True, gpu_taint(config, ctx.options.playbook))
        objects = [render.service_account(config), render.policy_configmap(config, policy)]
        if config.admission.certificates == "cert-manager":
            objects += render.cert_manager_objects(config)
        objects += [render.deployment(config, tls_hash, tolerate, policy), render.service(config),
                    render.network_policy(config)]
        if pdb := render.disruption_budget(config):
            objects.append(pdb)
        return locate_pods(objects, config.registry)  # OPA's image from registry.mirror, when set

    def check(self, ctx) -> Check:
        config = ctx.config
        ns = config.admission.opa.namespace
        live_ns = ctx.kube.get("v1", "Namespace", ns)
        namespace = "missing" if live_ns is None else "ours" if (live_ns["metadata"].get("labels") or {}).get(
            "app.kubernetes.io/managed-by") == "gpu-bootstrap" else "theirs"
        generated = config.admission.certificates == "generated"
        secret, kept = self._secret(ctx, ns)
        stored = certs.Stored.from_secret(secret) if generated else None
        rolled_out = self._rolled_out(ctx)
        webhook = self._live_webhook(ctx)
        now, seed = self.clock(), self.entropy()
        cert = decide(config, stored, now, seed, rolled_out) if generated and not kept else None
        tls_hash = kept or (cert.tls_hash if cert else "")
        objects = self._objects(ctx, tls_hash, ctx.kube.list("v1", "Node"), policy_for(ctx)[0])
        drift = object_drift(ctx.kube, objects)
        if namespace == "missing":
            drift[Ref("v1", "Namespace", ns)] = "missing"
        elif namespace == "ours" and (unlabelled := _labels_missing(render.namespace(config), live_ns)):
            # one an admin made for `rbac --for up` (its header's command) has our managed-by label only
            drift[Ref("v1", "Namespace", ns)] = "needs " + ", ".join(f"{k}={v}" for k, v in unlabelled.items())
        if generated and secret is not None and cert.secret is None:
            if paths := differences({k: v for k, v in render.tls_secret(config, "", "", "").items() if k != "data"},
                                    secret):
                drift[Ref("v1", "Secret", render.SECRET, ns)] = "differs at " + ", ".join(paths[:3])
        keep = {Ref.of(o) for o in objects} | {Ref("v1", "Secret", render.SECRET, ns)}
        leftovers = owned_refs(ctx.kube, OPA_KINDS, ns, keep)
        facts = OpaFacts(namespace, objects, drift, leftovers, stored, rolled_out, webhook, now, seed, kept)
        pending = {}
        if cert and cert.secret is not None:
            pending[Ref("v1", "Secret", render.SECRET, ns)] = cert.reason
        pending.update(drift)
        if pending or leftovers:
            parts = [f"{ref.kind} {ref.name}: {why}" for ref, why in list(pending.items())[:4]]
            parts += [f"{ref.kind} {ref.name}: no longer wanted" for ref in leftovers[:2]]
            return Check(WARN, "; ".join(parts), facts=facts)
        state = self._running(ctx)
        if state.status != PASS:
            return Check(WARN, state.message, facts=facts)
        expiry = ""
        if stored is not None:
            expiry = f", certificate valid for {certs.days_left(stored.cert_pem, now):.0f} more day(s)"
        return Check(PASS, f"OPA runs in {ns} ({state.message}{expiry})", done=True, facts=facts)

    def plan(self, ctx, check: Check) -> list[Change]:
        facts: OpaFacts = check.facts
        config = ctx.config
        ns = config.admission.opa.namespace
        changes = []
        if facts.namespace == "missing":
            changes.append(Change(Verb.APPLY, Ref("v1", "Namespace", ns), "create", "OPA's own namespace (exempt "
                                  f"from the policy; {pod_security.ENFORCE}={pod_security.RESTRICTED}: OPA's pods "
                                  "pass it)", render.namespace(config)))
        elif Ref("v1", "Namespace", ns) in facts.drift:
            changes.append(Change(Verb.APPLY, Ref("v1", "Namespace", ns),
                                  "label " + facts.drift[Ref("v1", "Namespace", ns)].removeprefix("needs "),
                                  "OPA's own namespace, as `up` makes it: its pods pass the restricted profile",
                                  render.namespace(config)))
        cert = decide(config, facts.stored, facts.now, facts.seed, facts.rolled_out) \
            if config.admission.certificates == "generated" and not facts.kept_hash else None
        secret_ref = Ref("v1", "Secret", render.SECRET, ns)
        if cert is not None and cert.secret is not None:
            if facts.webhook is not None and not _bundle_has(facts.webhook[1], cert.bundle):
                # First make the API server trust the new CA (beside the old one), then switch the certificate.
                changes.append(Change(Verb.PATCH, Ref(f"{GROUP}/v1", facts.webhook[0], render.CONFIG_NAME),
                                      "trust the new CA beside the old one", "certificate rotation: no request may "
                                      "fail while the replicas switch", _ca_patch(cert.bundle), "json"))
            info = certs.inspect(certs.split_bundle(cert.bundle)[0])
            details = (f"new CA {info.subject}, valid until {info.not_after:%Y-%m-%d}",
                       f"ca.crt holds {len(certs.split_bundle(cert.bundle))} CA(s); the private key stays in the Secret")
            trim = facts.stored is not None and cert.tls_hash == certs.fingerprint(facts.stored.cert_pem)
            summary = "create" if facts.stored is None else "drop the old CA" if trim else "rotate"
            changes.append(Change(Verb.APPLY, secret_ref, summary, cert.reason, cert.secret,
                                  details=() if trim else details))
        elif secret_ref in facts.drift and cert is not None:
            body = render.tls_secret(config, facts.stored.cert_pem, facts.stored.key_pem, facts.stored.ca_bundle)
            changes.append(Change(Verb.APPLY, secret_ref, "update", facts.drift[secret_ref], body))
        for obj in facts.objects:
            ref = Ref.of(obj)
            why = facts.drift.get(ref)
            if why:
                changes.append(Change(Verb.APPLY, ref, "create" if why == "missing" else "update", why, obj))
        for ref in facts.leftovers:
            changes.append(Change(Verb.DELETE, ref, "remove", "no longer wanted by the config"))
        return changes

    # --- state ---------------------------------------------------------------------------------------------------
    def _secret(self, ctx, ns: str) -> tuple[dict | None, str]:
        """(the TLS Secret, ""); or, where it may not be read (dry runs and doctor read no Secret values), (None, the
        certificate hash OPA's pods run with): what is deployed is kept, and whether it is due for rotation is
        `up`'s to judge."""
        from gpu_bootstrap.core.errors import ClusterError
        try:
            return ctx.kube.get("v1", "Secret", render.SECRET, ns), ""
        except ClusterError as error:
            if error.status != 403:
                raise
            live = self._deployment(ctx)
            if live is None:  # no OPA yet: planned as on a fresh cluster (`up` reuses a Secret it finds)
                return None, ""
            annotations = ((live["spec"]["template"].get("metadata") or {}).get("annotations") or {})
            return None, annotations.get(render.TLS_HASH, "")

    def _deployment(self, ctx) -> dict | None:
        return ctx.kube.get("apps/v1", "Deployment", render.NAME, ctx.config.admission.opa.namespace)

    def _rolled_out(self, ctx) -> str | None:
        """The tls hash of the pod template when every replica is updated to it and available, else None."""
        deploy = self._deployment(ctx)
        if deploy is None:
            return None
        status, wanted = deploy.get("status") or {}, (deploy.get("spec") or {}).get("replicas", 1)
        complete = status.get("observedGeneration", 0) >= deploy["metadata"].get("generation", 1) and \
            status.get("updatedReplicas", 0) == wanted and status.get("replicas", 0) == wanted and \
            status.get("availableReplicas", 0) >= wanted
        template = ((deploy.get("spec") or {}).get("template") or {}).get("metadata") or {}
        return (template.get("annotations") or {}).get(render.TLS_HASH) if complete else None

    def _live_webhook(self, ctx) -> tuple[str, str] | None:
        for kind in WEBHOOK_KINDS:
            live = ctx.kube.get(f"{GROUP}/v1", kind, render.CONFIG_NAME)
            if live and (live["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "gpu-bootstrap":
                hooks = live.get("webhooks") or [{}]
                bundle = (hooks[0].get("clientConfig") or {}).get("caBundle") or ""
                try:
                    import base64
                    return kind, base64.b64decode(bundle).decode()
                except (ValueError, UnicodeDecodeError):
                    return kind, ""
        return None

    def _running(self, ctx) -> Check:
        settings = ctx.config.admission
        deploy = self._deployment(ctx)
        ns = settings.opa.namespace
        if deploy is None:
            return Check(WARN, f"Deployment {ns}/{render.NAME} does not exist")
        status = deploy.get("status") or {}
        wanted = settings.opa.replicas
        rolled = status.get("observedGeneration", 0) >= deploy["metadata"].get("generation", 1) and \
            status.get("updatedReplicas", 0) == wanted and status.get("replicas", 0) == wanted
        if not rolled or status.get("availableReplicas", 0) < wanted:
            pods = ctx.kube.list("v1", "Pod", ns, label_selector=f"app.kubernetes.io/name={render.NAME}")
            trouble = next((f"; pod {p['metadata']['name']}: {pod_state(p)}" for p in pods if not pod_ready(p)), "")
            if "ImagePull" in trouble or "ErrImage" in trouble:
                trouble += " — set admission.opa.image to a mirror that has it"
            return Check(WARN, f"{status.get('availableReplicas', 0)} of {wanted} OPA replica(s) available{trouble}")
        if settings.certificates == "cert-manager" and ctx.kube.get("v1", "Secret", render.SECRET, ns) is None:
            return Check(WARN, f"cert-manager has not issued Secret {ns}/{render.SECRET} yet")
        return Check(PASS, f"{wanted} replica(s) ready")

    def verify(self, ctx) -> Check:
        timeout = ctx.config.admission.wait_timeout
        deadline = time.monotonic() + timeout
        while True:
            state = self._running(ctx)
            if state.status == PASS or time.monotonic() >= deadline:
                break
            time.sleep(1.0)
        if state.status != PASS:
            return Check(FAIL, f"{state.message} after {timeout}s")
        return Check(PASS, f"OPA runs in {ctx.config.admission.opa.namespace} ({state.message})", done=True)

    def undo_plan(self, ctx) -> list[Change]:
        ns = ctx.config.admission.opa.namespace
        changes = [Change(Verb.DELETE, ref, "remove", "teardown of OPA")
                   for ref in reversed(owned_refs(ctx.kube, OPA_KINDS, ns, set()))]
        live_ns = ctx.kube.get("v1", "Namespace", ns)
        if live_ns and (live_ns["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "gpu-bootstrap":
            changes.append(Change(Verb.DELETE, Ref("v1", "Namespace", ns), "remove", "OPA's namespace (created by "
                                                                                      "gpu-bootstrap)"))
        return changes


def _bundle_has(live_bundle: str, wanted: str) -> bool:
    have = {c.strip() for c in certs.split_bundle(live_bundle)}
    return all(c.strip() in have for c in certs.split_bundle(wanted))


def _ca_patch(bundle: str) -> list[dict]:
    return [{"op": "test", "path": "/webhooks/0/name", "value": render.WEBHOOK_NAME},
            {"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": certs.b64(bundle)}]


# --- admission --------------------------------------------------------------------------------------------------------


def _labels_missing(wanted: dict, live: dict) -> dict[str, str]:
    """The labels of the wanted object the live one lacks or holds with another value."""
    have = live["metadata"].get("labels") or {}
    return {k: v for k, v in (wanted["metadata"].get("labels") or {}).items() if have.get(k) != v}


def rbac_needs(config) -> dict:
    cert_manager = config.admission.certificates == "cert-manager"
    return {
        READ: [*steering_needs(),
               need("", "secrets serviceaccounts configmaps services", "get list", "opa"),
               need("apps", "deployments", "get list", "opa"),
               need("policy", "poddisruptionbudgets", "get list", "opa"),
               need("networking.k8s.io", "networkpolicies", "get list", "opa"),
               need("admissionregistration.k8s.io", ADMISSION_KINDS, "get list"), need("", "nodes", "list"),
               *([need("cert-manager.io", "certificates issuers", "get list", "opa")] if cert_manager else [])],
        WRITE: [need("", "namespaces", APPLY),
                need("networking.k8s.io", "networkpolicies", APPLY, "opa"),
                need("", "secrets serviceaccounts configmaps services", APPLY, "opa"),
                need("apps", "deployments", APPLY, "opa"), need("policy", "poddisruptionbudgets", APPLY, "opa"),
                need("admissionregistration.k8s.io", "mutatingwebhookconfigurations validatingwebhookconfigurations",
                     "patch"),
                *([need("cert-manager.io", "certificates issuers", APPLY, "opa")] if cert_manager else [])],
        RUN: [need("", "secrets serviceaccounts configmaps services", "delete", "opa"),
              need("networking.k8s.io", "networkpolicies", "delete", "opa"),
              need("apps", "deployments", "delete", "opa"), need("policy", "poddisruptionbudgets", "delete", "opa"),
              need("", "pods", "list", "opa"), need("discovery.k8s.io", "endpointslices", "list", "opa")],
        DOCTOR: [need("", "pods", "list", "opa"), need("discovery.k8s.io", "endpointslices", "list", "opa"),
                 need("networking.k8s.io", "networkpolicies", "list", "opa"), need("", "pods", "create", "opa")]}


DECLARATION = declare(
    AdmissionOpa, section="admission", docs="steps/admission.md", needs=rbac_needs,
    enabled=lambda config: config.admission.enabled and config.admission.engine == "opa",
    summary="deploys OPA as the admission webhook's server: a CA and serving certificate of its own (kept only in a "
            "Secret, reused on re-runs, rotated before expiry), the policy, two hardened replicas off the GPU nodes")
