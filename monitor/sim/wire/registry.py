"""The simulator's API flavours, one line each; the server serves every one listed here."""

from __future__ import annotations

from monitor.sim.wire import Flavour, anthropic, gemini, openai, responses

FLAVORS: tuple[Flavour, ...] = (
    openai.CHAT,
    openai.COMPLETIONS,
    anthropic.MESSAGES,
    responses.RESPONSES,
    gemini.GEMINI,
)
