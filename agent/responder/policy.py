"""What the responder lets in (pure, no sockets): allow list, caps, tests per hour, credit floor and budget."""

from __future__ import annotations

import collections
import ipaddress
import logging
import socket
import threading
import time
from typing import Callable, Mapping, Optional, Sequence, Union

from agent.config import ResponderConfig
from agent.iperf3 import protocol as p
from agent.iperf3.params import TestParams
from agent.models.probe_cost import below_floor, crosses_floor, expected_test_bytes, over_budget
from agent.models.serving_budget import ServingBudget
from agent.models.units import DIRECTIONS

log = logging.getLogger(__name__)

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
LOOPBACK = ("127.0.0.0/8", "::1/128")


def parse_allow(items: Sequence[Union[str, Network]]) -> list[Network]:
    return [ipaddress.ip_network(i, strict=False) if isinstance(i, str) else i for i in items]


def resolve_allow(configured: Optional[Sequence[str]], vpc_cidrs: Callable[[], Sequence[str]]) -> list[Network]:
    """The allow list in force: `[responder] allow` when set; else the VPC's CIDRs (from IMDS, via
    `vpc_cidrs`); else loopback only (docs/probes.md, "The responder"). A failing `vpc_cidrs` means
    loopback, logged."""
    if configured is not None:
        return parse_allow(list(configured))
    try:
        cidrs = list(vpc_cidrs())
    except Exception as exc:
        log.warning("responder: cannot learn the VPC's CIDRs (%s); allowing loopback only", exc)
        cidrs = []
    if cidrs:
        return parse_allow(cidrs)
    return parse_allow(list(LOOPBACK))


def client_ip(addr: str) -> Optional[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]]:
    """A peer's address as the policy sees it (without its scope id); None when it is not an IP address."""
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # a dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d
    return ip


def _scope_index(scope: str) -> Optional[int]:
    """An IPv6 scope id as an interface index: digits are one already, a name is looked up now (the
    interface may come and go while the daemon runs); None for a name no interface has."""
    if scope.isdigit():
        return int(scope)
    try:
        return socket.if_nametoindex(scope)
    except OSError:
        return None


def same_scope(entry: str, peer: Optional[str]) -> bool:
    """Whether a peer's scope id (the `%eth0` of `fe80::1%eth0`, from accept()) names the interface of an
    allow entry's scope id: compared as interface indexes, or as names when one has no index."""
    if peer is None:
        return False
    if entry == peer:
        return True
    a, b = _scope_index(entry), _scope_index(peer)
    return a is not None and a == b


def is_allowed(addr: str, allow: Sequence[Network]) -> bool:
    """Whether a peer may test. An entry with a scope id (`fe80::%eth0/64`) matches only peers on that
    interface: link-local addresses repeat on every link, so without the scope the entry would let in
    the same addresses on every other link (docs/security.md, "Responder limits"). An entry without one
    matches any link."""
    ip = client_ip(addr)
    if ip is None:
        return False
    _, sep, scope = addr.partition("%")
    peer_scope = scope if sep and scope else None
    for n in allow:
        if ip.version != n.version or ip not in n:
            continue
        entry_scope = getattr(n.network_address, "scope_id", None)
        if entry_scope and not same_scope(entry_scope, peer_scope):
            continue
        return True
    return False


def valid_cookie(cookie: bytes) -> bool:
    """iperf3 cookies are 36 printable characters and a NUL; anything else is not an iperf3 client."""
    return len(cookie) == p.COOKIE_SIZE and cookie[-1] == 0 and all(0x21 <= b <= 0x7E for b in cookie[:-1])


class Refused(Exception):
    """A test the responder will not run: `reason` is a stats.REFUSAL_REASONS label, str() the explanation.
    `busy` refusals are answered with ACCESS_DENIED (iperf3 clients print "busy" and may retry later),
    the others with SERVER_ERROR and `code`."""

    def __init__(self, reason: str, message: str, code: int = p.IEAUTHTEST, busy: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code
        self.busy = busy


def data_connections(params: TestParams) -> int:
    """The data connections a test makes: -P of them, twice with --bidir (one set each way)."""
    return params.num_streams * (2 if params.bidirectional else 1)


def udp_planned_bytes(params: TestParams, peak_bytes_per_second: Optional[float],
                      cfg: ResponderConfig) -> Optional[float]:
    """What a UDP test moves each way, known in advance because UDP goes at the asked rate whatever the
    receiver does: rate x streams x length. `-b 0` (unlimited) goes as fast as the host can, so it is
    planned at this size's peak, the most the shaper lets through (docs/security.md, "Responder limits");
    None when the peak
    is unknown too (then only max_bytes bounds it, at run time)."""
    length = (params.duration + params.omit) or cfg.max_duration
    if params.bandwidth > 0:
        return params.bandwidth / 8 * params.num_streams * length
    if peak_bytes_per_second is not None and peak_bytes_per_second > 0:
        return peak_bytes_per_second * length
    return None


def check_caps(params: TestParams, cfg: ResponderConfig, peak_bytes_per_second: Optional[float] = None) -> None:
    """Raise Refused when the parameters ask for more than `[responder]` allows. Over-long or too-wide
    tests are refused, not clamped: iperf3 clients end a test by their own clock, so a clamped test would
    report a rate over the wrong duration. `peak_bytes_per_second` (this size's, when known) plans UDP
    tests without a rate."""
    if params.protocol not in ("tcp", "udp"):
        raise Refused("unsupported", f"protocol {params.protocol} is not supported (TCP and UDP are)", p.IEPROTOCOL)
    conns = data_connections(params)
    if conns > cfg.max_streams:
        what = f"2 x {params.num_streams} streams (--bidir)" if params.bidirectional else f"{conns} streams"
        raise Refused("streams", f"{what} exceed max_streams {cfg.max_streams}")
    if params.duration == 0 and not params.bytes and not params.blocks:
        raise Refused("duration", f"an open-ended test (time 0 without a byte or block count) exceeds "
                      f"max_duration {cfg.max_duration:g}s")
    if params.duration + params.omit > cfg.max_duration:
        raise Refused("duration", f"{params.duration + params.omit}s (time + omit) exceeds max_duration "
                      f"{cfg.max_duration:g}s")
    limit = params.bytes or params.blocks * params.blksize
    if limit > cfg.max_bytes:
        raise Refused("bytes", f"{limit} bytes exceed max_bytes {cfg.max_bytes}")
    if params.protocol == "udp":
        if not 16 <= params.blksize <= p.MAX_UDP_BLKSIZE:
            raise Refused("unsupported", f"UDP block size {params.blksize} is not 16..{p.MAX_UDP_BLKSIZE}",
                          p.IEUDPBLOCKSIZE)
        planned = udp_planned_bytes(params, peak_bytes_per_second, cfg)
        if planned is not None and planned > cfg.max_bytes:
            length = (params.duration + params.omit) or cfg.max_duration
            rate = (f"{params.num_streams} x {params.bandwidth} bit/s" if params.bandwidth
                    else f"unlimited (-b 0) at this host's peak of {peak_bytes_per_second:.0f} bytes/s")
            raise Refused("bytes", f"{rate} for {length:g}s is {planned:.0f} bytes, over max_bytes "
                          f"{cfg.max_bytes}")
    elif not 1 <= params.blksize <= p.MAX_TCP_BLKSIZE:
        raise Refused("unsupported", f"block size {params.blksize} is not 1..{p.MAX_TCP_BLKSIZE}", p.IEBLOCKSIZE)


class RateLimiter:
    """At most `per_hour` tests per source address in any sliding hour."""

    def __init__(self, per_hour: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_hour = per_hour
        self.clock = clock
        self._seen: dict[str, collections.deque[float]] = {}
        self._lock = threading.Lock()

    def allow(self, source: str) -> bool:
        """Record a test from `source` and say whether it is within the limit (refusals are not recorded)."""
        now = self.clock()
        with self._lock:
            for key in [k for k, q in self._seen.items() if not q or q[-1] <= now - 3600]:
                del self._seen[key]
            q = self._seen.setdefault(source, collections.deque())
            while q and q[0] <= now - 3600:
                q.popleft()
            if len(q) >= self.per_hour:
                return False
            q.append(now)
            return True


# -- the credit guard: serving spends this host's own buckets (docs/probes.md, "Credit guard") ------------

def drained_directions(params: TestParams) -> tuple[str, ...]:
    """The buckets of this host a test drains: with -R the responder sends (outbound), otherwise it
    receives (inbound); --bidir both. AWS keeps one bucket per direction (docs/ec2-network-facts.md, "Bandwidth")."""
    if params.bidirectional:
        return DIRECTIONS
    return ("out",) if params.reverse else ("in",)


def expected_bytes(params: TestParams, peak_bytes_per_second: Optional[float],
                   cfg: ResponderConfig) -> Optional[float]:
    """What the test is expected to move in each direction it drains, reckoned as the probe scheduler
    does (agent.models.probe_cost): its length (time + omit) x this size's peak, or the client's -b / -n
    when smaller, and never more than max_bytes (the run-time cap). None when nothing bounds it: no
    known peak and no limit from the client."""
    length = (params.duration + params.omit) or cfg.max_duration
    asked = params.bytes or params.blocks * params.blksize
    expected = expected_test_bytes(length, peak_bytes_per_second, bitrate_bits_per_second=params.bandwidth,
                                   streams=params.num_streams, nbytes=asked)
    if expected is None and params.protocol == "udp":
        # UDP without a rate sends as fast as it can, whatever the receiver does: only the run-time
        # cap bounds it, so plan for all of it (docs/security.md, "Responder limits").
        return float(cfg.max_bytes)
    return min(expected, float(cfg.max_bytes)) if expected is not None else None


def credit_refusal(params: TestParams, credits: Mapping[str, tuple[float, float]],
                   expected: Optional[float], floor: float) -> Optional[Refused]:
    """Refused (busy) when a bucket the test would drain holds less than `floor` of its size, or when the
    test's expected bytes would by themselves take it below; None to serve. `credits` holds only the
    directions with a known bucket (probe_cost.credit_state): a credit-blind host is never refused here."""
    drained = [d for d in drained_directions(params) if d in credits]
    for d in drained:
        remaining, bucket = credits[d]
        if below_floor(remaining, bucket, floor):
            return Refused("credit_floor", f"credit floor: this host's {d}bound burst credit is at "
                           f"{remaining / bucket:.0%} of its bucket, under the responder's credit_floor {floor:g}",
                           busy=True)
    if expected is not None:
        for d in drained:
            remaining, bucket = credits[d]
            if crosses_floor(remaining, bucket, expected, floor):
                return Refused("would_cross_floor", f"credit floor: this test is expected to move "
                               f"{gigabytes(expected)}, which would take this "
                               f"host's {d}bound burst credit from {remaining / bucket:.0%} of its bucket to "
                               f"under the responder's credit_floor {floor:g}", busy=True)
    return None


def gigabytes(nbytes: float) -> str:
    """Bytes for a person, in the decimal units the budgets are quoted in: '9.8 GB', '470 MB'."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} bytes"


def budget_refusal(params: TestParams, expected: Optional[float], used: Mapping[str, float],
                   used_by_source: Mapping[str, float], budget: ServingBudget,
                   source: str = "this source") -> Optional[Refused]:
    """Refused (busy) when the bytes served in the last hour plus the test's expected ones would exceed
    the hourly budget of a direction it drains, for all sources together or for this source; None to
    serve. The reason says how much of which budget is spent and what the budget is, so `burstwatch
    probe` (and the log) can tell an operator why (docs/probes.md, "What a refused client sees")."""
    for d in drained_directions(params):
        # The source's own budget first: it is the smaller, so the one a client can act on.
        for spent, limit, whose, each in ((used_by_source.get(d, 0.0), budget.per_source, source, True),
                                          (used.get(d, 0.0), budget.total, "all sources", False)):
            if over_budget(spent, expected, limit):
                way = "received from" if d == "in" else "sent to"
                test = f"; this test is expected to move {gigabytes(expected)}" if expected else ""
                return Refused("budget", f"hourly budget spent: {gigabytes(spent)} of {gigabytes(limit)} {way} "
                               f"{whose} in the last hour{test} (budget: {budget.describe(each)})", busy=True)
    return None
