"""What every API flavour shares: the kinds of events, what one event says, the flavour protocol.

The flavours themselves live in `apis.py` and in one module each; `apis.FLAVORS` lists them all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Protocol
from urllib.parse import urlsplit

from monitor.probe.sse import SSEEvent
from monitor.servertext import QuotesServer


class EventKind(Enum):
    OTHER = "other"  # role chunk, ping, usage-only, empty delta: not a token
    REASONING = "reasoning"  # a generated token, but not yet the visible answer
    ANSWER = "answer"  # visible content
    TOOL_CALL = "tool_call"  # a token of a tool call's name or arguments: an answer too
    DONE = "done"
    ERROR = "error"  # the server reported an error inside the stream


@dataclass(slots=True)
class EventInfo:
    kind: EventKind = EventKind.OTHER
    served_model: str | None = None
    # OpenAI's `system_fingerprint`: the backend configuration that answered (None where not sent).
    fingerprint: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    # Hidden reasoning tokens as the API counts them (part of completion_tokens), when it does.
    reasoning_tokens: int | None = None
    error_message: str | None = None
    finished: bool = False  # this event also ends the stream (APIs without a separate end marker)


class MalformedEvent(QuotesServer, ValueError):
    """An event whose data is not what the API promises (not JSON, wrong shape); `{quote}` in the
    message stands for `quote`, the event's data, shown capped to 80 characters."""

    def __init__(self, message: str, *, quote: str = "") -> None:
        super().__init__(message)
        self.quote_text = quote


@dataclass(frozen=True, slots=True)
class LeastReasoning:
    """`params.reasoning: least`: ask for the least reasoning the API allows; each flavour knows its switch."""

    # The effort level to send where the API takes one (None: the API's own least, usually `minimal`).
    effort: str | None = None
    # The server is OpenAI's own API (or Azure OpenAI), which takes `reasoning_effort`; any other
    # OpenAI-compatible server (vLLM, SGLang) turns thinking off in the chat template instead.
    openai_hosted: bool = False


# Hosts of OpenAI's own API and of Azure OpenAI: the servers whose chat API takes `reasoning_effort`.
_OPENAI_HOSTS = ("api.openai.com",)
_OPENAI_HOST_SUFFIXES = (".openai.azure.com", ".cognitiveservices.azure.com")


def is_openai_hosted(base_url: str) -> bool:
    host = (urlsplit(base_url).hostname or "").lower()
    return host in _OPENAI_HOSTS or host.endswith(_OPENAI_HOST_SUFFIXES)


@dataclass(frozen=True, slots=True)
class RequestParams:
    model: str
    max_tokens: int
    temperature: float
    extra_body: dict[str, Any]
    include_usage: bool
    force_tool_call: bool = False  # offer TOOL and require it (tool_choice), in the API's own shape
    least_reasoning: LeastReasoning | None = None
    # A warm prompt: mark its text as a cache breakpoint where the API caches only what is marked
    # (Anthropic's cache_control); the others cache every prompt's prefix on their own.
    cache_breakpoint: bool = False


# The one function a forced tool call offers; its arguments are the answer, so any model can call it.
TOOL_NAME = "record_summary"
TOOL_DESCRIPTION = "Record a one-sentence summary of the text."
TOOL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"summary": {"type": "string", "description": "The summary."}},
    "required": ["summary"],
}


class ApiFlavor(Protocol):
    name: ClassVar[str]
    path: ClassVar[str]

    def path_for(self, params: RequestParams) -> str:
        """The path (and query) after base_url; most APIs use `path`, Gemini puts the model in it."""
        ...

    def build_body(self, prompt: str, params: RequestParams) -> dict[str, Any]: ...

    def auth_headers(self, api_key: str | None) -> dict[str, str]: ...

    def classify(self, event: SSEEvent) -> EventInfo: ...


def load_event(data: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError as exc:
        raise MalformedEvent("event data is not JSON: {quote}", quote=data) from exc
    if not isinstance(obj, dict):
        raise MalformedEvent("event data is not a JSON object: {quote}", quote=data)
    return obj


def error_event(info: EventInfo, error: Any) -> EventInfo:
    """`info` made the API's error event, with the message of `error` (the API's error object or text)."""
    info.kind = EventKind.ERROR
    info.error_message = error_text(error)
    return info


def error_text(err: Any) -> str:
    if isinstance(err, dict):
        return str(err.get("message") or err.get("type") or err)
    return str(err)


def read_usage(info: EventInfo, usage: Any, *, prompt: str, completion: str, details: str, output_details: str) -> None:
    """Token counts from an OpenAI-style usage object into `info`; the two OpenAI APIs name the same counts
    differently (`prompt_tokens` and `completion_tokens_details` in Chat Completions, `input_tokens` and
    `output_tokens_details` in Responses), hence the keys."""
    if not isinstance(usage, dict):
        return
    info.prompt_tokens = usage.get(prompt)
    info.completion_tokens = usage.get(completion)
    cached = usage.get(details)
    if isinstance(cached, dict):
        info.cached_tokens = cached.get("cached_tokens")
    output = usage.get(output_details)
    if isinstance(output, dict) and isinstance(output.get("reasoning_tokens"), int):
        info.reasoning_tokens = output["reasoning_tokens"]


def merge_extra(body: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    # extra_body is passed through verbatim, as the openai SDK does, and may override defaults.
    return {**body, **extra}


class FixedPath:
    """For the APIs whose path does not depend on the request."""

    path: ClassVar[str]

    def path_for(self, params: RequestParams) -> str:
        return self.path
