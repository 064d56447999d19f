"""What every config section is built from: the base model (unknown keys are errors, no `true` for a
number) and the field types sections share (names, environment variable names, paths, headers, cron
expressions, timezones). Each stage's section lives beside the stage (`probe/settings.py`,
`detect/settings.py`, `alert/settings.py`); `config/models.py`'s `Config` composes them."""

from __future__ import annotations

import re
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_serializer, field_validator

from monitor.config.cron import build_trigger, resolve_timezone

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ValueError(f"name '{name}' may only contain letters, digits, '_', '.' and '-'")
    return name


def _check_env_name(name: str | None) -> str | None:
    # Never echo the value: a common slip is pasting the key itself where its variable's name belongs.
    if name is not None and not ENV_NAME_PATTERN.match(name):
        raise ValueError(
            "must be the NAME of an environment variable (letters, digits and '_', e.g. OPENAI_API_KEY), "
            "not the secret itself"
        )
    return name


def _expand_user(path: Path | None) -> Path | None:
    return path.expanduser() if path is not None else None


def _check_headers(headers: dict[str, str]) -> dict[str, str]:
    for name, value in headers.items():
        if not re.match(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$", name):
            raise ValueError(f"'{name}' is not a valid HTTP header name")
        if "\n" in value or "\r" in value:
            raise ValueError(f"the value of header '{name}' contains a line break")
    return headers


def masked_headers(headers: dict[str, str]) -> dict[str, str]:
    return dict.fromkeys(headers, "***")


Name = Annotated[str, AfterValidator(check_name)]
EnvName = Annotated[str | None, AfterValidator(_check_env_name)]
UserPath = Annotated[Path, AfterValidator(_expand_user)]
Headers = Annotated[dict[str, str], AfterValidator(_check_headers)]


def _check_cron(expr: str) -> str:
    build_trigger(expr, "UTC")
    return expr


def _check_timezone(name: str) -> str:
    resolve_timezone(name)
    return name


# A job's schedule and a silence's window share these checks.
CronExpression = Annotated[str, AfterValidator(_check_cron)]
TimezoneName = Annotated[str, AfterValidator(_check_timezone)]


def _numeric_kind(annotation: Any) -> str | None:
    """'an integer' or 'a number' when a field holds one (optionally None), else None."""
    members = [annotation]
    while members:
        current = members.pop()
        origin = get_origin(current)
        if origin is Annotated:
            members.append(get_args(current)[0])
        elif origin in (Union, UnionType):
            members += [arg for arg in get_args(current) if arg is not type(None)]
        elif current is int:
            return "an integer"
        elif current is float:
            return "a number"
    return None


class ConfigModel(BaseModel):
    # Numbers are accepted where text is expected so `model: 3` or a numeric header value just work.
    # `inf` and `nan` are refused: `pause_s: .inf` would hang a job, and nan passes no bound check.
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # YAML's `true` would otherwise pass as 1: `rounds: true` is a slip, not a count.
        if isinstance(value, bool) and info.field_name is not None:
            kind = _numeric_kind(cls.model_fields[info.field_name].annotation)
            if kind is not None:
                raise ValueError(f"expected {kind}, got {'true' if value else 'false'}")
        return value


class MaskedHeadersModel(ConfigModel):
    """A section whose `headers` often carry credentials (via ${VAR}): dumps and reprs, which end up in logs,
    show them masked; the live values stay available as `.headers`."""

    @field_serializer("headers", check_fields=False)
    def _dump_headers(self, headers: dict[str, str]) -> dict[str, str]:
        return masked_headers(headers)

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, (masked_headers(value) if name == "headers" else value)
