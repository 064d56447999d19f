"""Prompt sizing: the first measured request after one warm-up round lands within 5% of its target.

A server counts the prompt's text plus its chat template's fixed tokens (vLLM's ChatML template
adds a couple of dozen); the simulator's toy tokenizer stands in for the text's count. The requests
go in the probe's order for a run of two sizes with one warm-up round: each size's warm-up, then the
measured rounds, each sized with the counts seen so far.
"""

from __future__ import annotations

import pytest

from monitor.probe.prompts import Calibration, PromptFactory, PromptSpec, new_nonce
from monitor.sim.tokens import count_tokens

RUNS = 12  # nonces differ per run; every run must land


def measured_misses(sizes: tuple[int, ...], template: int, language: str, *, warmup: int = 1) -> list[str]:
    misses = []
    for _ in range(RUNS):
        calibration = Calibration()
        factory = PromptFactory(calibration)
        specs = [PromptSpec(name=f"{size}tok", tokens=size, language=language) for size in sizes]
        for index in range(warmup + 3):
            for spec in specs:
                text = factory.text_for("tiny", spec, warmup=index < warmup)
                counted = count_tokens(text) + template
                calibration.observe(("tiny", spec.name), len(text), counted, family=spec.family("tiny"))
                if index >= warmup and abs(counted - spec.tokens) > 0.05 * spec.tokens:
                    misses.append(f"round {index + 1}: {counted} tokens for {spec.tokens}")
    return misses


@pytest.mark.parametrize("template", [0, 12, 25, 40])
@pytest.mark.parametrize("language", ["en", "zh"])
@pytest.mark.parametrize("sizes", [(128, 4000), (64, 512), (256, 2048, 8000)])
def test_every_measured_request_of_a_run_of_several_sizes_lands_within_5_percent(
    sizes: tuple[int, ...], language: str, template: int
) -> None:
    assert measured_misses(sizes, template, language) == []


@pytest.mark.parametrize("template", [0, 25])
def test_one_size_alone_lands_within_5_percent_from_its_second_count_on(template: int) -> None:
    # One count cannot tell the template from the text; two can (see Calibration).
    assert measured_misses((512,), template, "en", warmup=2) == []


def test_a_nonce_costs_the_same_tokens_whatever_its_digits() -> None:
    counts = {count_tokens(f"[{new_nonce()}] ") for _ in range(500)}
    assert len(counts) == 1, counts


def test_a_prompt_with_no_count_yet_borrows_its_family_s_fit_not_another_language_s() -> None:
    calibration = Calibration()
    en, zh = PromptSpec("short", 128), PromptSpec("zh", 128, language="zh")
    calibration.observe(("tiny", "short"), 400, 100, family=en.family("tiny"))
    assert calibration.chars_for(("tiny", "long"), 1000, "en", family=en.family("tiny")) == 4000
    assert calibration.chars_for(("tiny", "zh"), 1000, "zh", family=zh.family("tiny")) == 1400
