"""admission: keep every GPU pod on the bin-packing scheduler, while it runs, and let GPU pods tolerate the GPU taint.

Once `admission-opa` (steps/admission_opa.py) has OPA ready, this step creates the webhook configuration (and, from
Kubernetes 1.30, the in-process backstop policy) and proves with server-side dry runs that a GPU pod is steered (or
rejected, in mode enforce), that one without the GPU taint's toleration gets it (mode mutate), and that a CPU pod is
not touched. It steers only to a scheduler that runs (steps/admission_state.py): skipped, not yet ready or gone, GPU
pods keep their scheduler, and the plan says why. With `engine: vap` there is no server: it creates admission
policies only.

The webhook's failurePolicy is Ignore (docs/steps/admission.md): a broken OPA never blocks a pod; the
backstop policy, evaluated inside the API server, rejects GPU pods that were not steered, with the field to set.
"""
from __future__ import annotations

import time

from gpu_bootstrap.core.errors import ClusterError, ConfigError, Unreachable
from gpu_bootstrap.pipeline.step import FAIL, PASS, WARN, Change, Check, ObjectsFacts, Ref, Step, Verb, declare
from gpu_bootstrap.security.rbac_rules import (ADMISSION_KINDS, APPLY, DOCTOR, READ, RUN, WRITE, admission_probes, need,
    steering_needs)
from gpu_bootstrap.render import admission as render
from gpu_bootstrap.render import admission_policy as policy_render
from gpu_bootstrap.render import certificates as certs
from gpu_bootstrap.core.versions import minor_of
from gpu_bootstrap.steps.admission_opa import AdmissionOpa, _bundle_has
from gpu_bootstrap.core.objects import served
from gpu_bootstrap.steps.admission_state import (GROUP, MAP_VERSIONS, WEBHOOK_KINDS, object_drift, owned_refs,
                                                 policy_for)
from gpu_bootstrap.steps.node_prep import gpu_taint


AdmissionFacts = ObjectsFacts


class Admission(Step):
    id = "admission"
    title = "Keep GPU pods on the bin-packing scheduler (admission)"


    def inputs(self, ctx) -> dict:
        return {"admission": ctx.config.admission.model_dump(mode="json"),
                "policy": policy_for(ctx)[0].__dict__, "kube": ctx.server_version()}

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
        policy, not_steering = policy_for(ctx)
        notes = [not_steering] if not_steering else []
        if labelled := self._labelled_namespaces(ctx):
            notes.append(f"namespace(s) {', '.join(labelled[:5])} carry {policy_render.IGNORE_LABEL}="
                         f"{policy_render.IGNORE_VALUE}, which no longer exempts anything (anyone who may label a "
                         f"namespace could use it): list them in admission.exempt_namespaces if they must stay exempt")
        vap = served(ctx.kube, f"{GROUP}/v1", "ValidatingAdmissionPolicy") if render.cel_available(version) else False
        map_version = None
        if settings.mode == "mutate" and (settings.engine == "vap" or policy.claims):
            map_version = next((v for v in MAP_VERSIONS if served(ctx.kube, v, "MutatingAdmissionPolicy")), None)
        if settings.engine == "vap":
            if settings.mode == "enforce":
                if not vap:
                    raise self._refuse_vap(version, "enforce", "ValidatingAdmissionPolicy (GA in 1.30) is not served")
                return render.validating_policy(config, policy) + self._claims(ctx, policy, vap, None, notes) + \
                    self._device_access(ctx, policy, vap, None, notes), notes
            if map_version is None:
                raise self._refuse_vap(version, "mutate", "API discovery shows no MutatingAdmissionPolicy")
            # The backstop too: it rejects the GPU pods that name a node, which no mutation can steer.
            return render.mutating_policy(config, map_version, policy) + (
                render.validating_policy(config, policy) if vap else []) + self._claims(
                ctx, policy, vap, map_version, notes) + self._device_access(ctx, policy, vap, map_version, notes), notes
        return self._opa_objects(ctx, policy, vap, notes) + self._claims(ctx, policy, vap, map_version, notes) + \
            self._device_access(ctx, policy, vap, None, notes), notes

    @staticmethod
    def _device_access(ctx, policy, vap: bool, map_version: str | None, notes: list[str]) -> list[dict]:
        """GPUs only for pods given them (render/device_access.py): the API server's own policy where CEL admission
        is served, whatever the engine; before 1.30 OPA alone refuses such pods, and only while it answers."""
        if not policy.device_access:
            return []
        if not vap:
            notes.append("device access: Kubernetes without ValidatingAdmissionPolicy (1.30+): OPA alone refuses pods "
                         "that choose GPUs through NVIDIA_VISIBLE_DEVICES or NVIDIA's RuntimeClass, and lets them in "
                         "while it does not answer (failurePolicy Ignore); the runtime setting still holds where the "
                         "gpu-operator installs the toolkit")
            return []
        return render.device_access_policies(ctx.config, map_version, policy)

    def _claims(self, ctx, policy, vap: bool, map_version: str | None, notes: list[str]) -> list[dict]:
        """gpu_operator.allocation: dra: the policies for pods whose GPUs come through ResourceClaims (only CEL with
        the claim templates as parameters can tell a GPU claim from another; OPA sees the pod alone)."""
        if not policy.claims:
            return []
        scheduler = ctx.config.scheduler.name
        if not vap:
            notes.append("pods whose GPUs come through ResourceClaims are not recognised: ValidatingAdmissionPolicy "
                         "is not served, and only it can read what a claim template asks for")
            return []
        if ctx.config.admission.mode == "mutate" and map_version is None and policy.steer:
            notes.append(f"pods whose GPUs come through ResourceClaims are not steered: this API server serves no "
                         f"MutatingAdmissionPolicy (admissionregistration.k8s.io/v1 from 1.36; v1beta1 on 1.34-1.35 "
                         f"when enabled). Such pods must set spec.schedulerName: {scheduler} and tolerate the GPU "
                         f"taint; the backstop rejects them otherwise, with the field to set")
        return render.claim_policies(ctx.config, map_version, policy)

    def _opa_objects(self, ctx, policy, vap: bool, notes: list[str]) -> list[dict]:
        config, version, settings = ctx.config, ctx.server_version(), ctx.config.admission
        self._refuse_without_opa(ctx)
        bundle = None
        if settings.certificates == "generated":
            try:
                stored = certs.Stored.from_secret(ctx.kube.get("v1", "Secret", render.SECRET, settings.opa.namespace))
            except ClusterError as error:  # a dry run or doctor reads no Secret: the CA the webhook trusts now
                if error.status != 403:
                    raise
                stored = self._live_bundle(ctx)
            if stored is None:
                notes.append(f"caBundle: Secret {settings.opa.namespace}/{render.SECRET} does not exist yet (the "
                             f"admission-opa step creates it before this step runs)")
            else:
                bundle = stored.ca_bundle
        objects = [render.webhook_configuration(config, version, bundle, policy)]
        if vap:
            objects += render.validating_policy(config, policy)
        else:
            notes.append(f"Kubernetes {'.'.join(map(str, minor_of(version)))} has no CEL admission (1.30+): every "
                         f"pod created outside the exempt namespaces reaches OPA, and there is no in-process backstop")
        return objects

    @staticmethod
    def _live_bundle(ctx):
        """The CA bundle of the live webhook configuration (public, unlike the Secret holding the key beside it)."""
        import base64
        for kind in WEBHOOK_KINDS:
            for hook in (ctx.kube.get(f"{GROUP}/v1", kind, render.CONFIG_NAME) or {}).get("webhooks") or []:
                if bundle := (hook.get("clientConfig") or {}).get("caBundle"):
                    return certs.Stored("", "", base64.b64decode(bundle).decode())
        return None

    def check(self, ctx) -> Check:
        desired, notes = self.desired(ctx)
        drift = object_drift(ctx.kube, desired)
        keep = {Ref.of(o) for o in desired}
        kinds = [(f"{GROUP}/v1", k) for k in WEBHOOK_KINDS]
        if render.cel_available(ctx.server_version()):
            kinds += [(f"{GROUP}/v1", "ValidatingAdmissionPolicyBinding"), (f"{GROUP}/v1", "ValidatingAdmissionPolicy")]
            kinds += [(v, k) for v in MAP_VERSIONS for k in ("MutatingAdmissionPolicyBinding",
                                                             "MutatingAdmissionPolicy")]
        leftovers = owned_refs(ctx.kube, kinds, None, keep)
        facts = AdmissionFacts(desired, drift, leftovers, tuple(notes))
        notes = [n for n in notes if not n.startswith("caBundle")]  # expected on a fresh cluster: a change's detail
        if drift or leftovers:
            parts = [f"{ref.kind} {ref.name}: {why}" for ref, why in drift.items()]
            parts += [f"{ref.kind} {ref.name}: no longer wanted" for ref in leftovers]
            return Check(WARN, "; ".join(parts[:4]), facts=facts, warnings=notes)
        what = ", ".join(sorted({o["kind"] for o in desired}))
        policy, why = policy_for(ctx)
        if not policy.steer:  # in place, as it should be while the scheduler does not run: said, not hidden
            status = PASS if not ctx.config.scheduler.enabled else WARN
            return Check(status, f"{why} ({what})", done=True, facts=facts,
                         warnings=[n for n in notes if n != why])
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
        """Server-side dry runs (they pass through admission, store nothing): (what, as expected, detail). What is
        expected follows the policy now: steered (mutate) or rejected (enforce) only while the scheduler runs; the
        GPU taint's toleration added in mode mutate."""
        config = ctx.config
        ns = self.probe_namespace(ctx)
        policy, _why = policy_for(ctx)
        mutate = config.admission.mode == "mutate"
        results = []
        try:
            answer = ctx.kube.create(render.sample_pod("gpu-bootstrap-admission-probe-gpu", ns), dry_run=True)
            got = (answer.get("spec") or {}).get("schedulerName")
            if not policy.steer:
                results.append(("GPU pod", got in (None, policy_render.DEFAULT_SCHEDULER),
                                f"schedulerName {got} (not steered: the scheduler does not run)"))
            elif mutate:
                results.append(("GPU pod", got == policy.scheduler, f"schedulerName {got}"))
            else:
                results.append(("GPU pod", False, f"admitted with schedulerName {got}, not rejected"))
        except ClusterError as error:
            if isinstance(error, Unreachable) or not error.status:
                raise
            ok = policy.steer and not mutate and error.status in (400, 403, 422) and \
                "spec.schedulerName" in error.message
            results.append(("GPU pod", ok, f"rejected ({error.status}): {error.message}"))
        if mutate and policy.toleration is not None:
            results.append(self._probe_toleration(ctx, ns, policy))
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
    def _probe_toleration(ctx, ns: str, policy) -> tuple[str, bool, str]:
        """A GPU pod as users write it (no toleration): after admission it tolerates the GPU taint."""
        what = "GPU pod without a toleration"
        pod = render.sample_pod("gpu-bootstrap-admission-probe-untolerating", ns, tolerate=False)
        try:
            answer = ctx.kube.create(pod, dry_run=True)
        except ClusterError as error:
            if isinstance(error, Unreachable) or not error.status:
                raise
            return what, False, f"rejected ({error.status}): {error.message}"
        tolerations = (answer.get("spec") or {}).get("tolerations") or []
        taint = policy.toleration
        ok = any(render.tolerates(t, taint) for t in tolerations)
        return what, ok, ("tolerates the GPU taint" if ok else
                          f"does not tolerate {taint['key']}:{taint['effect']} after admission")

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
        policy, why = policy_for(ctx)
        first = ("steered" if ctx.config.admission.mode == "mutate" else "rejected") if policy.steer else \
            "left on its scheduler"
        tolerated = "; one without a toleration gets the GPU taint's" if any(
            w == "GPU pod without a toleration" for w, _ok, _d in results) else ""
        return Check(PASS, f"a dry-run GPU pod is {first} ({verdict[:80]}){tolerated}; a GPU pod naming a node is "
                           f"rejected; a CPU pod passes untouched" + (f" — {why}" if why else ""), done=True)

    # --- doctor --------------------------------------------------------------------------------------------------------
    def doctor(self, ctx) -> list[Check]:
        try:
            checks = [self.check(ctx)]
        except ConfigError as error:
            return [Check(FAIL, error.one_line())]
        settings = ctx.config.admission
        checks.append(self._doctor_extended_resource_toleration(ctx))
        checks.append(self._doctor_exempt_namespaces(ctx))
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
    def _doctor_exempt_namespaces(ctx) -> Check:
        """An exempt namespace that does not exist is anyone's who may create namespaces: they create it and run
        GPU pods there unsteered, reaching GPUs by any route admission closes elsewhere."""
        exempt = [n for n in policy_render.of(ctx.config).exempt_namespaces if n not in policy_render.BUILTIN_EXEMPT]
        missing = [n for n in exempt if ctx.kube.get("v1", "Namespace", n) is None]
        if missing:
            return Check(WARN, f"exempt namespace(s) {', '.join(missing)} do not exist: whoever may create namespaces "
                               f"can create one and run pods there that admission does not see; create them now "
                               f"(as an admin), or remove them from admission.exempt_namespaces")
        return Check(PASS, f"every exempt namespace exists ({', '.join(exempt) or 'none beside kube-system'})")

    @staticmethod
    def _doctor_bundle(ctx, hook: dict, ns: str) -> Check:
        stored = Admission._live_bundle(ctx)
        if stored is None:
            return Check(FAIL, "the webhook configuration has no caBundle: the API server cannot verify OPA")
        cas = certs.split_bundle(stored.ca_bundle)
        left = min(certs.days_left(ca, AdmissionOpa.clock()) for ca in cas)
        status = FAIL if left <= 0 else WARN if left <= ctx.config.admission.rotate_before_days else PASS
        return Check(status, f"the webhook trusts {len(cas)} CA(s), valid for {left:.0f} more day(s); the serving "
                             f"certificate is in Secret {ns}/{render.SECRET}, which doctor does not read (up checks "
                             f"and rotates it)")

    @staticmethod
    def _ready_endpoints(ctx, namespace: str, name: str) -> int:
        slices = ctx.kube.list("discovery.k8s.io/v1", "EndpointSlice", namespace,
                               label_selector=f"kubernetes.io/service-name={name}")
        return sum(1 for s in slices for e in s.get("endpoints") or []
                   if (e.get("conditions") or {}).get("ready", True))

    def _doctor_certificate(self, ctx, hook: dict, ns: str) -> Check:
        import base64
        try:
            stored = certs.Stored.from_secret(ctx.kube.get("v1", "Secret", render.SECRET, ns))
        except ClusterError as error:  # doctor reads no Secret (it holds OPA's key): the CA the webhook trusts
            if error.status != 403:
                raise
            return self._doctor_bundle(ctx, hook, ns)
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

    def _doctor_extended_resource_toleration(self, ctx) -> Check:
        """Is the API server's ExtendedResourceToleration plugin on (kubeadm leaves it off)? It adds `nvidia.com/gpu
        Exists NoSchedule` to every pod that asks for the resource, before any webhook: a dry-run GPU pod with no
        toleration tells, unless our own toleration looks the same."""
        policy, _why = policy_for(ctx)
        if policy.toleration == render.EXTENDED_RESOURCE_TOLERATION and ctx.config.admission.mode == "mutate":
            return Check(PASS, "ExtendedResourceToleration: cannot tell (admission adds the same toleration); GPU "
                               "pods get it either way")
        try:
            answer = ctx.kube.create(render.sample_pod("gpu-bootstrap-admission-probe-ert", self.probe_namespace(ctx),
                                                       tolerate=False), dry_run=True)
        except ClusterError as error:
            if isinstance(error, Unreachable) or not error.status:
                raise
            return Check(WARN, f"ExtendedResourceToleration: cannot tell ({error.message})")
        tolerations = (answer.get("spec") or {}).get("tolerations") or []
        if render.EXTENDED_RESOURCE_TOLERATION in tolerations:
            return Check(PASS, "ExtendedResourceToleration is on: the API server lets every pod that asks for "
                               "nvidia.com/gpu tolerate nvidia.com/gpu:NoSchedule taints")
        taint = gpu_taint(ctx.config, ctx.options.playbook)
        if taint is None:
            return Check(PASS, "ExtendedResourceToleration is off (kubeadm's default); the GPU nodes are not tainted")
        covered = any(render.tolerates(t, taint) for t in tolerations)
        return Check(PASS if covered else WARN,
                     "ExtendedResourceToleration is off (kubeadm's default): " + (
                         "admission gives GPU pods the GPU taint's toleration" if covered else
                         f"a GPU pod that does not tolerate {taint['key']}={taint.get('value', '')}:{taint['effect']} "
                         f"stays Pending; add the toleration to your pods, use admission.mode: mutate, or enable the "
                         f"plugin (--enable-admission-plugins=...,ExtendedResourceToleration)"))

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
                for ref in owned_refs(ctx.kube, kinds, None, set())]


def rbac_needs(config) -> dict:
    mutating_policies = "mutatingadmissionpolicies mutatingadmissionpolicybindings"
    return {
        READ: [*steering_needs(),
               need("admissionregistration.k8s.io", ADMISSION_KINDS, "get list"),
               need("admissionregistration.k8s.io", mutating_policies, "get list"),
               need("", "secrets", "get", "opa"),
               need("", "namespaces", "list")],  # namespaces still carrying the retired opt-out label
        WRITE: [need("admissionregistration.k8s.io", ADMISSION_KINDS, APPLY),
                need("admissionregistration.k8s.io", mutating_policies, APPLY)],
        RUN: [need("admissionregistration.k8s.io", ADMISSION_KINDS, "delete"),
              # leftovers: an engine or allocation mode no longer configured (DRA mode's claim policies)
              need("admissionregistration.k8s.io", mutating_policies, "delete"), *admission_probes()],
        DOCTOR: admission_probes()}


def rbac_dra_needs(config) -> dict:
    """The claim policies' parameters: the API server lets only an identity that may read them in every namespace
    create a policy (paramKind) or binding (paramRef) over them."""
    return {WRITE: [need("resource.k8s.io", "resourceclaimtemplates resourceclaims", "get list",
                         why="admission: the claim policies read the claim templates and claims as their parameters "
                             "(allocation: dra)")]}


DECLARATION = declare(
    Admission, section="admission", enabled=lambda config: config.admission.enabled, needs=rbac_needs,
    dra_needs=rbac_dra_needs,
    summary="once OPA is ready, points the API server at it (a webhook with `failurePolicy: Ignore`, plus from 1.30 an "
            "in-process backstop policy), so GPU pods that name no scheduler get the bin-packing one (or are "
            "rejected, naming the field); proves it with server-side dry runs")
