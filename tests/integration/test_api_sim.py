"""Every API flavour end to end: the probe client against the simulator over real loopback HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from monitor.probe.api_base import LeastReasoning
from monitor.probe.apis import FLAVORS, RequestParams
from monitor.probe.client import Endpoint, ProbeClient, Timeouts
from monitor.probe.result import ErrorClass, Sample
from monitor.sim import ModelProfile, RunningSimulator, Simulator, start

# Its figures are times within milliseconds: it runs while no other test runs.
pytestmark = pytest.mark.solo

ALL_APIS = ["openai-chat", "openai-completions", "anthropic-messages", "openai-responses", "gemini"]
# The path prefix each API's base_url carries on the simulator, as on the real service.
VERSION = {"gemini": "/v1beta"}
TTFT_MS = 60.0


def profile(name: str, **extra: Any) -> ModelProfile:
    return ModelProfile(
        name=name, ttft_base_ms=TTFT_MS, prefill_ms_per_1k=0.0, noise_sigma=0.0, decode_tps=500.0, **extra
    )


@pytest.fixture
def sim() -> Simulator:
    profiles = {
        "plain": profile("plain", answer_tokens=6),
        "thinker": profile("thinker", reasoning_tokens=4, answer_tokens=3, thinks_by_default=True),
    }
    return Simulator(profiles, noise=False, seed=3, api_key="sim-key-0123456789")


@pytest.fixture
async def server(sim: Simulator) -> AsyncIterator[RunningSimulator]:
    running = await start(sim, port=0)
    yield running
    await running.close()


async def probe(
    server: RunningSimulator,
    api: str,
    model: str = "plain",
    *,
    max_tokens: int = 16,
    prompt: str = "Say hello to the monitor, briefly.",
    api_key: str = "sim-key-0123456789",
    force_tool_call: bool = False,
    least_reasoning: LeastReasoning | None = None,
    cache_breakpoint: bool = False,
) -> Sample:
    endpoint = Endpoint(
        server.url + VERSION.get(api, "/v1"),
        FLAVORS[api],
        api_key=api_key,
        timeouts=Timeouts(connect=2, first_token=5, total=10),
    )
    params = RequestParams(
        model=model,
        max_tokens=max_tokens,
        temperature=0.0,
        extra_body={},
        include_usage=True,
        force_tool_call=force_tool_call,
        least_reasoning=least_reasoning,
        cache_breakpoint=cache_breakpoint,
    )
    sample = Sample(target="t", model=model, api=api, prompt="p", round=1)
    async with ProbeClient() as client:
        return await client.probe(endpoint, params, prompt, sample)


@pytest.mark.parametrize("api", ALL_APIS)
async def test_each_api_streams_through_the_simulator_and_its_ttft_is_the_configured_one(
    server: RunningSimulator, api: str
) -> None:
    sample = await probe(server, api)
    assert sample.ok, sample.error_message
    assert sample.ttft_ms is not None and TTFT_MS <= sample.ttft_ms < TTFT_MS + 40
    assert sample.ttfa_ms == sample.ttft_ms
    assert sample.token_events == 6
    assert sample.completion_tokens == 6
    assert sample.prompt_tokens is not None and sample.prompt_tokens > 0
    assert sample.cached_tokens in (0, None)


@pytest.mark.parametrize("api", ["openai-chat", "anthropic-messages", "openai-responses", "gemini"])
async def test_reasoning_comes_first_in_every_api_that_has_it(server: RunningSimulator, api: str) -> None:
    sample = await probe(server, api, "thinker")
    assert sample.ok, sample.error_message
    assert sample.token_events == 7
    assert sample.ttft_ms is not None and sample.ttfa_ms is not None
    assert sample.ttfa_ms > sample.ttft_ms


@pytest.mark.parametrize(
    ("api", "least"),
    [
        ("openai-chat", LeastReasoning()),
        ("openai-chat", LeastReasoning(openai_hosted=True)),
        ("anthropic-messages", LeastReasoning()),
        ("openai-responses", LeastReasoning()),
        ("gemini", LeastReasoning()),
    ],
    ids=["chat-self-hosted", "chat-openai", "anthropic", "responses", "gemini"],
)
async def test_least_reasoning_leaves_the_thinker_only_its_answer(
    server: RunningSimulator, api: str, least: LeastReasoning
) -> None:
    sample = await probe(server, api, "thinker", least_reasoning=least)
    assert sample.ok, sample.error_message
    assert sample.token_events == 3
    assert sample.ttfa_ms == sample.ttft_ms
    assert not sample.reasoning_tokens


@pytest.mark.parametrize("api", ["openai-responses", "gemini"])
async def test_a_response_cut_by_max_tokens_is_still_a_success(server: RunningSimulator, api: str) -> None:
    sample = await probe(server, api, max_tokens=3)
    assert sample.ok, sample.error_message
    assert sample.token_events == 3 and sample.completion_tokens == 3


@pytest.mark.parametrize("api", ["openai-responses", "gemini"])
async def test_a_warm_prompt_reports_cached_tokens(server: RunningSimulator, api: str) -> None:
    prompt = "A long shared prefix for the cache. " * 40
    await probe(server, api, prompt=prompt)
    sample = await probe(server, api, prompt=prompt)
    assert sample.ok, sample.error_message
    assert sample.cached_tokens is not None and sample.cached_tokens > 0


@pytest.mark.parametrize("marked", [True, False], ids=["warm-marked", "unmarked"])
async def test_anthropic_caches_a_warm_prompt_only_through_its_breakpoint(
    server: RunningSimulator, marked: bool
) -> None:
    prompt = f"A long shared prefix for the cache, marked {marked}. " * 40
    await probe(server, "anthropic-messages", prompt=prompt, cache_breakpoint=marked)
    sample = await probe(server, "anthropic-messages", prompt=prompt, cache_breakpoint=marked)
    assert sample.ok, sample.error_message
    assert sample.prompt_tokens is not None and sample.cached_tokens is not None
    if marked:
        assert sample.cached_tokens > 0.9 * sample.prompt_tokens, sample
    else:
        assert sample.cached_tokens == 0, sample


async def configure(server: RunningSimulator, model: str, patch: dict[str, Any]) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server.url}/sim/models/{model}", json=patch) as response,
    ):
        assert response.status in (200, 201), await response.text()


@pytest.mark.parametrize("api", ["openai-responses", "gemini"])
@pytest.mark.parametrize(
    ("faults", "expected"),
    [
        ({"error_event_after_tokens": 2}, ErrorClass.STREAM_ERROR),
        ({"malformed_after_tokens": 2}, ErrorClass.MALFORMED_STREAM),
        ({"cut_after_tokens": 2}, ErrorClass.STREAM_ERROR),
        ({"error_rate": 1.0, "error_status": 503}, ErrorClass.SERVER_ERROR),
    ],
    ids=["error-event", "malformed", "cut", "http-503"],
)
async def test_faults_are_classified_in_the_new_apis(
    server: RunningSimulator, api: str, faults: dict[str, Any], expected: ErrorClass
) -> None:
    await configure(server, "plain", {"faults": faults})
    sample = await probe(server, api)
    assert sample.error is expected, sample.error_message
    if expected is not ErrorClass.SERVER_ERROR:
        assert sample.ttft_ms is not None


@pytest.mark.parametrize("api", ["openai-responses", "gemini"])
async def test_an_unknown_model_is_model_not_found(server: RunningSimulator, api: str) -> None:
    sample = await probe(server, api, "no-such-model")
    assert sample.error is ErrorClass.MODEL_NOT_FOUND, sample.error_message


async def test_gemini_without_alt_sse_answers_one_json_array(server: RunningSimulator) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 4}}
    url = f"{server.url}/v1beta/models/plain:streamGenerateContent"
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers={"x-goog-api-key": "sim-key-0123456789"}) as response,
    ):
        assert response.status == 200
        assert response.content_type == "application/json"
        chunks = json.loads(await response.text())
    assert isinstance(chunks, list)
    assert chunks[-1]["candidates"][0]["finishReason"] == "MAX_TOKENS"


@pytest.mark.parametrize("api", ["openai-responses", "gemini"])
async def test_the_new_apis_need_the_key(server: RunningSimulator, api: str) -> None:
    sample = await probe(server, api, api_key="wrong")
    assert sample.error is ErrorClass.AUTH, sample.error_message


TOOL_APIS = ["openai-chat", "anthropic-messages", "openai-responses", "gemini"]


@pytest.mark.parametrize("api", TOOL_APIS)
async def test_a_forced_tool_call_is_timed_in_every_api_with_tools(server: RunningSimulator, api: str) -> None:
    # The simulator answers with a tool call only when the request offers the tool and requires it,
    # so this also checks each API's request shape.
    sample = await probe(server, api, force_tool_call=True)
    assert sample.ok, sample.error_message
    assert sample.first_tool_call_ms is not None
    assert sample.first_tool_call_ms == sample.ttft_ms
    assert TTFT_MS <= sample.first_tool_call_ms < TTFT_MS + 40


@pytest.mark.parametrize("api", TOOL_APIS)
async def test_reasoning_before_a_tool_call_is_time_the_tool_call_waits_for(server: RunningSimulator, api: str) -> None:
    sample = await probe(server, api, "thinker", force_tool_call=True)
    assert sample.ok, sample.error_message
    assert sample.ttft_ms is not None and sample.first_tool_call_ms is not None
    assert sample.first_tool_call_ms > sample.ttft_ms


@pytest.mark.parametrize("api", ALL_APIS)
async def test_without_forcing_there_is_no_tool_call(server: RunningSimulator, api: str) -> None:
    sample = await probe(server, api)
    assert sample.ok and sample.first_tool_call_ms is None


async def test_a_prompt_profile_with_tool_call_forces_it_through_the_runner(server: RunningSimulator) -> None:
    from monitor.probe.prompts import Calibration, PromptFactory, PromptSpec
    from monitor.probe.runner import ProbeTarget, ProviderLimits, RunPlan, run_plan

    endpoint = Endpoint(server.url + "/v1", FLAVORS["openai-chat"], api_key="sim-key-0123456789")
    params = RequestParams(model="plain", max_tokens=16, temperature=0.0, extra_body={}, include_usage=True)
    target = ProbeTarget(name="plain", provider="sim", endpoint=endpoint, params=params)
    specs = (PromptSpec("plain-text", 128), PromptSpec("tool", 128, tool_call=True))
    plan = RunPlan(targets=(target,), prompts=specs, rounds=1, warmup=0, pause_s=0)
    async with ProbeClient() as client:
        samples = await run_plan(plan, client=client, limits=ProviderLimits({}), prompts=PromptFactory(Calibration()))
    by_prompt = {sample.prompt: sample for sample in samples}
    assert by_prompt["tool"].ok and by_prompt["tool"].first_tool_call_ms is not None
    assert by_prompt["plain-text"].ok and by_prompt["plain-text"].first_tool_call_ms is None
