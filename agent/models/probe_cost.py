"""What a throughput test costs in burst credits and budget: one reckoning for the prober and the responder (pure)."""

# The probe scheduler decides whether this host may run a probe of its own; the responder decides whether
# it may serve someone else's test. Both spend the same buckets (docs/probes.md, "What a probe costs in
# credits"), so both reckon with these functions.

from __future__ import annotations

import math
from typing import Any, Mapping, Optional


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


def credit_state(raw: Optional[Mapping[str, Any]]) -> dict[str, tuple[float, float]]:
    """Normalise a credit reading to direction -> (remaining, bucket), keeping only directions that
    have a bucket; with several network cards, a direction's lowest ratio wins (the first to run dry).

    `raw` maps a direction (or "in:1"-style keys) to (remaining_bytes, bucket_bytes) or to an object with
    .direction, .remaining_bytes and .bucket_bytes (agent.models.credit_model.CreditReading); None or
    missing figures mean "unknown" (never gated)."""
    out: dict[str, tuple[float, float]] = {}
    for key, value in (raw or {}).items():
        if value is None:
            continue
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
