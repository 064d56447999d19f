"""OpenAI Responses: typed events (`event:` plus `type`), a sequence number on each, and errors.

Reasoning streams as `response.reasoning_text.delta`, as vLLM's Responses server writes it; a
response cut by `max_output_tokens` ends with `response.incomplete`, as the hosted API does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from monitor.sim.parse import BadRequest, SimRequest, flag, forces_tool_call, max_tokens_of, model_name
from monitor.sim.plan import OutputPlan
from monitor.sim.wire import TOOL_NAME, Flavour, Usage, dumps, tool_arguments
from monitor.sim.wire import openai as openai_wire


def usage_json(usage: Usage, *, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


class ResponsesWire:
    """created, in_progress, a reasoning item when thinking, a message item, completed or incomplete."""

    def __init__(self, *, response_id: str, created: int, model: str, thinking: bool, tool_call: bool = False) -> None:
        self._tool_call = tool_call
        self._call_id = f"fc_{response_id}"
        self._id = response_id
        self._created = created
        self._model = model
        self._thinking = thinking
        self._sequence = 0
        self._reasoning: list[str] = []
        self._answer: list[str] = []
        self._message_index = 1 if thinking else 0
        self._message_id = f"msg_{response_id}"
        self._reasoning_id = f"rs_{response_id}"
        # Per-token events are built from these two halves and the piece: no dict per token.
        self._answer_head = (
            'data: {"type":"response.output_text.delta","item_id":'
            f'{dumps(self._message_id)},"output_index":{self._message_index},"content_index":0,"delta":'
        ).encode()
        self._reasoning_head = (
            'data: {"type":"response.reasoning_text.delta","item_id":'
            f'{dumps(self._reasoning_id)},"output_index":0,"content_index":0,"delta":'
        ).encode()

    def _event(self, name: str, obj: dict[str, Any]) -> bytes:
        payload = {"type": name, "sequence_number": self._sequence, **obj}
        self._sequence += 1
        return f"event: {name}\ndata: {dumps(payload)}\n\n".encode()

    def _delta(self, name: str, head: bytes, piece: str) -> bytes:
        sequence = self._sequence
        self._sequence += 1
        return (
            b"event: " + name.encode() + b"\n" + head + dumps(piece).encode() + b',"sequence_number":%d}\n\n' % sequence
        )

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": "response",
            "created_at": self._created,
            "status": status,
            "model": self._model,
            "output": [],
            "usage": None,
            **extra,
        }

    def _message_start(self) -> bytes:
        if self._tool_call:
            call = {
                "id": self._call_id,
                "type": "function_call",
                "status": "in_progress",
                "call_id": f"call_{self._id}",
                "name": TOOL_NAME,
                "arguments": "",
            }
            return self._event("response.output_item.added", {"output_index": self._message_index, "item": call})
        item = {"id": self._message_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        return self._event(
            "response.output_item.added", {"output_index": self._message_index, "item": item}
        ) + self._event(
            "response.content_part.added",
            {"item_id": self._message_id, "output_index": self._message_index, "content_index": 0, "part": part},
        )

    def opening(self) -> bytes:
        out = self._event("response.created", {"response": self._response("in_progress")})
        out += self._event("response.in_progress", {"response": self._response("in_progress")})
        if self._thinking:
            item = {"id": self._reasoning_id, "type": "reasoning", "summary": [], "content": []}
            return out + self._event("response.output_item.added", {"output_index": 0, "item": item})
        return out + self._message_start()

    def reasoning(self, piece: str) -> bytes:
        self._reasoning.append(piece)
        return self._delta("response.reasoning_text.delta", self._reasoning_head, piece)

    def begin_answer(self) -> bytes:
        if not self._thinking:
            return b""
        text = "".join(self._reasoning)
        item = {
            "id": self._reasoning_id,
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
        }
        return self._event("response.output_item.done", {"output_index": 0, "item": item}) + self._message_start()

    def answer(self, piece: str) -> bytes:
        if self._tool_call:
            arguments = tool_arguments(piece, first=not self._answer)
            self._answer.append(arguments)
            return self._event(
                "response.function_call_arguments.delta",
                {"item_id": self._call_id, "output_index": self._message_index, "delta": arguments},
            )
        self._answer.append(piece)
        return self._delta("response.output_text.delta", self._answer_head, piece)

    def _closing_items(self) -> bytes:
        arguments = "".join(self._answer)
        where = {"item_id": self._call_id, "output_index": self._message_index}
        item = {
            "id": self._call_id,
            "type": "function_call",
            "status": "completed",
            "call_id": f"call_{self._id}",
            "name": TOOL_NAME,
            "arguments": arguments,
        }
        return self._event("response.function_call_arguments.done", {**where, "arguments": arguments}) + self._event(
            "response.output_item.done", {"output_index": self._message_index, "item": item}
        )

    def closing(self, *, finished: bool, usage: Usage) -> bytes:
        if self._tool_call:
            return self._end(self._closing_items(), finished=finished, usage=usage)
        text = "".join(self._answer)
        part = {"type": "output_text", "text": text, "annotations": []}
        where = {"item_id": self._message_id, "output_index": self._message_index, "content_index": 0}
        item = {
            "id": self._message_id,
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [part],
        }
        out = self._event("response.output_text.done", {**where, "text": text})
        out += self._event("response.content_part.done", {**where, "part": part})
        out += self._event("response.output_item.done", {"output_index": self._message_index, "item": item})
        return self._end(out, finished=finished, usage=usage)

    def _end(self, out: bytes, *, finished: bool, usage: Usage) -> bytes:
        usage_obj = usage_json(usage, reasoning_tokens=len(self._reasoning))
        if finished:
            return out + self._event("response.completed", {"response": self._response("completed", usage=usage_obj)})
        incomplete = self._response("incomplete", usage=usage_obj, incomplete_details={"reason": "max_output_tokens"})
        return out + self._event("response.incomplete", {"response": incomplete})

    def malformed(self) -> bytes:
        return b"event: response.output_text.delta\n" + self._answer_head + b'"\\u00\n\n'

    def error_event(self) -> bytes:
        message = "The server had an error while processing your request."
        return self._event("error", {"code": "server_error", "message": message, "param": None})


def response_object(*, response_id: str, created: int, model: str, plan: OutputPlan, usage: Usage) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if plan.reasoning:
        content = [{"type": "reasoning_text", "text": "".join(plan.reasoning)}]
        output.append({"id": f"rs_{response_id}", "type": "reasoning", "summary": [], "content": content})
    text = {"type": "output_text", "text": "".join(plan.answer), "annotations": []}
    output.append(
        {"id": f"msg_{response_id}", "type": "message", "status": "completed", "role": "assistant", "content": [text]}
    )
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "completed" if plan.finished else "incomplete",
        "incomplete_details": None if plan.finished else {"reason": "max_output_tokens"},
        "model": model,
        "output": output,
        "usage": usage_json(usage, reasoning_tokens=len(plan.reasoning)),
    }


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
    model = model_name(body)
    instructions = body.get("instructions")
    text = _input_text(body.get("input"))
    thinking = None
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and reasoning.get("effort") is not None:
        thinking = reasoning["effort"] not in ("none", "minimal")
    return SimRequest(
        model=model,
        prompt="\n".join([instructions, text]) if isinstance(instructions, str) and instructions else text,
        stream=flag(body, "stream"),
        max_tokens=max_tokens_of(body, "max_output_tokens"),
        include_usage=True,
        has_stream_options=False,
        thinking=thinking,
        tool_call=forces_tool_call(body),
    )


RESPONSES = Flavour(
    name="responses",
    paths=("/v1/responses",),
    family=openai_wire.FAMILY,
    parse=lambda body, _route: parse_responses(body),
    stream=lambda g: ResponsesWire(
        response_id=f"resp_{g.request_id}",
        created=g.created,
        model=g.model,
        thinking=g.thinking,
        tool_call=g.tool_call,
    ),
    whole=lambda g: response_object(
        response_id=f"resp_{g.request_id}", created=g.created, model=g.model, plan=g.plan, usage=g.usage
    ),
)
