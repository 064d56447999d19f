"""Where a regression's time went, from the server's own metrics (providers with `server_metrics_url`).

Pure: the run's `server_*` fields against the medians of its history give the server's side; the
client's TTFT against its baseline gives the whole. The cause is whichever grew: the server's queue,
its prefill, or neither (the time went outside the server: network, gateway, client).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from monitor.quantile import quantile
from monitor.store.records import RunRecord

Cause = Literal["server_queue", "server_prefill", "outside_server"]
CONCLUSIONS: dict[str, str] = {
    "server_queue": "queueing on the server",
    "server_prefill": "prefill on the server",
    "outside_server": "server TTFT unchanged: network or gateway",
}
# The server explains a regression when its own TTFT grew by at least this share of the client's growth.
SERVER_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class ServerSplit:
    """The run's server-side numbers beside their baselines (medians over the history's runs)."""

    ttft_ms: float | None = None
    ttft_baseline_ms: float | None = None
    waiting: float | None = None
    waiting_baseline: float | None = None
    queue_ms: float | None = None
    queue_baseline_ms: float | None = None
    prefill_ms: float | None = None
    prefill_baseline_ms: float | None = None


def _baseline(history: Sequence[RunRecord], name: str) -> float | None:
    return quantile([float(v) for v in (getattr(r, name) for r in history) if v is not None], 0.5)


def server_split(run: RunRecord, history: Sequence[RunRecord]) -> ServerSplit | None:
    """None when the run carries no server metrics."""
    if run.server_ttft_ms is None and run.server_waiting is None:
        return None
    return ServerSplit(
        ttft_ms=run.server_ttft_ms,
        ttft_baseline_ms=_baseline(history, "server_ttft_ms"),
        waiting=run.server_waiting,
        waiting_baseline=_baseline(history, "server_waiting"),
        queue_ms=run.server_queue_ms,
        queue_baseline_ms=_baseline(history, "server_queue_ms"),
        prefill_ms=run.server_prefill_ms,
        prefill_baseline_ms=_baseline(history, "server_prefill_ms"),
    )


def _growth(value: float | None, baseline: float | None) -> float | None:
    return None if value is None or baseline is None else value - baseline


def classify(client_ms: float | None, client_baseline_ms: float | None, split: ServerSplit | None) -> Cause | None:
    """What the client's extra TTFT is made of; None when it did not grow or the server's side is unknown."""
    client = _growth(client_ms, client_baseline_ms)
    if split is None or client is None or client <= 0:
        return None
    queue = _growth(split.queue_ms, split.queue_baseline_ms)
    prefill = _growth(split.prefill_ms, split.prefill_baseline_ms)
    # Time spent in the server's queue is the server's by definition. Checked before the TTFT
    # comparison, which sets the client's figure (a median over the detector's window) against the
    # server's histogram mean over this run's requests: with one request queued much longer than the
    # rest, or a loaded client, that comparison can fall just under the share although the queue alone
    # explains the growth (seen against the real vLLM at load average 24-37).
    if queue is not None and queue >= SERVER_SHARE * client and (prefill is None or queue >= prefill):
        return "server_queue"
    # The server's histograms average every request it served over the run, not only the probe's: under
    # a burst the others dilute the mean (seen: client 7,695 ms, server mean 1,039 ms, 6 waiting). When
    # requests were waiting that usually were not and queue time grew more than prefill did, the
    # server was queueing, whatever that mean says.
    waiting_rose = split.waiting is not None and split.waiting >= (split.waiting_baseline or 0.0) + 1
    if waiting_rose and queue is not None and queue > 0 and (prefill is None or queue >= prefill):
        return "server_queue"
    server = _growth(split.ttft_ms, split.ttft_baseline_ms)
    if server is None:
        return None
    if server < SERVER_SHARE * client:
        return "outside_server"
    if queue is not None and prefill is not None:
        return "server_queue" if queue >= prefill else "server_prefill"
    if split.waiting is not None and split.waiting > (split.waiting_baseline or 0.0):
        return "server_queue"
    return "server_prefill"


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _ms(value: float) -> str:
    return f"{value:,.0f} ms" if abs(value) >= 10 else f"{value:.1f} ms"


def _with_baseline(text: str, baseline: float | None) -> str:
    return text if baseline is None else f"{text} (baseline {_n(baseline)})"


def split_text(client_ms: float | None, client_baseline_ms: float | None, split: ServerSplit | None) -> str | None:
    """`client TTFT 950 ms (baseline 400); server TTFT 900 ms (baseline 360); 12 requests waiting
    (baseline 0): queueing on the server`; None when there is nothing to say."""
    cause = classify(client_ms, client_baseline_ms, split)
    if cause is None or split is None or client_ms is None or split.ttft_ms is None:
        return None
    parts = [
        _with_baseline(f"client TTFT {_ms(client_ms)}", client_baseline_ms),
        _with_baseline(f"server TTFT {_ms(split.ttft_ms)}", split.ttft_baseline_ms),
    ]
    if split.waiting is not None:
        parts.append(_with_baseline(f"{_n(split.waiting)} requests waiting", split.waiting_baseline))
    return "; ".join(parts) + ": " + CONCLUSIONS[cause]
