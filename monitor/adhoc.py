"""The ad-hoc probe behind `ttft-monitor probe`: targets and prompts from the options and the config, one run
of the daemon's pipeline under the job name `adhoc` (stored only with --store). The command
(`monitor/commands/probe.py`) parses, prints and picks the exit code."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from monitor.app import proxy_environment
from monitor.config.loader import load_config
from monitor.config.models import Config
from monitor.config.series import cache_pairs, series_prompts
from monitor.probe.endpoint import Timeouts
from monitor.probe.plan import Endpoints, adhoc_target, prompt_spec
from monitor.probe.prompts import PromptSpec
from monitor.probe.result import Sample
from monitor.probe.runner import ProbeTarget, ProviderLimits, RunPlan
from monitor.store.records import ADHOC_JOB


class UsageError(Exception):
    """Bad command-line input; the message says what to change."""


@dataclass(slots=True)
class ProbeOptions:
    config_path: str | None = None
    targets: list[str] = field(default_factory=list)
    url: str | None = None
    api: str = "openai-chat"
    model: str | None = None
    api_key_env: str | None = None
    max_tokens: int = 64
    extra_body: str | None = None
    reasoning: str = "default"
    reasoning_effort: str | None = None
    include_usage: bool = True
    prompts: list[str] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    language: str = "en"
    cache: str | None = None
    rounds: int = 5
    warmup: int = 1
    pause_s: float = 1.0
    connection: str = "reuse"
    concurrency: int = 1
    output_format: str = "table"
    store: bool = False
    timeouts: Timeouts = field(default_factory=Timeouts)
    report_path: str | None = None


def parse_token_list(text: str) -> list[int]:
    values = []
    for part in text.split(","):
        part = part.strip().lower().replace("_", "")
        if not part:
            continue
        scale = 1
        if part.endswith("k"):
            scale, part = 1024, part[:-1]
        try:
            value = int(float(part) * scale)
        except ValueError:
            raise UsageError(f"'{text}' is not a list of token counts (e.g. 2000,16k)") from None
        if not 128 <= value <= 131072:
            raise UsageError(f"{value} is outside 128..131072")
        values.append(value)
    return values


def load(options: ProbeOptions, environ: dict[str, str]) -> Config | None:
    """The config the options name; None for a one-off --url with nothing that needs a config."""
    path = options.config_path
    if path is None:
        if options.url and not options.targets and not options.store:
            return None
        path = "config.yaml"
    return load_config(path, environ=environ)


def build_targets(options: ProbeOptions, config: Config | None, environ: dict[str, str]) -> list[ProbeTarget]:
    targets: list[ProbeTarget] = []
    proxies = proxy_environment(environ)
    if not options.url and (options.reasoning != "default" or options.reasoning_effort is not None):
        # Config targets keep their own setting: silently probing them with thinking on would cost and mislead.
        raise UsageError(
            "--reasoning and --reasoning-effort apply to --url only; for config targets set "
            "params.reasoning: least (and reasoning_effort) on the target"
        )
    if options.url:
        if not options.model:
            raise UsageError("--url needs --model (the model name the endpoint serves)")
        api_key = None
        if options.api_key_env:
            api_key = environ.get(options.api_key_env)
            if not api_key:
                raise UsageError(
                    f"--api-key-env: environment variable {options.api_key_env} is not set; export it first"
                )
        try:
            extra = json.loads(options.extra_body) if options.extra_body else {}
        except ValueError as exc:
            raise UsageError(f"--extra-body is not JSON: {exc}") from None
        if not isinstance(extra, dict):
            raise UsageError("--extra-body must be a JSON object, e.g. '{\"top_p\": 0.9}'")
        if options.reasoning_effort is not None:
            if options.reasoning != "least":
                raise UsageError("--reasoning-effort applies only with --reasoning least: add it, or drop the effort")
            if not re.fullmatch(r"[a-z][a-z_-]{0,31}", options.reasoning_effort):
                raise UsageError(
                    f"--reasoning-effort {options.reasoning_effort!r} is not an effort level: use one word the API "
                    "knows, e.g. minimal, low or none"
                )
        if not options.url.startswith(("http://", "https://")):
            raise UsageError(f"--url '{options.url}' must start with http:// or https://")
        targets.append(
            adhoc_target(
                url=options.url,
                api=options.api,
                model=options.model,
                api_key=api_key,
                max_tokens=options.max_tokens,
                extra_body=extra,
                include_usage=options.include_usage,
                timeouts=options.timeouts,
                reasoning=options.reasoning,
                reasoning_effort=options.reasoning_effort,
                proxies=proxies,
            )
        )
    if config is not None:
        names = options.targets or ([] if options.url else list(config.targets))
        unknown = [n for n in names if n not in config.targets]
        if unknown:
            known = ", ".join(sorted(config.targets)) or "none"
            raise UsageError(f"--target: unknown target {', '.join(unknown)} (known: {known})")
        targets.extend(Endpoints(config, proxies=proxies).targets(names))
    if not targets:
        raise UsageError("nothing to probe: give --target NAME (from the config) or --url/--api/--model")
    return targets


def build_prompts(options: ProbeOptions, config: Config | None) -> list[PromptSpec]:
    specs: list[PromptSpec] = []
    for name in options.prompts:
        if config is None or name not in config.prompts:
            known = ", ".join(sorted(config.prompts)) if config else "none (no config)"
            raise UsageError(f"--prompt: unknown prompt profile '{name}' (known: {known})")
        if options.cache:  # asked for one cache mode: that one, a `cache: both` prompt included
            specs.append(dataclasses.replace(prompt_spec(name, config.prompts[name]), cache=options.cache))
            continue
        twins = cache_pairs(config.prompts)
        for measured, profile in series_prompts(config.prompts, [name]):
            specs.append(prompt_spec(measured, profile, primed=measured in twins))
    tokens = options.prompt_tokens or ([] if specs else [512])
    for count in tokens:
        specs.append(PromptSpec(f"{count}tok", count, options.language, options.cache or "bust"))
    return specs


@dataclass(frozen=True, slots=True)
class Prepared:
    """What one ad-hoc run needs, checked before anything is sent."""

    config: Config | None
    plan: RunPlan
    limits: ProviderLimits


def prepare(options: ProbeOptions, environ: dict[str, str]) -> Prepared:
    """The plan for `options`; ConfigError or UsageError (one line naming the fix) when it cannot be made."""
    config = load(options, environ)
    targets = build_targets(options, config, environ)
    prompts = build_prompts(options, config)
    plan = RunPlan(
        targets=tuple(targets),
        prompts=tuple(prompts),
        rounds=options.rounds,
        warmup=options.warmup,
        pause_s=options.pause_s,
        concurrency=options.concurrency,
    )
    limits = {name: p.max_concurrency for name, p in config.providers.items()} if config is not None else {}
    # Ad-hoc endpoints get the requested concurrency; configured ones keep their provider's cap.
    limits.update({t.provider: options.concurrency for t in targets if t.provider not in limits})
    if options.store and config is None:
        raise UsageError("--store needs a config file with a database (pass --config)")
    return Prepared(config=config, plan=plan, limits=ProviderLimits(limits))


class StoreTrouble(Exception):
    """The database did not take the samples (they wait in the spool)."""


async def probe_once(
    plan: RunPlan,
    *,
    connection: str,
    limits: ProviderLimits,
    on_sample: Callable[[Sample], None] | None,
    config: Config | None,
    store: bool,
) -> list[Sample]:
    """The same pipeline as the daemon's jobs, under the job name `adhoc`; stores only with --store."""
    from monitor.app import build_context, freeze_heap, open_store
    from monitor.schedule.pipeline import execute

    async with AsyncExitStack() as stack:
        opened = None
        if store:
            assert config is not None
            opened = await open_store(
                config, metrics=None, retry_s=min(config.database.connect_retry_s, 5), spool_subdir="adhoc"
            )
            stack.push_async_callback(opened.engine.dispose)
        context = await build_context(config or Config(), stack, store=opened, metrics=None)
        context.limits = limits
        freeze_heap(collect=False)  # an ad hoc run is short: its start-up garbage may stay
        outcome = await execute(context, job=ADHOC_JOB, plan=plan, connection=connection, on_sample=on_sample)
        if opened is not None and opened.spool.depth:
            raise StoreTrouble(
                f"the database did not take the samples; {opened.spool.depth} wait in the spool and are "
                "written by the next run or by the daemon"
            )
        return outcome.samples
