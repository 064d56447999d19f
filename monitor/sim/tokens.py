"""The simulator's toy tokenizer: deterministic, regex based, no vocabulary.

English and Chinese get different characters-per-token ratios on purpose, so a client
that sizes prompts must calibrate from the server-reported `prompt_tokens` rather than
assume a fixed ratio.
"""

from __future__ import annotations

import re

# CJK ideographs (with extension A and compatibility forms), kana and hangul syllables.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"

_TOKEN = rf"[A-Za-z]{{1,4}}|[0-9]{{1,3}}|[{_CJK}]{{1,2}}|[^\s{_CJK}A-Za-z0-9]"
_TOKEN_RE = re.compile(_TOKEN)
# A token with the whitespace before it, so generated pieces join back into readable text.
_PIECE_RE = re.compile(rf"\s*(?:{_TOKEN})")


def tokenize(text: str) -> list[str]:
    """Tokens of `text`; whitespace separates tokens but is never one."""
    return _TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    return sum(1 for _ in _TOKEN_RE.finditer(text))


def pieces(text: str) -> list[str]:
    """Tokens with their leading whitespace: `"".join(pieces(t)) == t.rstrip()`."""
    return _PIECE_RE.findall(text)
