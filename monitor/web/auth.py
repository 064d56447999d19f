"""Optional protection of the UI and API: a bearer token, or HTTP basic auth with a scrypt hash.

Pure functions here; `api.py` applies them to its own routes only, so `/metrics` and the health
endpoints on the same listener stay as they are.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from dataclasses import dataclass

_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 2**14, 8, 1
COOKIE = "ttft_session"


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """`scrypt$N$r$p$salt$hash` (base64), for `web.basic_password_hash`."""
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P, dklen=32)
    encode = base64.b64encode
    return f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${encode(salt).decode()}${encode(digest).decode()}"


def verify_password(password: str, encoded: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = encoded.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = hashlib.scrypt(
            password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p), dklen=len(expected)
        )
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(actual, expected)


@dataclass(frozen=True, slots=True)
class Guard:
    """Who may see the UI: anyone (no token, no user), a bearer token holder, or a basic-auth user."""

    token: str | None = None
    basic_user: str | None = None
    basic_password_hash: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.token) or self.basic_user is not None

    def session_value(self) -> str:
        """The login cookie: derived from the token, so the cookie never carries the token itself."""
        assert self.token
        return hmac.new(self.token.encode(), b"ttft-monitor web session", hashlib.sha256).hexdigest()

    def allows(self, authorization: str | None, cookie: str | None) -> bool:
        if not self.enabled:
            return True
        scheme, _, credentials = (authorization or "").partition(" ")
        if self.token:
            if scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), self.token.encode()):
                return True
            if cookie and hmac.compare_digest(cookie.encode(), self.session_value().encode()):
                return True
        if self.basic_user is not None and self.basic_password_hash and scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(credentials.strip()).decode().partition(":")
            except (ValueError, binascii.Error, UnicodeDecodeError):
                return False
            return hmac.compare_digest(user.encode(), self.basic_user.encode()) and verify_password(
                password, self.basic_password_hash
            )
        return False

    def token_matches(self, candidate: str) -> bool:
        return bool(self.token) and hmac.compare_digest(candidate.encode(), (self.token or "").encode())
