"""How far the probe's prompts land from their token targets, counted by a real tokenizer and chat template.

    PYTHONPATH=. ~/.cache/ttft-monitor/vllm-env/bin/python bench/prompt_sizing.py [--runs 15] [--sizes 128,4000]

Runs in the vLLM environment of tests/support/vllm_peer.py (it has `transformers`; `python -m tests.support.vllm_peer
prepare` builds it and the tiny model). The tiny model's byte-level BPE and ChatML template count each
prompt as vLLM would; the prompts are built and calibrated as in a probe run of those sizes with one
warm-up round, side by side in one run for: the calibration as shipped, the same with the hex nonce
it replaced, and the one-prompt-at-a-time fit with the hex nonce. Prints the worst miss of a measured
request per size, in tokens, and the token counts a nonce takes.
"""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from monitor.probe import prompts
from monitor.probe.prompts import Calibration, PromptFactory, PromptSpec


def worst_misses(
    count: Callable[[str], int], sizes: list[int], runs: int, *, family: bool, nonce: Callable[[], str]
) -> dict[int, int]:
    shipped = prompts.new_nonce
    prompts.new_nonce = nonce
    try:
        worst = dict.fromkeys(sizes, 0)
        for _ in range(runs):
            calibration = Calibration()
            factory = PromptFactory(calibration)
            specs = [PromptSpec(name=f"{size}tok", tokens=size) for size in sizes]
            for index in range(4):  # one warm-up round, three measured
                for spec in specs:
                    text = factory.text_for("tiny", spec, warmup=index == 0)
                    counted = count(text)
                    extra = {"family": spec.family("tiny")} if family else {}
                    calibration.observe(("tiny", spec.name), len(text), counted, **extra)
                    if index:
                        worst[spec.tokens] = max(worst[spec.tokens], abs(counted - spec.tokens))
        return worst
    finally:
        prompts.new_nonce = shipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--sizes", default="128,4000")
    parser.add_argument("--model", help="the tiny model's directory (default: the newest built one)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    env = Path(os.environ.get("TTFT_VLLM_ENV") or "~/.cache/ttft-monitor/vllm-env").expanduser()
    model = args.model or str(max((env / "ttft-tiny-llama").glob("*/"), key=lambda p: p.stat().st_mtime))
    tokenizer = AutoTokenizer.from_pretrained(model)

    def count(text: str) -> int:
        chat = [{"role": "user", "content": text}]
        return len(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False))

    sizes = [int(s) for s in args.sizes.split(",")]
    hex_nonce = lambda: uuid.uuid4().hex[:16]  # noqa: E731
    print(f"tokenizer {model}; chat template of an empty message: {count('')} tokens; {args.runs} runs")
    rows = (
        ("as shipped (family fit, decimal nonce)", True, prompts.new_nonce),
        ("family fit, hex nonce", True, hex_nonce),
        ("one prompt at a time, hex nonce", False, hex_nonce),
    )
    for name, family, nonce in rows:
        misses = worst_misses(count, sizes, args.runs, family=family, nonce=nonce)
        cells = ", ".join(f"{size}: {miss} tokens ({100 * miss / size:.1f}%)" for size, miss in misses.items())
        print(f"worst miss of a measured request, {name}: {cells}")
    for name, nonce in (("decimal", prompts.new_nonce), ("hex", hex_nonce)):
        counts = sorted({len(tokenizer.encode(f"[{nonce()}] ")) for _ in range(300)})
        print(f"tokens of a {name} nonce, 300 drawn: {counts}")


if __name__ == "__main__":
    main()
