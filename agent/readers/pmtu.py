"""Measure the path MTU to a peer with DF-set probes, and find MTU black holes (tracepath-style)."""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import struct
import time
from typing import NamedTuple, Optional

log = logging.getLogger(__name__)

# include/uapi/linux/in.h and errqueue.h (not all exported by Python's socket module)
IP_MTU_DISCOVER = 10
IP_PMTUDISC_DO = 2        # set DF, never fragment locally, and honour what PMTU discovery learnt
IP_RECVERR = 11
IP_MTU = 14
SO_EE_ORIGIN_LOCAL = 1
SO_EE_ORIGIN_ICMP = 2
_EE = struct.Struct("=IBBBBII")   # struct sock_extended_err
IPV4_HEADER = 20
PROBE_HEADER = 8                  # ICMP echo header or UDP header: an N-byte probe carries N - 28 bytes
SMALL_PROBE = 128                 # total size of the "is the peer there at all" probe
UDP_PORT = 33434                  # traceroute's first port: nothing listens there, so the peer answers
                                  # with ICMP port unreachable, which is how a UDP probe "arrives"
# Sizes worth trying first when large packets vanish: VPC jumbo (9001), ENA Express (8900), transit
# gateway and inter-region peering (8500), Ethernet/IGW/VPN (1500), PPPoE (1492), common tunnels
# (docs/ec2-network-facts.md, "MTU"); IPv6's minimum 1280 and IPv4's 576 close the list.
CANDIDATES = (9001, 8900, 8500, 1500, 1492, 1480, 1460, 1400, 1280, 1024, 576)
METHODS = ("icmp", "icmp-raw", "udp")


class PathMtu(NamedTuple):
    peer: str
    address: Optional[str]
    method: Optional[str]            # icmp (ping socket), icmp-raw, udp
    route_mtu: Optional[int]         # IP_MTU before probing: the interface's or the route's MTU
    path_mtu: Optional[int]          # largest probe that got an answer (None when nothing answered)
    reported_mtu: Optional[int]      # the MTU routers reported with ICMP "fragmentation needed"
    reporters: tuple[str, ...]       # routers that sent those ICMP messages
    black_hole: bool                 # probes above path_mtu vanished with no ICMP error
    reachable: bool
    rtt: Optional[float]             # seconds, from the small probe
    probes: int
    detail: str


class _Outcome(NamedTuple):
    kind: str                        # reply | too_big | unreachable | timeout
    mtu: Optional[int] = None
    origin: Optional[str] = None
    errno: int = 0


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def parse_extended_err(data: bytes) -> tuple[int, int, int, int, int, Optional[str]]:
    """struct sock_extended_err (+ offender sockaddr_in) -> (errno, origin, type, code, info, offender)."""
    ee_errno, origin, ee_type, code, _pad, info, _data = _EE.unpack_from(data)
    offender = None
    if len(data) >= _EE.size + 8:
        family = struct.unpack_from("=H", data, _EE.size)[0]
        if family == socket.AF_INET:
            offender = socket.inet_ntoa(data[_EE.size + 4:_EE.size + 8])
    return ee_errno, origin, ee_type, code, info, offender


class _Probe:
    """One connected DF socket to the peer: ICMP echo (ping or raw socket) or UDP to a closed port."""

    def __init__(self, address: str, method: str, port: int = UDP_PORT) -> None:
        self.method = method
        self.seq = 0
        self.ident = os.getpid() & 0xFFFF
        if method == "icmp":
            # Unprivileged ICMP echo ("ping sockets"): allowed when net.ipv4.ping_group_range covers our
            # group (systemd sets 0..2147483647 on Debian and Amazon Linux 2023).
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
        elif method == "icmp-raw":
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)  # CAP_NET_RAW
        elif method == "udp":
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        else:
            raise ValueError(f"unknown probe method {method!r}")
        try:
            self.sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
            self.sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
            self.sock.connect((address, port if method == "udp" else 0))
        except OSError:
            self.sock.close()
            raise

    def close(self) -> None:
        self.sock.close()

    def ip_mtu(self) -> int:
        return int(self.sock.getsockopt(socket.IPPROTO_IP, IP_MTU))

    def _packet(self, size: int) -> bytes:
        payload = b"\xa5" * max(0, size - IPV4_HEADER - PROBE_HEADER)
        if self.method == "udp":
            return payload
        self.seq = (self.seq + 1) & 0xFFFF
        header = struct.pack("!BBHHH", 8, 0, 0, self.ident, self.seq)
        if self.method == "icmp-raw":
            header = struct.pack("!BBHHH", 8, 0, _checksum(header + payload), self.ident, self.seq)
        return header + payload  # ping sockets fill in the identifier and checksum themselves

    def _is_reply(self, data: bytes) -> bool:
        if self.method == "icmp-raw":
            if len(data) < IPV4_HEADER + 8:
                return False
            data = data[(data[0] & 0x0F) * 4:]
            ident = struct.unpack_from("!H", data, 4)[0]
            if ident != self.ident:
                return False
        elif len(data) < 8:
            return False
        icmp_type, _code, _sum, _ident, seq = struct.unpack_from("!BBHHH", data)
        return icmp_type == 0 and seq == self.seq

    def _error(self) -> Optional[_Outcome]:
        """One entry of the socket's error queue (IP_RECVERR), as an outcome."""
        try:
            _data, anc, _flags, _addr = self.sock.recvmsg(65536, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        for level, ctype, cdata in anc:
            if level != socket.IPPROTO_IP or ctype != IP_RECVERR:
                continue
            ee_errno, origin, _ee_type, _code, info, offender = parse_extended_err(cdata)
            if ee_errno == errno.EMSGSIZE:
                return _Outcome("too_big", mtu=info or self.ip_mtu(), origin=offender, errno=ee_errno)
            if ee_errno == errno.ECONNREFUSED and self.method == "udp":
                return _Outcome("reply", origin=offender)   # port unreachable: the probe reached the peer
            if origin in (SO_EE_ORIGIN_ICMP, SO_EE_ORIGIN_LOCAL):
                return _Outcome("unreachable", origin=offender, errno=ee_errno)
        return None

    def send(self, size: int, timeout: float) -> _Outcome:
        """Send one DF probe of `size` bytes (IP header included) and wait for its fate."""
        while self._error() is not None:
            pass  # stale errors from earlier probes
        try:
            self.sock.send(self._packet(size))
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:
                while self._error() is not None:
                    pass
                return _Outcome("too_big", mtu=self.ip_mtu(), errno=exc.errno)
            if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNREFUSED, errno.EACCES,
                             errno.EPERM):
                return _Outcome("unreachable", errno=exc.errno)
            raise
        deadline = time.monotonic() + timeout
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | select.POLLERR)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return _Outcome("timeout")
            events = poller.poll(left * 1000)
            for _fd, ev in events:
                if ev & select.POLLERR:
                    out = self._error()
                    if out is not None:
                        return out
                if ev & select.POLLIN:
                    try:
                        data = self.sock.recv(65536, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        continue
                    except OSError as exc:  # a pending ICMP error reported through recv
                        out = self._error()
                        if out is not None:
                            return out
                        if exc.errno == errno.ECONNREFUSED and self.method == "udp":
                            return _Outcome("reply")
                        return _Outcome("unreachable", errno=exc.errno or 0)
                    if self.method != "udp" and self._is_reply(data):
                        return _Outcome("reply")


def open_probe(address: str, method: Optional[str] = None, port: int = UDP_PORT) -> _Probe:
    """The first probe socket this process may open: ping socket, raw ICMP, then UDP."""
    errors = []
    for m in ([method] if method else METHODS):
        try:
            return _Probe(address, m, port)
        except PermissionError as exc:
            errors.append(f"{m}: {exc.strerror}")
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EPROTONOSUPPORT):
                raise
            errors.append(f"{m}: {exc.strerror}")
    raise PermissionError("no probe socket allowed (" + "; ".join(errors) + ")")


def resolve_ipv4(peer: str) -> str:
    """'10.0.1.23', '10.0.1.23:5201' or 'host.example:5201' -> an IPv4 address (raises OSError)."""
    host = peer
    if peer.count(":") == 1:
        host = peer.rsplit(":", 1)[0]
    host = host.strip("[]")
    infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_DGRAM)
    return str(infos[0][4][0])


def measure_path_mtu(peer: str, *, timeout: float = 1.0, tries: int = 2, method: Optional[str] = None,
                     max_probes: int = 64) -> PathMtu:
    """Path MTU to `peer` the way tracepath finds it, plus a black-hole search.

    1. A small probe: is the peer there, and how far (RTT sets the wait for the rest)?
    2. DF probes at the route's MTU; each ICMP "fragmentation needed" lowers it (Linux also lowers the
       route's cached PMTU, which IP_MTU then reports) until a probe is answered.
    3. If probes at that size vanish with no ICMP while small ones are answered, the path is an MTU
       black hole: find the largest size that still gets through (common MTUs first, then bisect)."""
    try:
        address = resolve_ipv4(peer)
    except OSError as exc:
        host = peer.rsplit("]", 1)[0].lstrip("[") if peer.startswith("[") else peer
        if host.count(":") > 1:
            return PathMtu(peer, None, None, None, None, None, (), False, False, None, 0,
                           "IPv6 peer: path MTU is only measured over IPv4 for now")
        return PathMtu(peer, None, None, None, None, None, (), False, False, None, 0, f"cannot resolve: {exc}")
    try:
        probe = open_probe(address, method)
    except OSError as exc:
        return PathMtu(peer, address, None, None, None, None, (), False, False, None, 0, str(exc))
    count = 0
    try:
        route_mtu = probe.ip_mtu()

        def send(size: int, wait: float, attempts: int) -> _Outcome:
            nonlocal count
            out = _Outcome("timeout")
            for _ in range(attempts):
                count += 1
                out = probe.send(size, wait)
                if out.kind != "timeout":
                    return out
            return out

        def result(path: Optional[int], reported: Optional[int], reporters: list[str], black: bool,
                   reachable: bool, rtt: Optional[float], detail: str) -> PathMtu:
            return PathMtu(peer, address, probe.method, route_mtu, path, reported, tuple(reporters), black,
                           reachable, rtt, count, detail)

        t0 = time.monotonic()
        first = send(SMALL_PROBE, timeout, tries + 1)
        rtt = time.monotonic() - t0 if first.kind == "reply" else None
        if first.kind == "unreachable":
            return result(None, None, [], False, False, None,
                          f"unreachable ({os.strerror(first.errno) if first.errno else 'ICMP'})")
        if first.kind != "reply":
            return result(None, None, [], False, False, None,
                          f"no answer to {SMALL_PROBE}-byte {probe.method} probes within {timeout:g}s")
        # Silence is judged against the peer's own RTT, with a floor for scheduling noise.
        wait = min(timeout, max(0.25, 4 * (rtt or 0)))
        mtu = route_mtu
        reported: Optional[int] = None
        reporters: list[str] = []
        while count < max_probes:
            out = send(mtu, wait, tries)
            if out.kind == "reply":
                return result(mtu, reported, reporters, False, True, rtt,
                              f"{mtu} bytes reach the peer" + (f" (routers reported {reported})" if reported else ""))
            if out.kind == "too_big":
                new = out.mtu if out.mtu and out.mtu < mtu else mtu - 1
                if out.origin:
                    reported = new
                    if out.origin not in reporters:
                        reporters.append(out.origin)
                mtu = new
                continue
            if out.kind == "unreachable":
                return result(None, reported, reporters, False, False, rtt,
                              f"unreachable at {mtu} bytes ({os.strerror(out.errno) if out.errno else 'ICMP'})")
            break  # silence at `mtu`
        # Black hole: small probes are answered, `mtu`-byte ones vanish without an ICMP error.
        lo, hi = SMALL_PROBE, mtu
        for cand in CANDIDATES:
            if not lo < cand < hi or count >= max_probes:
                continue
            out = send(cand, wait, tries)
            if out.kind == "reply":
                lo = cand
                break
            hi = cand
        if lo + 1 < hi and count < max_probes:
            out = send(lo + 1, wait, tries)
            if out.kind == "reply":
                lo += 1
                while lo + 1 < hi and count < max_probes:
                    mid = (lo + hi) // 2
                    if send(mid, wait, tries).kind == "reply":
                        lo = mid
                    else:
                        hi = mid
            else:
                hi = lo + 1
        return result(lo, reported, reporters, True, True, rtt,
                      f"{mtu}-byte probes vanish without ICMP \"fragmentation needed\"; {lo} bytes get through")
    finally:
        probe.close()
