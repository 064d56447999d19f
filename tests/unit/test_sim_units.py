"""The simulator's pure parts: tokenizer, prefix hashing, latency model, output plan, profiles, parsing."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.sim.arrival import ArrivalStamps
from monitor.sim.cache import BLOCK_TOKENS, PrefixCache, block_hashes
from monitor.sim.latency import token_gap_ns, ttft_ms
from monitor.sim.parse import BadRequest, load_json
from monitor.sim.plan import plan_output
from monitor.sim.profiles import (
    Faults,
    ModelProfile,
    ProfileError,
    apply_patch,
    default_profiles,
    new_profile,
)
from monitor.sim.tokens import count_tokens, pieces, tokenize
from monitor.sim.wire import Usage
from monitor.sim.wire.anthropic import MessagesWire, parse_messages
from monitor.sim.wire.openai import ChatWire, CompletionWire, parse_chat, parse_completions


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", []),
        ("   \n\t ", []),
        ("Hello", ["Hell", "o"]),
        ("Hello, world!", ["Hell", "o", ",", "worl", "d", "!"]),
        ("a b  c", ["a", "b", "c"]),
        ("internationalization", ["inte", "rnat", "iona", "liza", "tion"]),
        ("12345", ["123", "45"]),
        ("abc123def", ["abc", "123", "def"]),
        ("你好世界。", ["你好", "世界", "。"]),
        ("我们在测试", ["我们", "在测", "试"]),
        ("中文English混合", ["中文", "Engl", "ish", "混合"]),
        ("café", ["caf", "é"]),
        ("3.14", ["3", ".", "14"]),
        ("<|im_start|>", ["<", "|", "im", "_", "star", "t", "|", ">"]),
    ],
)
def test_it_tokenizes_like_the_table(text: str, tokens: list[str]) -> None:
    assert tokenize(text) == tokens
    assert count_tokens(text) == len(tokens)


def test_english_and_chinese_have_different_chars_per_token() -> None:
    english = "The quick brown fox jumps over the lazy dog " * 10
    chinese = "我们正在测量大型语言模型的首个令牌时间" * 10
    english_ratio = len(english.replace(" ", "")) / count_tokens(english)
    chinese_ratio = len(chinese) / count_tokens(chinese)
    assert english_ratio > 2.5
    assert chinese_ratio == pytest.approx(2.0)


@settings(deadline=None)  # timing is not under test; a busy machine must not fail it
@given(st.text())
def test_count_tokens_matches_tokenize(text: str) -> None:
    assert count_tokens(text) == len(tokenize(text))


@settings(deadline=None)
@given(st.text())
def test_pieces_rebuild_the_text_without_trailing_whitespace(text: str) -> None:
    assert "".join(pieces(text)) == text.rstrip()
    assert len(pieces(text)) == count_tokens(text)


def test_block_hashes_cover_only_full_blocks() -> None:
    tokens = [str(i) for i in range(BLOCK_TOKENS * 3 + 5)]
    assert len(block_hashes(tokens)) == 3
    assert block_hashes(tokens[: BLOCK_TOKENS - 1]) == []


def test_block_hashes_chain_so_an_early_change_changes_every_block() -> None:
    tokens = [str(i) for i in range(BLOCK_TOKENS * 4)]
    changed_first = ["nonce", *tokens[1:]]
    changed_last = [*tokens[:-1], "nonce"]
    original = block_hashes(tokens)
    assert all(a != b for a, b in zip(original, block_hashes(changed_first), strict=True))
    assert block_hashes(changed_last)[:3] == original[:3]
    assert block_hashes(changed_last)[3] != original[3]


def test_prefix_cache_counts_leading_blocks_only() -> None:
    cache = PrefixCache()
    hashes = block_hashes([str(i) for i in range(BLOCK_TOKENS * 3)])
    assert cache.cached_tokens(hashes) == 0
    cache.insert(hashes[:2])
    assert cache.cached_tokens(hashes) == 2 * BLOCK_TOKENS
    assert cache.cached_tokens([hashes[2], hashes[0]]) == 0  # a miss ends the prefix


def test_prefix_cache_evicts_the_least_recently_used_blocks() -> None:
    cache = PrefixCache(capacity_blocks=2)
    cache.insert([1, 2])
    assert cache.cached_tokens([1]) == BLOCK_TOKENS  # refreshes block 1
    cache.insert([3])
    assert len(cache) == 2
    assert cache.cached_tokens([2]) == 0
    assert cache.cached_tokens([1]) == BLOCK_TOKENS


def _profile(**changes: object) -> ModelProfile:
    base = ModelProfile(name="m", ttft_base_ms=100.0, prefill_ms_per_1k=50.0, noise_sigma=0.0, decode_tps=50.0)
    return apply_patch(base, changes)


@pytest.mark.parametrize(
    ("changes", "uncached", "cached", "noise", "expected"),
    [
        ({}, 0, 0, 1.0, 100.0),
        ({}, 2000, 0, 1.0, 200.0),
        ({}, 1000, 1000, 1.0, 150.0),
        ({"cached_prefill_factor": 0.1}, 1000, 1000, 1.0, 155.0),
        ({}, 2000, 0, 1.5, 300.0),
    ],
)
def test_ttft_follows_the_latency_model(
    changes: dict[str, object], uncached: int, cached: int, noise: float, expected: float
) -> None:
    profile = _profile(**changes)
    assert ttft_ms(profile, uncached_tokens=uncached, cached_tokens=cached, noise=noise) == pytest.approx(expected)


def test_token_gap_is_the_decode_rate_unless_dripping() -> None:
    assert token_gap_ns(_profile()) == 20_000_000
    assert token_gap_ns(_profile(faults={"drip_gap_ms": 250})) == 250_000_000


def test_default_profiles_match_the_public_shapes() -> None:
    profiles = default_profiles()
    assert set(profiles) == {"qwen3-8b", "qwen3-14b", "gpt-4o-mini", "claude-haiku-sim", "gemini-flash-sim"}
    at_2k = {name: ttft_ms(profile, uncached_tokens=2000, cached_tokens=0) for name, profile in profiles.items()}
    assert at_2k["qwen3-8b"] == pytest.approx(300.0)
    assert at_2k["qwen3-14b"] == pytest.approx(400.0)
    assert profiles["qwen3-8b"].reasoning_tokens == 40
    assert profiles["qwen3-8b"].thinks_by_default
    assert profiles["gpt-4o-mini"].reasoning_tokens == 0
    assert profiles["claude-haiku-sim"].reasoning_tokens == 30
    assert not profiles["claude-haiku-sim"].thinks_by_default
    assert all(profile.faults == Faults() for profile in profiles.values())


@pytest.mark.parametrize(
    ("reasoning", "answer", "max_tokens", "expected"),
    [
        (0, 5, 16, (0, 5, True)),
        (0, 5, 5, (0, 5, True)),
        (0, 5, 3, (0, 3, False)),
        (40, 48, 16, (16, 0, False)),
        (3, 2, 4, (3, 1, False)),
        (3, 2, 100, (3, 2, True)),
    ],
)
def test_output_plan_counts_reasoning_against_max_tokens(
    reasoning: int, answer: int, max_tokens: int, expected: tuple[int, int, bool]
) -> None:
    plan = plan_output(reasoning_tokens=reasoning, answer_tokens=answer, max_tokens=max_tokens)
    assert (len(plan.reasoning), len(plan.answer), plan.finished) == expected


def test_long_answers_repeat_the_canned_text_readably() -> None:
    plan = plan_output(reasoning_tokens=0, answer_tokens=200, max_tokens=200)
    text = "".join(plan.answer)
    assert count_tokens(text) == 200
    assert "decoding. Time" in text


def test_patch_changes_only_the_given_fields() -> None:
    original = _profile(faults={"cut_after_tokens": 3})
    updated = apply_patch(original, {"ttft_base_ms": 5, "faults": {"error_rate": 0.5}})
    assert updated.ttft_base_ms == 5.0
    assert updated.faults.error_rate == 0.5
    assert updated.faults.cut_after_tokens == 3
    assert original.ttft_base_ms == 100.0 and original.faults.error_rate == 0.0


def test_patch_with_null_faults_clears_them() -> None:
    assert apply_patch(_profile(faults={"cut_after_tokens": 3}), {"faults": None}).faults == Faults()


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"ttft_ms": 5}, "ttft_ms: unknown field"),
        ({"faults": {"hang": True}}, "faults.hang: unknown field"),
        ({"ttft_base_ms": "fast"}, "ttft_base_ms: expected a number"),
        ({"ttft_base_ms": True}, "ttft_base_ms: expected a number"),
        ({"ttft_base_ms": -1}, "ttft_base_ms: -1 is out of range"),
        ({"decode_tps": 0}, "decode_tps: 0 is out of range (expected > 0)"),
        ({"reasoning_tokens": 1.5}, "reasoning_tokens: expected an integer"),
        ({"reasoning_field": "thoughts"}, "reasoning_field: 'thoughts' is not one of"),
        ({"faults": {"error_rate": 2}}, "faults.error_rate: 2 is out of range"),
        ({"faults": {"error_status": 418}}, "faults.error_status: 418 is not one of 401, 404, 429, 500, 503"),
        (
            {"faults": {"hang_before_first_token": 1}},
            "faults.hang_before_first_token: expected true or false",
        ),
        ({"faults": []}, "faults: expected an object or null"),
        ({"name": "other"}, "name: 'other' does not match"),
        ([], "expected a JSON object"),
    ],
)
def test_patch_rejects_bad_input_naming_the_field(patch: object, message: str) -> None:
    with pytest.raises(ProfileError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        apply_patch(_profile(), patch)


def test_new_models_start_from_a_sensible_default() -> None:
    profile = new_profile("fresh")
    assert profile.name == "fresh"
    assert profile.ttft_base_ms > 0 and profile.decode_tps > 0
    assert profile.reasoning_tokens == 0


@pytest.mark.parametrize(
    ("parse", "body", "message"),
    [
        (parse_chat, {"messages": [{"role": "user", "content": "x"}]}, "model: Field required"),
        (parse_chat, {"model": "m"}, "messages: Field required"),
        (parse_chat, {"model": "m", "messages": []}, "messages: Field required"),
        (parse_chat, {"model": "m", "messages": ["hi"]}, "messages[0]: expected an object"),
        (parse_chat, {"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (parse_chat, {"model": "m", "messages": [{"role": "user"}], "max_tokens": 0}, "max_tokens: expected"),
        (
            parse_chat,
            {"model": "m", "messages": [{"role": "user"}], "stream_options": {"include_usage": True}},
            "Stream options can only be defined when `stream=True`.",
        ),
        (parse_completions, {"model": "m"}, "prompt: Field required"),
        (parse_messages, {"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens: Field"),
    ],
)
def test_bad_bodies_are_rejected_with_a_reason(
    parse: Callable[[dict[str, object]], object], body: dict[str, object], message: str
) -> None:
    with pytest.raises(BadRequest) as info:
        parse(body)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("raw", [b"", b"{", b"[1]", b"\xff"])
def test_invalid_json_is_a_bad_request(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        load_json(raw)


def test_chat_prompt_joins_string_and_text_part_contents() -> None:
    request = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi"}, {"type": "image_url", "image_url": {}}],
                },
            ],
            "chat_template_kwargs": {"enable_thinking": False},
        }
    )
    assert request.prompt == "Be brief.\nHi"
    assert request.thinking is False
    assert request.max_tokens == 16
    assert not request.stream


def test_messages_prompt_includes_the_system_prompt() -> None:
    request = parse_messages(
        {
            "model": "m",
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 5,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        }
    )
    assert request.prompt == "Be brief.\nHi"
    assert request.thinking is True


def _data(event: bytes) -> object:
    text = event.decode()
    assert text.endswith("\n\n")
    line = next(line for line in text.splitlines() if line.startswith("data: "))
    return json.loads(line.removeprefix("data: "))


def test_chat_wire_fills_templates_with_valid_json() -> None:
    wire = ChatWire(chunk_id="chatcmpl-1", created=7, model="m", reasoning_field="reasoning", include_usage=False)
    assert _data(wire.reasoning('say "hi"\n')) == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "choices": [{"index": 0, "delta": {"reasoning": 'say "hi"\n'}, "logprobs": None, "finish_reason": None}],
    }
    with pytest.raises(json.JSONDecodeError):
        _data(wire.malformed())


def test_completion_and_messages_wires_write_one_token_per_event() -> None:
    completion = CompletionWire(chunk_id="cmpl-1", created=7, model="m", include_usage=False)
    assert _data(completion.answer("你好"))["choices"][0]["text"] == "你好"  # type: ignore[index]
    usage = Usage(prompt_tokens=10, cached_tokens=0, completion_tokens=1)
    messages = MessagesWire(message_id="msg_1", model="m", thinking=False, usage=usage)
    assert _data(messages.answer(" x")) == {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": " x"},
    }


class _RecordingProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.events: list[object] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.events.append(data)

    def eof_received(self) -> bool | None:
        self.events.append("eof")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")


def test_arrival_stamps_note_the_last_data_and_pass_everything_through() -> None:
    now = iter([100, 250])
    stamps = ArrivalStamps(lambda: next(now))
    inner = _RecordingProtocol()
    protocol = stamps.wrap(lambda: inner)()
    assert stamps.last_data_ns(inner) is None
    protocol.connection_made(asyncio.Transport())
    protocol.data_received(b"POST / HTTP/1.1\r\n")
    assert stamps.last_data_ns(inner) == 100
    protocol.data_received(b"\r\n")
    assert stamps.last_data_ns(inner) == 250
    protocol.eof_received()
    protocol.connection_lost(None)
    assert stamps.last_data_ns(inner) is None
    assert stamps.last_data_ns(None) is None
    assert inner.events == ["made", b"POST / HTTP/1.1\r\n", b"\r\n", "eof", "lost"]


def test_ar_noise_is_shared_by_requests_close_in_time_and_forgotten_over_many_steps() -> None:
    import math as _math

    from monitor.sim.profiles import ModelProfile
    from monitor.sim.server import Simulator

    now = [0.0]
    profile = ModelProfile("ar", 200.0, 0.0, 0.3, 50.0, ar_share=1.0, ar_phi=0.9, ar_step_s=1.0)
    sim = Simulator({"ar": profile}, seed=5, wall_clock=lambda: now[0])

    def logs(step_s: float, count: int) -> list[float]:
        values = []
        for _ in range(count):
            now[0] += step_s
            values.append(_math.log(sim.noise_factor(sim.profiles["ar"])))
        return values

    def lag_one(values: list[float]) -> float:
        mean = sum(values) / len(values)
        centred = [v - mean for v in values]
        return sum(a * b for a, b in itertools.pairwise(centred)) / sum(c * c for c in centred)

    close = logs(1.0, 4000)  # one step apart: correlation phi
    assert abs(lag_one(close) - 0.9) < 0.05
    assert abs(_math.sqrt(sum(v * v for v in close) / len(close)) - 0.3) < 0.05
    apart = logs(50.0, 2000)  # fifty steps apart: 0.9^50, independent
    assert abs(lag_one(apart)) < 0.1
