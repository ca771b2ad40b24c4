"""Fuzzing the /proc/net/dev parser: the kernel's format round-trips for any legal interface name, and
anything else is either parsed into unsigned counters or refused with ValueError.

Its caller, the netdev collector, runs under sampling.run_step, which records a failure (and logs it)
for any exception; ValueError is the one the parser documents, so another type is a bug. Counters feed
the credit model as cumulative u64s, so a negative value must never come out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent.readers.netdev import NetDevCounters, parse_proc_net_dev, read_proc_net_dev

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "proc_net_dev.txt"
CAPTURE = FIXTURE.read_text(encoding="ascii").split("\n", 1)[1]  # the first line says where it came from
HEADER = "".join(CAPTURE.splitlines(keepends=True)[:2])
u64 = st.integers(0, 2**64 - 1)

# What net/core/dev.c dev_valid_name allows: 1-15 bytes, none of NUL, '/', ':' or (the kernel's) isspace,
# and not "." or "..". Names are bytes; here, text as os.fsdecode() gives it, anything else included.
KERNEL_SPACE = "\t\n\v\f\r "
names = st.text(st.characters(blacklist_characters="\x00/:" + KERNEL_SPACE, blacklist_categories=("Cs",)),
                min_size=1, max_size=15).filter(lambda n: n not in (".", "..") and len(os.fsencode(n)) < 16)


def kernel_line(name: str, v: list[int]) -> str:
    """One interface as net/core/net-procfs.c dev_seq_printf_stats prints it."""
    return ("%6s:%8d %7d %4d %4d %4d %5d %10d %9d %8d %7d %4d %4d %4d %5d %7d %10d\n"  # noqa: UP031 - the C format
            % (name, *v))


@given(st.dictionaries(names, st.lists(u64, min_size=16, max_size=16), max_size=6))
@example({"eth0": list(range(16))})
@example({"a\x1cb": [1] * 16, "\x85": [2] * 16, "\u2003x": [3] * 16, "\u2028": [4] * 16})
def test_kernel_output_round_trips(ifaces: dict[str, list[int]]) -> None:
    text = HEADER + "".join(kernel_line(n, v) for n, v in ifaces.items())
    expected = {n: NetDevCounters(*(v[i] for i in (0, 1, 2, 3, 8, 9, 10, 11))) for n, v in ifaces.items()}
    assert parse_proc_net_dev(text) == expected


ARABIC_12 = "\u0661\u0662"  # Arabic-Indic digits: int() reads them as 12
junk_fields = st.sampled_from(["-1", "+1", "1_000", ARABIC_12, "²", "0x10", "1e3", "", "x", "18446744073709551616"])
fields = st.lists(st.one_of(u64.map(str), junk_fields, st.text(max_size=4)), min_size=14, max_size=18)
lines = (st.sampled_from(CAPTURE.splitlines()) | st.text(max_size=40)
         | st.tuples(st.text(max_size=8), fields).map(lambda t: f"{t[0]}: {' '.join(t[1])}"))


@given(st.lists(lines, max_size=8).map("\n".join))
@example(HEADER + "eth0: -1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n")
@example(HEADER + "eth0: 1_0 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n")
@example(HEADER + f"eth0: {ARABIC_12} 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n")
def test_any_text_is_parsed_into_unsigned_counters_or_refused(text: str) -> None:
    try:
        parsed = parse_proc_net_dev(text)
    except ValueError:
        return
    assert len(parsed) <= text.count(":"), parsed      # one interface per "name:" line at most
    for name, counters in parsed.items():
        assert ":" not in name and "\n" not in name
        assert all(type(x) is int and x >= 0 for x in counters), (name, counters)


@pytest.mark.parametrize("raw", ["é".encode(), b"\xff\xfe", b"a\x85b"], ids=["utf-8", "not-utf-8", "nel"])
def test_non_ascii_interface_names_are_read(tmp_path: Path, raw: bytes) -> None:
    """The reader decoded /proc/net/dev as ASCII: one interface with another name stopped all sampling."""
    (tmp_path / "net").mkdir()
    body = HEADER.encode() + b"%6s:" % raw + b" 1" * 16 + b"\n" + b"  eth0:" + b" 2" * 16 + b"\n"
    (tmp_path / "net" / "dev").write_bytes(body)
    parsed = parse_proc_net_dev(read_proc_net_dev(str(tmp_path)))
    assert parsed[os.fsdecode(raw)] == NetDevCounters(*[1] * 8)
    assert parsed["eth0"] == NetDevCounters(*[2] * 8)
