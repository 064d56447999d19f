"""`params.reasoning: least`: what each API's request carries, and what the config accepts."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from monitor.probe.api_base import LeastReasoning, is_openai_hosted
from monitor.probe.apis import FLAVORS, RequestParams
from monitor.probe.plan import least_reasoning
from monitor.probe.settings import Params
from monitor.sim.wire.openai import parse_chat

SELF_HOSTED = LeastReasoning()
OPENAI = LeastReasoning(openai_hosted=True)


def body(api: str, least: LeastReasoning | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    params = RequestParams(
        model="m", max_tokens=16, temperature=0.0, extra_body=extra or {}, include_usage=True, least_reasoning=least
    )
    return FLAVORS[api].build_body("hello", params)


REASONING_KEYS = ("reasoning_effort", "chat_template_kwargs", "reasoning", "thinking")


@pytest.mark.parametrize("api", list(FLAVORS))
def test_default_sends_no_reasoning_switch(api: str) -> None:
    sent = body(api, None)
    assert not set(REASONING_KEYS) & set(sent)
    assert "thinkingConfig" not in sent.get("generationConfig", {})


@pytest.mark.parametrize(
    ("api", "least", "expected"),
    [
        ("openai-chat", OPENAI, {"reasoning_effort": "minimal"}),
        ("openai-chat", LeastReasoning(effort="none", openai_hosted=True), {"reasoning_effort": "none"}),
        ("openai-chat", SELF_HOSTED, {"chat_template_kwargs": {"enable_thinking": False}}),
        (
            "openai-chat",
            LeastReasoning(effort="low"),
            {"chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "low"},
        ),
        ("openai-responses", SELF_HOSTED, {"reasoning": {"effort": "minimal"}}),
        ("openai-responses", LeastReasoning(effort="low", openai_hosted=True), {"reasoning": {"effort": "low"}}),
        ("anthropic-messages", SELF_HOSTED, {"thinking": {"type": "disabled"}}),
        ("anthropic-messages", LeastReasoning(effort="low"), {"thinking": {"type": "disabled"}}),
    ],
)
def test_least_sends_the_apis_own_switch(api: str, least: LeastReasoning, expected: dict[str, Any]) -> None:
    sent = body(api, least)
    assert {key: sent[key] for key in REASONING_KEYS if key in sent} == expected
    # Nothing else changes: the measured request is the same but for the switch.
    plain = body(api, None)
    assert {k: v for k, v in sent.items() if k not in expected} == plain


def test_gemini_least_is_a_budget_of_zero_or_the_named_level_and_keeps_its_limits() -> None:
    assert body("gemini", SELF_HOSTED)["generationConfig"] == {
        "maxOutputTokens": 16,
        "temperature": 0.0,
        "thinkingConfig": {"thinkingBudget": 0},
    }
    assert body("gemini", LeastReasoning(effort="low"))["generationConfig"]["thinkingConfig"] == {
        "thinkingLevel": "low"
    }


def test_completions_has_no_thinking_phase_to_switch_off() -> None:
    assert body("openai-completions", OPENAI) == body("openai-completions", None)


def test_extra_body_wins_over_what_least_sends() -> None:
    own = {"chat_template_kwargs": {"enable_thinking": True, "custom": 1}}
    assert body("openai-chat", SELF_HOSTED, own)["chat_template_kwargs"] == own["chat_template_kwargs"]
    assert body("openai-chat", OPENAI, {"reasoning_effort": "low"})["reasoning_effort"] == "low"
    assert body("anthropic-messages", SELF_HOSTED, {"thinking": {"type": "enabled", "budget_tokens": 1024}})[
        "thinking"
    ] == {"type": "enabled", "budget_tokens": 1024}


@pytest.mark.parametrize(
    ("url", "hosted"),
    [
        ("https://api.openai.com/v1", True),
        ("https://API.OpenAI.com/v1/", True),
        ("https://my-deploy.openai.azure.com/openai/v1", True),
        ("https://x.cognitiveservices.azure.com/openai", True),
        ("http://127.0.0.1:8000/v1", False),
        ("https://api.openai.com.evil.example/v1", False),
        ("https://openrouter.ai/api/v1", False),
        ("https://notapi.openai.com.example", False),
    ],
)
def test_openai_hosting_is_read_from_the_host_alone(url: str, hosted: bool) -> None:
    assert is_openai_hosted(url) is hosted


def test_the_plan_makes_least_only_when_asked() -> None:
    assert least_reasoning("default", None, base_url="https://api.openai.com/v1") is None
    assert least_reasoning("least", None, base_url="https://api.openai.com/v1") == OPENAI
    assert least_reasoning("least", "low", base_url="http://vllm:8000/v1") == LeastReasoning(effort="low")


def test_an_effort_without_least_is_refused_with_the_fix() -> None:
    with pytest.raises(ValidationError, match=r"reasoning_effort \(low\) applies only with `reasoning: least`"):
        Params(reasoning_effort="low")


@pytest.mark.parametrize("bad", ["", "Low", "low effort", "x" * 40, "1"])
def test_an_effort_that_is_not_one_word_is_refused(bad: str) -> None:
    with pytest.raises(ValidationError):
        Params(reasoning="least", reasoning_effort=bad)


def test_an_unknown_reasoning_mode_is_refused() -> None:
    with pytest.raises(ValidationError, match="'default' or 'least'"):
        Params(reasoning="off")  # type: ignore[arg-type]


@pytest.mark.parametrize(("effort", "thinking"), [("minimal", False), ("none", False), ("low", True)])
def test_the_simulator_reads_openais_effort_like_openai(effort: str, thinking: bool) -> None:
    request = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": effort})
    assert request.thinking is thinking


def test_a_warm_anthropic_prompt_is_one_text_block_marked_for_the_cache() -> None:
    params = RequestParams(
        model="m", max_tokens=16, temperature=0.0, extra_body={}, include_usage=True, cache_breakpoint=True
    )
    warm = FLAVORS["anthropic-messages"].build_body("hello", params)
    assert warm["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}]}
    ]
    assert body("anthropic-messages", None)["messages"] == [{"role": "user", "content": "hello"}]
    # The APIs that cache every prefix on their own get the same request either way.
    for api in ("openai-chat", "openai-responses", "gemini"):
        assert FLAVORS[api].build_body("hello", params) == body(api, None)
