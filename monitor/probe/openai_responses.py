"""OpenAI Responses API (`POST /responses`, `stream: true`): typed events, one per `event:`/`type`.

`response.created` and `response.in_progress` carry no tokens; text, reasoning and tool-call
arguments come as `*.delta` events; usage (with cached tokens) comes with `response.completed`.
A response cut short by `max_output_tokens` ends with `response.incomplete`, which is a normal end
for a probe (like `finish_reason: length`); any other reason, `response.failed` and `error` are errors.
"""

from __future__ import annotations

from typing import Any, ClassVar

from monitor.probe.api_base import (
    TOOL_DESCRIPTION,
    TOOL_NAME,
    TOOL_PARAMETERS,
    EventInfo,
    EventKind,
    FixedPath,
    RequestParams,
    error_event,
    error_text,
    load_event,
    merge_extra,
    read_usage,
)
from monitor.probe.sse import SSEEvent

_ANSWER = frozenset({"response.output_text.delta", "response.refusal.delta"})
_REASONING = frozenset({"response.reasoning_summary_text.delta", "response.reasoning_text.delta"})
_TOOL_CALL = frozenset({"response.function_call_arguments.delta", "response.custom_tool_call_input.delta"})
_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class OpenAIResponses(FixedPath):
    name: ClassVar[str] = "openai-responses"
    path: ClassVar[str] = "/responses"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def build_body(self, prompt: str, params: RequestParams) -> dict[str, Any]:
        # Usage always comes with response.completed: include_usage has nothing to ask for here.
        body: dict[str, Any] = {
            "model": params.model,
            "input": prompt,
            "stream": True,
            "max_output_tokens": params.max_tokens,
            "temperature": params.temperature,
            "store": False,
        }
        if params.force_tool_call:
            body["tools"] = [
                {"type": "function", "name": TOOL_NAME, "description": TOOL_DESCRIPTION, "parameters": TOOL_PARAMETERS}
            ]
            body["tool_choice"] = {"type": "function", "name": TOOL_NAME}
        if params.least_reasoning is not None:
            body["reasoning"] = {"effort": params.least_reasoning.effort or "minimal"}
        return merge_extra(body, params.extra_body)

    def classify(self, event: SSEEvent) -> EventInfo:
        obj = load_event(event.data)
        kind = obj.get("type") or event.event
        info = EventInfo()
        if kind in _ANSWER:
            info.kind = EventKind.ANSWER if obj.get("delta") else EventKind.OTHER
        elif kind in _REASONING:
            info.kind = EventKind.REASONING if obj.get("delta") else EventKind.OTHER
        elif kind in _TOOL_CALL:
            info.kind = EventKind.TOOL_CALL if obj.get("delta") else EventKind.OTHER
        elif kind == "error":
            error_event(info, obj.get("error") or obj)
        elif kind in _ENDS or kind in ("response.created", "response.in_progress"):
            response = obj.get("response") or {}
            info.served_model = response.get("model")
            read_usage(
                info,
                response.get("usage"),
                prompt="input_tokens",
                completion="output_tokens",
                details="input_tokens_details",
                output_details="output_tokens_details",
            )
            if kind == "response.completed":
                info.kind = EventKind.DONE
            elif kind == "response.incomplete":
                reason = (response.get("incomplete_details") or {}).get("reason")
                if reason == "max_output_tokens":
                    info.kind = EventKind.DONE
                else:
                    info.kind = EventKind.ERROR
                    info.error_message = f"response incomplete: {reason or 'no reason given'}"
            elif kind == "response.failed":
                info.kind = EventKind.ERROR
                info.error_message = f"response failed: {error_text(response.get('error') or 'no error given')}"
        return info
