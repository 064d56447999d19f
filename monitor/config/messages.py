"""Pydantic's validation errors, reworded as plain instructions tied to a key path.

Input values are quoted, shortened, so the user can find their typo, except values under secret-looking
keys or taken from the environment, which may be secrets.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from monitor.alert.settings import Receiver
from monitor.probe.settings import Provider

Loc = tuple[str | int, ...]

LITERAL_SECRET_KEYS: dict[type[BaseModel], tuple[frozenset[str], str]] = {
    Provider: (
        frozenset({"api_key", "apikey", "api-key", "key", "token", "api_token", "secret", "password"}),
        "literal API keys are not allowed in the config file; put the key in an environment variable and set "
        "api_key_env: NAME, or in a file and set api_key_file: PATH",
    ),
    Receiver: (
        frozenset({"secret", "token", "password", "api_key", "routing_key", "key", "integration_key"}),
        "literal secrets are not allowed in the config file; put it in an environment variable and set "
        "secret_env: NAME, or in a file and set secret_file: PATH",
    ),
}

_TYPE_WORDS = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string (text)",
    "dict_type": "a mapping (key: value lines)",
    "model_type": "a mapping (key: value lines)",
    "model_attributes_type": "a mapping (key: value lines)",
    "list_type": "a list (- item lines, or [a, b])",
    "datetime_parsing": "a date and time like 2025-01-31T09:00:00+00:00",
    "datetime_type": "a date and time like 2025-01-31T09:00:00+00:00",
    "datetime_from_date_parsing": "a date and time like 2025-01-31T09:00:00+00:00",
    "path_type": "a file path",
}
_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}


def translate(error: ErrorDetails, root: type[BaseModel], *, hide_input: bool = False) -> tuple[Loc, str]:
    """(key path, message) for one pydantic error found validating `root`.

    `hide_input` keeps the offending value out of the message (say, because it came from a variable).
    """
    loc = tuple(part for part in error["loc"] if part != "[key]")
    kind = error["type"]
    value = _HIDDEN if hide_input or _looks_secret(loc) else error.get("input")
    ctx = error.get("ctx") or {}

    if kind == "extra_forbidden":
        return loc, unknown_key_message(str(loc[-1]), model_at(root, loc[:-1]))
    if kind == "missing":
        return loc[:-1], f"missing required key '{loc[-1]}'"
    if kind in _TYPE_WORDS:
        return loc, f"expected {_TYPE_WORDS[kind]}, got {describe(value)}"
    if kind == "finite_number":
        return loc, f"must be a finite number, got {describe(value)}"
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return loc, f"{describe(value)} is not one of {', '.join(allowed)}"
    if kind in _BOUNDS:
        key, sign = _BOUNDS[kind]
        bound = ctx.get(key)
        return loc, f"must be {sign} {f'{bound:g}' if isinstance(bound, float) else bound}, got {describe(value)}"
    if kind == "too_short":
        minimum = ctx.get("min_length")
        return loc, "must not be empty" if minimum == 1 else f"needs at least {minimum} items"
    if kind == "too_long":
        return loc, f"allows at most {ctx.get('max_length')} item(s)"
    if kind in ("value_error", "assertion_error"):
        return loc, str(ctx.get("error", error["msg"]))
    return loc, error["msg"]


def unknown_key_message(key: str, model: type[BaseModel] | None) -> str:
    """`unknown key 'schedul'; did you mean 'schedule'? (allowed: name, schedule, ...)`."""
    if model in LITERAL_SECRET_KEYS:
        names, message = LITERAL_SECRET_KEYS[model]
        if key.lower() in names:
            return message
    if model is None:
        return f"unknown key '{key}'"
    allowed = list(model.model_fields)
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown key '{key}'{hint} (allowed: {', '.join(allowed)})"


def model_at(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The model class whose fields live at `loc` (dict keys and list indexes stepped over)."""
    current: Any = root
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        elif typing.get_origin(current) in (dict, list):
            current = typing.get_args(current)[-1]
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


class _Hidden:
    """Stands in for an input value under a secret-looking key, so it is never quoted."""


_HIDDEN = _Hidden()


_SECRET_KEY_NAME = re.compile(r"(^|[_-])(key|secret|token|password|authorization)($|[_-])", re.IGNORECASE)


def _looks_secret(loc: Loc) -> bool:
    return bool(loc) and bool(_SECRET_KEY_NAME.search(str(loc[-1])))


def describe(value: Any) -> str:
    """A short, safe rendering of a bad input value."""
    if isinstance(value, _Hidden):
        return "a value that is not shown as it may be secret"
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "nothing (null)"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated[...] and Optional[...] down to the interesting type."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation
