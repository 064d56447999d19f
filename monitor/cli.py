"""Command line: parse, call, print. Exit codes: 0 ok, 1 probes failed, 2 usage or config error."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from monitor import __version__
from monitor.cliargs import (
    DEFAULT_CONFIG_ENV,
    OneLineErrorParser,
    config_arg,
    config_path,
    non_negative,
    port_number,
    positive,
    whole_number,
)

if TYPE_CHECKING:
    from monitor.logging import Redactor
    from monitor.probe_command import ProbeOptions

from monitor.commandline import load_config_or_explain
from monitor.exitcodes import EXIT_INFRA, EXIT_OK, EXIT_USAGE
from monitor.probe.apis import FLAVORS

SIM_DEFAULT_PORT = 8400


_config_arg = config_arg
_positive_int = whole_number(1)
_rounds = whole_number(1, 1000)
_warmup = whole_number(0, 100)
_seconds = non_negative("seconds")
_pause = non_negative("seconds", maximum=3600)
_timeout = positive("seconds", maximum=3600)


def _token_list(text: str) -> list[int]:
    """--prompt-tokens; argparse names the option before the message."""
    from monitor.probe_command import UsageError, parse_token_list

    try:
        return parse_token_list(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="ttft-monitor",
        description="Measure and watch LLM endpoints' time to first token (TTFT).",
    )
    parser.add_argument("--version", action="version", version=f"ttft-monitor {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    probe = commands.add_parser(
        "probe",
        help="measure TTFT now, ad hoc (no database needed)",
        description="Stream requests to targets from the config, or to one endpoint given by --url, and "
        "print TTFT and the phases around it.",
    )
    _config_arg(probe)
    what = probe.add_argument_group("what to probe")
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
    what.add_argument("--no-usage", action="store_true", help="do not send stream_options.include_usage (for --url)")
    prompts = probe.add_argument_group("prompts")
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
    how = probe.add_argument_group("how")
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

    sim = commands.add_parser(
        "sim",
        help="serve the built-in LLM API simulator",
        description="Serve /v1/chat/completions, /v1/completions, /v1/messages and /v1/models with "
        "realistic latency, a prefix cache and faults on demand (control API under /sim/).",
    )
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=port_number, default=SIM_DEFAULT_PORT, help="0 picks a free port")
    sim.add_argument("--no-noise", action="store_true", help="exact latencies (noise sigma 0)")
    sim.add_argument("--seed", type=int, help="seed the noise for repeatable runs")
    sim.add_argument("--api-key-env", help="require the key in this environment variable")

    check = commands.add_parser("check-config", help="validate the config and show the jobs' next run times")
    _config_arg(check)

    run = commands.add_parser(
        "run",
        help="the daemon: run the config's jobs on their schedules",
        description="Run every job on its cron schedule, store the samples, serve /metrics, /healthz and "
        "/readyz. SIGTERM/SIGINT stop it gracefully; SIGHUP reloads the config (a bad file is rejected).",
    )
    _config_arg(run)

    once = commands.add_parser(
        "once",
        help="run the job(s) once, store, push metrics, exit (Kubernetes CronJob)",
        description=(
            "Exit status: 0 done, 1 every probe failed, 2 config error, 3 database or spool trouble, "
            "4 stopped by SIGTERM/SIGINT (what was measured is stored or spooled), "
            "5 the Pushgateway refused the metrics or could not be reached."
        ),
    )
    _config_arg(once)
    once.add_argument("--job", action="append", default=[], help="only this job (repeatable); default: all")

    # Registration modules import argparse only: `ttft-monitor once` must start fast.
    from monitor.alert.commands import register as register_alert
    from monitor.store.commands import register as register_db
    from monitor.triage.commands import register as register_triage

    register_db(commands)
    register_alert(commands)
    register_triage(commands)
    from monitor.detect.cli import register as register_replay

    register_replay(commands)

    demo = commands.add_parser(
        "demo",
        help="the simulator and the real daemon, with a regression that opens and resolves (start here)",
        description="Starts the simulator and `ttft-monitor run` on SQLite in a state directory, probes three "
        "simulated models every 5 s with a short and a long prompt, prints a live table, makes one model slower "
        "after a minute so a regression incident opens (the log receiver prints it) and resolves. Ctrl-C stops.",
    )
    demo.add_argument("--state-dir", default="state/demo", help="where the demo keeps its database (state/demo)")
    demo.add_argument("--slow-after", type=_seconds, default=60, help="seconds before the slowdown (60)")
    demo.add_argument("--recover-after", type=_seconds, default=150, help="seconds before recovery (150)")
    demo.add_argument("--duration", type=_seconds, default=None, help="stop after this many seconds (default: Ctrl-C)")

    serve = commands.add_parser(
        "serve",
        help="serve the status pages and JSON API alone, read-only (no probing)",
        description="Serve the status pages (overview, series, compare, incidents) and /api/v1/ from the config's "
        "database, read-only, with /healthz and /readyz. `run` serves the same pages on metrics.listen.",
    )
    _config_arg(serve)
    serve.add_argument("--listen", default="127.0.0.1:9464", help="HOST:PORT to serve on (127.0.0.1:9464)")
    serve.add_argument(
        "--hash-password",
        action="store_true",
        help="read a password on stdin and print its hash for web.basic_password_hash, then exit",
    )

    report = commands.add_parser(
        "report",
        help="the comparison of targets and prompt sizes from the stored history, as HTML, Markdown or JSON",
        description="TTFT median, p90, n and 95% bootstrap interval per target and prompt, pairwise differences "
        "and prefill slopes: the numbers of the compare page. HTML is one self-contained file that opens offline.",
    )
    _config_arg(report)
    report.add_argument("--since", default="7d", help="how far back, e.g. 24h, 7d, 30d (7d)")
    report.add_argument("--until", help="end of the window, ISO 8601 with a zone (default: now)")
    report.add_argument("--target", "-t", action="append", default=[], help="only this target (repeatable)")
    report.add_argument("--prompt", action="append", default=[], help="only this prompt profile (repeatable)")
    report.add_argument("--location", action="append", default=[], help="only this location (repeatable)")
    report.add_argument("--format", "-f", choices=["html", "md", "json"], default="html", help="output (html)")
    report.add_argument("--output", "-o", help="write to this file (default: standard output)")
    return parser


def _probe_options(args: argparse.Namespace) -> ProbeOptions:
    from monitor.probe.endpoint import Timeouts
    from monitor.probe_command import ProbeOptions

    return ProbeOptions(
        config_path=args.config or os.environ.get(DEFAULT_CONFIG_ENV),
        targets=args.target,
        url=args.url,
        api=args.api,
        model=args.model,
        api_key_env=args.api_key_env,
        max_tokens=args.max_tokens,
        extra_body=args.extra_body,
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


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


@contextmanager
def simulator_process(port: int = SIM_DEFAULT_PORT) -> Iterator[None]:
    """The simulator in a child process: measuring a server on our own event loop would skew TTFT."""
    if _port_open("127.0.0.1", port):
        print(f"using the server already listening on 127.0.0.1:{port}", file=sys.stderr)
        yield
        return
    child = subprocess.Popen(
        [sys.executable, "-m", "monitor", "sim", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 15
        while not _port_open("127.0.0.1", port):
            if child.poll() is not None or time.monotonic() > deadline:
                err = child.stderr.read().decode(errors="replace") if child.stderr else ""
                raise RuntimeError(f"the simulator did not start on port {port}: {err.strip()[-300:]}")
            time.sleep(0.05)
        yield
    finally:
        child.terminate()
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()


def _cmd_probe(args: argparse.Namespace) -> int:
    from monitor.logging import configure_logging

    # stdout carries the table / JSON / CSV; only warnings go to stderr.
    from monitor.probe_command import probe_main

    configure_logging(stream=sys.stderr, level=logging.WARNING)
    options = _probe_options(args)
    if not args.with_sim:
        return probe_main(options)
    if options.url and urlsplit(options.url).port not in (None, SIM_DEFAULT_PORT):
        print("ttft-monitor probe: --with-sim serves on port 8400; point --url there", file=sys.stderr)
        return EXIT_USAGE
    try:
        with simulator_process():
            return probe_main(options)
    except RuntimeError as exc:
        print(f"ttft-monitor probe: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _cmd_sim(args: argparse.Namespace) -> int:
    from monitor.sim.server import run

    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            print(f"ttft-monitor sim: environment variable {args.api_key_env} is not set", file=sys.stderr)
            return EXIT_USAGE
    try:
        run(args.host, args.port, noise=not args.no_noise, seed=args.seed, api_key=api_key)
    except OSError as exc:
        print(
            f"ttft-monitor sim: cannot listen on {args.host}:{args.port}: {exc.strerror}; "
            "choose another --port or stop what uses it",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return EXIT_OK


def _cmd_check_config(args: argparse.Namespace) -> int:
    from monitor.config.check import check_config

    code, text = check_config(config_path(args.config))
    (sys.stdout if code == 0 else sys.stderr).write(text.rstrip("\n") + "\n")
    return code


def _setup_logging() -> Redactor:
    from monitor.logging import configure_logging

    return configure_logging()


def _cmd_run(args: argparse.Namespace) -> int:
    from monitor.daemon import run_daemon

    redactor = _setup_logging()
    return asyncio.run(run_daemon(config_path(args.config), redactor=redactor))


def _cmd_once(args: argparse.Namespace) -> int:
    from monitor.daemon import run_once

    redactor = _setup_logging()
    return asyncio.run(run_once(config_path(args.config), job_names=args.job, redactor=redactor))


def _cmd_db(args: argparse.Namespace) -> int:
    from monitor.store.cli import run as run_db

    return run_db(args)


def _cmd_alert(args: argparse.Namespace) -> int:
    from monitor.alert.cli import run as run_alert

    _setup_logging()
    return run_alert(args)


def _cmd_incidents(args: argparse.Namespace) -> int:
    if getattr(args, "incidents_command", None) is None:
        return _cmd_alert(args)
    return _cmd_triage(args)


def _cmd_triage(args: argparse.Namespace) -> int:
    from monitor.logging import configure_logging
    from monitor.triage.cli import run as run_triage

    # stdout says what was done; the outbox's log lines (warnings only) go to stderr.
    configure_logging(stream=sys.stderr, level=logging.WARNING)
    return run_triage(args)


def _cmd_replay(args: argparse.Namespace) -> int:
    from monitor.detect.cli import run as run_replay

    return run_replay(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from monitor.demo import run_demo

    return run_demo(
        state_dir=Path(args.state_dir),
        slow_after_s=args.slow_after,
        recover_after_s=args.recover_after,
        duration_s=args.duration,
    )


def _cmd_serve(args: argparse.Namespace) -> int:
    if args.hash_password:
        import getpass

        from monitor.web.auth import hash_password

        password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
        if not password:
            print("ttft-monitor serve: an empty password cannot be hashed; type one", file=sys.stderr)
            return EXIT_USAGE
        print(hash_password(password))
        return EXIT_OK
    from monitor.config.urls import check_listen_address
    from monitor.web.serve import serve

    try:
        check_listen_address(args.listen)
    except ValueError as exc:
        print(f"ttft-monitor serve: --listen: {exc}", file=sys.stderr)
        return EXIT_USAGE
    config = load_config_or_explain(args.config, sys.stderr)
    if config is None:
        return EXIT_USAGE
    return asyncio.run(serve(config, args.listen))


def _cmd_report(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from monitor.web.api import BadRequest, parse_duration, parse_time
    from monitor.web.report import render, report_from_store

    try:
        since = parse_duration(args.since)
        until = parse_time(args.until, "until") if args.until else datetime.now(UTC)
    except BadRequest as exc:
        print(f"ttft-monitor report: --{exc}", file=sys.stderr)
        return EXIT_USAGE
    config = load_config_or_explain(args.config, sys.stderr)
    if config is None:
        return EXIT_USAGE

    async def build() -> dict[str, object]:
        from monitor.store.engine import create_engine
        from monitor.store.schema import ensure_current

        engine = create_engine(config.database.url)
        try:
            await ensure_current(engine)  # a schema behind or missing names `db upgrade`, not a missing table
            return await report_from_store(
                engine, since=since, now=until, targets=args.target, prompts=args.prompt,
                locations=args.location,
            )  # fmt: skip
        finally:
            await engine.dispose()

    from monitor.store.engine import StoreError, describe_db_error

    try:
        data = asyncio.run(build())
    except StoreError as exc:  # already one line naming the fix (SchemaBehind: `db upgrade`)
        print(f"ttft-monitor report: {exc}", file=sys.stderr)
        return EXIT_INFRA
    except Exception as exc:
        print(f"ttft-monitor report: {describe_db_error(exc, config.database.url)}", file=sys.stderr)
        return EXIT_INFRA
    # A name no stored series has is a typo, not an empty window: say so rather than print an empty report.
    available: dict[str, list[str]] = data["available"]  # type: ignore[assignment]
    for flag, asked, key in (("target", args.target, "targets"), ("prompt", args.prompt, "prompts"),
                             ("location", args.location, "locations")):  # fmt: skip
        unknown = [name for name in asked if name not in available[key]]
        if unknown:
            stored = ", ".join(available[key]) or "none yet"
            print(
                f"ttft-monitor report: --{flag} {', '.join(unknown)}: no stored series has this {flag} "
                f"(stored: {stored})",
                file=sys.stderr,
            )
            return EXIT_USAGE
    text = render(data, args.format, title=f"TTFT comparison, last {args.since}")
    if not args.output:
        sys.stdout.write(text)
        return EXIT_OK
    try:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        print(f"ttft-monitor report: cannot write {args.output}: {exc.strerror}; choose another -o", file=sys.stderr)
        return EXIT_USAGE
    print(f"ttft-monitor report: wrote {args.output} ({len(data['cells'])} cells)", file=sys.stderr)  # type: ignore[arg-type]
    return EXIT_OK


COMMANDS = {
    "probe": _cmd_probe,
    "sim": _cmd_sim,
    "check-config": _cmd_check_config,
    "run": _cmd_run,
    "once": _cmd_once,
    "db": _cmd_db,
    "alert": _cmd_alert,
    "incidents": _cmd_incidents,
    "annotate": _cmd_triage,
    "replay": _cmd_replay,
    "demo": _cmd_demo,
    "serve": _cmd_serve,
    "report": _cmd_report,
}


# The commands that measure import SQLAlchemy, pydantic and aiohttp before their first probe:
# hundreds of thousands of objects, none of them garbage, which the cyclic collector would walk again
# and again while they load (about 100 ms of a 1.4 s `once` start here). For these it stays off until
# `app.freeze_heap` collects once, freezes what start-up built and turns it back on.
MEASURING_COMMANDS = frozenset({"run", "once", "probe"})


def main(argv: Sequence[str] | None = None) -> int:
    gc.disable()
    try:
        args = build_parser().parse_args(argv)
        if args.command not in MEASURING_COMMANDS:
            gc.enable()
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        return 130
    finally:
        gc.enable()  # also when a measuring command ended before freeze_heap (a config error, say)
