"""`ttft-monitor probe`: the ad-hoc comparison, no database needed."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import time
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TextIO

from monitor.app import InfrastructureError, proxy_environment
from monitor.config.errors import ConfigError
from monitor.config.loader import load_config
from monitor.config.models import Config
from monitor.exitcodes import EXIT_FAILED, EXIT_INFRA, EXIT_OK, EXIT_USAGE
from monitor.probe.endpoint import Timeouts
from monitor.probe.plan import Endpoints, adhoc_target, prompt_spec
from monitor.probe.prompts import PromptSpec
from monitor.probe.report import render_csv, render_json, render_table, summarize
from monitor.probe.result import Sample
from monitor.probe.runner import ProbeTarget, ProviderLimits, RunPlan
from monitor.servertext import MESSAGE_CAP, capped
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


def _load(options: ProbeOptions, environ: dict[str, str]) -> Config | None:
    path = options.config_path
    if path is None:
        if options.url and not options.targets and not options.store:
            return None
        path = "config.yaml"
    return load_config(path, environ=environ)


def build_targets(options: ProbeOptions, config: Config | None, environ: dict[str, str]) -> list[ProbeTarget]:
    targets: list[ProbeTarget] = []
    proxies = proxy_environment(environ)
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
        spec = prompt_spec(name, config.prompts[name])
        if options.cache:
            spec = dataclasses.replace(spec, cache=options.cache)
        specs.append(spec)
    tokens = options.prompt_tokens or ([] if specs else [512])
    for count in tokens:
        specs.append(PromptSpec(f"{count}tok", count, options.language, options.cache or "bust"))
    return specs


class Progress:
    """A one-line progress bar on a terminal; silent when stderr is piped."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.done = 0
        self.stream = stream
        self.enabled = stream.isatty()
        self.started = time.monotonic()

    def __call__(self, sample: Sample) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 30
        filled = width * self.done // max(self.total, 1)
        status = (
            f"{sample.ttft_ms:.0f} ms"
            if sample.ttft_ms is not None and sample.ok
            else (sample.error.value if sample.error else "?")
        )
        bar = "#" * filled + "." * (width - filled)
        left_s = (time.monotonic() - self.started) / self.done * (self.total - self.done)
        eta = f" ETA {left_s:.0f} s" if self.done < self.total else ""
        line = f"\r[{bar}] {self.done}/{self.total}{eta} {sample.target}/{sample.prompt}: {status}"
        self.stream.write(line[:120].ljust(120))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 120 + "\r")
            self.stream.flush()


class StoreTrouble(Exception):
    """The database did not take the samples (they wait in the spool)."""


async def probe_once(
    plan: RunPlan,
    *,
    connection: str,
    limits: ProviderLimits,
    on_sample: Progress | None,
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
        freeze_heap()
        outcome = await execute(context, job=ADHOC_JOB, plan=plan, connection=connection, on_sample=on_sample)
        if opened is not None and opened.spool.depth:
            raise StoreTrouble(
                f"the database did not take the samples; {opened.spool.depth} wait in the spool and are "
                "written by the next run or by the daemon"
            )
        return outcome.samples


def failure_lines(samples: list[Sample]) -> list[str]:
    """One line per distinct failure: the class, how often, and the server's message (redacted, on one
    line and capped by the probe; again here, for a terminal, whatever produced the sample)."""
    counts = Counter((s.target, s.error.value, s.error_message) for s in samples if s.error is not None)
    return [f"{target}: {error} x{n}: {capped(text or '', MESSAGE_CAP)}" for (target, error, text), n in counts.items()]


def run_probe(options: ProbeOptions, *, stdout: TextIO, stderr: TextIO, environ: dict[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    try:
        config = _load(options, env)
        targets = build_targets(options, config, env)
        prompts = build_prompts(options, config)
    except ConfigError as exc:
        stderr.write(f"{exc}\n")
        return EXIT_USAGE
    except UsageError as exc:
        stderr.write(f"ttft-monitor probe: {exc}\n")
        return EXIT_USAGE
    plan = RunPlan(
        targets=tuple(targets),
        prompts=tuple(prompts),
        rounds=options.rounds,
        warmup=options.warmup,
        pause_s=options.pause_s,
        concurrency=options.concurrency,
    )
    limits_map = {name: p.max_concurrency for name, p in config.providers.items()} if config is not None else {}
    # Ad-hoc endpoints get the requested concurrency; configured ones keep their provider's cap.
    limits_map.update({t.provider: options.concurrency for t in targets if t.provider not in limits_map})
    progress = Progress(len(targets) * len(prompts) * (options.rounds + options.warmup), stderr)
    if options.store and config is None:
        stderr.write("ttft-monitor probe: --store needs a config file with a database (pass --config)\n")
        return EXIT_USAGE
    try:
        samples = asyncio.run(
            probe_once(
                plan,
                connection=options.connection,
                limits=ProviderLimits(limits_map),
                on_sample=progress,
                config=config,
                store=options.store,
            )
        )
    except (InfrastructureError, StoreTrouble) as exc:
        progress.close()
        stderr.write(f"ttft-monitor probe: {exc}\n")
        return EXIT_INFRA
    except KeyboardInterrupt:
        progress.close()
        stderr.write("interrupted\n")
        return 130
    progress.close()
    rows = summarize(samples)
    if options.output_format == "json":
        stdout.write(render_json(samples, rows) + "\n")
    elif options.output_format == "csv":
        stdout.write(render_csv(samples))
    else:
        stdout.write(render_table(rows, show_setup=options.connection == "fresh") + "\n")
    if options.report_path:
        from monitor.web.report import write_probe_report

        problem = write_probe_report(options.report_path, samples)
        if problem:
            stderr.write(f"ttft-monitor probe: {problem}\n")
            return EXIT_USAGE
    measured = [s for s in samples if not s.warmup]
    if measured and not any(s.ok for s in measured):
        stderr.write("every probe failed:\n")
        for line in failure_lines(measured):
            stderr.write(f"  {line}\n")
        return EXIT_FAILED
    if options.output_format != "table":
        for line in failure_lines(measured):
            stderr.write(f"failed: {line}\n")
    return EXIT_OK


def probe_main(options: ProbeOptions) -> int:
    return run_probe(options, stdout=sys.stdout, stderr=sys.stderr)
