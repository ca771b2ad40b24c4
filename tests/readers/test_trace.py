"""The trace CSV of `burstwatch replay`: rows, intervals, and errors that name the row and the column."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.readers.trace import TraceError, parse_timestamp, parse_trace, read_trace


def rows(text: str) -> list:
    return list(parse_trace(text.splitlines(keepends=True), "t.csv"))


def test_intervals_are_the_time_since_the_row_before_and_the_first_takes_the_seconds() -> None:
    got = rows("timestamp,in_bytes,out_bytes\n100,1,2\n160,3,4\n460,5,6\n")
    assert [(r.line, r.t, r.dt, r.in_bytes, r.out_bytes) for r in got] == [
        (2, 100.0, 60.0, 1.0, 2.0), (3, 160.0, 60.0, 3.0, 4.0), (4, 460.0, 300.0, 5.0, 6.0)]
    assert got[0].in_shaped is None and got[0].out_shaped is None


def test_shaped_columns_are_optional_per_cell_and_extra_columns_are_ignored() -> None:
    got = rows("note,timestamp,out_bytes,in_bytes,out_shaped\nx,1,10,20,\ny,2,10,20,7\n")
    assert [(r.in_bytes, r.out_bytes, r.out_shaped, r.in_shaped) for r in got] == [
        (20.0, 10.0, None, None), (20.0, 10.0, 7, None)]


@pytest.mark.parametrize("text,stamp", [
    ("1700000000", 1700000000.0), ("1700000000.5", 1700000000.5), ("2023-11-14T22:13:20Z", 1700000000.0),
    ("2023-11-14T22:13:20", 1700000000.0), ("2023-11-14T23:13:20+01:00", 1700000000.0),
    ("2023-11-14 22:13:20.250000+00:00", 1700000000.25)])
def test_timestamps_are_unix_seconds_or_iso_8601(text: str, stamp: float) -> None:
    assert parse_timestamp(text) == stamp


@pytest.mark.parametrize("text,message", [
    ("", "empty file"),
    ("timestamp,in_bytes\n1,2\n", "row 1: missing column 'out_bytes'"),
    ("timestamp,in_bytes,out_bytes,in_bytes\n1,2,3,4\n", "row 1: column 'in_bytes' appears twice"),
    ("timestamp,in_bytes,out_bytes\n1,2,3\n2,x,3\n", "row 3, column 'in_bytes': 'x' is not valid"),
    ("timestamp,in_bytes,out_bytes\n1,2,3\n2,2,-3\n", "row 3, column 'out_bytes': '-3'"),
    ("timestamp,in_bytes,out_bytes\n1,2,3\n2,2,nan\n", "row 3, column 'out_bytes': 'nan'"),
    ("timestamp,in_bytes,out_bytes,out_shaped\n1,2,3,1.5\n", "row 2, column 'out_shaped': '1.5'"),
    ("timestamp,in_bytes,out_bytes\n1,2,3\nyesterday,2,3\n", "row 3, column 'timestamp': 'yesterday'"),
    ("timestamp,in_bytes,out_bytes\n5,2,3\n5,2,3\n", "row 3, column 'timestamp': '5' is not after"),
    ("timestamp,in_bytes,out_bytes\n5,2,3\n6,2\n", "row 3: 2 columns, the header has 3"),
    ("timestamp,in_bytes,out_bytes\n5,2,3\n", "needs at least two rows"),
])
def test_bad_input_names_the_row_and_the_column(text: str, message: str) -> None:
    with pytest.raises(TraceError) as err:
        rows(text)
    assert message in str(err.value) and str(err.value).startswith("t.csv:")


def test_a_file_is_streamed_not_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    with path.open("w") as f:
        f.write("timestamp,in_bytes,out_bytes\n")
        for i in range(1000):
            f.write(f"{i},1,1\n")
    it = read_trace(str(path))
    assert next(it).line == 2 and next(it).line == 3     # rows arrive before the file is read to its end
    assert sum(1 for _ in it) == 998
    with pytest.raises(TraceError, match="cannot read"):
        list(read_trace(str(tmp_path / "missing.csv")))
