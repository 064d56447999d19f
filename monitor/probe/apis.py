"""The only per-API code: how to build the request and what each streamed event means.

Everything else (timing, timeouts, errors, statistics) is shared by all APIs in `client.py`.
Adding an API flavour means one new module (built on `api_base`) and one line in `FLAVORS`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from monitor.probe.api_base import (
    TOOL_DESCRIPTION,
    TOOL_NAME,
    TOOL_PARAMETERS,
    ApiFlavor,
    EventInfo,
    EventKind,
    FixedPath,
    LeastReasoning,
    MalformedEvent,
    RequestParams,
    error_event,
    load_event,
    merge_extra,
    read_usage,
)
from monitor.probe.gemini import Gemini
from monitor.probe.openai_responses import OpenAIResponses
from monitor.probe.sse import SSEEvent

__all__ = ["FLAVORS", "ApiFlavor", "EventInfo", "EventKind", "MalformedEvent", "RequestParams"]


class _OpenAIBase(FixedPath):
    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _common(self, params: RequestParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": params.model,
            "stream": True,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
        }
        if params.include_usage:
            body["stream_options"] = {"include_usage": True}
        return body

    def classify(self, event: SSEEvent) -> EventInfo:
        if event.data.strip() == "[DONE]":
            return EventInfo(EventKind.DONE)
        obj = load_event(event.data)
        fingerprint = obj.get("system_fingerprint")
        info = EventInfo(
            served_model=obj.get("model"), fingerprint=fingerprint if isinstance(fingerprint, str) else None
        )
        if "error" in obj:
            return error_event(info, obj["error"])
        read_usage(
            info,
            obj.get("usage"),
            prompt="prompt_tokens",
            completion="completion_tokens",
            details="prompt_tokens_details",
            output_details="completion_tokens_details",
        )
        choices = obj.get("choices")
        if choices:
            choice = choices[0]
            if not isinstance(choice, dict):
                raise MalformedEvent("choices[0] is not an object")
            info.kind = self._choice_kind(choice)
        return info

    def _choice_kind(self, choice: dict[str, Any]) -> EventKind:
        raise NotImplementedError


class OpenAIChat(_OpenAIBase):
    name: ClassVar[str] = "openai-chat"
    path: ClassVar[str] = "/chat/completions"

    def build_body(self, prompt: str, params: RequestParams) -> dict[str, Any]:
        body = self._common(params)
        body["messages"] = [{"role": "user", "content": prompt}]
        if params.force_tool_call:
            function = {"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "parameters": TOOL_PARAMETERS}
            body["tools"] = [{"type": "function", "function": function}]
            body["tool_choice"] = {"type": "function", "function": {"name": TOOL_NAME}}
        if params.least_reasoning is not None:
            body.update(self._least_reasoning(params.least_reasoning))
        return merge_extra(body, params.extra_body)

    @staticmethod
    def _least_reasoning(least: LeastReasoning) -> dict[str, Any]:
        if least.openai_hosted:
            return {"reasoning_effort": least.effort or "minimal"}
        # vLLM and SGLang hand chat_template_kwargs to the model's template, where Qwen3 and GLM read
        # enable_thinking (templates that do not know it ignore it); an effort is sent only when named,
        # for gpt-oss, whose template reads reasoning_effort and cannot stop reasoning.
        switches: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": False}}
        if least.effort:
            switches["reasoning_effort"] = least.effort
        return switches

    def _choice_kind(self, choice: dict[str, Any]) -> EventKind:
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return EventKind.OTHER
        if delta.get("content"):
            return EventKind.ANSWER
        if delta.get("tool_calls") or delta.get("function_call"):
            return EventKind.TOOL_CALL
        # vLLM before 0.9 and DeepSeek say reasoning_content; newer vLLM and OpenRouter say reasoning.
        if delta.get("reasoning_content") or delta.get("reasoning"):
            return EventKind.REASONING
        return EventKind.OTHER


class OpenAICompletions(_OpenAIBase):
    name: ClassVar[str] = "openai-completions"
    path: ClassVar[str] = "/completions"

    def build_body(self, prompt: str, params: RequestParams) -> dict[str, Any]:
        body = self._common(params)
        body["prompt"] = prompt
        return merge_extra(body, params.extra_body)

    def _choice_kind(self, choice: dict[str, Any]) -> EventKind:
        return EventKind.ANSWER if choice.get("text") else EventKind.OTHER


class AnthropicMessages(FixedPath):
    name: ClassVar[str] = "anthropic-messages"
    path: ClassVar[str] = "/messages"
    version = "2023-06-01"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": self.version}
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def build_body(self, prompt: str, params: RequestParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": params.model,
            "stream": True,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "messages": [{"role": "user", "content": self._content(prompt, params)}],
        }
        if params.force_tool_call:
            body["tools"] = [{"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "input_schema": TOOL_PARAMETERS}]
            body["tool_choice"] = {"type": "tool", "name": TOOL_NAME}
        if params.least_reasoning is not None:
            # Extended thinking has no effort levels here: off is the least.
            body["thinking"] = {"type": "disabled"}
        return merge_extra(body, params.extra_body)

    @staticmethod
    def _content(prompt: str, params: RequestParams) -> str | list[dict[str, Any]]:
        if not params.cache_breakpoint:
            return prompt
        # Anthropic reads from and writes to its prompt cache only up to a block marked so (prompts
        # under its minimum, 1,024 or 2,048 tokens by model, are then simply not cached).
        return [{"type": "text", "text": prompt, "cache_control": {"type": "ephemeral"}}]

    def classify(self, event: SSEEvent) -> EventInfo:
        obj = load_event(event.data)
        kind = obj.get("type") or event.event
        info = EventInfo()
        if kind == "content_block_delta":
            delta = obj.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta" and delta.get("text"):
                info.kind = EventKind.ANSWER
            elif dtype == "input_json_delta" and delta.get("partial_json"):
                info.kind = EventKind.TOOL_CALL
            elif dtype == "thinking_delta" and delta.get("thinking"):
                info.kind = EventKind.REASONING
        elif kind == "message_start":
            message = obj.get("message") or {}
            info.served_model = message.get("model")
            usage = message.get("usage") or {}
            if "input_tokens" in usage:
                cached = usage.get("cache_read_input_tokens") or 0
                created = usage.get("cache_creation_input_tokens") or 0
                info.prompt_tokens = (usage.get("input_tokens") or 0) + cached + created
                info.cached_tokens = cached
        elif kind == "message_delta":
            usage = obj.get("usage") or {}
            info.completion_tokens = usage.get("output_tokens")
        elif kind == "message_stop":
            info.kind = EventKind.DONE
        elif kind == "error":
            error_event(info, obj.get("error"))
        return info


_ALL: tuple[ApiFlavor, ...] = (
    OpenAIChat(),
    OpenAICompletions(),
    AnthropicMessages(),
    OpenAIResponses(),
    Gemini(),
)
FLAVORS: dict[str, ApiFlavor] = {flavor.name: flavor for flavor in _ALL}
