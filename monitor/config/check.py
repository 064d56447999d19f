"""`ttft-monitor check-config`: load the file and show what the daemon would do with it."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from monitor.config.cron import next_fire_times
from monitor.config.errors import ConfigError
from monitor.config.loader import load_config
from monitor.config.models import Config
from monitor.config.urls import mask_password
from monitor.exitcodes import EXIT_OK, EXIT_USAGE

NEXT_RUNS_SHOWN = 3


def check_config(
    path: str | Path, *, environ: Mapping[str, str] | None = None, now: datetime | None = None
) -> tuple[int, str]:
    """(0, summary) when the config at `path` is usable, else (2, one line per problem)."""
    try:
        config = load_config(path, environ=environ)
    except ConfigError as exc:
        return EXIT_USAGE, str(exc)
    return EXIT_OK, render_summary(config, path=str(path), now=now or datetime.now(UTC))


def render_summary(config: Config, *, path: str, now: datetime) -> str:
    """A human-readable account of `config`; secrets appear only as where they come from."""
    db = config.database
    lines = [
        f"{path}: OK",
        f"location: {config.location}",
        f"database: {mask_password(db.url)}",
        f"  state_dir {db.state_dir}, keep raw {db.retention.raw_days} d, rollups {db.retention.rollup_days} d",
        f"metrics: listen {config.metrics.listen}"
        + (f", push to {config.metrics.pushgateway}" if config.metrics.pushgateway else ""),
        f"providers ({len(config.providers)}):",
    ]
    for name, provider in config.providers.items():
        lines.append(f"  {name}: {provider.api} {provider.display_url()}, auth: {provider.auth_source()}")
    lines.append(f"targets ({len(config.targets)}):")
    for name, target in config.targets.items():
        lines.append(f"  {name}: model {target.model} on {target.provider}, max_tokens {target.params.max_tokens}")
    lines.append(f"prompts ({len(config.prompts)}):")
    for name, prompt in config.prompts.items():
        lines.append(f"  {name}: {prompt.tokens} tokens, {prompt.language}, cache {prompt.cache}")
    lines.append(f"jobs ({len(config.jobs)}):")
    for job in config.jobs:
        jitter = f", jitter up to {job.jitter_s:g} s" if job.jitter_s else ""
        lines += [
            f"  {job.name}: '{job.schedule}' in {job.timezone}{jitter}",
            f"    {len(job.targets)} targets x {len(job.prompts)} prompts x {job.rounds} rounds"
            f" (+{job.warmup} warmup), connection {job.connection}",
            f"    targets: {', '.join(job.targets)}",
            f"    prompts: {', '.join(job.prompts)}",
            "    next runs: " + ", ".join(t.isoformat() for t in next_fire_times(job.trigger(), now, NEXT_RUNS_SHOWN)),
        ]
    receivers = config.alerts.receivers
    lines.append(
        f"alerts: {len(receivers)} receivers, {len(config.alerts.routes)} routes, "
        f"{len(config.alerts.silences)} silences"
    )
    for name, receiver in receivers.items():
        lines.append(f"  {name}: {receiver.type}")
    return "\n".join(lines)
