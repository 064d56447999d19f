"""`ttft-monitor report` and `probe --report`: the compare view as a document.

The numbers come from `queries.compare_values`, the function behind the compare page and API. HTML
is one self-contained file: the data as JSON, uPlot and the page's own rendering code inline, so it
opens from disk with no network; Markdown carries the tables; JSON is the API's document.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any, cast

from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.alert.text import escape_commonmark
from monitor.config.models import Config
from monitor.probe.result import Sample
from monitor.timefmt import iso
from monitor.web import queries
from monitor.web.costs import CostBook

FORMATS = ("html", "md", "json")


@dataclass(frozen=True, slots=True)
class ReportFilters:
    """Which stored series a report covers: the names asked for (none: every one)."""

    targets: Sequence[str] = ()
    prompts: Sequence[str] = ()
    locations: Sequence[str] = ()


async def report_from_store(
    engine: AsyncEngine, *, since: timedelta, now: datetime, filters: ReportFilters
) -> queries.CompareDocument:
    f = filters
    return await queries.compare(
        engine, start=now - since, end=now, targets=f.targets, prompts=f.prompts, locations=f.locations
    )


async def report_from_database(
    url: str, *, since: timedelta, now: datetime, filters: ReportFilters, config: Config | None = None
) -> queries.CompareDocument:
    """`report_from_store` over an engine of its own (`ttft-monitor report`); StoreError (SchemaBehind names
    `db upgrade`) or the driver's error when the database cannot be read. With `config`, the document
    carries what probing each of its cells costs a month (`costs`)."""
    from monitor.store.engine import create_engine
    from monitor.store.schema import ensure_current

    engine = create_engine(url)
    try:
        await ensure_current(engine)  # a schema behind or missing names `db upgrade`, not a missing table
        data = await report_from_store(engine, since=since, now=now, filters=filters)
        if config is not None:
            book = await CostBook(config, engine).get()
            data["costs"] = [
                {"target": c["target"], "prompt": c["prompt"], **found.to_json()}
                for c in data["cells"]
                if (found := book.get((c["target"], c["prompt"]))) is not None
            ]
        return data
    finally:
        await engine.dispose()


@dataclass(frozen=True, slots=True)
class UnknownNames:
    """Filter values no stored series has: `kind` is target, prompt or location."""

    kind: str
    unknown: list[str]
    stored: list[str]


def unknown_filter(data: queries.CompareDocument, filters: ReportFilters) -> UnknownNames | None:
    """The first filter of `data` asking for a name no stored series has, else None.

    Such a name is a typo, not an empty window: the command says so rather than print an empty report."""
    available = data["available"]
    for kind, asked, stored in (
        ("target", filters.targets, available["targets"]),
        ("prompt", filters.prompts, available["prompts"]),
        ("location", filters.locations, available["locations"]),
    ):
        unknown = [name for name in asked if name not in stored]
        if unknown:
            return UnknownNames(kind=kind, unknown=unknown, stored=stored)
    return None


def report_from_samples(samples: Iterable[Sample], *, now: datetime | None = None) -> queries.CompareDocument:
    """The same document for an ad-hoc probe run (no database): its successful measured samples."""
    kept = [s for s in samples if not s.warmup and s.error is None and s.ttft_ms is not None]
    moments = [s.sent_at for s in kept if s.sent_at is not None]
    end = now or datetime.now(UTC)
    rows = [(s.target, s.model, s.prompt, float(s.ttft_ms or 0.0), s.prompt_tokens) for s in kept]
    document: dict[str, Any] = {
        "start": iso(min(moments)) if moments else iso(end),
        "end": iso(max(moments)) if moments else iso(end),
        "filters": {"targets": [], "prompts": [], "locations": []},
        "available": {
            "targets": sorted({r[0] for r in rows}),
            "prompts": sorted({r[2] for r in rows}),
            "locations": [],
        },
        **queries.compare_values(rows),
    }
    return cast(queries.CompareDocument, document)


def render(data: queries.CompareDocument, output_format: str, *, title: str = "TTFT comparison") -> str:
    if output_format == "json":
        return json.dumps(data, indent=2) + "\n"
    if output_format == "md":
        return render_markdown(data, title=title)
    if output_format == "html":
        return render_html(data, title=title)
    raise ValueError(f"unknown report format {output_format!r}; use one of {', '.join(FORMATS)}")


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _cell(text: Any) -> str:
    """A name in a table cell: on one line, its pipes escaped, no markdown or HTML of its own (a model
    named `![x](http://...)` is those characters, not an image fetched from there)."""
    return escape_commonmark(str(text), table_cell=True)


def _text(text: Any) -> str:
    """A name in running text (a list item, the title): no markdown or HTML of its own."""
    return escape_commonmark(str(text))


# A long range is computed from the hourly rollups (docs/api.md, "Long ranges read the hourly rollups").
HOURLY_NOTE = (
    " From the hourly rollups (the range is longer than raw samples are kept, or holds too many runs): "
    "quantiles merged across hours, intervals over hours."
)


def render_markdown(data: queries.CompareDocument, *, title: str) -> str:
    lines = [
        f"# {_text(title)}",
        "",
        f"Samples from {data['start']} to {data['end']}; medians of successful requests."
        + (HOURLY_NOTE if data.get("resolution") == "hour" else ""),
        "",
    ]
    lines += [
        "## TTFT by target and prompt (ms)",
        "",
        "| target | model | prompt | prompt tokens | n | median | 95% interval | p90 |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in data["cells"]:
        tokens = "–" if c["prompt_tokens_median"] is None else f"{c['prompt_tokens_median']:,.0f}"
        lines.append(
            f"| {_cell(c['target'])} | {_cell(c['model'])} | {_cell(c['prompt'])} | {tokens} | {c['n']} | "
            f"{_ms(c['median_ms'])} | {_ms(c['ci_low_ms'])} – {_ms(c['ci_high_ms'])} | {_ms(c['p90_ms'])} |"
        )
    lines += ["", "## Pairwise differences of medians", ""]
    for p in data["pairs"]:
        verdict = "significant" if p["significant"] else "not significant"
        lines.append(
            f"- {_text(p['prompt'])}: **{_text(p['faster'])}** is faster than **{_text(p['slower'])}** by "
            f"{_ms(p['difference_ms'])} ms (95% interval {_ms(p['ci_low_ms'])} – {_ms(p['ci_high_ms'])}), {verdict}"
        )
    lines += [
        "",
        "## Prefill slope (ms per 1,000 prompt tokens)",
        "",
        "| rank | target | model | ms / 1K tokens | intercept ms | samples |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for s in data["slopes"]:
        rank = "–" if s["rank"] is None else str(s["rank"])
        slope = _ms(s["ms_per_1k_tokens"]) if s["reason"] is None else f"n/a: {_cell(s['reason'])}"
        lines.append(
            f"| {rank} | {_cell(s['target'])} | {_cell(s['model'])} | {slope} | "
            f"{_ms(s['intercept_ms'])} | {s['points']} |"
        )
    if data.get("costs"):
        lines += [
            "",
            "## What probing costs (a month at the schedule, from the last day's probes)",
            "",
            "| target | prompt | tokens / month | cost / month |",
            "|---|---|---:|---:|",
        ]
        for c in data["costs"]:
            bound = "" if c["from_history"] else "at most "
            cost = "no prices" if c["cost_per_month"] is None else f"{bound}{c['cost_per_month']:,.2f} {c['currency']}"
            lines.append(
                f"| {_cell(c['target'])} | {_cell(c['prompt'])} | {bound}{c['tokens_per_month']:,} | {_cell(cost)} |"
            )
    if data.get("cache"):
        lines += [
            "",
            "## Prompt cache (`cache: both`: busted against warm probes)",
            "",
            "| target | prompt | busted median | warm median | speed-up | n busted / warm |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for c in data["cache"]:
            speedup = "–" if c["speedup"] is None else f"{c['speedup']:.2f}x"
            lines.append(
                f"| {_cell(c['target'])} | {_cell(c['prompt'])} | {_ms(c['cold_median_ms'])} | "
                f"{_ms(c['warm_median_ms'])} | {speedup} | {c['cold_n']} / {c['warm_n']} |"
            )
    return "\n".join(lines) + "\n"


def _static(name: str) -> str:
    return (resources.files("monitor.web") / "static" / name).read_text(encoding="utf-8")


def _inline_script(code: str) -> str:
    # A script element ends at the first "</script"; nothing inside may spell it.
    return code.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")


def render_html(data: queries.CompareDocument, *, title: str) -> str:
    # JSON in a data block: "<" escaped so no value (a target named "</script>") can end the element.
    payload = json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    boot = """
"use strict";
(() => {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const root = document.getElementById("app");
  root.append(TTFT.el("p", { class: "muted" }, `Samples from ${TTFT.when(data.start)} to ${TTFT.when(data.end)}; `
    + "medians of successful requests, 95% bootstrap intervals."
    + (data.resolution === "hour" ? HOURLY_NOTE : "")));
  TTFT_CHARTS.renderCompare(root, data, {});
  root.setAttribute("data-loaded", "1");
})();
""".replace("HOURLY_NOTE", json.dumps(HOURLY_NOTE))
    scripts = "\n".join(
        f"<script>{_inline_script(code)}</script>"
        for code in (_static("uPlot.iife.min.js"), _static("common.js"), _static("charts.js"), boot)
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<link rel="icon" href="data:,">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_static("uPlot.min.css")}
{_static("style.css")}</style>
</head>
<body>
<main id="app"><h1>{html.escape(title)}</h1></main>
<script type="application/json" id="report-data">{payload}</script>
{scripts}
</body>
</html>
"""


def write_probe_report(path: str, samples: Sequence[Sample]) -> str | None:
    """`probe --report FILE`: the format follows the extension (.md, .json, else HTML). None, or the
    one-line problem."""
    output_format = "md" if path.endswith(".md") else "json" if path.endswith(".json") else "html"
    text = render(report_from_samples(samples), output_format, title="TTFT comparison, ad-hoc probe")
    try:
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        return f"cannot write the report {path}: {exc.strerror}; choose another --report path"
    return None
