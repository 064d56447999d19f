"""Reading API keys and other secrets from the environment or from files, at load time.

Messages name variables and paths, never contents.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

FILE_SUFFIX = "_FILE"


class SecretError(ValueError):
    """The secret could not be read. `field` is the config key to point the user at."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class ResolvedSecret:
    value: str | None
    source: str  # safe to print: "env OPENAI_API_KEY", "file /run/key (from OPENAI_API_KEY_FILE)", "none"


def resolve_secret(
    *,
    env_name: str | None,
    file: Path | str | None,
    environ: Mapping[str, str],
    env_field: str,
    file_field: str,
) -> ResolvedSecret:
    """The secret named by `env_name` (falling back to `${env_name}_FILE`) or stored in `file`.

    `env_field`/`file_field` are the config keys, used in messages: "... or change api_key_env".
    """
    if env_name is not None:
        value = environ.get(env_name)
        if value is None and environ.get(env_name + FILE_SUFFIX):
            # systemd LoadCredential and Kubernetes secret volumes hand over files, not variables.
            file_var = env_name + FILE_SUFFIX
            path = Path(environ[file_var])
            return ResolvedSecret(
                read_secret_file(path, field=env_field, origin=f"(from environment variable {file_var})"),
                f"file {path} (from {file_var})",
            )
        if value is None:
            raise SecretError(env_field, f"environment variable {env_name} is not set; export it or change {env_field}")
        if not value.strip():
            raise SecretError(env_field, f"environment variable {env_name} is empty; export it or change {env_field}")
        return ResolvedSecret(value.strip(), f"env {env_name}")
    if file is not None:
        path = Path(file)
        return ResolvedSecret(read_secret_file(path, field=file_field, origin=f"(check {file_field})"), f"file {path}")
    return ResolvedSecret(None, "none")


def read_secret_file(path: Path, *, field: str, origin: str) -> str:
    """The stripped text of `path`, or SecretError saying why it cannot be used."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise SecretError(field, f"secret file {path} does not exist {origin}") from exc
    except IsADirectoryError as exc:
        raise SecretError(field, f"secret file {path} is a directory, not a file {origin}") from exc
    except PermissionError as exc:
        raise SecretError(field, f"secret file {path} cannot be read: permission denied {origin}") from exc
    except UnicodeDecodeError:
        # `from None`: the decode error quotes the offending bytes, which are part of the secret.
        raise SecretError(field, f"secret file {path} is not UTF-8 text {origin}") from None
    except OSError as exc:
        raise SecretError(field, f"secret file {path} cannot be read: {exc.strerror} {origin}") from exc
    secret = text.strip()
    if not secret:
        raise SecretError(field, f"secret file {path} is empty {origin}")
    return secret


# Standard Webhooks (standardwebhooks.com): a signing secret is `whsec_` + base64 of random bytes, and
# the standard's libraries sign with the decoded bytes. The spec asks for 24 to 64 bytes.
WEBHOOK_SECRET_PREFIX = "whsec_"
WEBHOOK_SECRET_MIN_BYTES = 24
WEBHOOK_SECRET_BYTES = 32
NEW_WEBHOOK_SECRET_HINT = "make one with `ttft-monitor alert new-secret`"


def webhook_secret_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret, or ValueError naming the fix (never quoting the secret)."""
    if not secret.startswith(WEBHOOK_SECRET_PREFIX):
        raise ValueError(
            "a webhook signing secret must be whsec_ followed by base64 (the Standard Webhooks format, which "
            f"the standard's libraries expect); {NEW_WEBHOOK_SECRET_HINT}"
        )
    encoded = secret[len(WEBHOOK_SECRET_PREFIX) :]
    try:
        # Unpadded base64 is accepted, as the standard's libraries accept it.
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(
            f"the webhook secret starts with whsec_ but the rest is not base64; {NEW_WEBHOOK_SECRET_HINT}"
        ) from None
    if len(key) < WEBHOOK_SECRET_MIN_BYTES:
        raise ValueError(
            f"the webhook secret holds {len(key)} bytes, fewer than the {WEBHOOK_SECRET_MIN_BYTES} the Standard "
            f"Webhooks spec asks for; {NEW_WEBHOOK_SECRET_HINT}"
        )
    return key


def new_webhook_secret(random_bytes: Callable[[int], bytes] = os.urandom) -> str:
    """A fresh Standard Webhooks signing secret: `whsec_` + base64 of 32 random bytes."""
    return WEBHOOK_SECRET_PREFIX + base64.b64encode(random_bytes(WEBHOOK_SECRET_BYTES)).decode()
