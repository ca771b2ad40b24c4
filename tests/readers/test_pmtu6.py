"""Path MTU probes over IPv6: the pure pieces, and real measurements across a router with a 1280-byte hop
(ICMPv6 Packet Too Big, and the PLPMTUD search when the router's Packet Too Big is dropped)."""

from __future__ import annotations

import errno
import socket
import struct
from typing import Any, Callable, Optional

import pytest

from agent.readers import pmtu
from agent.readers.pmtu import (
    IPV4,
    IPV6,
    PathMtu,
    family_of,
    measure_path_mtu,
    next_size,
    parse_extended_err,
    peer_host,
    resolve,
    route_mtu6,
    search_largest,
)
from tests.conftest import require_root_tools
from tests.support.lab import Lab, run_in_ns

# ULA addresses (fd00::/8), used only inside the lab's own namespaces
ROUTER_NEAR, CLIENT = "fd96:1::1", "fd96:1::2"
ROUTER_FAR, SERVER = "fd96:2::1", "fd96:2::2"

# The error-queue entry Linux 6.18 queued on a raw ICMPv6 socket when the lab's router answered a 1500-byte
# probe with Packet Too Big (recvmsg(MSG_ERRQUEUE), level IPPROTO_IPV6, type IPV6_RECVERR): struct
# sock_extended_err {EMSGSIZE, SO_EE_ORIGIN_ICMP6, type 2, code 0, pad, info=1280, data=0} + the router's
# sockaddr_in6.
CAPTURED_PTB = bytes.fromhex("5a0000000302000000050000000000000a00000000000000"
                             "fd96000100000000000000000000000100000000")


def test_parse_extended_err_of_a_packet_too_big() -> None:
    assert parse_extended_err(CAPTURED_PTB) == (errno.EMSGSIZE, 3, 2, 0, 1280, ROUTER_NEAR)


def test_parse_extended_err_of_a_local_error_has_no_offender() -> None:
    # What the kernel queues itself when send() fails with EMSGSIZE: SO_EE_ORIGIN_LOCAL, offender family 0
    ee = struct.pack("=IBBBBII", errno.EMSGSIZE, 1, 0, 0, 0, 1280, 0) + bytes(28)
    assert parse_extended_err(ee) == (errno.EMSGSIZE, 1, 0, 0, 1280, None)


def test_parse_extended_err_truncated_ipv6_offender() -> None:
    ee = struct.pack("=IBBBBII", errno.EMSGSIZE, 3, 2, 0, 0, 1280, 0) + struct.pack("=H", socket.AF_INET6) + bytes(6)
    assert parse_extended_err(ee)[5] is None


@pytest.mark.parametrize("peer, host", [
    ("fd00::5", "fd00::5"),
    ("[fd00::5]:5201", "fd00::5"),
    ("[fd00::5]", "fd00::5"),
    ("2001:db8::1:5201", "2001:db8::1:5201"),   # bare IPv6: the last group is an address group, not a port
    ("10.1.2.3:5201", "10.1.2.3"),
    ("peer.example:5201", "peer.example"),
    ("peer.example", "peer.example"),
])
def test_peer_host(peer: str, host: str) -> None:
    assert peer_host(peer) == host


@pytest.mark.parametrize("peer, address", [
    ("fd00::5", "fd00::5"),
    ("[FD00:0::5]:5201", "fd00::5"),            # normalised, like the kernel prints it
    ("[10.1.2.3]:5201", "10.1.2.3"),
    ("::ffff:10.1.2.3", "10.1.2.3"),            # IPv4-mapped: an IPv4 peer on the wire
])
def test_resolve_literals(peer: str, address: str) -> None:
    assert resolve(peer) == address


def _gai(*addresses: str) -> Callable[..., list[tuple[Any, ...]]]:
    def fake(host: str, *_a: object, **_k: object) -> list[tuple[Any, ...]]:
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_DGRAM, 17, "",
                 (a, 0, 0, 0) if ":" in a else (a, 0)) for a in addresses]
    return fake


@pytest.mark.parametrize("routed, expected", [
    ({"fd96:9::1", "10.1.2.3"}, "fd96:9::1"),   # getaddrinfo's order, as the probe client connects
    ({"10.1.2.3"}, "10.1.2.3"),                 # an AAAA record without an IPv6 route here: IPv4
    (set(), "fd96:9::1"),                       # no route at all: the first, which then reports it
])
def test_resolve_a_name(monkeypatch: pytest.MonkeyPatch, routed: set[str], expected: str) -> None:
    monkeypatch.setattr(pmtu.socket, "getaddrinfo", _gai("fd96:9::1", "10.1.2.3"))
    monkeypatch.setattr(pmtu, "_routed", lambda a: a in routed)
    assert resolve("peer.example:5201") == expected


def test_resolve_a_name_without_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pmtu.socket, "getaddrinfo", _gai())
    with pytest.raises(OSError, match="no IPv4 or IPv6 address"):
        resolve("peer.example")
    assert "cannot resolve" in measure_path_mtu("peer.example").detail


def test_family_of() -> None:
    assert family_of("fd00::5") is IPV6 and family_of("10.1.2.3") is IPV4
    assert (IPV6.header, IPV6.echo_request, IPV6.echo_reply, IPV6.min_mtu) == (40, 128, 129, 1280)


@pytest.mark.parametrize("fam, mtu, reported, expected", [
    (IPV6, 1500, 1280, 1280),     # Packet Too Big with the next hop's MTU
    (IPV6, 1500, 1200, 1280),     # a report below the IPv6 minimum: 1280 is tried first (RFC 8201 section 4)
    (IPV6, 1280, 1200, 1200),     # 1280 itself was too big: go on below it rather than loop
    (IPV6, 1500, 0, 1499),        # no MTU in the report: one byte less
    (IPV6, 1500, 1500, 1499),     # a report that does not lower the size: one byte less
    (IPV4, 9001, 1500, 1500),
    (IPV4, 1500, 1200, 1200),     # IPv4 has no such floor above 68
])
def test_next_size(fam: object, mtu: int, reported: int, expected: int) -> None:
    assert next_size(fam, mtu, reported) == expected  # type: ignore[arg-type]


def _path(mtu: int, budget: int = 64) -> tuple[Callable[[int], Optional[bool]], list[int]]:
    """A path that answers probes up to `mtu` bytes and swallows larger ones; records the sizes tried."""
    sent: list[int] = []

    def answered(size: int) -> Optional[bool]:
        if len(sent) >= budget:
            return None
        sent.append(size)
        return size <= mtu

    return answered, sent


def test_search_finds_1280_below_a_1500_route() -> None:
    answered, sent = _path(1280)
    assert search_largest(answered, 128, 1500, floor=IPV6.min_mtu) == 1280
    assert sent == [1492, 1480, 1460, 1400, 1280, 1281]   # common sizes, then one byte above the hit


@pytest.mark.parametrize("mtu", [1281, 1350, 1399, 1499])
def test_search_bisects_between_common_sizes(mtu: int) -> None:
    answered, sent = _path(mtu)
    assert search_largest(answered, 128, 1500, floor=IPV6.min_mtu) == mtu
    assert len(sent) <= 6 + 8   # candidates, then a bisection of at most 120 bytes


def test_ipv6_search_tries_nothing_below_1280_first() -> None:
    answered, sent = _path(1000)
    assert search_largest(answered, 128, 1500, floor=IPV6.min_mtu) == 1000
    assert 1024 not in sent and 576 not in sent   # only IPv4 goes to those common sizes
    answered4, sent4 = _path(1000)
    assert search_largest(answered4, 128, 1500, floor=IPV4.min_mtu) == 1000 and sent4[:7] == [
        1492, 1480, 1460, 1400, 1280, 1024, 576]


def test_search_stops_when_the_probe_budget_is_spent() -> None:
    answered, sent = _path(1280, budget=3)
    assert search_largest(answered, 128, 1500, floor=IPV6.min_mtu) == 128   # nothing confirmed above lo
    assert sent == [1492, 1480, 1460]


def test_loopback_over_ipv6() -> None:
    """::1 is loopback: UDP probes (no privilege needed) reach it at lo's full MTU."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.connect(("::1", 9))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    res = measure_path_mtu("[::1]:5201", method="udp", timeout=0.5)
    assert (res.address, res.method, res.reachable, res.black_hole) == ("::1", "udp", True, False)
    assert res.path_mtu == res.route_mtu and res.path_mtu is not None and res.path_mtu >= 1280


def router6_lab(lab: Lab, drop_ptb: bool = False) -> tuple[str, str, str]:
    """client --(1500)-- router --(1280)-- server, IPv6 only. drop_ptb: the router's ICMPv6 Packet Too Big
    is dropped as it leaves (what an ICMP-dropping firewall does). Returns the three namespaces."""
    c, r, s = lab.host("c", ipv6=True), lab.host("r", forwarding=True, ipv6=True), lab.host("s", ipv6=True)
    lab.link(c, r, f"{CLIENT}/64", f"{ROUTER_NEAR}/64", mtu=1500, names=("eth0", "eth0"))
    lab.link(r, s, f"{ROUTER_FAR}/64", f"{SERVER}/64", mtu=1280, names=("eth1", "eth0"))
    lab.run(c, "ip", "-6", "route", "add", "default", "via", ROUTER_NEAR)
    lab.run(s, "ip", "-6", "route", "add", "default", "via", ROUTER_FAR)
    # Port unreachable (the UDP probes' answer) is rate-limited per destination; Packet Too Big is not
    # (net.ipv6.icmp.ratemask leaves type 2 out by default).
    lab.run(s, "sysctl", "-qw", "net.ipv6.icmp.ratelimit=0")
    lab.run(c, "sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647")   # IPv6 ping sockets too
    if drop_ptb:
        lab.run(r, "nft", "add table inet bw; add chain inet bw out { type filter hook output priority 0; }; "
                "add rule inet bw out icmpv6 type packet-too-big drop")
    lab.wait_ipv6(c, r, s)
    return c, r, s


def _measure(ns: str, method: Optional[str], timeout: float = 0.5) -> PathMtu:
    return run_in_ns(ns, lambda: measure_path_mtu(SERVER, method=method, timeout=timeout), timeout=60)


@pytest.mark.netns
@pytest.mark.parametrize("method", ["icmp", "icmp-raw", "udp"])
def test_packet_too_big_across_a_1280_hop(method: str) -> None:
    require_root_tools("ip", "sysctl")
    with Lab() as lab:
        c, _r, _s = router6_lab(lab)
        res = _measure(c, method)
        assert (res.address, res.method, res.route_mtu, res.path_mtu, res.reported_mtu) == (
            SERVER, method, 1500, 1280, 1280)
        assert res.reporters == (ROUTER_NEAR,) and res.reachable and not res.black_hole
        again = _measure(c, method)   # the kernel cached the PMTU: the route says 1280 from the start
        assert (again.route_mtu, again.path_mtu, again.reported_mtu) == (1280, 1280, None)


@pytest.mark.netns
@pytest.mark.parametrize("method", ["icmp-raw", "udp"])
def test_plpmtud_search_when_packet_too_big_is_dropped(method: str) -> None:
    require_root_tools("ip", "nft")
    with Lab() as lab:
        c, _r, _s = router6_lab(lab, drop_ptb=True)
        res = _measure(c, method, timeout=0.3)
        assert res.black_hole and res.reachable and res.reporters == ()
        assert (res.route_mtu, res.path_mtu, res.reported_mtu) == (1500, 1280, None)
        assert 'without ICMPv6 "packet too big"' in res.detail
        assert run_in_ns(c, lambda: route_mtu6(SERVER)) == 1500   # the kernel learnt nothing


@pytest.mark.netns
def test_unreachable_ipv6_peer() -> None:
    require_root_tools("ip")
    with Lab() as lab:
        c, _r, _s = router6_lab(lab)
        res = run_in_ns(c, lambda: measure_path_mtu("fd96:9::9", method="icmp-raw", timeout=0.3))
        assert not res.reachable and res.path_mtu is None and res.address == "fd96:9::9"
