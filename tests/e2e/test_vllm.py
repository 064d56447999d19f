"""The real CLI against a genuine vLLM (CPU build) serving a tiny local model (tests/support/vllm_peer.py).

CPU inference shares two cores with the test runner, so requests are few and short (a handful of
generated tokens each) and every comparison is made within one run of this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
from pathlib import Path
from typing import Any

import pytest

from monitor.probe.apis import FLAVORS
from tests.conftest import CliResult, run_cli
from tests.support.banners import SummaryLines
from tests.support.vllm_peer import CPUS_VARIABLE, SERVED_MODEL, VllmServer, engine_cpus, metric_total

pytest_plugins = ("tests.support.vllm_peer",)

# The first test of the session also waits for vLLM to start: tens of seconds on two idle cores,
# two and a half minutes measured on two cores shared with other work.
# realtime: the vLLM server the module shares takes about two minutes to start.
pytestmark = [pytest.mark.vllm, pytest.mark.realtime, pytest.mark.timeout(600)]

SHORT, LONG = 128, 4000
CLI_TIMEOUT_S = 240
RESPONSES = "openai-responses"


def probe(server: VllmServer, *args: str) -> dict[str, Any]:
    """`ttft-monitor probe --format json` against the server: its samples and summary."""
    result = run_cli(
        "probe",
        "--url",
        server.v1,
        "--model",
        SERVED_MODEL,
        "--pause",
        "0",
        "--format",
        "json",
        *args,
        timeout=CLI_TIMEOUT_S,
    )
    assert result.code == 0, str(result)
    return parse_report(result)


def parse_report(result: CliResult) -> dict[str, Any]:
    report = json.loads(result.stdout)
    errors = [s for s in report["samples"] if s["error"] is not None]
    assert not errors, f"probe samples failed: {errors}\n{result}"
    return report


def measured(report: dict[str, Any], prompt: str) -> list[dict[str, Any]]:
    samples = [s for s in report["samples"] if s["prompt"] == prompt and not s["warmup"]]
    assert samples, f"no measured samples for {prompt}: {report['samples']}"
    return samples


def median_ttft(samples: list[dict[str, Any]]) -> float:
    return statistics.median(s["ttft_ms"] for s in samples)


def process_tree(root: int) -> list[int]:
    """`root` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def test_the_server_and_its_engine_keep_to_their_own_core(vllm_server: VllmServer) -> None:
    """vLLM's engine spins; outside its core the monitor, PostgreSQL and pytest must still run
    (tests/support/vllm_peer.py): every thread of every process of the server stays on `engine_cpus()`."""
    cpus = engine_cpus(choice=os.environ.get(CPUS_VARIABLE))
    tree = process_tree(vllm_server.process.pid)
    assert len(tree) >= 2, f"no engine process under the server: {tree}"  # the API server starts its engine
    strays = {}
    for pid in tree:
        for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
            with contextlib.suppress(ProcessLookupError):
                allowed = os.sched_getaffinity(int(task.name))
                if not allowed <= cpus:
                    strays[f"{pid}/{task.name}"] = sorted(allowed)
    assert not strays, f"threads outside cores {sorted(cpus)}: {strays}"


@pytest.fixture(scope="module")
def bust_run(vllm_server: VllmServer) -> dict[str, Any]:
    return probe(
        vllm_server,
        *("--api", "openai-chat", "--prompt-tokens", f"{SHORT},{LONG}", "--cache", "bust"),
        *("--rounds", "3", "--warmup", "1", "--max-tokens", "4"),
    )


def test_with_cache_bust_ttft_grows_with_the_prompt(bust_run: dict[str, Any], vllm_figures: SummaryLines) -> None:
    short, long = median_ttft(measured(bust_run, f"{SHORT}tok")), median_ttft(measured(bust_run, f"{LONG}tok"))
    vllm_figures.append(
        f"TTFT median, cache bust, 3 chat requests each: {SHORT} tokens {short:.1f} ms, {LONG} {long:.1f} ms"
    )
    # Prefill of 4,000 tokens is real work even for a tiny model; 128 tokens are next to nothing.
    assert long > 1.5 * short, f"TTFT median {SHORT} tokens: {short:.1f} ms, {LONG} tokens: {long:.1f} ms"


@pytest.mark.parametrize("target", [SHORT, LONG])
def test_with_cache_bust_prompts_are_on_target_and_nothing_is_cached(bust_run: dict[str, Any], target: int) -> None:
    for sample in measured(bust_run, f"{target}tok"):
        assert abs(sample["prompt_tokens"] - target) <= 0.05 * target, sample
        assert sample["cached_tokens"] == 0, sample
        assert sample["completion_tokens"] == 4, sample


def test_with_cache_warm_the_prefix_cache_answers_and_ttft_drops(
    vllm_server: VllmServer, bust_run: dict[str, Any], vllm_figures: SummaryLines
) -> None:
    warm = measured(
        probe(
            vllm_server,
            *("--api", "openai-chat", "--prompt-tokens", str(LONG), "--cache", "warm"),
            *("--rounds", "3", "--warmup", "1", "--max-tokens", "4"),
        ),
        f"{LONG}tok",
    )
    assert all(s["cached_tokens"] > 0.9 * LONG for s in warm), warm
    warm_ttft, bust_ttft = median_ttft(warm), median_ttft(measured(bust_run, f"{LONG}tok"))
    cached = statistics.median(s["cached_tokens"] for s in warm)
    vllm_figures.append(
        f"TTFT median at {LONG} tokens, cache warm: {warm_ttft:.1f} ms ({cached:.0f} tokens from the prefix cache), "
        f"against {bust_ttft:.1f} ms with cache bust"
    )
    assert warm_ttft < bust_ttft, f"TTFT median at {LONG} tokens: warm {warm_ttft:.1f} ms, bust {bust_ttft:.1f} ms"


@pytest.mark.parametrize("api", ["openai-chat", "openai-completions", RESPONSES])
def test_each_api_flavour_measures_the_same_server(vllm_server: VllmServer, api: str) -> None:
    if api not in FLAVORS:
        pytest.skip(f"{api} is not in monitor.probe.apis.FLAVORS yet (it comes with the wire branch)")
    report = probe(
        vllm_server,
        *("--api", api, "--prompt-tokens", "512", "--rounds", "2", "--warmup", "1", "--max-tokens", "6"),
    )
    for sample in measured(report, "512tok"):
        assert sample["api"] == api
        assert sample["served_model"] == SERVED_MODEL, sample
        assert 0 < sample["first_event_ms"] <= sample["ttft_ms"] <= sample["total_ms"], sample
        # No reasoning channel here: the first token is the first visible answer token.
        assert sample["ttfa_ms"] == sample["ttft_ms"], sample
        assert abs(sample["prompt_tokens"] - 512) <= 0.05 * 512, sample
        assert sample["completion_tokens"] == 6, sample
        assert sample["cached_tokens"] == 0, sample
        # A decode rate needs the tokens to arrive at different times. On a loaded machine the client can
        # read all six in one go (one arrival stamp): then the rate is unknown, never zero or made up.
        if sample["gap_max_ms"] == 0:
            assert sample["decode_tps"] is None, sample
        else:
            assert sample["decode_tps"] > 0, sample


@pytest.mark.parametrize(
    ("api", "effort"),
    [("openai-chat", None), ("openai-chat", "low"), (RESPONSES, None)],
    ids=["chat-template", "chat-effort-low", "responses-minimal"],
)
def test_a_real_vllm_takes_the_least_reasoning_switches(vllm_server: VllmServer, api: str, effort: str | None) -> None:
    # chat_template_kwargs.enable_thinking, reasoning_effort and Responses' reasoning.effort as vLLM's own
    # request models read them: a switch it refused would turn every probe into error bad_request.
    report = probe(
        vllm_server,
        *("--api", api, "--prompt-tokens", "128", "--rounds", "1", "--warmup", "0", "--max-tokens", "4"),
        *("--reasoning", "least"),
        *(("--reasoning-effort", effort) if effort else ()),
    )
    (sample,) = measured(report, "128tok")
    assert sample["completion_tokens"] == 4 and not sample["reasoning_tokens"], sample


def test_monitor_ttft_matches_vllms_own_ttft_plus_the_http_stack(
    vllm_server: VllmServer, vllm_figures: SummaryLines
) -> None:
    requests, prompt_tokens = 4, 1000
    ttft_metric = "vllm:time_to_first_token_seconds"
    before = vllm_server.metrics()
    # No warm-up: vLLM's histogram must hold exactly the requests whose TTFT the monitor reports.
    args: tuple[str, ...] = ("--api", "openai-chat", "--prompt-tokens", str(prompt_tokens), "--cache", "bust")
    args += ("--rounds", str(requests), "--warmup", "0", "--max-tokens", "4")
    report = probe(vllm_server, *args)
    after = vllm_server.metrics()
    count = metric_total(after, ttft_metric + "_count") - metric_total(before, ttft_metric + "_count")
    assert count == requests, f"vLLM counted {count} first tokens for {requests} requests"
    server_mean_ms = 1000 * (metric_total(after, ttft_metric + "_sum") - metric_total(before, ttft_metric + "_sum"))
    server_mean_ms /= count
    samples = measured(report, f"{prompt_tokens}tok")
    monitor_mean_ms = statistics.fmean(s["ttft_ms"] for s in samples)
    difference = monitor_mean_ms - server_mean_ms
    vllm_figures.append(
        f"TTFT over {requests} chat requests of {prompt_tokens} prompt tokens (cache bust): monitor "
        f"{monitor_mean_ms:.1f} ms, vLLM's own vllm:time_to_first_token_seconds {server_mean_ms:.1f} ms, "
        f"difference {difference:.1f} ms ({100 * difference / server_mean_ms:.0f}%): HTTP stack, "
        f"tokenization and loopback (monitor median {statistics.median(s['ttft_ms'] for s in samples):.1f} ms; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )
    print(vllm_figures[-1])
    # vLLM starts its clock after the request has arrived and been tokenized; the monitor's starts
    # before the request leaves, so it can only be later. Loopback and the HTTP stack add
    # milliseconds, not a multiple.
    assert monitor_mean_ms >= server_mean_ms, vllm_figures[-1]
    assert difference < max(100.0, 0.5 * server_mean_ms), vllm_figures[-1]
