"""Find the interfaces behind the default routes, from /proc/net/route and /proc/net/ipv6_route.

procfs rather than netlink here: this runs in the resident daemon, and importing pyroute2 there would
cost ~23 MB of RSS (it imports asyncio and unittest.mock) for one start-up question.
"""

from __future__ import annotations

import os


def read_routes(procfs: str = "/proc") -> tuple[str, str]:
    texts = []
    for name in ("net/route", "net/ipv6_route"):
        try:
            with open(os.path.join(procfs, name), encoding="ascii") as f:
                texts.append(f.read())
        except OSError:
            texts.append("")
    return texts[0], texts[1]


def parse_default_route_interfaces(route_v4: str, route_v6: str) -> list[str]:
    """Interfaces with a default route (destination 0/0, up), IPv4 first, without duplicates."""
    names: list[str] = []
    for line in route_v4.splitlines()[1:]:
        f = line.split()
        # Iface Destination Gateway Flags RefCnt Use Metric Mask ...; RTF_UP = 0x1
        if len(f) >= 8 and f[1] == "00000000" and f[7] == "00000000" and int(f[3], 16) & 0x1:
            names.append(f[0])
    for line in route_v6.splitlines():
        f = line.split()
        # dst dst_len src src_len next_hop metric refcnt use flags iface; ::/0 with a device that is not lo
        if len(f) >= 10 and f[0] == "0" * 32 and f[1] == "00" and f[9] != "lo" and int(f[8], 16) & 0x1:
            names.append(f[9])
    return list(dict.fromkeys(names))


def default_route_interfaces(procfs: str = "/proc") -> list[str]:
    return parse_default_route_interfaces(*read_routes(procfs))
