"""What counts as a secret here, and how a value that may carry one is shown.

- A database or storage URL is shown with its password masked (`mask_url`) wherever it is
  printed: command output, logs, error messages, metadata.
- The variables that hold the ledger's URL, the custom_id key or a provider's key
  (`holds_a_secret`) are read for that purpose only; a spec cannot name one as its webhook
  variable, which would send or log the value.
- A webhook URL is a secret too (a Slack-style URL is its own credential): it must be https,
  so it never crosses a network in clear text, except to this machine (http to 127.0.0.1,
  ::1 or localhost: a local relay, a test). `webhook_url_problem` never quotes the URL.
"""

import re
import urllib.parse

MASK = "***"
SECRET_VARIABLES = frozenset(
    {
        "LLM_ASSETS_DATABASE_URL",
        "LLM_ASSETS_ID_KEY",
        "LLM_ASSETS_ONLINE_API_KEY",
        "OPENAI_API_KEY",
        "AZURE_OPENAI_API_KEY",
        "AZURE_OPENAI_AD_TOKEN",
        "ANTHROPIC_API_KEY",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "DAGSTER_PG_PASSWORD",
        "PGPASSWORD",
        "LLM_ASSETS_CELERY_BROKER",
        "LLM_ASSETS_CELERY_BACKEND",
        "LLM_ASSETS_RATE_LIMIT_REDIS",
    }
)
"""The ledger's URL, the custom_id key, the providers' keys and the database passwords of the
deployment, and the broker and Redis URLs (which may carry a password)."""
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
_PASSWORD_PARAMETERS = frozenset({"password", "sslpassword"})
_AUTHORITY = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/?#]*)(.*)$", re.DOTALL)


def holds_a_secret(variable: str) -> bool:
    """Whether an environment variable holds the ledger's URL, a key or a password: one of
    SECRET_VARIABLES, or any name ending in _API_KEY."""
    name = variable.upper()
    return name in SECRET_VARIABLES or name.endswith("_API_KEY")


def mask_url(url: str) -> str:
    """The URL with its password (and a `password` query parameter) shown as ***.

    The user info is masked first, up to the last "@" before the host, so that a password
    with an unencoded "@" or ":" is hidden whole (a URL parser stops at its first "@"). Then
    database URLs are read and rendered by SQLAlchemy (`render_as_string(hide_password=True)`)
    for their query parameters; a value that is no URL (a local path) is returned as it is.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    url = _mask_user_info(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return url
    hidden = {key: MASK for key in parsed.query if key.lower() in _PASSWORD_PARAMETERS}
    if hidden:
        parsed = parsed.update_query_dict(hidden)
    return parsed.render_as_string(hide_password=True)


def _mask_user_info(url: str) -> str:
    """`scheme://user:password@host…` with the password masked, read without parsing the rest
    (a URL that fails to parse still has its password hidden)."""
    found = _AUTHORITY.match(url)
    if found is None:
        return url
    scheme, authority, rest = found.groups()
    user_info, at, host = authority.rpartition("@")
    if not at or ":" not in user_info:
        return url
    return f"{scheme}{user_info.partition(':')[0]}:{MASK}@{host}{rest}"


def webhook_url_problem(url: str, variable: str) -> str | None:
    """Why the webhook URL in `variable` cannot be used, or None: it must be https://host/…,
    or http:// to a loopback host. The reason names the variable, never the URL."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        host = parts.hostname
    except ValueError:
        return f"the webhook URL in {variable} is not a URL"
    if parts.scheme == "https" and host:
        return None
    if parts.scheme == "http" and host in LOOPBACK_HOSTS:
        return None
    return (
        f"the webhook URL in {variable} must start with https:// (http:// only to "
        f"{', '.join(sorted(LOOPBACK_HOSTS))}): a webhook URL is a credential and is never "
        "sent in clear text"
    )
