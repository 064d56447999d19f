"""Keep secrets out of anything a human or a machine might read: logs, errors, metrics, the database."""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "[REDACTED]"

# Shapes of keys that servers like to echo back ("Incorrect API key provided: sk-abc...").
_KEY_SHAPES = re.compile(
    r"(?:sk-(?:ant-|proj-)?[A-Za-z0-9_\-*]{6,}|(?i:bearer)\s+[A-Za-z0-9._\-~+/*]{6,}=*|whsec_[A-Za-z0-9+/=]{6,})"
)
SENSITIVE_HEADERS = frozenset(
    {"authorization", "x-api-key", "api-key", "proxy-authorization", "cookie", "x-goog-api-key"}
)


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Remove known secrets and anything shaped like an API key from `text`."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return _KEY_SHAPES.sub(REDACTED, text)


def redact_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if k.lower() in SENSITIVE_HEADERS else v) for k, v in headers.items()}
