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
                 r"webhook[-_]?url|bearer|authorization|cookie|session[-_]?id|dsn|^pass$|^pwd$|"
                 r"(^|[-_.])auth$|^basic[-_]?auth|^\.?dockerconfigjson$|^\.?dockercfg$|htpasswd")
SECRET_KEY = re.compile(_SECRET_WORDS, re.IGNORECASE)
# keys that name a secret's *reference* or a setting about it, not its value (secretName: grafana-admin)
_REFERENCE = re.compile(r"(name|names|ref|file|path|paths|dir|mount|mountpath|namespace|enabled|selector|type|tokens|"
                        r"policy|seconds|ttl|expiration|length|prefix|annotations?|labels?|pull[-_]?secrets?)$|"
                        r"^existing|^use[A-Z]|"
                        r"^(create|generate|rotate|auto)", re.IGNORECASE)

_VALUE_PATTERNS = [  # (pattern, replacement): each keeps what identifies the thing and drops the secret part
    (re.compile(r"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY[A-Z0-9 ]*)-----.*?(-----END \1-----|\Z)", re.DOTALL),
     "-----BEGIN \\1-----" + REDACTED + "-----END \\1-----"),
    # htpasswd lines (nginx, Prometheus' web config): user:<hash>
    (re.compile(r"(?m)^([ \t]*[^:\s#]+):(\$apr1\$|\$2[abxy]?\$|\$[156]\$|\{SSHA?\})\S+"), "\\1:" + REDACTED),
    (re.compile(r"\b([a-z][a-z0-9+.-]*://[^/\s:@'\"]*:)[^/\s@'\"]+@", re.IGNORECASE), "\\1" + REDACTED + "@"),
    (re.compile(r"(https?://(?:hooks\.slack\.com/(?:services|workflows|triggers)|"
                r"(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks|[a-z0-9.-]*webhook\.office\.com/webhook\w*|"
                r"outlook\.office\.com/webhook)/)[^\s'\"<>]+", re.IGNORECASE), "\\1" + REDACTED),
    (re.compile(r"([?&][\w.-]*(?:token|key|sig|signature|password|passwd|secret|code|auth|credential)[\w.-]*=)"
                r"[^&\s'\"#<>]+", re.IGNORECASE), "\\1" + REDACTED),
    # a command-line flag that names a secret: --db-password=x, -api-key=x (not --token-file=/path: a reference)
    (re.compile(r"(?<![\w-])(--?(?![\w.-]*(?:file|path|dir|name|ttl|mode)=)[A-Za-z0-9][\w.-]*?"
                r"(?:password|passwd|secret|token|api[-_.]?key|apikey|credentials?|private[-_.]?key|access[-_.]?key|"
                r"auth[-_.]?key|client[-_.]?key)[\w.-]*=)([^\s'\",]+)", re.IGNORECASE), "\\1" + REDACTED),
    # a flag named for auth itself (--auth=x, --basic-auth=x; not --authorization-mode=RBAC)
    (re.compile(r"(?<![\w-])(--?(?:[\w.-]*[-_.])?auth=)([^\s'\",]+)", re.IGNORECASE), "\\1" + REDACTED),
    (re.compile(r"\b(xox[abposr]-|gh[pousr]_|github_pat_|glpat-|nvapi-|sk-|hf_)[A-Za-z0-9_-]{10,}"),
     "\\1" + REDACTED),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "AKIA" + REDACTED),
    (re.compile(r"\b(hv[sbr]\.)[A-Za-z0-9_-]{12,}"), "\\1" + REDACTED),  # Vault tokens
    # curl -u user:password (and --user): the user stays
    (re.compile(r"(?<![\w-])((?:-u|--user)\s+[^\s:'\"]+:)[^\s'\"]+"), "\\1" + REDACTED),
    # a connection string's password after harmless key=value pairs (host=db user=g password=x)
    (re.compile(r"((?:^|\s)(?:password|passwd|pwd)=)[^\s'\";]+", re.IGNORECASE), "\\1" + REDACTED),
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


def reference(key: Any) -> bool:
    """Does this key name a secret's reference or a setting about it (secretName, existingSecret, passwordFile)?"""
    return bool(_REFERENCE.search(str(key)))


def secret_key(key: Any) -> bool:
    """Does this key hold a secret's value (not a reference to one)?"""
    text = str(key)
    return bool(SECRET_KEY.search(text)) and not _REFERENCE.search(text)


_URL = re.compile(r"\b((?:https?|wss?)://[^/\s'\"<>?#]+)(/[^\s'\"<>?#]*)")
_BASE64_BLOB = re.compile(r"[A-Za-z0-9+/]{40,}={0,2}")
_PUBLIC_PEM = re.compile(r"-----BEGIN (CERTIFICATE|PUBLIC KEY|X509 CRL|CERTIFICATE REQUEST)-----")


def tokenish(part: str) -> bool:
    """Does this look like a generated token (a webhook's path, an API key), not a word or a name? 16 or more
    characters of a token's alphabet, digits among letters: `3f9a8b7c6d5e4f3a2b1c`, `AbC123xYz987LmN4`; not
    `kube-prometheus-stack-prometheus-0` nor a version."""
    if len(part) < 16 or not re.fullmatch(r"[A-Za-z0-9_~+=-]+", part):
        return False
    digits = sum(c.isdigit() for c in part)
    upper, lower = sum(c.isupper() for c in part), sum(c.islower() for c in part)
    return digits >= 4 or (digits >= 1 and upper >= 2 and lower >= 2)


def _url_path(match: re.Match) -> str:
    """A URL's path segments that look like tokens (a webhook's secret part) are replaced."""
    segments = [REDACTED if tokenish(segment) else segment for segment in match.group(2).split("/")]
    return match.group(1) + "/".join(segments)


def _base64_pem(match: re.Match) -> str:
    """A base64 blob that decodes to a PEM block other than a certificate or public key (a `tls.key` value)."""
    import base64
    import binascii
    blob = match.group(0)
    if not blob.startswith("LS0tLS1CRUdJT"):  # "-----BEGIN" in base64
        return blob
    try:
        decoded = base64.b64decode(blob + "=" * (-len(blob) % 4)).decode("ascii", "replace")
    except (binascii.Error, ValueError):
        return blob
    blocks = re.findall(r"-----BEGIN [^-]+-----", decoded)
    return blob if blocks and all(_PUBLIC_PEM.match(b) for b in blocks) else REDACTED


def text(value: str) -> str:
    """A string with every secret-looking part replaced (the rules by value, and key: value lines inside it)."""
    if not value:
        return value
    for pattern, replacement in _VALUE_PATTERNS:
        value = pattern.sub(replacement, value)
    if "://" in value:
        value = _URL.sub(_url_path, value)
    if "LS0tLS1CRUdJT" in value:
        value = _BASE64_BLOB.sub(_base64_pem, value)
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


# a command-line flag that names a secret and takes its value as the next argument: ["--db-password", "x"]
SECRET_FLAG = re.compile(r"--?[A-Za-z0-9][\w.-]*?(password|passwd|secret|token|api[-_.]?key|apikey|credentials?|"
                         r"private[-_.]?key|access[-_.]?key|auth[-_.]?key|client[-_.]?key)[\w.-]*", re.IGNORECASE)
# `user:password` as a whole value (curl's -u, Alertmanager's and registries' auth strings); not host:port, an image
# tag or a version
_USER_PASS = re.compile(r"[A-Za-z0-9._%+@-]{1,128}:(?P<password>[^\s:/@]{3,})")
_NOT_A_PASSWORD = re.compile(r"v?[0-9]+([.-][0-9A-Za-z]+)*|latest|stable")
# on screen, a `user:password` string is looked for only under keys about credentials: in rendered manifests the
# shape is everywhere (role names, recording rules `apiserver_request:availability30d`); an export looks everywhere
_CREDENTIAL_KEY = re.compile(r"auth|user|login|cred|basic|proxy|pass", re.IGNORECASE)
_IMAGE_KEYS = re.compile(r"(image|tag|repository|version|registry|host|address|endpoint|url|addr)$", re.IGNORECASE)


def user_password(value: str, key: Any = None) -> bool:
    """Is this whole string a `user:password` pair? Its second part must look like a password: a digit, a capital
    or a symbol in it, not only the lowercase words and dashes of a name (`system:kube-scheduler`, a recording rule's
    `node_namespace_pod_container:container_memory_cache`), a version or a digest."""
    found = _USER_PASS.fullmatch(value)
    if not found or re.fullmatch(r"sha\d+:[0-9a-f]+", value) or \
            re.fullmatch(r"[a-z_.-]+", found.group("password")):
        return False
    return not _NOT_A_PASSWORD.fullmatch(found.group("password")) and \
        not (key is not None and _IMAGE_KEYS.search(str(key)))


def tree(value: Any, key: Any = None) -> Any:
    """A copy of a YAML/JSON tree with secret values replaced; a Secret's data and stringData entirely."""
    if isinstance(value, dict):
        if value.get("kind") == "Secret" and isinstance(value.get("apiVersion"), str):
            value = {k: ({name: REDACTED for name in v} if k in ("data", "stringData") and isinstance(v, dict)
                         else v) for k, v in value.items()}
        env_style = isinstance(value.get("name"), str) and secret_key(value["name"]) and "value" in value
        return {k: (_hidden(v) if (env_style and k == "value") or k == "auths" else tree(v, k))
                for k, v in value.items()}  # `auths`: a docker config's credentials, whatever their keys
    if isinstance(value, list):
        return [_hidden(item) if index and _takes_secret(value[index - 1]) else tree(item, key)
                for index, item in enumerate(value)]
    if isinstance(value, str):
        if key is not None and secret_key(key):
            return _hidden(value)
        if key is not None and _CREDENTIAL_KEY.search(str(key)) and user_password(value, key):
            return value.partition(":")[0] + ":" + REDACTED
        return text(value)
    if key is not None and secret_key(key):
        return _hidden(value)  # a number is a secret too (adminPassword: 73195824)
    return value


def _takes_secret(argument: Any) -> bool:
    """A flag alone in an argument list whose next argument is its secret value."""
    return isinstance(argument, str) and bool(SECRET_FLAG.fullmatch(argument)) and not \
        re.search(r"(file|path|dir|name)$", argument, re.IGNORECASE)


def _hidden(value: Any) -> Any:
    """A secret key's value: hidden when it holds something (an empty string or null hides nothing). A boolean is a
    switch (plans show true/false too), not a secret; any other scalar (a number, a date) is hidden."""
    if isinstance(value, dict):
        # under a secret key every value of a map is one (basic_auth: {username, password}), but for references
        # (existingSecret, passwordFile) and switches
        return {k: tree(v, k) if _REFERENCE.search(str(k)) else _hidden(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hidden(item) for item in value]
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
