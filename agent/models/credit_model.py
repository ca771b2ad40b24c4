"""The burst-credit token bucket per direction: estimate, forecast, learn (pure; no I/O).

The model tracks the *deficit* D: bytes spent above the baseline since the bucket was last full
(D = max(0, D + bytes - baseline * dt)). The deficit does not depend on the bucket size, so when
the shaper reveals a real exhaustion the bucket is D at that moment, whatever size the model
assumed: that is how it learns. Remaining credit = bucket - D, clamped to 0 .. bucket.
Facts behind it (docs/ec2-network-facts.md, "Bandwidth" and "Burst credits"): separate buckets in and
out; credits are full at launch and earned below the baseline; one Gbit of credit = 1 Gbit/s for 1 s.
The reasoning behind every threshold below is written out in docs/credits.md.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from agent.models.spend_trend import TREND_MAX_POINTS, SpendTrend
from agent.models.units import DIRECTIONS

INF = math.inf

# A shaped interval is "at the baseline" when the rate sits in this band around the baseline; shaping
# well above it is shaping at the peak or best-effort burst, which ENA also counts
# (docs/ec2-network-facts.md: "a rising counter alone does not mean exhaustion").
NEAR_BASELINE_LOW = 0.8
NEAR_BASELINE_HIGH = 1.25
# Consecutive samples of shaping near the baseline before they are weighed at all: the byte counters and
# the shaping counter are read at slightly different moments, so one or two samples can straddle the end
# of a burst. A count of samples, not seconds: it filters sampling noise, whatever the interval.
EXHAUSTION_CONFIRM_SAMPLES = 3

# -- The exhaustion evidence rule (docs/credits.md, "Exhaustion needs evidence") ------------------------
# Shaping near the baseline is an exhaustion only when the history could have spent the bucket. Every
# threshold is a fraction of the bucket or of the baseline, so the rule reads the same on EC2 (drains of
# 5-60 minutes) as in the lab (about 300x faster).
#
# 1. The deficit since the bucket was last full must be a substantial part of the bucket in use. Traffic
#    that averages under the baseline keeps D near 0 however it is shaped at the peak (microbursts), so
#    this alone answers the common false alarm. A quarter: a real bucket may well be smaller than the one
#    in use (that is what learning is for), but the measured r4 buckets are 0.66-1.14 x the one-hour
#    default (seed 000) and the lab's calibration runs a bucket 2x too large (D = 0.5 x the bucket at the
#    clamp); a bucket four times smaller than the estimate is beyond both, while a few minutes at the peak
#    followed by bursty near-baseline traffic (a broker catching up, then steady) is ordinary.
EXHAUSTION_EVIDENCE_FRACTION = 0.25
# 2. The deficit must sit at its high-water mark since the bucket was last full. D never exceeds the real
#    bucket, so the real bucket is at least the highest D seen and still holds at least (peak D - D): a
#    deficit below its own peak proves credit is left. The slack absorbs what D may lose during the
#    confirmation itself (a rate at the band's low edge for 3 samples: 1 % of the lab's 12-s bucket at
#    0.2-s samples, 0.02 % of a one-hour bucket at 1-s samples).
HIGH_WATER_TOLERANCE = 0.01
# 3. When the model disagrees (it holds more than AGREEMENT of the bucket), the exhaustion would teach it
#    a new size, so it must also look like a clamp: a shaper holding a backlog at an empty bucket sends at
#    exactly its fill rate, so the deficit stays flat. Traffic that averages measurably under the baseline
#    while shaped is earning credit: peak shaping of microbursts, not a clamp. The slack is the baseline's
#    own uncertainty: the clamped r4.large ran at 734-755 Mbit/s against 750 (seeds 000, 002), the lab's
#    tbf at its configured rate.
CLAMP_RATE_SLACK = 0.05
# The model agrees with an observed exhaustion when it holds less than this share of the bucket.
AGREEMENT = 0.05
# Later learnings move the bucket half-way, so one odd exhaustion cannot swing it wildly.
LEARN_WEIGHT_AFTER_FIRST = 0.5

# -- The trend forecast ------------------------------------------------------------------------------------
# Seconds of history the trend forecast fits its slope to. EC2 drains last 5-60 minutes ("typically from 5
# to 60 minutes", docs/ec2-network-facts.md); the shortest measured, r4.large at 10 Gbit/s, is ~295 s
# (seed 000). One minute is a fifth of that, so the trend has settled early in any drain; it spans several
# cycles of the bursty workloads that flip the instant forecast (flushes and batches seconds apart); it is
# the `for:` of BurstCreditsRunningOut and CloudWatch's standard period; and it holds 60 samples at the
# default 1-s interval. The lab (about 300x faster, 0.2-s samples) uses a few seconds.
DEFAULT_FORECAST_WINDOW = 60.0
# A net rate under this share of the baseline is "flat": such a forecast would exceed 10,000 times the
# bucket's own refill time, and the running sums' rounding lives far below it.
TREND_FLAT_FRACTION = 1e-4

# The trend's forecast takes off this share of the spend's excursion above its fitted line (SpendTrend.
# excursion): a bursty drain empties when a burst's top reaches the credit left, between the line's crossing
# (late) and the burst tops' (early, by up to a cycle the fitted line also wobbles by). The full excursion
# over-corrects cycles longer than a third of the window; half keeps those and still lifts 0.5 s on / 0.5 s
# off from 88 % to 100 % of forecasts within max(1 s, 15 %) (simulated at lab scale; docs/credits.md, "Two
# forecasts"). No effect on a steady drain, whose excursion is 0.
EXCURSION_WEIGHT = 0.5
# The trend's forecast is reported as the sooner of its own and the median of the empty *moments* it
# predicted over the last third of the window (1 s in the lab, 20 s on EC2). A bursty drain's fitted slope
# and excursion wobble with the phase of its cycle, so successive samples predict moments scattered around
# the true one, up to two seconds late in the lab's TCP on/off drains (0.5 s on / 0.5 s off: 75-95 % of
# samples within the target); the moment itself should stand still, and the median cuts the late tail
# (100 %, make bench BENCH=zoo). The sooner of the two, because at the start of a drain the moments fall
# fast and their median would lag behind them: a fresh burst keeps its current figure. A steady drain
# predicts the same moment every sample and is not changed. (docs/credits.md, "Two forecasts")
MOMENT_SMOOTHING_FRACTION = 1.0 / 3.0

# -- Persistence (docs/credits.md, "Persistence") -----------------------------------------------------------
# The state is saved whenever a direction's estimate has moved by this share of its bucket since the last
# save (at most once per sample; [credits] save_interval is the idle heartbeat). After a crash the gap since
# the last save is accounted from the kernel's byte counters, which tell how much crossed but not when:
# whether a refill happened at a full bucket (and was lost) or mid-drain is a guess. Saving on movement
# keeps what the gap has to guess to about this share of the bucket on top of the downtime itself, at any
# time scale; a clock alone left up to save_interval of it (12.8 % of the bucket off in the lab at 5 s,
# issue 12).
SAVE_MOVEMENT_FRACTION = 0.01


def gap_deficit(deficit: float, seconds: float, moved: float, baseline: float, peak: Optional[float]) -> float:
    """The deficit after a gap of `seconds` in which `moved` bytes crossed at unknown moments (unclamped
    above; never below 0).

    Only the sum of the bytes is known, so the accounting takes the order that leaves the fewest credits:
    the refill first, capped at a full bucket (credit earned while full is lost), and the bytes last, at the
    peak (the shortest time they could have taken, so the least baseline earned beside them):
    t = min(G, M / peak); D = max(0, D0 - baseline x (G - t)) + M - baseline x t. Any other order leaves at
    least as much credit. Without a peak the bytes are taken as spread over the whole gap (t = G)."""
    seconds = max(0.0, seconds)
    moved = max(0.0, moved)
    t = min(seconds, moved / peak) if peak is not None and peak > 0 else seconds
    return max(0.0, max(0.0, deficit - baseline * (seconds - t)) + moved - baseline * t)


@dataclass(frozen=True)
class CreditReading:
    """One direction's credit figures after a sample; what exporters render (never recompute)."""

    direction: str                          # "in" | "out"
    rate_bytes_per_second: float            # measured rate the estimate uses
    remaining_bytes: Optional[float]        # None: no bucket (never exhausts) or profile unknown
    bucket_bytes: Optional[float]
    ratio: Optional[float]                  # remaining / bucket, 0..1
    exhaustion_seconds: float               # at the current rate; +Inf when not draining (or no bucket)
    refill_seconds: float                   # seconds to full at the current rate; +Inf when not refilling
    shaped: bool = False                    # shaping signal rose during the last interval
    exhausted: bool = False                 # the shaper holds us at the baseline now (with evidence)
    learned_count: int = 0
    learn_method: str = "none"              # none | exhaustion | unshaped_overrun
    bucket_source: str = "none"
    # At the net spend rate over the last forecast_window (the slope of bytes - baseline x time, bursts and
    # pauses together); +Inf when not draining (resp. not refilling) or there is no bucket.
    exhaustion_trend_seconds: float = INF
    refill_trend_seconds: float = INF


@dataclass
class Bucket:
    """One direction's state. `deficit` is the only figure that has to survive a restart."""

    bucket: float
    baseline: float                         # bytes per second
    deficit: float = 0.0                    # bytes above baseline since last full; 0 = full
    exhausted: bool = False
    learned_count: int = 0
    learn_method: str = "none"
    bucket_source: str = "default"
    overrun: bool = False                   # in an unshaped-overrun episode (bucket growing)
    forecast_window: float = DEFAULT_FORECAST_WINDOW
    # Evidence state (not persisted: a restart starts from the restored deficit as its own high-water mark).
    deficit_peak: float = 0.0               # highest deficit since the bucket was last full
    at_baseline_samples: int = 0            # consecutive samples shaped near the baseline
    run_start_deficit: float = 0.0          # the deficit when that run began
    run_seconds: float = 0.0                # and how long it has lasted
    unexplained_samples: int = 0            # shaped-near-baseline samples the history could not explain
    held_deficit: float = 0.0               # while exhausted: the deficit left free (not pinned to the bucket)
    held_peak: float = 0.0                  # its highest value since the exhaustion began
    held_peak_clock: float = 0.0            # and when
    clock: float = 0.0                      # seconds of samples seen (the trend's time axis)
    net: float = 0.0                        # bytes - baseline * seconds, unclamped: the trend's values
    trend: SpendTrend = field(init=False, repr=False)
    # (clock, predicted empty moment) of the recent samples whose trend forecast was a finite drain
    moments: deque = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.trend = SpendTrend(self.forecast_window)
        self.moments = deque()

    def remaining(self) -> float:
        return min(self.bucket, max(0.0, self.bucket - self.deficit))

    def _learn(self, size: float, method: str) -> bool:
        if size < EXHAUSTION_EVIDENCE_FRACTION * self.bucket:
            return False  # never reached through the evidence rule; a guard for callers that bypass it
        if self.learned_count == 0 or method == "unshaped_overrun":
            self.bucket = size
        else:
            self.bucket += LEARN_WEIGHT_AFTER_FIRST * (size - self.bucket)
        self.learn_method = method
        self.bucket_source = "learned"
        return True

    def explained(self) -> bool:
        """Whether the current run of shaping near the baseline is an exhaustion (the evidence rule)."""
        if self.deficit < EXHAUSTION_EVIDENCE_FRACTION * self.bucket:
            return False
        if self.deficit < self.deficit_peak - HIGH_WATER_TOLERANCE * self.bucket:
            return False
        if self.remaining() > AGREEMENT * self.bucket and self.run_seconds > 0:
            net = (self.deficit - self.run_start_deficit) / self.run_seconds
            if net < -CLAMP_RATE_SLACK * self.baseline:
                return False
        return True

    def _released(self, net_bytes: float) -> bool:
        """While exhausted the deficit is pinned to the bucket (a clamp holds the rate at the baseline, and
        the pin absorbs a baseline a little off). The free deficit checks that the traffic still looks held:
        once it has earned HIGH_WATER_TOLERANCE of the bucket at a rate clearly under the baseline (rule 3's
        slack) since its last high point, the bucket is refilling under bursty traffic, not held empty."""
        self.held_deficit = min(self.bucket, self.held_deficit + net_bytes)
        if self.held_deficit >= self.held_peak:
            self.held_peak, self.held_peak_clock = self.held_deficit, self.clock
            return False
        earned = self.held_peak - self.held_deficit
        seconds = self.clock - self.held_peak_clock
        return (earned >= HIGH_WATER_TOLERANCE * self.bucket and seconds > 0
                and earned / seconds > CLAMP_RATE_SLACK * self.baseline)

    def step(self, dt: float, nbytes: float, rate: float, shaped: Optional[bool], learn: bool = True) -> None:
        """Account one interval: `nbytes` crossed in `dt` s; `shaped` is None without a shaping source.
        With `learn` off an observed exhaustion still empties the bucket, but its size never changes."""
        self.clock += dt
        before = self.deficit
        self.deficit = max(0.0, self.deficit + nbytes - self.baseline * dt)
        if self.deficit <= 0.0:
            self.deficit_peak = 0.0         # full again: the next drain starts its own history
        self.deficit_peak = max(self.deficit_peak, self.deficit)
        near_baseline = NEAR_BASELINE_LOW * self.baseline <= rate <= NEAR_BASELINE_HIGH * self.baseline
        if shaped and near_baseline:
            if self.at_baseline_samples == 0:
                self.run_start_deficit, self.run_seconds = before, 0.0
            self.at_baseline_samples += 1
            self.run_seconds += dt
        else:
            self.at_baseline_samples = 0
        was_exhausted = self.exhausted
        if self.at_baseline_samples < EXHAUSTION_CONFIRM_SAMPLES:
            self.exhausted = False
        elif not was_exhausted:
            self.exhausted = self.explained()
            if not self.exhausted:
                # Peak or microburst shaping: counted by the shaping counter, never emptying or teaching.
                self.unexplained_samples += 1
        elif self._released(nbytes - self.baseline * dt):
            self.exhausted = False
            self.deficit = self.held_deficit
        if self.exhausted and not was_exhausted:
            # A real exhaustion: the bucket is the deficit right now. Learn if the model disagrees.
            if learn and (self.remaining() > AGREEMENT * self.bucket or self.overrun):
                # An overrun episode was already counted when it began: its exhaustion only settles it.
                if self._learn(self.deficit, "exhaustion") and not self.overrun:
                    self.learned_count += 1
            self.overrun = False
            self.held_deficit = self.held_peak = self.bucket
            self.held_peak_clock = self.clock
        if self.exhausted:
            self.deficit = self.bucket
        elif self.deficit > self.bucket:
            if learn and shaped is not None and rate > NEAR_BASELINE_HIGH * self.baseline:
                # Running above the baseline with an empty model bucket: the real bucket is larger (an
                # empty one would hold the rate at the baseline; shaping at the peak is ordinary burst
                # behaviour). Past the agreement margin, grow it as a lower bound; the exhaustion that
                # ends the episode fixes it. Within the margin keep the deficit as it is, unlearned.
                if self.overrun or self.deficit > (1.0 + AGREEMENT) * self.bucket:
                    if not self.overrun:
                        self.learned_count += 1
                    self.overrun = True
                    self._learn(self.deficit, "unshaped_overrun")
            else:
                self.deficit = self.bucket
        self.deficit_peak = min(self.deficit_peak, self.bucket)  # a clamp or a learned size caps it too
        # The trend fits the net spend (bytes above the baseline, unclamped): the deficit itself is clamped
        # at full and pinned while exhausted, which would bend its slope where the traffic did not change.
        self.net += nbytes - self.baseline * dt
        self.trend.add(self.clock, self.net)

    def reset_history(self) -> None:
        """The deficit was set from outside (restore, gap, new profile): start its evidence and trend anew."""
        self.deficit_peak = self.deficit
        self.at_baseline_samples = 0
        self.net = 0.0
        self.trend.reset()
        self.moments.clear()

    def reading(self, direction: str, rate: float, shaped: bool) -> CreditReading:
        remaining = self.remaining()
        drain = rate - self.baseline
        if self.exhausted or remaining <= 0:
            exhaustion = 0.0 if drain >= 0 else INF
        else:
            exhaustion = remaining / drain if drain > 0 else INF
        missing = self.bucket - remaining
        if missing <= 0:
            refill = 0.0
        else:
            refill = missing / -drain if drain < 0 else INF
        trend_exhaustion, trend_refill = self.trend_forecasts(remaining, missing)
        return CreditReading(direction, rate, remaining, self.bucket,
                             remaining / self.bucket if self.bucket > 0 else None,
                             exhaustion, refill, shaped, self.exhausted, self.learned_count,
                             self.learn_method, self.bucket_source, trend_exhaustion, trend_refill)

    def _smoothed(self, exhaustion: float) -> float:
        """The sooner of `exhaustion` and the median of the empty moments predicted over the last
        MOMENT_SMOOTHING_FRACTION of the window, as seconds from now; 0 and +Inf pass through and start
        it anew. O(entries in the span), at most about TREND_MAX_POINTS."""
        if exhaustion <= 0.0 or math.isinf(exhaustion):
            self.moments.clear()
            return exhaustion
        span = MOMENT_SMOOTHING_FRACTION * self.forecast_window
        # At most about TREND_MAX_POINTS in the span, at any sampling rate and window: a sample within the
        # newest entry's slot replaces it (the slot keeps the time it opened).
        opened = self.moments[-1][0] if self.moments else -INF
        if self.clock - opened < span / TREND_MAX_POINTS:
            self.moments[-1] = (opened, self.clock + exhaustion)
        else:
            self.moments.append((self.clock, self.clock + exhaustion))
        while len(self.moments) > 1 and self.moments[0][0] < self.clock - span - 1e-9:
            self.moments.popleft()
        moments = sorted(m for _, m in self.moments)
        mid = len(moments) // 2
        median = moments[mid] if len(moments) % 2 else (moments[mid - 1] + moments[mid]) / 2
        return max(0.0, min(exhaustion, median - self.clock))

    def trend_forecasts(self, remaining: float, missing: float) -> tuple[float, float]:
        """(seconds to empty, seconds to full) at the net spend rate over the forecast window."""
        slope = self.trend.slope()
        flat = TREND_FLAT_FRACTION * self.baseline
        if slope is None:
            slope = 0.0
        if self.exhausted:
            exhaustion = 0.0
        elif remaining <= 0:
            # Empty without a confirmed clamp (no shaping source): empty while the traffic is not clearly
            # under the baseline (rule 3's slack keeps the figure from flipping on a rate a hair under it).
            exhaustion = 0.0 if slope >= -CLAMP_RATE_SLACK * self.baseline else INF
        else:
            # Between the fitted line's crossing and the burst tops' (EXCURSION_WEIGHT); a steady drain has no
            # excursion, and this is remaining / slope. 0: a burst like the recent ones would empty it.
            exhaustion = (max(0.0, remaining - EXCURSION_WEIGHT * self.trend.excursion(slope)) / slope
                          if slope > flat else INF)
        exhaustion = self._smoothed(exhaustion)
        if missing <= 0:
            refill = 0.0
        else:
            refill = missing / -slope if slope < -flat else INF
        return exhaustion, refill


@dataclass
class CreditEstimator:
    """Both directions' buckets, fed by the sampler every interval (cheap enough for 0.1 s)."""

    baseline: Optional[float]               # bytes per second
    bucket: Optional[float]                 # bytes; None = no bucket (never exhausts)
    bucket_source: str = "default"
    learn: bool = True
    buckets: dict[str, Bucket] = field(default_factory=dict)
    forecast_window: float = DEFAULT_FORECAST_WINDOW   # seconds ([credits] forecast_window)

    def __post_init__(self) -> None:
        if self.active:
            assert self.baseline is not None and self.bucket is not None
            for d in DIRECTIONS:
                self.buckets[d] = Bucket(self.bucket, self.baseline, bucket_source=self.bucket_source,
                                         forecast_window=self.forecast_window)

    @property
    def active(self) -> bool:
        return bool(self.baseline and self.bucket and self.bucket > 0)

    def set_forecast_window(self, seconds: float) -> None:
        """A new [credits] forecast_window (reload): applies from the next sample, history kept."""
        self.forecast_window = seconds
        for b in self.buckets.values():
            b.forecast_window = seconds
            b.trend.set_window(seconds)

    def update(self, dt: float, nbytes: dict[str, float], rates: dict[str, float],
               shaping_delta: Optional[dict[str, int]]) -> dict[str, CreditReading]:
        out = {}
        for d in DIRECTIONS:
            rate = rates.get(d, 0.0)
            shaped = None if shaping_delta is None or d not in shaping_delta else shaping_delta[d] > 0
            b = self.buckets.get(d)
            if b is None:
                out[d] = CreditReading(d, rate, None, None, None, INF, INF, bool(shaped))
                continue
            if dt > 0:
                b.step(dt, nbytes.get(d, 0.0), rate, shaped, self.learn)
            out[d] = b.reading(d, rate, bool(shaped))
        return out

    def account_gap(self, seconds: float, nbytes: dict[str, Optional[float]], peak: Optional[float] = None) -> None:
        """Fold in a period the agent did not watch (a restart within the same boot): the kernel's
        counters tell what crossed, the clock tells what the baseline earned, and where the bytes' timing is
        unknown the accounting errs towards fewer credits (gap_deficit: refill first, bytes last at `peak`,
        bytes per second). Clamped like a sample."""
        for d, b in self.buckets.items():
            moved = nbytes.get(d)
            if moved is None:
                continue  # counters unusable (interface re-created): keep the saved deficit
            b.deficit = min(b.bucket, gap_deficit(b.deficit, seconds, moved, b.baseline, peak))
            b.reset_history()

    def movement(self, saved: dict[str, Any]) -> float:
        """How far the estimate has moved since `saved` (an earlier to_state()): the largest change of any
        direction's deficit or bucket, as a share of its bucket (inf when a direction is missing from it)."""
        out = 0.0
        for d, b in self.buckets.items():
            s = saved.get(d)
            if not isinstance(s, dict) or b.bucket <= 0:
                return INF
            out = max(out, abs(b.deficit - float(s.get("deficit", 0.0))) / b.bucket,
                      abs(b.bucket - float(s.get("bucket", b.bucket))) / b.bucket)
        return out

    # -- persistence (pure: dicts in and out; the state store does the file I/O) ----------------
    def to_state(self) -> dict[str, Any]:
        return {d: {"deficit": b.deficit, "bucket": b.bucket, "learned_count": b.learned_count,
                    "learn_method": b.learn_method, "bucket_source": b.bucket_source}
                for d, b in self.buckets.items()}

    def restore(self, state: dict[str, Any], bucket_too: bool = True) -> None:
        for d, b in self.buckets.items():
            s = state.get(d)
            if not isinstance(s, dict):
                continue
            if bucket_too and s.get("bucket_source") == "learned":
                b.bucket = float(s["bucket"])
                b.bucket_source = "learned"
                b.learn_method = str(s.get("learn_method", "exhaustion"))
                b.learned_count = int(s.get("learned_count", 0))
            b.deficit = min(b.bucket, max(0.0, float(s.get("deficit", 0.0))))
            b.reset_history()

    def learned_buckets(self) -> dict[str, dict[str, Any]]:
        """Per direction learned size and how, for the per-instance-type store."""
        return {d: {"bucket": b.bucket, "learned_count": b.learned_count, "learn_method": b.learn_method}
                for d, b in self.buckets.items() if b.bucket_source == "learned"}
