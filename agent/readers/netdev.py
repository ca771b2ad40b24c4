"""Read and parse the kernel's per-interface counters (/proc/net/dev, sysfs ifindex)."""

from __future__ import annotations

import os
from typing import NamedTuple

# Column order of /proc/net/dev (net/core/net-procfs.c: dev_seq_printf_stats).
RX_FIELDS = ("bytes", "packets", "errs", "drop", "fifo", "frame", "compressed", "multicast")
TX_FIELDS = ("bytes", "packets", "errs", "drop", "fifo", "colls", "carrier", "compressed")


class NetDevCounters(NamedTuple):
    """One interface's cumulative counters as the kernel reports them."""

    rx_bytes: int
    rx_packets: int
    rx_errors: int
    rx_dropped: int
    tx_bytes: int
    tx_packets: int
    tx_errors: int
    tx_dropped: int


COUNTER_NAMES = NetDevCounters._fields


def read_proc_net_dev(procfs: str = "/proc") -> str:
    # Interface names are bytes, not always ASCII (`ip link add 'é' type dummy`): decoded as os.listdir()
    # decodes /sys/class/net, so the names match the ones the rest of the daemon has.
    with open(os.path.join(procfs, "net/dev"), "rb") as f:
        return os.fsdecode(f.read())


def _counter(field: str, name: str) -> int:
    # The kernel prints %llu; int() would also take "-1", "+1", "1_0" and non-ASCII digits.
    if not (field.isascii() and field.isdigit()):
        raise ValueError(f"interface={name}: counter {field[:32]!r} in /proc/net/dev is not an unsigned integer")
    return int(field)


def parse_proc_net_dev(text: str) -> dict[str, NetDevCounters]:
    """Parse /proc/net/dev text into counters per interface name; ValueError on a counter that is not
    an unsigned decimal integer. Lines without a colon or with fewer than 16 fields are skipped."""
    out: dict[str, NetDevCounters] = {}
    # Split and strip on what the kernel writes ("%6s:%8llu ..." lines, net/core/net-procfs.c), not on
    # str.splitlines()/strip()'s wider notion of line breaks and spaces: a name may hold any byte but NUL,
    # '/', ':' and ASCII whitespace (net/core/dev.c dev_valid_name), e.g. \x1c or U+0085.
    for line in text.split("\n")[2:]:
        name, sep, rest = line.partition(":")
        if not sep:
            continue
        v = rest.split()
        if len(v) < 16:
            continue
        name = name.strip(" ")
        out[name] = NetDevCounters(*(_counter(v[i], name) for i in (0, 1, 2, 3, 8, 9, 10, 11)))
    return out


def read_ifindex(name: str, sysfs: str = "/sys") -> int | None:
    """The interface's index, or None when it does not exist (a new index means it was recreated)."""
    try:
        with open(os.path.join(sysfs, "class/net", name, "ifindex"), encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None
