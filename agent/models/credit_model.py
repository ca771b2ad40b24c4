"""The burst-credit token bucket per direction: estimate, forecast, learn (pure; docs/credits.md)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Optional

from agent.models.credit_band import BucketBand, band_forecast
from agent.models.credit_evidence import (
    AGREEMENT,
    EXHAUSTION_EVIDENCE_FRACTION,
    NEAR_BASELINE_HIGH,
    DrainHistory,
    EvidenceVerdict,
    HeldClamp,
    near_baseline,
)
from agent.models.credit_trend import DEFAULT_FORECAST_WINDOW, TrendForecast
from agent.models.profile import DEFAULT_BUCKET_SECONDS, BandwidthProfile
from agent.models.units import DIRECTIONS

if TYPE_CHECKING:
    from agent.config import CreditsConfig

INF = math.inf
log = logging.getLogger(__name__)

# Later learnings move the bucket half-way, so one odd exhaustion cannot swing it (docs/credits.md,
# "Learning the bucket").
LEARN_WEIGHT_AFTER_FIRST = 0.5
# The state is saved whenever an estimate has moved by this share of its bucket, which bounds what a crash
# can cost at any time scale (docs/credits.md, "Persistence").
SAVE_MOVEMENT_FRACTION = 0.01
# The band's early side reads the trend once the drain is this many forecast windows old: within two, one
# burst from a full bucket is still in the trend's window, and traffic averaging under the baseline would
# hold the low bucket's forecast under the early horizon after each burst (docs/alerting.md, "The trade").
TREND_READY_WINDOWS = 2.0


def gap_deficit(deficit: float, seconds: float, moved: float, baseline: float, peak: Optional[float]) -> float:
    """The deficit after a gap of `seconds` in which `moved` bytes crossed at unknown moments (unclamped
    above; never below 0), taken in the order that leaves the fewest credits: the refill first, capped at a
    full bucket, the bytes last at the peak (docs/credits.md, "Persistence"). Without a peak the bytes are
    spread over the whole gap.

        t = min(G, M / peak);  D = max(0, D0 - baseline x (G - t)) + M - baseline x t"""
    seconds = max(0.0, seconds)
    moved = max(0.0, moved)
    t = min(seconds, moved / peak) if peak is not None and peak > 0 else seconds
    return max(0.0, max(0.0, deficit - baseline * (seconds - t)) + moved - baseline * t)


class CreditState(str, Enum):
    """Where a direction's bucket is after a sample (docs/credits.md, "States and transitions")."""

    FULL = "full"               # deficit 0: the next drain starts its own evidence history
    PARTIAL = "partial"         # partly spent: the deficit follows the traffic, up or down
    EMPTY = "empty"             # spent in the model, no shaper says so: the deficit stops at the bucket
    OVERRUN = "overrun"         # spent in the model, traffic still above the band: the real bucket is larger
    EXHAUSTED = "exhausted"     # the shaper holds the rate at the baseline, with evidence: deficit = bucket


class Transition(str, Enum):
    """How a sample moves a bucket into, through or out of an exhaustion."""

    FREE = "free"               # no confirmed run of shaping near the baseline
    UNEXPLAINED = "unexplained"  # a confirmed run the history cannot explain: peak or microburst shaping
    CONFIRMED = "confirmed"     # a confirmed run with evidence: exhausted; learned if the model disagrees
    HELD = "held"               # still exhausted
    RELEASED = "released"       # the traffic left free has earned credit: the bucket refills underneath
    RUN_ENDED = "run_ended"     # the run of shaping near the baseline ended


def transition(exhausted: bool, confirmed: bool, explained: bool, released: bool) -> Transition:
    """The sample's transition: `exhausted` before it; `confirmed`, a run of EXHAUSTION_CONFIRM_SAMPLES
    shaped near the baseline; `explained`, the evidence rule's verdict on it (read when not exhausted);
    `released`, the held clamp's (read when exhausted)."""
    if not confirmed:
        return Transition.RUN_ENDED if exhausted else Transition.FREE
    if exhausted:
        return Transition.RELEASED if released else Transition.HELD
    return Transition.CONFIRMED if explained else Transition.UNEXPLAINED


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
    state: str = "none"                     # a CreditState value; "none" without a bucket
    # The bucket as a band (docs/credits.md, "The bucket as a band"): its low and high sizes, where they come
    # from (default, fleet, config, learned) and how many exhaustions stand behind them; the remaining credit
    # at each end as a share of that end; and the forecast band: earliest with the low bucket and the sooner
    # pace, latest with the high bucket (+Inf while a pause may never end).
    bucket_low_bytes: Optional[float] = None
    bucket_high_bytes: Optional[float] = None
    band_source: str = "none"
    band_observations: int = 0
    remaining_low_ratio: Optional[float] = None
    remaining_high_ratio: Optional[float] = None
    exhaustion_earliest_seconds: float = INF
    exhaustion_latest_seconds: float = INF
    contradictions: int = 0                 # exhaustions that contradicted a configured bucket
    # The bucket drains now: at the current rate, or at the trend once the drain is a forecast window old
    # (within it one burst from a full bucket fills the trend's window). What the page waits for.
    draining: bool = False


@dataclass
class BucketLearner:
    """How the bucket's size was learned (docs/credits.md, "Learning the bucket")."""

    learned_count: int = 0
    learn_method: str = "none"
    bucket_source: str = "default"
    overrun: bool = False                   # an overrun episode is open: the bucket grows until an exhaustion

    def _learn(self, bucket: float, size: float, method: str) -> Optional[float]:
        """The bucket after learning `size` by `method`; None when the size is refused."""
        if size < EXHAUSTION_EVIDENCE_FRACTION * bucket:
            return None  # never reached through the evidence rule; a guard for callers that bypass it
        self.learn_method = method
        self.bucket_source = "learned"
        if self.learned_count == 0 or method == "unshaped_overrun":
            return size
        return bucket + LEARN_WEIGHT_AFTER_FIRST * (size - bucket)

    def at_exhaustion(self, bucket: float, deficit: float, remaining: float, learn: bool) -> float:
        """The bucket after a real exhaustion at `deficit`: that deficit, when the model disagreed (it held
        more than AGREEMENT of its bucket) or an overrun episode was open; the episode closes."""
        if learn and (remaining > AGREEMENT * bucket or self.overrun):
            learned = self._learn(bucket, deficit, "exhaustion")
            if learned is not None:
                bucket = learned
                if not self.overrun:    # an overrun episode was counted when it began
                    self.learned_count += 1
        self.overrun = False
        return bucket

    def at_overrun(self, bucket: float, deficit: float) -> float:
        """The bucket while the model is spent and the traffic runs above the band: past the AGREEMENT margin
        (or within an open episode) the deficit, a lower bound; within the margin unchanged."""
        if self.overrun or deficit > (1.0 + AGREEMENT) * bucket:
            if not self.overrun:
                self.learned_count += 1
            self.overrun = True
            learned = self._learn(bucket, deficit, "unshaped_overrun")
            return bucket if learned is None else learned
        return bucket


@dataclass
class Bucket:
    """One direction's bucket: its level (the deficit), state, exhaustion evidence, learner and trend.
    `deficit` is the only figure that has to survive a restart."""

    bucket: float                           # bytes
    baseline: float                         # bytes per second
    deficit: float = 0.0                    # bytes above baseline since last full; 0 = full
    state: CreditState = CreditState.FULL
    evidence: DrainHistory = field(default_factory=DrainHistory)
    hold: HeldClamp = field(default_factory=HeldClamp)      # read while EXHAUSTED
    learner: BucketLearner = field(default_factory=BucketLearner)
    forecast: TrendForecast = field(default_factory=TrendForecast)
    sizes: BucketBand = field(default_factory=BucketBand)
    burst_pace: float = 0.0                 # the fastest net rate (bytes/s) since the bucket was last full

    @property
    def exhausted(self) -> bool:
        return self.state is CreditState.EXHAUSTED

    def remaining(self) -> float:
        return min(self.bucket, max(0.0, self.bucket - self.deficit))

    def advance(self, dt: float, nbytes: float, rate: float, shaped: Optional[bool], learn: bool = True) -> Transition:
        """Account one interval: `nbytes` crossed in `dt` s; `shaped` is None without a shaping source.
        With `learn` off an observed exhaustion still empties the bucket, but its size never changes."""
        net = nbytes - self.baseline * dt
        self.forecast.advance(dt, net, self.baseline)
        before = self.deficit
        self.deficit = max(0.0, self.deficit + nbytes - self.baseline * dt)
        self.evidence.observe(before, self.deficit, dt, bool(shaped) and near_baseline(rate, self.baseline))
        verdict = self.evidence.evidence(self.bucket, self.baseline, self.deficit).verdict()
        released = self.exhausted and self.hold.released(net, self.forecast.clock, self.bucket, self.baseline)
        move = transition(self.exhausted, self.evidence.confirmed, verdict is EvidenceVerdict.EXHAUSTED, released)
        if move is Transition.CONFIRMED:
            # A real exhaustion: the bucket is the deficit right now, one more observation of its size.
            if self.sizes.observe(self.deficit, self.bucket, self.learner.bucket_source):
                log.warning("bucket exhausted at %.0f Gbit, the configured burst_bucket_gbit is %.0f: the "
                            "configured size is kept (credits.trust_configured_bucket)",
                            self.deficit * 8 / 1e9, self.bucket * 8 / 1e9)
            self.bucket = self.learner.at_exhaustion(self.bucket, self.deficit, self.remaining(), learn)
            self.hold.start(self.bucket, self.forecast.clock)
        elif move is Transition.RELEASED:
            self.deficit = self.hold.free_deficit
        if move in (Transition.CONFIRMED, Transition.HELD):
            self.state, self.deficit = CreditState.EXHAUSTED, self.bucket
        else:
            self.state = self._settle(rate, shaped, learn)
        self.evidence.cap(self.bucket)
        self.forecast.note_level(self.deficit, self.bucket)
        self.burst_pace = 0.0 if self.deficit <= 0.0 else max(self.burst_pace, rate - self.baseline)
        return move

    def _settle(self, rate: float, shaped: Optional[bool], learn: bool) -> CreditState:
        """Where a free deficit lands. Past the bucket it stops there, unless the traffic runs above the band
        with a shaping source to say so: an empty real bucket would hold it at the baseline, so the real
        bucket is larger (docs/credits.md, "Learning the bucket"). A pause within an overrun refills from the
        deficit the overrun showed: clamping it there would start every burst of a cyclic drain from the
        model's bucket, so its overrun never passed the margin and the real exhaustion confirmed the old size."""
        if self.deficit > self.bucket:
            if learn and shaped is not None and rate > NEAR_BASELINE_HIGH * self.baseline:
                self.bucket = self.learner.at_overrun(self.bucket, self.deficit)
                return CreditState.OVERRUN
            if self.state is CreditState.OVERRUN and rate <= self.baseline:
                return CreditState.OVERRUN
            self.deficit = self.bucket
        return self._level()

    def _level(self) -> CreditState:
        if self.deficit <= 0.0:
            return CreditState.FULL
        return CreditState.PARTIAL if self.deficit < self.bucket else CreditState.EMPTY

    def reset_history(self) -> None:
        """The deficit was set from outside (restore, gap, new profile): start its evidence and trend anew."""
        self.evidence.restart(self.deficit)
        self.forecast.restart()
        if not self.exhausted:
            self.state = self._level()

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
        trend_exhaustion, trend_refill = self.forecast.forecasts(self.baseline, remaining, missing, self.exhausted)
        learner = self.learner
        band = self.sizes.band(self.bucket, DEFAULT_BUCKET_SECONDS * self.baseline, learner.bucket_source,
                               learner.learn_method == "unshaped_overrun")
        low_ratio, high_ratio = band.ratios(self.deficit)
        ready = self.forecast.clock - self.forecast.drain_start >= TREND_READY_WINDOWS * self.forecast.window
        earliest, latest = band_forecast(band, self.deficit, remaining, exhaustion, trend_exhaustion,
                                         self.burst_pace, self.forecast.drain_pace(self.deficit),
                                         self.forecast.cycle() is not None, self.exhausted, ready)
        draining = not self.exhausted and (math.isfinite(exhaustion) or (ready and math.isfinite(trend_exhaustion)))
        return CreditReading(direction, rate, remaining, self.bucket,
                             remaining / self.bucket if self.bucket > 0 else None, exhaustion, refill,
                             shaped=shaped, exhausted=self.exhausted, learned_count=learner.learned_count,
                             learn_method=learner.learn_method, bucket_source=learner.bucket_source,
                             exhaustion_trend_seconds=trend_exhaustion, refill_trend_seconds=trend_refill,
                             state=self.state.value, bucket_low_bytes=band.low, bucket_high_bytes=band.high,
                             band_source=band.source, band_observations=band.observations,
                             remaining_low_ratio=low_ratio, remaining_high_ratio=high_ratio,
                             exhaustion_earliest_seconds=earliest, exhaustion_latest_seconds=latest,
                             contradictions=self.sizes.contradictions, draining=draining)


@dataclass
class CreditEstimator:
    """Both directions' buckets, fed by the sampler every interval (cheap enough for 0.1 s)."""

    baseline: Optional[float]               # bytes per second
    bucket: Optional[float]                 # bytes; None = no bucket (never exhausts)
    bucket_source: str = "default"
    learn: bool = True
    buckets: dict[str, Bucket] = field(default_factory=dict)
    forecast_window: float = DEFAULT_FORECAST_WINDOW   # seconds ([credits] forecast_window)
    # the trend history of the last restore(), applied by account_gap() once the gap is known
    _saved_trends: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.active:
            assert self.baseline is not None and self.bucket is not None
            for d in DIRECTIONS:
                self.buckets[d] = Bucket(self.bucket, self.baseline,
                                         learner=BucketLearner(bucket_source=self.bucket_source),
                                         forecast=TrendForecast(self.forecast_window))

    @property
    def active(self) -> bool:
        return bool(self.baseline and self.bucket and self.bucket > 0)

    def set_fleet_spread(self, spread: Optional[tuple[float, float]]) -> None:
        """The fleet's smallest and largest size for this type (bytes), the band of a fleet belief."""
        for b in self.buckets.values():
            b.sizes.fleet = spread

    def set_forecast_window(self, seconds: float) -> None:
        """A new [credits] forecast_window (reload): applies from the next sample, history kept."""
        self.forecast_window = seconds
        for b in self.buckets.values():
            b.forecast.set_window(seconds)

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
                b.advance(dt, nbytes.get(d, 0.0), rate, shaped, self.learn)
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
            # The net spend is exact across the gap (the counters), so the trend goes on from its saved
            # history; only the gap's own shape is unknown (docs/credits.md, "Persistence").
            b.forecast.restore(self._saved_trends.pop(d, None), seconds, moved, b.baseline)

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
        return {d: {"deficit": b.deficit, "bucket": b.bucket, "learned_count": b.learner.learned_count,
                    "learn_method": b.learner.learn_method, "bucket_source": b.learner.bucket_source,
                    "trend": b.forecast.to_state(), "sizes": b.sizes.to_state()}
                for d, b in self.buckets.items()}

    def restore(self, state: dict[str, Any], bucket_too: bool = True) -> None:
        for d, b in self.buckets.items():
            s = state.get(d)
            if not isinstance(s, dict):
                continue
            if bucket_too and s.get("bucket_source") == "learned":
                b.bucket = float(s["bucket"])
                b.learner.bucket_source = "learned"
                b.learner.learn_method = str(s.get("learn_method", "exhaustion"))
                b.learner.learned_count = int(s.get("learned_count", 0))
            if "sizes" in s:                # older files have none: the band starts from the prior
                b.sizes.restore(s["sizes"])
            b.deficit = min(b.bucket, max(0.0, float(s.get("deficit", 0.0))))
            b.reset_history()
            self._saved_trends[d] = s.get("trend")

    def learned_buckets(self) -> dict[str, dict[str, Any]]:
        """Per direction learned size and how, and the exhaustion sizes seen, for the per-instance-type store:
        the directions that learned a size or saw an exhaustion."""
        return {d: {"bucket": b.bucket, "learned_count": b.learner.learned_count,
                    "learn_method": b.learner.learn_method, "sizes": b.sizes.to_state(),
                    "bucket_source": b.learner.bucket_source}
                for d, b in self.buckets.items() if b.learner.bucket_source == "learned" or b.sizes.observations}


def learnable(profile: BandwidthProfile, cfg: CreditsConfig) -> bool:
    """A configured bucket is fixed unless credits.trust_configured_bucket = false."""
    return cfg.learn and (profile.bucket_source != "config" or not cfg.trust_configured_bucket)


def estimator_for(profile: BandwidthProfile, cfg: CreditsConfig, fleet_spread: Optional[tuple[float, float]] = None,
                  learned: Optional[dict[str, dict[str, Any]]] = None) -> CreditEstimator:
    """The estimator for `profile` and [credits], built one way for the daemon (agent/sampling/credits.py) and
    `burstwatch replay` (agent/commands/replay.py): full buckets of the profile's belief with its prior band,
    the fleet's spread of the type's sizes (bytes) and the sizes learned for the type (learned-buckets.json
    entries by direction) when there are any and learning may use them."""
    can_learn = learnable(profile, cfg)
    if not profile.bursts:
        return CreditEstimator(profile.baseline_bytes_per_second, None, profile.bucket_source, learn=can_learn,
                               forecast_window=cfg.forecast_window)
    est = CreditEstimator(profile.baseline_bytes_per_second, profile.bucket_bytes, profile.bucket_source,
                          learn=can_learn, forecast_window=cfg.forecast_window)
    est.set_fleet_spread(fleet_spread)
    if learned and can_learn:
        est.restore({d: {"bucket_source": "learned", **v, "deficit": 0.0} for d, v in learned.items()})
    return est
