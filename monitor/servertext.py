"""Text a server chose, made fit to keep and to show: secrets masked, control characters made visible,
length capped. Pure.

The order matters. A cap applied before redaction cuts a secret in two, and the half left no longer
matches: `gwtok_...xyzABC` of a token ending `...ABCD` was stored and logged that way. So the text is
redacted whole, then capped, and a tail of the capped text that begins a known secret (one cut by
this cap, or by a read bound upstream such as the error body's 2,000 bytes) is masked too.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from monitor.redact import MIN_SECRET_CHARS, REDACTED, redact, secret_forms

# The cap on one piece of server text in a message, a header or a model name.
SERVER_TEXT_CAP = 300
# The cap on a whole error message: ours, with the server's text quoted in it (the database's too).
MESSAGE_CAP = 2000
TRUNCATED_MARK = "\u2026"
# A tail this long that begins a secret is masked; two characters say no more than a vendor's
# well-known key prefix, and masking every single matching character would mask by chance.
SECRET_TAIL_CHARS = 3
# C0 controls, DEL and C1 controls: a terminal acts on them (ESC colours and moves the cursor, BEL
# rings, CR overwrites the line, NEL and CSI are C1), and a newline forges a log line.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # keeps tab and newline
_NAMED_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def printable(text: str, *, lines: bool = False) -> str:
    """`text` on one line with every control character shown as an escape (`\\x1b`, `\\n`); with
    `lines`, tabs and newlines are kept (text of several lines, such as a config error)."""
    pattern = _CONTROL_BUT_LINES if lines else _CONTROL
    if not pattern.search(text):
        return text
    return pattern.sub(lambda match: _NAMED_ESCAPES.get(match.group(0)) or f"\\x{ord(match.group(0)):02x}", text)


def capped(text: str, limit: int = SERVER_TEXT_CAP, secrets: Iterable[str | None] = (), *, escape: bool = True) -> str:
    """`text` redacted, its control characters escaped (unless `escape` is false: the caller quotes it
    with `repr`), then cut to at most `limit` characters ending in TRUNCATED_MARK.

    Never leaves the first characters of a secret at the end: a tail of SECRET_TAIL_CHARS or more
    that begins one of `secrets` (in any form it travels in) becomes REDACTED, as does a REDACTED
    marker the cut fell inside.
    """
    if limit < len(REDACTED) + len(TRUNCATED_MARK):
        raise ValueError(f"limit {limit} is too small to hold {REDACTED}{TRUNCATED_MARK}")
    known = tuple(sorted({s for s in secrets if s and len(s) >= MIN_SECRET_CHARS}))
    text = redact(text, known)
    if escape and (shown := printable(text)) != text:
        text = redact(shown, known)  # an escape can spell out a secret (`\x00ab` holds `x00ab`)
    forms = _forms(known)
    if len(text) <= limit and not _secret_tail(text, forms):
        return text
    cut = len(text) > limit
    head = text[: limit - len(TRUNCATED_MARK)] if cut else text
    masked = False
    while True:
        if cut and (start := _marker_cut_at(text, len(head))) is not None:
            head, masked = head[:start], True
            continue
        if tail := _secret_tail(head, forms):
            head, masked = head[:-tail], True
            continue
        ending = (REDACTED if masked else "") + (TRUNCATED_MARK if cut else "")
        if len(head) + len(ending) <= limit:
            return head + ending
        # The marker does not fit: cut further, and look at the new end again.
        cut = True
        head = head[: limit - len(REDACTED) - len(TRUNCATED_MARK)]


@functools.lru_cache(maxsize=256)
def _forms(secrets: tuple[str, ...]) -> tuple[frozenset[str], int]:
    """Every beginning (SECRET_TAIL_CHARS or longer) of every form of `secrets`, and the longest's length."""
    forms = set().union(*(secret_forms(secret) for secret in secrets))
    starts = frozenset(form[:k] for form in forms for k in range(SECRET_TAIL_CHARS, len(form) + 1))
    return starts, max(map(len, forms), default=0)


def _secret_tail(text: str, forms: tuple[frozenset[str], int]) -> int:
    """The length of the longest end of `text` that begins a secret (SECRET_TAIL_CHARS or more); 0 if none."""
    starts, longest = forms
    for length in range(min(longest, len(text)), SECRET_TAIL_CHARS - 1, -1):
        if text[-length:] in starts:
            return length
    return 0


def _marker_cut_at(text: str, at: int) -> int | None:
    """Where a REDACTED marker starts, when cutting `text` at `at` would split it."""
    start = text.find(REDACTED, max(0, at - len(REDACTED) + 1), at + len(REDACTED) - 1)
    return start if start != -1 and start < at else None


class QuotesServer:
    """For an error whose message quotes text a server sent, in place of `{quote}`: the quote is kept
    whole and cut only when the message is written out with the secrets known (`describe`), since a
    quote cut earlier can hold a secret's first characters, which redaction no longer recognises."""

    quote_text: str = ""
    quote_limit: int = 80
    quote_repr: bool = True  # shown as a Python string literal (the body's data); else as it is (a header)

    def describe(self, secrets: Iterable[str | None] = ()) -> str:
        message = str(self.args[0]) if isinstance(self, BaseException) and self.args else ""
        if "{quote}" not in message:
            return message
        shown = capped(self.quote_text, self.quote_limit, secrets, escape=not self.quote_repr)
        return message.replace("{quote}", repr(shown) if self.quote_repr else shown)

    def __str__(self) -> str:
        return self.describe()
