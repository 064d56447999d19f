"""The prompt's filler text, kept once and sliced (`prompts._Filler`), against the sentence-by-sentence
construction it replaced: every budget gives the same text."""

from __future__ import annotations

import pytest

from monitor.probe import prompts
from monitor.probe.prompts import build_text


def _built_sentence_by_sentence(language: str, chars: int, nonce: str | None) -> str:
    # The construction before the filler was kept (the reference).
    sentences = prompts._ZH if language == "zh" else prompts._EN
    joiner = "" if language == "zh" else " "
    head = f"[{nonce}] " if nonce else ""
    tail = prompts._INSTRUCTION["zh" if language == "zh" else "en"]
    budget = max(0, chars - len(head) - len(tail))
    parts: list[str] = []
    length = 0
    i = 0
    while length < budget:
        sentence = sentences[i % len(sentences)]
        lap = i // len(sentences)
        if lap:
            sentence = f"({lap}) {sentence}" if language != "zh" else f"（{lap}）{sentence}"
        parts.append(sentence)
        length += len(sentence) + len(joiner)
        i += 1
    return head + joiner.join(parts)[:budget] + tail


@pytest.mark.parametrize("language", ["en", "zh", "fr"])
@pytest.mark.parametrize("nonce", [None, "0123456789012345"])
def test_every_budget_gives_the_text_built_sentence_by_sentence(language: str, nonce: str | None) -> None:
    # Short budgets one by one (every sentence boundary, the joiner after it), then long ones that grow the
    # kept text several times, then short ones again from the grown text.
    for chars in [*range(0, 1200), 9_999, 40_000, 123_457, *range(0, 300)]:
        assert build_text(language, chars, nonce=nonce) == _built_sentence_by_sentence(language, chars, nonce)


def test_a_nonce_is_uuid4s_number_of_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import uuid

    for _ in range(200):
        raw = os.urandom(16)
        monkeypatch.setattr(os, "urandom", lambda n, raw=raw: raw[:n])
        assert prompts.new_nonce() == f"{uuid.UUID(bytes=raw, version=4).int % 10**16:016d}"
