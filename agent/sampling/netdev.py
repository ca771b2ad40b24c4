"""Sampling step for the monitored interfaces' byte, packet, error and drop counters (the hot path)."""

from __future__ import annotations

from typing import Callable

from agent.readers.netdev import NetDevCounters, NetDevReader, parse_proc_net_dev


class NetdevStep:
    name = "netdev"

    def __init__(self, interfaces: Callable[[], list[str]], procfs: str = "/proc", sysfs: str = "/sys") -> None:
        self._interfaces = interfaces
        self.procfs, self.sysfs = procfs, sysfs
        self.reader = NetDevReader(procfs, sysfs)

    def run(self) -> dict[str, tuple[int | None, NetDevCounters]]:
        """interface -> (ifindex, counters) for the monitored interfaces that exist now.

        One read of /proc/net/dev covers every interface; the ifindex read lets the tracker tell a
        re-created interface (new index, counters from zero) from a wrap."""
        wanted = self._interfaces()
        allc = parse_proc_net_dev(self.reader.read())
        return {n: (self.reader.ifindex(n), allc[n]) for n in wanted if n in allc}
