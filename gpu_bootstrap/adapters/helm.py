"""The Helm adapter: the real helm binary (v3.14+ or v4), run directly (no shell) as a child that dies with us.

Values always travel on stdin (they can hold secrets; never on the command line). A chart is a repository chart
(name + repository URL) or a local .tgz / directory, for air-gapped clusters. A helm failure becomes one
ClusterError carrying helm's own error line.

Processes: helm runs in its own process group with PR_SET_PDEATHSIG=SIGKILL (gpu_bootstrap.core.interrupts), so neither
Ctrl-C, SIGTERM nor `kill -9` of gpu-bootstrap leaves it running; an attempt that outlives its time limit is
stopped the same way (SIGTERM to the group, SIGKILL after a grace period).

Requests: with a relay (adapters/relay.py, as app/commands.py builds it), helm reaches the API server through it, and
each of its requests is repeated by gpu-bootstrap's own rule (Kube.forward) when a reset, a 429 or a 5xx stopped it.

Retries: read-only commands (status, list, get, history, show, template, server-side dry runs) and
`upgrade --install` are repeated when helm's error is a transient API failure (503, 429, reset, timeout, etcd
leader change, ...), with exponential backoff and jitter, until a deadline (reads READ_DEADLINE; an upgrade at most
UPGRADE_ATTEMPTS times within its --timeout, each repeat with what is left of it; attempts that never reached the
cluster do not count, but are given up after UNREACHED_DEADLINE, so an API outage of up to a minute is ridden out).
An upgrade is not repeated when the release is locked by another operation (pending) or when its own --wait ran
out — except that a release our own failed attempt left pending (helm could not record the failure) is recovered
first, as the next run would. The error names the first real cause, not what a later attempt tripped over because
of it.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpu_bootstrap.core import interrupts
from gpu_bootstrap.adapters import backoff
from gpu_bootstrap.core.errors import ClusterError, ConfigError, GpuBootstrapError, ReleaseNotFound
from gpu_bootstrap.core.refs import Chart

log = logging.getLogger("gpu_bootstrap.helm")

READ_DEADLINE = 90.0  # seconds a read-only command may take, all attempts and waits included
READ_ATTEMPT_TIMEOUT = 60.0  # seconds one read-only attempt may run (helm has no request timeout of its own)
UPGRADE_ATTEMPTS = 10  # an upgrade runs at most this often, within its --timeout (5 ran out within a minute of
#                        a 300 s budget when 10 % of helm's writes failed: tests/test_fault_runs.py)
UNREACHED_DEADLINE = 60.0  # seconds attempts that never reached the cluster are repeated (as the kube adapter's)
CHANGE_MARGIN = 120.0  # seconds a changing command may run beyond its --timeout (CRDs, hooks) before it is stopped
MIN_UPGRADE_RETRY = 30  # seconds of --timeout a repeated upgrade must still have, else it is not repeated
BACKOFF_BASE = 1.0  # seconds before the 2nd attempt; doubles each time ...
BACKOFF_CAP = 8.0  # ... up to this; each wait is drawn from [half, all] of it (jitter)
TRANSIENT = re.compile("|".join([
    r"the server is currently unable to handle the request", r"service unavailable",
    r"too many requests", r"has asked us to try again later", r"rate limit",
    r"connection reset by peer", r"connection refused", r"broken pipe", r"unexpected eof", r": eof\b",
    r"http2: client connection lost", r"tls handshake timeout", r"i/o timeout", r"net/http: timeout",
    r"client\.timeout exceeded", r"operation timed out", r"etcdserver: (request timed out|leader changed|too many)",
    r"the server was unable to return a response in the time allotted", r"timeout: request did not complete",
    r"the server has received too many requests", r"an error on the server .* has prevented the request",
    r"did not finish within \d+ s",  # our own attempt time limit
    r"not ready\. status: unknown",  # helm 4 waiting for a hook: kstatus could not read the object
]), re.IGNORECASE)
LOCKED = re.compile(r"another operation \(install/upgrade/rollback\) is in progress", re.IGNORECASE)
UNREACHED = re.compile(r"kubernetes cluster unreachable", re.IGNORECASE)  # helm's first check: nothing changed yet
PENDING = re.compile(r"another operation \(install/upgrade/rollback\) is in progress|"
                     r"has no deployed releases|release: already exists", re.IGNORECASE)
WAIT_RAN_OUT = re.compile(r"context deadline exceeded|timed out waiting for the condition|"
                          r"resources not ready|wait(ing)? .*timed out", re.IGNORECASE)
NOT_FOUND = re.compile(r"release: not found", re.IGNORECASE)


class _CrdLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml: kps's 4.5 MB of CRDs in 4 s, not 18
    """CRDs as the API server reads them (YAML 1.2): a bare `=` is the string "=", not YAML 1.1's value key (which
    PyYAML cannot construct; kube-prometheus-stack's AlertmanagerConfig CRD has one)."""


_CrdLoader.add_constructor("tag:yaml.org,2002:value", yaml.SafeLoader.construct_yaml_str)


def find_helm() -> str:
    candidate = os.environ.get("GPU_BOOTSTRAP_HELM") or shutil.which("helm")
    if not candidate or not Path(candidate).exists():
        raise ConfigError("helm not found", "install helm v3.14+ or v4 on PATH, or set GPU_BOOTSTRAP_HELM")
    return candidate


def _error_line(error) -> str:
    """helm's own error line: the last `Error:` line of its stderr, else its last line."""
    stderr = getattr(error, "stderr", error)
    text = (stderr.decode(errors="replace") if isinstance(stderr, bytes) else str(stderr or "")).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    return (errors[-1] if errors else (lines[-1] if lines else "helm failed"))[:600]


def seconds(timeout: str | int | float) -> float:
    """A helm/Go duration ("900s", "10m", "1h30m", "2m3.5s") or a number of seconds, in seconds."""
    if isinstance(timeout, (int, float)):
        return float(timeout)
    text = str(timeout).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ConfigError(f"not a duration: {timeout!r}", "use e.g. 900s or 15m")
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


@dataclass
class Attempt:
    """What one helm run produced."""

    returncode: int | None  # None: stopped by us (time limit)
    stdout: bytes
    stderr: bytes

    @property
    def line(self) -> str:
        return _error_line(self.stderr)


class ChartDigestMismatch(GpuBootstrapError):
    """A repository chart whose archive is not the one the catalogue pins: nothing is installed from it (exit 1)."""


class Helm:
    def __init__(self, kubeconfig: Path | None = None, context: str | None = None, executable: str | None = None,
                 timeout: str = "10m", read_deadline: float = READ_DEADLINE,
                 read_attempt_timeout: float = READ_ATTEMPT_TIMEOUT, relay=None, kube=None):
        self.kubeconfig = kubeconfig
        self.kube = kube  # adapters/kube.Kube: what helm cannot tell (does a delete hook's ServiceAccount exist?)
        self.relay = relay  # adapters/relay.Relay: helm's requests go through it (our retry rule), else direct
        self.context = context
        self.executable = executable
        self.timeout = timeout
        self.read_deadline = read_deadline
        self.read_attempt_timeout = read_attempt_timeout
        self.attempts = 0  # helm processes started
        self.retries = 0  # of which repeats after a transient failure
        self._pulled: dict[tuple, Path] = {}  # (repository, chart, version) -> its verified archive

    # --- running helm ---------------------------------------------------------------------------------------------
    def _argv(self, args: list[str]) -> list[str]:
        argv = [self.executable or find_helm(), *args]
        if self.relay is not None:
            return argv + ["--kubeconfig", str(self.relay.kubeconfig())]
        if self.kubeconfig:
            argv += ["--kubeconfig", str(self.kubeconfig)]
        if self.context:
            argv += ["--kube-context", self.context]
        return argv

    def _once(self, argv: list[str], stdin: bytes | None, limit: float) -> Attempt:
        """One helm process: its own group, dies with us, stopped (TERM, then KILL) at the time limit."""
        self.attempts += 1
        started = time.monotonic()
        try:
            process = interrupts.start_child(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as error:
            raise ConfigError(f"cannot run {argv[0]}: {error.strerror or error}",
                              "install helm v3.14+ or v4 on PATH, or set GPU_BOOTSTRAP_HELM") from None
        try:
            out, err = process.communicate(stdin, timeout=limit)
        except subprocess.TimeoutExpired:
            log.warning("helm %s did not finish within %.0f s; stopping it", argv[1], limit)
            interrupts.stop(process)
            return Attempt(None, b"", f"Error: helm {argv[1]} did not finish within {limit:.0f} s".encode())
        except BaseException:  # KeyboardInterrupt (a signal) or anything else: helm must not outlive this call
            interrupts.stop(process, wait=False)
            raise
        interrupts.forget(process)
        log.debug("helm %s -> exit %s in %.1f s", argv[1], process.returncode, time.monotonic() - started)
        if process.returncode != 0 and err:
            log.debug("helm stderr: %s", err.decode(errors="replace").strip()[-4000:])
        return Attempt(process.returncode, out, err)

    def _run(self, args: list[str], values: dict | None = None, what: str = "helm", retry: str | None = None,
             timeout: str | None = None, recover=None) -> str:
        """Run helm once, or with retry="read" / "upgrade" repeat it on transient API errors until a deadline:
        reads READ_DEADLINE, an upgrade its --timeout. A changing command (timeout given) may run for its timeout
        plus CHANGE_MARGIN before it is stopped; a read READ_ATTEMPT_TIMEOUT. An upgrade attempt that never
        reached the cluster ("kubernetes cluster unreachable": helm checks that before it changes anything) does
        not count towards UPGRADE_ATTEMPTS; such attempts in a row are given up after UNREACHED_DEADLINE. When a
        repeated upgrade finds the release locked by the attempt before it (helm could not record that attempt's
        failure, so the release stays pending), `recover()` clears it, as the next run would, and the upgrade
        goes on."""
        stdin = json.dumps(values).encode() if values is not None else None
        argv = self._argv(args)
        log.debug("helm %s%s", " ".join(argv[1:]), " (values on stdin)" if stdin is not None else "")
        started = time.monotonic()
        end = started + (seconds(timeout) if retry == "upgrade" else self.read_deadline)
        first_cause: str | None = None
        number = unreached = 0
        unreached_since: float | None = None  # the first of the attempts in a row that never reached the cluster
        while True:
            number += 1
            if retry == "upgrade":
                if number > 1:
                    argv = self._with_timeout(argv, end)
                limit = max(end - time.monotonic(), MIN_UPGRADE_RETRY) + CHANGE_MARGIN
            elif retry == "read":
                limit = max(min(self.read_attempt_timeout, end - time.monotonic()), 1.0)
            else:
                limit = seconds(timeout) + CHANGE_MARGIN if timeout else self.read_attempt_timeout
            started_attempt = time.monotonic()
            result = self._once(argv, stdin, limit)
            if result.returncode == 0:
                if number > 1:
                    log.info("%s succeeded on attempt %d after %.1f s", what, number, time.monotonic() - started)
                return result.stdout.decode()
            text = result.stderr.decode(errors="replace")
            if NOT_FOUND.search(text):
                raise ReleaseNotFound(f"{what}: {result.line}")
            transient = bool(TRANSIENT.search(text))
            if transient and first_cause is None:
                first_cause = result.line
            if retry == "upgrade" and UNREACHED.search(text):
                unreached += 1
                unreached_since = unreached_since or started_attempt
                if time.monotonic() - unreached_since > UNREACHED_DEADLINE:
                    raise self._failure(what, result, first_cause, number, started, always_count=True)
            else:
                unreached_since = None
            if retry == "upgrade" and recover is not None and first_cause is not None and LOCKED.search(text) and \
                    self._recover(recover, what, number - unreached, end):
                continue
            if retry and transient and self._may_repeat(retry, text, end, number - unreached) and \
                    self._backoff(number, end, f"{what}: {result.line}"):
                continue
            raise self._failure(what, result, first_cause, number, started)

    def _recover(self, recover, what: str, changing: int, end: float) -> bool:
        """Clear a release our own failed attempt left pending; True when the upgrade may go on."""
        if changing >= UPGRADE_ATTEMPTS or end - time.monotonic() < MIN_UPGRADE_RETRY:
            return False
        log.info("%s: the failed attempt before left the release pending; recovering it", what)
        try:
            log.info("%s: %s", what, recover())
        except ClusterError as error:
            if not TRANSIENT.search(error.message):
                return False
            log.info("%s: recovering failed (%s); trying again", what, error.message)
        return self._backoff(changing, end, f"{what}: recovered the release")

    @staticmethod
    def _may_repeat(retry: str, text: str, end: float, number: int) -> bool:
        if retry == "upgrade":
            if PENDING.search(text) or WAIT_RAN_OUT.search(text):
                return False  # the release is locked, or its own --wait ran out: repeating cannot help
            return number < UPGRADE_ATTEMPTS and end - time.monotonic() >= MIN_UPGRADE_RETRY
        return True

    def _backoff(self, number: int, end: float, what: str) -> bool:
        if not backoff.wait(number, BACKOFF_BASE, BACKOFF_CAP, end, f"{what}; transient", log):
            return False
        self.retries += 1
        return True

    @staticmethod
    def _with_timeout(argv: list[str], end: float) -> list[str]:
        """The same upgrade with --timeout set to what is left of the deadline (a repeat does not extend it)."""
        left = f"{max(int(end - time.monotonic()), MIN_UPGRADE_RETRY)}s"
        argv = list(argv)
        if "--timeout" in argv:
            argv[argv.index("--timeout") + 1] = left
        return argv

    @staticmethod
    def _failure(what: str, result: Attempt, first_cause: str | None, number: int, started: float,
                 always_count: bool = False) -> ClusterError:
        """`always_count`: say how many attempts were made even when it was one (an unreachable cluster is given up
        after a time, not a number of attempts, and a slow attempt can use it all)."""
        line = result.line
        text = result.stderr.decode(errors="replace")
        tried = (f" (after {number} attempt{'s' if number > 1 else ''} in {time.monotonic() - started:.0f} s)"
                 if number > 1 or always_count else "")
        if first_cause and first_cause != line and not TRANSIENT.search(text):
            if PENDING.search(text):
                # a repeat tripped over what the failed attempt left behind: the first failure is the real cause
                line = f"{first_cause} (a repeat then found: {line.removeprefix('Error: ')})"
            else:
                tried = f" (after {number} attempts in {time.monotonic() - started:.0f} s; the first failed with: " \
                        f"{first_cause.removeprefix('Error: ')})"
        return ClusterError(f"{what} failed: {line}{tried}", "see the log for helm's full output")

    def _chart_args(self, chart: Chart) -> list[str]:
        if chart.repo and chart.version and not chart.repo.startswith("oci://"):
            return [str(self.verified_chart(chart))]
        args = [chart.ref]
        if chart.repo:
            args += ["--repo", chart.repo]
        if chart.version:
            args += ["--version", chart.version]
        return args

    def verified_chart(self, chart: Chart) -> Path:
        """A repository chart, pulled once into a private folder and checked against the sha256 the supply-chain
        catalogue (core/data/images.yaml) records for its version; every helm command then uses that very archive, so
        what was checked is what is installed. A mismatch is refused where the catalogue's sum was read from the
        repository's index (`verified`), and warned about otherwise; a version the catalogue lacks is used with a
        warning (not verified)."""
        key = (chart.repo, chart.ref, chart.version)
        if key in self._pulled:
            return self._pulled[key]
        import atexit
        import hashlib
        import tempfile
        from gpu_bootstrap.core.catalogue import chart_sha256, chart_sha256_verified
        from gpu_bootstrap.security.tempfiles import run_folder_or_none
        # inside the run folder, so a run killed with -9 leaves it to the next run's sweep (security/tempfiles.py)
        folder = Path(tempfile.mkdtemp(prefix="gpu-bootstrap-chart-", dir=run_folder_or_none()))
        atexit.register(shutil.rmtree, folder, True)
        self._run(["pull", chart.ref, "--repo", chart.repo, "--version", chart.version, "--destination", str(folder)],
                  what=f"helm pull {chart.ref} {chart.version}", retry="read")
        archives = sorted(folder.glob("*.tgz"))
        if len(archives) != 1:
            raise ClusterError(f"helm pull {chart.ref} {chart.version} from {chart.repo} left {len(archives)} "
                               f"archives, expected one")
        actual = hashlib.sha256(archives[0].read_bytes()).hexdigest()
        expected = chart_sha256(chart.ref, chart.version)
        if expected is None:
            log.warning("chart %s %s from %s is not in gpu-bootstrap's catalogue (core/data/images.yaml): its archive "
                        "(sha256 %s) is used unverified", chart.ref, chart.version, chart.repo, actual)
        elif actual != expected and not chart_sha256_verified(chart.ref):
            # Our sums come from our own packaging of the release tag; refusing the repository's own archive on
            # that basis would stop every real install, so say what differs and carry on.
            log.warning("chart %s %s from %s has sha256 %s; gpu-bootstrap's catalogue records %s from its own "
                        "packaging of the release tag, not from the repository's index, so the archive is used "
                        "unverified: compare it with the index.yaml digest", chart.ref, chart.version, chart.repo,
                        actual, expected)
        elif actual != expected:
            raise ChartDigestMismatch(
                f"chart {chart.ref} {chart.version} from {chart.repo} has sha256 {actual}, but gpu-bootstrap's "
                f"catalogue pins {expected}: refused (the repository serves another archive under this version)",
                "do not install it: compare with the repository's index.yaml digest and the chart's provenance, or "
                "install from a local .tgz you verified (helm pull; gpu_operator.chart / monitoring.chart)")
        else:
            log.info("chart %s %s: sha256 %s matches the catalogue", chart.ref, chart.version, actual)
        self._pulled[key] = archives[0]
        return archives[0]

    # --- reading ---------------------------------------------------------------------------------------------------
    def show_chart(self, chart: Chart) -> dict:
        return yaml.safe_load(self._run(["show", "chart", *self._chart_args(chart)], what="helm show chart",
                                        retry="read"))

    def status(self, release: str, namespace: str) -> dict | None:
        try:
            return json.loads(self._run(["status", release, "--namespace", namespace, "--output", "json"],
                                        what="helm status", retry="read"))
        except ReleaseNotFound:
            return None

    def deployed_chart(self, release: str, namespace: str, version: str | None = None) -> str | None:
        """'<chart name>-<version>' of the deployed release (helm list), or None. (`version`: the one a plan
        wants; helm's record names the release's chart exactly, so it is not needed here.)"""
        rows = json.loads(self._run(["list", "--namespace", namespace, "--filter", f"^{release}$", "--output", "json"],
                                    what="helm list", retry="read") or "[]")
        return rows[0].get("chart") if rows else None

    def labelled(self, release: str, namespace: str, selector: str) -> bool:
        """Does the release (in any state) carry the labels of `selector` in its metadata (helm --labels)?"""
        rows = json.loads(self._run(["list", "--namespace", namespace, "--deployed", "--failed", "--pending",
                                     "--superseded", "--uninstalling", "--filter", f"^{release}$",
                                     "--selector", selector, "--output", "json"], what="helm list",
                                    retry="read") or "[]")
        return bool(rows)

    def user_values(self, release: str, namespace: str) -> dict:
        return json.loads(self._run(["get", "values", release, "--namespace", namespace, "--output", "json"],
                                    what="helm get values", retry="read")) or {}

    def hooks(self, release: str, namespace: str) -> str:
        return self._run(["get", "hooks", release, "--namespace", namespace], what="helm get hooks", retry="read")

    def _missing_hook_accounts(self, release: str, namespace: str) -> set[tuple[str, str]]:
        """The delete hooks' ServiceAccounts that certainly do not exist (one that could not be read is not
        missing: the hooks then run, as helm would run them)."""
        if self.kube is None:
            return set()
        from gpu_bootstrap.render.helm_hooks import delete_hook_accounts
        try:
            accounts = delete_hook_accounts(self.hooks(release, namespace), namespace)
        except ReleaseNotFound:
            return set()
        missing = set()
        for account_namespace, name in accounts:
            try:
                if self.kube.get("v1", "ServiceAccount", name, account_namespace) is None:
                    missing.add((account_namespace, name))
            except ClusterError as error:
                log.info("helm uninstall %s: ServiceAccount %s/%s unreadable (%s); its hooks run", release,
                         account_namespace, name, error.message)
        return missing

    def manifest(self, release: str, namespace: str) -> str:
        return self._run(["get", "manifest", release, "--namespace", namespace], what="helm get manifest",
                         retry="read")

    def template(self, release: str, chart: Chart, values: dict, namespace: str, kube_version: str,
                 include_crds: bool = False) -> str:
        args = ["template", release, *self._chart_args(chart), "--namespace", namespace, "--kube-version",
                kube_version, "--values", "-", "--include-crds" if include_crds else "--skip-crds"]
        return self._run(args, values, what="helm template", retry="read")

    def show_crds(self, chart: Chart) -> list[dict]:
        """The chart's CRDs (its crds/ folders and its subcharts'), read once per chart and run (they are large:
        checks, plans and dry runs all ask)."""
        key = (chart.ref, chart.repo, chart.version)
        cache = self.__dict__.setdefault("_crds", {})
        if key not in cache:
            cache[key] = [doc for doc in yaml.load_all(self._run(["show", "crds", *self._chart_args(chart)],
                                                                 what="helm show crds", retry="read"),
                                                       Loader=_CrdLoader) if doc]
        return copy.deepcopy(cache[key])

    def dry_run_manifest(self, release: str, chart: Chart, values: dict, namespace: str) -> str:
        """What an upgrade would deploy, rendered by helm against the live cluster (server-side dry run)."""
        args = ["upgrade", release, *self._chart_args(chart), "--install", "--namespace", namespace,
                "--dry-run=server", "--output", "json", "--values", "-"]
        out = self._run(args, values, what="helm upgrade --dry-run", retry="read")
        return json.loads(out[out.index("{"):]).get("manifest", "")

    # --- changing ---------------------------------------------------------------------------------------------------
    def upgrade(self, release: str, chart: Chart, values: dict, namespace: str, wait: bool = True,
                timeout: str | None = None, dry_run: bool = False, labels: dict | None = None,
                skip_crds: bool = False) -> dict:
        """`labels`: kept in the release's metadata (helm --labels), e.g. who manages it. `skip_crds`: leave the
        chart's crds/ alone (another chart of ours owns the same CRDs).

        helm exits 0 when the install or upgrade worked but its last write, the release record's new status,
        failed (it logs "failed to record the release" and goes on): the release then stays pending, and the next
        run would have to recover it. So the status is read back after a success; a release left pending is
        recovered and the upgrade run once more."""
        args = ["upgrade", release, *self._chart_args(chart), "--install", "--namespace", namespace,
                "--create-namespace", "--output", "json", "--values", "-", "--timeout", timeout or self.timeout,
                "--history-max", "10"]
        if labels:
            args += ["--labels", ",".join(f"{key}={value}" for key, value in sorted(labels.items()))]
        if skip_crds:
            args += ["--skip-crds"]
        if wait and not dry_run:
            args += ["--wait"]
        if dry_run:
            args += ["--dry-run=server"]
        what = f"helm upgrade --install {release}"
        out = self._run(args, values, what=what, retry="read" if dry_run else "upgrade",
                        timeout=timeout or self.timeout,
                        recover=None if dry_run else lambda: self.recover(release, namespace, timeout))
        for repeat in (False, True) if not dry_run else ():
            state = ((self.status(release, namespace) or {}).get("info") or {}).get("status") or ""
            if not state.startswith("pending"):
                break
            if repeat:
                raise ClusterError(f"{what}: helm reported success twice but could not record the release, which "
                                   f"is {state}", "run the same command again: the pending release is recovered")
            log.warning("%s worked, but helm could not record it: the release is %s; recovering it and upgrading "
                        "once more", what, state)
            log.info("%s: %s", what, self.recover(release, namespace, timeout))
            out = self._run(args, values, what=what, retry="upgrade", timeout=timeout or self.timeout,
                            recover=lambda: self.recover(release, namespace, timeout))
        return json.loads(out[out.index("{"):])

    def history(self, release: str, namespace: str) -> list[dict]:
        return json.loads(self._run(["history", release, "--namespace", namespace, "--output", "json"],
                                    what="helm history", retry="read") or "[]")

    def rollback(self, release: str, namespace: str, revision: int, timeout: str | None = None) -> None:
        self._run(["rollback", release, str(revision), "--namespace", namespace, "--wait", "--timeout",
                   timeout or self.timeout], what=f"helm rollback {release}", timeout=timeout or self.timeout)

    def recover(self, release: str, namespace: str, timeout: str | None = None) -> str:
        """Clear a release left pending by an interrupted helm run: a pending install is removed, a pending upgrade
        or rollback goes back to the last revision that was deployed, an uninstall that could not delete the
        release's record (it stays `uninstalling`) is finished. Returns what was done."""
        revisions = self.history(release, namespace)
        if revisions and max(revisions, key=lambda r: r["revision"]).get("status") == "uninstalling":
            # Its pre-delete hooks ran in the uninstall that removed the objects. Run again, they would need the
            # ServiceAccounts that uninstall deleted: the ServiceAccount admission plugin refuses their pods, the
            # hook Job never completes, and the release stays stuck (found on a real API server).
            self.uninstall(release, namespace, wait=True, timeout=timeout, no_hooks=True)
            return "finished the interrupted uninstall"
        good = [r["revision"] for r in revisions if r.get("status") in ("deployed", "superseded")]
        if not good:
            self.uninstall(release, namespace, wait=True, timeout=timeout)
            return "removed the unfinished first install"
        self.rollback(release, namespace, max(good), timeout)
        return f"rolled back to revision {max(good)}"

    def uninstall(self, release: str, namespace: str, wait: bool = True, timeout: str | None = None,
                  dry_run: bool = False, no_hooks: bool = False) -> bool:
        """Returns False when there was no such release. The chart's delete hooks run unless `no_hooks`, or unless
        they cannot start (render/helm_hooks.py: the ServiceAccount they run as is missing)."""
        if not no_hooks and not dry_run:
            missing = self._missing_hook_accounts(release, namespace)
            if missing:
                log.warning("helm uninstall %s: its delete hooks run as ServiceAccount %s, which does not exist (the "
                            "release's install stopped before making it), so their pods would be refused and the "
                            "uninstall would wait its whole timeout: uninstalling without the hooks", release,
                            ", ".join(f"{ns}/{name}" for ns, name in sorted(missing)))
                no_hooks = True
        args = ["uninstall", release, "--namespace", namespace, "--timeout", timeout or self.timeout]
        if no_hooks:
            args.append("--no-hooks")
        if wait and not dry_run:
            args.append("--wait")
        if dry_run:
            args.append("--dry-run")
        try:
            self._run(args, what=f"helm uninstall {release}", timeout=timeout or self.timeout)
            return True
        except ReleaseNotFound:
            return False
