"""Argument types and options shared by every command line: argparse only, so the CLI starts fast."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping

DEFAULT_CONFIG_ENV = "TTFT_CONFIG"


def config_arg(parser: argparse.ArgumentParser, *, note: str = "") -> None:
    """`--config/-c`; when absent, commands read $TTFT_CONFIG, else ./config.yaml."""
    parser.add_argument(
        "--config", "-c", default=None, help=f"config file (default: ${DEFAULT_CONFIG_ENV}, else ./config.yaml){note}"
    )


def config_path(given: str | None, environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return given or env.get(DEFAULT_CONFIG_ENV) or "config.yaml"


def whole_number(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be at least {minimum}")
        return value

    return parse


def non_negative(unit: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a number of {unit}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{value:g} must be 0 or more")
        return value

    return parse
