"""Runs `incidents ack|resolve|label|stats` and `annotate`: parse, call monitor.triage.service, print.

Exit codes: 0 done (acknowledging an acknowledged incident too: the first acknowledgement is kept);
1 refused by the incident's state (acknowledging or resolving a resolved incident); 2 usage or config
error (an unknown or ambiguous id, an unknown target, empty text); 3 the database failed.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import unicodedata
from collections.abc import Awaitable, Callable
from typing import TextIO

from monitor.commandline import load_config_or_explain, run_against_database
from monitor.config.models import Config
from monitor.exitcodes import EXIT_OK, EXIT_USAGE
from monitor.triage.service import MAX_TEXT, Triage, TriageRefused, describe
from monitor.triage.stats import format_precision

MAX_BY = 200
# Characters that would let a note rewrite what a terminal or a chat shows around it: control
# characters (escape sequences, NUL, which PostgreSQL cannot store either) and bidirectional overrides.
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")


class UsageProblem(Exception):
    """Bad input found before touching the database."""


def command_name(args: argparse.Namespace) -> str:
    if args.command == "annotate":
        return "ttft-monitor annotate"
    return f"ttft-monitor incidents {args.incidents_command}"


def unsafe_character(text: str) -> str | None:
    """The first control or bidirectional-override character of `text` (as `U+001B`), else None."""
    for char in text:
        if unicodedata.category(char) == "Cc" or char in BIDI_CONTROLS:
            return f"U+{ord(char):04X}"
    return None


def plain(text: str, what: str) -> str:
    """`text` on one line (runs of whitespace become one space); UsageProblem when it holds a control
    character or is longer than MAX_TEXT (`what` names it in the error)."""
    line = " ".join(text.split())
    bad = unsafe_character(line)
    if bad is not None:
        raise UsageProblem(f"{what} contains the control character {bad}; give plain text")
    if len(line) > MAX_TEXT:
        raise UsageProblem(f"{what} is {len(line)} characters; keep it to {MAX_TEXT}")
    return line


def who(given: str | None, environ: dict[str, str] | None = None) -> str:
    """`--by`, else $USER, else the login name, else "unknown"."""
    env = os.environ if environ is None else environ
    # One line: the name goes into notifications ("Resolved by hand by NAME").
    name = " ".join((given or env.get("USER") or "").split())
    name = "".join(char for char in name if unsafe_character(char) is None)
    if not name:
        try:
            name = getpass.getuser()
        except Exception:  # no passwd entry in a container
            name = "unknown"
    return name[:MAX_BY]


def run(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    name = command_name(args)
    config = load_config_or_explain(getattr(args, "config", None), err)
    if config is None:
        return EXIT_USAGE
    try:
        action = _action(args, config, out)
    except UsageProblem as exc:
        err.write(f"{name}: {exc}\n")
        return EXIT_USAGE
    from monitor.store.triage import IncidentLookupError

    return run_against_database(
        _with_engine(config, action),
        command=name,
        url=config.database.url,
        err=err,
        usage_errors=(IncidentLookupError,),
        refusals=(TriageRefused,),
    )


async def _with_engine(config: Config, action: Callable[[Triage], Awaitable[int]]) -> int:
    from monitor.store.engine import create_engine
    from monitor.store.migrate import ensure_current

    engine = create_engine(config.database.url)
    try:
        await ensure_current(engine)
        return await action(Triage(engine, config))
    finally:
        await engine.dispose()


def _action(args: argparse.Namespace, config: Config, out: TextIO) -> Callable[[Triage], Awaitable[int]]:
    """The coroutine to run against the database, after the checks that need none."""
    if args.command == "annotate":
        text = plain(args.text, "the annotation text")
        if not text:
            raise UsageProblem('the annotation text is empty; say what changed, e.g. "vLLM upgraded"')
        if args.target is not None and args.target not in config.targets:
            known = ", ".join(sorted(config.targets)) or "none are defined"
            raise UsageProblem(f"--target: no target named '{args.target}' in the config (known: {known})")
        return lambda triage: _annotate(triage, text, args.target, who(args.by), out)
    action = args.incidents_command
    if action == "stats":
        return lambda triage: _stats(triage, args.days, args.format, out)
    by = who(args.by)
    if action == "ack":
        return lambda triage: _ack(triage, args.id, by, out)
    if action == "label":
        return lambda triage: _label(triage, args.id, args.label, by, out)
    note = plain(args.note, "--note") if args.note else None
    return lambda triage: _resolve(triage, args.id, note, by, out)


async def _ack(triage: Triage, given: str, by: str, out: TextIO) -> int:
    done = await triage.ack(given, by=by)
    if done.already:
        at = done.facts.acked_at.isoformat(timespec="seconds") if done.facts.acked_at else "?"
        out.write(f"incident {describe(done.facts)} was already acknowledged by {done.facts.acked_by} at {at}\n")
    else:
        out.write(
            f"acknowledged incident {describe(done.facts)} as {by}: no reminders or escalations will be sent; "
            "its resolve will\n"
        )
    return EXIT_OK


async def _label(triage: Triage, given: str, label: str, by: str, out: TextIO) -> int:
    facts = await triage.label(given, label, by=by)
    before = f" (was {facts.label})" if facts.label and facts.label != label else ""
    out.write(f"labelled incident {describe(facts)} {label}{before}\n")
    return EXIT_OK


async def _resolve(triage: Triage, given: str, note: str | None, by: str, out: TextIO) -> int:
    done = await triage.resolve(given, by=by, note=note)
    queued = sorted(item.receiver for item in done.enqueued if item.status == "pending")
    held = sorted(f"{item.receiver} ({item.reason})" for item in done.enqueued if item.status != "pending")
    if done.facts.group_id is not None and done.group_open:
        group = str(done.facts.group_id)[:8]
        told = (
            f"its group {group} (one page) stays open while {done.group_open} other member(s) are: "
            "resolve them too to close the page"
        )
    elif queued:
        told = f"resolve notification queued for {', '.join(queued)} (the running daemon sends it)"
    else:
        told = "no receiver takes its resolve notification"
    if held:
        told += f"; held back: {', '.join(held)}"
    out.write(f"resolved incident {describe(done.facts)} as {by}; {told}\n")
    return EXIT_OK


async def _annotate(triage: Triage, text: str, target: str | None, by: str, out: TextIO) -> int:
    item = await triage.annotate(text, target=target, by=by)
    scope = f"target {target}" if target else "every target"
    out.write(f"annotation '{item.text}' recorded at {item.at.isoformat(timespec='seconds')} for {scope}\n")
    return EXIT_OK


async def _stats(triage: Triage, days: float | None, output: str, out: TextIO) -> int:
    rows = await triage.stats(days=days)
    if output == "json":
        out.write(json.dumps([row.to_json() for row in rows], indent=2) + "\n")
    else:
        out.write(format_precision(rows))
    return EXIT_OK
