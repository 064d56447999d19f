"""`incidents ack|resolve|label|stats` and `annotate` as a user runs them (child processes), on both
databases: what they print, and the exit code with one clear line, never a traceback, when they fail."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.exitcodes import EXIT_FAILED, EXIT_INFRA, EXIT_OK, EXIT_USAGE
from tests.support.alert_fixtures import store_incident
from tests.support.ports import free_port
from tests.support.store_fixtures import Backend
from tests.support.triage import cli, write_config

pytest_plugins = ("tests.support.store_fixtures", "tests.support.alert_fixtures")


@pytest.fixture
def backend(alert_backend: Backend) -> Backend:
    return alert_backend


@pytest.fixture
async def engine(backend: Backend) -> AsyncEngine:  # type: ignore[misc]
    engine = backend.engine()
    yield engine
    await engine.dispose()


@pytest.mark.realtime
async def test_ack_label_resolve_and_stats_from_the_command_line(
    tmp_path: Path, backend: Backend, engine: AsyncEngine
) -> None:
    now = datetime.now(UTC)
    incident = await store_incident(engine, opened_at=now - timedelta(minutes=20))
    other = await store_incident(engine, target="gpt-4o-mini", severity="ticket", opened_at=now - timedelta(hours=2))
    config = write_config(tmp_path, backend.url)
    short = str(incident)[:8]

    result = cli(config, "annotate", "vLLM upgraded", "--target", "qwen3-8b")
    assert result.code == EXIT_OK and "annotation 'vLLM upgraded' recorded at" in result.stdout, result
    result = cli(config, "incidents", "ack", short)
    assert result.code == EXIT_OK and f"acknowledged incident {short} (regression, page)" in result.stdout, result
    assert "as alice" in result.stdout
    result = cli(config, "incidents", "ack", short, "--by", "bob")
    assert result.code == EXIT_OK and "already acknowledged by alice" in result.stdout, result
    result = cli(config, "incidents", "label", short, "true-positive")
    assert result.code == EXIT_OK, result
    result = cli(config, "incidents", "label", str(other), "false-positive")
    assert result.code == EXIT_OK, result
    result = cli(config, "incidents", "resolve", short, "--note", "rolled back")
    assert result.code == EXIT_OK, result
    assert f"resolved incident {short}" in result.stdout and "queued for console" in result.stdout

    result = cli(config, "incidents", "--format", "json")
    assert result.code == EXIT_OK, result
    shown = {item["id"]: item for item in json.loads(result.stdout)}
    mine = shown[str(incident)]
    assert (mine["state"], mine["acked_by"], mine["label"], mine["resolved_by"], mine["note"]) == (
        "resolved",
        "alice",
        "true-positive",
        "alice",
        "rolled back",
    )
    assert [a["text"] for a in mine["annotations"]] == ["vLLM upgraded"]
    result = cli(config, "incidents")
    assert result.code == EXIT_OK and "  label: true-positive" in result.stdout, result
    assert "qwen3-8b: vLLM upgraded (by alice)" in result.stdout

    result = cli(config, "incidents", "stats")
    assert result.code == EXIT_OK, result
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in result.stdout.splitlines()[1:-1]}
    assert rows[("regression", "page")] == ["100%", "1", "0", "0", "0"]
    assert rows[("regression", "ticket")] == ["0%", "0", "1", "0", "0"]
    assert rows[("all", "all")] == ["50%", "1", "1", "0", "0"]
    # These incidents have no runs behind them: no series-weeks to rate them over, and it says so.
    assert "regression alerts: 2 over 0.0 series-weeks of runs, too little for a weekly rate" in result.stdout
    result = cli(config, "incidents", "stats", "--format", "json")
    assert [(r["kind"], r["severity"], r["precision"]) for r in json.loads(result.stdout)][-1] == ("all", "all", 0.5)


@pytest.mark.realtime
async def test_bad_input_and_refusals_exit_with_one_line(tmp_path: Path, backend: Backend, engine: AsyncEngine) -> None:
    incident = await store_incident(engine)
    config = write_config(tmp_path, backend.url)
    cases = [
        (("incidents", "ack", "ffffffff"), EXIT_USAGE, "no incident with id 'ffffffff'"),
        (("incidents", "ack", "zz"), EXIT_USAGE, "'zz' is not an incident id"),
        (("incidents", "label", str(incident), "maybe"), EXIT_USAGE, "invalid choice: 'maybe'"),
        (("annotate", "   "), EXIT_USAGE, "the annotation text is empty"),
        (("annotate", "x", "--target", "nope"), EXIT_USAGE, "no target named 'nope' in the config (known: qwen3-8b)"),
        (("annotate", "x" * 501), EXIT_USAGE, "keep it to 500"),
        # A terminal escape, NUL (PostgreSQL cannot store it) or a bidi override would rewrite what
        # `incidents` and chat receivers show.
        (("annotate", "ok\x1b[2J\x1b[31mFAKE"), EXIT_USAGE, "contains the control character U+001B"),
        (("incidents", "stats", "--days", "1e6"), EXIT_USAGE, "must be at most 36500"),
        (("annotate", "a\x07b"), EXIT_USAGE, "contains the control character U+0007"),
        (("annotate", "rollback \u202egnp.exe"), EXIT_USAGE, "contains the control character U+202E"),
        (("incidents", "resolve", str(incident), "--note", "x\x1by"), EXIT_USAGE, "--note contains"),
        (("annotate", "vLLM 0.9 → 0.10 升级 ✅"), EXIT_OK, "annotation 'vLLM 0.9 → 0.10 升级 ✅' recorded"),
        (("incidents", "resolve", str(incident)), EXIT_OK, "resolved incident"),
        (("incidents", "resolve", str(incident)), EXIT_FAILED, "is already resolved at"),
        (("incidents", "ack", str(incident)), EXIT_FAILED, "only an open incident can be acknowledged"),
    ]
    for args, code, text in cases:
        result = cli(config, *args)
        assert result.code == code, (args, result)
        assert text in (result.stderr if code else result.stdout), (args, result)
        if code:
            assert len(result.stderr.strip().splitlines()) == 1, (args, result)


@pytest.mark.parametrize(
    "args", [("incidents", "ack", "0e6f1a52"), ("incidents", "stats"), ("annotate", "vLLM upgraded")]
)
def test_an_unreachable_database_exits_3(tmp_path: Path, args: tuple[str, ...]) -> None:
    config = write_config(tmp_path, f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/nothing")
    result = cli(config, *args)
    assert result.code == EXIT_INFRA, result
    assert len(result.stderr.strip().splitlines()) == 1 and "127.0.0.1" in result.stderr, result


def test_a_database_without_the_schema_exits_3_and_says_what_to_run(tmp_path: Path) -> None:
    result = cli(write_config(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"), "incidents", "stats")
    assert result.code == EXIT_INFRA and "ttft-monitor db upgrade" in result.stderr, result


@pytest.mark.parametrize(
    ("given", "environ", "expected"),
    [
        ("bob", {"USER": "alice"}, "bob"),
        (None, {"USER": "alice"}, "alice"),
        ("  eve\n[PAGE] fake  ", {}, "eve [PAGE] fake"),
        ("x" * 300, {}, "x" * 200),
        ("ev\x1b[31me\u202e", {}, "ev[31me"),
    ],
)
def test_who_is_one_short_line(given: str | None, environ: dict[str, str], expected: str) -> None:
    from monitor.triage.inputs import who

    assert who(given, environ) == expected
