"""`ttft-monitor probe`: the ad-hoc comparison, no database needed (monitor.adhoc runs it).

Exit codes: 0 done, 1 every measured probe failed, 2 usage or config error, 3 the database did not take the
samples (--store), 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING, TextIO
from urllib.parse import urlsplit

from monitor.commands.args import DEFAULT_CONFIG_ENV, config_arg, non_negative, positive, whole_number
from monitor.commands.sim import SIM_DEFAULT_PORT
from monitor.exitcodes import EXIT_FAILED, EXIT_INFRA, EXIT_OK, EXIT_USAGE
from monitor.probe.apis import FLAVORS

if TYPE_CHECKING:
    from monitor.adhoc import ProbeOptions
    from monitor.probe.result import Sample
    from monitor.probe.settings import Prices

NAME = "probe"

_positive_int = whole_number(1)
_rounds = whole_number(1, 1000)
_warmup = whole_number(0, 100)
_pause = non_negative("seconds", maximum=3600)
_timeout = positive("seconds", maximum=3600)


def _token_list(text: str) -> list[int]:
    """--prompt-tokens; argparse names the option before the message."""
    from monitor.adhoc import UsageError, parse_token_list

    try:
        return parse_token_list(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(parser: argparse.ArgumentParser) -> None:
    config_arg(parser)
    what = parser.add_argument_group("what to probe")
    what.add_argument("--target", "-t", action="append", default=[], help="target from the config (repeatable)")
    what.add_argument("--url", help="one-off endpoint base URL, e.g. http://127.0.0.1:8000/v1")
    what.add_argument(
        "--api",
        default="openai-chat",
        choices=list(FLAVORS),
        help="API of --url (default: openai-chat)",
    )
    what.add_argument("--model", help="model name for --url")
    what.add_argument("--api-key-env", help="environment variable holding the key for --url")
    what.add_argument("--max-tokens", type=_positive_int, default=64, help="max_tokens for --url (default 64)")
    what.add_argument("--extra-body", help="JSON object merged into the request for --url")
    what.add_argument(
        "--reasoning",
        choices=["default", "least"],
        default="default",
        help="least: ask --url for the least reasoning its API allows, as params.reasoning does (docs/cost.md)",
    )
    what.add_argument("--reasoning-effort", help="with --reasoning least: the effort level to send, e.g. low or none")
    what.add_argument("--no-usage", action="store_true", help="do not send stream_options.include_usage (for --url)")
    prompts = parser.add_argument_group("prompts")
    prompts.add_argument("--prompt", action="append", default=[], help="prompt profile from the config (repeatable)")
    prompts.add_argument(
        "--prompt-tokens", type=_token_list, default=[], help="prompt sizes in tokens, e.g. 2000,16000 or 2k,16k"
    )
    prompts.add_argument("--language", choices=["en", "zh"], default="en", help="language for --prompt-tokens")
    prompts.add_argument(
        "--cache",
        choices=["bust", "warm"],
        help="bust (default): a unique nonce first so no prefix cache answers; warm: repeat one prompt",
    )
    how = parser.add_argument_group("how")
    how.add_argument("--rounds", "-n", type=_rounds, default=5, help="measured requests per series (5)")
    how.add_argument("--warmup", type=_warmup, default=1, help="unmeasured requests first (1)")
    how.add_argument("--pause", type=_pause, default=1.0, help="seconds between rounds of a series (1)")
    how.add_argument(
        "--connection",
        choices=["reuse", "fresh"],
        default="reuse",
        help="reuse (default): keep-alive; fresh: new connection per request, set-up shown separately",
    )
    how.add_argument("--concurrency", type=_positive_int, default=1, help="requests in flight at once (1)")
    how.add_argument("--timeout-first-token", type=_timeout, default=60.0, help="seconds, for --url (60)")
    how.add_argument("--timeout-total", type=_timeout, default=300.0, help="seconds, for --url (300)")
    how.add_argument("--format", "-f", choices=["table", "json", "csv"], default="table", help="output (table)")
    how.add_argument(
        "--store", action="store_true", help="also write the samples to the config's database (job name adhoc)"
    )
    how.add_argument(
        "--report", metavar="FILE", help="also write the comparison report (HTML; .md or .json by extension)"
    )
    how.add_argument(
        "--with-sim",
        action="store_true",
        help=f"start the built-in simulator on 127.0.0.1:{SIM_DEFAULT_PORT} for the duration (demo, tests)",
    )


def options_of(args: argparse.Namespace) -> ProbeOptions:
    from monitor.adhoc import ProbeOptions
    from monitor.probe.endpoint import Timeouts

    return ProbeOptions(
        config_path=args.config or os.environ.get(DEFAULT_CONFIG_ENV),
        targets=args.target,
        url=args.url,
        api=args.api,
        model=args.model,
        api_key_env=args.api_key_env,
        max_tokens=args.max_tokens,
        extra_body=args.extra_body,
        reasoning=args.reasoning,
        reasoning_effort=args.reasoning_effort,
        include_usage=not args.no_usage,
        prompts=args.prompt,
        prompt_tokens=args.prompt_tokens,
        language=args.language,
        cache=args.cache,
        rounds=args.rounds,
        warmup=args.warmup,
        pause_s=args.pause,
        connection=args.connection,
        concurrency=args.concurrency,
        output_format=args.format,
        store=args.store,
        report_path=args.report,
        timeouts=Timeouts(
            connect=min(10.0, args.timeout_first_token),
            first_token=args.timeout_first_token,
            total=max(args.timeout_total, args.timeout_first_token),
        ),
    )


def main(args: argparse.Namespace) -> int:
    from monitor.logging import configure_logging
    from monitor.sim.process import simulator_process

    # stdout carries the table / JSON / CSV; only warnings go to stderr.
    configure_logging(stream=sys.stderr, level=logging.WARNING)
    options = options_of(args)
    if not args.with_sim:
        return run_probe(options, stdout=sys.stdout, stderr=sys.stderr)
    if options.url and urlsplit(options.url).port not in (None, SIM_DEFAULT_PORT):
        print(f"ttft-monitor probe: --with-sim serves on port {SIM_DEFAULT_PORT}; point --url there", file=sys.stderr)
        return EXIT_USAGE
    try:
        with simulator_process(SIM_DEFAULT_PORT):
            return run_probe(options, stdout=sys.stdout, stderr=sys.stderr)
    except RuntimeError as exc:
        print(f"ttft-monitor probe: {exc}", file=sys.stderr)
        return EXIT_USAGE


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


def failure_lines(samples: list[Sample]) -> list[str]:
    """One line per distinct failure: the class, how often, and the server's message (redacted, on one
    line and capped by the probe; again here, for a terminal, whatever produced the sample)."""
    from monitor.servertext import MESSAGE_CAP, capped

    counts = Counter((s.target, s.error.value, s.error_message) for s in samples if s.error is not None)
    return [f"{target}: {error} x{n}: {capped(text or '', MESSAGE_CAP)}" for (target, error, text), n in counts.items()]


def run_probe(options: ProbeOptions, *, stdout: TextIO, stderr: TextIO, environ: dict[str, str] | None = None) -> int:
    import asyncio

    from monitor.adhoc import StoreTrouble, UsageError, prepare, probe_once
    from monitor.app import InfrastructureError
    from monitor.config.cost import prices_for
    from monitor.config.errors import ConfigError
    from monitor.probe.report import render_csv, render_json, render_table, summarize
    from monitor.probe.spend import run_spend, spend_line

    env = dict(os.environ if environ is None else environ)
    try:
        prepared = prepare(options, env)
    except ConfigError as exc:
        stderr.write(f"{exc}\n")
        return EXIT_USAGE
    except UsageError as exc:
        stderr.write(f"ttft-monitor probe: {exc}\n")
        return EXIT_USAGE
    plan = prepared.plan
    config = prepared.config

    def prices_of(target: str) -> Prices | None:
        # A --url target is not in the config: it has no prices.
        return prices_for(config, target) if config is not None and target in config.targets else None

    progress = Progress(len(plan.targets) * len(plan.prompts) * (options.rounds + options.warmup), stderr)
    try:
        samples = asyncio.run(
            probe_once(
                plan,
                connection=options.connection,
                limits=prepared.limits,
                on_sample=progress,
                config=prepared.config,
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
    # What the run spent: under the table, and on stderr beside JSON and CSV so their output stays data.
    (stdout if options.output_format == "table" else stderr).write(spend_line(run_spend(samples, prices_of)) + "\n")
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
