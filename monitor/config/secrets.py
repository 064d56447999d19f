"""Reading API keys and other secrets from the environment or from files, at load time.

Messages name variables and paths, never contents.
"""

from __future__ import annotations

from collections.abc import Mapping
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
            raise SecretError(
                env_field, f"environment variable {env_name} is not set; export it or change {env_field}"
            )
        if not value.strip():
            raise SecretError(
                env_field, f"environment variable {env_name} is empty; export it or change {env_field}"
            )
        return ResolvedSecret(value.strip(), f"env {env_name}")
    if file is not None:
        path = Path(file)
        return ResolvedSecret(
            read_secret_file(path, field=file_field, origin=f"(check {file_field})"), f"file {path}"
        )
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
