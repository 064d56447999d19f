"""CSV cells a spreadsheet will not run: text that starts like a formula gets a leading `'`. Pure.

A spreadsheet treats a cell starting with `=`, `+`, `-` or `@` (and, in some, a tab or a carriage
return before one) as a formula, so `=HYPERLINK(...)` from a server's request id or `@SUM(...)` as a
served model would run when an export is opened. OWASP's remedy: prefix such a cell with a single
quote, which spreadsheets show as text. Numbers are left alone, whether a value (-8.5) or text that
is only a number ("-8.5", as the replay export writes it): a spreadsheet reads those as the number.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def csv_cell(value: Any) -> Any:
    """`value` fit for a CSV cell: a string that starts like a formula gets a leading `'`."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def csv_row(values: Iterable[Any]) -> list[Any]:
    return [csv_cell(value) for value in values]


def read_csv_cell(text: str) -> str:
    """A cell as written before `csv_cell` (for a reader of our own exports)."""
    return text[1:] if text.startswith("'") and text[1:].startswith(FORMULA_STARTS) else text
