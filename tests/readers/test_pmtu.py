"""Path MTU probes: the pure pieces, and real measurements across a router with a 1500-byte hop."""

from __future__ import annotations

import errno
import socket
import struct
from typing import Optional

import pytest

from agent.readers.pmtu import PathMtu, _checksum, measure_path_mtu, parse_extended_err, resolve
from tests.conftest import require_root_tools
from tests.support.lab import Lab, run_in_ns


def test_parse_extended_err() -> None:
    # struct sock_extended_err {EMSGSIZE, SO_EE_ORIGIN_ICMP, type 3, code 4, pad, info=1500, data}
    ee = struct.pack("=IBBBBII", errno.EMSGSIZE, 2, 3, 4, 0, 1500, 0)
    offender = struct.pack("=HH4s8x", socket.AF_INET, 0, socket.inet_aton("10.9.1.1"))
    assert parse_extended_err(ee + offender) == (errno.EMSGSIZE, 2, 3, 4, 1500, "10.9.1.1")
    assert parse_extended_err(ee)[5] is None


def test_checksum_of_an_echo_request() -> None:
    header = struct.pack("!BBHHH", 8, 0, 0, 0x1234, 1)
    packet = struct.pack("!BBHHH", 8, 0, _checksum(header + b"abc"), 0x1234, 1) + b"abc"
    assert _checksum(packet) == 0   # a correct checksum sums to zero


@pytest.mark.parametrize("peer", ["10.1.2.3", "10.1.2.3:5201", "[10.1.2.3]:5201", "localhost:5201"])
def test_resolve_ipv4(peer: str) -> None:
    assert resolve(peer) in ("10.1.2.3", "127.0.0.1", "::1")   # localhost may come first as ::1


def test_unresolvable_peer_is_a_result_not_an_exception() -> None:
    res = measure_path_mtu("no-such-host.invalid")
    assert not res.reachable and res.address is None and "resolve" in res.detail


def _router_lab(lab: Lab, hop: str = "icmp", icmp_to_peer: bool = True) -> tuple[str, str]:
    """a --(9001)-- r --(1500)-- b. hop: "icmp" (r says fragmentation needed), "nft" (r's ICMP is dropped),
    "l2" (r's side of the second link is 9001 too, b's is 1500: b's device drops big frames silently)."""
    a, r, b = lab.host("a"), lab.host("r", forwarding=True), lab.host("b")
    lab.link(a, r, "10.95.1.2/24", "10.95.1.1/24", mtu=9001)
    ir, ib = lab.link(r, b, "10.95.2.1/24", "10.95.2.2/24", mtu=9001 if hop == "l2" else 1500)
    if hop == "l2":
        lab.run(b, "ip", "link", "set", ib, "mtu", "1500")
    lab.run(a, "ip", "route", "add", "10.95.2.0/24", "via", "10.95.1.1")
    lab.run(b, "ip", "route", "add", "10.95.1.0/24", "via", "10.95.2.1")
    if hop == "nft":
        lab.run(r, "nft", "add table inet bw; add chain inet bw out { type filter hook output priority 0; }; "
                "add rule inet bw out icmp type destination-unreachable icmp code frag-needed drop")
    if not icmp_to_peer:
        lab.run(b, "nft", "add table inet bw; add chain inet bw in { type filter hook input priority 0; }; "
                "add rule inet bw in meta l4proto { icmp, udp } drop")
    # Port-unreachable answers to UDP probes are rate-limited per source (icmp_ratelimit, 1/s after a
    # burst of 6); the UDP method tolerates it only slowly, so the lab lets b answer every probe.
    lab.run(b, "sysctl", "-qw", "net.ipv4.icmp_ratelimit=0")
    return a, b


def _measure(a: str, method: str, timeout: float = 0.5) -> PathMtu:
    return run_in_ns(a, lambda: measure_path_mtu("10.95.2.2", method=method, timeout=timeout), timeout=60)


@pytest.mark.netns
@pytest.mark.parametrize("method", ["icmp", "icmp-raw", "udp"])
def test_pmtud_across_a_1500_hop(method: str) -> None:
    require_root_tools("ip", "sysctl")
    with Lab() as lab:
        a, _b = _router_lab(lab)
        if method == "icmp":   # ping sockets: allowed only for groups in ping_group_range (systemd sets all)
            lab.run(a, "sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647")
        res = _measure(a, method)
        assert (res.method, res.route_mtu, res.path_mtu, res.reported_mtu) == (method, 9001, 1500, 1500)
        assert res.reporters == ("10.95.1.1",) and res.reachable and not res.black_hole
        again = _measure(a, method)   # the kernel cached the PMTU: IP_MTU says 1500 from the start
        assert (again.route_mtu, again.path_mtu, again.reported_mtu) == (1500, 1500, None)


@pytest.mark.netns
def test_ping_socket_refused_falls_back_to_raw() -> None:
    require_root_tools("ip", "sysctl")
    with Lab() as lab:
        a, _b = _router_lab(lab)
        lab.run(a, "sysctl", "-qw", "net.ipv4.ping_group_range=1 0")   # the kernel default: nobody
        res = run_in_ns(a, lambda: measure_path_mtu("10.95.2.2", timeout=0.5))
        assert res.method == "icmp-raw" and res.path_mtu == 1500


@pytest.mark.netns
@pytest.mark.parametrize("method", ["icmp-raw", "udp"])
def test_black_hole_when_the_router_drops_frag_needed(method: str) -> None:
    require_root_tools("ip", "nft")
    with Lab() as lab:
        a, _b = _router_lab(lab, hop="nft")
        res = _measure(a, method, timeout=0.3)
        assert res.black_hole and res.reachable
        assert (res.route_mtu, res.path_mtu, res.reported_mtu) == (9001, 1500, None)


@pytest.mark.netns
def test_black_hole_from_an_l2_mtu_mismatch() -> None:
    """No router involved: the last link's receiver has MTU 1500 and drops larger frames silently.
    veth accepts MTU + 14 (Ethernet header) + 4 (VLAN tag) bytes on receive, so the effective path MTU
    is found by bisection at 1500..1504, which is what the kernel really lets through."""
    require_root_tools("ip")
    with Lab() as lab:
        a, _b = _router_lab(lab, hop="l2")
        res = _measure(a, "icmp-raw", timeout=0.2)
        assert res.black_hole and res.route_mtu == 9001
        assert 1500 <= res.path_mtu <= 1504


@pytest.mark.netns
def test_silent_and_unreachable_peers() -> None:
    require_root_tools("ip", "nft")
    with Lab() as lab:
        a, _b = _router_lab(lab, icmp_to_peer=False)
        silent = _measure(a, "icmp-raw", timeout=0.3)
        assert not silent.reachable and silent.path_mtu is None and "no answer" in silent.detail
        nowhere: Optional[PathMtu] = run_in_ns(a, lambda: measure_path_mtu("192.168.250.9", timeout=0.3))
        assert nowhere is not None and not nowhere.reachable and "unreachable" in nowhere.detail
