"""admission-opa and admission: keep every GPU pod on the bin-packing scheduler.

Two steps, so that the runner's order does what matters most for a webhook: `admission-opa` deploys OPA (its
certificate in a Secret, its policy, the Deployment, Service and PDB) and verifies it is ready; only then does
`admission` create the webhook configuration (and, from Kubernetes 1.30, the in-process backstop policy) and prove
with server-side dry runs that a GPU pod is steered and a CPU pod is not. Teardown runs in reverse: the webhook
configuration goes first, OPA after it. With `engine: vap` there is no server: `admission-opa` is skipped and
`admission` creates admission policies only.

The webhook's failurePolicy is Ignore (docs/steps/admission.md): a broken OPA never blocks a pod; the
backstop policy, evaluated inside the API server, rejects GPU pods that were not steered, with the field to set.
"""
from __future__ import annotations

import datetime as _dt
import os
import time
from dataclasses import dataclass, field

from gpu_bootstrap.core.errors import ClusterError, ConfigError, Unreachable
from gpu_bootstrap.core.catalogue import locate_pods, registry_inputs
from gpu_bootstrap.core.objects import differences, pod_ready, pod_state, toleration_for
from gpu_bootstrap.pipeline.step import FAIL, PASS, WARN, Change, Check, ObjectsFacts, Ref, Step, Verb
from gpu_bootstrap.render import admission as render
from gpu_bootstrap.render import admission_policy as policy_render
from gpu_bootstrap.render import certificates as certs
from gpu_bootstrap.security import pod_security
from gpu_bootstrap.core.versions import minor_of
from gpu_bootstrap.steps.node_prep import gpu_taint, no_room_warning

GROUP = render.GROUP
OPA_KINDS = (  # (apiVersion, kind) owned in OPA's namespace, in apply order
    ("v1", "ServiceAccount"), ("v1", "ConfigMap"), ("v1", "Secret"), ("apps/v1", "Deployment"), ("v1", "Service"),
    ("policy/v1", "PodDisruptionBudget"), ("networking.k8s.io/v1", "NetworkPolicy"),
    (render.CERT_MANAGER, "Issuer"), (render.CERT_MANAGER, "Certificate"),
)
MAP_VERSIONS = (f"{GROUP}/v1", f"{GROUP}/v1beta1")
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def served(kube, api_version: str, kind: str) -> bool:
    """Whether API discovery shows the kind. A failure to ask is not an answer: it propagates (unknown ≠ absent)."""
    try:
        kube.resource(api_version, kind)
        return True
    except Unreachable:
        raise
    except ClusterError as error:
        if error.status:  # 403, 500, ...: we could not read discovery
            raise
        return False  # "the cluster does not serve …" / "serves no …"


def _owned(kube, kinds, namespace: str | None, exclude: set) -> list[Ref]:
    found = []
    for api_version, kind in kinds:
        try:
            items = kube.list(api_version, kind, namespace, label_selector=render.OWNED_SELECTOR)
        except Unreachable:
            raise
        except ClusterError as error:
            if error.status:
                raise
            continue  # a kind this cluster does not serve holds nothing of ours
        for obj in items:
            ref = Ref(api_version, kind, obj["metadata"]["name"], obj["metadata"].get("namespace"))
            if ref not in exclude and ref not in found:
                found.append(ref)
    return found


def _drift(kube, desired: list[dict]) -> dict:
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

    def enabled(self, ctx) -> bool:
        return ctx.config.admission.enabled and ctx.config.admission.engine == "opa"

    def inputs(self, ctx) -> dict:
        settings = ctx.config.admission
        return {"admission": settings.model_dump(mode="json"), "policy": policy_render.of(ctx.config).__dict__,
                "kube": ctx.server_version(), **registry_inputs(ctx.config)}

    def _objects(self, ctx, tls_hash: str, nodes: list[dict]) -> list[dict]:
        """`nodes`: the cluster's nodes; when tainting the GPU nodes leaves none free, OPA tolerates the taint."""
        config = ctx.config
        tolerate = None
        if no_room_warning(nodes, config, ctx.options.playbook):
            tolerate = toleration_for(gpu_taint(config, ctx.options.playbook))
        objects = [render.service_account(config), render.policy_configmap(config)]
        if config.admission.certificates == "cert-manager":
            objects += render.cert_manager_objects(config)
        objects += [render.deployment(config, tls_hash, tolerate), render.service(config),
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
        secret = ctx.kube.get("v1", "Secret", render.SECRET, ns)
        stored = certs.Stored.from_secret(secret) if generated else None
        rolled_out = self._rolled_out(ctx)
        webhook = self._live_webhook(ctx)
        now, seed = self.clock(), self.entropy()
        cert = decide(config, stored, now, seed, rolled_out) if generated else None
        objects = self._objects(ctx, cert.tls_hash if cert else "", ctx.kube.list("v1", "Node"))
        drift = _drift(ctx.kube, objects)
        if namespace == "missing":
            drift[Ref("v1", "Namespace", ns)] = "missing"
        elif namespace == "ours" and pod_security.enforced(live_ns) != pod_security.RESTRICTED:
            drift[Ref("v1", "Namespace", ns)] = f"needs {pod_security.ENFORCE}={pod_security.RESTRICTED}"
        if generated and secret is not None and cert.secret is None:
            if paths := differences({k: v for k, v in render.tls_secret(config, "", "", "").items() if k != "data"},
                                    secret):
                drift[Ref("v1", "Secret", render.SECRET, ns)] = "differs at " + ", ".join(paths[:3])
        keep = {Ref.of(o) for o in objects} | {Ref("v1", "Secret", render.SECRET, ns)}
        leftovers = _owned(ctx.kube, OPA_KINDS, ns, keep)
        facts = OpaFacts(namespace, objects, drift, leftovers, stored, rolled_out, webhook, now, seed)
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
                                  f"label {pod_security.ENFORCE}={pod_security.RESTRICTED}",
                                  "OPA's own namespace: its pods pass the restricted profile", render.namespace(config)))
        cert = decide(config, facts.stored, facts.now, facts.seed, facts.rolled_out) \
            if config.admission.certificates == "generated" else None
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
                   for ref in reversed(_owned(ctx.kube, OPA_KINDS, ns, set()))]
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
AdmissionFacts = ObjectsFacts


class Admission(Step):
    id = "admission"
    title = "Keep GPU pods on the bin-packing scheduler (admission)"

    def enabled(self, ctx) -> bool:
        return ctx.config.admission.enabled

    def inputs(self, ctx) -> dict:
        return {"admission": ctx.config.admission.model_dump(mode="json"),
                "policy": policy_render.of(ctx.config).__dict__, "kube": ctx.server_version()}

    def _refuse_vap(self, kube_version: str, mode: str, why: str) -> ConfigError:
        return ConfigError(
            f"admission.engine: vap cannot {'mutate' if mode == 'mutate' else 'enforce'} on Kubernetes "
            f"{'.'.join(map(str, minor_of(kube_version)))}: {why}",
            "engine vap works with mode enforce from 1.30 (ValidatingAdmissionPolicy) and mode mutate where API "
            "discovery shows MutatingAdmissionPolicy (admissionregistration.k8s.io/v1beta1 on 1.34-1.35 when enabled, "
            "v1 from 1.36); on other clusters use admission.engine: opa (nothing was changed)")

    def _refuse_without_opa(self, ctx) -> None:
        """`up --only admission` on a cluster with no OPA would make a webhook with no server and a backstop that
        then rejects every GPU pod (nothing steers them). Refuse, naming the step to run first."""
        selected = ctx.options.selected
        if not selected or "admission-opa" in selected:
            return
        ns = ctx.config.admission.opa.namespace
        if ctx.kube.get("apps/v1", "Deployment", render.NAME, ns) is None:
            raise ConfigError(
                f"admission: OPA is not deployed (no Deployment {ns}/{render.NAME}) and this run does not include the "
                f"admission-opa step: the webhook would have no server, and the backstop would reject every GPU pod",
                "run `gpu-bootstrap up --only admission-opa,admission` (or without --only); nothing was changed")

    def _labelled_namespaces(self, ctx) -> list[str]:
        """Namespaces still carrying the old opt-out label, which no longer exempts anything."""
        exempt = set(policy_render.of(ctx.config).exempt_namespaces)
        try:
            found = ctx.kube.list("v1", "Namespace", label_selector=f"{policy_render.IGNORE_LABEL}="
                                                                    f"{policy_render.IGNORE_VALUE}")
        except ClusterError as error:
            if isinstance(error, Unreachable) or error.status:
                raise
            return []
        return sorted(n["metadata"]["name"] for n in found if n["metadata"]["name"] not in exempt)

    def desired(self, ctx) -> tuple[list[dict], list[str]]:
        """The objects to apply, in order, and notes for the plan. Raises ConfigError for what cannot work here."""
        config, version = ctx.config, ctx.server_version()
        settings = config.admission
        notes = []
        if labelled := self._labelled_namespaces(ctx):
            notes.append(f"namespace(s) {', '.join(labelled[:5])} carry {policy_render.IGNORE_LABEL}="
                         f"{policy_render.IGNORE_VALUE}, which no longer exempts anything (anyone who may label a "
                         f"namespace could use it): list them in admission.exempt_namespaces if they must stay exempt")
        if "binpack-scheduler" not in ctx.options.playbook or not config.scheduler.enabled:
            notes.append(f"this playbook does not deploy the bin-packing scheduler: make sure a scheduler named "
                         f"{config.scheduler.name} runs, or steered GPU pods stay Pending")
        vap = served(ctx.kube, f"{GROUP}/v1", "ValidatingAdmissionPolicy") if render.cel_available(version) else False
        if settings.engine == "vap":
            if settings.mode == "enforce":
                if not vap:
                    raise self._refuse_vap(version, "enforce", "ValidatingAdmissionPolicy (GA in 1.30) is not served")
                return render.validating_policy(config), notes
            version_served = next((v for v in MAP_VERSIONS if served(ctx.kube, v, "MutatingAdmissionPolicy")), None)
            if version_served is None:
                raise self._refuse_vap(version, "mutate", "API discovery shows no MutatingAdmissionPolicy")
            # The backstop too: it rejects the GPU pods that name a node, which no mutation can steer.
            return render.mutating_policy(config, version_served) + (
                render.validating_policy(config) if vap else []), notes
        self._refuse_without_opa(ctx)
        bundle = None
        if settings.certificates == "generated":
            stored = certs.Stored.from_secret(ctx.kube.get("v1", "Secret", render.SECRET, settings.opa.namespace))
            if stored is None:
                notes.append(f"caBundle: Secret {settings.opa.namespace}/{render.SECRET} does not exist yet (the "
                             f"admission-opa step creates it before this step runs)")
            else:
                bundle = stored.ca_bundle
        objects = [render.webhook_configuration(config, version, bundle)]
        if vap:
            objects += render.validating_policy(config)
        else:
            notes.append(f"Kubernetes {'.'.join(map(str, minor_of(version)))} has no CEL admission (1.30+): every "
                         f"pod created outside the exempt namespaces reaches OPA, and there is no in-process backstop")
        return objects, notes

    def check(self, ctx) -> Check:
        desired, notes = self.desired(ctx)
        drift = _drift(ctx.kube, desired)
        keep = {Ref.of(o) for o in desired}
        kinds = [(f"{GROUP}/v1", k) for k in WEBHOOK_KINDS]
        if render.cel_available(ctx.server_version()):
            kinds += [(f"{GROUP}/v1", "ValidatingAdmissionPolicyBinding"), (f"{GROUP}/v1", "ValidatingAdmissionPolicy")]
            kinds += [(v, k) for v in MAP_VERSIONS for k in ("MutatingAdmissionPolicyBinding",
                                                             "MutatingAdmissionPolicy")]
        leftovers = _owned(ctx.kube, kinds, None, keep)
        facts = AdmissionFacts(desired, drift, leftovers, tuple(notes))
        if drift or leftovers:
            parts = [f"{ref.kind} {ref.name}: {why}" for ref, why in drift.items()]
            parts += [f"{ref.kind} {ref.name}: no longer wanted" for ref in leftovers]
            return Check(WARN, "; ".join(parts[:4]), facts=facts, warnings=notes)
        what = ", ".join(sorted({o["kind"] for o in desired}))
        return Check(PASS, f"{ctx.config.admission.mode} GPU pods to {ctx.config.scheduler.name} ({what})", done=True,
                     facts=facts, warnings=notes)

    def plan(self, ctx, check: Check) -> list[Change]:
        facts: AdmissionFacts = check.facts
        return facts.changes(lambda ref: [n for n in facts.notes if n.startswith("caBundle")]
                             if "Webhook" in ref.kind else [])

    # --- proving it --------------------------------------------------------------------------------------------------
    def probe_namespace(self, ctx) -> str:
        exempt = set(policy_render.of(ctx.config).exempt_namespaces)
        for candidate in ("default", "gpu-bootstrap"):
            if candidate not in exempt and ctx.kube.get("v1", "Namespace", candidate) is not None:
                return candidate
        raise ClusterError("no namespace to probe admission in ('default' and 'gpu-bootstrap' are missing or exempt)")

    def probe(self, ctx) -> list[tuple[str, bool, str]]:
        """Server-side dry runs (they pass through admission, store nothing): (what, as expected, detail)."""
        config = ctx.config
        ns = self.probe_namespace(ctx)
        scheduler = config.scheduler.name
        results = []
        try:
            answer = ctx.kube.create(render.sample_pod("gpu-bootstrap-admission-probe-gpu", ns), dry_run=True)
            got = (answer.get("spec") or {}).get("schedulerName")
            if config.admission.mode == "mutate":
                results.append(("GPU pod", got == scheduler, f"schedulerName {got}"))
            else:
                results.append(("GPU pod", False, f"admitted with schedulerName {got}, not rejected"))
        except ClusterError as error:
            if isinstance(error, Unreachable) or not error.status:
                raise
            ok = config.admission.mode == "enforce" and error.status in (400, 403, 422) and \
                "spec.schedulerName" in error.message
            results.append(("GPU pod", ok, f"rejected ({error.status}): {error.message}"))
        bound = render.sample_pod("gpu-bootstrap-admission-probe-bound", ns, node_name=(
            config.nodes[0].name if config.nodes else "gpu-bootstrap-probe"))
        results.append(self._probe_bound(ctx, bound))
        try:
            answer = ctx.kube.create(render.sample_pod("gpu-bootstrap-admission-probe-cpu", ns, gpu=False), dry_run=True)
            got = (answer.get("spec") or {}).get("schedulerName")
            results.append(("CPU pod", got in (None, policy_render.DEFAULT_SCHEDULER), f"schedulerName {got}"))
        except ClusterError as error:
            if isinstance(error, Unreachable) or not error.status:
                raise
            results.append(("CPU pod", False, f"rejected ({error.status}): {error.message}"))
        return results

    @staticmethod
    def _probe_bound(ctx, pod: dict) -> tuple[str, bool, str]:
        """A GPU pod that names a node, sent by us (not a kubelet): rejected in both modes."""
        what = "GPU pod naming a node (not sent by a node)"
        try:
            answer = ctx.kube.create(pod, dry_run=True)
        except ClusterError as error:
            if isinstance(error, Unreachable) or not error.status:
                raise
            ok = error.status in (400, 403, 422) and "spec.nodeName" in error.message
            return what, ok, f"rejected ({error.status}): {error.message}"
        return what, False, f"admitted with schedulerName {(answer.get('spec') or {}).get('schedulerName')}"

    def verify(self, ctx) -> Check:
        timeout = ctx.config.admission.wait_timeout
        deadline = time.monotonic() + timeout
        while True:
            results = self.probe(ctx)
            if all(ok for _w, ok, _d in results) or time.monotonic() >= deadline:
                break
            time.sleep(1.0)
        failed = [f"{what}: {detail}" for what, ok, detail in results if not ok]
        if failed:
            return Check(FAIL, "admission does not behave as configured after "
                               f"{timeout}s — " + "; ".join(failed))
        verdict = results[0][2]
        return Check(PASS, f"a dry-run GPU pod is {'steered' if ctx.config.admission.mode == 'mutate' else 'rejected'}"
                           f" ({verdict[:80]}); a GPU pod naming a node is rejected; a CPU pod passes untouched",
                     done=True)

    # --- doctor --------------------------------------------------------------------------------------------------------
    def doctor(self, ctx) -> list[Check]:
        try:
            checks = [self.check(ctx)]
        except ConfigError as error:
            return [Check(FAIL, error.one_line())]
        settings = ctx.config.admission
        if settings.engine != "opa":
            return checks + [self._doctor_probe(ctx)]
        ns = settings.opa.namespace
        hook = next((h for kind in WEBHOOK_KINDS
                     for h in ((ctx.kube.get(f"{GROUP}/v1", kind, render.CONFIG_NAME) or {}).get("webhooks") or [])),
                    None)
        if hook is None:
            return checks + [Check(WARN, "no webhook configuration yet (gpu-bootstrap up creates it)")]
        service = (hook.get("clientConfig") or {}).get("service") or {}
        ready = self._ready_endpoints(ctx, service.get("namespace", ns), service.get("name", render.NAME))
        policy = hook.get("failurePolicy", "Fail")
        if ready == 0:
            consequence = ("EVERY matching pod creation fails (failurePolicy Fail): delete the webhook configuration "
                           "to recover" if policy == "Fail" else
                           "GPU pods are not steered (failurePolicy Ignore; the backstop rejects them)")
            checks.append(Check(FAIL, f"webhook {hook.get('name')} points at Service {service.get('namespace')}/"
                                      f"{service.get('name')}, which has no ready endpoints: {consequence}"))
        else:
            checks.append(Check(PASS, f"webhook Service has {ready} ready endpoint(s); failurePolicy {policy}"))
        if settings.certificates == "generated" or (hook.get("clientConfig") or {}).get("caBundle"):
            checks.append(self._doctor_certificate(ctx, hook, ns))
        checks.append(self._doctor_probe(ctx))
        return checks

    @staticmethod
    def _ready_endpoints(ctx, namespace: str, name: str) -> int:
        slices = ctx.kube.list("discovery.k8s.io/v1", "EndpointSlice", namespace,
                               label_selector=f"kubernetes.io/service-name={name}")
        return sum(1 for s in slices for e in s.get("endpoints") or []
                   if (e.get("conditions") or {}).get("ready", True))

    def _doctor_certificate(self, ctx, hook: dict, ns: str) -> Check:
        import base64
        stored = certs.Stored.from_secret(ctx.kube.get("v1", "Secret", render.SECRET, ns))
        if stored is None:
            return Check(FAIL, f"Secret {ns}/{render.SECRET} is missing or unreadable: OPA cannot serve TLS")
        now = AdmissionOpa.clock()
        left = certs.days_left(stored.cert_pem, now)
        try:
            bundle = base64.b64decode((hook.get("clientConfig") or {}).get("caBundle") or "").decode()
        except (ValueError, UnicodeDecodeError):
            bundle = ""
        signer = stored.signer
        if signer is None or not _bundle_has(bundle, certs.join_bundle([signer])):
            return Check(FAIL, f"the webhook's caBundle does not hold the CA that signed Secret {ns}/{render.SECRET}: "
                               f"the API server cannot verify OPA (run gpu-bootstrap up)")
        if left <= 0:
            return Check(FAIL, f"the serving certificate expired {-left:.0f} day(s) ago (run gpu-bootstrap up)")
        status = WARN if left <= ctx.config.admission.rotate_before_days else PASS
        return Check(status, f"serving certificate valid for {left:.0f} more day(s); caBundle matches the Secret"
                             + (" (gpu-bootstrap up rotates it)" if status == WARN else ""))

    def _doctor_probe(self, ctx) -> Check:
        try:
            results = self.probe(ctx)
        except ClusterError as error:
            return Check(WARN, f"could not probe admission: {error.message}")
        failed = [f"{what}: {detail}" for what, ok, detail in results if not ok]
        if failed:
            return Check(FAIL, "policy not answering as configured (not loaded, or OPA unreachable): " +
                         "; ".join(failed))
        return Check(PASS, f"policy answers: {results[0][0]} {results[0][2][:80]}")

    def undo_plan(self, ctx) -> list[Change]:
        kinds = [(f"{GROUP}/v1", k) for k in WEBHOOK_KINDS]
        kinds += [(f"{GROUP}/v1", "ValidatingAdmissionPolicyBinding"), (f"{GROUP}/v1", "ValidatingAdmissionPolicy")]
        kinds += [(v, k) for v in MAP_VERSIONS for k in ("MutatingAdmissionPolicyBinding", "MutatingAdmissionPolicy")]
        return [Change(Verb.DELETE, ref, "remove", "teardown of admission (first: nothing may call a removed server)")
                for ref in _owned(ctx.kube, kinds, None, set())]
