"""When to probe which peer, and whether a probe may start now: jittered rounds, credits, budget (pure)."""

from __future__ import annotations

import collections
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

from agent.models.probe_cost import (
    PROBE_RATES,
    CreditSource,
    below_floor,
    credit_state,
    crosses_floor,
    expected_test_bytes,
    over_budget,
    rate_cap,
    stream_bitrate,
)
from agent.models.units import DIRECTIONS

if TYPE_CHECKING:
    from agent.config import ProbeConfig

log = logging.getLogger(__name__)

# "out": we send, iperf3's forward mode; it drains our outbound bucket (and the peer's inbound one).
# "in": the peer sends, iperf3 --reverse; it drains our inbound bucket (and the peer's outbound one).
# AWS keeps separate buckets per direction (docs/ec2-network-facts.md), so each direction is gated alone.
# The order a peer's probes run in by default (ours first): the directions themselves are
# agent.models.units.DIRECTIONS, which keys every per-direction figure.
PROBE_ORDER = ("out", "in")

# Why a due probe did not start. Each counts one probe (one peer, one direction), except no_peers,
# which counts a round that had nobody to probe. docs/probe-scheduling.md explains each.
SKIP_REASONS = ("no_peers", "credit_floor", "would_cross_floor", "budget", "busy", "peer_backoff")

# The sliding window of the probe byte budget.
BUDGET_WINDOW = 3600.0
# Default spread of each round's start around `interval` (+/- 20 %): with the random first offset, a
# fleet started at the same moment drifts apart instead of probing in lockstep.
DEFAULT_JITTER = 0.2
# Pause between one probe's end and the next one's start: an iperf3 server still tearing down the last
# test answers "busy" to a test that follows too closely, and the shaper's queues get to drain.
DEFAULT_GAP = 1.0
# A peer whose probes keep failing sits out 1, 3, 7, 15 rounds (2**(n-1) - 1 after n failures), so a
# terminated instance that discovery still lists costs little, and a peer that recovers comes back.
MAX_BACKOFF_ROUNDS = 15

DEFAULT_PORT = 5201


@dataclass(frozen=True)
class Peer:
    """Someone to probe: `source` is "config" ([probe] peers) or "discovered" (EC2 tags, the S3 registry);
    `zone` its Availability Zone when discovery knows it (None: configured, taken as this instance's)."""

    host: str
    port: int = DEFAULT_PORT
    instance_type: Optional[str] = None
    source: str = "config"
    zone: Optional[str] = None

    @property
    def key(self) -> str:
        """host:port, bracketed for IPv6: the `peer` label and the identity of a peer."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_peer(text: str, default_port: int = DEFAULT_PORT, source: str = "config") -> Peer:
    """'10.0.1.23' / '10.0.1.24:5202' / '[fd00::1]:5202' / 'fd00::1' -> Peer; ValueError when malformed
    (config.check_peers has already rejected those at load time)."""
    text = text.strip()
    port = default_port
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            port = int(rest.lstrip(":"))
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        port = int(port_text)
    else:
        host = text  # a name, IPv4 or a bare IPv6 address
    if not host or not 0 < port < 65536:
        raise ValueError(f"peer {text!r} is not host[:port]")
    return Peer(host, port, source=source)


@dataclass(frozen=True)
class ProbePlan:
    """A probe the scheduler allows now; the caller runs it and reports back with `finish()`."""

    peer: Peer
    direction: str
    duration: float
    streams: int
    expected_bytes: Optional[float]   # duration x the rate cap or the peak; None when neither is known
    round: int
    bitrate: Optional[int] = None     # iperf3 -b, bits/s per stream (rate = "baseline"); None: uncapped


def _check_directions(directions: Sequence[str]) -> None:
    if not directions or any(d not in DIRECTIONS for d in directions):
        raise ValueError(f"directions must be drawn from {DIRECTIONS}")


def _check_rate(rate: str) -> None:
    if rate not in PROBE_RATES:
        raise ValueError(f"rate must be one of {PROBE_RATES}")


@dataclass
class _PeerState:
    rank: float                       # random order among peers never probed: a per-agent start point
    last_attempt: Optional[float] = None
    failures: int = 0                 # consecutive failures that were the peer's fault
    sit_out: int = 0                  # rounds left to skip


class Scheduler:
    """Rounds every `interval` seconds (jittered; the first at a random offset in [0, interval)); each
    round visits up to `peers_per_round` peers, least recently probed first, and queues one probe per
    direction for each. `poll()` hands out one probe at a time and never another before `finish()`.

    A probe is skipped (and counted by reason) when either direction's bucket is below `credit_floor`,
    when its expected bytes would by themselves take its direction's bucket below the floor, when the
    bytes of the last hour plus its expected bytes would exceed `hourly_budget_bytes`, when `busy()`
    says something else is using the link (e.g. the responder serving a test), or when its peer is
    backing off after failures. Skipped peers keep their place at the front for the next round. Probes
    start at least `gap` seconds apart. Peers in another zone than `zone` get a round's slot only with
    probability `cross_az_share` (docs/probes.md, "Same-AZ peers").

    With `rate` "baseline" each probe is paced at `baseline_bytes_per_second()` split over its streams
    (ProbePlan.bitrate), and its expected bytes are duration x that cap; while the baseline is unknown
    it runs uncapped, and the log says so once."""

    def __init__(self, *, interval: float, peers_per_round: int, duration: float, streams: int,
                 credit_floor: float, hourly_budget_bytes: float,
                 credits: CreditSource = lambda: None,
                 peak_bytes_per_second: Callable[[], Optional[float]] = lambda: None,
                 baseline_bytes_per_second: Callable[[], Optional[float]] = lambda: None,
                 busy: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] = time.monotonic, rng: Optional[random.Random] = None,
                 directions: Sequence[str] = PROBE_ORDER, jitter: float = DEFAULT_JITTER,
                 gap: float = DEFAULT_GAP, rate: str = "baseline", zone: Optional[str] = None,
                 cross_az_share: float = 0.0) -> None:
        if interval <= 0 or peers_per_round < 1 or duration <= 0 or not 0 <= jitter < 1:
            raise ValueError("interval and duration must be positive, peers_per_round >= 1, 0 <= jitter < 1")
        _check_directions(directions)
        _check_rate(rate)
        self.interval = interval
        self.peers_per_round = peers_per_round
        self.duration = duration
        self.streams = streams
        self.credit_floor = credit_floor
        self.hourly_budget_bytes = hourly_budget_bytes
        self.directions = tuple(directions)
        self.rate = rate
        self.zone = zone
        self.cross_az_share = cross_az_share
        self.jitter = jitter
        self.gap = gap
        self._credits = credits
        self._peak = peak_bytes_per_second
        self._baseline = baseline_bytes_per_second
        self._said_uncapped = False       # "baseline unknown, probing uncapped" is logged once, not per probe
        self._busy = busy
        self.clock = clock
        self.rng = rng or random.Random()
        self._peers: dict[str, Peer] = {}
        self._state: dict[str, _PeerState] = {}
        self._queue: collections.deque[tuple[str, str]] = collections.deque()
        self._in_flight: Optional[ProbePlan] = None
        self._not_before = -math.inf      # no probe starts before this (the gap after the last one)
        self._spent: collections.deque[tuple[float, float]] = collections.deque()
        self._largest = dict.fromkeys(DIRECTIONS, 0.0)   # biggest probe seen, for when the peak is unknown
        self.skipped = dict.fromkeys(SKIP_REASONS, 0)
        self.bytes_total = dict.fromkeys(DIRECTIONS, 0.0)
        self.rounds = 0
        self.next_round = self.clock() + self.rng.uniform(0.0, interval)

    @classmethod
    def from_config(cls, cfg: ProbeConfig, **kw: Any) -> Scheduler:
        """The schedule of a [probe] section; `kw` are the rest of __init__'s arguments (the credit, peak,
        baseline and busy callables; clock, rng, jitter and gap for tests)."""
        return cls(interval=cfg.interval, peers_per_round=cfg.peers_per_round, duration=cfg.duration,
                   streams=cfg.streams, credit_floor=cfg.credit_floor,
                   hourly_budget_bytes=cfg.hourly_budget_bytes, directions=cfg.directions, rate=cfg.rate,
                   cross_az_share=cfg.cross_az_share, **kw)

    def reconfigure(self, cfg: ProbeConfig) -> None:
        """Take a reloaded [probe] section's schedule. Peer history, the budget window and the counters carry
        over; a shorter interval takes effect at once (the next round moves to a random point of the new
        interval when that is sooner). ValueError, with nothing changed, when the directions are bad."""
        _check_directions(cfg.directions)
        _check_rate(cfg.rate)
        if cfg.interval != self.interval:
            self.next_round = min(self.next_round, self.clock() + self.rng.uniform(0.0, cfg.interval))
        self.interval, self.peers_per_round, self.duration = cfg.interval, cfg.peers_per_round, cfg.duration
        self.streams, self.credit_floor = cfg.streams, cfg.credit_floor
        self.hourly_budget_bytes, self.directions = cfg.hourly_budget_bytes, tuple(cfg.directions)
        self.rate = cfg.rate            # cross_az_share waits for a restart: discovery's zone filter follows it

    # -- peers -------------------------------------------------------------------------------------------
    def set_peers(self, peers: Iterable[Peer]) -> None:
        """Replace the peer set (configured peers first: a configured and a discovered entry with the same
        host:port are one peer). Known peers keep their history; peers that left are forgotten."""
        merged: dict[str, Peer] = {}
        for p in peers:
            merged.setdefault(p.key, p)
        for key in merged:
            if key not in self._state:
                self._state[key] = _PeerState(rank=self.rng.random())
        for key in list(self._state):
            if key not in merged:
                del self._state[key]
        self._peers = merged
        self._queue = collections.deque(item for item in self._queue if item[0] in merged)

    @property
    def peers(self) -> tuple[Peer, ...]:
        return tuple(self._peers.values())

    @property
    def in_flight(self) -> Optional[ProbePlan]:
        return self._in_flight

    # -- figures -----------------------------------------------------------------------------------------
    def bitrate(self) -> Optional[int]:
        """iperf3's -b for the next probe (bits/s per stream): the baseline split over the streams with
        rate "baseline"; None (uncapped) with rate "peak" or while the baseline is unknown."""
        cap = rate_cap(self.rate, self._baseline())
        if cap is None:
            if self.rate == "baseline" and not self._said_uncapped:
                log.info("probe rate = baseline, but this instance's baseline is unknown: probes run "
                         "uncapped (at the peak, spending burst credits) until it is known")
                self._said_uncapped = True
            return None
        self._said_uncapped = False
        return stream_bitrate(cap, self.streams)

    def expected_bytes(self, direction: str, bitrate: Optional[int] = None) -> Optional[float]:
        """What one probe is expected to move: duration x the profile's peak (what the shaper allows with
        credits; refill at the baseline is ignored, so the estimate errs on the safe side), or x its rate
        cap (`bitrate` per stream, default: the next probe's) when that is lower. Without either, the
        largest probe seen so far in that direction; None before any."""
        if bitrate is None:
            bitrate = self.bitrate()
        expected = expected_test_bytes(self.duration, self._peak(), bitrate_bits_per_second=bitrate or 0,
                                       streams=self.streams)
        if expected is not None:
            return expected
        largest = self._largest.get(direction, 0.0)
        return largest if largest > 0 else None

    def credits_now(self) -> dict[str, tuple[float, float]]:
        """The credit state as the gates see it: direction -> (remaining, bucket), bucketed directions only."""
        return credit_state(self._credits())

    def budget_used(self) -> float:
        """Probe bytes in the last hour (the sliding budget window)."""
        self._prune(self.clock())
        return sum(b for _, b in self._spent)

    @property
    def pending(self) -> int:
        """Probes of the current round still queued."""
        return len(self._queue)

    def wait_seconds(self) -> float:
        """Seconds until `poll()` may have something: the gap after a probe when the round has more
        queued, else the next round."""
        now = self.clock()
        due = now if self._queue and self._in_flight is None else self.next_round
        return max(0.0, due - now, self._not_before - now)

    # -- decisions ---------------------------------------------------------------------------------------
    def poll(self) -> Optional[ProbePlan]:
        """The probe to run now, or None. Starts a round when one is due; counts every skip."""
        now = self.clock()
        if self._in_flight is not None:
            # Never two probes at once: a round that comes due during a probe is skipped whole.
            if now >= self.next_round:
                self._skip("busy", max(1, min(self.peers_per_round, len(self._peers))) * len(self.directions))
                self._advance(now)
            return None
        if now < self._not_before:
            return None
        while True:
            if not self._queue:
                if now < self.next_round:
                    return None
                self._begin_round(now)
                if not self._queue:
                    return None
            key, direction = self._queue.popleft()
            bitrate = self.bitrate()
            expected = self.expected_bytes(direction, bitrate)
            reason = self._gate(direction, expected)
            if reason is not None:
                log.debug("peer=%s direction=%s probe skipped: %s", key, direction, reason)
                self._skip(reason)
                continue
            self._state[key].last_attempt = now
            plan = ProbePlan(self._peers[key], direction, self.duration, self.streams, expected, self.rounds,
                             bitrate)
            self._in_flight = plan
            return plan

    def finish(self, plan: ProbePlan, success: bool, nbytes: float, peer_fault: bool = True) -> None:
        """Record what the probe did: its bytes count against the hourly budget whatever the outcome;
        a failure that was the peer's fault (refused, timed out; not "busy") starts its backoff."""
        if self._in_flight is not plan:
            log.warning("peer=%s direction=%s finished a probe that was not in flight", plan.peer.key,
                        plan.direction)
        self._in_flight = None
        now = self.clock()
        self._not_before = now + self.gap
        if nbytes > 0:
            self._spent.append((now, float(nbytes)))
            self.bytes_total[plan.direction] += float(nbytes)
            self._largest[plan.direction] = max(self._largest[plan.direction], float(nbytes))
        state = self._state.get(plan.peer.key)
        if state is None:       # the peer left while its probe ran
            return
        if success or not peer_fault:
            state.failures = 0
            return
        state.failures += 1
        state.sit_out = min(2 ** (state.failures - 1) - 1, MAX_BACKOFF_ROUNDS)
        if state.sit_out:
            log.info("peer=%s failed %d probe(s) in a row; skipping it for %d round(s)", plan.peer.key,
                     state.failures, state.sit_out)

    # -- internals ---------------------------------------------------------------------------------------
    def _skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] += n

    def _advance(self, now: float) -> None:
        gap = self.interval * (1.0 + self.rng.uniform(-self.jitter, self.jitter))
        # Anchored to the schedule, so rounds do not drift by the time probes take; after a stall
        # (suspend, a long round) the next round is one interval from now rather than a burst of them.
        self.next_round += gap
        if self.next_round <= now:
            self.next_round = now + gap

    def _begin_round(self, now: float) -> None:
        self.rounds += 1
        self._advance(now)
        if not self._peers:
            self._skip("no_peers")
            return
        order = sorted(self._peers, key=lambda k: (self._state[k].last_attempt is not None,
                                                    self._state[k].last_attempt or 0.0, self._state[k].rank))
        ready: list[str] = []
        for key in order:
            state = self._state[key]
            if state.sit_out > 0:
                state.sit_out -= 1
                if len(ready) < self.peers_per_round:
                    self._skip("peer_backoff", len(self.directions))
                continue
            ready.append(key)
        chosen = self._choose(ready)
        if not chosen and ready:
            self._skip("no_peers")        # only peers in other zones, and this round is not a cross-AZ one
        self._queue.extend((key, d) for key in chosen for d in self.directions)

    def cross_az(self, peer: Peer) -> bool:
        """The peer is in another Availability Zone (both zones known)."""
        return self.zone is not None and peer.zone is not None and peer.zone != self.zone

    def _choose(self, ready: list[str]) -> list[str]:
        """Up to peers_per_round of `ready` (least recently probed first): each slot goes to a peer in
        another zone with probability cross_az_share, else to one in this zone. A probe measures this
        instance's path, and crossing zones changes the path and is billed per GB (docs/probes.md,
        "Same-AZ peers"), so with the default share of 0 no probe crosses."""
        same = [k for k in ready if not self.cross_az(self._peers[k])]
        if self.cross_az_share <= 0:
            return same[:self.peers_per_round]
        cross = [k for k in ready if self.cross_az(self._peers[k])]
        chosen: list[str] = []
        for _ in range(self.peers_per_round):
            pool = cross if self.rng.random() < self.cross_az_share else same
            if pool:
                chosen.append(pool.pop(0))
        return chosen

    def _gate(self, direction: str, expected: Optional[float]) -> Optional[str]:
        credits = self.credits_now()
        for remaining, bucket in credits.values():
            if below_floor(remaining, bucket, self.credit_floor):
                return "credit_floor"
        if expected is not None and direction in credits:
            remaining, bucket = credits[direction]
            if crosses_floor(remaining, bucket, expected, self.credit_floor):
                return "would_cross_floor"
        if over_budget(self.budget_used(), expected, self.hourly_budget_bytes):
            return "budget"
        if self._busy():
            return "busy"
        return None

    def _prune(self, now: float) -> None:
        while self._spent and self._spent[0][0] <= now - BUDGET_WINDOW:
            self._spent.popleft()
