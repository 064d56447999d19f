"""What probes spent: a sample's tokens by kind, a run's total and its cost where the target is priced.

`probe` prints it (`spend_line`); the metrics count the same `sample_tokens` per target (docs/cost.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from monitor.config.cost import Tokens, cost_of, costs_text, spent, tokens_detail
from monitor.probe.result import Sample

if TYPE_CHECKING:
    from monitor.probe.settings import Prices


def sample_tokens(sample: Sample) -> Tokens:
    """The tokens one request spent, as its server reported them (a failed request may have spent some)."""
    return spent(
        prompt_tokens=sample.prompt_tokens,
        cached_tokens=sample.cached_tokens,
        completion_tokens=sample.completion_tokens,
        reasoning_tokens=sample.reasoning_tokens,
    )


@dataclass(slots=True)
class Spend:
    tokens: Tokens = field(default_factory=Tokens)
    cost: dict[str, float] = field(default_factory=dict)  # by currency
    unpriced: set[str] = field(default_factory=set)  # targets without prices
    estimated: int = 0  # samples whose reasoning tokens were estimated from the stream


def run_spend(samples: Iterable[Sample], prices_of: Callable[[str], Prices | None]) -> Spend:
    """The tokens and cost of `samples` (warm-ups included: they are paid for), priced per target."""
    out = Spend()
    for sample in samples:
        tokens = sample_tokens(sample)
        out.tokens += tokens
        out.estimated += sample.reasoning_tokens_estimated and bool(sample.reasoning_tokens)
        prices = prices_of(sample.target)
        if prices is None:
            if tokens.total:
                out.unpriced.add(sample.target)
            continue
        out.cost[prices.currency] = out.cost.get(prices.currency, 0.0) + cost_of(tokens, prices)
    return out


def spend_line(spend: Spend) -> str:
    """`cost of this run: 12,345 tokens (input ..., reasoning ...); 0.0031 USD`, and what it leaves out."""
    line = f"cost of this run: {tokens_detail(spend.tokens)}"
    if spend.cost:
        line += f"; {costs_text(spend.cost)}"
    notes = []
    if spend.unpriced:
        notes.append(f"no prices for {', '.join(sorted(spend.unpriced))}")
    if spend.estimated:
        notes.append(f"reasoning estimated from the stream in {spend.estimated} samples")
    return line + (f" ({'; '.join(notes)})" if notes else "")


# A change in what each probe generates this large is the model's behaviour, not noise: a model that
# starts reasoning goes from about a dozen tokens a probe to hundreds (12 -> 950 in a public report).
REASONING_JUMP_RATIO = 4.0
REASONING_JUMP_MIN_TOKENS = 100


@dataclass(frozen=True, slots=True)
class PerProbe:
    """The median tokens one successful probe of a target and prompt generated in a run."""

    completion: float
    reasoning: float


def per_probe(samples: Iterable[Sample]) -> dict[tuple[str, str], PerProbe]:
    """By (target, prompt): the medians over a run's successful samples that carry a completion count."""
    from monitor.quantile import quantile

    grouped: dict[tuple[str, str], list[Sample]] = {}
    for sample in samples:
        if sample.ok and sample.completion_tokens is not None:
            grouped.setdefault((sample.target, sample.prompt), []).append(sample)
    out = {}
    for key, group in grouped.items():
        completion = quantile([float(s.completion_tokens or 0) for s in group], 0.5)
        reasoning = quantile([float(s.reasoning_tokens or 0) for s in group], 0.5)
        if completion is not None:
            out[key] = PerProbe(completion, reasoning or 0.0)
    return out


def token_jumps(
    before: dict[tuple[str, str], PerProbe], after: dict[tuple[str, str], PerProbe]
) -> list[tuple[tuple[str, str], PerProbe, PerProbe]]:
    """The series whose tokens per probe grew at least REASONING_JUMP_RATIO-fold and by at least
    REASONING_JUMP_MIN_TOKENS from one run to the next: "the model now reasons" (or answers at length)."""
    jumps = []
    for key, now in after.items():
        was = before.get(key)
        if was is None:
            continue
        grew = now.completion - was.completion
        if grew >= REASONING_JUMP_MIN_TOKENS and now.completion >= REASONING_JUMP_RATIO * max(was.completion, 1.0):
            jumps.append((key, was, now))
    return jumps
