"""Secrets planted where users put them, for the tests that prove none reaches a plan, a log, a render dir or an
export: under a secret key, in a chart's env map, in an ini file given as a map (with the dotted key `grafana.ini`),
in webhook URLs (a token in the path, in the query), in a command-line flag, as PEM plain and base64, as an
htpasswd line, a `user:password` string and docker config JSON. Every value carries a marker no rule can guess;
`leaked(text)` names the markers (and encoded forms) a text holds."""
from __future__ import annotations

import base64
import json

PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEAPLANTEDpem0006kZ3xQ9Yb7Lm\n"
       "-----END RSA PRIVATE KEY-----\n")
PEM_BASE64 = base64.b64encode(PEM.encode()).decode()
DOCKER_AUTH = base64.b64encode(b"robot:PLANTEDdocker0011").decode()
HTPASSWD = "admin:$apr1$PLANTEDh$tp0009aBcDeFgHiJkLmNo/"

SECRETS = {
    "key": "PLANTEDgrafanapw0001",
    "env": "PLANTEDenvpw0002",
    "ini": "PLANTEDinipw0003",
    "url-path": "PLANTED4f3a2b1c9d8e7f60",
    "url-query": "PLANTEDquery0005",
    "flag": "PLANTEDflag0007",
    "pem": "PLANTEDpem0006",
    "user-pass": "PLANTEDuserpass8",
    "htpasswd": "PLANTEDh$tp0009",
    "docker": DOCKER_AUTH,
    "pem-base64": PEM_BASE64[:60],
    # the second review's shapes (issue 54)
    "slack": "PLANTEDslack0012",  # a Slack incoming webhook's secret segment (the last of its path)
    "short-path": "PLANTs13",  # a webhook whose secret segment is too short to look like a token
    "routing-key": "PLANTEDroutekey14",  # PagerDuty's routing_key: Alertmanager types it a secret
    "auth-arg": "PLANTEDauth0015",  # --auth=<token> in a chart's extraArgs
    "secure-json": "PLANTEDsecurejson16",  # Grafana datasource secureJsonData
    "dsn": "PLANTEDdsnpw0017",  # a connection string whose first key=value is harmless
    "curl": "PLANTEDcurlpw18",  # curl -u user:pw inside a string
    "vault": "hvs.PLANTEDvault0019xyz",  # a Vault token by its prefix
}


def monitoring_values() -> dict:
    """kube-prometheus-stack values as a user writes them, each planted secret where its kind goes."""
    return {
        "grafana": {
            "adminPassword": SECRETS["key"],
            "env": {"GF_DATABASE_PASSWORD": SECRETS["env"]},
            "grafana.ini": {"database": {"type": "postgres", "password": SECRETS["ini"]}},
            "assertNoLeakedSecrets": False,  # the grafana chart refuses a password in grafana.ini unless told
            "additionalDataSources": [{"name": "pg", "type": "postgres", "url": "db.example.com:5432",
                                       "secureJsonData": {"password": SECRETS["secure-json"]}}],
        },
        "alertmanager": {"config": {
            "route": {"receiver": "ops"},
            "receivers": [{"name": "ops", "webhook_configs": [
                {"url": f"https://alerts.example.com/hooks/{SECRETS['url-path']}"},
                {"url": f"https://alerts.example.com/notify?token={SECRETS['url-query']}"},
                {"url": f"https://alerts.example.com/h/{SECRETS['short-path']}"}],
                "slack_configs": [{"api_url": f"https://hooks.slack.com/services/T0001/B0002/{SECRETS['slack']}",
                                   "channel": "#gpu"}],
                "pagerduty_configs": [{"routing_key": SECRETS["routing-key"]}]}]}},
        "prometheusOperator": {"extraArgs": [f"--x-password={SECRETS['flag']}", f"--auth={SECRETS['auth-arg']}"]},
        "notes": {"a": PEM, "b": PEM_BASE64, "c": HTPASSWD, "d": f"ops:{SECRETS['user-pass']}",
                  "e": json.dumps({"auths": {"registry.example.com": {"auth": DOCKER_AUTH}}}),
                  "f": f"host=db.example.com user=gpu password={SECRETS['dsn']} sslmode=require",
                  "g": f"curl -sf -u ops:{SECRETS['curl']} https://example.com/health",
                  "h": f"export VAULT_TOKEN={SECRETS['vault']}"},
    }


def leaked(text: str) -> list[str]:
    """The kinds of planted secret `text` holds."""
    return [kind for kind, marker in SECRETS.items() if marker in text]


def files_with_secrets(folder) -> dict[str, list[str]]:
    return {str(p.relative_to(folder)): found for p in sorted(folder.rglob("*")) if p.is_file()
            if (found := leaked(p.read_text(errors="replace")))}
