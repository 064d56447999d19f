import copy
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.config.check import check_config
from monitor.config.errors import ConfigError, ConfigIssue
from monitor.config.expand import expand_string
from monitor.config.loader import load_config
from monitor.config.models import ColdPolicy, Config, Job
from monitor.detect.rules import Rules

EXAMPLE = Path(__file__).resolve().parent.parent.parent / "config.yaml"

BASE: dict[str, Any] = {
    "providers": {"sim": {"base_url": "http://127.0.0.1:8400/v1", "api": "openai-chat"}},
    "targets": {
        "qwen3-8b": {"provider": "sim", "model": "qwen3-8b"},
        "qwen3-14b": {"provider": "sim", "model": "qwen3-14b"},
    },
    "prompts": {"short": {"tokens": 512}},
    "jobs": [
        {"name": "fast", "schedule": "* * * * *", "targets": ["qwen3-8b"], "prompts": ["short"]},
        {"name": "slow", "schedule": "0 * * * *", "targets": ["qwen3-14b"], "prompts": ["short"]},
    ],
}


@pytest.fixture(autouse=True)
def in_tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Messages start with the file name as given; run where "config.yaml" is the file under test.
    monkeypatch.chdir(tmp_path)


def write(data: Any, name: str = "config.yaml") -> Path:
    path = Path(name)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def base(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data


def problems(data: Any, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(write(data), environ=environ or {})
    return str(caught.value).splitlines()


# ---------------------------------------------------------------- the example file


def test_the_example_config_loads_with_no_environment_variables() -> None:
    config = load_config(EXAMPLE, environ={})
    assert config.location == "local"
    assert config.database.url == "sqlite+aiosqlite:///./state/ttft-monitor.db"
    assert config.database.state_dir == Path("./state")
    assert config.providers["sim"].base_url == "http://127.0.0.1:8400/v1"
    assert config.providers["sim"].api == "openai-chat"
    assert config.providers["sim"].secret() is None
    assert config.providers["sim-anthropic"].api == "anthropic-messages"
    assert {name: (t.provider, t.model) for name, t in config.targets.items()} == {
        "qwen3-8b": ("sim", "qwen3-8b"),
        "qwen3-14b": ("sim", "qwen3-14b"),
        "gpt-4o-mini": ("sim", "gpt-4o-mini"),
        "claude-sim": ("sim-anthropic", "claude-haiku-sim"),
        "gpt-4o-mini-responses": ("sim-responses", "gpt-4o-mini"),
        "gemini-flash-sim": ("sim-gemini", "gemini-flash-sim"),
    }
    # Qwen3 thinks unless told not to: the example asks for the least reasoning, nothing verbatim.
    for qwen in ("qwen3-8b", "qwen3-14b"):
        assert config.targets[qwen].params.reasoning == "least"
        assert config.targets[qwen].params.extra_body == {}
    assert {name: (p.tokens, p.language) for name, p in config.prompts.items()} == {
        "short": (512, "en"),
        "long": (4096, "en"),
        "short-zh": (512, "zh"),
    }
    job = config.job("ttft")
    assert (job.schedule, job.rounds, job.warmup) == ("* * * * *", 3, 1)
    assert job.targets == ["qwen3-8b", "qwen3-14b", "gpt-4o-mini"]
    assert job.prompts == ["short", "long"]


def test_the_example_config_follows_the_state_dir_variable() -> None:
    config = load_config(EXAMPLE, environ={"TTFT_STATE_DIR": "/var/lib/ttft"})
    assert config.database.url == "sqlite+aiosqlite:////var/lib/ttft/ttft-monitor.db"
    assert config.database.state_dir == Path("/var/lib/ttft")


def test_check_config_on_the_example_lists_the_job_with_its_next_three_runs() -> None:
    code, report = check_config(EXAMPLE, environ={}, now=datetime(2025, 1, 31, 9, 0, 30, tzinfo=UTC))
    assert code == 0, report
    assert "  ttft: '* * * * *' in UTC, jitter up to 5 s" in report
    assert "    3 targets x 2 prompts x 3 rounds (+1 warmup), connection reuse" in report
    assert "    next runs: 2025-01-31T09:01:00+00:00, 2025-01-31T09:02:00+00:00, 2025-01-31T09:03:00+00:00" in report
    assert "  sim: openai-chat http://127.0.0.1:8400/v1, auth: none" in report
    assert "database: sqlite+aiosqlite:///./state/ttft-monitor.db" in report


def test_check_config_notes_a_job_of_fewer_rounds_than_detection_is_tuned_for() -> None:
    data = base()
    data["jobs"][0].update(rounds=1, warmup=0)
    code, report = check_config(write(data), environ={})
    assert code == 0, report
    assert "    note: 1 round a run: a run's median is one or two requests" in report
    assert "0.85 false alerts a series-week with 1 round" in report
    data["jobs"][0].update(rounds=3)
    code, report = check_config(write(data), environ={})
    assert code == 0 and "note:" not in report, report


def test_check_config_shows_next_runs_in_the_jobs_timezone() -> None:
    data = base()
    data["jobs"][0].update(schedule="0 9 * * 1-5", timezone="Europe/Berlin")
    code, report = check_config(write(data), environ={}, now=datetime(2025, 1, 31, 9, 0, tzinfo=UTC))
    assert code == 0, report
    assert "    next runs: 2025-02-03T09:00:00+01:00, 2025-02-04T09:00:00+01:00, 2025-02-05T09:00:00+01:00" in report


def test_check_config_returns_2_and_the_problems_for_a_bad_file() -> None:
    data = base()
    data["jobs"][0]["targets"] = ["nope"]
    code, report = check_config(write(data), environ={})
    assert code == 2
    assert report == (
        "config.yaml: jobs[0].targets[0]: unknown target 'nope' (known: qwen3-14b, qwen3-8b); "
        "fix the name or define it under targets:"
    )


def test_check_config_masks_the_database_password() -> None:
    data = base(database={"url": "postgresql+asyncpg://ttft:${PGPASSWORD}@db:5432/ttft"})
    code, report = check_config(write(data), environ={"PGPASSWORD": "hunter2"})
    assert code == 0, report
    assert "database: postgresql+asyncpg://ttft:***@db:5432/ttft" in report
    assert "hunter2" not in report


# ---------------------------------------------------------------- the common mistakes, word for word


def test_it_rejects_an_unknown_target_in_a_job() -> None:
    data = base()
    data["jobs"][1]["targets"] = ["qwen3-8bb"]
    assert problems(data) == [
        "config.yaml: jobs[1].targets[0]: unknown target 'qwen3-8bb' (known: qwen3-14b, qwen3-8b); "
        "fix the name or define it under targets:"
    ]


def test_it_rejects_an_unknown_prompt_and_an_unknown_provider() -> None:
    data = base()
    data["jobs"][0]["prompts"] = ["short", "longg"]
    data["targets"]["qwen3-8b"]["provider"] = "simm"
    assert problems(data) == [
        "config.yaml: targets.qwen3-8b.provider: unknown provider 'simm' (known: sim); "
        "fix the name or define it under providers:",
        "config.yaml: jobs[0].prompts[1]: unknown prompt 'longg' (known: short); "
        "fix the name or define it under prompts:",
    ]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d.update(job=[]),
            "config.yaml: job: unknown key 'job'; did you mean 'jobs'? "
            "(allowed: location, database, metrics, otel, "
            "providers, targets, prompts, jobs, detection, alerts, web, budget, probe_self_delay_bound_ms, "
            "shutdown_grace_s)",
        ),
        (
            lambda d: d["jobs"][1].update(schedul="* * * * *"),
            "config.yaml: jobs[1].schedul: unknown key 'schedul'; did you mean 'schedule'? (allowed: name, "
            "schedule, timezone, jitter_s, targets, prompts, rounds, warmup, pause_s, connection, shards)",
        ),
        (
            lambda d: d["providers"]["sim"].update(timeout_s={"conect": 5}),
            "config.yaml: providers.sim.timeout_s.conect: unknown key 'conect'; did you mean 'connect'? "
            "(allowed: connect, first_token, total)",
        ),
        (
            lambda d: d["targets"]["qwen3-8b"].update(params={"max_token": 5}),
            "config.yaml: targets.qwen3-8b.params.max_token: unknown key 'max_token'; did you mean "
            "'max_tokens'? (allowed: max_tokens, temperature, extra_body, reasoning, reasoning_effort)",
        ),
        (
            lambda d: d.update(database={"retention": {"raw": 5}}),
            "config.yaml: database.retention.raw: unknown key 'raw' (allowed: raw_days, rollup_days, cold_after_days)",
        ),
    ],
)
def test_it_names_an_unknown_key_and_suggests_the_closest_one(change: Any, expected: str) -> None:
    data = base()
    change(data)
    assert problems(data) == [expected]


def test_it_rejects_a_bad_cron_expression() -> None:
    data = base()
    data["jobs"][0]["schedule"] = "*/5 * *"
    assert problems(data) == [
        "config.yaml: jobs[0].schedule: '*/5 * *' is not a cron expression "
        "(expected 5 fields: minute hour day month weekday, or 6 with seconds first)"
    ]


def test_a_job_splits_into_at_most_as_many_shards_as_it_has_series() -> None:
    data = base()
    data["jobs"][0].update(targets=["qwen3-8b", "qwen3-14b"], shards=2)
    assert load_config(write(data), environ={}).jobs[0].shards == 2
    data["jobs"][0]["shards"] = 3
    assert problems(data) == [
        "config.yaml: jobs[0]: shards: 3 is more than the job's 2 series (targets x prompts); use at most 2"
    ]
    data["jobs"][0]["shards"] = 0
    assert problems(data) == ["config.yaml: jobs[0].shards: must be >= 1, got 0"]


def test_it_rejects_an_unknown_timezone() -> None:
    data = base()
    data["jobs"][0]["timezone"] = "Mars/Olympus"
    assert problems(data) == [
        "config.yaml: jobs[0].timezone: unknown timezone 'Mars/Olympus'; "
        "use an IANA name such as UTC, Europe/Berlin or Asia/Shanghai"
    ]


def test_it_rejects_a_missing_file() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config("missing.yaml", environ={})
    assert str(caught.value) == (
        f"missing.yaml: file not found (looked at {Path('missing.yaml').absolute()}); pass --config PATH or create it"
    )


def test_it_reports_a_yaml_syntax_error_with_line_and_column() -> None:
    path = write("providers:\n  sim:\n    base_url: http://x\n   api: openai-chat\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    (issue,) = caught.value.errors
    assert (issue.line, issue.column) == (4, 4)
    assert str(caught.value).startswith("config.yaml:4:4: YAML syntax error: ")


def test_it_explains_an_unquoted_cron_expression() -> None:
    path = write("jobs:\n  - name: a\n    schedule: * * * * *\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert str(caught.value) == (
        "config.yaml:3:15: YAML syntax error: a value starting with '*' must be quoted, e.g. schedule: \"*/5 * * * *\""
    )


def test_it_rejects_a_key_given_twice() -> None:
    path = write("location: a\nlocation: b\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert (
        str(caught.value) == "config.yaml:2:1: key 'location' appears twice in one mapping (first on line 1); keep one"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "config.yaml: the file is empty; see config.yaml in the repository for a documented example"),
        (
            "- a\n- b\n",
            "config.yaml: the file must be a YAML mapping of top-level keys (location, database, "
            "providers, targets, prompts, jobs, ...), but it holds a list",
        ),
    ],
)
def test_it_rejects_a_file_that_is_not_a_mapping(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(text), environ={})
    assert str(caught.value) == message


def test_it_rejects_a_wrong_type() -> None:
    data = base()
    data["jobs"][0]["rounds"] = "five"
    assert problems(data) == ["config.yaml: jobs[0].rounds: expected an integer, got 'five'"]


def test_it_rejects_an_unknown_api() -> None:
    data = base()
    data["providers"]["sim"]["api"] = "openai"
    assert problems(data) == [
        "config.yaml: providers.sim.api: 'openai' is not one of openai-chat, openai-completions, anthropic-messages, "
        "openai-responses, gemini"
    ]


def test_it_rejects_a_duplicate_job_name() -> None:
    data = base()
    data["jobs"][1]["name"] = "fast"
    assert problems(data) == [
        "config.yaml: jobs[1].name: job name 'fast' is already used by jobs[0]; job names must be unique"
    ]


def test_it_names_a_missing_required_key() -> None:
    data = base()
    del data["targets"]["qwen3-8b"]["model"]
    assert problems(data) == ["config.yaml: targets.qwen3-8b: missing required key 'model'"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d["prompts"]["short"].update(tokens=10), "prompts.short.tokens: must be >= 128, got 10"),
        (
            lambda d: d.update(detection={"trailing_runs": 11}),
            "detection.trailing_runs: must be >= 12, got 11",
        ),
        (lambda d: d["jobs"][0].update(targets=[]), "jobs[0].targets: must not be empty"),
        (
            lambda d: d["jobs"][0].update(name="my job"),
            "jobs[0].name: name 'my job' may only contain letters, digits, '_', '.' and '-'",
        ),
        (
            lambda d: d["providers"]["sim"].update(base_url="ftp://x"),
            "providers.sim.base_url: 'ftp://x' is not an http:// or https:// URL; "
            "write e.g. http://127.0.0.1:8000/v1 or https://api.openai.com/v1",
        ),
        (
            lambda d: d["providers"]["sim"].update(timeout_s={"connect": 100}),
            "providers.sim.timeout_s: timeouts must satisfy connect <= first_token <= total, "
            "got connect=100, first_token=60, total=300",
        ),
        (
            lambda d: d.update(database={"url": "postgresql://u@db/x"}),
            "database.url: database URL scheme 'postgresql://' needs the async driver: "
            "write 'postgresql+asyncpg://' instead",
        ),
        (
            lambda d: d.update(database={"url": "mysql://u@db/x"}),
            "database.url: database URL scheme 'mysql://' is not supported; use "
            "postgresql+asyncpg://USER:PASSWORD@HOST:5432/DBNAME or sqlite+aiosqlite:///PATH/ttft-monitor.db",
        ),
        (
            lambda d: d.update(metrics={"listen": "9464"}),
            "metrics.listen: '9464' is not HOST:PORT; write e.g. 127.0.0.1:9464, "
            "0.0.0.0:9464 (all interfaces) "
            "or [::1]:9464",
        ),
        (
            lambda d: d["providers"]["sim"].update(tls={"ca_file": "nowhere.pem"}),
            "providers.sim.tls.ca_file: CA file nowhere.pem does not exist "
            "(relative paths start at the working directory)",
        ),
        (
            lambda d: d.update(alerts={"routes": [{"receivers": ["ops"], "jobs": ["fastt"]}]}),
            "alerts.routes[0].receivers[0]: unknown receiver 'ops' (no receivers are defined); "
            "fix the name or define it under alerts.receivers:",
        ),
        (
            lambda d: d.update(detection={"page": {"ratio": 1.05}}),
            "detection: clear_ratio (1.08) must be below ticket.ratio (1.12) and page.ratio (1.05), "
            "or incidents would clear while still over their threshold",
        ),
    ],
)
def test_it_explains_invalid_values(change: Any, expected: str) -> None:
    data = base()
    change(data)
    assert problems(data)[0] == f"config.yaml: {expected}"


def test_it_reports_every_problem_at_once_in_file_order() -> None:
    data = base(locaton="x")
    data["jobs"][0]["rounds"] = 0
    data["jobs"][1]["targets"] = ["qwen3-8bb"]
    data["providers"]["sim"]["api"] = "openai"
    assert [line.split(": ")[1] for line in problems(data)] == [
        "providers.sim.api",
        "jobs[0].rounds",
        "jobs[1].targets[0]",
        "locaton",
    ]


def test_errors_carry_file_path_and_message_separately() -> None:
    data = base()
    data["jobs"][0]["rounds"] = "five"
    with pytest.raises(ConfigError) as caught:
        load_config(write(data), environ={})
    assert caught.value.errors == [ConfigIssue("config.yaml", "jobs[0].rounds", "expected an integer, got 'five'")]
    # A chained pydantic error would print input values, which may be secrets.
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


def test_a_partial_severity_rule_keeps_the_other_defaults() -> None:
    config = load_config(write(base(detection={"page": {"ratio": 2}})), environ={})
    assert (
        config.detection.page.ratio,
        config.detection.page.min_delta_ms,
        config.detection.page.confirmations,
    ) == (2, 100, 2)


def test_a_silence_needs_a_complete_window() -> None:
    data = base(alerts={"silences": [{"cron": "0 22 * * 6"}]})
    assert problems(data) == ["config.yaml: alerts.silences[0]: a recurring silence needs both cron and duration_s"]


# ---------------------------------------------------------------- ${VAR} expansion


@pytest.mark.parametrize(
    ("text", "environ", "expected"),
    [
        ("${A}", {"A": "x"}, "x"),
        ("a-${A}-b", {"A": "x"}, "a-x-b"),
        ("${A:-fallback}", {}, "fallback"),
        ("${A:-fallback}", {"A": ""}, "fallback"),
        ("${A:-fallback}", {"A": "set"}, "set"),
        ("${A:-}", {}, ""),
        ("${A:-a:b/c d}", {}, "a:b/c d"),
        ("$${A}", {"A": "x"}, "${A}"),
        ("cost: $$5", {}, "cost: $5"),
        ("$$$$", {}, "$$"),
        ("$$${A}", {"A": "x"}, "$x"),
        ("plain $ sign", {}, "plain $ sign"),
        ("${A}${B}", {"A": "1", "B": "2"}, "12"),
        ("${A}", {"A": ""}, ""),
    ],
)
def test_it_expands_environment_references(text: str, environ: dict[str, str], expected: str) -> None:
    assert expand_string(text, environ) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("${A}", "environment variable A is not set; export it or write ${A:-default}"),
        (
            "${1A}",
            "'${1A}' is not a valid reference; write ${NAME} or ${NAME:-default} (nesting is not "
            "supported), or $$ for a literal $",
        ),
        (
            "${A",
            "'${A' is not a valid reference; write ${NAME} or ${NAME:-default} (nesting is not "
            "supported), or $$ for a literal $",
        ),
        (
            "${A:-${B}}",
            "'${A:-${B}' is not a valid reference; write ${NAME} or ${NAME:-default} (nesting is not "
            "supported), or $$ for a literal $",
        ),
    ],
)
def test_it_explains_a_bad_reference(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        expand_string(text, {})
    assert str(caught.value) == message


def test_an_unset_variable_is_reported_with_its_key_path() -> None:
    data = base()
    data["providers"]["sim"]["headers"] = {"X-Org": "${ORG_ID}"}
    assert problems(data) == [
        "config.yaml: providers.sim.headers.X-Org: environment variable ORG_ID is not set; "
        "export it or write ${ORG_ID:-default}"
    ]


def test_an_unset_variable_does_not_also_produce_a_type_error() -> None:
    data = base()
    data["jobs"][0]["rounds"] = "${ROUNDS}"
    assert problems(data) == [
        "config.yaml: jobs[0].rounds: environment variable ROUNDS is not set; export it or write ${ROUNDS:-default}"
    ]


def test_expanded_values_are_converted_to_the_fields_type() -> None:
    data = base()
    data["jobs"][0].update(rounds="${ROUNDS:-3}", jitter_s="${JITTER}")
    data["providers"]["sim"]["tls"] = {"verify": "${VERIFY:-false}"}
    config = load_config(write(data), environ={"JITTER": "2.5"})
    assert (config.jobs[0].rounds, config.jobs[0].jitter_s) == (3, 2.5)
    assert config.providers["sim"].tls.verify is False


def test_expansion_reaches_nested_lists_and_extra_body_but_not_keys() -> None:
    data = base()
    data["targets"]["qwen3-8b"]["params"] = {"extra_body": {"${KEEP}": ["${A}", {"b": "${A}"}]}}
    config = load_config(write(data), environ={"A": "x"})
    assert config.targets["qwen3-8b"].params.extra_body == {"${KEEP}": ["x", {"b": "x"}]}


# ---------------------------------------------------------------- helpers


def test_job_finds_a_job_by_name_and_explains_a_miss() -> None:
    config = load_config(write(base()), environ={})
    assert config.job("slow").schedule == "0 * * * *"
    with pytest.raises(KeyError, match="no job named 'nope' \\(known: fast, slow\\)"):
        config.job("nope")


def test_a_jobs_trigger_uses_its_timezone_and_jitter() -> None:
    job = Job(name="j", schedule="0 9 * * *", timezone="Asia/Shanghai", jitter_s=3, targets=["t"], prompts=["p"])
    trigger = job.trigger()
    assert str(trigger.timezone) == "Asia/Shanghai"
    assert trigger.jitter == 3


def test_a_config_built_in_code_is_checked_for_references_too() -> None:
    with pytest.raises(ValueError, match="unknown target 'ghost'"):
        Config.model_validate(
            base(jobs=[{"name": "j", "schedule": "@hourly", "targets": ["ghost"], "prompts": ["short"]}])
        )


def test_defaults_give_a_usable_empty_config() -> None:
    config = Config()
    assert config.database.retention.raw_days == 30
    assert config.metrics.listen == "127.0.0.1:9464"
    assert config.detection.ticket.confirmations == 6
    assert config.alerts.renotify_interval_s == 14400


def test_a_trailing_slash_is_removed_from_base_url() -> None:
    data = base()
    data["providers"]["sim"]["base_url"] = "http://127.0.0.1:8400/v1/"
    assert load_config(write(data), environ={}).providers["sim"].base_url == "http://127.0.0.1:8400/v1"


@pytest.mark.parametrize(
    ("issue", "text"),
    [
        (ConfigIssue("c.yaml", "jobs[0]", "bad"), "c.yaml: jobs[0]: bad"),
        (ConfigIssue("c.yaml", "", "bad"), "c.yaml: bad"),
        (ConfigIssue("c.yaml", "", "bad", 3, 7), "c.yaml:3:7: bad"),
    ],
)
def test_an_issue_prints_as_one_line(issue: ConfigIssue, text: str) -> None:
    assert str(issue) == text


def test_the_commented_out_examples_in_the_example_config_are_valid() -> None:
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    # Keys are lower case, or Header-Names; prose comments start with a capital and no hyphenated word.
    commented_yaml = re.compile(r"^(\s*)# (\s*(- )?([a-z_-]+|[A-Z][A-Za-z]*(-[A-Z][A-Za-z]*)+):.*)$")
    # The commented Postgres URL replaces the SQLite one rather than repeating the key.
    lines = [line for line in lines if not line.startswith("  url: sqlite")]
    uncommented = [commented_yaml.sub(r"\1\2", line) for line in lines]
    assert uncommented != lines
    environ = {
        "OPENAI_API_KEY": "sk-x",
        "OPENAI_ORG_ID": "org",
        "PGPASSWORD": "pw",
        "SLACK_WEBHOOK_URL": "https://hooks.slack.com/x",
        "PAGERDUTY_ROUTING_KEY": "r",
        "GEMINI_API_KEY": "g",
    }
    # Only the files the examples point at are missing on a test machine.
    assert problems("\n".join(uncommented) + "\n", environ) == [
        "config.yaml: providers.anthropic.api_key_file: secret file "
        "/run/credentials/ttft-monitor.service/anthropic-key does not exist (check api_key_file)",
        "config.yaml: providers.vllm.tls.ca_file: CA file /etc/ssl/internal-ca.pem does not exist "
        "(relative paths start at the working directory)",
    ]


def test_every_registered_api_flavour_and_receiver_kind_is_accepted_by_the_config():
    from monitor.alert.receivers import KINDS
    from monitor.alert.settings import Receiver
    from monitor.probe.apis import FLAVORS
    from monitor.probe.settings import Provider

    for name in FLAVORS:
        assert Provider.model_validate({"base_url": "http://127.0.0.1:8400/v1", "api": name}).api == name
    for name in KINDS:
        assert Receiver.model_construct(type=name).type == name
        assert name in str(Receiver.model_json_schema()["properties"]["type"])


@pytest.mark.parametrize(
    ("written", "mode"), [("full", "full"), ("summary", "summary"), ("off", "off"), ("'off'", "off")]
)
def test_metrics_per_series_reads_each_mode_and_a_bare_yaml_off(written: str, mode: str) -> None:
    text = yaml.safe_dump(base(), sort_keys=False) + f"metrics:\n  per_series: {written}\n"
    assert load_config(write(text), environ={}).metrics.per_series == mode


def test_metrics_per_series_names_the_modes_for_anything_else() -> None:
    text = yaml.safe_dump(base(), sort_keys=False) + "metrics:\n  per_series: true\n"
    (problem,) = problems(text)
    assert problem == "config.yaml: metrics.per_series: true is not one of full, summary, off", problem


# ---------------------------------------------------------------- the cold tier's cutoff


def test_the_cold_tier_is_auto_unless_set_and_its_least_cutoff_is_what_reads_rows_only() -> None:
    # Detection reads its history (10.6 days for the hourly job) from chunks too: it sets no cutoff. What reads
    # rows only is check-config's token history (2 days) and the cost view's day: 3 days.
    config = load_config(write(base()), environ={})
    assert config.database.retention.cold_after_days == "auto"
    assert config.cold_minimum() == (3, "check-config's token history (2 days) and the cost view's day")
    # And each series' newest runs, as many as the detector learns from (the overview's note counts them).
    assert config.cold_policy() == ColdPolicy(after_days=3, keep_runs=Rules().min_history_runs)
    on = base(jobs=[BASE["jobs"][0]], database={"retention": {"cold_after_days": 9}})
    assert load_config(write(on), environ={}).cold_policy() == ColdPolicy(after_days=9)


def test_auto_keeps_the_burn_rates_longest_window_and_a_day_as_rows() -> None:
    # The burn rates count samples in SQL over their longest window, back from the run a batch holds: a batch
    # the spool replays late reaches a day further.
    burn = base(jobs=[BASE["jobs"][0]], database={"retention": {"raw_days": 40}}, detection={"slo_burn": {"windows": [
        {"severity": "ticket", "burn_rate": 1.0, "long_window_minutes": 14400, "short_window_minutes": 360}
    ]}})  # fmt: skip
    burn["targets"]["qwen3-8b"]["slo"] = {"ttft_ms": 800}
    longer = load_config(write(burn), environ={}).cold_policy()
    assert longer == ColdPolicy(after_days=11, keep_runs=Rules().min_history_runs)


@pytest.mark.parametrize(
    ("retention", "policy"),
    [
        ({"cold_after_days": "off"}, None),
        ({"cold_after_days": None}, None),
        ({"cold_after_days": 12, "raw_days": 12}, None),  # every day is dropped before it could be compacted
        ({"raw_days": 3}, None),  # auto with nothing past its floor
        ({"cold_after_days": 12}, ColdPolicy(after_days=12)),
    ],
)
def test_the_cold_tier_compacts_nothing_when_off_or_when_retention_drops_the_days_first(
    retention: dict[str, object], policy: ColdPolicy | None
) -> None:
    assert load_config(write(base(database={"retention": retention})), environ={}).cold_policy() == policy


@pytest.mark.parametrize("value", ["sometimes", 0, -3, True, 1.5])
def test_the_cold_tiers_setting_refuses_what_is_not_days_auto_or_off_in_one_line(value: object) -> None:
    (problem,) = problems(base(database={"retention": {"cold_after_days": value}}))
    assert problem.startswith("config.yaml: database.retention.cold_after_days: "), problem
    assert "a number of days >= 1, auto (the default) or off" in problem, problem


def test_a_bare_yaml_off_and_days_from_the_environment_are_read_as_written() -> None:
    from_env = base(database={"retention": {"cold_after_days": "${COLD_DAYS}"}})
    assert load_config(write(from_env), environ={"COLD_DAYS": "12"}).database.retention.cold_after_days == 12
    # YAML 1.1 reads a bare `off` as false.
    text = yaml.safe_dump(base(database={"retention": {"cold_after_days": "OFF_HERE"}}), sort_keys=False)
    config = load_config(write(text.replace("'OFF_HERE'", "off").replace("OFF_HERE", "off")), environ={})
    assert config.database.retention.cold_after_days == "off" and config.cold_policy() is None


def test_a_cold_tier_cutoff_that_would_starve_a_rows_only_reader_is_refused_naming_the_fix() -> None:
    data = base(database={"retention": {"cold_after_days": 2}})
    assert problems(data) == [
        "config.yaml: database.retention.cold_after_days (2) would compact runs still read as rows (3 days back) "
        "by check-config's token history (2 days) and the cost view's day: raise it to at least 3, or set it to "
        "auto (the default) or off"
    ]
    assert (
        load_config(
            write(base(database={"retention": {"cold_after_days": 3}})), environ={}
        ).database.retention.cold_after_days
        == 3
    )


def test_the_burn_rates_longest_window_is_kept_as_rows_too() -> None:
    data = base(jobs=[BASE["jobs"][0]], detection={"slo_burn": {"windows": [
        {"severity": "ticket", "burn_rate": 1.0, "long_window_minutes": 14400, "short_window_minutes": 360}
    ]}})  # fmt: skip
    data["targets"]["qwen3-8b"]["slo"] = {"ttft_ms": 800}
    config = load_config(write(data), environ={})
    assert config.cold_minimum() == (11, "detection.slo_burn's longest window and a day")


def test_the_detectors_history_reach_is_what_it_reads() -> None:
    from datetime import timedelta

    from monitor.detect.detector import Detector
    from monitor.detect.rules import Rules

    at = datetime(2026, 12, 7, tzinfo=UTC)
    for rules in (Rules(), Rules(seasonal_days=0), Rules(seasonal_days=3, level_hours=6)):
        for interval in (timedelta(seconds=30), timedelta(minutes=5), timedelta(hours=1)):
            reach = at - Detector(rules).history_since(at, interval=interval)
            assert reach.total_seconds() == pytest.approx(rules.history_reach_s(interval.total_seconds()))


def test_the_cold_tier_never_takes_the_days_check_config_projects_costs_from() -> None:
    from monitor.commands.check_config import HISTORY_DAYS
    from monitor.config.models import COLD_FLOOR_DAYS

    data = base(jobs=[BASE["jobs"][0]], detection={"seasonal_days": 0})
    config = load_config(write(data), environ={})
    assert config.cold_minimum() == (3, "check-config's token history (2 days) and the cost view's day")
    assert COLD_FLOOR_DAYS > HISTORY_DAYS  # whole days compacted: the floor's day more covers the window's start
