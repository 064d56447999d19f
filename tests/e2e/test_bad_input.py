"""Malformed config and command lines: one clear line naming the cause and the fix, exit 2, quickly."""

from __future__ import annotations

import copy
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.config.errors import ConfigError
from monitor.config.loader import MAX_YAML_VALUES, load_config
from tests.conftest import call_cli, run_cli

BASE: dict[str, Any] = {
    "providers": {"p": {"base_url": "http://127.0.0.1:9/v1", "api": "openai-chat"}},
    "targets": {"t": {"provider": "p", "model": "m"}},
    "prompts": {"s": {"tokens": 512}},
    "jobs": [{"name": "j", "schedule": "* * * * *", "targets": ["t"], "prompts": ["s"]}],
}


def config_with(tmp_path: Path, loc: tuple[str | int, ...], value: Any) -> Path:
    data = copy.deepcopy(BASE)
    node: Any = data
    for part in loc[:-1]:
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
    node[loc[-1]] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def only_error(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    (issue,) = caught.value.errors
    return f"{issue.path}: {issue.message}"


@pytest.mark.parametrize(
    ("loc", "value", "message"),
    [
        (("jobs", 0, "pause_s"), float("inf"), "jobs[0].pause_s: must be a finite number, got inf"),
        (("jobs", 0, "pause_s"), float("nan"), "jobs[0].pause_s: must be a finite number, got nan"),
        (("jobs", 0, "pause_s"), 86400, "jobs[0].pause_s: must be <= 3600, got 86400"),
        (("jobs", 0, "pause_s"), True, "jobs[0].pause_s: expected a number, got true"),
        (("jobs", 0, "rounds"), True, "jobs[0].rounds: expected an integer, got true"),
        (("jobs", 0, "warmup"), False, "jobs[0].warmup: expected an integer, got false"),
        (("jobs", 0, "jitter_s"), float("-inf"), "jobs[0].jitter_s: must be a finite number, got -inf"),
        (
            ("providers", "p", "timeout_s", "total"),
            float("inf"),
            "providers.p.timeout_s.total: must be a finite number, got inf",
        ),
        (
            ("providers", "p", "timeout_s", "connect"),
            -1,
            "providers.p.timeout_s.connect: must be > 0, got -1",
        ),
        (("providers", "p", "max_concurrency"), True, "providers.p.max_concurrency: expected an integer, got true"),
        (("prompts", "s", "tokens"), True, "prompts.s.tokens: expected an integer, got true"),
        (("shutdown_grace_s",), float("inf"), "shutdown_grace_s: must be a finite number, got inf"),
        (("database", "connect_retry_s"), float("nan"), "database.connect_retry_s: must be a finite number, got nan"),
        (("detection", "page", "ratio"), float("inf"), "detection.page.ratio: must be a finite number, got inf"),
        (("alerts", "renotify_interval_s"), True, "alerts.renotify_interval_s: expected a number, got true"),
    ],
)
def test_numbers_are_finite_in_range_and_never_booleans(
    tmp_path: Path, loc: tuple[str | int, ...], value: Any, message: str
) -> None:
    assert only_error(config_with(tmp_path, loc, value)) == message


def test_a_boolean_still_works_where_a_boolean_belongs(tmp_path: Path) -> None:
    config = load_config(config_with(tmp_path, ("providers", "p", "include_usage"), False), environ={})
    assert config.providers["p"].include_usage is False


def test_yaml_infinity_written_by_hand_is_refused(tmp_path: Path) -> None:
    text = yaml.safe_dump(BASE).replace("schedule:", "pause_s: .inf\n  schedule:")
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    assert only_error(path) == "jobs[0].pause_s: must be a finite number, got inf"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--pause", "inf"], "argument --pause: 'inf' is not a finite number of seconds"),
        (["--pause", "nan"], "argument --pause: 'nan' is not a finite number of seconds"),
        (["--pause", "-1"], "argument --pause: -1 must be 0 or more"),
        (["--pause", "7200"], "argument --pause: 7200 must be at most 3600"),
        (["--timeout-first-token", "-1"], "argument --timeout-first-token: -1 must be more than 0"),
        (["--timeout-first-token", "0"], "argument --timeout-first-token: 0 must be more than 0"),
        (["--timeout-total", "inf"], "argument --timeout-total: 'inf' is not a finite number of seconds"),
        (["--rounds", "true"], "argument --rounds/-n: 'true' is not a whole number"),
        (["--rounds", "0"], "argument --rounds/-n: 0 must be at least 1"),
        (["--warmup", "-1"], "argument --warmup: -1 must be at least 0"),
    ],
)
def test_probe_arguments_are_finite_and_in_range(args: list[str], line: str) -> None:
    result = call_cli("probe", "--url", "http://127.0.0.1:9/v1", "--model", "m", *args)
    assert result.code == 2, result
    assert result.stderr == f"ttft-monitor probe: error: {line} (see ttft-monitor probe --help)\n", result


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_sim_refuses_a_port_that_does_not_exist(port: str) -> None:
    result = call_cli("sim", "--port", port)
    assert result.code == 2, result
    (line,) = result.stderr.splitlines()
    assert line.startswith("ttft-monitor sim: error: argument --port: "), result
    assert "is not a port number" in line and line.endswith("(see ttft-monitor sim --help)"), result


def test_sim_refuses_a_port_in_use_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = call_cli("sim", "--port", str(port))
    assert result.code == 2, result
    assert result.stderr == (
        f"ttft-monitor sim: cannot listen on 127.0.0.1:{port}: error while attempting to bind on address "
        f"('127.0.0.1', {port}): address already in use; choose another --port or stop what uses it\n"
    ), result


BILLION_LAUGHS = "\n".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]"
            for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
        ),
    ]
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            BILLION_LAUGHS,
            f"YAML anchors and aliases (&name / *name) expand to more than {MAX_YAML_VALUES} values, which no "
            "config needs (an alias bomb?); write the values out or use fewer aliases",
        ),
        (
            "a: &a [1, *a]\n",
            "a YAML alias refers to a value that contains it (an endless loop); remove it",
        ),
        (
            "a: " + "[" * 20000 + "]" * 20000 + "\n",
            "values are nested more than 64 levels deep, which no config needs; check the brackets and indentation",
        ),
        (
            "#" * (1024 * 1024 + 1),
            "is larger than 1 MiB, which no config needs; check that --config names the right file",
        ),
    ],
    ids=["billion-laughs", "recursive-alias", "deep-nesting", "huge-file"],
)
def test_check_config_refuses_a_hostile_yaml_file_quickly_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(text, encoding="utf-8")
    started = time.monotonic()
    result = run_cli("check-config", "--config", str(path), timeout=30)
    elapsed = time.monotonic() - started
    assert result.code == 2, result
    assert result.stderr == f"{path}: {message}\n", result
    # The unbounded expansion ran past 30 s at 824 MB; 15 s leaves room for a loaded CI machine.
    assert elapsed < 15, f"took {elapsed:.1f} s"


def test_anchors_and_merge_keys_of_normal_size_still_work(tmp_path: Path) -> None:
    text = yaml.safe_dump(BASE) + ("x-defaults: &defaults {provider: p, model: m}\n")
    text = text.replace("targets:\n  t:\n", "targets:\n  t2:\n    <<: *defaults\n  t:\n")
    text = text.replace("x-defaults: &defaults {provider: p, model: m}\n", "")
    text = "defaults_holder: &defaults {provider: p, model: m}\n" + text
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:  # the holder key is unknown: proves the alias parsed
        load_config(path, environ={})
    assert [issue.path for issue in caught.value.errors] == ["defaults_holder"]


GOOD_WHSEC = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        (
            "whsec_not-base64!",
            "the webhook secret starts with whsec_ but the rest is not base64; make one with "
            "`ttft-monitor alert new-secret`",
        ),
        (
            "a-plain-shared-secret",
            "a webhook signing secret must be whsec_ followed by base64 (the Standard Webhooks format, which the "
            "standard's libraries expect); make one with `ttft-monitor alert new-secret`",
        ),
        (
            "whsec_c2hvcnQ=",
            "the webhook secret holds 5 bytes, fewer than the 24 the Standard Webhooks spec asks for; make one "
            "with `ttft-monitor alert new-secret`",
        ),
    ],
    ids=["whsec-not-base64", "plain", "too-short"],
)
def test_check_config_refuses_a_webhook_secret_the_standard_cannot_verify(
    tmp_path: Path, secret: str, message: str
) -> None:
    path = config_with(
        tmp_path,
        ("alerts",),
        {"receivers": {"hook": {"type": "webhook", "url": "http://127.0.0.1:9/h", "secret_env": "HOOK_SECRET"}}},
    )
    result = call_cli("check-config", "--config", str(path), env={"HOOK_SECRET": secret})
    assert result.code == 2, result
    assert result.stderr == f"{path}: alerts.receivers.hook.secret_env: {message}\n", result
    assert secret not in result.stderr + result.stdout


def test_check_config_accepts_a_standard_webhook_secret_from_a_file(tmp_path: Path) -> None:
    secret_file = tmp_path / "hook-secret"
    secret_file.write_text(GOOD_WHSEC + "\n", encoding="utf-8")
    receivers = {"hook": {"type": "webhook", "url": "http://127.0.0.1:9/h", "secret_file": str(secret_file)}}
    config = load_config(config_with(tmp_path, ("alerts",), {"receivers": receivers}), environ={})
    assert config.alerts.receivers["hook"].secret() == GOOD_WHSEC
    secret_file.write_text("plain\n", encoding="utf-8")
    assert only_error(config_with(tmp_path, ("alerts",), {"receivers": receivers})).startswith(
        "alerts.receivers.hook.secret_file: a webhook signing secret must be whsec_ followed by base64"
    )


def test_other_receivers_keep_their_own_secret_formats(tmp_path: Path) -> None:
    receivers = {"pd": {"type": "pagerduty", "secret_env": "PD_KEY"}}
    config = load_config(config_with(tmp_path, ("alerts",), {"receivers": receivers}), environ={"PD_KEY": "R0UTING"})
    assert config.alerts.receivers["pd"].secret() == "R0UTING"


def test_the_alias_bomb_is_refused_in_milliseconds_and_memory_stays_small(tmp_path: Path) -> None:
    import tracemalloc

    path = tmp_path / "bomb.yaml"
    path.write_text(BILLION_LAUGHS, encoding="utf-8")
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(ConfigError, match="alias bomb"):
            load_config(path, environ={})
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 2, f"took {elapsed:.2f} s"
    assert peak < 5 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB"


@pytest.mark.parametrize("command", [["serve", "--listen", "127.0.0.1:9"], ["report"]])
def test_serve_and_report_name_the_broken_config_key_and_exit_2(tmp_path: Path, command: list[str]) -> None:
    path = config_with(tmp_path, ("jobs",), 5)
    result = call_cli(*command, "--config", str(path))
    assert result.code == 2, str(result)
    assert result.stderr.strip() == f"{path}: jobs: expected a list (- item lines, or [a, b]), got 5", str(result)
    missing = call_cli(*command, "--config", str(tmp_path / "absent.yaml"))
    assert missing.code == 2 and "file not found" in missing.stderr, str(missing)
