"""Wording shared by every receiver: what regressed, by how much, since when, and where to look.

Pure functions of a notification and the current time, so each receiver's exact output is testable.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from monitor.alert.model import Notification

KIND_TITLES = {
    "regression": "TTFT regression",
    "availability": "Availability incident",
    "slo": "TTFT SLO breach",
    "slo_burn": "TTFT SLO burn rate",
    "model_changed": "Served model changed",
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


def iso(moment: datetime) -> str:
    """RFC 3339 in UTC with a `Z`, whole seconds: what every receiver API accepts."""
    return moment.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


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


def markdown_sections(notification: Notification, now: datetime, *, heading: str, fact: str) -> list[str]:
    """The chat robots' markdown: `heading`, the summary (when there is one), the facts (each `fact` formatted
    with `label` and `value`, one line each) and the series link (when there is one); the caller joins and caps."""
    n = notification
    parts = [heading]
    if n.summary:
        parts.append(n.summary)
    parts.append("\n".join(fact.format(label=label, value=value) for label, value in facts(n, now)))
    if n.link:
        parts.append(f"[Open the series]({n.link})")
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
