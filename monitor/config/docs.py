"""Generates the key reference in docs/configuration.md from the models, so the two cannot drift.

python -m monitor.config.docs --write docs/configuration.md   # regenerate
python -m monitor.config.docs --check docs/configuration.md   # exit 1 if stale
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from monitor.config.models import Config
from monitor.docgen import regenerate

BEGIN = "<!-- BEGIN GENERATED REFERENCE: python -m monitor.config.docs --write docs/configuration.md -->"
END = "<!-- END GENERATED REFERENCE -->"

_SCALARS = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    Path: "path",
    datetime: "date-time",
}
_BOUNDS = (
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Ge, "ge", ">="),
    (annotated_types.Lt, "lt", "<"),
    (annotated_types.Le, "le", "<="),
)


def reference_rows(
    model: type[BaseModel], prefix: str = "", defaults: BaseModel | None = None
) -> Iterator[tuple[str, str, str, str]]:
    """(key path, type, default, meaning) for every field of `model` and its nested models."""
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        nested, nested_prefix = _nested_model(field.annotation, path)
        if defaults is not None:
            default = getattr(defaults, name)
        elif field.is_required():
            default = _REQUIRED
        else:
            default = field.get_default(call_default_factory=True)
        yield (
            path,
            describe_type(field),
            format_default(default),
            (field.description or "").replace("|", "\\|"),
        )
        if nested is not None:
            yield from reference_rows(nested, nested_prefix, default if isinstance(default, BaseModel) else None)


def render_reference() -> str:
    """The markdown between the BEGIN/END markers: one table per top-level key."""
    sections: list[str] = []
    current: list[str] = []
    for path, type_text, default, meaning in reference_rows(Config):
        if "." not in path and "[" not in path:
            if current:
                sections.append("\n".join(current))
            current = [
                f"### `{path}`",
                "",
                meaning,
                "",
                "| Key | Type | Default | Meaning |",
                "|---|---|---|---|",
            ]
        current.append(f"| `{path}` | {type_text} | {default} | {meaning} |")
    sections.append("\n".join(current))
    return "\n\n".join(sections) + "\n"


def replace_reference(document: str, reference: str) -> str:
    """`document` with the text between the markers replaced by `reference`."""
    head, begin, rest = document.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"markers not found; the document needs a line {BEGIN!r} and a line {END!r}")
    return f"{head}{BEGIN}\n\n{reference}\n{END}{tail}"


def describe_type(field: FieldInfo) -> str:
    text = _type_text(field.annotation)
    bounds = [
        f"{sign} {_number(getattr(item, attr))}"
        for item in field.metadata
        for kind, attr, sign in _BOUNDS
        if isinstance(item, kind)
    ]
    if any(isinstance(item, annotated_types.MinLen) and item.min_length == 1 for item in field.metadata):
        bounds.append("not empty")
    return f"{text}, {' and '.join(bounds)}" if bounds else text


class _Required:
    pass


_REQUIRED = _Required()


def format_default(value: Any) -> str:
    if isinstance(value, _Required):
        return "**required**"
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float | int):
        return f"`{_number(value)}`"
    if isinstance(value, list):
        return f"`[{', '.join(str(item) for item in value)}]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    if isinstance(value, Path) and not value.is_absolute():
        return f"`./{value}`"
    if value == "":
        return '`""`'
    return f"`{value}`"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _type_text(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_text(args[0])
    if origin in (typing.Union, types.UnionType):
        members = [arg for arg in args if arg is not type(None)]
        text = " or ".join(_type_text(arg) for arg in members)
        return f"{text} or null" if len(members) < len(args) else text
    if origin is Literal:
        return "one of " + ", ".join(f"`{arg}`" for arg in args)
    if origin is dict:
        value = args[1]
        if _is_model(value):
            return f"mapping of name to {_type_text(value)}"
        if value is Any:
            return "mapping"
        return f"mapping of {_type_text(args[0])} to {_type_text(value)}"
    if origin is list:
        return f"list of {_type_text(args[0])}"
    if _is_model(annotation):
        return "mapping"
    return _SCALARS.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _nested_model(annotation: Any, path: str) -> tuple[type[BaseModel] | None, str]:
    """The model nested under a field, and the key prefix its fields are documented under."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _nested_model(args[0], path)
    if _is_model(annotation):
        return annotation, f"{path}."
    if origin is dict and _is_model(args[1]):
        return args[1], f"{path}.<name>."
    if origin is list and _is_model(args[0]):
        return args[0], f"{path}[]."
    return None, ""


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def main(argv: list[str] | None = None) -> int:
    return regenerate(
        argv,
        prog="python -m monitor.config.docs",
        description=__doc__.splitlines()[0],
        update=lambda document: replace_reference(document, render_reference()),
    )


if __name__ == "__main__":
    raise SystemExit(main())
