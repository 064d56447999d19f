"""Anthropic Messages: the streamed event sequence, the whole message, and errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from monitor.sim.parse import SimRequest, content_text, flag, forces_tool_call, max_tokens_of, messages_text, model_name
from monitor.sim.plan import OutputPlan
from monitor.sim.wire import TOOL_NAME, Family, Flavour, Usage, dumps, slot, split_template, tool_arguments

# Real streams carry an opaque signature for the thinking block; clients only pass it back.
THINKING_SIGNATURE = "EqQBCkYIARgCIkBzaW11bGF0ZWQgdGhpbmtpbmcgc2lnbmF0dXJl"


def _event(name: str, obj: Any) -> bytes:
    return f"event: {name}\ndata: {dumps(obj)}\n\n".encode()


def _delta_template(index: int, delta_type: str, field: str) -> tuple[bytes, bytes]:
    payload = {"type": "content_block_delta", "index": index, "delta": {"type": delta_type, field: slot()}}
    return split_template(f"event: content_block_delta\ndata: {dumps(payload)}\n\n")


def _block_start(index: int, block: dict[str, Any]) -> bytes:
    return _event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def _block_stop(index: int) -> bytes:
    return _event("content_block_stop", {"type": "content_block_stop", "index": index})


def _stop_reason(finished: bool) -> str:
    return "end_turn" if finished else "max_tokens"


def usage_json(usage: Usage, *, output_tokens: int) -> dict[str, Any]:
    # input_tokens counts only the uncached part; the total prompt is input + cache reads.
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": output_tokens,
    }


class MessagesWire:
    """message_start, a thinking block when thinking, a text block, message_delta, message_stop."""

    def __init__(self, *, message_id: str, model: str, thinking: bool, usage: Usage, tool_call: bool = False) -> None:
        self._tool_call = tool_call
        self._tool_started = False
        self._message_id = message_id
        self._model = model
        self._thinking = thinking
        self._usage = usage
        self._answer_index = 1 if thinking else 0
        self._open_index = 0
        self._thinking_delta = _delta_template(0, "thinking_delta", "thinking")
        self._text_delta = _delta_template(self._answer_index, "text_delta", "text")

    def opening(self) -> bytes:
        message: dict[str, Any] = {
            "id": self._message_id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_json(self._usage, output_tokens=1),
        }
        first_block = {"type": "thinking", "thinking": "", "signature": ""} if self._thinking else self._answer_block()
        return (
            _event("message_start", {"type": "message_start", "message": message})
            + _block_start(0, first_block)
            # The real API writes this one with a space after the colon.
            + b'event: ping\ndata: {"type": "ping"}\n\n'
        )

    def reasoning(self, piece: str) -> bytes:
        head, tail = self._thinking_delta
        return head + dumps(piece).encode() + tail

    def begin_answer(self) -> bytes:
        if not self._thinking:
            return b""
        self._open_index = self._answer_index
        signature = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": THINKING_SIGNATURE},
        }
        return (
            _event("content_block_delta", signature)
            + _block_stop(0)
            + _block_start(self._answer_index, self._answer_block())
        )

    def _answer_block(self) -> dict[str, Any]:
        if self._tool_call:
            return {"type": "tool_use", "id": f"toolu_{self._message_id[-12:]}", "name": TOOL_NAME, "input": {}}
        return {"type": "text", "text": ""}

    def answer(self, piece: str) -> bytes:
        if self._tool_call:
            first = not self._tool_started
            self._tool_started = True
            delta = {"type": "input_json_delta", "partial_json": tool_arguments(piece, first=first)}
            payload = {"type": "content_block_delta", "index": self._answer_index, "delta": delta}
            return _event("content_block_delta", payload)
        head, tail = self._text_delta
        return head + dumps(piece).encode() + tail

    def closing(self, *, finished: bool, usage: Usage) -> bytes:
        stop_reason = "tool_use" if self._tool_call and finished else _stop_reason(finished)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": usage.completion_tokens},
        }
        return (
            _block_stop(self._open_index)
            + _event("message_delta", delta)
            + _event("message_stop", {"type": "message_stop"})
        )

    def malformed(self) -> bytes:
        head = self._text_delta[0] if self._open_index == self._answer_index else self._thinking_delta[0]
        return head + b'"\\u00\n\n'

    def error_event(self) -> bytes:
        return _event("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})


def message_response(*, message_id: str, model: str, plan: OutputPlan, usage: Usage) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if plan.reasoning:
        content.append({"type": "thinking", "thinking": "".join(plan.reasoning), "signature": THINKING_SIGNATURE})
    if plan.answer:
        content.append({"type": "text", "text": "".join(plan.answer)})
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _stop_reason(plan.finished),
        "stop_sequence": None,
        "usage": usage_json(usage, output_tokens=usage.completion_tokens),
    }


def models_list(names: list[str]) -> dict[str, Any]:
    data = [{"type": "model", "id": name, "display_name": name, "created_at": "2025-01-01T00:00:00Z"} for name in names]
    return {
        "data": data,
        "has_more": False,
        "first_id": names[0] if names else None,
        "last_id": names[-1] if names else None,
    }


# status -> (type, message), as the Anthropic API reports them.
_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    404: ("not_found_error", "Not found."),
    429: ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit."),
    500: ("api_error", "Internal server error"),
    503: ("overloaded_error", "Overloaded"),
}


def error_body(status: int, *, request_id: str, message: str | None = None, model: str | None = None) -> dict[str, Any]:
    kind, default_message = _ERRORS.get(status, _ERRORS[500])
    if message is None:
        message = f"model: {model}" if status == 404 and model else default_message
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}


def _authorized(headers: Mapping[str, str], _query: Mapping[str, str], key: str) -> bool:
    return headers.get("x-api-key") == key


FAMILY = Family(
    name="anthropic",
    authorized=_authorized,
    response_headers=lambda request_id: {"request-id": f"req_{request_id}"},
    error_body=lambda status, *, request_id, message=None, model=None: error_body(
        status, request_id=f"req_{request_id}", message=message, model=model
    ),
)


def parse_messages(body: Mapping[str, Any]) -> SimRequest:
    """POST /v1/messages (Anthropic): max_tokens is required, as in the real API."""
    model = model_name(body)
    texts = messages_text(body)
    max_tokens = max_tokens_of(body, "max_tokens", required=True)
    system = content_text(body.get("system"), "system")
    thinking = None
    config = body.get("thinking")
    if isinstance(config, Mapping) and config.get("type") in ("enabled", "disabled"):
        thinking = config["type"] == "enabled"
    return SimRequest(
        model=model,
        prompt="\n".join([system, *texts] if system else texts),
        stream=flag(body, "stream"),
        max_tokens=max_tokens,
        include_usage=True,
        has_stream_options=False,
        thinking=thinking,
        tool_call=forces_tool_call(body),
        cacheable=_marks_cache(body.get("system"))
        or any(_marks_cache(message.get("content")) for message in body["messages"] if isinstance(message, Mapping)),
    )


def _marks_cache(content: Any) -> bool:
    """A list of content blocks with one marked `cache_control` (a plain string cannot be marked)."""
    if not isinstance(content, list):
        return False
    return any(isinstance(part, Mapping) and part.get("cache_control") for part in content)


MESSAGES = Flavour(
    name="messages",
    paths=("/v1/messages",),
    family=FAMILY,
    parse=lambda body, _route: parse_messages(body),
    stream=lambda g: MessagesWire(
        message_id=f"msg_{g.request_id}", model=g.model, thinking=g.thinking, usage=g.usage, tool_call=g.tool_call
    ),
    whole=lambda g: message_response(message_id=f"msg_{g.request_id}", model=g.model, plan=g.plan, usage=g.usage),
)
