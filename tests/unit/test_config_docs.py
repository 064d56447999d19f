import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from monitor.config.docs import BEGIN, END, render_reference, replace_reference
from monitor.config.models import Config

DOCS = Path(__file__).resolve().parent.parent.parent / "docs" / "configuration.md"


def documented_paths(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every key path, written the way the docs write it: `providers.<name>.api`, `jobs[].name`."""
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        yield path
        nested = submodel(field.annotation)
        if nested is not None:
            model_type, container = nested
            suffix = {"dict": ".<name>.", "list": "[].", "": "."}[container]
            yield from documented_paths(model_type, f"{path}{suffix}")


def submodel(annotation: Any) -> tuple[type[BaseModel], str] | None:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    if origin is dict and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return args[1], "dict"
    if origin is list and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0], "list"
    return None


def test_every_config_key_is_documented() -> None:
    text = DOCS.read_text(encoding="utf-8")
    missing = [path for path in documented_paths(Config) if f"| `{path}` |" not in text]
    assert not missing, f"undocumented config keys in {DOCS}: {missing}"


def test_every_documented_key_exists() -> None:
    reference = DOCS.read_text(encoding="utf-8").partition(BEGIN)[2].partition(END)[0]
    known = set(documented_paths(Config))
    rows = [line.split("`")[1] for line in reference.splitlines() if line.startswith("| `")]
    assert rows
    stale = [path for path in rows if path not in known]
    assert not stale, f"documented keys that no longer exist: {stale}"


def test_the_generated_reference_is_up_to_date() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert replace_reference(text, render_reference()) == text, (
        "docs/configuration.md is stale; run: .venv/bin/python -m monitor.config.docs --write docs/configuration.md"
    )


def test_every_field_has_a_description() -> None:
    def walk(model: type[BaseModel]) -> Iterator[str]:
        for name, field in model.model_fields.items():
            if not field.description:
                yield f"{model.__name__}.{name}"
            nested = submodel(field.annotation)
            if nested is not None:
                yield from walk(nested[0])

    assert list(walk(Config)) == []
