"""Prompts built to a token target, and the calibration that keeps them on target.

Token counts are never guessed from characters for the record: every sample stores the
`prompt_tokens` the server reports. Characters per token differ by tokenizer and language, so the
estimate used to *build* the prompt is learnt per (target, prompt profile) from those reports.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

# Plain, varied sentences: repetitive filler compresses into few tokens on some tokenizers and
# would make the character estimate swing between targets.
_EN = (
    "The operations team reviewed the quarterly capacity plan for the inference cluster.",
    "Each node serves several model replicas behind a gateway that balances requests by queue depth.",
    "Latency during prefill grows with the number of prompt tokens and the size of the model.",
    "Engineers compared streaming responses from three providers over a week of scheduled probes.",
    "A cache of attention keys and values lets repeated prefixes skip most of the computation.",
    "When traffic peaks in the afternoon, the first token takes noticeably longer to arrive.",
    "The monitoring dashboard shows the median, the ninetieth percentile and the slowest probe.",
    "Alerts should fire only when a change is large, statistically clear and persistent.",
    "Batch size, tensor parallelism and quantisation all shift the balance between speed and cost.",
    "Network round trips add a fixed delay that matters most for short prompts.",
    "A regression that appears after a deployment is usually visible within a few probe rounds.",
    "Operators keep a runbook that explains how to roll back a model server safely.",
)
_ZH = (
    "运维团队审阅了推理集群本季度的容量规划。",
    "每个节点在网关之后运行多个模型副本，网关按队列深度分配请求。",
    "预填充阶段的延迟随提示词的长度和模型的规模一起增长。",
    "工程师用一周的定时探测比较了三家服务商的流式响应。",
    "注意力的键值缓存让重复的前缀跳过大部分计算。",
    "下午流量高峰时，第一个字明显来得更慢。",
    "监控面板展示中位数、第九十百分位以及最慢的一次探测。",
    "告警只应在变化足够大、统计上清楚并且持续存在时触发。",
    "批大小、张量并行和量化都会改变速度与成本之间的平衡。",
    "网络往返带来固定的延迟，对短提示词影响最大。",
    "部署之后出现的性能退化，通常在几轮探测之内就能看到。",
    "值班人员有一份运行手册，说明如何安全地回滚模型服务。",
)
_INSTRUCTION = {
    "en": "\n\nSummarise the text above in one short sentence.",
    "zh": "\n\n请用一句话概括上面的内容。",
}
# First guesses before any server has reported a count (typical BPE tokenizers).
INITIAL_CHARS_PER_TOKEN = {"en": 4.2, "zh": 1.4}


def build_text(language: str, chars: int, *, nonce: str | None = None) -> str:
    """Deterministic text of about `chars` characters; `nonce` goes first so no prefix can be cached."""
    sentences = _ZH if language == "zh" else _EN
    joiner = "" if language == "zh" else " "
    head = f"[{nonce}] " if nonce else ""
    tail = _INSTRUCTION["zh" if language == "zh" else "en"]
    budget = max(0, chars - len(head) - len(tail))
    parts: list[str] = []
    length = 0
    i = 0
    while length < budget:
        sentence = sentences[i % len(sentences)]
        # Vary every lap a little so long prompts are not one block repeated.
        lap = i // len(sentences)
        if lap:
            sentence = f"({lap}) {sentence}" if language != "zh" else f"（{lap}）{sentence}"
        parts.append(sentence)
        length += len(sentence) + len(joiner)
        i += 1
    body = joiner.join(parts)[:budget]
    return head + body + tail


def new_nonce() -> str:
    return uuid.uuid4().hex[:16]


@dataclass(slots=True)
class Observation:
    chars: int
    tokens: int


class Calibration:
    """Characters-per-token per (target, prompt), corrected from the server's reported counts.

    With two observations of different lengths it fits tokens = chars / k + overhead, which
    absorbs the chat template's fixed tokens; with one it uses the ratio. Either way one reported
    count is enough to land within a few percent of the target on the next request.
    """

    def __init__(self, *, on_update: Callable[[tuple[str, str], float, float], None] | None = None) -> None:
        self._fits: dict[tuple[str, str], tuple[float, float]] = {}
        self._last: dict[tuple[str, str], Observation] = {}
        self._on_update = on_update

    def load(self, key: tuple[str, str], chars_per_token: float, overhead_tokens: float) -> None:
        self._fits[key] = (chars_per_token, overhead_tokens)

    def fit(self, key: tuple[str, str]) -> tuple[float, float] | None:
        return self._fits.get(key)

    def chars_for(self, key: tuple[str, str], tokens: int, language: str) -> int:
        fit = self._fits.get(key)
        if fit is None:
            return max(1, round(tokens * INITIAL_CHARS_PER_TOKEN.get(language, 4.0)))
        cpt, overhead = fit
        return max(1, round((tokens - overhead) * cpt))

    def observe(self, key: tuple[str, str], chars: int, tokens: int | None) -> None:
        if not tokens or tokens <= 0 or chars <= 0:
            return
        last = self._last.get(key)
        fit: tuple[float, float]
        if last is not None and abs(last.chars - chars) > 0.02 * chars and last.tokens != tokens:
            slope = (tokens - last.tokens) / (chars - last.chars)  # tokens per char
            overhead = tokens - slope * chars
            plausible = slope > 0 and 0 <= overhead < 0.5 * tokens
            fit = (1 / slope, overhead) if plausible else (chars / tokens, 0.0)
        else:
            _, overhead = self._fits.get(key, (0.0, 0.0))
            overhead = min(overhead, 0.5 * tokens)
            fit = (chars / max(tokens - overhead, 1), overhead)
        self._fits[key] = fit
        self._last[key] = Observation(chars, tokens)
        if self._on_update is not None:
            self._on_update(key, *fit)


@dataclass(frozen=True, slots=True)
class PromptSpec:
    name: str
    tokens: int
    language: str = "en"
    cache: str = "bust"
    # Offer one function and require it (tool_choice), so the answer is a tool call.
    tool_call: bool = False


class PromptFactory:
    """Builds the text for the next sample of a series. Make one per run.

    `bust`: a fresh nonce first in every request, so no prefix cache can answer.
    `warm`: one text repeated for the whole run, to measure the cached path on purpose. It still
    starts with a nonce, but one per run, so an earlier run cannot have warmed the cache: the
    first request of the run fills it and every later one hits it. Warm-up requests share that
    nonce, so with warm-up rounds even the first measured request finds (part of) it cached.
    """

    def __init__(self, calibration: Calibration) -> None:
        self.calibration = calibration
        self._warm_nonce: dict[tuple[str, str], str] = {}
        self._warm_text: dict[tuple[str, str], str] = {}

    def text_for(self, target: str, spec: PromptSpec, *, warmup: bool = False) -> str:
        key = (target, spec.name)
        if spec.cache != "warm":
            chars = self.calibration.chars_for(key, spec.tokens, spec.language)
            return build_text(spec.language, chars, nonce=new_nonce())
        fixed = self._warm_text.get(key)
        if fixed is not None:
            return fixed
        nonce = self._warm_nonce.setdefault(key, new_nonce())
        chars = self.calibration.chars_for(key, spec.tokens, spec.language)
        text = build_text(spec.language, chars, nonce=nonce)
        if not warmup:
            # Fixed from the first measured request on; warm-up requests follow the calibration.
            self._warm_text[key] = text
        return text
