"""The config's building blocks: the base Section, the field patterns and validators several sections share,
label-selector parsing, and the catalogue's default images."""
from __future__ import annotations

import ipaddress
import re

from pydantic import BaseModel, ConfigDict

__all__ = [
    "DEFAULT_CONFIG", "DNS1123_LABEL", "DNS1123_SUBDOMAIN", "DURATION", "ENV_OVERRIDES", "HOSTNAME", "LABEL_NAME",
    "LABEL_VALUE", "POSIX_USER", "QUANTITY", "SCHEDULER_RESOURCE", "SELECTOR_TERM", "Section", "check_address",
    "check_dns_label", "check_dns_subdomain", "check_label_key", "check_label_value", "check_node_name", "parse_age",
    "selector_equalities", "selector_problem"]


DEFAULT_CONFIG = "gpu-bootstrap.yaml"
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
HOSTNAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*")
POSIX_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+")  # Prometheus' duration syntax
AGE = re.compile(r"([0-9]+[smhdw])+")  # preflight.max_facts_age
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# an extended resource name (nvidia.com/gpu), as the scheduler and Karpenter take it
SCHEDULER_RESOURCE = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
ENV_OVERRIDES = {
    "GPU_BOOTSTRAP_KUBECONFIG": ("cluster", "kubeconfig"),
    "GPU_BOOTSTRAP_CONTEXT": ("cluster", "context"),
    "GPU_BOOTSTRAP_SSH_USER": ("ssh", "user"),
    "GPU_BOOTSTRAP_SSH_PORT": ("ssh", "port"),
    "GPU_BOOTSTRAP_SSH_IDENTITY_FILE": ("ssh", "identity_file"),
    "GPU_BOOTSTRAP_SSH_KNOWN_HOSTS": ("ssh", "known_hosts"),
    "GPU_BOOTSTRAP_SSH_HOST_KEY_POLICY": ("ssh", "host_key_policy"),
}


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- validators shared by several fields ---------------------------------------------------------------------------
def parse_age(text: str) -> int:
    """'7d', '36h', '1d12h', '0s' -> seconds; ValueError for anything else."""
    if not isinstance(text, str) or not AGE.fullmatch(text):
        raise ValueError(f"{str(text)[:40]!r} is not an age (e.g. 7d, 36h, 1d12h, 30m; 0s never reuses facts)")
    return sum(int(n) * _AGE_UNITS[unit] for n, unit in re.findall(r"([0-9]+)([smhdw])", text))


def check_node_name(name: str) -> str:
    if len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name):
        raise ValueError(f"{name[:60]!r} is not a valid Kubernetes node name (lowercase letters, digits, '-' and '.', "
                         f"starting and ending with a letter or digit, at most 253 characters)")
    return name


def check_dns_label(value: str, limit: int = 63) -> str:
    """A namespace, release or other object name that must be a DNS-1123 label: it also goes into label values,
    Service host names and the shell lines `rbac` prints, so nothing else is let through."""
    if len(value) > limit or not DNS1123_LABEL.fullmatch(value):
        raise ValueError(f"{value[:60]!r} must be a lowercase DNS label of at most {limit} characters (letters, "
                         f"digits and '-', starting and ending with a letter or digit)")
    return value


DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def check_dns_subdomain(value: str) -> str:
    """An object name (an AppProject, a GitRepository): a DNS-1123 subdomain."""
    if len(value) > 253 or not DNS1123_SUBDOMAIN.fullmatch(value) or ".." in value:
        raise ValueError(f"{value[:60]!r} must be a lowercase DNS subdomain of at most 253 characters (letters, "
                         f"digits, '-' and '.', starting and ending with a letter or digit)")
    return value


def check_address(address: str) -> str:
    try:
        ipaddress.ip_address(address)
        return address
    except ValueError:
        pass
    if len(address) > 253 or not HOSTNAME.fullmatch(address):
        raise ValueError(f"{address[:60]!r} is neither an IP address nor a host name")
    return address


def check_label_key(key: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if (slash and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.fullmatch(prefix))) or \
            not name or len(name) > 63 or not LABEL_NAME.fullmatch(name):
        raise ValueError(f"{key[:80]!r} is not a valid label or taint key (optional DNS prefix '/', then up to 63 "
                         f"letters, digits, '-', '_' or '.')")
    return key


def check_label_value(value: str) -> str:
    if len(value) > 63 or not LABEL_VALUE.fullmatch(value):
        raise ValueError(f"{value[:80]!r} is not a valid label or taint value (up to 63 letters, digits, '-', '_' or "
                         f"'.', starting and ending with a letter or digit)")
    return value


SELECTOR_TERM = re.compile(r"\s*(!?)\s*([^\s=!,()]+)(?:\s*(==|=|!=)\s*([^\s,()]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*")


def selector_problem(selector: str) -> str | None:
    """What is wrong with a Kubernetes label selector (kubectl -l syntax), or None."""
    if not selector:
        return "the label selector is empty"
    rest = selector
    while rest:
        term = SELECTOR_TERM.match(rest)
        if not term or not term.group(2):
            return f"{selector[:80]!r} is not a label selector (e.g. karpenter.sh/nodepool=gpu, or gpu in (a,b))"
        try:
            check_label_key(term.group(2))
            for value in [term.group(4)] if term.group(4) else (term.group(6) or "").split(","):
                check_label_value(value.strip())
        except ValueError as error:
            return f"in the label selector: {error}"
        rest = rest[term.end():]
        if rest and not rest.startswith(","):
            return f"{selector[:80]!r} is not a label selector (terms are separated by ',')"
        rest = rest[1:]
    return None


def selector_equalities(selector: str) -> dict[str, str]:
    """The key=value terms of a valid label selector (what a nodeSelector can express), {} when it has others."""
    found, rest = {}, selector
    while rest:
        term = SELECTOR_TERM.match(rest)
        if term.group(1) or term.group(3) not in ("=", "=="):
            return {}
        found[term.group(2)] = term.group(4)
        rest = rest[term.end():].removeprefix(",")
    return found


def _catalogued(name: str) -> str:
    """A default image from the supply-chain catalogue (data/images.yaml), by digest where it records one."""
    from gpu_bootstrap.core.catalogue import default
    return default(name)
