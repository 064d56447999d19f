"""What a simulated model says: canned reasoning and answer text, cut to the request's limits."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from itertools import chain, islice, repeat

from monitor.sim.tokens import pieces

REASONING_TEXT = (
    "Okay, the user wants a short answer. Let me think about what matters here: "
    "keep it accurate, keep it brief, and mention the main point first."
)
ANSWER_TEXT = (
    "Time to first token is the delay between sending a request and receiving the first "
    "generated token. It is dominated by queueing and prompt prefill, while the pace of the "
    "tokens after it is set by decoding."
)


@dataclass(frozen=True, slots=True)
class OutputPlan:
    reasoning: tuple[str, ...]
    answer: tuple[str, ...]
    # True when the model stopped on its own ("stop" / "end_turn"), False when max_tokens cut it.
    finished: bool

    @property
    def completion_tokens(self) -> int:
        return len(self.reasoning) + len(self.answer)


@cache
def _pieces(text: str) -> tuple[str, ...]:
    # Memoised: the canned texts are cut up on every request otherwise.
    return tuple(pieces(text))


def _repeated(text: str, count: int) -> tuple[str, ...]:
    """`count` token pieces of `text`, repeated as often as needed, a space between repeats."""
    once = _pieces(text)
    again = _pieces(" " + text)
    return tuple(islice(chain(once, chain.from_iterable(repeat(again))), count))


def plan_output(
    *, reasoning_tokens: int, answer_tokens: int, max_tokens: int, answer_text: str = ANSWER_TEXT
) -> OutputPlan:
    """Reasoning first, then the answer; both count against `max_tokens`, as in vLLM."""
    reasoning = min(reasoning_tokens, max_tokens)
    answer = min(answer_tokens, max_tokens - reasoning)
    return OutputPlan(
        reasoning=_repeated(REASONING_TEXT, reasoning),
        answer=_repeated(answer_text, answer),
        finished=reasoning_tokens + answer_tokens <= max_tokens,
    )
