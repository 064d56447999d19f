"""`ttft-monitor check-config`: load the file and show what the daemon would do with it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from monitor.config.cost import Seen, project, render_projection
from monitor.config.cron import next_fire_times
from monitor.config.errors import ConfigError
from monitor.config.loader import load_config
from monitor.config.models import Config
from monitor.config.series import warm_twin
from monitor.config.urls import is_loopback, mask_password
from monitor.exitcodes import EXIT_OK, EXIT_USAGE

NEXT_RUNS_SHOWN = 3
# Reads what a database holds for the projection (the command's edge does the I/O): (seen, where from).
History = Callable[[Config], tuple[Mapping[tuple[str, str], Seen], str]]


def check_config(
    path: str | Path,
    *,
    environ: Mapping[str, str] | None = None,
    now: datetime | None = None,
    history: History | None = None,
) -> tuple[int, str]:
    """(0, summary) when the config at `path` is usable, else (2, one line per problem). `history` reads the
    tokens per probe a database holds, by (target, prompt), for the cost projection, with a line on where
    they came from."""
    try:
        config = load_config(path, environ=environ)
    except ConfigError as exc:
        return EXIT_USAGE, str(exc)
    seen, note = history(config) if history is not None and config.jobs else ({}, None)
    summary = render_summary(config, path=str(path), now=now or datetime.now(UTC), seen=seen)
    return EXIT_OK, summary if note is None else f"{summary}\n  {note}"


def unprotected_listen(config: Config, listen: str | None = None, *, key: str = "metrics.listen") -> str | None:
    """Why `run` (or `serve` on `listen`) refuses to start: the UI and API would be reachable beyond this
    machine with no auth, and nobody said that is meant. None when they are protected, on loopback,
    disabled, or `web.allow_unauthenticated` is true."""
    web = config.web
    listen = listen or config.metrics.listen
    if not web.enabled or web.allow_unauthenticated or web.token_env or web.basic_user is not None:
        return None
    if is_loopback(listen):
        return None
    return (
        f"{key} {listen} is reachable beyond this machine and the status pages and API have no auth; set "
        "web.token_env (a bearer token from the environment) or web.basic_user with web.basic_password_hash "
        "(from `ttft-monitor serve --hash-password`), listen on 127.0.0.1, or set web.allow_unauthenticated: "
        "true if anyone who can reach it may read them"
    )


def _cold_summary(config: Config) -> str:
    retention = config.database.retention
    fixed = retention.cold_days()
    if fixed is not None:
        return f"cold after {fixed} d" + (" (past raw_days: nothing compacted)" if fixed >= retention.raw_days else "")
    if not retention.cold_tier_on():
        return f"cold tier off (at least {config.cold_minimum()[0]} d when set in days)"
    policy = config.cold_policy()
    if policy is None:
        return "cold tier auto: nothing compacted (raw_days too short for it)"
    return f"cold tier auto: days older than {policy.after_days} d (what {config.cold_minimum()[1]} read as rows)"


# Fewer rounds a run than detection is tuned for: what it measured of them (bench/detector.py --noise all --series
# 12 --quiet-series 8 --weeks 3 --rounds 1,3,5 --sigmas 0.3, the series without steps, 2026-12-07; docs/detection.md).
FEW_ROUNDS = 3
FEW_ROUNDS_NOTE = (
    "a run's median is one or two requests, so detection needs more runs to tell a shift from noise: on the "
    "detection bench's series without regressions it raised 0.85 false alerts a series-week with 1 round, 0.64 "
    "with 3 and 0.37 with 5 (its target is 0.5; docs/detection.md); 3 or more rounds are what it is tuned for"
)


def render_summary(
    config: Config, *, path: str, now: datetime, seen: Mapping[tuple[str, str], Seen] | None = None
) -> str:
    """A human-readable account of `config`; secrets appear only as where they come from."""
    db = config.database
    lines = [
        f"{path}: OK",
        f"location: {config.location}",
        f"database: {mask_password(db.url)}",
        f"  state_dir {db.state_dir}, keep raw {db.retention.raw_days} d, rollups {db.retention.rollup_days} d, "
        + _cold_summary(config),
        f"metrics: listen {config.metrics.listen}"
        + (f", push to {config.metrics.pushgateway}" if config.metrics.pushgateway else ""),
        f"providers ({len(config.providers)}):",
    ]
    for name, provider in config.providers.items():
        lines.append(f"  {name}: {provider.api} {provider.display_url()}, auth: {provider.auth_source()}")
    lines.append(f"targets ({len(config.targets)}):")
    for name, target in config.targets.items():
        params = target.params
        reasoning = ""
        if params.reasoning == "least":
            effort = f" (effort {params.reasoning_effort})" if params.reasoning_effort else ""
            reasoning = f", reasoning least{effort}"
        lines.append(f"  {name}: model {target.model} on {target.provider}, max_tokens {params.max_tokens}{reasoning}")
    lines.append(f"prompts ({len(config.prompts)}):")
    for name, prompt in config.prompts.items():
        twin = f" (series {name}, busted, and {warm_twin(name)}, warm)" if prompt.cache == "both" else ""
        lines.append(f"  {name}: {prompt.tokens} tokens, {prompt.language}, cache {prompt.cache}{twin}")
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
        if job.rounds < FEW_ROUNDS:
            lines.append(f"    note: {job.rounds} round{'s' if job.rounds != 1 else ''} a run: {FEW_ROUNDS_NOTE}")
    receivers = config.alerts.receivers
    lines.append(
        f"alerts: {len(receivers)} receivers, {len(config.alerts.routes)} routes, "
        f"{len(config.alerts.silences)} silences"
    )
    for name, receiver in receivers.items():
        lines.append(f"  {name}: {receiver.type}")
    lines.append(f"web: {_web_summary(config)}")
    if config.jobs:
        lines += render_projection(project(config, seen))
    problem = unprotected_listen(config)
    if problem:
        lines.append(f"warning: `run` will refuse to start: {problem}")
    return "\n".join(lines)


def _web_summary(config: Config) -> str:
    web = config.web
    if not web.enabled:
        return "disabled"
    if web.token_env:
        auth = f"bearer token from {web.token_env}, sign-ins last {web.session_hours:g} h"
    elif web.basic_user is not None:
        auth = f"basic auth as {web.basic_user}"
    else:
        auth = "no auth" + (" (web.allow_unauthenticated)" if web.allow_unauthenticated else "")
    where = "loopback only" if is_loopback(config.metrics.listen) else "beyond this machine"
    proxy = ", trusting X-Forwarded-* headers" if web.trust_proxy_headers else ""
    return f"on {config.metrics.listen} ({where}), {auth}{proxy}"
