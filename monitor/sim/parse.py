"""Request bodies of the five generation APIs, reduced to what the simulator needs (pure)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_TOKENS = 16


class BadRequest(ValueError):
    """The body is not a valid request; the message is shown to the client."""


@dataclass(frozen=True, slots=True)
class SimRequest:
    model: str
    prompt: str
    stream: bool
    max_tokens: int
    include_usage: bool
    has_stream_options: bool
    # What the request says about thinking; None leaves it to the model's default.
    thinking: bool | None
    # The request offers tools and requires one (tool_choice): the answer streams as a tool call.
    tool_call: bool = False


def forces_tool_call(body: Mapping[str, Any]) -> bool:
    """tool_choice (or Gemini's functionCallingConfig) requiring a tool, with tools offered, in any API's shape."""
    if not body.get("tools"):
        return False
    choice = body.get("tool_choice")
    if choice in ("required", "any"):
        return True
    if isinstance(choice, Mapping) and choice.get("type") in ("function", "tool", "any"):
        return True
    config = body.get("toolConfig")
    calling = config.get("functionCallingConfig") if isinstance(config, Mapping) else None
    return isinstance(calling, Mapping) and calling.get("mode") == "ANY"


def load_json(raw: bytes) -> Mapping[str, Any]:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"Invalid JSON body: {exc}") from exc
    if not isinstance(body, Mapping):
        raise BadRequest("The request body must be a JSON object.")
    return body


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: Field required (a non-empty string).")
    return model


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{key}: expected a boolean, got {value!r}.")
    return value


def _max_tokens(body: Mapping[str, Any], *keys: str, required: bool = False) -> int:
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest(f"{key}: expected a positive integer, got {value!r}.")
        return value
    if required:
        raise BadRequest(f"{keys[0]}: Field required")
    return DEFAULT_MAX_TOKENS


def _stream_options(body: Mapping[str, Any], stream: bool) -> tuple[bool, bool]:
    """(present, include_usage). Like vLLM and OpenAI, stream_options without streaming is an error."""
    options = body.get("stream_options")
    if options is None:
        return False, False
    if not isinstance(options, Mapping):
        raise BadRequest(f"stream_options: expected an object, got {options!r}.")
    if not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.")
    return True, _flag(options, "include_usage")


def _content_text(content: Any, where: str) -> str:
    """A message's text: a string, or the text parts of a list (other parts, e.g. images, are ignored)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for i, part in enumerate(content):
            if not isinstance(part, Mapping):
                raise BadRequest(f"{where}[{i}]: expected an object, got {part!r}.")
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise BadRequest(f"{where}[{i}].text: expected a string.")
                texts.append(text)
        return "\n".join(texts)
    raise BadRequest(f"{where}: expected a string or a list of content parts, got {content!r}.")


def _messages_text(body: Mapping[str, Any]) -> list[str]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: Field required (a non-empty list).")
    texts: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}]: expected an object with a 'role'.")
        texts.append(_content_text(message.get("content"), f"messages[{i}].content"))
    return texts


def parse_chat(body: Mapping[str, Any]) -> SimRequest:
    """POST /v1/chat/completions (vLLM / OpenAI)."""
    model = _model(body)
    texts = _messages_text(body)
    stream = _flag(body, "stream")
    has_options, include_usage = _stream_options(body, stream)
    thinking = None
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, Mapping) and isinstance(kwargs.get("enable_thinking"), bool):
        thinking = kwargs["enable_thinking"]
    return SimRequest(
        model=model,
        prompt="\n".join(texts),
        stream=stream,
        max_tokens=_max_tokens(body, "max_completion_tokens", "max_tokens"),
        include_usage=include_usage,
        has_stream_options=has_options,
        thinking=thinking,
        tool_call=forces_tool_call(body),
    )


def parse_completions(body: Mapping[str, Any]) -> SimRequest:
    """POST /v1/completions: a raw prompt, so no chat template and no thinking phase."""
    model = _model(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest("prompt: Field required (a string).")
    stream = _flag(body, "stream")
    has_options, include_usage = _stream_options(body, stream)
    return SimRequest(
        model=model,
        prompt=prompt,
        stream=stream,
        max_tokens=_max_tokens(body, "max_tokens"),
        include_usage=include_usage,
        has_stream_options=has_options,
        thinking=False,
    )


def parse_messages(body: Mapping[str, Any]) -> SimRequest:
    """POST /v1/messages (Anthropic): max_tokens is required, as in the real API."""
    model = _model(body)
    texts = _messages_text(body)
    max_tokens = _max_tokens(body, "max_tokens", required=True)
    system = _content_text(body.get("system"), "system")
    thinking = None
    config = body.get("thinking")
    if isinstance(config, Mapping) and config.get("type") in ("enabled", "disabled"):
        thinking = config["type"] == "enabled"
    return SimRequest(
        model=model,
        prompt="\n".join([system, *texts] if system else texts),
        stream=_flag(body, "stream"),
        max_tokens=max_tokens,
        include_usage=True,
        has_stream_options=False,
        thinking=thinking,
        tool_call=forces_tool_call(body),
    )


def _input_text(value: Any) -> str:
    """Responses `input`: a string, or a list of messages (their text parts) or input_text items."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise BadRequest("input: Field required (a string or a non-empty list).")
    texts: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise BadRequest(f"input[{i}]: expected an object, got {item!r}.")
        content = item.get("content")
        if isinstance(content, list):
            texts.extend(
                str(part.get("text", ""))
                for part in content
                if isinstance(part, Mapping) and part.get("type") in ("input_text", "text")
            )
        elif isinstance(content, str):
            texts.append(content)
    return "\n".join(texts)


def parse_responses(body: Mapping[str, Any]) -> SimRequest:
    """POST /v1/responses (OpenAI Responses): usage always comes with the last event."""
    model = _model(body)
    instructions = body.get("instructions")
    text = _input_text(body.get("input"))
    thinking = None
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and reasoning.get("effort") is not None:
        thinking = reasoning["effort"] not in ("none", "minimal")
    return SimRequest(
        model=model,
        prompt="\n".join([instructions, text]) if isinstance(instructions, str) and instructions else text,
        stream=_flag(body, "stream"),
        max_tokens=_max_tokens(body, "max_output_tokens"),
        include_usage=True,
        has_stream_options=False,
        thinking=thinking,
        tool_call=forces_tool_call(body),
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
        max_tokens=_max_tokens(config, "maxOutputTokens"),
        include_usage=True,
        has_stream_options=False,
        thinking=thinking,
        tool_call=forces_tool_call(body),
    )
