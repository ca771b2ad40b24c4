"""Read interfaces' MTU and receive counters, and the routes over them (netlink via pyroute2)."""

from __future__ import annotations

import logging
import socket
from typing import Any, Iterable, NamedTuple, Optional

log = logging.getLogger(__name__)

RTAX_MTU = 2  # include/uapi/linux/rtnetlink.h: the route metric that caps the path MTU
MAIN_TABLE = 254


class RxCounters(NamedTuple):
    """Receive-side loss counters (struct rtnl_link_stats64): what rising drops look like."""

    rx_packets: int = 0
    rx_dropped: int = 0        # ENA: packets the device dropped because the RX ring was full
    rx_missed: int = 0
    rx_over: int = 0           # ENA >= 2.8.8: RX overruns (vCPU starvation, ENA best practices)
    rx_fifo: int = 0

    @property
    def lost(self) -> int:
        return self.rx_dropped + self.rx_missed + self.rx_over + self.rx_fifo


class LinkInfo(NamedTuple):
    name: str
    ifindex: int
    mtu: int
    kind: Optional[str]        # IFLA_INFO_KIND for virtual devices (veth, bridge, ...); None for hardware
    operstate: str
    max_mtu: Optional[int]
    counters: RxCounters


class RouteInfo(NamedTuple):
    family: int                # 4 or 6
    dst: str                   # "default" or a CIDR
    gateway: Optional[str]
    interface: Optional[str]
    mtu: Optional[int]         # the route's own MTU metric (`ip route ... mtu N`), None when unset
    mtu_locked: bool           # `mtu lock N`: path MTU discovery may not lower it


class RouteLookup(NamedTuple):
    """`ip route get DST`: where a packet to DST leaves, and any path MTU the kernel has learnt."""

    dst: str
    interface: Optional[str]
    gateway: Optional[str]
    source: Optional[str]
    mtu: Optional[int]


def _metric(msg: Any, name: str) -> Optional[int]:
    metrics = msg.get_attr("RTA_METRICS")
    if metrics is None:
        return None
    value = metrics.get_attr(name)
    return int(value) if value is not None else None


def parse_link(msg: Any) -> LinkInfo:
    """A pyroute2 RTM_NEWLINK message -> LinkInfo."""
    info = msg.get_attr("IFLA_LINKINFO")
    kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
    st = msg.get_attr("IFLA_STATS64") or msg.get_attr("IFLA_STATS")
    if st is not None:
        counters = RxCounters(int(st["rx_packets"]), int(st["rx_dropped"]), int(st["rx_missed_errors"]),
                              int(st["rx_over_errors"]), int(st["rx_fifo_errors"]))
    else:
        counters = RxCounters()
    max_mtu = msg.get_attr("IFLA_MAX_MTU")
    return LinkInfo(name=msg.get_attr("IFLA_IFNAME"), ifindex=int(msg["index"]), mtu=int(msg.get_attr("IFLA_MTU")),
                    kind=kind, operstate=str(msg.get_attr("IFLA_OPERSTATE") or "UNKNOWN"),
                    max_mtu=int(max_mtu) if max_mtu else None, counters=counters)


def parse_route(msg: Any, names: dict[int, str]) -> RouteInfo:
    """A pyroute2 RTM_NEWROUTE message -> RouteInfo (`names`: ifindex -> interface name)."""
    family = 4 if msg["family"] == socket.AF_INET else 6
    dst = msg.get_attr("RTA_DST")
    dst_s = "default" if msg["dst_len"] == 0 and dst is None else f"{dst}/{msg['dst_len']}"
    oif = msg.get_attr("RTA_OIF")
    lock = _metric(msg, "RTAX_LOCK") or 0
    return RouteInfo(family=family, dst=dst_s, gateway=msg.get_attr("RTA_GATEWAY"),
                     interface=names.get(oif) if oif else None, mtu=_metric(msg, "RTAX_MTU"),
                     mtu_locked=bool(lock & (1 << RTAX_MTU)))


def read_links(names: Optional[Iterable[str]] = None) -> dict[str, LinkInfo]:
    """The current network namespace's interfaces (or just `names`), by name."""
    from pyroute2 import IPRoute  # imported late: only checks and discovery need netlink

    wanted = set(names) if names is not None else None
    with IPRoute() as ipr:
        out = {}
        for msg in ipr.get_links():
            link = parse_link(msg)
            if wanted is None or link.name in wanted:
                out[link.name] = link
        return out


def read_routes(interfaces: Optional[Iterable[str]] = None) -> list[RouteInfo]:
    """IPv4 and IPv6 routes of the main table, optionally only those leaving through `interfaces`."""
    from pyroute2 import IPRoute

    wanted = set(interfaces) if interfaces is not None else None
    with IPRoute() as ipr:
        names = {int(m["index"]): m.get_attr("IFLA_IFNAME") for m in ipr.get_links()}
        out = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for msg in ipr.get_routes(family=family, table=MAIN_TABLE):
                r = parse_route(msg, names)
                if wanted is None or r.interface in wanted:
                    out.append(r)
        return out


def route_to(dst: str) -> Optional[RouteLookup]:
    """`ip route get DST` (an IP address), or None when there is no route."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    with IPRoute() as ipr:
        try:
            msgs = ipr.route("get", dst=dst)
        except NetlinkError as exc:
            log.debug("no route to peer=%s: %s", dst, exc)
            return None
        if not msgs:
            return None
        msg = msgs[0]
        oif = msg.get_attr("RTA_OIF")
        name = None
        if oif:
            links = ipr.get_links(oif)
            name = links[0].get_attr("IFLA_IFNAME") if links else None
        return RouteLookup(dst=dst, interface=name, gateway=msg.get_attr("RTA_GATEWAY"),
                           source=msg.get_attr("RTA_PREFSRC"), mtu=_metric(msg, "RTAX_MTU"))
