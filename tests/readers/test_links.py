"""Links and routes over netlink, read inside a namespace the test builds."""

from __future__ import annotations

import socket

import pytest

from agent.readers.links import read_links, read_routes, route_to
from tests.conftest import require_root_tools
from tests.support.lab import Lab, run_in_ns

pytestmark = pytest.mark.netns


def test_links_routes_and_route_lookup() -> None:
    require_root_tools("ip", "ping")
    with Lab() as lab:
        a, r = lab.host("a"), lab.host("r", forwarding=True)
        ia, _ir = lab.link(a, r, "10.94.1.2/24", "10.94.1.1/24", mtu=9001, names=("eth0", "eth1"))
        lab.run(a, "ip", "route", "add", "default", "via", "10.94.1.1", "mtu", "1500")
        lab.run(a, "ip", "route", "add", "10.94.8.0/24", "via", "10.94.1.1", "mtu", "lock", "1400")
        lab.run(a, "ping", "-c", "3", "-i", "0.2", "-W", "2", "10.94.1.1")

        links = run_in_ns(a, read_links)
        assert set(links) == {"lo", ia}
        eth0 = links[ia]
        assert (eth0.mtu, eth0.kind, eth0.operstate) == (9001, "veth", "UP")
        assert eth0.counters.rx_packets >= 3          # the echo replies (and ARP/ND) came in
        assert eth0.ifindex == int(lab.run(a, "cat", f"/sys/class/net/{ia}/ifindex").stdout)
        assert run_in_ns(a, lambda: read_links([ia])).keys() == {ia}

        routes = {(r.family, r.dst): r for r in run_in_ns(a, lambda: read_routes([ia]))}
        default = routes[(4, "default")]
        assert (default.gateway, default.interface, default.mtu, default.mtu_locked) == \
            ("10.94.1.1", ia, 1500, False)
        locked = routes[(4, "10.94.8.0/24")]
        assert (locked.mtu, locked.mtu_locked) == (1400, True)
        assert routes[(4, "10.94.1.0/24")].mtu is None    # the connected route has no MTU of its own
        assert all(r.interface == ia for r in routes.values())

        hop = run_in_ns(a, lambda: route_to("10.94.8.7"))
        assert hop is not None and (hop.interface, hop.gateway, hop.source) == (ia, "10.94.1.1", "10.94.1.2")
        direct = run_in_ns(a, lambda: route_to("10.94.1.1"))
        assert direct is not None and direct.gateway is None
        lab.run(a, "ip", "route", "del", "default")
        assert run_in_ns(a, lambda: route_to("192.168.77.1")) is None   # no route at all


def test_route_families() -> None:
    require_root_tools("ip")
    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        ia, _ = lab.link(a, b, "10.94.2.1/24", "10.94.2.2/24")
        lab.run(a, "ip", "-6", "addr", "add", "fd00:94::1/64", "dev", ia, "nodad")
        fams = {r.family for r in run_in_ns(a, read_routes)}
        assert fams == {4, 6}
        assert socket.AF_INET6 == 10  # the family numbers parse_route maps to 4 and 6
