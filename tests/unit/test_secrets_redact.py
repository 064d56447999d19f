"""The pure redaction rules: each form a secret travels in, and what is left alone."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

from monitor.redact import REDACTED, mask_url, redact, url_credentials

KEY = "Kx9!q2Zr7$Lm4w8PvT3n"


def lower_escapes(text: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda escape: escape.group(0).lower(), text)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"bad key {KEY}", f"bad key {REDACTED}"),
        (f"GET /v1?key={quote(KEY, safe='')}", f"GET /v1?key={REDACTED}"),
        (f"GET /v1?key={lower_escapes(quote(KEY, safe=''))}", f"GET /v1?key={REDACTED}"),
        (f"token {b64(KEY)}", f"token {REDACTED}"),
        (f"token {b64(KEY).rstrip('=')}", f"token {REDACTED}"),
        (f"token {base64.urlsafe_b64encode(KEY.encode()).decode()}", f"token {REDACTED}"),
        (f"Authorization: Basic {b64('someone:' + KEY)}", f"Authorization: Basic {REDACTED}"),
        ("echo " + b64('{"auth": "' + KEY + '"}'), f"echo {REDACTED}"),
        (
            "database_unreachable retry_in_s=0.5 Basic dXNlcjpvdGhlcg==",
            "database_unreachable retry_in_s=0.5 Basic dXNlcjpvdGhlcg==",
        ),
    ],
    ids=[
        "plain",
        "url-encoded",
        "url-encoded-lower",
        "base64",
        "base64-unpadded",
        "base64-urlsafe",
        "basic",
        "base64-json",
        "untouched",
    ],
)
def test_a_secret_is_masked_in_every_form_it_travels_in(text: str, expected: str) -> None:
    assert redact(text, [KEY]) == expected


@pytest.mark.parametrize(
    ("url", "credentials"),
    [
        ("https://u:p%40ss@h/v1", ["p%40ss", "u:p%40ss", "u:p@ss"]),
        ("https://sk0123456789@h/v1", ["sk0123456789", "sk0123456789:"]),
        ("https://h/v1?key=abcd&api-version=2024-06-01&x=1", ["abcd", "2024-06-01"]),
        ("https://h/v1", []),
    ],
)
def test_url_credentials(url: str, credentials: list[str]) -> None:
    assert url_credentials(url) == credentials


def test_a_database_user_is_not_a_secret_but_its_password_is() -> None:
    assert url_credentials("postgresql+asyncpg://postgres@db:5432/x", user_is_secret=False) == []
    assert "pw-123" in url_credentials("postgresql+asyncpg://postgres:pw-123@db/x", user_is_secret=False)


def test_mask_url_hides_userinfo_and_key_like_query_values() -> None:
    assert mask_url("https://u:hunter22@h/v1?key=abcd&v=1") == f"https://{REDACTED}@h/v1?key={REDACTED}&v=1"


def test_a_provider_s_secrets_are_its_credentials_not_every_header_value(tmp_path: Path) -> None:
    from monitor.config.loader import load_config

    provider = {
        "base_url": "https://u:${URL_PASSWORD}@h/v1?key=${URL_KEY}&api-version=2024",
        "api": "openai-chat",
        "api_key_env": "API_KEY",
        "headers": {"X-Debug": "true", "X-Tenant-Token": "${TENANT_TOKEN}", "Authorization": "Bearer ${GATEWAY}"},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"providers": {"p": provider}}), encoding="utf-8")
    environ = {
        "URL_PASSWORD": "pw-0001",
        "URL_KEY": "qk-0002",
        "API_KEY": "ak-0003",
        "TENANT_TOKEN": "tt-0004",
        "GATEWAY": "gw-0005",
    }
    config = load_config(path, environ=environ)
    secrets = config.providers["p"].secrets()
    assert set(environ.values()) <= set(secrets)
    assert "Bearer gw-0005" in secrets
    assert "true" not in secrets and "2024" not in secrets
    assert config.providers["p"].display_url() == f"https://{REDACTED}@h/v1?key={REDACTED}&api-version=2024"
