"""Reading request bodies (pure): what every API's parser shares. Each flavour's own parser is in its wire module."""

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
    # Whether the prefix cache may serve and keep this prompt: always, but on Anthropic only when a
    # block is marked cache_control, as on the real API.
    cacheable: bool = True


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


def model_name(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: Field required (a non-empty string).")
    return model


def flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{key}: expected a boolean, got {value!r}.")
    return value


def max_tokens_of(body: Mapping[str, Any], *keys: str, required: bool = False) -> int:
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


def stream_options(body: Mapping[str, Any], stream: bool) -> tuple[bool, bool]:
    """(present, include_usage). Like vLLM and OpenAI, stream_options without streaming is an error."""
    options = body.get("stream_options")
    if options is None:
        return False, False
    if not isinstance(options, Mapping):
        raise BadRequest(f"stream_options: expected an object, got {options!r}.")
    if not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.")
    return True, flag(options, "include_usage")


def content_text(content: Any, where: str) -> str:
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


def messages_text(body: Mapping[str, Any]) -> list[str]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: Field required (a non-empty list).")
    texts: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}]: expected an object with a 'role'.")
        texts.append(content_text(message.get("content"), f"messages[{i}].content"))
    return texts
