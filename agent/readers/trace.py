"""A traffic history for `burstwatch replay`: the trace CSV, read row by row (docs/replay.md, "The trace")."""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import math
from dataclasses import dataclass
from typing import IO, Callable, Iterable, Iterator, Optional

REQUIRED = ("timestamp", "in_bytes", "out_bytes")
OPTIONAL = ("in_shaped", "out_shaped")


class TraceError(ValueError):
    """Bad input, naming the file, the row (its line in the file, the header being line 1) and the column."""


@dataclass(frozen=True)
class TraceRow:
    """One interval of the trace: `dt` seconds ending at `t` (Unix seconds); the shaped counts are None when
    the trace has no such column."""

    line: int
    t: float
    dt: float
    in_bytes: float
    out_bytes: float
    in_shaped: Optional[int] = None
    out_shaped: Optional[int] = None


def parse_timestamp(text: str) -> float:
    """Unix seconds, or ISO 8601 (a naive time is UTC; 'Z' is accepted on Python 3.9 too)."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
        stamp = dt.datetime.fromisoformat(iso)      # ValueError names nothing: the caller adds row and column
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=dt.timezone.utc)
        return stamp.timestamp()
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    return value


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError("not a finite number >= 0")
    return value


def _count(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise ValueError("not a whole number >= 0")
    return value


def _columns(header: list[str], name: str) -> dict[str, int]:
    """Where each known column is; raises TraceError for a missing required or a repeated known column."""
    for col in REQUIRED:
        if col not in header:
            raise TraceError(f"{name}: row 1: missing column {col!r} (the header needs {', '.join(REQUIRED)}; "
                             f"optional {', '.join(OPTIONAL)})")
    dupes = sorted({h for h in header if header.count(h) > 1 and h in REQUIRED + OPTIONAL})
    if dupes:
        raise TraceError(f"{name}: row 1: column {dupes[0]!r} appears twice")
    return {h: header.index(h) for h in REQUIRED + OPTIONAL if h in header}


def parse_trace(lines: Iterable[str], name: str = "<trace>") -> Iterator[TraceRow]:
    """The rows of a trace CSV, one at a time (a week of 1-s samples is never held). Each row's interval is
    the time since the row before; the first row's is taken to be the second's (its start is not in the
    file). Raises TraceError on the first bad cell, an empty trace or timestamps that do not increase."""
    reader = csv.reader(lines)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise TraceError(f"{name}: empty file (needs a header: {', '.join(REQUIRED)})") from None
    except csv.Error as exc:
        raise TraceError(f"{name}: row 1: {exc}") from None
    idx = _columns(header, name)
    width = max(idx.values()) + 1

    def cell(row: list[str], line: int, col: str, parse: Callable[[str], float]) -> float:
        text = row[idx[col]]
        try:
            return parse(text)
        except ValueError as exc:
            raise TraceError(f"{name}: row {line}, column {col!r}: {text!r} is not valid ({exc})") from None

    first: Optional[TraceRow] = None         # held until the second row gives it an interval
    before: Optional[float] = None
    try:
        for row in reader:
            line = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) < width:
                raise TraceError(f"{name}: row {line}: {len(row)} columns, the header has {len(header)}")
            t = cell(row, line, "timestamp", parse_timestamp)
            in_b = cell(row, line, "in_bytes", _number)
            out_b = cell(row, line, "out_bytes", _number)
            in_s = None if "in_shaped" not in idx or not row[idx["in_shaped"]].strip() \
                else int(cell(row, line, "in_shaped", _count))
            out_s = None if "out_shaped" not in idx or not row[idx["out_shaped"]].strip() \
                else int(cell(row, line, "out_shaped", _count))
            if before is None:
                first = TraceRow(line, t, 0.0, in_b, out_b, in_s, out_s)
                before = t
                continue
            if t <= before:
                raise TraceError(f"{name}: row {line}, column 'timestamp': {row[idx['timestamp']]!r} is not after "
                                 f"the row before (timestamps must increase)")
            if first is not None:
                yield dataclasses.replace(first, dt=t - before)
                first = None
            yield TraceRow(line, t, t - before, in_b, out_b, in_s, out_s)
            before = t
    except csv.Error as exc:
        raise TraceError(f"{name}: row {reader.line_num}: {exc}") from None
    if first is not None or before is None:
        raise TraceError(f"{name}: needs at least two rows after the header (an interval is the time between rows)")


def read_trace(path: str) -> Iterator[TraceRow]:
    """The rows of the trace file at `path` ('-' for standard input), streamed."""
    import sys

    if path == "-":
        yield from parse_trace(sys.stdin, "<stdin>")
        return
    try:
        f: IO[str] = open(path, encoding="utf-8", newline="")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with f:
        yield from parse_trace(f, path)

