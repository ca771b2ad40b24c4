"""Find the interfaces behind the default routes (netlink via pyroute2)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def default_route_interfaces() -> list[str]:
    """Names of the interfaces that carry an IPv4 or IPv6 default route, in ifindex order."""
    from pyroute2 import IPRoute  # imported late: a few hundred ms, and only needed at start-up

    with IPRoute() as ipr:
        idx = set()
        for family in (2, 10):  # AF_INET, AF_INET6
            for route in ipr.get_routes(family=family, table=254):
                if route.get("dst_len") == 0 and route.get_attr("RTA_DST") is None:
                    oif = route.get_attr("RTA_OIF")
                    if oif:
                        idx.add(oif)
                    for nh in route.get_attr("RTA_MULTIPATH") or []:
                        if nh.get("oif"):
                            idx.add(nh["oif"])
        names = []
        for i in sorted(idx):
            links = ipr.get_links(i)
            if links:
                names.append(links[0].get_attr("IFLA_IFNAME"))
        return names
