"""`once` pushes its metrics to a Pushgateway: one group per (probe job, location).

A group is replaced whole by each push (PUT), so one group per probe job keeps CronJobs of different
jobs (`once --job a`, `once --job b`) from overwriting each other, and a run of several jobs pushes
each job's series to its own group instead of one group where their series would collide. Series of
the whole process (database, spool, notifications) go to every group: each is what that run saw.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from yarl import URL

from monitor.config.models import Config
from monitor.config.series import job_series
from monitor.probe.proxy import ProxyEnvironment, aiohttp_proxy_options, route_for
from monitor.redact import url_credentials
from monitor.servertext import capped

# The `job` of every pushed series, as for the daemon's scrape job in deploy/prometheus.
PUSH_JOB = "ttft-monitor"
PUSH_TIMEOUT_S = 10.0

Series = tuple[str, str]  # (target, prompt)


def belongs_to_job(labels: Mapping[str, str], probe_job: str, series: set[Series]) -> bool:
    """Whether a sample with `labels` goes in `probe_job`'s group."""
    if "probe_job" in labels:
        return labels["probe_job"] == probe_job
    if "target" in labels and "prompt" in labels:
        return (labels["target"], labels["prompt"]) in series
    if "target" in labels:
        return labels["target"] in {target for target, _ in series}
    return True  # the process's own series


class JobView:
    """The samples of `registry` that belong to one probe job, without the `probe_job` label (the
    grouping key puts it back on every series of the group)."""

    def __init__(self, registry: CollectorRegistry, probe_job: str, series: set[Series]) -> None:
        self._registry = registry
        self._probe_job = probe_job
        self._series = series

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            kept = [
                Sample(s.name, {k: v for k, v in s.labels.items() if k != "probe_job"}, *s[2:])
                for s in family.samples
                if belongs_to_job(s.labels, self._probe_job, self._series)
            ]
            if kept or not family.samples:
                copy = Metric(family.name, family.documentation, family.type, family.unit)
                copy.samples = kept
                yield copy


def group_path(grouping: Mapping[str, str]) -> str:
    """`/metrics/job/ttft-monitor/probe_job/a/location/b`; values with a `/` (or empty) go base64-encoded,
    the Pushgateway's own escape for them."""
    parts = ["metrics", "job", PUSH_JOB]
    for name, value in grouping.items():
        if "/" in value or not value:
            parts += [f"{name}@base64", base64.urlsafe_b64encode(value.encode()).decode() or "="]
        else:
            parts += [name, quote(value, safe="")]
    return "/" + "/".join(parts)


@dataclass(frozen=True)
class PushResult:
    probe_job: str
    ok: bool
    answer: str  # "202", or the gateway's status and body, or why it could not be reached


async def push_groups(
    gateway: str,
    registry: CollectorRegistry,
    *,
    location: str,
    jobs: Mapping[str, set[Series]],
    timeout_s: float = PUSH_TIMEOUT_S,
    proxies: ProxyEnvironment | None = None,
) -> list[PushResult]:
    """PUT each job's group; never raises. Rejections and unreachable gateways are logged.

    The push goes as every outbound request does (monitor.probe.proxy): through HTTP(S)_PROXY unless
    NO_PROXY or loopback says direct; `proxies` None honours no environment."""
    log = structlog.get_logger()
    base = URL(gateway).with_user(None)  # credentials in the URL stay out of the logs
    proxies = proxies if proxies is not None else ProxyEnvironment()
    route = route_for(gateway, None, proxies)
    credentials = [*url_credentials(gateway), *proxies.secrets()]
    results = []
    client_timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=client_timeout) as session:
        for probe_job, series in jobs.items():
            body = generate_latest(JobView(registry, probe_job, series))
            path = group_path({"probe_job": probe_job, "location": location})
            url = gateway.rstrip("/") + path
            try:
                options = aiohttp_proxy_options(route, url, {"Content-Type": CONTENT_TYPE_LATEST})
                async with session.put(url, data=body, **options) as response:
                    answer = capped((await response.text()).strip(), 500, credentials)
                    status = response.status
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                reason = capped(f"{type(exc).__name__}: {exc}", 300, credentials)
                log.error("pushgateway_unreachable", gateway=str(base), group=path, error=reason)
                results.append(PushResult(probe_job, False, reason))
                continue
            if status >= 300:
                log.error("pushgateway_rejected", gateway=str(base), group=path, status=status, answer=answer)
                results.append(PushResult(probe_job, False, f"{status} {answer}".strip()))
            else:
                log.info("pushgateway_pushed", group=path, status=status, bytes=len(body))
                results.append(PushResult(probe_job, True, str(status)))
    return results


async def push_once_metrics(
    config: Config, registry: CollectorRegistry, job_names: Iterable[str], *, proxies: ProxyEnvironment | None = None
) -> bool:
    """Push the run's metrics when `metrics.pushgateway` is set; False when any group was not taken."""
    gateway = config.metrics.pushgateway
    if not gateway:
        return True
    results = await push_groups(
        gateway, registry, location=config.location, jobs=job_series(config, job_names), proxies=proxies
    )
    return all(result.ok for result in results)
