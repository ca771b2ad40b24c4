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
    with open(os.path.join(procfs, "net/dev"), encoding="ascii") as f:
        return f.read()


def parse_proc_net_dev(text: str) -> dict[str, NetDevCounters]:
    """Parse /proc/net/dev text into counters per interface name."""
    out: dict[str, NetDevCounters] = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        if not sep:
            continue
        v = rest.split()
        if len(v) < 16:
            continue
        out[name.strip()] = NetDevCounters(int(v[0]), int(v[1]), int(v[2]), int(v[3]),
                                           int(v[8]), int(v[9]), int(v[10]), int(v[11]))
    return out


def read_ifindex(name: str, sysfs: str = "/sys") -> int | None:
    """The interface's index, or None when it does not exist (a new index means it was recreated)."""
    try:
        with open(os.path.join(sysfs, "class/net", name, "ifindex"), encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None
