"""Measure the path MTU to an IPv4 or IPv6 peer with DF-set probes, and find MTU black holes (tracepath-style)."""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import select
import socket
import struct
import time
from typing import Callable, NamedTuple, Optional

log = logging.getLogger(__name__)

# include/uapi/linux/in.h, in6.h and errqueue.h (not all exported by Python's socket module)
IP_MTU_DISCOVER = 10
IP_PMTUDISC_DO = 2        # set DF, never fragment locally, and honour what PMTU discovery learnt
IP_RECVERR = 11
IP_MTU = 14
IPV6_MTU_DISCOVER = 23
IPV6_PMTUDISC_DO = 2      # the same for IPv6 (routers never fragment IPv6; this stops the sender doing it).
                          # Not IPV6_PMTUDISC_PROBE, which ignores the learnt PMTU: the probes must see it.
IPV6_MTU = 24
IPV6_RECVERR = 25
SO_EE_ORIGIN_LOCAL = 1
SO_EE_ORIGIN_ICMP = 2
SO_EE_ORIGIN_ICMP6 = 3
_EE = struct.Struct("=IBBBBII")   # struct sock_extended_err
IPV4_HEADER = 20
IPV6_HEADER = 40                  # fixed header; the probes carry no extension headers
PROBE_HEADER = 8                  # ICMP(v6) echo header or UDP header: an N-byte IPv4 probe carries N - 28
                                  # bytes of payload, an IPv6 one N - 48
IPV4_MIN_MTU = 68                 # RFC 791: every IPv4 link carries 68-byte datagrams
IPV6_MIN_MTU = 1280               # RFC 8200 section 5: every IPv6 link carries 1280 bytes, and RFC 8201
                                  # section 4: a node never lowers its PMTU estimate below that
                                  # (docs/ec2-network-facts.md, "MTU over IPv6")
SMALL_PROBE = 128                 # total size of the "is the peer there at all" probe
UDP_PORT = 33434                  # traceroute's first port: nothing listens there, so the peer answers
                                  # with ICMP port unreachable, which is how a UDP probe "arrives"
# Sizes worth trying first when large packets vanish: VPC jumbo (9001), ENA Express (8900), transit
# gateway and inter-region peering (8500), Ethernet/IGW/VPN (1500), PPPoE (1492), common tunnels
# (docs/ec2-network-facts.md, "MTU"); IPv6's minimum 1280 and IPv4's 576 close the list. An IPv6 search
# tries none below 1280 (RFC 8899's BASE_PLPMTU for IPv6: the size every path must carry).
CANDIDATES = (9001, 8900, 8500, 1500, 1492, 1480, 1460, 1400, 1280, 1024, 576)
METHODS = ("icmp", "icmp-raw", "udp")


class _Family(NamedTuple):
    """What differs between probing over IPv4 and over IPv6."""

    af: int
    level: int                       # socket option level: IPPROTO_IP / IPPROTO_IPV6
    mtu_discover: int
    pmtudisc_do: int
    recverr: int
    header: int                      # IP header bytes in a probe
    icmp: int                        # protocol of ping and raw sockets
    echo_request: int
    echo_reply: int
    min_mtu: int
    too_big: str                     # what a router sends back for a packet larger than its next hop


IPV4 = _Family(af=socket.AF_INET, level=socket.IPPROTO_IP, mtu_discover=IP_MTU_DISCOVER, pmtudisc_do=IP_PMTUDISC_DO,
               recverr=IP_RECVERR, header=IPV4_HEADER, icmp=socket.IPPROTO_ICMP, echo_request=8, echo_reply=0,
               min_mtu=IPV4_MIN_MTU, too_big='ICMP "fragmentation needed"')
# ICMPv6 echo request 128 / reply 129 and Packet Too Big (type 2): RFC 4443 sections 4.1, 4.2 and 3.2
IPV6 = _Family(af=socket.AF_INET6, level=socket.IPPROTO_IPV6, mtu_discover=IPV6_MTU_DISCOVER,
               pmtudisc_do=IPV6_PMTUDISC_DO, recverr=IPV6_RECVERR, header=IPV6_HEADER, icmp=socket.IPPROTO_ICMPV6,
               echo_request=128, echo_reply=129, min_mtu=IPV6_MIN_MTU, too_big='ICMPv6 "packet too big"')


def family_of(address: str) -> _Family:
    return IPV6 if ":" in address else IPV4


class PathMtu(NamedTuple):
    peer: str
    address: Optional[str]
    method: Optional[str]            # icmp (ping socket), icmp-raw, udp
    route_mtu: Optional[int]         # IP_MTU before probing: the interface's or the route's MTU
    path_mtu: Optional[int]          # largest probe that got an answer (None when nothing answered)
    reported_mtu: Optional[int]      # the MTU routers reported (ICMP "fragmentation needed" / ICMPv6 "packet too big")
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
    """struct sock_extended_err (+ offender sockaddr_in or sockaddr_in6) -> (errno, origin, type, code, info,
    offender). For an ICMP(v6) error, info is the MTU the router reported."""
    ee_errno, origin, ee_type, code, _pad, info, _data = _EE.unpack_from(data)
    offender = None
    if len(data) >= _EE.size + 8:
        family = struct.unpack_from("=H", data, _EE.size)[0]
        if family == socket.AF_INET:
            offender = socket.inet_ntoa(data[_EE.size + 4:_EE.size + 8])
        elif family == socket.AF_INET6 and len(data) >= _EE.size + 24:   # family, port, flowinfo, address
            offender = socket.inet_ntop(socket.AF_INET6, data[_EE.size + 8:_EE.size + 24])
    return ee_errno, origin, ee_type, code, info, offender


def route_mtu6(address: str) -> int:
    """The path MTU Linux knows towards an IPv6 address now: the route's MTU, or the lower PMTU that an ICMPv6
    Packet Too Big left in the route cache. A fresh connected UDP socket looks the route up (and sends
    nothing): IPV6_MTU on the probe socket itself reads the route it cached at connect(), which ping and raw
    sockets do not refresh after a Packet Too Big (Linux keeps the learnt PMTU in a separate exception route)."""
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
        s.connect((address, UDP_PORT))
        return int(s.getsockopt(socket.IPPROTO_IPV6, IPV6_MTU))


class _Probe:
    """One connected DF socket to the peer: ICMP(v6) echo (ping or raw socket) or UDP to a closed port."""

    def __init__(self, address: str, method: str, port: int = UDP_PORT) -> None:
        self.method = method
        self.address = address
        self.fam = fam = family_of(address)
        self.seq = 0
        self.ident = os.getpid() & 0xFFFF
        if method == "icmp":
            # Unprivileged ICMP echo ("ping sockets", IPv4 and IPv6 alike): allowed when
            # net.ipv4.ping_group_range covers our group (systemd sets 0..2147483647 on Debian and Amazon
            # Linux 2023).
            self.sock = socket.socket(fam.af, socket.SOCK_DGRAM, fam.icmp)
        elif method == "icmp-raw":
            self.sock = socket.socket(fam.af, socket.SOCK_RAW, fam.icmp)  # CAP_NET_RAW
        elif method == "udp":
            self.sock = socket.socket(fam.af, socket.SOCK_DGRAM)
        else:
            raise ValueError(f"unknown probe method {method!r}")
        try:
            self.sock.setsockopt(fam.level, fam.mtu_discover, fam.pmtudisc_do)
            self.sock.setsockopt(fam.level, fam.recverr, 1)
            self.sock.connect((address, port if method == "udp" else 0))
        except OSError:
            self.sock.close()
            raise

    def close(self) -> None:
        self.sock.close()

    def ip_mtu(self) -> int:
        if self.fam is IPV6:
            return route_mtu6(self.address)
        return int(self.sock.getsockopt(socket.IPPROTO_IP, IP_MTU))

    def _packet(self, size: int) -> bytes:
        payload = b"\xa5" * max(0, size - self.fam.header - PROBE_HEADER)
        if self.method == "udp":
            return payload
        self.seq = (self.seq + 1) & 0xFFFF
        kind = self.fam.echo_request
        header = struct.pack("!BBHHH", kind, 0, 0, self.ident, self.seq)
        if self.method == "icmp-raw" and self.fam is IPV4:
            header = struct.pack("!BBHHH", kind, 0, _checksum(header + payload), self.ident, self.seq)
        # Ping sockets fill in the identifier and checksum themselves; for raw ICMPv6 sockets the kernel
        # computes the checksum, which covers a pseudo-header we do not build (RFC 3542 section 3.1).
        return header + payload

    def _is_reply(self, data: bytes) -> bool:
        if self.method == "icmp-raw" and self.fam is IPV4:   # raw IPv4 sockets see the IP header too
            if len(data) < IPV4_HEADER + 8:
                return False
            data = data[(data[0] & 0x0F) * 4:]
        if len(data) < 8:
            return False
        icmp_type, _code, _sum, ident, seq = struct.unpack_from("!BBHHH", data)
        if self.method == "icmp-raw" and ident != self.ident:
            return False   # another process's echo (a raw socket sees every reply from the peer)
        return icmp_type == self.fam.echo_reply and seq == self.seq

    def _error(self) -> Optional[_Outcome]:
        """One entry of the socket's error queue (IP_RECVERR / IPV6_RECVERR), as an outcome."""
        try:
            _data, anc, _flags, _addr = self.sock.recvmsg(65536, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        for level, ctype, cdata in anc:
            if level != self.fam.level or ctype != self.fam.recverr:
                continue
            ee_errno, origin, _ee_type, _code, info, offender = parse_extended_err(cdata)
            if ee_errno == errno.EMSGSIZE:
                return _Outcome("too_big", mtu=info or self.ip_mtu(), origin=offender, errno=ee_errno)
            if ee_errno == errno.ECONNREFUSED and self.method == "udp":
                return _Outcome("reply", origin=offender)   # port unreachable: the probe reached the peer
            if origin in (SO_EE_ORIGIN_ICMP, SO_EE_ORIGIN_ICMP6, SO_EE_ORIGIN_LOCAL):
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
            for _fd, ev in poller.poll(left * 1000):
                out = self._event(ev)
                if out is not None:
                    return out

    def _event(self, ev: int) -> Optional[_Outcome]:
        """What one poll event says of the probe in flight: an outcome, or None to keep waiting."""
        if ev & select.POLLERR:
            out = self._error()
            if out is not None:
                return out
        if not ev & select.POLLIN:
            return None
        try:
            data = self.sock.recv(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        except OSError as exc:  # a pending ICMP error reported through recv
            out = self._error()
            if out is not None:
                return out
            if exc.errno == errno.ECONNREFUSED and self.method == "udp":
                return _Outcome("reply")
            return _Outcome("unreachable", errno=exc.errno or 0)
        if self.method != "udp" and self._is_reply(data):
            return _Outcome("reply")
        return None


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


def peer_host(peer: str) -> str:
    """The host part of a `[probe] peers` entry: '10.0.1.23', '10.0.1.23:5201', 'host.example:5201',
    'fd00::5' or '[fd00::5]:5201' (the forms config.check_peers accepts)."""
    peer = peer.strip()
    if peer.startswith("["):
        return peer[1:].partition("]")[0]
    if peer.count(":") == 1:
        return peer.partition(":")[0]
    return peer   # a name, an IPv4 address or a bare IPv6 address


def _routed(address: str) -> bool:
    """Is there a route to `address`? (connecting a UDP socket looks it up and sends nothing)"""
    try:
        with socket.socket(family_of(address).af, socket.SOCK_DGRAM) as s:
            s.connect((address, UDP_PORT))
    except OSError:
        return False
    return True


def resolve(peer: str) -> str:
    """A peer entry -> the IPv4 or IPv6 address to probe (raises OSError). An address is taken as it is; a
    name's addresses are taken in getaddrinfo's order, which is the order the probe client tries them in,
    and the first one with a route wins (a name with an AAAA record on a host without IPv6 routes is
    measured over IPv4)."""
    host = peer_host(peer)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:   # an IPv4-mapped IPv6 address (::ffff:10.0.1.23) is an IPv4 peer on the wire
        return str(getattr(ip, "ipv4_mapped", None) or ip)
    infos = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_DGRAM)
    addresses = [str(info[4][0]) for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)]
    if not addresses:
        raise OSError(errno.EADDRNOTAVAIL, f"{host} has no IPv4 or IPv6 address")
    return next((a for a in addresses if _routed(a)), addresses[0])


def search_largest(answered: Callable[[int], Optional[bool]], lo: int, hi: int, floor: int = 0) -> int:
    """The PLPMTUD search (RFC 8899 section 5.3's idea, with probes that need an answer rather than
    acknowledged data): the largest size in [lo, hi) that gets through, given that `lo` does and `hi`
    does not. Common MTUs (CANDIDATES, none below `floor`) first, then bisection to the byte.
    `answered(size)` sends one probe: True when answered, False when it vanished, None when the probe
    budget is spent (the search stops with what it has)."""
    for cand in CANDIDATES:
        if not lo < cand < hi or cand < floor:
            continue
        ok = answered(cand)
        if ok is None:
            return lo
        if ok:
            lo = cand
            break
        hi = cand
    if lo + 1 < hi and answered(lo + 1):
        lo += 1
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            ok = answered(mid)
            if ok is None:
                break
            if ok:
                lo = mid
            else:
                hi = mid
    return lo


def next_size(fam: _Family, mtu: int, reported: Optional[int]) -> int:
    """The size to try after a `mtu`-byte probe was too big: what the router (or the kernel) reported, else
    one byte less. Over IPv6 never below 1280 while 1280 is untried: a Packet Too Big that reports less
    breaks RFC 8200, and Linux keeps 1280 as the path MTU anyway (RFC 8201 section 4)."""
    new = reported if reported and reported < mtu else mtu - 1
    if new < fam.min_mtu < mtu:
        new = fam.min_mtu
    return new


def measure_path_mtu(peer: str, *, timeout: float = 1.0, tries: int = 2, method: Optional[str] = None,
                     max_probes: int = 64) -> PathMtu:
    """Path MTU to `peer` (IPv4 or IPv6) the way tracepath finds it, plus a black-hole search.

    1. A small probe: is the peer there, and how far (RTT sets the wait for the rest)?
    2. DF probes at the route's MTU; each ICMP "fragmentation needed" (IPv4) or ICMPv6 "packet too big"
       (IPv6) lowers it (Linux also lowers the route's cached PMTU, which IP_MTU / IPV6_MTU then report)
       until a probe is answered.
    3. If probes at that size vanish with no ICMP while small ones are answered, the path is an MTU
       black hole (the router's ICMP is filtered): find the largest size that still gets through, the
       PLPMTUD way (search_largest)."""
    try:
        address = resolve(peer)
    except OSError as exc:
        return PathMtu(peer, None, None, None, None, None, (), False, False, None, 0, f"cannot resolve: {exc}")
    try:
        probe = open_probe(address, method)
    except OSError as exc:
        return PathMtu(peer, address, None, None, None, None, (), False, False, None, 0, str(exc))
    try:
        return _Measurement(peer, address, probe).run(timeout, tries, max_probes)
    finally:
        probe.close()


class _Measurement:
    """One path MTU measurement over an open probe socket: the probes it sent and the result it builds."""

    def __init__(self, peer: str, address: str, probe: _Probe) -> None:
        self.peer, self.address, self.probe = peer, address, probe
        self.fam = family_of(address)
        self.count = 0
        self.route_mtu = probe.ip_mtu()
        self.reported: Optional[int] = None
        self.reporters: list[str] = []

    def send(self, size: int, wait: float, attempts: int) -> _Outcome:
        out = _Outcome("timeout")
        for _ in range(attempts):
            self.count += 1
            out = self.probe.send(size, wait)
            if out.kind != "timeout":
                return out
        return out

    def result(self, path: Optional[int], black: bool, reachable: bool, rtt: Optional[float],
               detail: str) -> PathMtu:
        return PathMtu(self.peer, self.address, self.probe.method, self.route_mtu, path, self.reported,
                       tuple(self.reporters), black, reachable, rtt, self.count, detail)

    def run(self, timeout: float, tries: int, max_probes: int) -> PathMtu:
        t0 = time.monotonic()
        first = self.send(SMALL_PROBE, timeout, tries + 1)
        rtt = time.monotonic() - t0 if first.kind == "reply" else None
        if first.kind == "unreachable":
            return self.result(None, False, False, None,
                               f"unreachable ({os.strerror(first.errno) if first.errno else 'ICMP'})")
        if first.kind != "reply":
            return self.result(None, False, False, None,
                               f"no answer to {SMALL_PROBE}-byte {self.probe.method} probes within {timeout:g}s")
        # Silence is judged against the peer's own RTT, with a floor for scheduling noise.
        wait = min(timeout, max(0.25, 4 * (rtt or 0)))
        mtu = self.route_mtu
        while self.count < max_probes:
            out = self.send(mtu, wait, tries)
            if out.kind == "reply":
                return self.result(mtu, False, True, rtt, f"{mtu} bytes reach the peer"
                                   + (f" (routers reported {self.reported})" if self.reported else ""))
            if out.kind == "unreachable":
                return self.result(None, False, False, rtt, f"unreachable at {mtu} bytes "
                                   f"({os.strerror(out.errno) if out.errno else 'ICMP'})")
            if out.kind != "too_big":
                break  # silence at `mtu`
            mtu = next_size(self.fam, mtu, out.mtu)
            if out.origin:
                self.reported = mtu
                if out.origin not in self.reporters:
                    self.reporters.append(out.origin)

        # Black hole: small probes are answered, `mtu`-byte ones vanish without an ICMP error.
        def answered(size: int) -> Optional[bool]:
            if self.count >= max_probes:
                return None
            return self.send(size, wait, tries).kind == "reply"

        lo = search_largest(answered, SMALL_PROBE, mtu, self.fam.min_mtu)
        return self.result(lo, True, True, rtt,
                           f"{mtu}-byte probes vanish without {self.fam.too_big}; {lo} bytes get through")
