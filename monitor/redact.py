"""Keep secrets out of anything a human or a machine might read: logs, errors, metrics, the database.

A secret travels in more forms than the one configured: URL-encoded in a query string, base64 in a
Basic authorization header (`user:password`), base64 again when a server echoes a header back. Every
configured secret is masked in each of those forms, and any base64 run that decodes to text holding a
secret is masked whole.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit

REDACTED = "[REDACTED]"

# Shapes of keys that servers like to echo back ("Incorrect API key provided: sk-abc...").
_KEY_SHAPES = re.compile(
    r"(?:sk-(?:ant-|proj-)?[A-Za-z0-9_\-*]{6,}|(?i:bearer)\s+[A-Za-z0-9._\-~+/*]{6,}=*|whsec_[A-Za-z0-9+/=]{6,})"
)
# Headers that carry credentials: the config refuses literal values for them (only ${VAR}).
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key"})
# Headers whose values never reach a log or an error: the credentials, and cookies.
SENSITIVE_HEADERS = CREDENTIAL_HEADERS | {"cookie"}
# Query parameters that carry credentials, whatever their length.
SENSITIVE_QUERY_KEYS = frozenset(
    {
        "key",
        "api_key",
        "apikey",
        "api-key",
        "token",
        "access_token",
        "auth",
        "code",
        "sig",
        "signature",
        "secret",
        "password",
        "pass",
        "pwd",
    }
)
MIN_SECRET_CHARS = 4
# Query values at least this long are treated as credentials whatever their parameter's name.
LONG_QUERY_VALUE = 8
# Base64 runs this long or longer are decoded and checked for secrets inside.
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{8,}={0,2}")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Remove known secrets (in every form they travel in) and anything shaped like an API key from `text`."""
    known = tuple(sorted({s for s in secrets if s and len(s) >= MIN_SECRET_CHARS}))
    if known:
        pattern, needles, shortest_run = _compiled(known)
        text = pattern.sub(REDACTED, text)
        if needles is not None:
            text = _BASE64_RUN.sub(lambda match: _mask_if_encoded_secret(match.group(0), needles, shortest_run), text)
    return _KEY_SHAPES.sub(REDACTED, text)


def secret_forms(secret: str) -> set[str]:
    """`secret` as given, percent-decoded, URL-encoded and base64-encoded (standard and URL-safe alphabets)."""
    plain = {secret, unquote(secret)}
    forms = set(plain)
    for value in plain:
        for encoded in (quote(value, safe=""), quote(value), quote_plus(value)):
            # Percent-escapes may come back in lower case (`%2b`); a case-insensitive pattern would be slow.
            forms |= {encoded, re.sub(r"%[0-9A-F]{2}", lambda escape: escape.group(0).lower(), encoded)}
        raw = value.encode()
        for blob in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
            text = blob.decode()
            forms |= {text, text.rstrip("=")}
    return {form for form in forms if len(form) >= MIN_SECRET_CHARS}


def url_credentials(url: str, *, user_is_secret: bool = True) -> list[str]:
    """The parts of `url` that are credentials: the userinfo (and its `user:password` Basic form) and
    query values that are long or under a credential-like name.

    A user name alone (`https://KEY@host`) is taken for a key unless `user_is_secret` is false (a
    database URL's `postgres@host` names a role, and masking it would mask every mention of postgres).
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    found: list[str] = []
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        if colon and password:
            # What an HTTP client sends as `Authorization: Basic base64(user:password)`, decoded.
            found += [password, userinfo, f"{unquote(user)}:{unquote(password)}"]
        elif user and user_is_secret:
            found += [user, f"{unquote(user)}:"]
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if value and (name.lower() in SENSITIVE_QUERY_KEYS or len(value) >= LONG_QUERY_VALUE):
            found.append(value)
    return found


def mask_url(url: str, secrets: Iterable[str | None] = ()) -> str:
    """`url` fit to print: credentials in the userinfo and query masked, and any of `secrets` inside it."""
    return redact(url, [*url_credentials(url), *secrets])


@functools.lru_cache(maxsize=256)
def _compiled(secrets: tuple[str, ...]) -> tuple[re.Pattern[str], re.Pattern[bytes] | None, int]:
    """The pattern of every form of `secrets`; the pattern of those worth looking for inside decoded
    base64 (8 characters or longer, so random bytes do not match by chance), and the shortest base64
    run that could hold one."""
    forms = set().union(*(secret_forms(secret) for secret in secrets))
    # Longest first, so a secret containing another is masked whole.
    alternatives = "|".join(re.escape(form) for form in sorted(forms, key=len, reverse=True))
    inner = {form.encode() for secret in secrets for form in (secret, unquote(secret)) if len(form) >= 8}
    if not inner:
        return re.compile(alternatives), None, 0
    needles = re.compile(b"|".join(re.escape(needle) for needle in sorted(inner, key=len, reverse=True)))
    return re.compile(alternatives), needles, (min(len(needle) for needle in inner) * 4) // 3


def _mask_if_encoded_secret(run: str, needles: re.Pattern[bytes], shortest_run: int) -> str:
    if len(run) < shortest_run:
        return run
    body = run.rstrip("=")
    if len(body) % 4 == 1:
        body = body[:-1]
    padded = body + "=" * (-len(body) % 4)
    for altchars in (None, b"-_"):
        try:
            decoded = base64.b64decode(padded, altchars=altchars, validate=False)
        except (binascii.Error, ValueError):
            continue
        if needles.search(decoded):
            return REDACTED
    return run
