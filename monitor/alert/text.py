"""Wording shared by every receiver: what regressed, by how much, since when, and where to look.

Pure functions of a notification and the current time, so each receiver's exact output is testable.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from monitor.alert.model import Notification
from monitor.timefmt import iso

KIND_TITLES = {
    "regression": "TTFT regression",
    "availability": "Availability incident",
    "slo": "TTFT SLO breach",
    "slo_burn": "TTFT SLO burn rate",
    "model_changed": "Model changed",
    "tokens_jump": "Tokens per probe jumped",
    "cache_stopped": "Prompt cache stopped working",
    "test": "Test notification",
}


def kind_title(kind: str) -> str:
    return KIND_TITLES.get(kind, kind.replace("_", " ").capitalize())


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    if abs(value) < 10:
        return f"{value:.1f} ms"
    return f"{value:,.0f} ms"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def fmt_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def annotation_text(marks: Sequence[tuple[str, datetime]]) -> str:
    """`after annotation 'vLLM upgraded' at 03:02 UTC` (several: oldest first, comma-separated)."""
    if not marks:
        return ""
    items = ", ".join(f"'{text}' at {at.astimezone(UTC).strftime('%H:%M')} UTC" for text, at in marks)
    return f"after annotation{'s' if len(marks) > 1 else ''} {items}"


def fmt_duration(seconds: float) -> str:
    """`45s`, `12m`, `1h 20m`, `2d 3h`."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m"
    return f"{secs}s"


def status_tag(notification: Notification) -> str:
    if notification.state == "resolved":
        return "RESOLVED"
    if notification.state == "info":
        return "INFO"
    return notification.severity.upper()


def headline(notification: Notification) -> str:
    """`[PAGE] TTFT regression on qwen3-8b / short @ fra-dc1: 1,234 ms vs 410 ms baseline (3.01x)`."""
    if notification.grouped:
        text = f"[{status_tag(notification)}] {kind_title(notification.kind)} on {notification.group}"
        if notification.state == "firing" and notification.repeat:
            text += " (still open)"
        return text
    text = f"[{status_tag(notification)}] {kind_title(notification.kind)} on {notification.series}"
    short = short_measurement(notification)
    if short:
        text += f": {short}"
    if notification.state == "firing" and notification.repeat:
        text += " (still open)"
    return text


def _reference_name(notification: Notification) -> str:
    return "objective" if notification.kind == "slo" else "baseline"


def short_measurement(notification: Notification) -> str:
    n = notification
    if n.kind == "availability" and n.state != "resolved":
        return f"failing ({n.error_class})" if n.error_class else "failing"
    if n.kind == "slo_burn":  # ratio: the error budget's burn rate; the summary has the windows
        if n.state == "resolved":
            return f"back under, peaked at {fmt_ratio(n.peak_ratio)}" if n.peak_ratio is not None else "back under"
        return f"burning the error budget {fmt_ratio(n.ratio)}" if n.ratio is not None else ""
    if n.kind == "cache_stopped":  # ratio: the cache speed-up over cold; the summary has the figures
        verb = "works again, speed-up" if n.state == "resolved" else "speed-up over cold"
        return f"{verb} {fmt_ratio(n.ratio)}" if n.ratio is not None else ""
    if n.observed_ms is None:
        return ""
    if n.baseline_ms is None:
        return fmt_ms(n.observed_ms)
    if n.state == "resolved" and n.peak_ratio is not None:
        # What mattered is how bad it got, not the ratio at the moment it cleared.
        return f"peaked at {fmt_ratio(n.peak_ratio)} {_reference_name(n)}, back to {fmt_ratio(n.ratio)}"
    text = f"{fmt_ms(n.observed_ms)} vs {fmt_ms(n.baseline_ms)} {_reference_name(n)}"
    return f"{text} ({fmt_ratio(n.ratio)})" if n.ratio is not None else text


def measurement(notification: Notification) -> str | None:
    """The TTFT line: observed against baseline, the ratio and the difference."""
    n = notification
    if n.observed_ms is None:
        return None
    if n.baseline_ms is None:
        return f"{fmt_ms(n.observed_ms)} observed"
    delta = n.observed_ms - n.baseline_ms
    sign = "+" if delta >= 0 else "-"
    verb = "back to " if n.state == "resolved" else ""
    extras = [fmt_ratio(n.ratio)] if n.ratio is not None else []
    extras.append(f"{sign}{fmt_ms(abs(delta))}")
    return f"{verb}{fmt_ms(n.observed_ms)} vs {fmt_ms(n.baseline_ms)} {_reference_name(n)} ({', '.join(extras)})"


def facts(notification: Notification, now: datetime) -> list[tuple[str, str]]:
    """(label, value) pairs every receiver shows, in this order."""
    n = notification
    if n.grouped:
        out = [("Members", ", ".join(n.members)), ("Provider", n.provider), ("First", n.series)]
    else:
        out = [("Series", n.series), ("Model", f"{n.model} on {n.provider}"), ("Job", n.job)]
    ttft = measurement(n)
    if ttft is not None:
        out.append(("TTFT", ttft))
    if n.attribution:
        out.append(("Where", n.attribution))
    if n.annotation:
        out.append(("Change", n.annotation))
    if n.peak_ratio is not None and n.peak_at is not None and n.kind != "availability":
        out.append(("Peak", f"{fmt_ratio(n.peak_ratio)} at {fmt_time(n.peak_at)}"))
    if n.error_class:
        out.append(("Error class", n.error_class))
    if n.state == "resolved":
        end = n.resolved_at or now
        lasted = fmt_duration((end - n.since).total_seconds())
        out.append(("Open", f"{fmt_time(n.since)} to {fmt_time(end)} ({lasted})"))
    else:
        out.append(("Since", f"{fmt_time(n.since)} ({fmt_duration((now - n.since).total_seconds())} ago)"))
    out.append(("Incident", str(n.incident_id)))
    return out


# ---------------------------------------------------------------- markdown escaping
#
# Names, notes and server text are untrusted: a model named `![x](http://evil/x.png)` or a note holding
# `[x](http://evil.example)` must arrive as the characters typed, not as an image or a disguised link.
# Each renderer gives meaning to a different set of characters, so each has its own escaper; all escape
# only where their dialect would read markup, so `qwen3-8b` and `gpt-4o-mini` still read naturally.


@dataclass(frozen=True, slots=True)
class MarkdownDialect:
    """What one markdown renderer reads as markup, beyond what every one of them does (backslash escapes,
    `` ` `` code, `*` and `_` emphasis, `[text](url)` links, `#` headings and `>` quotes at a line's start)."""

    name: str
    html: bool  # inline HTML is rendered: `<`, `>` and an entity-like `&` are written as entities
    lists: bool  # `-`, `+` or `1.` at a line's start opens a list
    images: bool  # `![alt](src)` fetches and shows an image
    strikethrough: bool  # `~~text~~`
    tables: bool  # `|` separates table cells


# DingTalk's robot markdown: headings, quotes, bold, italics, links, images, both kinds of list; the PC
# client renders inline HTML too (`<font color>`).
DINGTALK = MarkdownDialect("dingtalk", html=True, lists=True, images=True, strikethrough=False, tables=False)
# WeCom's `markdown` message: headings, bold, links, inline code, quotes, `<font color>` and `<@userid>`
# mentions; no lists, images or tables (those are `markdown_v2`, which we do not send).
WECOM = MarkdownDialect("wecom", html=True, lists=False, images=False, strikethrough=False, tables=False)
# The Markdown report: CommonMark with GitHub's tables and strikethrough, read where HTML is rendered.
COMMONMARK = MarkdownDialect("commonmark", html=True, lists=True, images=True, strikethrough=True, tables=True)

# Every line break a renderer might honour; one-line fields collapse them so a value cannot start a
# line of its own (a heading, a quote, a list item, a fake fact).
_LINE_BREAKS = re.compile(r"[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+")
_ENTITY = re.compile(r"&(?:#[0-9]{1,8}|#[xX][0-9a-fA-F]{1,8}|[A-Za-z][A-Za-z0-9]{1,31});")
_ORDERED_MARKER = re.compile(r"[0-9]{1,9}[.)]")
# `]` closes a link's text only when a destination `(` or a reference `[` follows (Markdown.pl allowed
# spaces between them); a lone `[PAGE]` is no link and stays as it reads.
_LINK_CLOSE = re.compile(r"\][ \t]*[(\[]")
_ALWAYS = frozenset("\\`*")
_HTML_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def one_line(text: str) -> str:
    """`text` with every run of line breaks made one space."""
    return _LINE_BREAKS.sub(" ", text)


def escape_markdown(text: str, dialect: MarkdownDialect, *, line_start: bool = False, table_cell: bool = False) -> str:
    """`text` on one line, reading literally in `dialect`. `line_start`: the text begins a line, where
    `#`, `>`, `[` (a link definition), list markers and indentation mean something; `table_cell`: it sits
    in a table cell. Characters are escaped only where `dialect` would read them as markup: `-` only at a
    line's start, `_` only at a word's edge, `&` only before an entity, so `qwen3-8b` reads as it is."""
    text = one_line(text)
    if line_start:
        text = text.lstrip()  # four spaces of indentation would make a code block
    ordered = _ORDERED_MARKER.match(text) if line_start and dialect.lists else None
    out: list[str] = []
    for i, char in enumerate(text):
        before = text[i - 1] if i else ""
        after = text[i + 1] if i + 1 < len(text) else ""
        first = i == 0 and line_start
        if char in _ALWAYS:
            out.append("\\" + char)
        elif char == "_":
            # Emphasis opens and closes only at a word's edge: `timeout_connect` stays as it is.
            out.append(char if before.isalnum() and after.isalnum() else "\\_")
        elif char == "]":
            out.append("\\]" if _LINK_CLOSE.match(text, i) else char)
        elif char == "(":
            out.append("\\(" if before == "]" else char)  # and for renderers that ignore `\]`
        elif char == "[":
            out.append("\\[" if first else char)
        elif char == "!":
            out.append("\\!" if after == "[" and dialect.images else char)
        elif char in "<>&" and dialect.html:
            live = char != "&" or _ENTITY.match(text, i) is not None  # `&` means something only as `&lt;`
            out.append(_HTML_ENTITIES[char] if live else char)
        elif char == "<":
            out.append("\\<")  # an autolink, `<http://...>`
        elif char == ">" or char == "#" or (char in "-+" and dialect.lists):
            out.append("\\" + char if first else char)
        elif ordered is not None and i == ordered.end() - 1:
            out.append("\\" + char)  # `1.` or `1)` would open an ordered list
        elif char == "~" and dialect.strikethrough:
            out.append("\\~")
        elif char == "|" and table_cell and dialect.tables:
            out.append("\\|")
        else:
            out.append(char)
    return "".join(out)


def escape_dingtalk(text: str, *, line_start: bool = False) -> str:
    """Untrusted text for a DingTalk markdown message."""
    return escape_markdown(text, DINGTALK, line_start=line_start)


def escape_wecom(text: str, *, line_start: bool = False) -> str:
    """Untrusted text for a WeCom `markdown` message."""
    return escape_markdown(text, WECOM, line_start=line_start)


def escape_commonmark(text: str, *, line_start: bool = False, table_cell: bool = False) -> str:
    """Untrusted text for a CommonMark / GitHub document (the Markdown report)."""
    return escape_markdown(text, COMMONMARK, line_start=line_start, table_cell=table_cell)


def link_destination(url: str) -> str:
    """`url` safe as a markdown link's `(destination)`: the characters that would end it early are
    percent-encoded (series links already encode their query; this guards a base URL's own)."""
    return (
        one_line(url)
        .replace(" ", "%20")
        .replace("(", "%28")
        .replace(")", "%29")
        .replace("<", "%3C")
        .replace(">", "%3E")
    )


class MarkdownEscaper(Protocol):
    def __call__(self, text: str, *, line_start: bool = False) -> str: ...


def markdown_sections(
    notification: Notification, now: datetime, *, heading: str, fact: str, escape: MarkdownEscaper
) -> list[str]:
    """The chat robots' markdown: `heading` (formatted with the escaped `headline`), the summary (when there
    is one), the facts (each `fact` formatted with `label` and the escaped `value`, one line each) and the
    series link (when there is one); the caller joins and caps. Only the text is escaped, with `escape`,
    never the markup the receiver writes around it."""
    n = notification
    parts = [heading.format(headline=escape(headline(n)))]
    if n.summary:
        parts.append(escape(n.summary, line_start=True))
    parts.append("\n".join(fact.format(label=label, value=escape(value)) for label, value in facts(n, now)))
    if n.link:
        parts.append(f"[Open the series]({link_destination(n.link)})")
    return parts


def series_labels(notification: Notification) -> dict[str, str]:
    """The labels naming the series, in the order every structured receiver sends them."""
    n = notification
    return {
        "target": n.target,
        "model": n.model,
        "provider": n.provider,
        "prompt": n.prompt,
        "location": n.location,
        "job": n.job,
    }


def measurement_fields(notification: Notification) -> dict[str, float | str | None]:
    """What the detector measured, as the log line and the webhook's JSON both send it."""
    n = notification
    return {"baseline_ms": n.baseline_ms, "observed_ms": n.observed_ms, "ratio": n.ratio, "error_class": n.error_class}


def window_fields(notification: Notification) -> dict[str, str | None]:
    """When it began and ended, ISO 8601 to the second (`resolved_at` null while open)."""
    n = notification
    resolved_at = None if n.resolved_at is None else iso(n.resolved_at, whole_seconds=True)
    return {"since": iso(n.since, whole_seconds=True), "resolved_at": resolved_at}


def lines(notification: Notification, now: datetime) -> list[str]:
    """The notification as plain text lines: headline, the detector's summary, facts, link."""
    out = [headline(notification)]
    if notification.summary:
        out.append(notification.summary)
    out += [f"{label}: {value}" for label, value in facts(notification, now)]
    if notification.link:
        out.append(f"Link: {notification.link}")
    return out


def plain_text(notification: Notification, now: datetime) -> str:
    return "\n".join(lines(notification, now))


def truncate(text: str, limit: int) -> str:
    """At most `limit` characters, marking a cut with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def truncate_bytes(text: str, limit: int) -> str:
    """At most `limit` UTF-8 bytes (WeCom and DingTalk count bytes), never splitting a character."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors="ignore") + "…"
