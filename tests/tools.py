"""Finding the real tools the tests drive, and running them in an isolated environment.

A missing tool skips the test with a reason; with GPU_BOOTSTRAP_REQUIRE_TOOLS=1 (set by .ci/run) it fails it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS_BIN = ROOT / ".tools" / "bin"
SYSTEM_TOOLS = {"sshd": "/usr/sbin/sshd", "busybox": "/bin/busybox", "promtool": "/usr/bin/promtool",
                "prometheus": "/usr/bin/prometheus",
                "openssl": "/usr/bin/openssl", "ssh-keygen": "/usr/bin/ssh-keygen",
                "docker-registry": "/usr/bin/docker-registry"}


def shared_dir() -> Path:
    """The shared charts and traces: $GPU_BOOTSTRAP_SHARED, else ../shared beside this checkout, else ../shared beside
    the local repository this checkout was cloned from (a fresh clone elsewhere, as CI makes)."""
    if os.environ.get("GPU_BOOTSTRAP_SHARED"):
        return Path(os.environ["GPU_BOOTSTRAP_SHARED"])
    candidates = [ROOT.parent / "shared"]
    try:
        origin = subprocess.run(["git", "-C", str(ROOT), "config", "--get", "remote.origin.url"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        origin = ""
    if origin and "://" not in origin and ":" not in origin.split("/")[0] and Path(origin).is_dir():
        candidates.append(Path(origin).resolve().parent / "shared")
    return next((c for c in candidates if c.is_dir()), candidates[0])


def tools_required() -> bool:
    return os.environ.get("GPU_BOOTSTRAP_REQUIRE_TOOLS") == "1"


def missing(reason: str):
    if tools_required():
        pytest.fail(f"{reason} (GPU_BOOTSTRAP_REQUIRE_TOOLS=1: run scripts/install-test-tools)")
    pytest.skip(f"{reason}; run scripts/install-test-tools")


def tool(name: str) -> str:
    """Path of a real tool: helm and kubectl only from .tools/bin (pinned), others from the system."""
    if name in ("helm", "kubectl"):
        path = TOOLS_BIN / name
        if not path.exists():
            missing(f"the pinned {name} is not installed in {TOOLS_BIN}")
        return str(path)
    path = SYSTEM_TOOLS.get(name) or shutil.which(name)
    if not path or not Path(path).exists():
        missing(f"{name} is not installed")
    return path


def go_dir() -> str | None:
    """The folder of the Go the suite builds with: the one on PATH, else the machine's /usr/local/go (as
    scripts/install-test-tools finds it)."""
    found = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    return str(Path(found).parent) if found else None


def pinned_path(path: str | None = None) -> str:
    """`path` (the caller's PATH by default) with the pinned helm and kubectl (.tools/bin) and the suite's Go first."""
    rest = os.environ.get("PATH", "") if path is None else path
    first = [str(TOOLS_BIN)] + ([go_dir()] if go_dir() else [])
    return os.pathsep.join(first + [entry for entry in rest.split(os.pathsep) if entry and entry not in first])


def tool_env(home: Path | None = None, **overrides: str) -> dict:
    """The environment of every process a test starts that runs gpu-bootstrap, helm, kubectl or Go: the caller's,
    with the pinned helm and kubectl and the suite's Go first on PATH, whatever the caller's PATH holds, and this
    checkout importable (PYTHONPATH), so `python -m gpu_bootstrap` runs this code from any folder. With `home`, the
    clients' caches and configs live under it (HOME included), never in the user's, and no KUBECONFIG leaks in.
    `overrides` are set last. tests/test_tool_env.py holds every test module to starting those programs with an
    environment from here."""
    env = dict(os.environ)
    env["PATH"] = pinned_path(env.get("PATH", ""))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                        if p and p != str(ROOT)])
    if home is not None:
        env.update({"KUBECACHEDIR": str(home / "kube-cache"), "HELM_CACHE_HOME": str(home / "helm-cache"),
                    "HELM_CONFIG_HOME": str(home / "helm-config"), "HELM_DATA_HOME": str(home / "helm-data"),
                    "HOME": str(home)})
        env.pop("KUBECONFIG", None)
    env.update(overrides)
    return env


def run(args: list[str], env: dict, timeout: float = 120, check: bool = True, input: str | None = None):
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, input=input)  # tool_env: checked at each call
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {result.returncode}\nstdout:\n{result.stdout}\n"
                             f"stderr:\n{result.stderr}")
    return result



def wait_established(read_crd, *crds: str, timeout: float = 60) -> None:
    """Until each CRD is Established; `read_crd(name)` returns the CRD as a dict. Not `kubectl wait`: on a CRD just
    created, before the API server has set any condition, it fails at once (".status.conditions accessor error:
    <nil>") instead of waiting."""
    deadline = time.monotonic() + timeout
    for crd in crds:
        while not any(c.get("type") == "Established" and c.get("status") == "True"
                      for c in (read_crd(crd).get("status") or {}).get("conditions") or []):
            assert time.monotonic() < deadline, f"CRD {crd} was not Established within {timeout:.0f} s"
            time.sleep(0.2)

# Examples per hypothesis fuzz test: few in the unit loop a developer runs after each edit (pytest -m unit must stay
# under 30 s), more in the full suite (scripts/test sets 200, so CI runs twice the 100 it used to).
FUZZ_EXAMPLES = int(os.environ.get("GPU_BOOTSTRAP_FUZZ_EXAMPLES", "50"))


class Stall:
    """The CPU this machine withheld while the block ran: the summed lateness of a thread that asks to wake every
    20 ms. A deadline seen from outside a process (a signalled run's exit, promised within 4.5 s) is held to its
    bound plus this, so a test starved by its neighbours (the suite runs on two cores, the local cluster beside it)
    does not fail for their sake, while on a quiet machine the stall is ~0 and the bound is the promise itself."""

    TICK = 0.02

    def __init__(self):
        import threading
        self.late = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._measure, daemon=True)

    def _measure(self) -> None:
        import time
        while not self._stop.is_set():
            before = time.monotonic()
            time.sleep(self.TICK)
            self.late += max(0.0, time.monotonic() - before - self.TICK)

    def __enter__(self) -> "Stall":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
