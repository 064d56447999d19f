from monitor.table import table_lines


def test_it_pads_each_column_to_its_widest_cell_and_right_aligns_numbers_after_the_left_columns():
    lines = table_lines(["name", "n"], [["a", "10"], ["longer", "2"]], left_columns=1, rule=True)
    assert lines == ["name     n", "------  --", "a       10", "longer   2"]


def test_it_left_aligns_every_column_by_default_and_trims_trailing_spaces():
    assert table_lines(["A", "B"], [["xyz", ""], ["", "q"]]) == ["A    B", "xyz", "     q"]


def test_a_cell_with_control_characters_is_shown_escaped_and_laid_out_by_what_is_shown() -> None:
    lines = table_lines(["model", "n"], [["\x1b[31mred\x07", "1"], ["plain", "2"]])
    assert lines == ["model" + " " * 12 + "n", "\\x1b[31mred\\x07  1", "plain" + " " * 12 + "2"]
