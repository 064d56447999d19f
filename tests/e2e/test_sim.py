"""The simulator over real loopback HTTP: wire formats, faults, caching, control, stamps, timing."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from monitor.sim import ModelProfile, RunningSimulator, Simulator, build_app, start

REASONING = ["Okay", ",", " the"]
ANSWER = ["Time", " to", " firs", "t"]


def fast_profiles() -> dict[str, ModelProfile]:
    """Quick models, so the suite spends its time on behaviour rather than waiting."""

    def profile(name: str, **extra: Any) -> ModelProfile:
        return ModelProfile(
            name=name, ttft_base_ms=10.0, prefill_ms_per_1k=0.0, noise_sigma=0.0, decode_tps=2000.0, **extra
        )

    return {
        "thinker": profile("thinker", reasoning_tokens=3, answer_tokens=2),
        "plain": profile("plain", answer_tokens=4),
        "claude": profile("claude", reasoning_tokens=2, answer_tokens=3, thinks_by_default=False),
    }


@pytest.fixture
def sim() -> Simulator:
    return Simulator(fast_profiles(), noise=False, seed=7)


@pytest.fixture
async def server(sim: Simulator) -> AsyncIterator[RunningSimulator]:
    running = await start(sim, port=0)
    yield running
    await running.close()


@pytest.fixture
async def client(server: RunningSimulator) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=server.url) as session:
        yield session


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) per SSE event; comments come back as ("comment", text)."""
    events: list[tuple[str | None, str]] = []
    for block in text.split("\n\n"):
        if not block:
            continue
        name: str | None = None
        data: list[str] = []
        for line in block.split("\n"):
            if line.startswith(":"):
                events.append(("comment", line[1:].strip()))
            elif line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data.append(line.removeprefix("data: "))
        if data:
            events.append((name, "\n".join(data)))
    return events


def openai_payloads(text: str) -> list[Any]:
    """The data payloads of an OpenAI-style stream, JSON-decoded except the final "[DONE]"."""
    return [data if data == "[DONE]" else json.loads(data) for name, data in sse_events(text) if name is None]


def chat_body(model: str = "thinker", content: str = "Hello there", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "stream": True, **extra}


def messages_body(model: str = "claude", content: str | list[Any] = "Hello there", **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 16,
        "stream": True,
        **extra,
    }


async def post(
    client: aiohttp.ClientSession, path: str, body: Any, **kwargs: Any
) -> tuple[aiohttp.ClientResponse, str]:
    async with client.post(path, json=body, **kwargs) as response:
        return response, await response.text()


async def configure(client: aiohttp.ClientSession, model: str, patch: dict[str, Any]) -> dict[str, Any]:
    async with client.post(f"/sim/models/{model}", json=patch) as response:
        body = await response.json()
        assert response.status in (200, 201), body
        return body


async def stamp_of(client: aiohttp.ClientSession, request_id: str) -> dict[str, Any]:
    async with client.get(f"/sim/requests/{request_id}") as response:
        assert response.status == 200
        return await response.json()


def since_scheduled_first_token_ms(stamp: dict[str, Any], key: str) -> float:
    """Milliseconds from when the first token was due to `key`; tokens are scheduled from that moment,
    so the figure is never short, only long when a busy machine delays a write."""
    due_ns = stamp["received_ns"] + round(stamp["configured_ttft_ms"] * 1_000_000)
    return (stamp[key] - due_ns) / 1e6


def chunk(rid: str, created: int, model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    return {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }


# --- chat completions ---------------------------------------------------------------------


async def test_it_streams_a_role_chunk_first(client: aiohttp.ClientSession) -> None:
    response, text = await post(client, "/v1/chat/completions", chat_body())
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    rid = response.headers["x-request-id"]
    first = openai_payloads(text)[0]
    assert first == chunk(rid, first["created"], "thinker", {"role": "assistant", "content": ""})
    assert abs(first["created"] - time.time()) < 5


async def test_it_streams_the_exact_chat_chunk_sequence(client: aiohttp.ClientSession) -> None:
    body = chat_body(max_tokens=10, stream_options={"include_usage": True})
    response, text = await post(client, "/v1/chat/completions", body)
    rid = response.headers["x-request-id"]
    payloads = openai_payloads(text)
    created = payloads[0]["created"]
    prompt_tokens = 4  # "Hell", "o", "ther", "e"
    assert payloads == [
        chunk(rid, created, "thinker", {"role": "assistant", "content": ""}),
        *[chunk(rid, created, "thinker", {"reasoning_content": piece}) for piece in REASONING],
        *[chunk(rid, created, "thinker", {"content": piece}) for piece in ANSWER[:2]],
        chunk(rid, created, "thinker", {}, finish="stop"),
        {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion.chunk",
            "created": created,
            "model": "thinker",
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + 5,
                "completion_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        },
        "[DONE]",
    ]
    assert text.endswith("data: [DONE]\n\n")


async def test_max_tokens_counts_reasoning_and_finishes_with_length(client: aiohttp.ClientSession) -> None:
    _, text = await post(client, "/v1/chat/completions", chat_body(max_tokens=4))
    deltas = [p["choices"][0]["delta"] for p in openai_payloads(text)[1:-1]]
    assert deltas == [{"reasoning_content": piece} for piece in REASONING] + [{"content": "Time"}, {}]
    assert openai_payloads(text)[-2]["choices"][0]["finish_reason"] == "length"


async def test_the_default_max_tokens_is_16(client: aiohttp.ClientSession) -> None:
    await configure(client, "plain", {"answer_tokens": 100})
    _, text = await post(client, "/v1/chat/completions", chat_body("plain"))
    contents = [p for p in openai_payloads(text)[1:-1] if p["choices"][0]["delta"]]
    assert len(contents) == 16


async def test_enable_thinking_false_removes_reasoning(client: aiohttp.ClientSession) -> None:
    body = chat_body(max_tokens=10, chat_template_kwargs={"enable_thinking": False})
    response, text = await post(client, "/v1/chat/completions", body)
    deltas = [p["choices"][0]["delta"] for p in openai_payloads(text)[1:-1]]
    assert deltas == [{"content": "Time"}, {"content": " to"}, {}]
    assert (await stamp_of(client, response.headers["x-request-id"]))["reasoning"] is False


async def test_newer_vllm_profiles_use_the_reasoning_field(client: aiohttp.ClientSession) -> None:
    await configure(client, "thinker", {"reasoning_field": "reasoning"})
    _, text = await post(client, "/v1/chat/completions", chat_body(max_tokens=1))
    assert openai_payloads(text)[1]["choices"][0]["delta"] == {"reasoning": "Okay"}


async def test_no_stream_options_means_no_usage_chunk(client: aiohttp.ClientSession) -> None:
    _, text = await post(client, "/v1/chat/completions", chat_body())
    payloads = openai_payloads(text)
    assert payloads[-1] == "[DONE]"
    assert all("usage" not in p for p in payloads[:-1])
    assert payloads[-2]["choices"][0]["finish_reason"] == "stop"


async def test_it_echoes_the_clients_request_id(client: aiohttp.ClientSession) -> None:
    response, text = await post(client, "/v1/chat/completions", chat_body(), headers={"x-request-id": "abc-1"})
    assert response.headers["x-request-id"] == "abc-1"
    assert openai_payloads(text)[0]["id"] == "chatcmpl-abc-1"


async def test_a_non_streamed_chat_returns_the_whole_answer(client: aiohttp.ClientSession) -> None:
    body = chat_body(max_tokens=10, stream=False)
    async with client.post("/v1/chat/completions", json=body) as response:
        reply = await response.json()
    rid = response.headers["x-request-id"]
    assert reply == {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion",
        "created": reply["created"],
        "model": "thinker",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Time to",
                    "reasoning_content": "Okay, the",
                    "tool_calls": [],
                },
                "logprobs": None,
                "finish_reason": "stop",
                "stop_reason": None,
            }
        ],
        "usage": {
            "prompt_tokens": 4,
            "total_tokens": 9,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
        "prompt_logprobs": None,
    }


# --- legacy completions ------------------------------------------------------------------


async def test_it_streams_legacy_completions(client: aiohttp.ClientSession) -> None:
    body = {"model": "thinker", "prompt": "Hello there", "stream": True, "max_tokens": 3}
    body["stream_options"] = {"include_usage": True}
    response, text = await post(client, "/v1/completions", body)
    rid = response.headers["x-request-id"]
    payloads = openai_payloads(text)
    created = payloads[0]["created"]

    def text_chunk(piece: str, finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        header = {"id": f"cmpl-{rid}", "object": "text_completion", "created": created, "model": "thinker"}
        return {**header, "choices": [choice]}

    # A raw prompt has no chat template, hence no thinking phase and no role chunk.
    assert payloads == [
        text_chunk("Time"),
        text_chunk(" to"),
        text_chunk("", finish="stop"),
        {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": created,
            "model": "thinker",
            "choices": [],
            "usage": {
                "prompt_tokens": 4,
                "total_tokens": 6,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        },
        "[DONE]",
    ]


async def test_a_non_streamed_completion_returns_the_text(client: aiohttp.ClientSession) -> None:
    body = {"model": "plain", "prompt": "Hi", "max_tokens": 2}
    async with client.post("/v1/completions", json=body) as response:
        reply = await response.json()
    assert reply["object"] == "text_completion"
    assert reply["choices"][0]["text"] == "Time to"
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 2


# --- Anthropic messages ------------------------------------------------------------------


async def test_it_streams_anthropic_messages_with_thinking(client: aiohttp.ClientSession) -> None:
    body = messages_body(max_tokens=10, thinking={"type": "enabled", "budget_tokens": 1024})
    response, text = await post(client, "/v1/messages", body, headers={"anthropic-version": "2023-06-01"})
    assert response.status == 200
    request_id = response.headers["request-id"]
    assert request_id.startswith("req_")
    events = sse_events(text)
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    data = [json.loads(payload) for _, payload in events]
    assert data[0] == {
        "type": "message_start",
        "message": {
            "id": "msg_" + request_id.removeprefix("req_"),
            "type": "message",
            "role": "assistant",
            "model": "claude",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 4,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 1,
            },
        },
    }
    assert data[1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "thinking", "thinking": "", "signature": ""},
    }
    assert data[2] == {"type": "ping"}
    assert [d["delta"] for d in data[3:5]] == [
        {"type": "thinking_delta", "thinking": "Okay"},
        {"type": "thinking_delta", "thinking": ","},
    ]
    assert data[5]["delta"]["type"] == "signature_delta"
    assert data[6] == {"type": "content_block_stop", "index": 0}
    assert data[7] == {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}
    assert [d["delta"] for d in data[8:11]] == [
        {"type": "text_delta", "text": piece} for piece in ["Time", " to", " firs"]
    ]
    assert all(d["index"] == 1 for d in data[8:11])
    assert data[11] == {"type": "content_block_stop", "index": 1}
    assert data[12] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 5},
    }
    assert data[13] == {"type": "message_stop"}


async def test_anthropic_models_think_only_when_asked(client: aiohttp.ClientSession) -> None:
    _, text = await post(client, "/v1/messages", messages_body(max_tokens=2))
    data = [json.loads(payload) for _, payload in sse_events(text)]
    assert data[1]["content_block"] == {"type": "text", "text": ""}
    deltas = [d["delta"] for d in data if d["type"] == "content_block_delta"]
    assert deltas == [{"type": "text_delta", "text": "Time"}, {"type": "text_delta", "text": " to"}]
    assert data[-2]["delta"]["stop_reason"] == "max_tokens"


async def test_a_non_streamed_message_returns_the_whole_answer(client: aiohttp.ClientSession) -> None:
    body = messages_body(max_tokens=10, stream=False, thinking={"type": "enabled", "budget_tokens": 1024})
    async with client.post("/v1/messages", json=body) as response:
        reply = await response.json()
    assert reply["type"] == "message"
    assert [block["type"] for block in reply["content"]] == ["thinking", "text"]
    assert reply["content"][1]["text"] == "Time to firs"
    assert reply["stop_reason"] == "end_turn"
    assert reply["usage"]["output_tokens"] == 5


# --- errors -------------------------------------------------------------------------------


async def test_an_unknown_model_is_a_404_in_each_apis_shape(client: aiohttp.ClientSession) -> None:
    response, text = await post(client, "/v1/chat/completions", chat_body("nope"))
    assert response.status == 404
    assert json.loads(text) == {
        "error": {"message": "The model `nope` does not exist.", "type": "NotFoundError", "param": None, "code": 404}
    }
    response, text = await post(client, "/v1/messages", messages_body("nope"))
    assert response.status == 404
    error = json.loads(text)
    assert error["type"] == "error"
    assert error["error"] == {"type": "not_found_error", "message": "model: nope"}


async def test_it_requires_the_api_key_when_one_is_set() -> None:
    running = await start(Simulator(fast_profiles(), noise=False, api_key="sekret"), port=0)
    try:
        async with aiohttp.ClientSession(base_url=running.url) as client:
            response, text = await post(client, "/v1/chat/completions", chat_body())
            assert response.status == 401
            assert json.loads(text)["error"]["code"] == "invalid_api_key"
            response, _ = await post(
                client, "/v1/chat/completions", chat_body(), headers={"Authorization": "Bearer wrong"}
            )
            assert response.status == 401
            response, _ = await post(
                client, "/v1/chat/completions", chat_body(), headers={"Authorization": "Bearer sekret"}
            )
            assert response.status == 200

            response, text = await post(client, "/v1/messages", messages_body(), headers={"x-api-key": "wrong"})
            assert response.status == 401
            assert json.loads(text)["error"] == {"type": "authentication_error", "message": "invalid x-api-key"}
            response, _ = await post(client, "/v1/messages", messages_body(), headers={"x-api-key": "sekret"})
            assert response.status == 200

            async with client.get("/v1/models") as models:
                assert models.status == 401
    finally:
        await running.close()


@pytest.mark.parametrize(
    ("path", "raw", "message"),
    [
        ("/v1/chat/completions", b"{not json", "Invalid JSON body"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}]}', "model: Field required"),
        ("/v1/chat/completions", b'{"model": "thinker"}', "messages: Field required"),
        ("/v1/completions", b'{"model": "thinker"}', "prompt: Field required"),
    ],
)
async def test_a_bad_body_is_a_400(client: aiohttp.ClientSession, path: str, raw: bytes, message: str) -> None:
    async with client.post(path, data=raw, headers={"content-type": "application/json"}) as response:
        body = await response.json()
    assert response.status == 400
    assert body["error"]["type"] == "BadRequestError"
    assert body["error"]["message"].startswith(message)


async def test_anthropic_requires_max_tokens(client: aiohttp.ClientSession) -> None:
    body = messages_body()
    del body["max_tokens"]
    response, text = await post(client, "/v1/messages", body)
    assert response.status == 400
    assert json.loads(text)["error"] == {"type": "invalid_request_error", "message": "max_tokens: Field required"}


async def test_stream_options_without_streaming_is_a_400(client: aiohttp.ClientSession) -> None:
    body = chat_body(stream=False, stream_options={"include_usage": True})
    response, text = await post(client, "/v1/chat/completions", body)
    assert response.status == 400
    assert "Stream options can only be defined when `stream=True`." in text


async def test_a_profile_can_reject_stream_options(client: aiohttp.ClientSession) -> None:
    await configure(client, "plain", {"reject_stream_options": True})
    response, text = await post(
        client, "/v1/chat/completions", chat_body("plain", stream_options={"include_usage": True})
    )
    assert response.status == 400
    assert "stream_options" in json.loads(text)["error"]["message"]
    response, _ = await post(client, "/v1/chat/completions", chat_body("plain"))
    assert response.status == 200


@pytest.mark.parametrize(
    ("status", "openai_type", "anthropic_type"),
    [
        (401, "invalid_request_error", "authentication_error"),
        (404, "NotFoundError", "not_found_error"),
        (429, "requests", "rate_limit_error"),
        (500, "server_error", "api_error"),
        (503, "server_error", "overloaded_error"),
    ],
)
async def test_the_error_rate_fault_answers_the_configured_status(
    client: aiohttp.ClientSession, status: int, openai_type: str, anthropic_type: str
) -> None:
    await configure(client, "plain", {"faults": {"error_rate": 1.0, "error_status": status}})
    await configure(client, "claude", {"faults": {"error_rate": 1.0, "error_status": status}})
    response, text = await post(client, "/v1/chat/completions", chat_body("plain"))
    assert response.status == status
    assert json.loads(text)["error"]["type"] == openai_type
    if status == 429:
        assert response.headers["Retry-After"] == "1"
    response, text = await post(client, "/v1/messages", messages_body())
    assert response.status == status
    assert json.loads(text)["error"]["type"] == anthropic_type


async def test_a_partial_error_rate_fails_some_requests(client: aiohttp.ClientSession) -> None:
    await configure(client, "plain", {"faults": {"error_rate": 0.5}})
    statuses = []
    for _ in range(20):
        response, _ = await post(client, "/v1/chat/completions", chat_body("plain", stream=False, max_tokens=1))
        statuses.append(response.status)
    assert set(statuses) == {200, 500}


# --- faults in the stream ------------------------------------------------------------------


async def test_the_hang_fault_sends_the_role_chunk_then_nothing(client: aiohttp.ClientSession, sim: Simulator) -> None:
    await configure(client, "plain", {"faults": {"hang_before_first_token": True}})
    received = b""
    with pytest.raises(aiohttp.ServerTimeoutError):
        async with client.post(
            "/v1/chat/completions", json=chat_body("plain"), timeout=aiohttp.ClientTimeout(sock_read=0.3)
        ) as response:
            async for data in response.content.iter_any():
                received += data
    payloads = openai_payloads(received.decode())
    assert [p["choices"][0]["delta"] for p in payloads] == [{"role": "assistant", "content": ""}]
    stamp = sim.stamps.get(response.headers["x-request-id"])
    assert stamp is not None and stamp.outcome == "hang"
    # Once the client gives up, the handler notices and finishes.
    for _ in range(100):
        if stamp.completed_ns is not None:
            break
        await asyncio.sleep(0.01)
    assert stamp.completed_ns is not None


async def test_the_cut_fault_aborts_the_connection_mid_stream(client: aiohttp.ClientSession) -> None:
    await configure(client, "plain", {"faults": {"cut_after_tokens": 2}})
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with client.post("/v1/chat/completions", json=chat_body("plain")) as response:
            async for data in response.content.iter_any():
                received += data
    payloads = openai_payloads(received.decode())
    assert [p["choices"][0]["delta"] for p in payloads] == [
        {"role": "assistant", "content": ""},
        {"content": "Time"},
        {"content": " to"},
    ]
    assert (await stamp_of(client, response.headers["x-request-id"]))["outcome"] == "cut"


async def test_the_malformed_fault_emits_a_line_of_invalid_json(client: aiohttp.ClientSession) -> None:
    await configure(client, "plain", {"faults": {"malformed_after_tokens": 1}})
    _, text = await post(client, "/v1/chat/completions", chat_body("plain"))
    data = [payload for _, payload in sse_events(text) if payload != "[DONE]"]
    invalid = []
    for index, payload in enumerate(data):
        try:
            json.loads(payload)
        except json.JSONDecodeError:
            invalid.append(index)
    assert invalid == [2]  # after the role chunk and one token
    assert json.loads(data[3])["choices"][0]["delta"] == {"content": " to"}


async def test_the_error_event_fault_ends_an_openai_stream(client: aiohttp.ClientSession) -> None:
    await configure(client, "plain", {"faults": {"error_event_after_tokens": 1}})
    response, text = await post(client, "/v1/chat/completions", chat_body("plain"))
    payloads = openai_payloads(text)
    assert response.status == 200
    assert len(payloads) == 3
    assert payloads[1]["choices"][0]["delta"] == {"content": "Time"}
    assert payloads[2] == {
        "error": {
            "message": "The server had an error while processing your request.",
            "type": "server_error",
            "code": 500,
        }
    }


async def test_the_error_event_fault_ends_an_anthropic_stream(client: aiohttp.ClientSession) -> None:
    await configure(client, "claude", {"faults": {"error_event_after_tokens": 0}})
    _, text = await post(client, "/v1/messages", messages_body())
    events = sse_events(text)
    assert [name for name, _ in events] == ["message_start", "content_block_start", "ping", "error"]
    assert json.loads(events[-1][1]) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }


async def test_the_malformed_and_cut_faults_apply_to_anthropic_streams(client: aiohttp.ClientSession) -> None:
    await configure(client, "claude", {"faults": {"malformed_after_tokens": 2}})
    _, text = await post(client, "/v1/messages", messages_body())
    events = sse_events(text)
    assert events[5][0] == "content_block_delta"
    with pytest.raises(json.JSONDecodeError):
        json.loads(events[5][1])
    assert events[-1] == ("message_stop", '{"type":"message_stop"}')

    await configure(client, "claude", {"faults": {"malformed_after_tokens": None, "cut_after_tokens": 1}})
    with pytest.raises(aiohttp.ClientPayloadError):
        await post(client, "/v1/messages", messages_body())


async def test_faults_apply_to_non_streamed_requests(client: aiohttp.ClientSession) -> None:
    body = chat_body("plain", stream=False)
    await configure(client, "plain", {"faults": {"error_event_after_tokens": 2}})
    response, text = await post(client, "/v1/chat/completions", body)
    assert response.status == 500
    assert (await stamp_of(client, response.headers["x-request-id"]))["outcome"] == "error_event"

    await configure(client, "plain", {"faults": {"error_event_after_tokens": None, "malformed_after_tokens": 0}})
    response, text = await post(client, "/v1/chat/completions", body)
    assert response.status == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)

    await configure(client, "plain", {"faults": {"malformed_after_tokens": None, "cut_after_tokens": 1}})
    with pytest.raises(aiohttp.ClientError):
        await post(client, "/v1/chat/completions", body)


@pytest.mark.solo  # a time bound: it runs while no other test runs
async def test_the_drip_fault_spaces_tokens_by_the_gap(client: aiohttp.ClientSession) -> None:
    await configure(client, "plain", {"faults": {"drip_gap_ms": 30}})
    arrivals = []
    async with client.post("/v1/chat/completions", json=chat_body("plain")) as response:
        async for line in response.content:
            if b'"content":"' in line and b'"role"' not in line:
                arrivals.append(time.perf_counter_ns())
    gaps_ms = [(b - a) / 1e6 for a, b in itertools.pairwise(arrivals)]
    assert len(gaps_ms) == 3
    # Loose on the client: one late arrival (a busy machine) shortens the gap after it.
    assert all(15 < gap < 80 for gap in gaps_ms), gaps_ms
    assert 80 < sum(gaps_ms) < 130, gaps_ms
    stamp = await stamp_of(client, response.headers["x-request-id"])
    assert 90 <= since_scheduled_first_token_ms(stamp, "last_token_write_ns") < 110


@pytest.mark.solo  # a time bound: it runs while no other test runs
async def test_tokens_follow_the_decode_rate(client: aiohttp.ClientSession) -> None:
    await configure(client, "plain", {"decode_tps": 100, "answer_tokens": 11})
    response, _ = await post(client, "/v1/chat/completions", chat_body("plain", max_tokens=11))
    stamp = await stamp_of(client, response.headers["x-request-id"])
    assert 100 <= since_scheduled_first_token_ms(stamp, "last_token_write_ns") < 120


async def test_comment_pings_keep_the_stream_alive_while_prefilling(client: aiohttp.ClientSession) -> None:
    await configure(client, "plain", {"comment_pings": True, "ttft_base_ms": 320})
    _, text = await post(client, "/v1/chat/completions", chat_body("plain", max_tokens=1))
    events = sse_events(text)
    assert events[0] == ("comment", "ping")
    first_token = next(i for i, (_, data) in enumerate(events) if '"content":"Time"' in data)
    assert [name for name, _ in events[:first_token]].count("comment") == 4  # at 0, 100, 200 and 300 ms
    assert "comment" not in [name for name, _ in events[first_token:]]


# --- prefix cache ----------------------------------------------------------------------


async def test_the_same_prompt_hits_the_prefix_cache_and_a_nonce_misses(client: aiohttp.ClientSession) -> None:
    prompt = "word " * 100  # 100 tokens: six full blocks of 16
    options = {"stream_options": {"include_usage": True}}

    async def cached_tokens(content: str) -> int:
        _, text = await post(client, "/v1/chat/completions", chat_body("plain", content, **options))
        return openai_payloads(text)[-2]["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert await cached_tokens(prompt) == 0
    assert await cached_tokens(prompt) == 96
    assert await cached_tokens(f"{uuid.uuid4().hex} {prompt}") == 0
    assert await cached_tokens(prompt + "more words here") == 96


async def test_cached_tokens_shorten_the_ttft(client: aiohttp.ClientSession) -> None:
    await configure(client, "plain", {"prefill_ms_per_1k": 1000, "cached_prefill_factor": 0.1})
    ttfts = []
    for _ in range(2):
        response, _ = await post(client, "/v1/chat/completions", chat_body("plain", "word " * 100, max_tokens=1))
        ttfts.append((await stamp_of(client, response.headers["x-request-id"]))["configured_ttft_ms"])
    assert ttfts[0] == pytest.approx(10 + 100)
    assert ttfts[1] == pytest.approx(10 + 4 + 0.1 * 96)


async def test_anthropic_reports_cache_reads(client: aiohttp.ClientSession) -> None:
    marked = [{"type": "text", "text": "word " * 40, "cache_control": {"type": "ephemeral"}}]
    for expected_read in (0, 32):
        _, text = await post(client, "/v1/messages", messages_body(content=marked, system="Be brief."))
        usage = json.loads(sse_events(text)[0][1])["message"]["usage"]
        assert usage["cache_read_input_tokens"] == expected_read
        assert usage["input_tokens"] == 44 - expected_read  # "Be", "brie", "f", "." and 40 words


async def test_anthropic_caches_only_a_prompt_marked_cache_control(client: aiohttp.ClientSession) -> None:
    # As on the real API: without a cache_control breakpoint nothing is read from or kept in the cache.
    for _ in range(2):
        _, text = await post(client, "/v1/messages", messages_body(content="other " * 40, system="Be brief."))
        assert json.loads(sse_events(text)[0][1])["message"]["usage"]["cache_read_input_tokens"] == 0


# --- control endpoint ------------------------------------------------------------------


async def test_the_control_endpoint_changes_latency_at_run_time(client: aiohttp.ClientSession) -> None:
    async def client_ttft_ms() -> float:
        sent = time.perf_counter_ns()
        async with client.post("/v1/chat/completions", json=chat_body("plain", max_tokens=1)) as response:
            async for line in response.content:
                if b'"content":"' in line and b'"role"' not in line:
                    return (time.perf_counter_ns() - sent) / 1e6
        raise AssertionError("no content token")

    assert await client_ttft_ms() < 140
    profile = await configure(client, "plain", {"ttft_base_ms": 150})
    assert profile["ttft_base_ms"] == 150
    assert profile["decode_tps"] == 2000  # untouched
    assert 150 <= await client_ttft_ms() < 400  # the upper bound only guards against a hang


async def test_the_control_endpoint_lists_profiles(client: aiohttp.ClientSession) -> None:
    async with client.get("/sim/models") as response:
        listing = await response.json()
    assert sorted(listing["models"]) == ["claude", "plain", "thinker"]
    assert listing["models"]["thinker"]["reasoning_tokens"] == 3
    assert listing["models"]["thinker"]["faults"]["error_rate"] == 0.0
    assert listing["noise"] is False


async def test_the_control_endpoint_rejects_unknown_fields(client: aiohttp.ClientSession) -> None:
    async with client.post("/sim/models/plain", json={"faults": {"explode": True}}) as response:
        body = await response.json()
    assert response.status == 400
    assert body["error"].startswith("model 'plain': faults.explode: unknown field (known: cut_after_tokens,")
    async with client.post("/sim/models/plain", data=b"nope") as response:
        assert response.status == 400


async def test_the_control_endpoint_creates_a_model(client: aiohttp.ClientSession) -> None:
    async with client.post("/sim/models/brand-new", json={"ttft_base_ms": 15}) as response:
        profile = await response.json()
    assert response.status == 201
    assert profile["name"] == "brand-new"
    assert profile["noise_sigma"] == 0.0  # the simulator runs without noise
    response, _ = await post(client, "/v1/chat/completions", chat_body("brand-new", max_tokens=1))
    assert response.status == 200


async def test_reset_restores_profiles_and_clears_caches_and_stamps(client: aiohttp.ClientSession) -> None:
    body = chat_body("plain", "word " * 40, stream_options={"include_usage": True})
    response, _ = await post(client, "/v1/chat/completions", body)
    await configure(client, "plain", {"ttft_base_ms": 99, "faults": {"cut_after_tokens": 1}})
    await configure(client, "extra", {})
    async with client.post("/sim/reset") as reset:
        listing = await reset.json()
    assert sorted(listing["models"]) == ["claude", "plain", "thinker"]
    assert listing["models"]["plain"]["ttft_base_ms"] == 10
    assert listing["models"]["plain"]["faults"]["cut_after_tokens"] is None
    async with client.get(f"/sim/requests/{response.headers['x-request-id']}") as lookup:
        assert lookup.status == 404
    _, text = await post(client, "/v1/chat/completions", body)
    assert openai_payloads(text)[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


# --- stamps and timing -------------------------------------------------------------------


async def test_the_stamps_endpoint_reports_each_requests_timeline(client: aiohttp.ClientSession) -> None:
    response, text = await post(client, "/v1/chat/completions", chat_body(max_tokens=10))
    rid = response.headers["x-request-id"]
    stamp = await stamp_of(client, rid)
    assert stamp == await stamp_of(client, openai_payloads(text)[0]["id"])  # chatcmpl-<id> works too
    assert stamp["request_id"] == rid
    assert stamp["api"] == "chat"
    assert stamp["model"] == "thinker"
    assert stamp["stream"] is True
    assert stamp["status"] == 200
    assert stamp["outcome"] == "ok"
    assert stamp["configured_ttft_ms"] == 10.0
    assert stamp["prompt_tokens"] == 4
    assert stamp["cached_tokens"] == 0
    assert stamp["reasoning"] is True
    assert stamp["completion_tokens"] == 5
    assert (
        stamp["received_ns"]
        < stamp["first_event_write_ns"]
        < stamp["first_token_write_ns"]
        < stamp["first_answer_write_ns"]
        <= stamp["last_token_write_ns"]
        <= stamp["completed_ns"]
    )
    assert 10 <= (stamp["first_token_write_ns"] - stamp["received_ns"]) / 1e6 < 100  # precision: below
    async with client.get("/sim/requests/never-seen") as missing:
        assert missing.status == 404
        assert "never-seen" in (await missing.json())["error"]


async def test_anthropic_stamps_are_found_by_request_id_header(client: aiohttp.ClientSession) -> None:
    response, _ = await post(client, "/v1/messages", messages_body())
    stamp = await stamp_of(client, response.headers["request-id"])
    assert stamp["api"] == "messages"
    assert stamp["first_event_write_ns"] < stamp["first_token_write_ns"] == stamp["first_answer_write_ns"]


async def test_errors_are_stamped_too(client: aiohttp.ClientSession) -> None:
    response, _ = await post(client, "/v1/chat/completions", chat_body("nope"))
    stamp = await stamp_of(client, response.headers["x-request-id"])
    assert (stamp["status"], stamp["outcome"], stamp["first_token_write_ns"]) == (404, "error", None)


@pytest.mark.solo  # a time bound: it runs while no other test runs
async def test_without_noise_the_first_token_arrives_on_time(client: aiohttp.ClientSession) -> None:
    await configure(client, "plain", {"ttft_base_ms": 40})
    await post(client, "/v1/chat/completions", chat_body("plain", max_tokens=1))  # warm the connection
    samples: list[tuple[float, float, float]] = []
    on_time: list[tuple[float, float, float]] = []
    # Up to 40 tries for 5 on-time samples: the suite may share a busy machine, where any one
    # request can be descheduled at the wrong moment; on an idle machine the first 5 do.
    for i in range(40):
        if len(on_time) == 5:
            break
        sent = time.perf_counter_ns()
        arrived = None
        async with client.post("/v1/chat/completions", json=chat_body("plain", f"{i} hi", max_tokens=1)) as response:
            async for data in response.content.iter_any():
                if arrived is None and b'"content":"Time"' in data:
                    arrived = time.perf_counter_ns()
        assert arrived is not None
        stamp = await stamp_of(client, response.headers["x-request-id"])
        configured = stamp["configured_ttft_ms"]
        assert configured == 40.0
        write_error = (stamp["first_token_write_ns"] - stamp["received_ns"]) / 1e6 - configured
        # Seen by the client, against the server's receipt: the wait plus one loopback hop.
        arrival_error = (arrived - stamp["received_ns"]) / 1e6 - configured
        # From the client's own send time, aiohttp's request overhead (~1 ms here) adds to it.
        client_ttft = (arrived - sent) / 1e6
        sample = (round(write_error, 3), round(arrival_error, 3), round(client_ttft, 3))
        samples.append(sample)
        if write_error < 0.2 and arrival_error < 1.0 and client_ttft < 45:
            on_time.append(sample)
    assert all(write >= 0 and ttft >= 40 for write, _, ttft in samples), samples  # never early
    assert len(on_time) == 5, samples


def test_noise_is_lognormal_and_reproducible_with_a_seed() -> None:
    profile = ModelProfile(name="m", ttft_base_ms=100, prefill_ms_per_1k=0, noise_sigma=0.2, decode_tps=10)
    draws = [Simulator(seed=42).noise_factor(profile) for _ in range(2)]
    assert draws[0] == draws[1]
    many = Simulator(seed=1)
    factors = [many.noise_factor(profile) for _ in range(2000)]
    assert len(set(factors)) == 2000
    assert statistics.median(factors) == pytest.approx(1.0, abs=0.03)
    assert all(profile.noise_sigma == 0 for profile in Simulator(noise=False).profiles.values())


# --- robustness --------------------------------------------------------------------------


async def test_a_client_leaving_mid_stream_causes_no_traceback(
    client: aiohttp.ClientSession, sim: Simulator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await configure(client, "plain", {"decode_tps": 20, "answer_tokens": 40})
    ids = []
    # Leave once during prefill and once during decode.
    for wait_for_token in (False, True):
        async with client.post("/v1/chat/completions", json=chat_body("plain", max_tokens=40)) as response:
            ids.append(response.headers["x-request-id"])
            await response.content.readline()
            if wait_for_token:
                await response.content.readline()
                await response.content.readline()
            response.close()
    for _ in range(100):
        if all(sim.stamps.get(rid).completed_ns for rid in ids):  # type: ignore[union-attr]
            break
        await asyncio.sleep(0.01)
    assert [sim.stamps.get(rid).outcome for rid in ids] == ["client_gone", "client_gone"]  # type: ignore[union-attr]
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert problems == []


async def test_the_app_also_works_under_a_plain_aiohttp_runner() -> None:
    sim = Simulator(fast_profiles(), noise=False)
    runner = web.AppRunner(build_app(sim))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as client:
            response, text = await post(client, "/v1/chat/completions", chat_body(max_tokens=1))
            assert openai_payloads(text)[-1] == "[DONE]"
            stamp = await stamp_of(client, response.headers["x-request-id"])
            # Without our listener there is no arrival stamp; TTFT counts from the body's reading.
            assert 10 <= (stamp["first_token_write_ns"] - stamp["received_ns"]) / 1e6 < 100
    finally:
        await runner.cleanup()


async def test_closing_the_server_ends_open_streams_at_once() -> None:
    sim = Simulator(fast_profiles(), noise=False)
    running = await start(sim, port=0)
    async with aiohttp.ClientSession(base_url=running.url) as client:
        await configure(client, "plain", {"faults": {"hang_before_first_token": True}})
        async with client.post("/v1/chat/completions", json=chat_body("plain")) as response:
            await response.content.readline()
            started = time.perf_counter()
            await running.close()
            assert time.perf_counter() - started < 1.0
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()
    stamp = sim.stamps.get(response.headers["x-request-id"])
    assert stamp is not None and stamp.outcome == "hang" and stamp.completed_ns is not None


async def test_it_serves_hundreds_of_concurrent_streams(server: RunningSimulator) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(base_url=server.url, connector=connector) as client:

        async def one(i: int) -> str:
            _, text = await post(client, "/v1/chat/completions", chat_body("plain", f"request {i}"))
            return text

        texts = await asyncio.gather(*(one(i) for i in range(200)))
    assert all(text.endswith("data: [DONE]\n\n") for text in texts)
    assert all(len(openai_payloads(text)) == 7 for text in texts)


async def test_it_lists_models_in_each_apis_format(client: aiohttp.ClientSession) -> None:
    async with client.get("/v1/models") as response:
        listing = await response.json()
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == ["claude", "plain", "thinker"]
    assert all(m["object"] == "model" for m in listing["data"])
    async with client.get("/v1/models", headers={"anthropic-version": "2023-06-01"}) as response:
        listing = await response.json()
    assert [m["type"] for m in listing["data"]] == ["model"] * 3
    assert listing["has_more"] is False


def test_run_serves_until_sigterm() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", "from monitor.sim import run; run('127.0.0.1', 0, noise=False, seed=1)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, line
        with urllib.request.urlopen(f"{match.group(0)}/v1/models", timeout=5) as response:
            assert response.status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0
        assert process.stderr is not None
        assert process.stderr.read() == ""
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
