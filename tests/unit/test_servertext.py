"""`capped` and `printable`: server text redacted whole, then made one line, then capped, with no
secret's first characters left at a cut. Pure; tables of cases and properties."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.redact import REDACTED
from monitor.servertext import SECRET_TAIL_CHARS, TRUNCATED_MARK, QuotesServer, capped, printable

TOKEN = "gwtok_7Hq2Lx9Vb3Nz5Rk8Tm4Wp6Yc1Ds0xyzABCD"
M = TRUNCATED_MARK
R = REDACTED


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("short and clean", 300, "short and clean"),
        (f"bad key {TOKEN}", 300, f"bad key {R}"),
        # Redacted first: the marker fits where the token did not.
        ("x" * 290 + TOKEN, 300, "x" * 290 + R),
        # The cut falls inside the marker: the marker is kept whole and the padding cut instead.
        ("x" * 295 + TOKEN, 300, "x" * 289 + R + M),
        ("x" * 400, 300, "x" * 299 + M),
        # The text was cut upstream (a read bound) inside the token: its first characters are masked.
        ("x" * 10 + TOKEN[:12], 300, "x" * 10 + R),
        ("x" * 10 + TOKEN[:SECRET_TAIL_CHARS], 300, "x" * 10 + R),
        # Shorter than SECRET_TAIL_CHARS: kept (a vendor's key prefix says that much).
        ("x" * 10 + TOKEN[: SECRET_TAIL_CHARS - 1], 300, "x" * 10 + TOKEN[: SECRET_TAIL_CHARS - 1]),
        # The token's base64 form, cut upstream, is masked as well.
        ("basic " + base64.b64encode(TOKEN.encode()).decode()[:20], 300, "basic " + R),
        # Cut upstream at the very end of a long text, then cut by the cap: no room for the marker as it was.
        ("x" * 295 + TOKEN[:20], 300, "x" * 289 + R + M),
    ],
)
def test_it_redacts_before_capping_and_masks_a_secret_cut_at_the_end(text: str, limit: int, expected: str) -> None:
    out = capped(text, limit, [TOKEN])
    assert out == expected
    assert len(out) <= limit


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain text, é and 漢字", "plain text, é and 漢字"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("bell\x07 nul\x00 del\x7f", "bell\\x07 nul\\x00 del\\x7f"),
        ("csi\x9b nel\x85", "csi\\x9b nel\\x85"),
        ("two\nlines\r\tand a tab", "two\\nlines\\r\\tand a tab"),
    ],
)
def test_it_shows_control_characters_as_escapes_on_one_line(text: str, expected: str) -> None:
    assert printable(text) == expected
    assert capped(text, 300) == expected


def test_text_of_several_lines_can_keep_its_tabs_and_newlines_but_no_other_control() -> None:
    assert printable("one\n\ttwo\x1b[2J\r", lines=True) == "one\n\ttwo\\x1b[2J\\r"


def test_escaping_comes_before_the_cap_so_the_escaped_text_is_bounded() -> None:
    out = capped("\x1b" * 1000, 300)
    assert len(out) == 300 and out.endswith(M) and "\x1b" not in out


def test_a_secret_an_escape_spells_out_is_masked_too() -> None:
    assert capped("key \x00abcd", 300, ["x00abcd"]) == f"key \\{R}"


def test_a_caller_quoting_with_repr_can_keep_the_control_characters() -> None:
    assert capped("a\x1bb", 300, escape=False) == "a\x1bb"


def test_a_limit_too_small_for_the_marks_is_refused() -> None:
    with pytest.raises(ValueError, match="too small"):
        capped("x" * 100, 5)


class _Quoting(QuotesServer, ValueError):
    pass


def test_a_quoted_server_text_is_cut_only_when_described_with_the_secrets() -> None:
    error = _Quoting("event data is not JSON: {quote}")
    error.quote_text = "x" * 70 + TOKEN
    assert TOKEN[:4] not in error.describe([TOKEN])
    assert error.describe([TOKEN]) == "event data is not JSON: " + repr("x" * 70 + R)


# Secrets drawn from characters neither the padding nor the marks hold, so any 4 characters of one
# in the output leaked.
_SECRET = st.text(alphabet="BFGHJKLMNPQSUVWXYZ0123456789", min_size=8, max_size=48)
_PADDING = st.text(alphabet="abcdefghijklmnopqrstuvwxyz .,:;!?\x1b\x00\n\x9b", max_size=500)


@settings(max_examples=300, deadline=None)
@given(secret=_SECRET, before=_PADDING, after=_PADDING, limit=st.integers(16, 600), cut=st.integers(0, 48))
def test_no_four_characters_of_a_secret_survive_whatever_the_padding_and_the_cap(
    secret: str, before: str, after: str, limit: int, cut: int
) -> None:
    # The whole secret inside, and a second copy cut short (as a read bound would leave it) at the end.
    text = before + secret + after + secret[:cut]
    out = capped(text, limit, [secret])
    assert len(out) <= limit
    assert not any(c in out for c in "\x1b\x00\n\x9b")
    assert all(secret[i : i + 4] not in out for i in range(len(secret) - 3)), out


@settings(max_examples=300, deadline=None)
@given(secret=st.text(min_size=4, max_size=40), text=st.text(max_size=600), limit=st.integers(16, 600))
def test_any_secret_in_any_text_is_never_shown_whole_and_never_begun_at_the_end(
    secret: str, text: str, limit: int
) -> None:
    out = capped(text + secret + text, limit, [secret])
    assert len(out) <= limit
    assert secret not in out or secret in R + M  # the marks themselves hold no secret
    body = out.removesuffix(M)
    if not body.endswith(R):
        assert not any(body.endswith(secret[:k]) for k in range(SECRET_TAIL_CHARS, len(secret) + 1)), (
            f"{out!r} ends with the start of {secret!r}"
        )
