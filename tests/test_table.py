from monitor.table import table_lines


def test_it_pads_each_column_to_its_widest_cell_and_right_aligns_numbers_after_the_left_columns():
    lines = table_lines(["name", "n"], [["a", "10"], ["longer", "2"]], left_columns=1, rule=True)
    assert lines == ["name     n", "------  --", "a       10", "longer   2"]


def test_it_left_aligns_every_column_by_default_and_trims_trailing_spaces():
    assert table_lines(["A", "B"], [["xyz", ""], ["", "q"]]) == ["A    B", "xyz", "     q"]
