"""Checks on what a person types into `incidents ack|resolve|label` and `annotate` before it is stored and sent:
one line of plain text, no terminal control characters, a name for who acted."""

from __future__ import annotations

import getpass
import os
import unicodedata

from monitor.triage.service import MAX_TEXT

MAX_BY = 200
# Characters that would let a note rewrite what a terminal or a chat shows around it: control
# characters (escape sequences, NUL, which PostgreSQL cannot store either) and bidirectional overrides.
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")


class UsageProblem(Exception):
    """Bad input found before touching the database."""


def unsafe_character(text: str) -> str | None:
    """The first control or bidirectional-override character of `text` (as `U+001B`), else None."""
    for char in text:
        if unicodedata.category(char) == "Cc" or char in BIDI_CONTROLS:
            return f"U+{ord(char):04X}"
    return None


def plain(text: str, what: str) -> str:
    """`text` on one line (runs of whitespace become one space); UsageProblem when it holds a control
    character or is longer than MAX_TEXT (`what` names it in the error)."""
    line = " ".join(text.split())
    bad = unsafe_character(line)
    if bad is not None:
        raise UsageProblem(f"{what} contains the control character {bad}; give plain text")
    if len(line) > MAX_TEXT:
        raise UsageProblem(f"{what} is {len(line)} characters; keep it to {MAX_TEXT}")
    return line


def who(given: str | None, environ: dict[str, str] | None = None) -> str:
    """`--by`, else $USER, else the login name, else "unknown"."""
    env = os.environ if environ is None else environ
    # One line: the name goes into notifications ("Resolved by hand by NAME").
    name = " ".join((given or env.get("USER") or "").split())
    name = "".join(char for char in name if unsafe_character(char) is None)
    if not name:
        try:
            name = getpass.getuser()
        except Exception:  # no passwd entry in a container
            name = "unknown"
    return name[:MAX_BY]
