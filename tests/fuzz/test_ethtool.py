"""Fuzzing the ethtool parsers: captured `ethtool -S/-i/-l/-g` text and the SIOCETHTOOL replies.

The text parsers serve FixtureEthtoolReader, whose callers (the ethtool and shaping sampling steps, under
sampling.run_step) treat NotSupported as "nothing here" and anything else as a failed collection.
What each parser documents, and so what the properties allow: parse_ethtool_S raises NotSupported ("no
stats available"); parse_ethtool_i raises ValueError without a `driver:` line; parse_ethtool_l/_g raise
ValueError without either section. Statistics are u64 counters (ethtool prints them with %llu), channel
and ring sizes u32s, so nothing negative may come out. The ioctl reader's decoding is not a pure function;
it is fuzzed here through a fake kernel behind its one `_ioctl` method."""

from __future__ import annotations

import array
import struct
import threading
from pathlib import Path
from typing import Iterable

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent.readers import ethtool as e
from agent.readers.errors import NotSupported

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ethtool"
CAPTURES = {kind: [p.read_text(encoding="utf-8") for p in sorted(FIXTURES.glob(f"*/{kind}.txt"))]
            for kind in ("S", "i", "l", "g")}


@st.composite
def damaged(draw: st.DrawFn, kind: str) -> str:
    """A captured output with a few lines replaced, inserted or cut, and a few characters changed."""
    lines = draw(st.sampled_from(CAPTURES[kind])).splitlines()
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(lines)))
        junk = draw(st.sampled_from(["", ":", "::", "x:", ": 1", "n/a", "-1", "²", "\u0661\u0662", "1_0", "0x1f", " 7 ",
                                     "9" * 5000, "Pre-set maximums:", "Current hardware settings:", "#",
                                     "no stats available"]) | st.text(max_size=12))
        how = draw(st.integers(0, 2))
        if how == 0 and at < len(lines):
            key = lines[at].partition(":")[0]
            lines[at] = f"{key}:{junk}"
        elif how == 1:
            lines.insert(at, junk)
        else:
            del lines[at:at + 1]
    return "\n".join(lines)


def texts(kind: str) -> st.SearchStrategy[str]:
    return damaged(kind) | st.text(max_size=60) | st.lists(st.sampled_from(
        ["\n", ":", " ", "\t", "#", "NIC statistics:", "Pre-set maximums:", "Current hardware settings:",
         "RX", "TX", "Combined", "driver", "-1", "n/a", "12", "²"]), max_size=20).map("".join)


def unsigned(values: Iterable[object]) -> bool:
    return all(type(v) is int and 0 <= v < 10**20 for v in values)


# -- ethtool -S --------------------------------------------------------------------------------------------

@given(texts("S"))
@example("NIC statistics:\n     tx_timeout: -1\n")
@example("NIC statistics:\n     rx_bytes: 1_000\n     tx_bytes: \u0661\u0662\n")
@example("NIC statistics:\n     rx_bytes: " + "9" * 5000 + "\n")
def test_ethtool_S_gives_unsigned_statistics_or_not_supported(text: str) -> None:
    try:
        stats = e.parse_ethtool_S(text)
    except NotSupported:
        return
    assert unsigned(stats.values()), stats


# Statistic names as drivers write them: printable ASCII without line breaks, not a comment or header.
stat_names = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=32).filter(
    lambda n: not n.startswith("#") and not n.startswith("NIC statistics"))


@given(st.dictionaries(stat_names, st.integers(0, 2**64 - 1), max_size=10))
@example({"queue_0_tx_cnt": 2**64 - 1, "bw_in_allowance_exceeded": 0, "a:b": 1})
def test_ethtool_S_round_trips(stats: dict[str, int]) -> None:
    text = "NIC statistics:\n" + "".join(f"     {k}: {v}\n" for k, v in stats.items())
    assert e.parse_ethtool_S(text) == stats


# -- ethtool -i --------------------------------------------------------------------------------------------

@given(texts("i"))
def test_ethtool_i_gives_driver_info_or_value_error(text: str) -> None:
    try:
        info = e.parse_ethtool_i(text)
    except ValueError as exc:
        assert "driver" in str(exc)
        return
    assert all(isinstance(x, str) and "\n" not in x for x in info)


line_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=24).map(str.strip)


@given(st.builds(e.DriverInfo, line_text, line_text, line_text, line_text))
@example(e.DriverInfo("ena", "2.12.3g", "", "0000:00:05.0"))
def test_ethtool_i_round_trips(info: e.DriverInfo) -> None:
    text = (f"driver: {info.driver}\nversion: {info.version}\nfirmware-version: {info.firmware}\n"
            f"expansion-rom-version: \nbus-info: {info.bus_info}\nsupports-statistics: yes\n")
    assert e.parse_ethtool_i(text) == info


# -- ethtool -l and -g -------------------------------------------------------------------------------------

def has_section(text: str) -> bool:
    return any(ln.strip().lower().startswith(("pre-set maximums", "current hardware settings"))
               for ln in text.splitlines() if not ln.lstrip().startswith("#"))


@given(texts("l"))
@example("Channel parameters for ens5:\nPre-set maximums:\nCombined:\t²\n")
def test_ethtool_l_gives_channels_or_value_error_without_sections(text: str) -> None:
    try:
        channels = e.parse_ethtool_l(text)
    except ValueError:
        assert not has_section(text), "a ValueError although the text has a section"
        return
    assert unsigned(channels)


@given(texts("g"))
@example("Ring parameters for ens5:\nPre-set maximums:\nRX:\t\t\u0661\u0666\u0663\u0668\u0664\nTX:\t\t²\n")
def test_ethtool_g_gives_rings_or_value_error_without_sections(text: str) -> None:
    try:
        rings = e.parse_ethtool_g(text)
    except ValueError:
        assert not has_section(text), "a ValueError although the text has a section"
        return
    assert unsigned(rings)


u32 = st.integers(0, 2**32 - 1)


def show(v: int, na: bool) -> str:
    return "n/a" if na and v == 0 else str(v)  # newer ethtool prints n/a where older print 0


@given(st.builds(e.Channels, u32, u32, u32, u32, u32, u32, u32, u32), st.booleans())
def test_ethtool_l_round_trips(ch: e.Channels, na: bool) -> None:
    def section(rx: int, tx: int, other: int, combined: int) -> str:
        return (f"RX:\t\t{show(rx, na)}\nTX:\t\t{show(tx, na)}\nOther:\t\t{show(other, na)}\n"
                f"Combined:\t{show(combined, na)}\n")
    text = ("Channel parameters for eth0:\nPre-set maximums:\n" + section(ch.max_rx, ch.max_tx, ch.max_other,
                                                                           ch.max_combined)
            + "Current hardware settings:\n" + section(ch.rx, ch.tx, ch.other, ch.combined))
    assert e.parse_ethtool_l(text) == ch


@given(st.builds(e.Rings, u32, u32, u32, u32), st.booleans())
def test_ethtool_g_round_trips(rings: e.Rings, na: bool) -> None:
    def section(rx: int, tx: int) -> str:
        return f"RX:\t\t{show(rx, na)}\nRX Mini:\tn/a\nRX Jumbo:\tn/a\nTX:\t\t{show(tx, na)}\n"
    text = ("Ring parameters for eth0:\nPre-set maximums:\n" + section(rings.rx_max, rings.tx_max)
            + "Current hardware settings:\n" + section(rings.rx, rings.tx) + "RX Buf Len:\t\tn/a\nTX Push:\toff\n")
    assert e.parse_ethtool_g(text) == rings


# -- the SIOCETHTOOL replies -------------------------------------------------------------------------------

class FakeKernel(e.IoctlEthtoolReader):
    """The reader with its ioctl answered by a kernel whose statistic count changes from call to call
    (`ethtool -L` adding queues, a driver reset) and whose other replies are arbitrary bytes."""

    def __init__(self, counts: list[int], mask: int, fill: bytes) -> None:  # no socket: _ioctl is ours
        self._lock = threading.Lock()
        self._cache: dict[str, e._StatsCache] = {}
        self.counts, self.mask, self.fill, self.last = counts, mask, fill, 0

    def _count(self) -> int:
        if self.counts:
            self.last = self.counts.pop(0)
        return self.last

    def _ioctl(self, ifname: str, buf: array.array) -> None:
        if buf.typecode == "Q":  # GSTATS: the kernel writes its own count and that many u64s
            n = self._count()
            buf[0] = e.ETHTOOL_GSTATS | (n << 32)
            for i in range(min(n, len(buf) - 1)):  # the real kernel would overrun a short buffer
                buf[1 + i] = 1000 + i
            return
        assert buf.typecode == "B"
        cmd = struct.unpack_from("=I", buf)[0]
        if cmd == e.ETHTOOL_GSSET_INFO:
            struct.pack_into("=IIQI", buf, 0, cmd, 0, self.mask, self._count())
        elif cmd == e.ETHTOOL_GSTRINGS:
            n = self._count()
            struct.pack_into("=I", buf, 8, n)
            for i in range(min(n, (len(buf) - 12) // e.ETH_GSTRING_LEN)):
                struct.pack_into("32s", buf, 12 + i * e.ETH_GSTRING_LEN, b"stat_%d" % i)
        elif self.fill:  # GDRVINFO, GCHANNELS, GRINGPARAM: whatever the driver put there
            buf[4:] = array.array("B", (self.fill * (len(buf) // len(self.fill) + 1))[:len(buf) - 4])


@given(st.lists(st.integers(0, 600), max_size=12), st.sampled_from([1 << e.ETH_SS_STATS, 0, 0xFF]),
       st.binary(max_size=64))
@example([3, 3, 3], 1 << e.ETH_SS_STATS, b"")
@example([3, 5, 5, 5, 5], 1 << e.ETH_SS_STATS, b"\xff")  # grew between GSSET_INFO and GSTRINGS
@example([3, 3, 4, 4, 4, 4], 1 << e.ETH_SS_STATS, b"")  # grew between GSTRINGS and GSTATS
def test_ioctl_stats_decode_whatever_the_kernel_replies(counts: list[int], mask: int, fill: bytes) -> None:
    kernel = FakeKernel(list(counts), mask, fill)
    try:
        stats = kernel.stats("eth0")
    except NotSupported:
        pass
    else:
        # Names and values of one and the same count: never a value under another statistic's name. (Empty
        # when the count fell to 0 between GSSET_INFO and GSTRINGS, where NotSupported would be more exact.)
        assert stats == {f"stat_{i}": 1000 + i for i in range(len(stats))}
    info, channels, rings = kernel.driver("eth0"), kernel.channels("eth0"), kernel.rings("eth0")
    assert info is not None and all(isinstance(x, str) for x in info)
    assert channels is not None and unsigned(channels) and rings is not None and unsigned(rings)


@pytest.mark.parametrize("fill", [b"\xff" * 200, b"\x00" * 200, bytes(range(256))])
def test_driver_strings_of_any_bytes_decode(fill: bytes) -> None:
    info = FakeKernel([], 0, fill).driver("eth0")
    assert info is not None and all("\0" not in x for x in info)
