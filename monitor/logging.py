"""structlog, configured once: JSON lines for machines, aligned colour for a human at a terminal.

Every event passes a redaction step, so a key that slips into an event dict (a header map, a URL
with a password, a server message echoing the key) is masked before it is written; the same step
caps each text (`capped`: after redaction, so a cut cannot leave a secret's first characters).
"""

from __future__ import annotations

import functools
import logging
import math
import re
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any, TextIO

import structlog

from monitor.redact import REDACTED, SENSITIVE_HEADERS
from monitor.servertext import MESSAGE_CAP, capped, printable

# No text in a log line is longer (a 200 KB error event once made a 200 KB line per probe).
LOG_TEXT_CAP = MESSAGE_CAP
_SENSITIVE_KEYS = re.compile(r"(?i)(api[_-]?key|secret|token|password|authorization|credential)")
# A scheme is short: unbounded, `[a-z0-9+.-]*` ran to the end of every run of letters from each of its
# characters before failing on `://`, quadratic in the run (a 100 KB value took a minute in the redactor).
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]{0,31}://)(?P<user>[^:/@\s]+):(?P<pw>[^@/\s]+)@")


class Bounded(str):
    """Text to log, cut to `limit` characters by the redactor, which knows the secrets: cut by the
    caller, a secret straddling the cut would no longer be recognised."""

    limit: int

    def __new__(cls, text: str, limit: int) -> Bounded:
        bounded = super().__new__(cls, text)
        bounded.limit = limit
        return bounded


def error_text(exc: BaseException, limit: int = 300) -> Bounded:
    """`Type: message` of `exc`, to log, capped at `limit` characters after redaction."""
    return Bounded(f"{type(exc).__name__}: {exc}", limit)


# Values no processor changes (round_floats, the redactor): passed over without a look.
_PLAIN_TYPES = frozenset({int, bool, type(None)})
# Values the redactor passes over: no number holds a secret.
_NUMBER_TYPES = _PLAIN_TYPES | {float}
# Texts up to this long are redacted once and remembered (`_masked_name`); longer ones each time.
REMEMBERED_TEXT_CHARS = 100
# Fields whose text is new in every line (a probe's request id): redacted each time, not remembered, where
# each was a miss of `_masked_name` that pushed a text that does come back out of it.
_UNIQUE_TEXT_KEYS = frozenset({"request_id"})


def _masked_text(value: str, limit: int, secrets: tuple[str, ...]) -> str:
    unpassworded = _URL_PASSWORD.sub(r"\g<scheme>\g<user>:" + REDACTED + "@", value) if "://" in value else value
    # A console log is read at a terminal: no escape sequence reaches it, but a config error keeps
    # its lines (server text is one line already).
    return capped(printable(unpassworded, lines=True), limit, secrets, escape=False)


@functools.lru_cache(maxsize=1024)
def _masked_name(value: str, secrets: tuple[str, ...]) -> str:
    """`_masked_text` of a short text, remembered: most of a line's texts (its event, level, job, target,
    prompt and model) come back line after line, and redacting each afresh was most of a line's cost
    (bench/daemon.py: a probe's line 179 us, a probe 2.8 ms). A pure function of its arguments, so what
    is remembered is what would be computed; the secrets are part of the key, so a reload's new ones
    apply at once."""
    return _masked_text(value, LOG_TEXT_CAP, secrets)


def _mask(value: Any, secrets: tuple[str, ...]) -> Any:
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return value
    if kind is str and len(value) <= REMEMBERED_TEXT_CHARS:
        return _masked_name(value, secrets)
    if isinstance(value, str):
        return _masked_text(value, value.limit if isinstance(value, Bounded) else LOG_TEXT_CAP, secrets)
    if isinstance(value, dict):
        return {
            k: (
                REDACTED
                if isinstance(k, str) and (k.lower() in SENSITIVE_HEADERS or _is_secret_key(k))
                else _mask(v, secrets)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(_mask(v, secrets) for v in value)
    return value


@functools.lru_cache(maxsize=4096)
def _is_secret_key(key: str) -> bool:
    # `tokens`-style counters (prompt_tokens, cached_tokens) are numbers, not secrets.
    return bool(_SENSITIVE_KEYS.search(key)) and not key.endswith(("_tokens", "tokens_target", "_tokens_p50"))


class Redactor:
    """A structlog processor masking known secrets and anything shaped like one."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        self.secrets = tuple(s for s in secrets if s)

    def __call__(self, _logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        secrets = self.secrets
        for key, value in event.items():  # values replaced in place: the keys do not change
            kind = type(value)
            if kind in _NUMBER_TYPES:
                continue
            if _is_secret_key(key) and isinstance(value, str | bytes):
                event[key] = REDACTED
            elif kind is str and key in _UNIQUE_TEXT_KEYS:
                event[key] = _masked_text(value, LOG_TEXT_CAP, secrets)  # as `_mask`, without remembering it
            else:
                event[key] = _mask(value, secrets)
        return event


def readable(value: float) -> float:
    """`value` as a person reads it: at most three decimals, at least three significant digits.

    A log line is read by people (`"baseline_ms": 186.83132367138577` was the demo's), and by
    scripts that subtract stamps (bench/ reads `ttft_ms` to a microsecond); stored values keep
    every digit, only the line is rounded.
    """
    if not math.isfinite(value) or value == 0:
        return value
    if abs(value) >= 0.1:
        return round(value, 3)
    return float(f"{value:.3g}")


def _rounded(value: Any) -> Any:
    if type(value) in _PLAIN_TYPES or type(value) is str:
        return value
    if isinstance(value, float):
        return readable(value)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_rounded(v) for v in value)
    return value


def round_floats(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor: every float of the event, nested ones included, through `readable`."""
    for key, value in event.items():  # values replaced in place: the keys do not change
        kind = type(value)
        if kind is float:
            # `readable`, inlined: a probe's line has eight floats.
            if value != 0 and math.isfinite(value):
                event[key] = round(value, 3) if abs(value) >= 0.1 else float(f"{value:.3g}")
        elif kind not in _PLAIN_TYPES and kind is not str:
            event[key] = _rounded(value)
    return event


class _StdlibToStructlog(logging.Handler):
    """Libraries log through `logging` (APScheduler, aiohttp); send them the same way as ours."""

    def emit(self, record: logging.LogRecord) -> None:
        fields: dict[str, Any] = {"logger": record.name}
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            fields["error"] = error_text(exc, 500)
        structlog.get_logger().log(record.levelno, record.getMessage(), **fields)


def configure_logging(
    *,
    stream: TextIO | None = None,
    json_output: bool | None = None,
    secrets: Iterable[str | None] = (),
    level: int = logging.INFO,
) -> Redactor:
    """Configure structlog for the process. Returns the redactor so new secrets can be added on reload."""
    out = stream or sys.stdout
    if json_output is None:
        json_output = not out.isatty()
    redactor = Redactor(secrets)
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        round_floats,
        redactor,
        # After the redactor: a time of our own making holds no secret (the key order is the same).
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if json_output:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer(sort_keys=False)]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=out.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    root.handlers[:] = [_StdlibToStructlog()]
    root.setLevel(max(level, logging.WARNING))
    return redactor
