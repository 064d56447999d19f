"""What an inference server's own Prometheus endpoint says about a run: parsing and deltas (pure),
and the scrape (the one I/O function, bounded by a short timeout and never raising).

A provider that names `server_metrics_url` (self-hosted vLLM or SGLang) is scraped right before and
right after each run; `server_metrics` turns the two readings into what is stored with the run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
import ssl as ssl_module
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from monitor.probe.proxy import ProxyRoute, aiohttp_proxy_options

# Short: the "before" scrape sits in front of the run's first probe.
SCRAPE_TIMEOUT_S = 2.0
# Longer: no probe waits on the "after" scrape, and a server busy enough to matter answers slowly
# (a real vLLM with a queue, on two loaded cores: 20 readings within 24 ms, then 0.4 and 2.0 s).
AFTER_SCRAPE_TIMEOUT_S = 5.0
# A metrics page is tens of kilobytes (vLLM 0.32 with one model: 49 kB); a server sending more is
# not a metrics endpoint.
MAX_SCRAPE_BYTES = 8 * 1024 * 1024
# The longest sample line read; vLLM's longest is under 300 bytes.
MAX_LINE_BYTES = 64 * 1024
MODEL_LABEL = "model_name"  # vLLM and SGLang both label per-model series so

WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
PREFIX_HITS, PREFIX_QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
PREFIX_HIT_RATE_GAUGE = "sglang:cache_hit_rate"
TTFT = ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds")
QUEUE_TIME = ("vllm:request_queue_time_seconds",)
PREFILL_TIME = ("vllm:request_prefill_time_seconds",)
# Changes when the server restarts (prometheus_client's process collector; vLLM serves it).
PROCESS_START = "process_start_time_seconds"
# vLLM's cache configuration as labels of a constant gauge: which of them say what the server runs.
CACHE_CONFIG = "vllm:cache_config_info"
BUILD_CONFIG_LABELS = (("block_size", "block"), ("enable_prefix_caching", "prefix caching"), ("cache_dtype", "kv"))
# The most a server build description holds (the runs column is 256 characters).
BUILD_CAP = 256
HISTOGRAMS = (*TTFT, *QUEUE_TIME, *PREFILL_TIME)
COUNTERS = (PREFIX_HITS, PREFIX_QUERIES, *(f"{h}_{part}" for h in HISTOGRAMS for part in ("count", "sum")))
# The only samples read: a page holds hundreds more (every histogram's buckets), and parsing them all
# would hold the event loop, and with it the stamps of probes in flight, for no use.
WANTED = frozenset((*WAITING, *RUNNING, *KV_CACHE_USAGE, PREFIX_HIT_RATE_GAUGE, PROCESS_START, CACHE_CONFIG, *COUNTERS))
# A sample line of Prometheus' text format: name, optional labels, value, optional timestamp.
_SAMPLE_LINE = re.compile(
    rb"[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?[ \t]+"
    rb"[+-]?(?:[0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|Inf|inf|NaN|nan)"
    rb"(?:[ \t]+-?[0-9]+)?"
)
_NAME_END = re.compile(rb"[{ \t]")

# Sample name -> [(labels, value)], as read from one scrape.
Snapshot = Mapping[str, list[tuple[dict[str, str], float]]]


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """One run as the server saw it. Gauges: the larger of the readings before and after the run;
    rates and means: over the run (the deltas between the two readings). None: not known."""

    waiting: float | None = None
    running: float | None = None
    kv_cache_usage: float | None = None  # fraction, 0..1
    prefix_hit_rate: float | None = None  # fraction of prompt tokens served from the prefix cache
    ttft_ms: float | None = None  # mean over the requests the server finished prefilling in the run
    queue_ms: float | None = None
    prefill_ms: float | None = None

    def run_fields(self) -> dict[str, float | None]:
        """As the `server_*` fields of a RunRecord."""
        return {f"server_{name}": getattr(self, name) for name in self.__slots__}


class _PageFilter:
    """Keeps the WANTED sample lines of a Prometheus text page fed in chunks, checking every line's
    shape on the way, so a page costs one pass over its bytes however large it is."""

    def __init__(self) -> None:
        self.kept: list[bytes] = []
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE_BYTES:  # else an endless line is copied again with every chunk
            raise ValueError("not a Prometheus text page (a line without end)")
        self._keep(lines)

    def finish(self) -> str:
        self._keep([self._partial])
        self._partial = b""
        return b"\n".join(self.kept).decode("utf-8", errors="replace") + "\n"

    def _keep(self, lines: Iterable[bytes]) -> None:
        for raw in lines:
            line = raw.strip()
            if not line or line.startswith(b"#"):
                continue
            if _SAMPLE_LINE.fullmatch(line) is None:
                raise ValueError("not a Prometheus text page (a line is not a sample)")
            end = _NAME_END.search(line)
            if (line[: end.start()] if end else line).decode("ascii") in WANTED:
                self.kept.append(line)


def parse_snapshot(text: str | bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The WANTED samples of a Prometheus text page by sample name. Raises ValueError on a malformed page."""
    page = _PageFilter()
    page.feed(text.encode() if isinstance(text, str) else text)
    return _parse_kept(page.finish())


def _parse_kept(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                value = float(sample.value)
                # Every wanted sample is a count, a time, a fraction or a moment: none is negative or
                # infinite. One that is says nothing; the rest of the page still does.
                if math.isfinite(value) and value >= 0:
                    out.setdefault(sample.name, []).append((dict(sample.labels), value))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise ValueError(f"not a Prometheus text page ({type(exc).__name__})") from None
    return out


def _total(snapshot: Snapshot | None, name: str, model: str) -> float | None:
    """The sum over the label sets of `model` (series without a model label count: one-model servers)."""
    if snapshot is None or name not in snapshot:
        return None
    values = [v for labels, v in snapshot[name] if labels.get(MODEL_LABEL, model) == model]
    return sum(values) if values else None


def _first_total(snapshot: Snapshot | None, names: tuple[str, ...], model: str) -> float | None:
    for name in names:
        value = _total(snapshot, name, model)
        if value is not None:
            return value
    return None


def _gauge(
    before: Snapshot | None, after: Snapshot | None, names: tuple[str, ...], model: str, *, at_most: float = math.inf
) -> float | None:
    readings = [v for v in (_first_total(s, names, model) for s in (before, after)) if v is not None]
    # A "fraction" above 1 is some other unit (a percentage?): unknown, rather than stored as nonsense.
    return max(readings) if readings and max(readings) <= at_most else None


def restarted(before: Snapshot | None, after: Snapshot | None) -> bool:
    """The server restarted between the readings: its start time changed, or a counter went back.

    Then no difference between them means anything: a counter that restarted may already have
    climbed past its old value, so each delta alone cannot tell.
    """
    if before is None or after is None:
        return False
    start_before, start_after = _total(before, PROCESS_START, ""), _total(after, PROCESS_START, "")
    if start_before is not None and start_after is not None and start_before != start_after:
        return True
    for name in COUNTERS:
        for labels, value in after.get(name, []):
            old = [v for lb, v in before.get(name, []) if lb == labels]
            if old and value < old[0]:
                return True
    return False


def _delta(before: Snapshot | None, after: Snapshot | None, name: str, model: str) -> float | None:
    if before is None:
        return None
    # A series first seen after the run started from zero during it (labels appear on first use).
    old, new = _total(before, name, model) or 0.0, _total(after, name, model)
    if new is None or new < old:  # missing, or the server restarted in between
        return None
    return new - old


def _histogram_mean_ms(
    before: Snapshot | None, after: Snapshot | None, names: tuple[str, ...], model: str
) -> float | None:
    for name in names:
        count = _delta(before, after, f"{name}_count", model)
        total = _delta(before, after, f"{name}_sum", model)
        if count is not None and total is not None:
            return total / count * 1000 if count > 0 else None
    return None


def server_metrics(before: Snapshot | None, after: Snapshot | None, model: str) -> ServerMetrics | None:
    """What the two readings say about `model` over the run; None when neither reading exists.
    Across a restart only the gauges are kept: the readings are of two different processes."""
    if before is None and after is None:
        return None
    gauges = ServerMetrics(
        waiting=_gauge(before, after, WAITING, model),
        running=_gauge(before, after, RUNNING, model),
        kv_cache_usage=_gauge(before, after, KV_CACHE_USAGE, model, at_most=1.0),
    )
    if restarted(before, after):
        return gauges
    hits, queries = _delta(before, after, PREFIX_HITS, model), _delta(before, after, PREFIX_QUERIES, model)
    if hits is not None and queries:
        hit_rate: float | None = hits / queries if hits <= queries else None
    else:
        hit_rate = _gauge(None, after, (PREFIX_HIT_RATE_GAUGE,), model, at_most=1.0) if queries is None else None
    return dataclasses.replace(
        gauges,
        prefix_hit_rate=hit_rate,
        ttft_ms=_histogram_mean_ms(before, after, TTFT, model),
        queue_ms=_histogram_mean_ms(before, after, QUEUE_TIME, model),
        prefill_ms=_histogram_mean_ms(before, after, PREFILL_TIME, model),
    )


async def scrape(
    session: aiohttp.ClientSession, url: str, *, timeout_s: float = SCRAPE_TIMEOUT_S, proxy: ProxyRoute | None = None
) -> dict[str, list[tuple[dict[str, str], float]]] | str:
    """One reading of `url`, or the reason there is none (an error class, safe to log). Never raises
    except on cancellation, and never takes longer than `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url, allow_redirects=False, **aiohttp_proxy_options(proxy, url)) as response:
                if response.status != 200:
                    return f"http_{response.status}"
                # Chunk by chunk to the end: one read() returns only what has arrived so far, and a
                # page larger than a socket read would be cut short.
                page, received = _PageFilter(), 0
                async for chunk in response.content.iter_any():
                    received += len(chunk)
                    if received > MAX_SCRAPE_BYTES:
                        return "too_large"
                    page.feed(chunk)
                text = page.finish()
        return _parse_kept(text)
    except TimeoutError:
        return "timeout"
    except ValueError:
        return "malformed"
    except (aiohttp.ClientError, OSError) as exc:
        return type(exc).__name__


# ---------------------------------------------------------------- which server answered


def server_build(
    *,
    version: Any = None,
    models: Any = None,
    model: str,
    snapshot: Snapshot | None = None,
    model_info: Any = None,
) -> str | None:
    """What a self-hosted server says it runs, in words: "vllm 0.32.0; weights /models/qwen3-8b; max_model_len
    8192; block 128, prefix caching True, kv auto". From its `/version` answer (vLLM's `{"version": ...}`),
    its `/v1/models` list (the entry of `model`: `root`, the weights behind the id, and `max_model_len`)
    vLLM's `vllm:cache_config_info` labels, and SGLang's `/get_model_info` (`model_path`, the weights, and
    `weight_version`, which an online weight update moves). A change of it is a model change
    (monitor/detect/identity.py).
    None when the server says none of it. Values a server chose: control characters are dropped, each
    part is capped, and the whole fits BUILD_CAP."""
    parts: list[str] = []
    if isinstance(version, dict) and isinstance(version.get("version"), str | int | float):
        parts.append(f"{_owner(models, model) or 'server'} {_clean(str(version['version']))}")
    entry = _model_entry(models, model)
    info = model_info if isinstance(model_info, dict) else {}
    weights = entry.get("root") if entry is not None else None
    if not (isinstance(weights, str) and weights and weights != model):
        weights = info.get("model_path")
    if isinstance(weights, str) and weights and weights != model:
        parts.append(f"weights {_clean(weights)}")
    if isinstance(info.get("weight_version"), str | int) and not isinstance(info.get("weight_version"), bool):
        parts.append(f"weight_version {_clean(str(info['weight_version']))}")
    if entry is not None:
        length = entry.get("max_model_len")
        if isinstance(length, int) and not isinstance(length, bool):
            parts.append(f"max_model_len {length}")
    config = next(iter((snapshot or {}).get(CACHE_CONFIG, [])), None)
    if config is not None:
        labels = config[0]
        shown = [f"{word} {_clean(labels[name])}" for name, word in BUILD_CONFIG_LABELS if name in labels]
        if shown:
            parts.append(", ".join(shown))
    if not parts:
        return None
    text = "; ".join(parts)
    return text if len(text) <= BUILD_CAP else text[: BUILD_CAP - 1] + "\u2026"


def _model_entry(models: Any, model: str) -> dict[str, Any] | None:
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list):
        return None
    for entry in data:
        if isinstance(entry, dict) and entry.get("id") == model:
            return entry
    return None


def _owner(models: Any, model: str) -> str | None:
    entry = _model_entry(models, model)
    owner = entry.get("owned_by") if entry is not None else None
    return _clean(owner) if isinstance(owner, str) and owner else None


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _clean(text: str, limit: int = 120) -> str:
    text = _UNPRINTABLE.sub("", text)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


@dataclass(frozen=True, slots=True)
class InfoRequest:
    """How to ask for one server document: its route, headers (the API's credentials for the model list)
    and TLS settings."""

    proxy: ProxyRoute | None = None
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    ssl: ssl_module.SSLContext | bool = True


async def read_json(
    session: aiohttp.ClientSession, url: str, *, timeout_s: float, request: InfoRequest = InfoRequest()
) -> Any:
    """A small JSON document at `url` (a server's `/version`, `/v1/models`), or None: never raises except
    on cancellation, never takes longer than `timeout_s`, reads at most MAX_INFO_BYTES."""
    options = aiohttp_proxy_options(request.proxy, url, request.headers)
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url, allow_redirects=False, ssl=request.ssl, **options) as response:
                if response.status != 200:
                    return None
                body = b""
                async for chunk in response.content.iter_any():  # to the end: one read() may stop short
                    body += chunk
                    if len(body) > MAX_INFO_BYTES:
                        return None
        return json.loads(body)
    except (TimeoutError, ValueError, aiohttp.ClientError, OSError):
        return None


MAX_INFO_BYTES = 256 * 1024
