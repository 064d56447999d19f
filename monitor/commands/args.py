"""Argument types and options shared by every command line: argparse only, so the CLI starts fast."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from typing import NoReturn

DEFAULT_CONFIG_ENV = "TTFT_CONFIG"


class OneLineErrorParser(argparse.ArgumentParser):
    """Usage errors as one line naming the cause (and where help is), not the usage block first.

    Subcommands' parsers inherit the class, so every command of the CLI answers the same way.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def config_arg(parser: argparse.ArgumentParser, *, note: str = "") -> None:
    """`--config/-c`; when absent, commands read $TTFT_CONFIG, else ./config.yaml."""
    parser.add_argument(
        "--config", "-c", default=None, help=f"config file (default: ${DEFAULT_CONFIG_ENV}, else ./config.yaml){note}"
    )


def config_path(given: str | None, environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return given or env.get(DEFAULT_CONFIG_ENV) or "config.yaml"


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be at least {minimum}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{value} must be at most {maximum}")
        return value

    return parse


def port_number(text: str) -> int:
    """A TCP port, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a port number (0 to 65535)") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number: use 0 to 65535 (0 picks a free one)")
    return value


def _finite(text: str, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of {unit}") from None
    # float() also reads 'inf' and 'nan': a wait of forever hangs, and nan compares false with every bound.
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"'{text}' is not a finite number of {unit}")
    return value


def non_negative(unit: str, *, maximum: float | None = None) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = _finite(text, unit)
        if value < 0:
            raise argparse.ArgumentTypeError(f"{value:g} must be 0 or more")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{value:g} must be at most {maximum:g}")
        return value

    return parse


def positive(unit: str, *, maximum: float | None = None) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = _finite(text, unit)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{value:g} must be more than 0")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{value:g} must be at most {maximum:g}")
        return value

    return parse
