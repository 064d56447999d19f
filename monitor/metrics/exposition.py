"""The Prometheus text exposition (format 0.0.4) of a registry, byte for byte as
`prometheus_client.generate_latest` writes it, at a fifteenth of its cost for registries of many series.

`generate_latest` checks and escapes every label name of every line against the legacy name rules (two
regular expressions each), escapes every label value afresh and sorts each line's labels, after
`collect()` has built a dict and a tuple per line: at 6,000 probe series (376k lines) that took 30 s
of a loaded core, 9 s of a quiet one. Here label names are checked and sorted once per family, each
distinct label value is escaped once per rendering, and each series' labels are joined once for all
its lines (24 for a histogram). tests/unit/test_metrics_exposition.py compares both renderings.

The plain Counter, Gauge, Histogram and Summary objects of a `MonitorRegistry` are read directly (their
children and values, which prometheus_client keeps in attributes with no public accessor); anything
else, and a registry of another kind, goes through `collect()`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram, Summary
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _untyped_float

from monitor.metrics.definitions import MonitorRegistry
from monitor.metrics.lean import LeanBuckets, LeanCounter, LeanGauge, LeanHistogram, LeanSummary

# generate_latest's renaming from the OpenMetrics types to the text format's.
_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
_SUFFIXED = {"counter": "_total", "info": "_info"}
# Samples the text format has no place for in their family: written as gauge families after it.
_OPENMETRICS_ONLY = ("_created", "_gsum", "_gcount")
_KINDS: dict[type, str] = {Counter: "counter", Gauge: "gauge", Histogram: "histogram", Summary: "summary"}
_LEAN: dict[type, type] = {LeanCounter: Counter, LeanGauge: Gauge, LeanHistogram: Histogram, LeanSummary: Summary}


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _label_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def floatToGoString(value: float) -> str:
    text: str = _untyped_float(value)  # type: ignore[no-untyped-call]
    return text


def _number(value: float) -> str:
    # floatToGoString's common case without its three comparisons (repr of a finite float below 1e6).
    if type(value) is float and -1e6 < value < 1e6:
        return repr(value)
    return floatToGoString(value)


class _Lines:
    """Caches shared by every family of one rendering."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, str] = {}

    def name(self, label: str) -> str:
        escaped = self.names.get(label)
        if escaped is None:
            escaped = self.names[label] = escape_label_name(label)
        return escaped

    def labels(self, items: Iterable[tuple[str, str]]) -> str:
        """`a="1",b="2"` for (already sorted) label names and values."""
        cache = self.values
        parts = []
        for key, value in items:
            text = cache.get(value)
            if text is None:
                text = cache[value] = _label_value(value)
            parts.append(f'{self.name(key)}="{text}"')
        return ",".join(parts)

    def family(self, metric: Metric, out: list[str]) -> None:
        """Any family from `collect()`, as generate_latest writes it."""
        name, kind = metric.name, metric.type
        exposed = escape_metric_name(name + _SUFFIXED.get(kind, ""))
        doc = _help(metric.documentation)
        out.append(f"# HELP {exposed} {doc}\n# TYPE {exposed} {_TYPES.get(kind, kind)}\n")
        extra: dict[str, list[str]] = {}
        for sample in metric.samples:
            labelstr = "{" + self.labels(sorted(sample.labels.items())) + "}" if sample.labels else ""
            line = f"{escape_metric_name(sample.name)}{labelstr} {floatToGoString(sample.value)}"
            if sample.timestamp is not None:
                line += f" {int(float(sample.timestamp) * 1000):d}"
            if any(sample.name == name + suffix for suffix in _OPENMETRICS_ONLY):
                extra.setdefault(sample.name, []).append(line + "\n")
            else:
                out.append(line + "\n")
        for sample_name, lines in sorted(extra.items()):
            exposed = escape_metric_name(sample_name)
            out.append(f"# HELP {exposed} {doc}\n# TYPE {exposed} gauge\n")
            out.extend(lines)

    def wrapper(self, metric: MetricWrapperBase, out: list[str], take: Callable[[list[str]], None]) -> bool:
        """Render a plain Counter, Gauge, Histogram or Summary from its children; False for anything else.
        `take` is handed `out` after each child, to encode what is written so far."""
        kind = _kind(metric)
        if kind is None:
            return False
        attrs = vars(metric)
        names: tuple[str, ...] = attrs["_labelnames"]
        if names:
            with attrs["_lock"]:
                children = list(attrs["_metrics"].items())
        else:
            children = [((), metric)]
        if any("_child_samples" in vars(child) for _, child in children):  # Gauge.set_function
            return False
        name: str = attrs["_name"]
        exposed_kind = _KINDS[kind]
        exposed = escape_metric_name(name + ("_total" if kind is Counter else ""))
        out.append(f"# HELP {exposed} {_help(attrs['_documentation'])}\n# TYPE {exposed} {exposed_kind}\n")
        # generate_latest sorts each line's labels by name; the order is worked out once here.
        order = sorted(range(len(names)), key=names.__getitem__)
        sorted_names = [names[i] for i in order]
        if kind is Histogram:
            bucket, count, total = (escape_metric_name(name + s) for s in ("_bucket", "_count", "_sum"))
            before_le = sum(1 for n in sorted_names if n < "le")
            les: list[str] | None = None
            for values, child in children:
                ordered = [values[i] for i in order]
                head = self.labels(zip(sorted_names[:before_le], ordered[:before_le], strict=True))
                tail = self.labels(zip(sorted_names[before_le:], ordered[before_le:], strict=True))
                if les is None:
                    les = [floatToGoString(b) for b in child._upper_bounds]
                start = f'{bucket}{{{head}{"," if head else ""}le="'
                end = f'"{"," if tail else ""}{tail}}} '
                acc = 0.0
                buckets = child._buckets
                counts = buckets.counts() if isinstance(buckets, LeanBuckets) else [b.get() for b in buckets]
                for le, counted in zip(les, counts, strict=True):
                    acc += counted
                    out.append(f"{start}{le}{end}{_number(acc)}\n")
                series = head + ("," if head and tail else "") + tail
                labels = f"{{{series}}}" if series else ""
                out.append(f"{count}{labels} {_number(acc)}\n")
                if child._upper_bounds[0] >= 0:
                    out.append(f"{total}{labels} {_number(child._sum.get())}\n")
                take(out)
        elif kind is Summary:
            count, total = (escape_metric_name(name + s) for s in ("_count", "_sum"))
            for values, child in children:
                series = self.labels(zip(sorted_names, [values[i] for i in order], strict=True))
                labels = f"{{{series}}}" if series else ""
                out.append(f"{count}{labels} {_number(child._count.get())}\n")
                out.append(f"{total}{labels} {_number(child._sum.get())}\n")
                take(out)
        else:
            for values, child in children:
                series = self.labels(zip(sorted_names, [values[i] for i in order], strict=True))
                labels = f"{{{series}}}" if series else ""
                out.append(f"{exposed}{labels} {_number(child._value.get())}\n")
                take(out)
        return True


def _kind(metric: MetricWrapperBase) -> type | None:
    """Counter, Gauge, Histogram or Summary for those and their subclasses that keep the values where
    they do (monitor.metrics.lean's); None for another kind, or a subclass that may keep them elsewhere."""
    kind = type(metric)
    if kind in _KINDS:
        return kind
    if kind in _LEAN:
        return _LEAN[kind]
    return None


def _collectors(registry: Collector) -> Iterator[Collector]:
    if isinstance(registry, MonitorRegistry):
        yield from registry.collectors()
    else:
        yield registry


def render(registry: Collector) -> bytes:
    """The registry in the text format 0.0.4 (`CONTENT_TYPE_LATEST`), as `generate_latest` writes it."""
    return b"".join(render_parts(registry).pieces)


# Lines are joined and encoded (and compressed) this many at a time: 15-60 kB of text (a line of the
# daemon's families is 60-250 characters).
PIECE_LINES = 256


@dataclass
class Rendering:
    """An exposition in pieces, not joined: the listener writes them one after the other, so a rendering
    never holds the body twice. `gzip`: the pieces are one gzip stream of the text, `text_bytes` long."""

    pieces: list[bytes]
    gzip: bool
    text_bytes: int


class _Pieces:
    """Lines written into pieces of PIECE_LINES as they come, each encoded (and compressed) at once:
    at 500 probe series the text is 5 MB in 32k lines, and holding them as str until the end (then the
    joined str, then its bytes) took the daemon's resident memory 12 MB past what it needs at rest at each
    rendering; compressed, the body it keeps until the scrape is written is a thirtieth of the text."""

    def __init__(self, *, gzip: bool) -> None:
        self.pieces: list[bytes] = []
        self.text_bytes = 0
        # Level 1: at 500 probe series a thirtieth of the text in a few ms; higher levels save little more.
        self._compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS) if gzip else None

    def take(self, lines: list[str], *, at_least: int = PIECE_LINES) -> None:
        """Encode `lines` into a piece and clear them, once there are `at_least` of them."""
        if not lines or len(lines) < at_least:
            return
        data = "".join(lines).encode("utf-8")
        lines.clear()
        self.text_bytes += len(data)
        if self._compressor is not None:
            data = self._compressor.compress(data)
        if data:
            self.pieces.append(data)

    def finish(self) -> Rendering:
        if self._compressor is not None:
            self.pieces.append(self._compressor.flush())
        return Rendering(self.pieces, self._compressor is not None, self.text_bytes)


def render_parts(registry: Collector, *, gzip: bool = False, fast: bool = True) -> Rendering:
    """`render`'s text in pieces (`Rendering`), gzip-compressed as it is made with `gzip`. `fast`: read the
    plain metric objects directly (False: every collector through `collect()`)."""
    lines = _Lines()
    out = _Pieces(gzip=gzip)
    part: list[str] = []
    for collector in _collectors(registry):
        if fast and isinstance(collector, MetricWrapperBase):
            try:
                done = lines.wrapper(collector, part, out.take)
            except (AttributeError, KeyError):  # a prometheus_client that keeps its values elsewhere
                # Some of it may be in the pieces already: the whole rendering again, through collect().
                return render_parts(registry, gzip=gzip, fast=False)
            if done:
                continue
        families: Iterable[Metric] = collector.collect()
        if isinstance(registry, MonitorRegistry):
            families = registry.without_created(families)
        for metric in families:
            lines.family(metric, part)
            out.take(part)
    out.take(part, at_least=1)
    return out.finish()
