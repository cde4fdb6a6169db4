"""The Helm adapter: pyhelm3 driving the real helm binary (v3.14+ or v4), synchronously.

Values always travel on stdin. A chart is a repository chart (name + repository URL) or a local .tgz / directory,
for air-gapped clusters. A helm failure becomes one ClusterError carrying helm's own error line.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from pathlib import Path

import yaml

from ..errors import ClusterError, ConfigError
from ..refs import Chart

log = logging.getLogger("gpu_bootstrap.helm")


def find_helm() -> str:
    candidate = os.environ.get("GPU_BOOTSTRAP_HELM") or shutil.which("helm")
    if not candidate or not Path(candidate).exists():
        raise ConfigError("helm not found", "install helm v3.14+ or v4 on PATH, or set GPU_BOOTSTRAP_HELM")
    return candidate


def _error_line(error) -> str:
    text = (getattr(error, "stderr", b"") or b"").decode(errors="replace").strip() or str(error)
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    return (errors[-1] if errors else (lines[-1] if lines else "helm failed"))[:600]


class Helm:
    def __init__(self, kubeconfig: Path | None = None, context: str | None = None, executable: str | None = None,
                 timeout: str = "10m"):
        self.kubeconfig = kubeconfig
        self.context = context
        self.executable = executable
        self.timeout = timeout
        self._command = None

    def _cmd(self):
        if self._command is None:
            from pyhelm3 import Command
            self._command = Command(executable=self.executable or find_helm(), kubeconfig=self.kubeconfig,
                                    kubecontext=self.context, default_timeout=self.timeout)
        return self._command

    def _run(self, args: list[str], values: dict | None = None, what: str = "helm") -> str:
        from pyhelm3 import errors
        stdin = json.dumps(values).encode() if values is not None else None
        log.debug("helm %s", " ".join(a if not a.startswith("{") else "<json>" for a in args))
        try:
            return asyncio.run(self._cmd().run(args, stdin)).decode()
        except errors.ReleaseNotFoundError:
            raise
        except errors.Error as error:
            raise ClusterError(f"{what} failed: {_error_line(error)}",
                               "see the log for helm's full output") from None

    @staticmethod
    def _chart_args(chart: Chart) -> list[str]:
        args = [chart.ref]
        if chart.repo:
            args += ["--repo", chart.repo]
        if chart.version:
            args += ["--version", chart.version]
        return args

    # --- reading ---------------------------------------------------------------------------------------------------
    def show_chart(self, chart: Chart) -> dict:
        return yaml.safe_load(self._run(["show", "chart", *self._chart_args(chart)], what="helm show chart"))

    def status(self, release: str, namespace: str) -> dict | None:
        from pyhelm3 import errors
        try:
            return json.loads(self._run(["status", release, "--namespace", namespace, "--output", "json"],
                                        what="helm status"))
        except errors.ReleaseNotFoundError:
            return None

    def deployed_chart(self, release: str, namespace: str) -> str | None:
        """'<chart name>-<version>' of the deployed release (helm list), or None."""
        rows = json.loads(self._run(["list", "--namespace", namespace, "--filter", f"^{release}$", "--output", "json"],
                                    what="helm list") or "[]")
        return rows[0].get("chart") if rows else None

    def user_values(self, release: str, namespace: str) -> dict:
        return json.loads(self._run(["get", "values", release, "--namespace", namespace, "--output", "json"],
                                    what="helm get values")) or {}

    def manifest(self, release: str, namespace: str) -> str:
        return self._run(["get", "manifest", release, "--namespace", namespace], what="helm get manifest")

    def template(self, release: str, chart: Chart, values: dict, namespace: str, kube_version: str,
                 include_crds: bool = False) -> str:
        args = ["template", release, *self._chart_args(chart), "--namespace", namespace, "--kube-version",
                kube_version, "--values", "-", "--include-crds" if include_crds else "--skip-crds"]
        return self._run(args, values, what="helm template")

    def show_crds(self, chart: Chart) -> list[dict]:
        return [doc for doc in yaml.safe_load_all(self._run(["show", "crds", *self._chart_args(chart)],
                                                            what="helm show crds")) if doc]

    def dry_run_manifest(self, release: str, chart: Chart, values: dict, namespace: str) -> str:
        """What an upgrade would deploy, rendered by helm against the live cluster (server-side dry run)."""
        args = ["upgrade", release, *self._chart_args(chart), "--install", "--namespace", namespace,
                "--dry-run=server", "--output", "json", "--values", "-"]
        out = self._run(args, values, what="helm upgrade --dry-run")
        return json.loads(out[out.index("{"):]).get("manifest", "")

    # --- changing ---------------------------------------------------------------------------------------------------
    def upgrade(self, release: str, chart: Chart, values: dict, namespace: str, wait: bool = True,
                timeout: str | None = None, dry_run: bool = False) -> dict:
        args = ["upgrade", release, *self._chart_args(chart), "--install", "--namespace", namespace,
                "--create-namespace", "--output", "json", "--values", "-", "--timeout", timeout or self.timeout,
                "--history-max", "10"]
        if wait and not dry_run:
            args += ["--wait"]
        if dry_run:
            args += ["--dry-run=server"]
        out = self._run(args, values, what=f"helm upgrade --install {release}")
        return json.loads(out[out.index("{"):])

    def history(self, release: str, namespace: str) -> list[dict]:
        return json.loads(self._run(["history", release, "--namespace", namespace, "--output", "json"],
                                    what="helm history") or "[]")

    def rollback(self, release: str, namespace: str, revision: int, timeout: str | None = None) -> None:
        self._run(["rollback", release, str(revision), "--namespace", namespace, "--wait", "--timeout",
                   timeout or self.timeout], what=f"helm rollback {release}")

    def recover(self, release: str, namespace: str, timeout: str | None = None) -> str:
        """Clear a release left pending by an interrupted helm run: a pending install is removed, a pending upgrade
        or rollback goes back to the last revision that was deployed. Returns what was done."""
        revisions = self.history(release, namespace)
        good = [r["revision"] for r in revisions if r.get("status") in ("deployed", "superseded")]
        if not good:
            self.uninstall(release, namespace, wait=True, timeout=timeout)
            return "removed the unfinished first install"
        self.rollback(release, namespace, max(good), timeout)
        return f"rolled back to revision {max(good)}"

    def uninstall(self, release: str, namespace: str, wait: bool = True, timeout: str | None = None,
                  dry_run: bool = False) -> bool:
        """Returns False when there was no such release."""
        from pyhelm3 import errors
        args = ["uninstall", release, "--namespace", namespace, "--timeout", timeout or self.timeout]
        if wait and not dry_run:
            args.append("--wait")
        if dry_run:
            args.append("--dry-run")
        try:
            self._run(args, what=f"helm uninstall {release}")
            return True
        except errors.ReleaseNotFoundError:
            return False
