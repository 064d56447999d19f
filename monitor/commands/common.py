"""What the commands that read a config and a database share: loading the config with its errors on stderr,
and one line (never a traceback) for a database error.

The heavy modules (pydantic through the config loader, SQLAlchemy through the store) are imported inside the
functions, so a command that needs neither (`alert new-secret`, `sim`) still starts fast.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TextIO

from monitor.commands.args import config_path
from monitor.exitcodes import EXIT_FAILED, EXIT_INFRA, EXIT_USAGE

if TYPE_CHECKING:
    from monitor.config.models import Config


def load_config_or_explain(given: str | None, err: TextIO) -> Config | None:
    """The config at `--config` (else $TTFT_CONFIG, else ./config.yaml), or None once its errors are on `err`
    (the command then exits EXIT_USAGE)."""
    from monitor.config.errors import ConfigError
    from monitor.config.loader import load_config

    try:
        return load_config(config_path(given))
    except ConfigError as exc:
        err.write(f"{exc}\n")
        return None


def run_against_database(
    work: Coroutine[Any, Any, int],
    *,
    command: str,
    url: str,
    err: TextIO,
    usage_errors: tuple[type[Exception], ...] = (),
    refusals: tuple[type[Exception], ...] = (),
) -> int:
    """Run `work` to its exit code; a database error becomes one line on `err` prefixed with `command` and
    EXIT_INFRA (one of `usage_errors`: EXIT_USAGE, for what the user asked wrongly; one of `refusals`:
    EXIT_FAILED, for what the stored state does not allow)."""
    from monitor.store.engine import StoreError, describe_db_error

    # What the user asked wrongly, what the stored state refuses, and StoreError (DatabaseUnavailable and the
    # rest) already read as one line.
    answers = ((usage_errors, EXIT_USAGE), (refusals, EXIT_FAILED), ((StoreError,), EXIT_INFRA))
    try:
        return asyncio.run(work)
    except Exception as exc:
        for kinds, code in answers:
            if isinstance(exc, kinds):
                err.write(f"{command}: {exc}\n")
                return code
        # A database error we did not classify: one line, never a traceback.
        err.write(f"{command}: {describe_db_error(exc, url)}\n")
        return EXIT_INFRA
