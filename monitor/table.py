"""Plain-text tables for the terminal: every CLI table is laid out here."""

from __future__ import annotations

from collections.abc import Sequence

from monitor.servertext import printable


def table_lines(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, left_columns: int | None = None, rule: bool = False
) -> list[str]:
    """Columns two spaces apart, each as wide as its widest cell, trailing spaces trimmed.

    The first `left_columns` columns (all when None) are left-aligned, the rest right-aligned (numbers);
    `rule` puts a line of dashes under the header. Control characters in a cell (text a server or
    a stored row chose) are shown as escapes, so no cell can move the cursor or recolour the terminal.
    """
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(header[col]), *(len(row[col]) for row in rows)) for col in range(len(header))]
    lefts = len(header) if left_columns is None else left_columns

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        padded = (cell.ljust(w) if col < lefts else cell.rjust(w) for col, (cell, w) in pairs)
        return "  ".join(padded).rstrip()

    lines = [line(header)]
    if rule:
        lines.append(line(["-" * w for w in widths]))
    lines.extend(line(row) for row in rows)
    return lines
