"""Secrets stay in the cluster: what gpu-bootstrap prints, logs or writes to a render dir carries no secret value.

Two rules, both pure (no adapter, no I/O):

* by key: a string under a key that names a secret (`adminPassword`, `apiKey`, `bearer_token`, `credentials`,
  `routing_key`, ...; not a reference to one such as `existingSecret` or `secretName`), an env-style
  `{name: NGC_API_KEY, value: ...}`, and every value of a Secret's `data`/`stringData`;
* by value: text that is a secret whatever its key: a URL's password (`https://user:pw@host`), a chat webhook
  (Slack, Discord, Teams), a secret query parameter (`?token=`), a PEM private key, a token with a known prefix
  (`xoxb-`, `ghp_`, `nvapi-`, `AKIA`, a JWT), and `password: x` / `"apiKey": "x"` lines inside embedded files.

What is replaced becomes REDACTED; the structure, every key and every other value stay, so a render is still
reviewable. Plans go further and print no value of the user's at all, only its path (render/gpu_operator_values.py).
"""
from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"

_SECRET_WORDS = (r"password|passwd|passphrase|secret|token|credentials?|api[-_]?key|apikey|private[-_]?key|"
                 r"(access|auth|client|routing|service|integration|signing|encryption|license|ssh)[-_]?key|"
                 r"webhook[-_]?url|bearer|authorization|cookie|session[-_]?id|dsn|^pass$|^pwd$")
SECRET_KEY = re.compile(_SECRET_WORDS, re.IGNORECASE)
# keys that name a secret's *reference* or a setting about it, not its value (secretName: grafana-admin)
_REFERENCE = re.compile(r"(name|names|ref|file|path|paths|dir|mount|mountpath|namespace|enabled|selector|type|tokens|"
                        r"policy|seconds|ttl|expiration|length|prefix|annotations?|labels?|pull[-_]?secrets?)$|"
                        r"^existing|^use[A-Z]|"
                        r"^(create|generate|rotate|auto)", re.IGNORECASE)

_VALUE_PATTERNS = [  # (pattern, replacement): each keeps what identifies the thing and drops the secret part
    (re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(-----END \1PRIVATE KEY-----|\Z)", re.DOTALL),
     "-----BEGIN \\1PRIVATE KEY-----" + REDACTED + "-----END \\1PRIVATE KEY-----"),
    (re.compile(r"\b([a-z][a-z0-9+.-]*://[^/\s:@'\"]*:)[^/\s@'\"]+@", re.IGNORECASE), "\\1" + REDACTED + "@"),
    (re.compile(r"(https?://(?:hooks\.slack\.com/(?:services|workflows|triggers)|"
                r"(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks|[a-z0-9.-]*webhook\.office\.com/webhook\w*|"
                r"outlook\.office\.com/webhook)/)[^\s'\"<>]+", re.IGNORECASE), "\\1" + REDACTED),
    (re.compile(r"([?&](?:access_token|token|api[-_]?key|apikey|key|sig|signature|password|secret|code)=)"
                r"[^&\s'\"#<>]+", re.IGNORECASE), "\\1" + REDACTED),
    (re.compile(r"\b(xox[abposr]-|gh[pousr]_|github_pat_|glpat-|nvapi-|sk-|hf_)[A-Za-z0-9_-]{10,}"),
     "\\1" + REDACTED),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "AKIA" + REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
]
# `password: x`, `api_key = x`, `"apiKey": "x"` inside an embedded file (a ConfigMap's config, an ini, JSON)
# A value never starts with `{` or `[`: a nested inline map or list is not consumed, so the scan goes on inside it
# and finds `{"stringData": {"password": "x"}}` or `values: {grafana: {adminPassword: x}}` too.
_ASSIGNMENT = re.compile(r"""(?P<lead>(?:^|[\s{,])(?P<q>["']?)(?P<key>[A-Za-z_][\w.-]*)(?P=q)[ \t]*[:=](?!=)[ \t]*)"""
                         r"""(?P<value>"[^"\n]*"|'[^'\n]*'|[^\s,}'"{\[][^\n,}]*)""", re.MULTILINE)

# `"Authorization: Bearer x"`, `'password=x'`: a whole key-and-value inside one pair of quotes, after other text on
# the line (a curl command, a helm error quoting a header); the value ends at the closing quote
_QUOTED_ASSIGNMENT = re.compile(r"""(?P<lead>(?:^|(?<=[^\w"']))(?P<q>["'])[ \t]*(?P<key>[A-Za-z_][\w.-]*)[ \t]*[:=](?!=)"""
                                r"""[ \t]*)(?P<value>[^"'\n]+)(?P=q)""", re.MULTILINE)


def secret_key(key: Any) -> bool:
    """Does this key hold a secret's value (not a reference to one)?"""
    text = str(key)
    return bool(SECRET_KEY.search(text)) and not _REFERENCE.search(text)


def text(value: str) -> str:
    """A string with every secret-looking part replaced (the rules by value, and key: value lines inside it)."""
    if not value:
        return value
    for pattern, replacement in _VALUE_PATTERNS:
        value = pattern.sub(replacement, value)
    if ":" in value or "=" in value:
        value = _QUOTED_ASSIGNMENT.sub(_quoted_assignment, value)
        value = _ASSIGNMENT.sub(_assignment, value)
    return value


def _quoted_assignment(match: re.Match) -> str:
    found = match.group("value").strip()
    if not secret_key(match.group("key")) or not found or found.startswith(("$", "<")):
        return match.group(0)
    return f"{match.group('lead')}{REDACTED}{match.group('q')}"


def _assignment(match: re.Match) -> str:
    found = match.group("value").strip()
    if not secret_key(match.group("key")) or REDACTED in found or found in ('""', "''", "null", "~") or \
            found.startswith(("{", "[", "$", "<")):  # a nested block, a template or a placeholder: not a value
        return match.group(0)
    quote = found[0] if found[0] in "\"'" else ""
    return f"{match.group('lead')}{quote}{REDACTED}{quote}"


def tree(value: Any, key: Any = None) -> Any:
    """A copy of a YAML/JSON tree with secret values replaced; a Secret's data and stringData entirely."""
    if isinstance(value, dict):
        if value.get("kind") == "Secret" and isinstance(value.get("apiVersion"), str):
            value = {k: ({name: REDACTED for name in v} if k in ("data", "stringData") and isinstance(v, dict)
                         else v) for k, v in value.items()}
        env_style = isinstance(value.get("name"), str) and secret_key(value["name"]) and "value" in value
        return {k: (_hidden(v) if env_style and k == "value" else tree(v, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [tree(item, key) for item in value]
    if isinstance(value, str):
        return _hidden(value) if key is not None and secret_key(key) else text(value)
    if key is not None and secret_key(key):
        return _hidden(value)  # a number is a secret too (adminPassword: 73195824)
    return value


def _hidden(value: Any) -> Any:
    """A secret key's value: hidden when it holds something (an empty string or null hides nothing). A boolean is a
    switch (plans show true/false too), not a secret; any other scalar (a number, a date) is hidden."""
    if isinstance(value, (dict, list)):
        return tree(value)
    if value is None or isinstance(value, bool) or value == "":
        return value
    return REDACTED


def manifests(stream: str) -> str:
    """A multi-document YAML stream (helm template's output) with every document passed through `tree`. A document
    that needs no change keeps its exact text (and helm's `# Source:` comment); one that does is written anew."""
    import yaml
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: a chart's CRDs are megabytes
    out = []
    for document in re.split(r"(?m)^---[ \t]*$", stream):
        try:
            loaded = yaml.load(document, Loader=loader)
        except yaml.YAMLError:
            out.append(text(document))
            continue
        cleaned = tree(loaded)
        if cleaned == loaded:
            out.append(document)
            continue
        leading = []  # helm's "# Source: chart/templates/x.yaml" says where the document came from: kept
        for line in document.lstrip("\n").splitlines():
            if not line.startswith("#"):
                break
            leading.append(line)
        body = yaml.safe_dump(cleaned, sort_keys=False)
        out.append("\n" + "\n".join([*leading, "# secret values redacted by gpu-bootstrap", body.rstrip("\n")])
                   + "\n")
    return "---".join(out)
