"""The demo's live table: redrawn in place on a terminal, line by line when piped."""

from __future__ import annotations

import io

from monitor.demo import LiveTable


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _fill(table: LiveTable) -> None:
    for ttft in (300.0, 310.0, 320.0):
        table.add({"target": "qwen3-8b", "prompt": "short", "ttft_ms": ttft})


def test_a_terminal_gets_the_table_redrawn_in_place_with_notes_above_it() -> None:
    screen = Terminal()
    table = LiveTable(screen)
    _fill(table)
    table.maybe_draw(10)
    lines = table.drawn_lines
    assert lines == 3 and "qwen3-8b" in screen.getvalue()
    table.note("\n!!! [PAGE] TTFT regression on qwen3-14b\n")
    text = screen.getvalue()
    erase = f"\x1b[{lines}F\x1b[J"
    assert text.index(erase) < text.index("!!! [PAGE]")
    table.maybe_draw(11)  # the note reset the timer: the table comes back under the note at once
    assert screen.getvalue().rindex("-- TTFT after 11 s") > screen.getvalue().index("!!! [PAGE]")


def test_a_pipe_gets_plain_lines() -> None:
    piped = io.StringIO()
    table = LiveTable(piped)
    _fill(table)
    table.maybe_draw(10)
    table.note("\n!!! [PAGE] x\n")
    assert "\x1b[" not in piped.getvalue() and "!!! [PAGE] x" in piped.getvalue()


def test_probe_progress_shows_done_total_and_eta_on_a_terminal_only() -> None:
    from monitor.commands.probe import Progress
    from tests.support.store_fixtures import make_samples

    samples = make_samples(rounds=3, warmup=1)
    screen, piped = Terminal(), io.StringIO()
    for stream in (screen, piped):
        progress = Progress(len(samples), stream)
        for sample in samples:
            progress(sample)
        progress.close()
    assert "1/4 ETA " in screen.getvalue() and "4/4 qwen3-8b/short" in screen.getvalue()
    assert piped.getvalue() == ""
