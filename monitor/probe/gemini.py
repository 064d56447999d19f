"""Google Gemini (`POST …/models/{model}:streamGenerateContent?alt=sse`, key in `x-goog-api-key`).

Without `alt=sse` the API answers with one JSON array instead of events, so the path always asks
for it (and the configuration refuses a base_url that would drop it). There is no end marker: the
event whose candidate has a `finishReason` ends the stream, and may carry the last tokens too.
"""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote

from monitor.probe.api_base import (
    TOOL_DESCRIPTION,
    TOOL_NAME,
    TOOL_PARAMETERS,
    EventInfo,
    EventKind,
    MalformedEvent,
    RequestParams,
    error_event,
    load_event,
    merge_extra,
)
from monitor.probe.sse import SSEEvent

# Ends that are a normal answer; any other finishReason (SAFETY, RECITATION, ...) is an error.
_NORMAL_ENDS = frozenset({"STOP", "MAX_TOKENS"})


class Gemini:
    name: ClassVar[str] = "gemini"
    path: ClassVar[str] = "/models/{model}:streamGenerateContent?alt=sse"

    def path_for(self, params: RequestParams) -> str:
        model = params.model.removeprefix("models/")
        return self.path.format(model=quote(model, safe=""))

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"x-goog-api-key": api_key} if api_key else {}

    def build_body(self, prompt: str, params: RequestParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "contents": [{"role": "user", "parts": [{"text": prompt}]}],
            "generationConfig": {"maxOutputTokens": params.max_tokens, "temperature": params.temperature},
        }
        if params.force_tool_call:
            declaration = {"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "parameters": TOOL_PARAMETERS}
            body["tools"] = [{"functionDeclarations": [declaration]}]
            body["toolConfig"] = {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [TOOL_NAME]}}
        if (least := params.least_reasoning) is not None:
            # Gemini 2.5 Flash and Flash-Lite stop thinking at a budget of 0; Gemini 3 takes a level
            # instead, and 2.5 Pro cannot stop (its least is a budget of 128, set in extra_body).
            thinking = {"thinkingLevel": least.effort} if least.effort else {"thinkingBudget": 0}
            body["generationConfig"]["thinkingConfig"] = thinking
        return merge_extra(body, params.extra_body)

    def classify(self, event: SSEEvent) -> EventInfo:
        obj = load_event(event.data)
        info = EventInfo(served_model=obj.get("modelVersion"))
        if "error" in obj:
            return error_event(info, obj["error"])
        usage = obj.get("usageMetadata")
        if isinstance(usage, dict):
            info.prompt_tokens = usage.get("promptTokenCount")
            info.cached_tokens = usage.get("cachedContentTokenCount")
            if "candidatesTokenCount" in usage or "thoughtsTokenCount" in usage:
                info.completion_tokens = (usage.get("candidatesTokenCount") or 0) + (
                    usage.get("thoughtsTokenCount") or 0
                )
                # Gemini leaves thoughtsTokenCount out when the model did not think: that is a count of 0.
                info.reasoning_tokens = usage.get("thoughtsTokenCount") or 0
        candidates = obj.get("candidates")
        if not candidates:
            blocked = (obj.get("promptFeedback") or {}).get("blockReason")
            if blocked:
                info.kind = EventKind.ERROR
                info.error_message = f"prompt blocked: {blocked}"
            return info
        candidate = candidates[0]
        if not isinstance(candidate, dict):
            raise MalformedEvent("candidates[0] is not an object")
        for part in (candidate.get("content") or {}).get("parts") or ():
            if part.get("functionCall"):
                info.kind = EventKind.TOOL_CALL
            elif part.get("text") and info.kind is EventKind.OTHER:
                info.kind = EventKind.REASONING if part.get("thought") else EventKind.ANSWER
            elif part.get("text") and not part.get("thought") and info.kind is EventKind.REASONING:
                info.kind = EventKind.ANSWER
        reason = candidate.get("finishReason")
        if reason in _NORMAL_ENDS:
            info.finished = True
        elif reason:
            info.kind = EventKind.ERROR
            info.error_message = f"generation stopped: {reason}"
        return info
