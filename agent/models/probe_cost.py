"""What a throughput test costs in burst credits and budget: one reckoning for the prober and the responder (pure)."""

# The probe scheduler decides whether this host may run a probe of its own; the responder decides whether
# it may serve someone else's test. Both spend the same buckets (docs/probes.md, "What a probe costs in
# credits"), so both reckon with these functions.

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Optional, Protocol, Union

from agent.models.units import BITS_PER_BYTE, DIRECTIONS

if TYPE_CHECKING:  # models stay import-light; these are only types here
    from agent.config import ProbeConfig
    from agent.models.catalogue import TypeEntry
    from agent.models.credit_model import CreditReading
    from agent.models.profile import BandwidthProfile

# [probe] rate: "baseline" paces each probe at the instance's baseline (it checks the network delivers the
# baseline and spends no burst credit: the bucket refills at the baseline, docs/ec2-network-facts.md "Burst
# credits"); "peak" lets it run as fast as the path allows.
PROBE_RATES = ("baseline", "peak")
HOUR = 3600.0
# The cost line: probes, own and served together, take at most this share of a direction's hourly refill
# (baseline x 1 h) on the catalogue's median burstable type (docs/probe-scheduling.md, "What probes cost").
COST_LINE = 0.02
_OTHER = {"in": "out", "out": "in"}


def expected_test_bytes(duration: float, peak_bytes_per_second: Optional[float], *,
                        bitrate_bits_per_second: float = 0.0, streams: int = 1,
                        nbytes: float = 0.0) -> Optional[float]:
    """The bytes a test is expected to move: `duration` x the size's peak, the most the shaper lets
    through with credits (the refill at the baseline meanwhile is ignored, so the estimate errs on the
    safe side); the test's own limit when that is smaller: a rate (iperf3's -b, bits per second per
    stream) x streams x duration, or a byte count (-n, -k). None when nothing bounds it."""
    bounds = []
    if peak_bytes_per_second is not None and peak_bytes_per_second > 0:
        bounds.append(duration * peak_bytes_per_second)
    if bitrate_bits_per_second > 0:
        bounds.append(bitrate_bits_per_second / 8.0 * max(1, streams) * duration)
    if nbytes > 0:
        bounds.append(float(nbytes))
    return min(bounds) if bounds else None


def below_floor(remaining: float, bucket: float, floor: float) -> bool:
    """The bucket already holds less than `floor` (a fraction of its size)."""
    return remaining / bucket < floor


def crosses_floor(remaining: float, bucket: float, expected: float, floor: float) -> bool:
    """`expected` bytes would by themselves take the bucket below `floor`, or empty it (with a floor of 0)."""
    return (remaining - expected) / bucket < floor or remaining < expected


def over_budget(used: float, expected: Optional[float], budget: float) -> bool:
    """The hour's `used` bytes plus a test's `expected` ones would exceed `budget` (or it is spent already;
    a budget of 0 allows nothing)."""
    return used + (expected or 0.0) > budget or used >= budget


# What the wiring hands the prober and the responder so each can read this host's state without importing
# the credit service or the other: direction -> CreditReading (tests hand (remaining_bytes, bucket_bytes)).
CreditFigures = Mapping[str, Union["CreditReading", tuple[float, float]]]


class CreditSource(Protocol):
    """This host's latest credit readings; None (or a direction left out) is unknown."""

    def __call__(self) -> Optional[CreditFigures]: ...


class ProfileSource(Protocol):
    """This host's bandwidth profile as now known (a reload or the fleet's consensus may change it)."""

    def __call__(self) -> Optional[BandwidthProfile]: ...


class BusyFlag(Protocol):
    """True while the other side of the link is in use: the prober asks it of the responder (a test being
    served) and the responder of the prober (a probe of this host's own running)."""

    def __call__(self) -> bool: ...


def credit_state(raw: Optional[CreditFigures]) -> dict[str, tuple[float, float]]:
    """Normalise a credit reading to direction -> (remaining, bucket), keeping only directions that
    have a bucket; with several network cards, a direction's lowest ratio wins (the first to run dry).

    `raw` maps a direction (or "in:1"-style keys) to (remaining_bytes, bucket_bytes) or to an object with
    .direction, .remaining_bytes and .bucket_bytes (agent.models.credit_model.CreditReading); None or
    missing figures mean "unknown" (never gated)."""
    out: dict[str, tuple[float, float]] = {}
    for key, value in (raw or {}).items():
        if value is None:
            continue
        remaining: Optional[float]
        bucket: Optional[float]
        if isinstance(value, (tuple, list)):
            direction, (remaining, bucket) = str(key), value
        else:
            direction = str(getattr(value, "direction", key))
            remaining, bucket = getattr(value, "remaining_bytes", None), getattr(value, "bucket_bytes", None)
        if remaining is None or bucket is None or not bucket > 0 or math.isinf(bucket):
            continue
        pair = (max(0.0, float(remaining)), float(bucket))
        old = out.get(direction)
        if old is None or pair[0] / pair[1] < old[0] / old[1]:
            out[direction] = pair
    return out


def rate_cap(rate: str, baseline_bytes_per_second: Optional[float]) -> Optional[float]:
    """The rate a probe is paced at, bytes/s: the baseline with rate "baseline" when it is known; None
    (uncapped: the path and the shaper decide) with rate "peak" or an unknown baseline."""
    if rate == "baseline" and baseline_bytes_per_second is not None and baseline_bytes_per_second > 0:
        return float(baseline_bytes_per_second)
    return None


def stream_bitrate(cap_bytes_per_second: float, streams: int) -> int:
    """iperf3's -b for a total cap: bits per second *per stream* (the client's and the server's pacing
    are per stream), rounded down so the streams together stay under the cap; at least 1 (-b 0 means
    unlimited)."""
    return max(1, int(cap_bytes_per_second * BITS_PER_BYTE / max(1, streams)))


@dataclass(frozen=True)
class DirectionCost:
    """What the schedule costs one direction's bucket in an hour, in a homogeneous fleet where every agent
    probes on the same schedule and, on average, serves as many probes as it runs (each probe has one
    prober and one peer). An outbound probe (iperf3 forward) drains the prober's out and the peer's in
    bucket; an inbound one (-R) the prober's in and the peer's out bucket."""

    direction: str
    own_probes: float                   # probes this agent runs per hour that drain this direction
    served_probes: float                # probes it serves per hour that drain this direction
    probe_rate: Optional[float]         # bytes/s a probe runs at (cap or peak); None when unknown
    probe_seconds: float
    refill_bytes: Optional[float]       # baseline x 1 h: what the bucket gets back in an hour
    credit_per_probe: Optional[float]   # credit a probe spends above the baseline refill (idle otherwise)

    @property
    def probes(self) -> float:
        return self.own_probes + self.served_probes

    @property
    def bytes_per_probe(self) -> Optional[float]:
        return self.probe_rate * self.probe_seconds if self.probe_rate is not None else None

    @property
    def bytes_per_hour(self) -> Optional[float]:
        b = self.bytes_per_probe
        return b * self.probes if b is not None else None

    @property
    def fraction(self) -> Optional[float]:
        """bytes_per_hour / refill_bytes: the share of the hourly baseline the probes take, own and served
        together (None when the baseline or the probe's rate is unknown)."""
        b = self.bytes_per_hour
        if b is None or not self.refill_bytes:
            return None
        return b / self.refill_bytes


def hourly_cost(cfg: ProbeConfig, baseline_bytes_per_second: Optional[float],
                peak_bytes_per_second: Optional[float]) -> dict[str, DirectionCost]:
    """Direction -> DirectionCost of a [probe] section on a size with this baseline and peak (bytes/s),
    prober and responder together. Rounds per hour are 3600 / interval (the jitter averages out), each
    visiting `peers_per_round` peers in every configured direction. A probe runs at its rate cap
    (rate_cap) or, uncapped, at the peak: the shaper's most with credit."""
    rounds = HOUR / cfg.interval
    cap = rate_cap(cfg.rate, baseline_bytes_per_second)
    peak = peak_bytes_per_second if peak_bytes_per_second else None
    candidates = [r for r in (cap, peak) if r is not None]
    probe_rate = min(candidates) if candidates else None
    refill = baseline_bytes_per_second * HOUR if baseline_bytes_per_second else None
    credit = None
    if probe_rate is not None and baseline_bytes_per_second is not None:
        credit = max(0.0, probe_rate - baseline_bytes_per_second) * cfg.duration
    out = {}
    for d in DIRECTIONS:
        own = rounds * cfg.peers_per_round if d in cfg.directions else 0.0
        served = rounds * cfg.peers_per_round if _OTHER[d] in cfg.directions else 0.0
        out[d] = DirectionCost(d, own, served, probe_rate, cfg.duration, refill, credit)
    return out


def worst_fraction(costs: Mapping[str, DirectionCost]) -> Optional[float]:
    """The largest direction's share of its hourly refill (None when unknown)."""
    fractions = [c.fraction for c in costs.values() if c.fraction is not None]
    return max(fractions) if fractions else None


def burstable(entries: Iterable[TypeEntry]) -> list[TypeEntry]:
    """Types with a burst bucket (peak > baseline on the primary card), by baseline, then peak, then name."""
    out = [e for e in entries if e.baseline_gbps is not None and e.peak_gbps is not None
           and e.peak_gbps > e.baseline_gbps]
    return sorted(out, key=lambda e: (e.baseline_gbps, e.peak_gbps, e.instance_type))


def median_burstable(entries: Iterable[TypeEntry]) -> TypeEntry:
    """The catalogue's median burstable type by baseline (the lower middle one of an even count): the size
    the cost line is drawn on. ValueError when there is none."""
    ordered = burstable(entries)
    if not ordered:
        raise ValueError("no burstable type in the catalogue")
    return ordered[(len(ordered) - 1) // 2]
