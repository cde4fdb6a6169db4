"""Chart values that are or may be secret: wider than what a screen hides (security/redact.py), for what leaves
this machine as a file others read: an export (app/export/, by construction: the values are left out and come back
from a Secret) and a render dir's values.yaml (shown as <redacted>).

"May be" means: what the screen hides; any key with a secret word (`key`, `auth...`, `pass`, `token`, ..., in any
case, joined by `_`, `-` or `.`; not references such as `secretName`, switches such as `authEnabled`, nor label keys
such as `topologyKey` or a toleration's `key`); everything under such a key; a `user:password` string under any key
but names (`record`, `alert`, `image`, ...); and any value that looks like a generated token. Pure.
"""
from __future__ import annotations

import re
from typing import Any

from gpu_bootstrap.core.objects import deep_merge, join_path
from gpu_bootstrap.security.redact import REDACTED, reference, tokenish, tree, user_password

_GIT_SECRET_WORDS = re.compile(r"(^|[^a-z])(password|passwd|pwd|pass|secret|token|api[-_.]?key|apikey|key|"
                               r"credentials?|auth\w*|cookie|bearer|dsn|htpasswd)([^a-z]|$)", re.IGNORECASE)
# `key` of a toleration, a label selector's requirement, a ConfigMap volume's item or a key reference: a name
_STRUCTURAL_KEY_SIBLINGS = {"operator", "effect", "values", "path", "name"}
_SWITCH_KEYS = re.compile(r"(enabled|disabled|enable|mode|type|policy|strategy)$", re.IGNORECASE)
# keys that name a label, a field or a topology: kube-prometheus-stack's podAntiAffinityTopologyKey
_NAME_KEYS = re.compile(r"(topology|label|sort|hash|partition|shard|annotation|selector|match|field|group)[-_.]?key$",
                        re.IGNORECASE)
_DIGEST = re.compile(r"sha(256|384|512):[0-9a-f]{32,}")
# values that are names, whatever they look like: a recording rule, an alert, a role (`system:kube-scheduler`)
_NAME_VALUE = re.compile(r"^(record|alert|expr|name|kind|role|verb|group|resource|image|tag)$", re.IGNORECASE)


# Schema first: where a configuration's own schema types a field as a secret, that decides, whatever the value looks
# like (a short webhook path, a routing key). Alertmanager's config (prometheus/alertmanager's notifier configs:
# fields of type Secret, SecretURL, SecretTemplateURL; prometheus/common's HTTP client config), found wherever a
# values tree holds one (a map with `receivers` beside `route` or `global`: kube-prometheus-stack's
# alertmanager.config, an AlertmanagerConfig's); Grafana's datasource secureJsonData, encrypted by Grafana whole.
ALERTMANAGER_SECRETS = frozenset((
    "alert_source_token", "api_key", "api_secret", "api_url", "app_token", "auth_password", "auth_secret",
    "bot_token", "mattermost_webhook_url", "opsgenie_api_key", "rocketchat_token", "rocketchat_token_id",
    "routing_key", "service_key", "slack_api_url", "slack_app_token", "smtp_auth_password", "smtp_auth_secret",
    "telegram_bot_token", "token", "token_id", "url", "user_key", "victorops_api_key", "webhook_url",
    "wechat_api_secret", "bearer_token", "client_secret", "credentials", "password", "key"))
SECRET_SUBTREES = frozenset(("secureJsonData", "secure_json_data"))
# strings that carry a secret whatever their key: a command line's auth flag, a connection string's password after
# harmless key=value pairs, curl's -u user:password, a Vault token
_GIT_SECRET_TEXT = re.compile(r"(?<![\w-])--?[\w.-]*(auth|token|secret|passw\w*|credential\w*|api[-_.]?key)[\w.-]*="
                              r"[^\s'\",]+|(^|\s)(password|passwd|pwd)=\S+|(?<![\w-])(-u|--user)\s+[^\s:]+:\S+|"
                              r"\b(hv[sbr]\.|s\.)[A-Za-z0-9_-]{12,}", re.IGNORECASE)


def schema_of(key: Any, value: Any, parent: str | None) -> str | None:
    """The schema a subtree follows: "alertmanager" inside an Alertmanager config, "secret" inside a subtree
    whose schema makes every value secret, else the parent's."""
    if isinstance(key, str) and key in SECRET_SUBTREES:
        return "secret"
    if isinstance(value, dict) and "receivers" in value and ("route" in value or "global" in value):
        return "alertmanager"
    return parent


def _schema_secret(key: Any, schema: str | None) -> bool:
    return schema == "secret" or (schema == "alertmanager" and isinstance(key, str) and key in ALERTMANAGER_SECRETS)


def _words(key: str) -> str:
    """camelCase as separate words (adminPassword -> admin_Password), so the word rule sees them."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key)


def git_secret(key: Any, value: Any, siblings: dict | None = None) -> bool:
    """Must this leaf value stay out of Git? What the screen hides (`tree`), a key naming a secret in the wider sense
    (`key`, `auth`, `pass`, ... in any case, joined by `_`, `-` or `.`; not a reference such as `secretName` nor a
    switch such as `authEnabled`), or a value that looks like a generated token."""
    if value is None or isinstance(value, bool) or value == "":
        return False
    if tree(value, key) != value:
        return True
    if isinstance(value, str) and user_password(value, key) and not (isinstance(key, str) and _NAME_VALUE.search(key)):
        return True
    if key is not None and isinstance(key, str):
        words = _words(key)
        named = bool(_GIT_SECRET_WORDS.search(words)) and not reference(key) and \
            not _SWITCH_KEYS.search(key) and not _NAME_KEYS.search(key)
        if named and key.lower() == "key" and _STRUCTURAL_KEY_SIBLINGS & set(siblings or {}):
            named = False
        if named:
            return True
    if isinstance(value, str) and _GIT_SECRET_TEXT.search(value):
        return True
    return isinstance(value, str) and any(tokenish(part) for part in re.split(r"[\s,;:/@?&]+", _DIGEST.sub("", value)))


def split(values: dict) -> tuple[dict, list[str], dict]:
    """(the values without those that are or may be secret, their paths in helm's --set syntax, the skeleton of the
    values document that brings them back: each secret a placeholder naming its path). A list holding one is left
    out whole, as helm replaces lists."""
    paths: list[str] = []
    kept, skeleton = _split(values, tree(values), None, {}, "", paths, False, None)
    return kept, paths, skeleton or {}


def hidden(values: dict) -> dict:
    """A copy of the values with every value that is or may be secret shown as <redacted> (a render dir's
    values.yaml: the structure stays reviewable)."""
    return _hide(values, tree(values), None, {}, False, None)


def _secret_map(key, siblings: dict, secret_parent: bool) -> bool:
    return secret_parent or (isinstance(key, str) and git_secret(key, "x", siblings))


def _secret_leaf(value, hidden_value, key, siblings: dict, secret_parent: bool, schema: str | None = None) -> bool:
    return value != hidden_value or git_secret(key, value, siblings) or \
        ((secret_parent or _schema_secret(key, schema)) and value not in (None, "") and not isinstance(value, bool))


def _split(value, hidden_value, key, siblings: dict, path: str, paths: list[str], secret_parent: bool,
           schema: str | None):
    """(what stays, or _DROPPED; the skeleton of what went, or None)."""
    if isinstance(value, dict) and isinstance(hidden_value, dict):
        schema = schema_of(key, value, schema)
        inherited = _secret_map(key, siblings, secret_parent) or schema == "secret"
        kept, skeleton = {}, {}
        for child, item in value.items():
            stays, went = _split(item, hidden_value.get(child), child, value, join_path(path, child), paths,
                                 inherited and not reference(child), schema)
            if stays is not _DROPPED:
                kept[child] = stays
            if went is not None:
                skeleton[child] = went
        return kept, skeleton or None
    if isinstance(value, list) and isinstance(hidden_value, list) and len(value) == len(hidden_value):
        found = len(paths)
        whole = [_split(item, other, key, siblings, f"{path}[{index}]", paths, secret_parent, schema)
                 for index, (item, other) in enumerate(zip(value, hidden_value))]
        if len(paths) == found:
            return value, None
        # the whole list goes: its secret items as placeholders, the others as they are
        return _DROPPED, [_rejoined(stays, went) for stays, went in whole]
    if _secret_leaf(value, hidden_value, key, siblings, secret_parent, schema):
        paths.append(path)
        return _DROPPED, f"<secret: {path}>"
    return value, None


def _hide(value, hidden_value, key, siblings: dict, secret_parent: bool, schema: str | None):
    if isinstance(value, dict) and isinstance(hidden_value, dict):
        schema = schema_of(key, value, schema)
        inherited = _secret_map(key, siblings, secret_parent) or schema == "secret"
        return {child: _hide(item, hidden_value.get(child), child, value, inherited and not reference(child), schema)
                for child, item in value.items()}
    if isinstance(value, list) and isinstance(hidden_value, list) and len(value) == len(hidden_value):
        return [_hide(item, other, key, siblings, secret_parent, schema) for item, other in zip(value, hidden_value)]
    if value != hidden_value:
        return hidden_value  # the screen's rules hid the secret part (a URL's token) and keep the rest
    return REDACTED if _secret_leaf(value, hidden_value, key, siblings, secret_parent, schema) else value


_DROPPED = object()


def _rejoined(stays, went):
    """One item of a list that goes whole: what stayed of it and its secrets' placeholders, together again."""
    if went is None:
        return stays
    if isinstance(stays, dict) and isinstance(went, dict):
        return deep_merge(stays, went)
    return went
