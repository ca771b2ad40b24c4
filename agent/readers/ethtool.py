"""Read a device's ethtool statistics, driver identity, channels and rings (SIOCETHTOOL or fixtures)."""

from __future__ import annotations

import array
import errno
import fcntl
import logging
import os
import socket
import struct
import threading
from pathlib import Path
from typing import Mapping, NamedTuple, Optional, Protocol, Union

from agent.readers.errors import NoSuchInterface, NotSupported

log = logging.getLogger(__name__)

# include/uapi/linux/ethtool.h and include/uapi/linux/sockios.h
SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x00000003
ETHTOOL_GRINGPARAM = 0x00000010
ETHTOOL_GSTRINGS = 0x0000001B
ETHTOOL_GSTATS = 0x0000001D
ETHTOOL_GSSET_INFO = 0x00000037
ETHTOOL_GCHANNELS = 0x0000003C
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16
IFREQ_SIZE = 40  # sizeof(struct ifreq) on 64-bit Linux: the kernel copies this much from user space

# struct ethtool_drvinfo: cmd, driver[32], version[32], fw_version[32], bus_info[32],
# erom_version[32], reserved2[12], n_priv_flags, n_stats, testinfo_len, eedump_len, regdump_len
_DRVINFO = struct.Struct("=I32s32s32s32s32s12sIIIII")
_U32X9 = struct.Struct("=9I")            # struct ethtool_ringparam and struct ethtool_channels
_SSET_INFO = struct.Struct("=IIQI")       # cmd, reserved, sset_mask, data[0]

# The kernel fills ETHTOOL_GSTRINGS/GSTATS with *its* current count, not the length user space
# passed (net/ethtool/ioctl.c: ethtool_get_stats sets stats.n_stats from get_sset_count and copies
# that many u64s). A count that grows between our GSSET_INFO and GSTATS (`ethtool -L` adding queues
# adds ~40 ENA stats per queue) would overrun a buffer sized to the old count, so buffers carry
# headroom: twice the count plus this many entries (ENA's 32 queues x ~40 stats fit several times).
HEADROOM = 4096

PathLike = Union[str, "os.PathLike[str]"]


class DriverInfo(NamedTuple):
    """`ethtool -i`: the driver's name and version, firmware and PCI address."""

    driver: str
    version: str
    firmware: str
    bus_info: str


class Channels(NamedTuple):
    """`ethtool -l`: queue (channel) counts in use and the driver's maximums (0 = not applicable)."""

    combined: int
    max_combined: int
    rx: int = 0
    tx: int = 0
    other: int = 0
    max_rx: int = 0
    max_tx: int = 0
    max_other: int = 0


class Rings(NamedTuple):
    """`ethtool -g`: descriptor ring sizes in use and their maximums."""

    rx: int
    rx_max: int
    tx: int
    tx_max: int


class EthtoolReader(Protocol):
    def stats(self, ifname: str) -> dict[str, int]:
        """Every `ethtool -S` statistic; NotSupported when the device has none, NoSuchInterface."""

    def driver(self, ifname: str) -> Optional[DriverInfo]:
        """`ethtool -i`, or None when the device does not say (or does not exist)."""

    def channels(self, ifname: str) -> Optional[Channels]:
        """`ethtool -l`, or None when the driver has no channel settings."""

    def rings(self, ifname: str) -> Optional[Rings]:
        """`ethtool -g`, or None when the driver has no ring settings."""


# -- parsers for captured `ethtool` text (fixtures) ----------------------------------------------

def _lines(text: str) -> list[str]:
    """Lines without fixture comments ('# ...' headers saying where a capture came from)."""
    return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def parse_ethtool_S(text: str) -> dict[str, int]:
    """`ethtool -S DEV` text -> {stat: value}. Raises NotSupported on "no stats available"."""
    out: dict[str, int] = {}
    for line in _lines(text):
        s = line.strip()
        if "no stats available" in s:
            raise NotSupported(s)
        if s.endswith(":") or s.startswith("NIC statistics"):
            continue  # "NIC statistics:" and per-queue group headers of some ethtool versions
        name, sep, value = s.rpartition(":")
        value = value.strip()
        if not sep or not name.strip():
            continue
        # ethtool prints every statistic as %llu (at most 20 digits): anything else is not a statistic,
        # be it driver-specific text or what int() would also take ("-1", "1_000", non-ASCII digits).
        if not (value.isascii() and value.isdigit()) or len(value) > 20:
            continue
        out[name.strip()] = int(value)
    return out


def _kv(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in _lines(text):
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def parse_ethtool_i(text: str) -> DriverInfo:
    """`ethtool -i DEV` text -> DriverInfo."""
    kv = _kv(text)
    if "driver" not in kv:
        raise ValueError("no 'driver:' line in ethtool -i output")
    return DriverInfo(kv["driver"], kv.get("version", ""), kv.get("firmware-version", ""),
                      kv.get("bus-info", ""))


def _num(value: str) -> int:
    # "n/a" (newer ethtool) and 0 mean the same; isdigit() alone is also true for "²", which int() refuses.
    # Sizes are u32s (at most 10 digits); a longer run of digits would also make int() raise ValueError.
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 10 else 0


def _two_sections(text: str, header: str) -> tuple[dict[str, str], dict[str, str]]:
    """Split `ethtool -l/-g` text into its "Pre-set maximums" and "Current hardware settings"."""
    maxima: dict[str, str] = {}
    current: dict[str, str] = {}
    target: Optional[dict[str, str]] = None
    found = False
    for line in _lines(text):
        s = line.strip()
        low = s.lower()
        if low.startswith(header):
            continue
        if low.startswith("pre-set maximums"):
            target, found = maxima, True
            continue
        if low.startswith("current hardware settings"):
            target, found = current, True
            continue
        key, sep, value = s.partition(":")
        if sep and target is not None:
            target[key.strip().lower()] = value.strip()
    if not found:  # a section without lines (every size unknown) is still ethtool's answer
        raise ValueError(f"no '{header}' sections found")
    return maxima, current


def parse_ethtool_l(text: str) -> Channels:
    """`ethtool -l DEV` text -> Channels."""
    mx, cur = _two_sections(text, "channel parameters")
    return Channels(combined=_num(cur.get("combined", "0")), max_combined=_num(mx.get("combined", "0")),
                    rx=_num(cur.get("rx", "0")), tx=_num(cur.get("tx", "0")), other=_num(cur.get("other", "0")),
                    max_rx=_num(mx.get("rx", "0")), max_tx=_num(mx.get("tx", "0")),
                    max_other=_num(mx.get("other", "0")))


def parse_ethtool_g(text: str) -> Rings:
    """`ethtool -g DEV` text -> Rings."""
    mx, cur = _two_sections(text, "ring parameters")
    return Rings(rx=_num(cur.get("rx", "0")), rx_max=_num(mx.get("rx", "0")),
                 tx=_num(cur.get("tx", "0")), tx_max=_num(mx.get("tx", "0")))


# -- the real reader: SIOCETHTOOL ----------------------------------------------------------------

def _buffer(data: bytes) -> array.array:
    """A request buffer for SIOCETHTOOL, holding `data` (the command and its fields)."""
    return array.array("B", data)


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


class _StatsCache:
    """One interface's stat names and a reusable GSTATS buffer (names change only with the count)."""

    __slots__ = ("buf", "count", "names")

    def __init__(self, names: tuple[str, ...], buf: array.array) -> None:
        self.names = names
        self.count = len(names)
        self.buf = buf


def _ethtool_socket() -> socket.socket:
    """The AF_INET datagram socket that SIOCETHTOOL requests go through.

    We issue the requests ourselves instead of through pyroute2's IoctlEthtool: pyroute2 0.7.2 (Debian 12)
    has no ETHTOOL_GSTATS, GDRVINFO, GCHANNELS or GRINGPARAM; the GSTATS/GSTRINGS of later releases use
    fixed 256-entry buffers that the kernel overruns on devices with more statistics (an ENA with 8
    queues already has ~330); and this read runs every sample in the resident daemon, where importing
    pyroute2 costs ~23 MB of RSS (it pulls in asyncio and unittest.mock) for a socket."""
    return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


class IoctlEthtoolReader:
    """ethtool statistics and settings through the SIOCETHTOOL ioctl (what `ethtool -S/-i/-l/-g` use).

    The stats read is the hot path (every sample): names are fetched once per interface and kept
    until the device's statistic count changes; each read is then two ioctls (GSSET_INFO for the
    count, GSTATS for the values) into a reused buffer. Thread-safe: one lock around the socket."""

    def __init__(self) -> None:
        self._sock = _ethtool_socket()
        self._lock = threading.Lock()
        self._cache: dict[str, _StatsCache] = {}

    def close(self) -> None:
        self._sock.close()

    # -- plumbing ----------------------------------------------------------------------------------
    def _ioctl(self, ifname: str, buf: array.array) -> None:
        """SIOCETHTOOL with ifr_data pointing at `buf`, which the kernel fills in place.

        An array.array, because it tells its buffer's address (buffer_info) and struct packs into it:
        ctypes would do the same at ~0.6 MiB of the resident process."""
        name = ifname.encode()
        if not name or len(name) >= IFNAMSIZ:
            raise NoSuchInterface(ifname)
        ifr = struct.pack("16sP", name, buf.buffer_info()[0]).ljust(IFREQ_SIZE, b"\0")
        try:
            fcntl.ioctl(self._sock.fileno(), SIOCETHTOOL, ifr)
        except OSError as exc:
            if exc.errno == errno.ENODEV:
                raise NoSuchInterface(ifname) from None
            if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL):
                raise NotSupported(f"interface={ifname}: {os.strerror(exc.errno)}") from None
            raise

    def _stat_count(self, ifname: str) -> int:
        buf = _buffer(_SSET_INFO.pack(ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS, 0))
        self._ioctl(ifname, buf)
        _cmd, _res, mask, count = _SSET_INFO.unpack(buf)
        if not mask & (1 << ETH_SS_STATS) or count == 0:
            raise NotSupported(f"interface={ifname}: no ethtool statistics")
        return int(count)

    def _stat_names(self, ifname: str, count: int) -> tuple[str, ...]:
        cap = 2 * count + HEADROOM
        buf = _buffer(bytes(12 + cap * ETH_GSTRING_LEN))
        struct.pack_into("=III", buf, 0, ETHTOOL_GSTRINGS, ETH_SS_STATS, count)
        self._ioctl(ifname, buf)
        n = min(struct.unpack_from("=I", buf, 8)[0], cap)
        raw = buf.tobytes()
        return tuple(_cstr(raw[12 + i * ETH_GSTRING_LEN: 12 + (i + 1) * ETH_GSTRING_LEN]) for i in range(n))

    # -- the interface ------------------------------------------------------------------------------
    def stats(self, ifname: str) -> dict[str, int]:
        with self._lock:
            for _attempt in range(3):
                count = self._stat_count(ifname)
                cache = self._cache.get(ifname)
                if cache is None or cache.count != count:
                    names = self._stat_names(ifname, count)
                    cache = _StatsCache(names, array.array("Q", bytes(8 * (1 + 2 * len(names) + HEADROOM))))
                    self._cache[ifname] = cache
                buf = cache.buf
                buf[0] = ETHTOOL_GSTATS | (cache.count << 32)   # struct ethtool_stats {u32 cmd; u32 n_stats}
                self._ioctl(ifname, buf)
                n = buf[0] >> 32
                if n == cache.count:
                    return dict(zip(cache.names, buf[1:1 + n]))
                # The count changed between our two ioctls (queues or features changed): names are stale.
                log.debug("interface=%s: ethtool stat count changed %d -> %d; re-reading names",
                          ifname, cache.count, n)
                self._cache.pop(ifname, None)
            raise NotSupported(f"interface={ifname}: statistic count keeps changing")

    def driver(self, ifname: str) -> Optional[DriverInfo]:
        buf = _buffer(bytes(_DRVINFO.size))
        struct.pack_into("=I", buf, 0, ETHTOOL_GDRVINFO)
        try:
            with self._lock:
                self._ioctl(ifname, buf)
        except (NotSupported, NoSuchInterface):
            return None
        f = _DRVINFO.unpack(buf)
        return DriverInfo(_cstr(f[1]), _cstr(f[2]), _cstr(f[3]), _cstr(f[4]))

    def channels(self, ifname: str) -> Optional[Channels]:
        buf = _buffer(_U32X9.pack(ETHTOOL_GCHANNELS, *([0] * 8)))
        try:
            with self._lock:
                self._ioctl(ifname, buf)
        except (NotSupported, NoSuchInterface):
            return None
        _cmd, max_rx, max_tx, max_other, max_comb, rx, tx, other, comb = _U32X9.unpack(buf)
        return Channels(combined=comb, max_combined=max_comb, rx=rx, tx=tx, other=other,
                        max_rx=max_rx, max_tx=max_tx, max_other=max_other)

    def rings(self, ifname: str) -> Optional[Rings]:
        buf = _buffer(_U32X9.pack(ETHTOOL_GRINGPARAM, *([0] * 8)))
        try:
            with self._lock:
                self._ioctl(ifname, buf)
        except (NotSupported, NoSuchInterface):
            return None
        _cmd, rx_max, _mini_max, _jumbo_max, tx_max, rx, _mini, _jumbo, tx = _U32X9.unpack(buf)
        return Rings(rx=rx, rx_max=rx_max, tx=tx, tx_max=tx_max)


# -- the fixture reader ---------------------------------------------------------------------------

class FixtureEthtoolReader:
    """Replays captured `ethtool -S/-i/-l/-g` text: interface -> a directory of S.txt, i.txt, l.txt,
    g.txt. A missing file means "not supported" (node_exporter's EthtoolFixture); an interface not in
    the map does not exist."""

    def __init__(self, dirs: Mapping[str, PathLike]) -> None:
        self.dirs = {name: Path(d) for name, d in dirs.items()}

    def _text(self, ifname: str, what: str) -> Optional[str]:
        if ifname not in self.dirs:
            raise NoSuchInterface(ifname)
        p = self.dirs[ifname] / f"{what}.txt"
        return p.read_text(encoding="utf-8") if p.exists() else None

    def stats(self, ifname: str) -> dict[str, int]:
        text = self._text(ifname, "S")
        if text is None:
            raise NotSupported(f"interface={ifname}: no S.txt in the fixture")
        stats = parse_ethtool_S(text)
        if not stats:
            raise NotSupported(f"interface={ifname}: no statistics")
        return stats

    def driver(self, ifname: str) -> Optional[DriverInfo]:
        try:
            text = self._text(ifname, "i")
        except NoSuchInterface:
            return None
        return parse_ethtool_i(text) if text is not None else None

    def channels(self, ifname: str) -> Optional[Channels]:
        try:
            text = self._text(ifname, "l")
        except NoSuchInterface:
            return None
        return parse_ethtool_l(text) if text is not None else None

    def rings(self, ifname: str) -> Optional[Rings]:
        try:
            text = self._text(ifname, "g")
        except NoSuchInterface:
            return None
        return parse_ethtool_g(text) if text is not None else None
