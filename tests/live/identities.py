"""Identities for the live suite: `gpu-bootstrap rbac --for COMMAND` applied as a cluster admin would (its policy, roles
and bindings), bound to a ServiceAccount whose token comes from the TokenRequest API, and kubectl with only that
token. Everything applied is labelled gpu-bootstrap.io/live-test=rbac and removed by `remove_all`."""
from __future__ import annotations

import base64
import time
from pathlib import Path

import yaml

LIVE_LABEL = ("gpu-bootstrap.io/live-test", "rbac")
KINDS = "clusterroles,clusterrolebindings,roles,rolebindings,validatingadmissionpolicies," \
        "validatingadmissionpolicybindings"


def generate(target, deployment, command: str, service_account: str | None, *more: str) -> str:
    from gpu_bootstrap.cli.commands import app
    from tests.conftest import _process_state_kept
    from tests.live.conftest import runner
    args = ["rbac", "--for", command, "-c", str(deployment.config), "--playbook", str(target.playbook),
            "--kubeconfig", str(target.kubeconfig), *more]
    if service_account:
        args += ["--service-account", service_account]
    # in-process: the session's `deployment` fixture calls this before any module's state is saved, so the run's log
    # handler and signal handlers are put back here (tests/test_process_state.py)
    with _process_state_kept():
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.stdout


def grant(target, deployment, command: str, folder: Path, service_account: str,
          drop: tuple[str, str, str] | None = None, keep=None, more: tuple[str, ...] = ()) -> Path:
    """Apply `rbac --for COMMAND --service-account NS/NAME` (one rule's verb removed with drop=(kind, resource,
    verb); `keep(doc)` False leaves a document out, as a broken grant would) and return a kubeconfig holding a
    TokenRequest token of that ServiceAccount (`more`: further rbac options). Waits until the grant (and its admission
    policy) is in force."""
    text = generate(target, deployment, command, service_account, *more)
    create_namespaces_as_the_header_says(target, text)
    docs = [d for d in yaml.safe_load_all(text) if d]
    docs = [d for d in docs if keep is None or keep(d)]
    for doc in docs:
        doc["metadata"].setdefault("labels", {})[LIVE_LABEL[0]] = LIVE_LABEL[1]
        if drop and doc["kind"] == drop[0]:
            for rule in doc.get("rules") or []:
                if drop[1] in rule["resources"]:
                    rule["verbs"] = [v for v in rule["verbs"] if v != drop[2]]
            doc["rules"] = [r for r in doc.get("rules") or [] if r["verbs"]]
    namespace, _, name = service_account.partition("/")
    target.kubectl("create", "namespace", namespace, check=False)
    target.kubectl("create", "serviceaccount", name, "-n", namespace, check=False)
    target.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    path = kubeconfig(target, service_account, folder / f"kubeconfig-{command}-{name}")
    if any(d["kind"] == "ValidatingAdmissionPolicy" for d in docs):
        wait_for_policy(target, path, service_account)
    return path


def create_namespaces_as_the_header_says(target, text: str) -> None:
    """The Roles live in namespaces `up` creates: before the first `up` the admin runs the header's lines."""
    import shlex
    for line in text.splitlines():
        if not line.startswith("#   kubectl create namespace "):
            continue
        for command in line[len("#   "):].split(" && "):
            words = shlex.split(command)
            assert words[0] == "kubectl", line
            target.kubectl(*words[1:], check=False)  # namespaces `up` already made are there


def kubeconfig(target, service_account: str, path: Path) -> Path:
    namespace, _, name = service_account.partition("/")
    token = target.kubectl("create", "token", name, "-n", namespace, "--duration=1h").stdout.strip()
    ca = base64.b64encode(target.cluster.ca.read_bytes()).decode()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "ci",
        "clusters": [{"name": "local", "cluster": {"server": target.cluster.server,
                                                   "certificate-authority-data": ca}}],
        "users": [{"name": "ci", "user": {"token": token}}],
        "contexts": [{"name": "ci", "context": {"cluster": "local", "user": "ci"}}]}))
    path.chmod(0o600)
    return path


def wait_for_policy(target, kubeconfig_path: Path, service_account: str, timeout: float = 60) -> None:
    """The API server loads a new ValidatingAdmissionPolicy a moment after it is stored, so until a real write of
    this identity is denied by it, no attack would prove anything. The identity is let create ConfigMaps in a
    namespace of its own for a moment (a Role the admin grants), and tries until the policy denies it."""
    namespace = f"gpu-bootstrap-live-probe-{abs(hash(service_account)) % 10 ** 8}"
    target.kubectl("create", "namespace", namespace, check=False)
    name = service_account.replace("/", "-")
    target.kubectl("create", "role", f"policy-probe-{name}", "-n", namespace, "--verb=create", "--resource=configmaps")
    target.kubectl("label", "role", f"policy-probe-{name}", "-n", namespace, f"{LIVE_LABEL[0]}={LIVE_LABEL[1]}")
    sa_namespace, _, sa_name = service_account.partition("/")
    target.kubectl("create", "rolebinding", f"policy-probe-{name}", "-n", namespace, f"--role=policy-probe-{name}",
                   f"--serviceaccount={sa_namespace}:{sa_name}")
    try:
        deadline = time.monotonic() + timeout
        while True:
            made = as_token(kubeconfig_path, "create", "configmap", "policy-probe", "-n", namespace)
            if made.returncode != 0 and "ValidatingAdmissionPolicy" in made.stderr:
                return
            if made.returncode == 0:
                target.kubectl("delete", "configmap", "policy-probe", "-n", namespace, "--ignore-not-found")
            assert time.monotonic() < deadline, f"the admission policy of {service_account} never took effect: " \
                                                f"{made.stderr or 'a real write went through'}"
            time.sleep(0.5)
    finally:
        target.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def as_token(kubeconfig_path: Path, *args: str, input: str | None = None):
    """kubectl with only the ServiceAccount's token (its own kubeconfig), never the admin's."""
    from tests.tools import tool_env, run, tool
    return run([tool("kubectl"), "--kubeconfig", str(kubeconfig_path), *args], tool_env(kubeconfig_path.parent),
               60, False, input)


def can_i(target, service_account: str, verb: str, resource: str, *more: str) -> bool:
    namespace, _, name = service_account.partition("/")
    result = target.kubectl("auth", "can-i", verb, resource, f"--as=system:serviceaccount:{namespace}:{name}", *more,
                            check=False)
    return result.stdout.strip() == "yes"


def remove_all(target, *namespaces: str) -> None:
    target.kubectl("delete", KINDS, "-A", "-l", f"{LIVE_LABEL[0]}={LIVE_LABEL[1]}", check=False)
    for namespace in namespaces:
        target.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true")
