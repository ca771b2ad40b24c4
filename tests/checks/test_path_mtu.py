"""The path_mtu check's verdicts for IPv4 and IPv6 peers, from measured results (no probes sent)."""

from __future__ import annotations

from typing import Optional

import pytest

from agent import config as configmod
from agent.checks import run_checks
from agent.models.checks import Verdict
from agent.readers.links import RouteLookup
from agent.readers.pmtu import PathMtu
from tests.checks.helpers import fixture_context


def _verdict(peer: str, res: PathMtu, route: Optional[RouteLookup], if_mtu: int = 1500) -> Verdict:
    cfg = configmod.parse(f'[probe]\npeers = ["{peer}"]\n[imds]\nenabled = false\n')
    ctx = fixture_context("veth-lab", mtu=if_mtu, cfg=cfg, path_mtu=lambda _p: res,
                          route_to=lambda dst: route if route and dst == route.dst else None)
    (v,) = run_checks(ctx, ["path_mtu"])
    return v


def _res(peer: str, address: str, path: Optional[int], *, route_mtu: int = 1500, reported: Optional[int] = None,
         reporters: tuple[str, ...] = (), black: bool = False, reachable: bool = True,
         method: Optional[str] = "icmp") -> PathMtu:
    return PathMtu(peer, address, method, route_mtu, path, reported, reporters, black, reachable, 0.001, 7, "")


V6, V6_GW = "fd96:2::2", "fe80::1"      # EC2's IPv6 default route goes via the router's link-local address
V4, V4_GW = "10.96.2.2", "10.96.1.1"
ROUTE6 = RouteLookup(V6, "eth0", V6_GW, "fd96:1::2", None)
ROUTE4 = RouteLookup(V4, "eth0", V4_GW, "10.96.1.2", None)


@pytest.mark.parametrize("peer", [V6, f"[{V6}]:5201"])
def test_ipv6_path_below_the_interface_mtu_warns(peer: str) -> None:
    v = _verdict(peer, _res(peer, V6, 1280, reported=1280, reporters=("fd96:1::1",)), ROUTE6)
    assert (v.status, v.interface) == ("warn", peer)
    assert f"path MTU to {peer} is 1280, below eth0's 1500 (routers fd96:1::1 reported 1280)" in v.summary
    assert v.remedy.startswith(f"sudo ip -6 route replace {V6}/128 via {V6_GW} dev eth0 mtu 1280 ")
    assert (v.evidence["address"], v.evidence["path_mtu"], v.evidence["interface_mtu"]) == (V6, 1280, 1500)


def test_ipv6_black_hole_fails_and_says_packet_too_big_is_blocked() -> None:
    v = _verdict(V6, _res(V6, V6, 1280, black=True), ROUTE6)
    assert v.status == "fail" and v.evidence["black_hole"] is True
    assert f"MTU black hole to {V6} via eth0: 1500-byte packets vanish" in v.summary
    assert 'no ICMPv6 "packet too big" comes back (blocked on the path' in v.summary
    lines = v.remedy.splitlines()
    assert lines[0] == f"sudo ip -6 route replace {V6}/128 via {V6_GW} dev eth0 mtu lock 1280"
    assert lines[1].startswith("sudo sysctl -w net.ipv4.tcp_mtu_probing=1")
    assert "allow ICMPv6 Packet Too Big (type 2)" in lines[2] and "network ACLs inbound and outbound" in lines[2]
    assert "type 3 code 4" not in v.remedy


def test_ipv4_black_hole_keeps_its_ipv4_remedy() -> None:
    v = _verdict(V4, _res(V4, V4, 1500, route_mtu=9001, black=True), ROUTE4, if_mtu=9001)
    assert v.status == "fail"
    assert 'no ICMP "fragmentation needed" comes back' in v.summary
    lines = v.remedy.splitlines()
    assert lines[0] == f"sudo ip route replace {V4}/32 via {V4_GW} dev eth0 mtu lock 1500"
    assert "ICMP type 3 code 4" in lines[2] and "ICMPv6" not in v.remedy


def test_ipv6_full_mtu_is_ok() -> None:
    v = _verdict(V6, _res(V6, V6, 1500), ROUTE6)
    assert v.status == "ok" and v.summary == f"path MTU to {V6} is 1500 via eth0, the interface's full MTU"
    assert v.remedy == ""


def test_ipv6_pmtu_cached_by_the_kernel() -> None:
    cached = ROUTE6._replace(mtu=1280)
    v = _verdict(V6, _res(V6, V6, 1280, route_mtu=1280), cached)
    assert v.status == "warn" and "learnt earlier from ICMP and cached by the kernel" in v.summary
    assert v.evidence["cached_pmtu"] == 1280


def test_ipv6_peer_that_does_not_answer_is_skipped_with_the_icmpv6_rule() -> None:
    v = _verdict(V6, _res(V6, V6, None, reachable=False), ROUTE6)
    assert v.status == "skip"
    assert v.remedy.startswith(f"ping -c 3 {V6}   # the peer's security group must allow ICMPv6 echo request")
    v4 = _verdict(V4, _res(V4, V4, None, reachable=False), ROUTE4)
    assert "must allow ICMP echo (or UDP" in v4.remedy


def test_no_probe_socket_is_a_skip() -> None:
    v = _verdict(V6, _res(V6, V6, None, reachable=False, method=None), None)
    assert v.status == "skip" and "ping_group_range" in v.remedy
