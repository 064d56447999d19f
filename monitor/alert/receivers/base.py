"""What every receiver module provides, and the helpers they share.

A receiver is one module with a pure `build(notification, receiver, now)` returning the HTTP request
to send (None for receivers that do not use HTTP), a `problems(receiver)` check of its config, and
optionally `check_answer` for APIs that say "error" inside a 200 response (Feishu, DingTalk, WeCom).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from monitor import __version__
from monitor.alert.model import HttpRequest, Notification, Outcome

USER_AGENT = f"ttft-monitor/{__version__}"


class Receiver(Protocol):
    """What a receiver module reads of its `alerts.receivers.NAME` entry (`alert/settings.py`'s
    `Receiver`). Owned here, so the section, which lists the kinds from `KINDS`, is never imported back."""

    @property
    def type(self) -> str: ...
    @property
    def url(self) -> str | None: ...
    @property
    def url_env(self) -> str | None: ...
    @property
    def secret_env(self) -> str | None: ...
    @property
    def secret_file(self) -> Path | None: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    def secret(self) -> str | None: ...
    def resolved_url(self) -> str | None: ...


class BuildError(ValueError):
    """The receiver's config cannot produce a request (no URL, no routing key). Permanent."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A receiver's verdict on a 2xx response body: `outcome` and why."""

    outcome: Outcome
    detail: str


@dataclass(frozen=True, slots=True)
class ReceiverKind:
    build: Callable[[Notification, Receiver, datetime], HttpRequest | None]
    problems: Callable[[Receiver], list[str]]
    # Looks inside a 2xx body; None when the HTTP status says it all.
    check_answer: Callable[[int, bytes], Answer | None] | None = None
    # Re-send a firing notification this often regardless of `renotify_interval_s` (Alertmanager
    # forgets alerts that are not re-sent); None for receivers that keep state themselves.
    resend_interval_s: float | None = None
    # Stateful receivers open something on `firing` that `alert test` must close again.
    stateful: bool = False
    # For receivers that write a log line instead of sending (build returns None): its fields.
    log_fields: Callable[[Notification, datetime], dict[str, Any]] | None = None


def dumps(payload: Any) -> bytes:
    """Compact UTF-8 JSON: the exact bytes signed and sent."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def json_request(
    url: str, payload: Any, receiver: Receiver, protocol_headers: dict[str, str] | None = None
) -> HttpRequest:
    """A POST of `payload` as JSON; see `post`."""
    return post(url, dumps(payload), receiver, protocol_headers)


def post(url: str, body: bytes, receiver: Receiver, protocol_headers: dict[str, str] | None = None) -> HttpRequest:
    """A JSON POST. Configured headers may add auth or replace the User-Agent; the protocol's own
    headers (signatures) are applied last so configuration cannot break them."""
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    headers.update(receiver.headers)
    headers.update(protocol_headers or {})
    return HttpRequest("POST", url, headers, body)


def require_url(receiver: Receiver) -> str:
    url = receiver.resolved_url()
    if not url:
        raise BuildError(f"{receiver.type} receiver needs `url` (or `url_env`)")
    return url


def url_problems(receiver: Receiver) -> list[str]:
    if receiver.url is None and receiver.url_env is None:
        return [f"a {receiver.type} receiver needs `url` or `url_env`"]
    return []


def json_code_answer(
    code_keys: tuple[str, ...], message_keys: tuple[str, ...], transient_codes: frozenset[int]
) -> Callable[[int, bytes], Answer | None]:
    """`check_answer` for chat bots that answer HTTP 200 with `{"errcode": N, "errmsg": ...}`."""

    def check(status: int, body: bytes) -> Answer | None:
        try:
            data = json.loads(body)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        code = next((data[k] for k in code_keys if k in data), None)
        if code in (None, 0, "0"):
            return None
        message = next((str(data[k]) for k in message_keys if k in data), "")
        try:
            number = int(code)
        except (TypeError, ValueError):
            number = -1
        outcome: Outcome = "transient" if number in transient_codes else "permanent"
        return Answer(outcome, f"error code {code}: {message}".strip())

    return check


def chat_bot_kind(
    build: Callable[[Notification, Receiver, datetime], HttpRequest | None],
    *,
    code_keys: tuple[str, ...],
    message_keys: tuple[str, ...],
    transient_codes: frozenset[int],
) -> ReceiverKind:
    """The kind of a chat bot (Feishu, DingTalk, WeCom): a webhook URL, and a 200 answer whose code says
    whether it took the message (`json_code_answer`)."""
    return ReceiverKind(
        build=build, problems=url_problems, check_answer=json_code_answer(code_keys, message_keys, transient_codes)
    )
