import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.config.check import check_config
from monitor.config.errors import ConfigError
from monitor.config.loader import load_config

SECRET = "sk-test-0123456789abcdef"


def write_config(tmp_path: Path, provider: dict[str, Any], **extra: Any) -> Path:
    data = {
        "providers": {"openai": {"base_url": "https://api.openai.com/v1", "api": "openai-chat", **provider}},
        "targets": {"mini": {"provider": "openai", "model": "gpt-4o-mini"}},
        "prompts": {"short": {"tokens": 512}},
        "jobs": [{"name": "ttft", "schedule": "* * * * *", "targets": ["mini"], "prompts": ["short"]}],
        **extra,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def only_error(path: Path, environ: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ=environ)
    (issue,) = caught.value.errors
    return f"{issue.path}: {issue.message}"


def test_the_key_is_read_from_the_named_environment_variable(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, {"api_key_env": "OPENAI_API_KEY"}), environ={"OPENAI_API_KEY": SECRET})
    assert config.providers["openai"].secret() == SECRET
    assert config.providers["openai"].auth_source() == "env OPENAI_API_KEY"


def test_an_unset_key_variable_is_named_in_the_error(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"api_key_env": "OPENAI_API_KEY"})
    assert only_error(path, {}) == (
        "providers.openai.api_key_env: environment variable OPENAI_API_KEY is not set; export it or change api_key_env"
    )


def test_an_empty_key_variable_is_an_error(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"api_key_env": "OPENAI_API_KEY"})
    assert only_error(path, {"OPENAI_API_KEY": " "}) == (
        "providers.openai.api_key_env: environment variable OPENAI_API_KEY is empty; export it or change api_key_env"
    )


def test_the_key_falls_back_to_the_file_named_by_NAME_FILE(tmp_path: Path) -> None:
    key_file = tmp_path / "openai-key"
    key_file.write_text(f"  {SECRET}\n", encoding="utf-8")
    config = load_config(
        write_config(tmp_path, {"api_key_env": "OPENAI_API_KEY"}),
        environ={"OPENAI_API_KEY_FILE": str(key_file)},
    )
    assert config.providers["openai"].secret() == SECRET
    assert config.providers["openai"].auth_source() == f"file {key_file} (from OPENAI_API_KEY_FILE)"


def test_the_variable_itself_wins_over_NAME_FILE(tmp_path: Path) -> None:
    config = load_config(
        write_config(tmp_path, {"api_key_env": "OPENAI_API_KEY"}),
        environ={"OPENAI_API_KEY": SECRET, "OPENAI_API_KEY_FILE": "/nonexistent"},
    )
    assert config.providers["openai"].secret() == SECRET


def test_a_missing_NAME_FILE_target_is_explained(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"api_key_env": "OPENAI_API_KEY"})
    assert only_error(path, {"OPENAI_API_KEY_FILE": "/nonexistent/key"}) == (
        "providers.openai.api_key_env: secret file /nonexistent/key does not exist "
        "(from environment variable OPENAI_API_KEY_FILE)"
    )


def test_the_key_is_read_from_api_key_file_with_whitespace_stripped(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(f"{SECRET}\n\n", encoding="utf-8")
    config = load_config(write_config(tmp_path, {"api_key_file": str(key_file)}), environ={})
    assert config.providers["openai"].secret() == SECRET
    assert config.providers["openai"].auth_source() == f"file {key_file}"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "secret file {path} does not exist (check api_key_file)"),
        ("\n  \n", "secret file {path} is empty (check api_key_file)"),
        (b"\xff\xfe" + SECRET.encode(), "secret file {path} is not UTF-8 text (check api_key_file)"),
    ],
)
def test_an_unusable_api_key_file_is_explained(tmp_path: Path, content: str | bytes | None, message: str) -> None:
    key_file = tmp_path / "key"
    if isinstance(content, str):
        key_file.write_text(content, encoding="utf-8")
    elif isinstance(content, bytes):
        key_file.write_bytes(content)
    path = write_config(tmp_path, {"api_key_file": str(key_file)})
    assert only_error(path, {}) == f"providers.openai.api_key_file: {message.format(path=key_file)}"


def test_an_unreadable_api_key_file_is_explained(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(SECRET, encoding="utf-8")
    key_file.chmod(0)
    path = write_config(tmp_path, {"api_key_file": str(key_file)})
    assert error_without_root_override(path) == (
        f"providers.openai.api_key_file: secret file {key_file} cannot be read: permission denied (check api_key_file)"
    )


def error_without_root_override(path: Path) -> str:
    """`only_error`, run where file permissions apply: root reads any file, so drop that capability."""
    if os.geteuid() != 0:
        return only_error(path, {})
    code = (
        "import sys; from pathlib import Path; from tests.e2e.test_config_secrets import only_error; "
        "print(only_error(Path(sys.argv[1]), {}))"
    )
    done = subprocess.run(
        ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent.parent,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_provider_without_key_settings_has_no_secret(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, {}), environ={"OPENAI_API_KEY": SECRET})
    assert config.providers["openai"].secret() is None
    assert config.providers["openai"].auth_source() == "none"


def test_a_literal_api_key_is_refused_without_repeating_it(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"api_key": SECRET})
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert str(caught.value) == (
        f"{path}: providers.openai.api_key: literal API keys are not allowed in the config file; put the key "
        "in an environment variable and set api_key_env: NAME, or in a file and set api_key_file: PATH"
    )
    assert caught.value.__cause__ is None


def test_a_key_pasted_into_api_key_env_is_refused_without_repeating_it(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"api_key_env": SECRET})
    assert only_error(path, {}) == (
        "providers.openai.api_key_env: must be the NAME of an environment variable (letters, digits and '_', "
        "e.g. OPENAI_API_KEY), not the secret itself"
    )


def test_both_key_sources_at_once_are_refused(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"api_key_env": "OPENAI_API_KEY", "api_key_file": "/k"})
    assert only_error(path, {"OPENAI_API_KEY": SECRET}) == (
        "providers.openai: set either api_key_env or api_key_file, not both"
    )


def test_a_literal_credential_header_is_refused(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"headers": {"Authorization": f"Bearer {SECRET}"}})
    message = only_error(path, {})
    assert message == (
        "providers.openai.headers.Authorization: literal credentials are not allowed in the config file; "
        'write Authorization: "...${VAR}" and export VAR'
    )


def test_the_secret_never_appears_in_repr_str_dumps_or_reports(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        {"api_key_env": "OPENAI_API_KEY", "headers": {"Authorization": "Bearer ${OPENAI_API_KEY}"}},
    )
    config = load_config(path, environ={"OPENAI_API_KEY": SECRET})
    provider = config.providers["openai"]
    assert provider.secret() == SECRET
    assert provider.headers["Authorization"] == f"Bearer {SECRET}"  # the probe needs the real value
    for text in (
        repr(provider),
        str(provider),
        repr(config),
        str(config),
        str(provider.model_dump()),
        provider.model_dump_json(),
        check_config(path, environ={"OPENAI_API_KEY": SECRET})[1],
    ):
        assert SECRET not in text
    assert "auth: env OPENAI_API_KEY" in check_config(path, environ={"OPENAI_API_KEY": SECRET})[1]


def test_the_secret_never_appears_in_error_messages(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(SECRET, encoding="utf-8")
    path = write_config(
        tmp_path,
        {
            "api_key_file": str(key_file),
            "headers": {"X-Token": "${OPENAI_API_KEY}"},
            "max_concurrency": "${OPENAI_API_KEY}",
        },
        location=["not", "a", "string"],
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={"OPENAI_API_KEY": SECRET})
    text = str(caught.value)
    assert "providers.openai.max_concurrency" in text
    assert SECRET not in text
    assert all(SECRET not in issue.message for issue in caught.value.errors)
    assert caught.value.__cause__ is None


def test_receiver_secrets_and_urls_come_from_the_environment(tmp_path: Path) -> None:
    alerts = {
        "receivers": {
            "pd": {"type": "pagerduty", "secret_env": "PD_KEY"},
            "slack": {"type": "slack", "url_env": "SLACK_URL"},
        },
        "routes": [{"receivers": ["pd", "slack"]}],
    }
    path = write_config(tmp_path, {}, alerts=alerts)
    config = load_config(path, environ={"PD_KEY": SECRET, "SLACK_URL": "https://hooks.slack.com/services/T/B/X"})
    assert config.alerts.receivers["pd"].secret() == SECRET
    assert config.alerts.receivers["slack"].resolved_url() == "https://hooks.slack.com/services/T/B/X"
    assert SECRET not in repr(config)
    assert "hooks.slack.com" not in repr(config)
    assert only_error(path, {"PD_KEY": SECRET}) == (
        "alerts.receivers.slack.url_env: environment variable SLACK_URL is not set; export it or change url_env"
    )


def test_a_literal_receiver_secret_is_refused(tmp_path: Path) -> None:
    path = write_config(tmp_path, {}, alerts={"receivers": {"pd": {"type": "pagerduty", "routing_key": SECRET}}})
    assert only_error(path, {}) == (
        "alerts.receivers.pd.routing_key: literal secrets are not allowed in the config file; put it in an "
        "environment variable and set secret_env: NAME, or in a file and set secret_file: PATH"
    )


def test_the_database_password_is_masked_in_repr_and_dumps(tmp_path: Path) -> None:
    path = write_config(tmp_path, {}, database={"url": "postgresql+asyncpg://ttft:${PGPASSWORD}@db/ttft"})
    config = load_config(path, environ={"PGPASSWORD": SECRET})
    assert config.database.url == f"postgresql+asyncpg://ttft:{SECRET}@db/ttft"
    assert config.database.model_dump()["url"] == "postgresql+asyncpg://ttft:***@db/ttft"
    assert SECRET not in repr(config)
    assert SECRET not in config.model_dump_json()
