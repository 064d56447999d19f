"""vLLM / OpenAI: chat completions and legacy completions, streamed and whole, and errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from monitor.sim.parse import (
    BadRequest,
    SimRequest,
    flag,
    forces_tool_call,
    max_tokens_of,
    messages_text,
    model_name,
    stream_options,
)
from monitor.sim.plan import OutputPlan
from monitor.sim.wire import (
    TOOL_NAME,
    Family,
    Flavour,
    Usage,
    dumps,
    slot,
    split_template,
    tool_arguments,
)

DONE = b"data: [DONE]\n\n"


def _event(obj: Any) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode()


def usage_json(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "completion_tokens": usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }
    if usage.reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return out


def _finish_reason(finished: bool) -> str:
    return "stop" if finished else "length"


class _OpenAIStream:
    """What the chat and the completions stream write alike: an answer piece into its event template, the
    usage chunk (when the request asked for it) before `[DONE]`, a cut answer event, the error event."""

    _header: dict[str, Any]
    _include_usage: bool
    _answer: tuple[bytes, bytes]  # the answer event around its piece (`split_template`)

    def answer(self, piece: str) -> bytes:
        head, tail = self._answer
        return head + dumps(piece).encode() + tail

    def _ending(self, last: bytes, usage: Usage) -> bytes:
        if self._include_usage:
            last += _event({**self._header, "choices": [], "usage": usage_json(usage)})
        return last + DONE

    def malformed(self) -> bytes:
        return self._answer[0] + b'"\\u00\n\n'

    def error_event(self) -> bytes:
        return stream_error_event()


class ChatWire(_OpenAIStream):
    """`data: {chat.completion.chunk}` events, as vLLM's OpenAI server writes them."""

    def __init__(
        self,
        *,
        chunk_id: str,
        created: int,
        model: str,
        reasoning_field: str,
        include_usage: bool,
        tool_call: bool = False,
        fingerprint: str | None = None,
    ) -> None:
        self._header = {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model}
        if fingerprint is not None:
            self._header["system_fingerprint"] = fingerprint
        self._include_usage = include_usage
        self._tool_call = tool_call
        self._tool_started = False
        self._call_id = f"chatcmpl-tool-{chunk_id[-12:]}"
        self._reasoning = split_template(self._delta_event({reasoning_field: slot()}))
        self._answer = split_template(self._delta_event({"content": slot()}))

    def _delta_event(self, delta: dict[str, Any]) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return f"data: {dumps({**self._header, 'choices': [choice]})}\n\n"

    def opening(self) -> bytes:
        return self._delta_event({"role": "assistant", "content": ""}).encode()

    def reasoning(self, piece: str) -> bytes:
        head, tail = self._reasoning
        return head + dumps(piece).encode() + tail

    def begin_answer(self) -> bytes:
        return b""

    def answer(self, piece: str) -> bytes:
        if self._tool_call:
            return self._tool_delta(piece)
        return super().answer(piece)

    def _tool_delta(self, piece: str) -> bytes:
        first = not self._tool_started
        self._tool_started = True
        call: dict[str, Any] = {"index": 0, "function": {"arguments": tool_arguments(piece, first=first)}}
        if first:
            call = {
                "index": 0,
                "id": self._call_id,
                "type": "function",
                "function": {"name": TOOL_NAME, **call["function"]},
            }
        return self._delta_event({"tool_calls": [call]}).encode()

    def closing(self, *, finished: bool, usage: Usage) -> bytes:
        choice = {
            "index": 0,
            "delta": {},
            "logprobs": None,
            "finish_reason": "tool_calls" if self._tool_call and finished else _finish_reason(finished),
            "stop_reason": None,
        }
        return self._ending(_event({**self._header, "choices": [choice]}), usage)


class CompletionWire(_OpenAIStream):
    """`data: {text_completion}` events; no role chunk, the first event carries the first token."""

    def __init__(
        self, *, chunk_id: str, created: int, model: str, include_usage: bool, fingerprint: str | None = None
    ) -> None:
        self._header = {"id": chunk_id, "object": "text_completion", "created": created, "model": model}
        if fingerprint is not None:
            self._header["system_fingerprint"] = fingerprint
        self._include_usage = include_usage
        self._answer = split_template(self._choice_event(slot(), None))

    def _choice_event(self, text: str, finish_reason: str | None) -> str:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        return f"data: {dumps({**self._header, 'choices': [choice]})}\n\n"

    def opening(self) -> bytes:
        return b""

    def reasoning(self, piece: str) -> bytes:
        return self.answer(piece)

    def begin_answer(self) -> bytes:
        return b""

    def closing(self, *, finished: bool, usage: Usage) -> bytes:
        return self._ending(self._choice_event("", _finish_reason(finished)).encode(), usage)


def stream_error_event() -> bytes:
    error = {"message": "The server had an error while processing your request.", "type": "server_error"}
    return _event({"error": {**error, "code": 500}})


def chat_response(
    *, chunk_id: str, created: int, model: str, reasoning_field: str, plan: OutputPlan, usage: Usage
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(plan.answer) if plan.answer else None,
        reasoning_field: "".join(plan.reasoning) if plan.reasoning else None,
        "tool_calls": [],
    }
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": _finish_reason(plan.finished),
        "stop_reason": None,
    }
    return {
        "id": chunk_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage_json(usage),
        "prompt_logprobs": None,
    }


def completion_response(*, chunk_id: str, created: int, model: str, plan: OutputPlan, usage: Usage) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": "".join(plan.reasoning + plan.answer),
        "logprobs": None,
        "finish_reason": _finish_reason(plan.finished),
        "stop_reason": None,
    }
    return {
        "id": chunk_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage_json(usage),
    }


def models_list(names: list[str], *, created: int) -> dict[str, Any]:
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": name, "parent": None}
        for name in names
    ]
    return {"object": "list", "data": data}


# status -> (message, type, code). 400 and 404 follow vLLM; the others follow the OpenAI API.
_ERRORS: dict[int, tuple[str, str, int | str | None]] = {
    400: ("Bad request.", "BadRequestError", 400),
    401: (
        "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.",
        "invalid_request_error",
        "invalid_api_key",
    ),
    404: ("The model does not exist.", "NotFoundError", 404),
    429: ("Rate limit reached for requests. Please try again in 1s.", "requests", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request. Sorry about that!", "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}


def error_body(status: int, *, message: str | None = None, model: str | None = None) -> dict[str, Any]:
    default_message, kind, code = _ERRORS.get(status, _ERRORS[500])
    if message is None:
        message = f"The model `{model}` does not exist." if status == 404 and model else default_message
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _authorized(headers: Mapping[str, str], _query: Mapping[str, str], key: str) -> bool:
    return headers.get("Authorization") == f"Bearer {key}"


def _family_error(status: int, *, request_id: str, message: str | None = None, model: str | None = None) -> Any:
    return error_body(status, message=message, model=model)


# vLLM's and OpenAI's APIs (the Responses API too): a bearer key, x-request-id, OpenAI error bodies.
FAMILY = Family(
    name="openai",
    authorized=_authorized,
    response_headers=lambda request_id: {"x-request-id": request_id},
    error_body=_family_error,
)


def parse_chat(body: Mapping[str, Any]) -> SimRequest:
    """POST /v1/chat/completions (vLLM / OpenAI)."""
    model = model_name(body)
    texts = messages_text(body)
    stream = flag(body, "stream")
    has_options, include_usage = stream_options(body, stream)
    thinking = None
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, Mapping) and isinstance(kwargs.get("enable_thinking"), bool):
        thinking = kwargs["enable_thinking"]
    elif isinstance(effort := body.get("reasoning_effort"), str):
        # OpenAI's reasoning models: minimal (GPT-5) and none (GPT-5.1) leave out the reasoning.
        thinking = effort not in ("none", "minimal")
    return SimRequest(
        model=model,
        prompt="\n".join(texts),
        stream=stream,
        max_tokens=max_tokens_of(body, "max_completion_tokens", "max_tokens"),
        include_usage=include_usage,
        has_stream_options=has_options,
        thinking=thinking,
        tool_call=forces_tool_call(body),
    )


def parse_completions(body: Mapping[str, Any]) -> SimRequest:
    """POST /v1/completions: a raw prompt, so no chat template and no thinking phase."""
    model = model_name(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest("prompt: Field required (a string).")
    stream = flag(body, "stream")
    has_options, include_usage = stream_options(body, stream)
    return SimRequest(
        model=model,
        prompt=prompt,
        stream=stream,
        max_tokens=max_tokens_of(body, "max_tokens"),
        include_usage=include_usage,
        has_stream_options=has_options,
        thinking=False,
    )


CHAT = Flavour(
    name="chat",
    paths=("/v1/chat/completions",),
    family=FAMILY,
    parse=lambda body, _route: parse_chat(body),
    stream=lambda g: ChatWire(
        chunk_id=f"chatcmpl-{g.request_id}",
        created=g.created,
        model=g.model,
        reasoning_field=g.reasoning_field,
        include_usage=g.include_usage,
        tool_call=g.tool_call,
        fingerprint=g.fingerprint,
    ),
    whole=lambda g: chat_response(
        chunk_id=f"chatcmpl-{g.request_id}",
        created=g.created,
        model=g.model,
        reasoning_field=g.reasoning_field,
        plan=g.plan,
        usage=g.usage,
    ),
)

COMPLETIONS = Flavour(
    name="completions",
    paths=("/v1/completions",),
    family=FAMILY,
    parse=lambda body, _route: parse_completions(body),
    stream=lambda g: CompletionWire(
        chunk_id=f"cmpl-{g.request_id}",
        created=g.created,
        model=g.model,
        include_usage=g.include_usage,
        fingerprint=g.fingerprint,
    ),
    whole=lambda g: completion_response(
        chunk_id=f"cmpl-{g.request_id}", created=g.created, model=g.model, plan=g.plan, usage=g.usage
    ),
)
