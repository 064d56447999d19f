"""Every command's help, rendered as `--help` prints it, reads as written: no doubled `%%` (argparse
does not %-format a description), no sentence cut off mid-way, every description ending in
punctuation; and a bad value for any typed option gets one `--opt:` prefix, not two."""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import pytest

from monitor.cli import build_parser

# A help fragment (they end without a full stop, by convention) must not end on a word that needs more.
DANGLING = re.compile(
    r"\b(a|an|the|and|or|but|is|are|was|be|to|of|for|with|by|in|on|at|as|that|which|when|if|its|their|than)$", re.I
)
BAD_VALUES = ("2kb", "-3", "not-a-value")


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (sub)command's parser, with the words that reach it."""
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if all(sub is not seen for _, seen in found):
                    found += commands(sub, (*path, name))
    return found


def helps(parser: argparse.ArgumentParser) -> list[str]:
    """The help strings of the parser's options and subcommands, as argparse prints them."""
    texts = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            texts += [choice.help for choice in action._choices_actions if choice.help]
        elif action.help and action.help is not argparse.SUPPRESS:
            texts.append(action.help % {**vars(action), "prog": parser.prog})
    return texts


ALL = commands(build_parser())


def test_there_are_commands_to_check() -> None:
    names = {" ".join(path) for path, _ in ALL}
    assert {"", "probe", "report", "incidents", "incidents ack", "db"} <= names, names


@pytest.mark.parametrize(("path", "parser"), ALL, ids=[" ".join(p) or "ttft-monitor" for p, _ in ALL])
def test_each_commands_help_reads_as_written(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    rendered = parser.format_help()
    assert "%%" not in rendered and "%(" not in rendered, rendered
    problems = [text for text in helps(parser) if DANGLING.search(text.rstrip())]
    assert problems == [], f"help cut off mid-sentence in `{' '.join(path)}`: {problems}"
    description = " ".join((parser.description or "").split())
    if description:
        assert description[-1] in ".!?)", f"`{' '.join(path)}` description ends without punctuation: {description!r}"


def _typed_options(parser: argparse.ArgumentParser) -> list[str]:
    return [
        action.option_strings[-1]
        for action in parser._actions
        if action.option_strings and action.type is not None and action.choices is None
    ]


CASES = [(path, option) for path, parser in ALL for option in _typed_options(parser)]


@pytest.mark.parametrize(("path", "option"), CASES, ids=[f"{' '.join(p)} {o}" for p, o in CASES])
def test_a_bad_value_is_named_once(path: tuple[str, ...], option: str) -> None:
    for value in BAD_VALUES:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
            build_parser().parse_args([*path, option, value])
        message = err.getvalue()
        assert not re.search(r"(--?[\w-]+): \1:", message), message
        assert message.count("\n") <= 1, message  # one line, naming the cause
