"""The bucket's size as a band: a prior from public measurements, narrowed by this type's exhaustions (pure;
docs/credits.md, "The bucket as a band")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from agent.models.units import bytes_to_gbit, gbit_to_bytes

INF = math.inf

# The prior, in multiples of one hour of baseline (the default belief), before any exhaustion was seen: the
# public measurements of one type range from 0.19x (m5.xlarge at 12 Gbit/s, 2026) through 0.6x (r4.large,
# seed 002 against seed 000) to at least 1.9x (m5.xlarge the same day) and 2.8x (m8i.xlarge never enforced in
# 30 min); ../shared/ec2-network-facts.md, "The bucket is not a constant"; docs/credits.md, "The prior".
PRIOR_LOW = 0.2
PRIOR_HIGH = 3.0
# Around what this type's own exhaustions measured: one r4.large measured 0.62x of another's size (seeds
# 000/002), so a next exhaustion may land under the smallest seen by that much and a margin, or over the
# largest by its inverse.
LEARNED_LOW = 0.4
LEARNED_HIGH = 1.6
# Exhaustion sizes kept per direction (credits.json, learned-buckets.json): enough for a spread, few enough
# for the state file's 4-KiB budget (about 60 bytes a direction).
OBSERVATIONS_KEPT = 8
# An exhaustion contradicts a configured bucket when it lies outside this share of it (the model's own
# AGREEMENT margin, credit_evidence.py, doubled: the configured size is the user's word).
CONTRADICTION = 0.1
# Until the traffic has shown its cycle, the latest moment assumes it may spend at this share of the pace seen
# so far: a burst at the peak may be the first half of an on/off cycle not yet seen (issue 23's 150 s / 150 s).
UNSEEN_DUTY = 0.5


@dataclass(frozen=True)
class Band:
    """The bucket's low and high estimates (bytes) and where they come from."""

    low: float
    high: float
    source: str                 # default | fleet | config | learned
    observations: int

    def remaining(self, deficit: float) -> tuple[float, float]:
        """Credit left (bytes) if the bucket were `low`, resp. `high`, after `deficit` spent since full."""
        return max(0.0, self.low - deficit), max(0.0, self.high - deficit)

    def ratios(self, deficit: float) -> tuple[float, float]:
        """The remaining share of the bucket at each end: 1 - deficit / size, in 0..1."""
        lo, hi = self.remaining(deficit)
        return (lo / self.low if self.low > 0 else 0.0), (hi / self.high if self.high > 0 else 0.0)


@dataclass
class BucketBand:
    """One direction's observed exhaustion sizes and what they say about the bucket with the prior."""

    observations: list[float] = field(default_factory=list)     # bytes, newest last
    contradictions: int = 0     # exhaustions that contradicted a configured bucket
    seen: int = 0               # exhaustions observed by this process (the list keeps the recent ones)
    fleet: Optional[tuple[float, float]] = None     # the fleet's smallest and largest size for the type

    def observe(self, size: float, belief: float, source: str) -> bool:
        """A confirmed exhaustion at `size` bytes; True when it contradicts a configured `belief`."""
        self.observations.append(size)
        self.seen += 1
        del self.observations[:-OBSERVATIONS_KEPT]
        if source == "config" and abs(size - belief) > CONTRADICTION * belief:
            self.contradictions += 1
            return True
        return False

    def band(self, belief: float, hour_of_baseline: float, source: str, lower_bound: bool = False) -> Band:
        """The band around the `belief` (the bucket in use) of `source`: config alone is the user's word (no
        band until an exhaustion widens it); fleet and learned sizes get the learned margins; the default gets
        the prior. The belief always lies inside. `lower_bound`: the belief was learned from an overrun (the
        deficit passed it unshaped), so the bucket is at least that and the prior's high end still stands."""
        obs = self.observations
        if lower_bound:
            hi = max(PRIOR_HIGH * hour_of_baseline, LEARNED_HIGH * max(obs + [belief]))
            return Band(belief, hi, "learned", len(obs))
        if obs:
            lo, hi = LEARNED_LOW * min(obs), LEARNED_HIGH * max(obs)
            src = "config" if source == "config" else "learned"
            if source == "config":
                lo, hi = min(obs), max(obs)     # the user's word, widened only as far as the facts go
        elif source == "config":
            lo = hi = belief
            src = source
        elif source == "fleet" and self.fleet is not None:
            lo, hi, src = LEARNED_LOW * self.fleet[0], LEARNED_HIGH * self.fleet[1], source
        elif source in ("fleet", "learned"):
            lo, hi, src = LEARNED_LOW * belief, LEARNED_HIGH * belief, source
        else:
            lo, hi, src = PRIOR_LOW * hour_of_baseline, PRIOR_HIGH * hour_of_baseline, "default"
        return Band(min(lo, belief), max(hi, belief), src, len(obs))

    # -- persistence: "a b c" in Gbit, compact for the state file's budget --------------------------------
    def to_state(self) -> str:
        return " ".join(f"{bytes_to_gbit(v):.4g}" for v in self.observations)

    def restore(self, text: Any) -> None:
        """Load what to_state() wrote; anything unreadable (an older file has nothing) leaves it empty."""
        try:
            values = [gbit_to_bytes(float(v)) for v in str(text or "").split()]
        except ValueError:
            values = []
        self.observations = [v for v in values if math.isfinite(v) and v > 0][-OBSERVATIONS_KEPT:]


def band_forecast(band: Band, deficit: float, remaining: float, instant: float, trend: float,
                  burst_pace: float, drain_pace: float, cycle_known: bool, exhausted: bool,
                  trend_ready: bool = True) -> tuple[float, float]:
    """(earliest, latest) seconds to empty (docs/credits.md, "The forecast as a band").

    earliest: the sooner of the two point forecasts scaled to the low bucket's credit (the time to spend a
    credit at a given pace is proportional to it); in a pause, when the drain's fastest net pace so far
    (`burst_pace`, bytes/s) resumes now. The trend counts only once the drain is a forecast window old
    (`trend_ready`): within it, one burst from a full bucket is in the trend's whole window, and traffic
    averaging under the baseline would hold the low bucket's forecast under the horizon a minute after each
    burst (docs/alerting.md, "The trade").
    latest: the high bucket's credit at the drain's mean net pace since it began (`drain_pace`), which holds
    its pauses; until the traffic has shown its cycle the pace may be half of that (UNSEEN_DUTY), and in a
    pause +Inf: a pause may never end."""
    if exhausted:
        return 0.0, 0.0
    low_left, high_left = band.remaining(deficit)
    soonest = min(instant, trend) if trend_ready else instant
    if low_left <= 0.0:
        earliest = 0.0
    elif math.isinf(soonest):
        earliest = low_left / burst_pace if burst_pace > 0.0 and deficit > 0.0 else INF
    elif remaining <= 0.0:
        earliest = 0.0
    else:
        earliest = soonest * low_left / remaining
    pace = drain_pace if cycle_known else UNSEEN_DUTY * drain_pace
    pause = math.isinf(min(instant, trend)) and remaining > 0.0
    if (math.isinf(instant) and not cycle_known) or pace <= 0.0 or pause:
        latest = INF
    else:
        latest = high_left / pace
    return earliest, max(earliest, latest)


def learned_note(band: Band) -> Optional[str]:
    """'learned x3', 'fleet', 'default', 'config': how status names the band's source."""
    if band.source == "learned" and band.observations:
        return f"learned \u00d7{band.observations}"
    return band.source
