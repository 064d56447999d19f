"""Google Gemini `streamGenerateContent?alt=sse`: one GenerateContentResponse per event, CRLF-framed.

There is no end marker: the last event's candidate carries `finishReason` and the full
`usageMetadata`. Thought summaries are parts with `thought: true`. Without `alt=sse` the API
sends the same objects as one JSON array (`whole_array`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from monitor.sim.parse import BadRequest, SimRequest, forces_tool_call, max_tokens_of
from monitor.sim.plan import OutputPlan
from monitor.sim.wire import TOOL_NAME, Family, Flavour, Route, Usage, dumps, slot, split_template

# The API's own error message for an internal error.
INTERNAL_ERROR = "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting"

STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def usage_json(usage: Usage, *, thoughts: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "promptTokenCount": usage.prompt_tokens,
        "candidatesTokenCount": usage.completion_tokens - thoughts,
        "totalTokenCount": usage.prompt_tokens + usage.completion_tokens,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": usage.prompt_tokens}],
    }
    if usage.cached_tokens:
        out["cachedContentTokenCount"] = usage.cached_tokens
    if thoughts:
        out["thoughtsTokenCount"] = thoughts
    return out


def _finish_reason(finished: bool) -> str:
    return "STOP" if finished else "MAX_TOKENS"


class GeminiWire:
    def __init__(self, *, response_id: str, model: str, usage: Usage, tool_call: bool = False) -> None:
        # Gemini sends a function call whole, in one part: the first answer token brings it.
        self._tool_call = tool_call
        self._answer: list[str] = []
        self._tail = {"modelVersion": model, "responseId": response_id}
        self._prompt_usage = {"promptTokenCount": usage.prompt_tokens, "totalTokenCount": usage.prompt_tokens}
        self._thoughts = 0
        self._text = split_template(self._chunk({"text": slot()}))
        self._thought = split_template(self._chunk({"text": slot(), "thought": True}))

    def _chunk(self, part: dict[str, Any], **candidate: Any) -> str:
        body = {
            "candidates": [{"content": {"parts": [part], "role": "model"}, "index": 0, **candidate}],
            "usageMetadata": self._prompt_usage,
            **self._tail,
        }
        return f"data: {dumps(body)}\r\n\r\n"

    def opening(self) -> bytes:
        return b""

    def reasoning(self, piece: str) -> bytes:
        self._thoughts += 1
        head, tail = self._thought
        return head + dumps(piece).encode() + tail

    def begin_answer(self) -> bytes:
        return b""

    def answer(self, piece: str) -> bytes:
        if self._tool_call:
            self._answer.append(piece)
            if len(self._answer) > 1:
                return b""
            return self._chunk({"functionCall": {"name": TOOL_NAME, "args": {"summary": piece}}}).encode()
        head, tail = self._text
        return head + dumps(piece).encode() + tail

    def closing(self, *, finished: bool, usage: Usage) -> bytes:
        body = {
            "candidates": [
                {
                    "content": {"parts": [{"text": ""}], "role": "model"},
                    "finishReason": _finish_reason(finished),
                    "index": 0,
                }
            ],
            "usageMetadata": usage_json(usage, thoughts=self._thoughts),
            **self._tail,
        }
        return f"data: {dumps(body)}\r\n\r\n".encode()

    def malformed(self) -> bytes:
        return self._text[0] + b'"\\u00\r\n\r\n'

    def error_event(self) -> bytes:
        return f"data: {dumps(error_body(500))}\r\n\r\n".encode()


def whole_array(*, response_id: str, model: str, plan: OutputPlan, usage: Usage) -> list[dict[str, Any]]:
    """What the API sends without alt=sse: every chunk at once, as one JSON array."""
    tail = {"modelVersion": model, "responseId": response_id}
    chunks: list[dict[str, Any]] = []
    if plan.reasoning:
        part = {"text": "".join(plan.reasoning), "thought": True}
        chunks.append({"candidates": [{"content": {"parts": [part], "role": "model"}, "index": 0}], **tail})
    last = {
        "content": {"parts": [{"text": "".join(plan.answer)}], "role": "model"},
        "finishReason": _finish_reason(plan.finished),
        "index": 0,
    }
    chunks.append({"candidates": [last], "usageMetadata": usage_json(usage, thoughts=len(plan.reasoning)), **tail})
    return chunks


def error_body(status: int, *, message: str | None = None, model: str | None = None) -> dict[str, Any]:
    if message is None:
        if status == 404 and model:
            message = f"models/{model} is not found for API version v1beta, or is not supported for generateContent."
        elif status in (401, 403):
            message = "API key not valid. Please pass a valid API key."
        elif status == 429:
            message = "Resource has been exhausted (e.g. check quota)."
        elif status == 503:
            message = "The model is overloaded. Please try again later."
        else:
            message = INTERNAL_ERROR
    return {"error": {"code": status, "message": message, "status": STATUS_NAMES.get(status, "INTERNAL")}}


def _authorized(headers: Mapping[str, str], query: Mapping[str, str], key: str) -> bool:
    return key in (headers.get("x-goog-api-key"), query.get("key"))


def _family_error(status: int, *, request_id: str, message: str | None = None, model: str | None = None) -> Any:
    return error_body(status, message=message, model=model)


FAMILY = Family(
    name="gemini",
    authorized=_authorized,
    response_headers=lambda request_id: {"x-request-id": request_id},
    error_body=_family_error,
)


def parse_gemini(body: Mapping[str, Any], *, model: str, stream: bool) -> SimRequest:
    """POST .../models/{model}:streamGenerateContent: the model and streaming come from the URL."""
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise BadRequest("* GenerateContentRequest.contents: contents is not specified")
    texts: list[str] = []
    for i, content in enumerate(contents):
        parts = content.get("parts") if isinstance(content, Mapping) else None
        if not isinstance(parts, list):
            raise BadRequest(f"* GenerateContentRequest.contents[{i}].parts: parts is not specified")
        texts.extend(str(part["text"]) for part in parts if isinstance(part, Mapping) and "text" in part)
    config = body.get("generationConfig") or {}
    if not isinstance(config, Mapping):
        raise BadRequest("generationConfig: expected an object.")
    thinking = None
    thinking_config = config.get("thinkingConfig")
    if isinstance(thinking_config, Mapping):
        if thinking_config.get("thinkingBudget") == 0:
            thinking = False
        elif thinking_config.get("includeThoughts") is True:
            thinking = True
    return SimRequest(
        model=model,
        prompt="\n".join(texts),
        stream=stream,
        max_tokens=max_tokens_of(config, "maxOutputTokens"),
        include_usage=True,
        has_stream_options=False,
        thinking=thinking,
        tool_call=forces_tool_call(body),
    )


def _parse(body: Mapping[str, Any], route: Route) -> SimRequest:
    # Model and streaming are in the URL; without alt=sse the API answers with one JSON array.
    streams = route.match["method"] == "streamGenerateContent" and route.query.get("alt") == "sse"
    return parse_gemini(body, model=route.match["model"], stream=streams)


GEMINI = Flavour(
    name="gemini",
    paths=tuple(f"/{version}/models/{{model}}:{{method}}" for version in ("v1beta", "v1")),
    family=FAMILY,
    parse=_parse,
    stream=lambda g: GeminiWire(response_id=g.request_id, model=g.model, usage=g.usage, tool_call=g.tool_call),
    whole=lambda g: whole_array(response_id=g.request_id, model=g.model, plan=g.plan, usage=g.usage),
    serves=lambda route: route.match["method"] in ("streamGenerateContent", "generateContent"),
)
