"""Untrusted text in markdown: each dialect's escaper (pure, tables of hostile and ordinary inputs), the
exact DingTalk and WeCom payloads of an incident whose names and note are hostile, and the same
notification delivered through the outbox to purpose-built robot servers on loopback that read the
markdown the way a chat client would and refuse live markup."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.alert.dispatcher import Dispatcher
from monitor.alert.model import Notification, series_link
from monitor.alert.outbox import Outbox
from monitor.alert.receivers import KINDS
from monitor.alert.text import (
    COMMONMARK,
    DINGTALK,
    WECOM,
    MarkdownDialect,
    escape_commonmark,
    escape_dingtalk,
    escape_markdown,
    escape_wecom,
    link_destination,
    markdown_sections,
)
from monitor.alert.transport import Transport
from monitor.config.models import Config
from monitor.store.models import SeriesRow, table_of
from monitor.triage.service import Triage
from tests.support.alert_fixtures import (
    INCIDENT,
    T0,
    Loopback,
    Received,
    Reply,
    alerts,
    notification,
    outbox_rows,
    receiver,
    store_incident,
)
from tests.support.store_fixtures import Backend

pytest_plugins = ("tests.support.store_fixtures", "tests.support.alert_fixtures")

NOW = T0 + timedelta(minutes=30)
EVIL_TARGET = "<svg onload=alert(1)>"
EVIL_MODEL = "![x](http://evil.example/x.png)"
EVIL_BY = "mallory <@all>"
# What `incidents resolve --note` lets through (one line, no control characters), and a newline besides.
EVIL_NOTE = "[x](http://evil.example) **now** `rm -rf` | a\n# forged"
BASE_URL = "https://grafana.example.com/d/ttft"

PAGE_LINE = "[PAGE] TTFT regression on qwen3-8b / short @ fra-dc1"
# A dialect that renders no HTML: `<` is backslash-escaped there, not written as an entity.
NO_HTML = MarkdownDialect("no-html", html=False, lists=True, images=True, strikethrough=False, tables=False)


# ---------------------------------------------------------------- the escapers


@pytest.mark.parametrize(
    ("text", "dingtalk", "wecom", "commonmark"),
    [
        # A link's text hiding where it goes: the `](` that would close it is broken.
        ("[x](http://evil.example)", r"[x\]\(http://evil.example)", r"[x\]\(http://evil.example)", None),
        ("[x] (http://evil.example)", r"[x\] (http://evil.example)", None, None),  # Markdown.pl's spacing
        ("[x][ref]", r"[x\][ref]", None, None),
        # An image fetched from elsewhere (WeCom's `markdown` shows no images; the link is broken all the same).
        ("![img](http://evil/x.png)", r"\![img\]\(http://evil/x.png)", r"![img\]\(http://evil/x.png)", None),
        # HTML, an autolink, a WeCom mention: entities, because these dialects render HTML.
        ("<svg onload=alert(1)>", "&lt;svg onload=alert(1)&gt;", None, None),
        ("<http://evil.example>", "&lt;http://evil.example&gt;", None, None),
        ("<@all>", "&lt;@all&gt;", None, None),
        ("&lt;b&gt; &#60;", "&amp;lt;b&amp;gt; &amp;#60;", None, None),
        # Emphasis, code, strikethrough.
        ("**bold**", r"\*\*bold\*\*", None, None),
        ("_it_ __init__", r"\_it\_ \_\_init\_\_", None, None),
        ("`rm -rf /`", r"\`rm -rf /\`", None, None),
        ("~~gone~~", "~~gone~~", None, r"\~\~gone\~\~"),  # strikethrough is GitHub's, not the robots'
        (r"C:\temp", r"C:\\temp", None, None),
        # A one-line field stays on one line: no new line to open a heading, a quote or a fake fact.
        ("up\ndown", "up down", None, None),
        ("x\r\n\r\n# y", "x # y", None, None),
        ("a\u2028b\u2029c\x85d\x0be", "a b c d e", None, None),
        # Ordinary names and the messages' own wording read as they are.
        ("qwen3-8b", "qwen3-8b", None, None),
        ("gpt-4o-mini", "gpt-4o-mini", None, None),
        ("Qwen/Qwen3-8B on vllm", "Qwen/Qwen3-8B on vllm", None, None),
        ("timeout_connect", "timeout_connect", None, None),
        ("1,234 ms vs 410 ms baseline (3.01x, +824 ms)", "1,234 ms vs 410 ms baseline (3.01x, +824 ms)", None, None),
        (PAGE_LINE, PAGE_LINE, None, None),
        ("AT&T, p50 - 2 s, #3, a + b, 1. x, {k}", "AT&T, p50 - 2 s, #3, a + b, 1. x, {k}", None, None),
        ("a | b", "a | b", None, None),  # a pipe means something only in a table cell
    ],
)
def test_each_dialect_escapes_what_it_would_read_as_markup_and_nothing_else(
    text: str, dingtalk: str, wecom: str | None, commonmark: str | None
) -> None:
    # None: the same as DingTalk's.
    assert escape_dingtalk(text) == dingtalk
    assert escape_wecom(text) == (dingtalk if wecom is None else wecom)
    assert escape_commonmark(text) == (dingtalk if commonmark is None else commonmark)


@pytest.mark.parametrize(
    ("text", "dingtalk", "wecom"),
    [
        ("# forged heading", r"\# forged heading", r"\# forged heading"),
        ("> forged quote", "&gt; forged quote", "&gt; forged quote"),
        ("- forged item", r"\- forged item", "- forged item"),  # WeCom's `markdown` has no lists
        ("+ forged item", r"\+ forged item", "+ forged item"),
        ("* forged item", r"\* forged item", r"\* forged item"),
        ("12. forged item", r"12\. forged item", "12. forged item"),
        ("3) forged item", r"3\) forged item", "3) forged item"),
        ("[ref]: http://evil.example", r"\[ref]: http://evil.example", r"\[ref]: http://evil.example"),
        ("    indented code", "indented code", "indented code"),
        ("---", r"\---", "---"),
        # Only the start is a line's start: the rest reads as it is.
        ("qwen3-8b - 2 # 3 > 1", "qwen3-8b - 2 # 3 &gt; 1", "qwen3-8b - 2 # 3 &gt; 1"),
        ("Resolved by hand by alice: rolled back vLLM", "Resolved by hand by alice: rolled back vLLM", None),
    ],
)
def test_text_that_begins_a_line_cannot_open_a_heading_quote_list_or_code_block(
    text: str, dingtalk: str, wecom: str | None
) -> None:
    assert escape_dingtalk(text, line_start=True) == dingtalk
    assert escape_wecom(text, line_start=True) == (dingtalk if wecom is None else wecom)


@pytest.mark.parametrize(
    ("text", "cell"),
    [
        ("a|b", r"a\|b"),
        ("![x](http://evil/x.png)", r"\![x\]\(http://evil/x.png)"),
        ("<img src=x onerror=alert(1)>", "&lt;img src=x onerror=alert(1)&gt;"),
        ("two\nlines", "two lines"),
        ("qwen3-8b", "qwen3-8b"),
    ],
)
def test_a_table_cell_escapes_its_pipes_too(text: str, cell: str) -> None:
    assert escape_commonmark(text, table_cell=True) == cell


def test_a_dialect_without_html_backslash_escapes_angle_brackets_instead() -> None:
    assert escape_markdown("<http://evil.example> & <b>", NO_HTML) == r"\<http://evil.example> & \<b>"
    assert escape_markdown("> quote", NO_HTML, line_start=True) == r"\> quote"


@pytest.mark.parametrize(
    ("url", "safe"),
    [
        (series_link(BASE_URL, target=EVIL_TARGET, prompt="short", location="fra-dc1") or "", None),
        ("https://grafana.example.com/d/x (copy)?a=<b>", "https://grafana.example.com/d/x%20%28copy%29?a=%3Cb%3E"),
    ],
)
def test_a_link_destination_cannot_be_ended_early(url: str, safe: str | None) -> None:
    # A series link encodes its names already (None: unchanged); a base URL's own characters are encoded here.
    assert link_destination(url) == (url if safe is None else safe)
    assert not re.search(r"[()<> ]", link_destination(url))


def _escaped(text: str, at: int) -> bool:
    """Whether the character at `at` follows an odd number of backslashes."""
    count = 0
    while at - count - 1 >= 0 and text[at - count - 1] == "\\":
        count += 1
    return count % 2 == 1


def live_markup(text: str) -> list[str]:
    """What a CommonMark-style renderer would read as markup in text that should have none: raw HTML
    (any `<` or `>` at all), a link or image closing `](` / `] (` / `][`, emphasis or code markers (`_`
    at a word's edge), a line break. Empty when the text reads literally. Written from the CommonMark
    rules, independently of monitor.alert.text."""
    found = [f"{char!r} at {i}" for i, char in enumerate(text) if char in "<>\n\r"]
    found += [m.group() for m in re.finditer(r"\][ \t]*[(\[]", text) if not _escaped(text, m.start())]
    found += [f"{char!r} at {i}" for i, char in enumerate(text) if char in "*`" and not _escaped(text, i)]
    found += [
        f"'_' at {i}"
        for i, char in enumerate(text)
        if char == "_" and not _escaped(text, i) and not (text[i - 1 : i].isalnum() and text[i + 1 : i + 2].isalnum())
    ]
    return found


HOSTILE_ALPHABET = "[]()!<>&;*_`\\#-+.|~:@ \n\r\t\u2028ablt1"


@pytest.mark.parametrize("dialect", [DINGTALK, WECOM, COMMONMARK], ids=lambda d: d.name)
@settings(deadline=None)  # two shared cores: a slow example is not a failure
@given(text=st.text(alphabet=HOSTILE_ALPHABET, max_size=40))
def test_no_text_survives_escaping_as_live_markup(dialect: MarkdownDialect, text: str) -> None:
    for line_start in (False, True):
        escaped = escape_markdown(text, dialect, line_start=line_start)
        assert live_markup(escaped) == [], (text, escaped)
        # And nothing is lost: taking the escapes back out gives the text, on one line.
        plain = re.sub(r"\\(.)", r"\1", escaped).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
        expected = re.sub(r"[\r\n\u2028]+", " ", text)
        assert plain == (expected.lstrip() if line_start else expected), (text, escaped)


# ---------------------------------------------------------------- the robots' payloads


def hostile(**changes: object) -> Notification:
    """An incident resolved by hand (the wording `Triage.resolve` uses) whose target, model, resolver and
    note are hostile."""
    base = notification(
        target=EVIL_TARGET,
        model=EVIL_MODEL,
        state="resolved",
        resolved_at=NOW,
        observed_ms=None,
        ratio=None,
        summary=f"Resolved by hand by {EVIL_BY}: {EVIL_NOTE}",
        link=series_link(BASE_URL, target=EVIL_TARGET, prompt="short", location="fra-dc1"),
    )
    return base.with_changes(**changes)


EVIL_LINK = "https://grafana.example.com/d/ttft?var-target=%3Csvg+onload%3Dalert%281%29%3E&var-prompt=short&var-location=fra-dc1"
HEADLINE = "[RESOLVED] TTFT regression on &lt;svg onload=alert(1)&gt; / short @ fra-dc1"
SUMMARY = r"Resolved by hand by mallory &lt;@all&gt;: [x\]\(http://evil.example) \*\*now\*\* \`rm -rf\` | a # forged"
DINGTALK_FACTS = [
    ("Series", "&lt;svg onload=alert(1)&gt; / short @ fra-dc1"),
    ("Model", r"\![x\]\(http://evil.example/x.png) on vllm"),
    ("Job", "every-5m"),
    ("Open", "2026-03-02 09:00 UTC to 2026-03-02 09:30 UTC (30m)"),
    ("Incident", str(INCIDENT)),
]
WECOM_FACTS = [(label, value.lstrip("\\") if label == "Model" else value) for label, value in DINGTALK_FACTS]
DINGTALK_TEXT = (
    f"### {HEADLINE}\n\n{SUMMARY}\n\n"
    + "\n".join(f"- **{label}:** {value}" for label, value in DINGTALK_FACTS)
    + f"\n\n[Open the series]({EVIL_LINK})"
)
WECOM_CONTENT = (
    f'## <font color="info">{HEADLINE}</font>\n{SUMMARY}\n'
    + "\n".join(f"> **{label}:** {value}" for label, value in WECOM_FACTS)
    + f"\n[Open the series]({EVIL_LINK})"
)


def build_body(type_: str, n: Notification) -> dict[str, Any]:
    request = KINDS[type_].build(n, receiver(type_, "https://robot.example.com/send?key=k"), NOW)
    assert request is not None
    body: dict[str, Any] = json.loads(request.body)
    return body


def own_markup_removed(text: str, facts: list[tuple[str, str]], *, prefix: str) -> list[str]:
    """The untrusted pieces of a robot message: its lines without the receiver's own markup (heading,
    fact labels, font tag, the series link), each to be read as literal text."""
    lines = [line for line in text.split("\n") if line]
    assert lines[-1] == f"[Open the series]({EVIL_LINK})"
    pieces = [re.sub(r'^#+ (<font color="\w+">)?|</font>$', "", lines[0]), lines[1]]
    for line, (label, _value) in zip(lines[2:-1], facts, strict=True):
        own = f"{prefix} **{label}:** "
        assert line.startswith(own), line
        pieces.append(line.removeprefix(own))
    return pieces


def test_dingtalk_shows_hostile_names_and_notes_as_text() -> None:
    body = build_body("dingtalk", hostile())
    assert body == {
        "msgtype": "markdown",
        # The title is the chat list's plain-text preview: not markdown, so as it is.
        "markdown": {
            "title": "[RESOLVED] TTFT regression on <svg onload=alert(1)> / short @ f…",
            "text": DINGTALK_TEXT,
        },
    }
    for piece in own_markup_removed(body["markdown"]["text"], DINGTALK_FACTS, prefix="-"):
        assert live_markup(piece) == [], piece


def test_wecom_shows_hostile_names_and_notes_as_text() -> None:
    body = build_body("wecom", hostile())
    assert body == {"msgtype": "markdown", "markdown": {"content": WECOM_CONTENT}}
    for piece in own_markup_removed(body["markdown"]["content"], WECOM_FACTS, prefix=">"):
        assert live_markup(piece) == [], piece


@pytest.mark.parametrize("text", [EVIL_TARGET, EVIL_MODEL, EVIL_NOTE, "**bold**", "_it_", "`code`", "[a] [b]"])
def test_the_reading_the_robot_servers_use_finds_the_markup_it_looks_for(text: str) -> None:
    # The control for the checks above and below: unescaped, each of these is live markup.
    assert live_markup(text) != []


@pytest.mark.parametrize(("type_", "prefix", "facts"), [("dingtalk", "-", DINGTALK_FACTS), ("wecom", ">", WECOM_FACTS)])
def test_the_same_message_built_without_escaping_is_full_of_live_markup(
    type_: str, prefix: str, facts: list[tuple[str, str]]
) -> None:
    # What the robots were sent before: `markdown_sections` with no escaping at all.
    def verbatim(text: str, *, line_start: bool = False) -> str:
        return text

    heading = "### {headline}" if type_ == "dingtalk" else '## <font color="info">{headline}</font>'
    one_line_note = hostile(summary=f"Resolved by hand by {EVIL_BY}: {EVIL_NOTE.replace(chr(10), ' ')}")
    parts = markdown_sections(
        one_line_note, NOW, heading=heading, fact=prefix + " **{label}:** {value}", escape=verbatim
    )
    text = "\n".join(parts)
    pieces = own_markup_removed(text, facts, prefix=prefix)
    assert [bool(live_markup(piece)) for piece in pieces] == [True, True, True, True, False, False, False]


@pytest.mark.parametrize("type_", ["dingtalk", "wecom"])
def test_ordinary_names_arrive_without_a_single_escape(type_: str) -> None:
    for target, model in (("qwen3-8b", "Qwen/Qwen3-8B"), ("gpt-4o-mini", "gpt-4o-mini")):
        n = notification(target=target, model=model, summary="Resolved by hand by alice: rolled back vLLM 0.6.3")
        body = build_body(type_, n)
        text = body["markdown"].get("text") or body["markdown"]["content"]
        assert "\\" not in text and "&" not in text.replace("&var-", ""), text
        assert f"{target} / short @ fra-dc1" in text and f"{model} on vllm" in text


# ---------------------------------------------------------------- over loopback, through the outbox


async def test_a_hand_resolve_with_a_hostile_note_reaches_dingtalk_and_wecom_as_text(
    alert_backend: Backend, loopback: Loopback
) -> None:
    """The real path: the incident and its first notice in the database, `Triage.resolve` with a hostile
    resolver and note, the dispatcher sending to both robots on loopback."""
    checked: dict[str, list[str]] = {}

    def refuse_live_markup(
        path: str,
        text_of: Callable[[dict[str, Any]], str],
        facts: list[tuple[str, str]],
        prefix: str,
    ) -> None:
        """The robot endpoint at `path` reads the markdown as its client would and refuses (401) a message
        with live markup where there should be text."""

        def check(item: Received) -> str | None:
            pieces = own_markup_removed(text_of(item.json()), facts, prefix=prefix)
            problems = [found for piece in pieces for found in live_markup(piece)]
            checked[path] = pieces
            return f"live markup: {problems}" if problems else None

        loopback.verify(path, check)

    refuse_live_markup("/robot/send", lambda body: body["markdown"]["text"], DINGTALK_FACTS, "-")
    refuse_live_markup("/cgi-bin/webhook/send", lambda body: body["markdown"]["content"], WECOM_FACTS, ">")
    loopback.script("/robot/send", Reply(200, {"errcode": 0, "errmsg": "ok"}))
    loopback.script("/cgi-bin/webhook/send", Reply(200, {"errcode": 0, "errmsg": "ok"}))
    config = alerts(
        {
            "ding": receiver("dingtalk", loopback.url("/robot/send?access_token=tok")),
            "wecom": receiver("wecom", loopback.url("/cgi-bin/webhook/send?key=k")),
        },
        base_url=BASE_URL,
    )
    engine: AsyncEngine = alert_backend.engine()
    try:
        incident = await store_incident(engine, target=EVIL_TARGET)
        async with engine.begin() as connection:
            await connection.execute(sa.update(table_of(SeriesRow)).values(model=EVIL_MODEL))
        firing = hostile(incident_id=incident, state="firing", resolved_at=None, summary="Median TTFT 3.01x.")
        await Outbox(engine, config).notify(firing.with_changes(observed_ms=1234.0, ratio=3.01), now=T0)
        triage = Triage(engine, Config().model_copy(update={"alerts": config}), clock=lambda: NOW)
        done = await triage.resolve(str(incident), by=EVIL_BY, note=EVIL_NOTE)
        assert sorted(e.receiver for e in done.enqueued) == ["ding", "wecom"]
        async with Transport() as transport:
            dispatcher = Dispatcher(engine, config, transport, rng=random.Random(7), poll_interval_s=0.05)
            await dispatcher.dispatch_due(NOW)
        rows = await outbox_rows(engine)
    finally:
        await engine.dispose()
    (ding,) = loopback.at("/robot/send")
    (wecom,) = loopback.at("/cgi-bin/webhook/send")
    expected_id = str(incident)
    assert ding.json()["markdown"]["text"] == DINGTALK_TEXT.replace(str(INCIDENT), expected_id)
    assert wecom.json()["markdown"]["content"] == WECOM_CONTENT.replace(str(INCIDENT), expected_id)
    assert set(checked) == {"/robot/send", "/cgi-bin/webhook/send"}
    assert sorted((r.receiver, r.event, r.status) for r in rows if r.event == "resolved") == [
        ("ding", "resolved", "sent"),
        ("wecom", "resolved", "sent"),
    ]
