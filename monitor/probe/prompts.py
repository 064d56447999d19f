"""Prompts built to a token target, and the calibration that keeps them on target.

Token counts are never guessed from characters for the record: every sample stores the
`prompt_tokens` the server reports. Characters per token differ by tokenizer and language, so the
estimate used to *build* the prompt is learnt per (target, prompt profile) from those reports.
"""

from __future__ import annotations

import bisect
import os
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
# No tokenizer packs more characters than this into a token of these prompts: a server whose usage says
# 10 tokens for every prompt would otherwise grow the prompt 12.8 times a run, to megabytes in five.
MAX_CHARS_PER_TOKEN = 16.0


def build_text(language: str, chars: int, *, nonce: str | None = None) -> str:
    """Deterministic text of about `chars` characters; `nonce` goes first so no prefix can be cached."""
    head = f"[{nonce}] " if nonce else ""
    tail = _INSTRUCTION["zh" if language == "zh" else "en"]
    return head + _FILLERS["zh" if language == "zh" else "en"].text(max(0, chars - len(head) - len(tail))) + tail


class _Filler:
    """The text between the nonce and the instruction: the language's sentences in turn, each lap after
    the first numbered so long prompts are not one block repeated, joined, enough of them to reach the
    budget, cut at it.

    Every budget's text is a prefix of one sequence, so it is kept once (grown to the longest budget asked
    for) and sliced, rather than joined afresh for every probe (about a tenth of a probe's own CPU in the
    daemon's bench). `ends[k]` is where sentence k ends in `joined`: the sentences taken are the fewest
    whose length with a joiner each reaches the budget, and a budget that ends on the joiner after the
    last of them gets the text without it (tests/unit/test_prompts.py compares every budget with the
    sentence-by-sentence construction)."""

    __slots__ = ("ends", "joined", "joiner", "language", "sentences")

    def __init__(self, language: str) -> None:
        self.language = language
        self.sentences = _ZH if language == "zh" else _EN
        self.joiner = "" if language == "zh" else " "
        self.joined = ""
        self.ends: list[int] = []

    def text(self, budget: int) -> str:
        if budget <= 0:
            return ""
        step = len(self.joiner)
        while not self.ends or self.ends[-1] + step < budget:
            self._grow()
        last = self.ends[bisect.bisect_left(self.ends, budget - step)]
        return self.joined[: min(budget, last)]

    def _grow(self) -> None:
        pieces = [self.joined] if self.joined else []
        length = len(self.joined)
        i = len(self.ends)
        # At least double, so a long prompt is reached in a few steps.
        until = 2 * i + len(self.sentences)
        while i < until:
            sentence = self.sentences[i % len(self.sentences)]
            lap = i // len(self.sentences)
            if lap:
                sentence = f"({lap}) {sentence}" if self.language != "zh" else f"（{lap}）{sentence}"
            if pieces:
                pieces.append(self.joiner)
                length += len(self.joiner)
            pieces.append(sentence)
            length += len(sentence)
            self.ends.append(length)
            i += 1
        self.joined = "".join(pieces)


_FILLERS = {"en": _Filler("en"), "zh": _Filler("zh")}


def new_nonce() -> str:
    # Sixteen decimal digits: most tokenizers split digits alike whatever they are (one a token, or
    # groups of three), so every nonce costs the same tokens. Hex did not: its runs of letters and
    # digits came to anywhere from 6 to 16 tokens, a swing of 8% on a prompt of 128.
    return f"{_uuid4_int() % 10**16:016d}"


# The version and variant bits uuid.uuid4() sets, as masks on its 128-bit number.
_UUID4_CLEAR = ~((0xC000 << 48) | (0xF000 << 64))
_UUID4_SET = (0x8000 << 48) | (4 << 76)


def _uuid4_int() -> int:
    """`uuid.uuid4().int`, without the UUID object (its checks were most of a nonce's cost): the same
    16 random bytes with the same bits set (tests/unit/test_prompts.py)."""
    return (int.from_bytes(os.urandom(16)) & _UUID4_CLEAR) | _UUID4_SET


@dataclass(slots=True)
class Observation:
    chars: int
    tokens: int


# A family: prompts one line fits, tokens = chars / chars_per_token + overhead. The same target
# (one tokenizer, one chat template), language (characters per token) and tools (a tool
# definition adds its own fixed tokens); prompt size and cache mode do not matter.
Family = tuple[str, str, bool]
Fit = tuple[float, float]


def line_through(a: Observation, b: Observation) -> Fit | None:
    """(chars per token, overhead tokens) of the line through two counts, or None when they are
    too close to tell a slope or the line is implausible (the server counted oddly)."""
    if abs(a.chars - b.chars) <= 0.02 * max(a.chars, b.chars) or a.tokens == b.tokens:
        return None
    slope = (b.tokens - a.tokens) / (b.chars - a.chars)  # tokens per char
    overhead = b.tokens - slope * b.chars
    if slope <= 0 or not 0 <= overhead < 0.5 * min(a.tokens, b.tokens):
        return None
    return 1 / slope, overhead


class Calibration:
    """Characters-per-token per (target, prompt), corrected from the server's reported counts.

    A fit is tokens = chars / k + overhead; the overhead is the chat template's fixed tokens, the
    same for every prompt of a family (one target, language and tool set), and k is the prompt's
    own (text of one length tokenizes a little differently from another).

    - Counts of two prompts of a family at lengths at least twice apart (the two sizes of a warm-up
      round) give the family's overhead: then each prompt's k follows from its own last count.
      The first measured request after one warm-up round of two sizes lands on target.
    - One prompt alone: two of its counts of different lengths give its line; with one count the
      overhead is unknown, and the next request can miss by part of the template (136 tokens for
      128 once, against a template of about 20).
    """

    def __init__(self, *, on_update: Callable[[tuple[str, str], float, float], None] | None = None) -> None:
        self._fits: dict[tuple[str, str], Fit] = {}
        self._last: dict[tuple[str, str], Observation] = {}
        self._family_last: dict[Family, dict[tuple[str, str], Observation]] = {}
        self._on_update = on_update

    def load(self, key: tuple[str, str], chars_per_token: float, overhead_tokens: float) -> None:
        self._fits[key] = (chars_per_token, overhead_tokens)

    def fit(self, key: tuple[str, str]) -> tuple[float, float] | None:
        return self._fits.get(key)

    def chars_for(self, key: tuple[str, str], tokens: int, language: str, *, family: Family | None = None) -> int:
        fit = self._fits.get(key)
        if fit is None and family is not None:
            # No count of this prompt yet: its family's overhead with another prompt's k.
            fit = next((self._fits[k] for k in self._family_last.get(family, {}) if k in self._fits), None)
        if fit is None:
            return max(1, round(tokens * INITIAL_CHARS_PER_TOKEN.get(language, 4.0)))
        cpt, overhead = fit
        return max(1, round((tokens - overhead) * min(cpt, MAX_CHARS_PER_TOKEN)))

    def observe(self, key: tuple[str, str], chars: int, tokens: int | None, *, family: Family | None = None) -> None:
        if not tokens or tokens <= 0 or chars <= 0:
            return
        seen = Observation(chars, tokens)
        members = self._family_last.setdefault(family, {}) if family is not None else {}
        members[key] = seen
        overhead = self._family_overhead(members)
        if overhead is not None:
            self._refit_family(members, overhead)
            fit = self._fits[key]
        else:
            last = self._last.get(key)
            line = line_through(last, seen) if last is not None else None
            if line is not None:
                fit = line
            else:
                _, overhead = self._fits.get(key, (0.0, 0.0))
                overhead = min(overhead, 0.5 * tokens)
                fit = (chars / max(tokens - overhead, 1), overhead)
            self._fits[key] = fit
        self._last[key] = seen
        if self._on_update is not None:
            self._on_update(key, *fit)

    @staticmethod
    def _family_overhead(members: dict[tuple[str, str], Observation]) -> float | None:
        """The template's tokens from the family's shortest and longest last counts, when they are
        far enough apart that a few tokens of noise (the nonce) barely move the slope."""
        if len(members) < 2:
            return None
        short = min(members.values(), key=lambda o: o.chars)
        long = max(members.values(), key=lambda o: o.chars)
        if long.chars < 2 * short.chars:
            return None
        line = line_through(short, long)
        if line is None:
            # Noise around a template of 0: below zero is implausible, and none is the answer.
            return 0.0 if long.tokens > short.tokens else None
        return line[1]

    def _refit_family(self, members: dict[tuple[str, str], Observation], overhead: float) -> None:
        for member, seen in members.items():
            tokens = max(seen.tokens - min(overhead, 0.5 * seen.tokens), 1)
            fit = (seen.chars / tokens, min(overhead, 0.5 * seen.tokens))
            self._fits[member] = fit


@dataclass(frozen=True, slots=True)
class PromptSpec:
    name: str
    tokens: int
    language: str = "en"
    cache: str = "bust"
    # Offer one function and require it (tool_choice), so the answer is a tool call.
    tool_call: bool = False
    # The warm twin of a `cache: both` prompt: with no warm-up rounds in the job it gets one, unmeasured,
    # so its first measured request finds the prefix cached and every measured one is warm.
    primed: bool = False

    def family(self, target: str) -> Family:
        """The prompts of `target` whose counts lie on one line (see `Calibration`)."""
        return (target, self.language, self.tool_call)


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
        key, family = (target, spec.name), spec.family(target)
        if spec.cache != "warm":
            chars = self.calibration.chars_for(key, spec.tokens, spec.language, family=family)
            return build_text(spec.language, chars, nonce=new_nonce())
        fixed = self._warm_text.get(key)
        if fixed is not None:
            return fixed
        nonce = self._warm_nonce.setdefault(key, new_nonce())
        chars = self.calibration.chars_for(key, spec.tokens, spec.language, family=family)
        text = build_text(spec.language, chars, nonce=nonce)
        if not warmup or spec.primed:
            # Fixed from the first measured request on; warm-up requests follow the calibration. A primed
            # twin's warm-up is there to fill the cache with the measured text, so it fixes it (sized by
            # the calibration of the runs before): a prime of another length would leave the first
            # measured request a partial hit.
            self._warm_text[key] = text
        return text
