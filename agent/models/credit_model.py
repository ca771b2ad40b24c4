"""The burst-credit token bucket per direction: estimate, forecast, learn (pure; no I/O).

The model tracks the *deficit* D: bytes spent above the baseline since the bucket was last full
(D = max(0, D + bytes - baseline * dt)). The deficit does not depend on the bucket size, so when
the shaper reveals a real exhaustion the bucket is D at that moment, whatever size the model
assumed: that is how it learns. Remaining credit = bucket - D, clamped to 0 .. bucket.
Facts behind it (shared/ec2-network-facts.md): separate buckets in and out; credits are full at
launch and earned below the baseline; one Gbit of credit = 1 Gbit/s for 1 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

INF = math.inf
DIRECTIONS = ("in", "out")

# A shaped interval is "at the baseline" (bucket empty) when the rate sits in this band around the
# baseline; shaping well above it is shaping at the peak or best-effort burst, which ENA also counts
# (ec2-network-facts.md: "a rising counter alone does not mean exhaustion").
NEAR_BASELINE_LOW = 0.8
NEAR_BASELINE_HIGH = 1.25
# Shaping at the baseline must last this long before it counts as an exhaustion (one stray shaped
# sample during a ramp-down is not proof).
EXHAUSTION_CONFIRM_SECONDS = 1.0
# The model agrees with an observed exhaustion when it holds less than this share of the bucket.
AGREEMENT = 0.05
# Learned sizes below this share of the prior are rejected: they come from a wrong "full" anchor
# (e.g. a reboot that kept its credits), not from the shaper.
MIN_LEARN_FRACTION = 0.1
# Later learnings move the bucket half-way, so one odd exhaustion cannot swing it wildly.
LEARN_WEIGHT_AFTER_FIRST = 0.5


@dataclass(frozen=True)
class CreditReading:
    """One direction's credit figures after a sample; what exporters render (never recompute)."""

    direction: str                          # "in" | "out"
    rate_bytes_per_second: float            # measured rate the estimate uses
    remaining_bytes: Optional[float]        # None: no bucket (never exhausts) or profile unknown
    bucket_bytes: Optional[float]
    ratio: Optional[float]                  # remaining / bucket, 0..1
    exhaustion_seconds: float               # +Inf when not draining (or no bucket)
    refill_seconds: float                   # seconds to full at the current rate; +Inf when not refilling
    shaped: bool = False                    # shaping signal rose during the last interval
    exhausted: bool = False                 # the shaper holds us at the baseline now
    learned_count: int = 0
    learn_method: str = "none"              # none | exhaustion | unshaped_overrun
    bucket_source: str = "none"


@dataclass
class Bucket:
    """One direction's state. `deficit` is the only figure that has to survive a restart."""

    bucket: float
    baseline: float                         # bytes per second
    deficit: float = 0.0                    # bytes above baseline since last full; 0 = full
    shaped_at_baseline_for: float = 0.0     # seconds of consecutive shaping near the baseline
    exhausted: bool = False
    learned_count: int = 0
    learn_method: str = "none"
    bucket_source: str = "default"
    overrun: bool = False                   # in an unshaped-overrun episode (bucket growing)

    def remaining(self) -> float:
        return min(self.bucket, max(0.0, self.bucket - self.deficit))

    def _learn(self, size: float, method: str) -> bool:
        if size < MIN_LEARN_FRACTION * self.bucket:
            return False
        if self.learned_count == 0 or method == "unshaped_overrun":
            self.bucket = size
        else:
            self.bucket += LEARN_WEIGHT_AFTER_FIRST * (size - self.bucket)
        self.learn_method = method
        self.bucket_source = "learned"
        return True

    def step(self, dt: float, nbytes: float, rate: float, shaped: Optional[bool], learn: bool = True) -> None:
        """Account one interval: `nbytes` crossed in `dt` s; `shaped` is None without a shaping source.
        With `learn` off an observed exhaustion still empties the bucket, but its size never changes."""
        self.deficit = max(0.0, self.deficit + nbytes - self.baseline * dt)
        near_baseline = NEAR_BASELINE_LOW * self.baseline <= rate <= NEAR_BASELINE_HIGH * self.baseline
        if shaped and near_baseline:
            self.shaped_at_baseline_for += dt
        else:
            self.shaped_at_baseline_for = 0.0
        was_exhausted = self.exhausted
        self.exhausted = self.shaped_at_baseline_for >= EXHAUSTION_CONFIRM_SECONDS - 1e-9
        if self.exhausted and not was_exhausted:
            # A real exhaustion: the bucket is the deficit right now. Learn if the model disagrees.
            if learn and (self.remaining() > AGREEMENT * self.bucket or self.overrun):
                # An overrun episode was already counted when it began: its exhaustion only settles it.
                if self._learn(self.deficit, "exhaustion") and not self.overrun:
                    self.learned_count += 1
            self.overrun = False
        if self.exhausted:
            self.deficit = self.bucket
            return
        if self.deficit > self.bucket:
            if learn and shaped is False and rate > NEAR_BASELINE_HIGH * self.baseline:
                # Running above the baseline, unshaped, with an empty model bucket: the real bucket is
                # larger. Grow it as a lower bound; the exhaustion that ends the episode fixes it.
                if not self.overrun:
                    self.learned_count += 1
                self.overrun = True
                self._learn(self.deficit, "unshaped_overrun")
            else:
                self.deficit = self.bucket

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
        return CreditReading(direction, rate, remaining, self.bucket,
                             remaining / self.bucket if self.bucket > 0 else None,
                             exhaustion, refill, shaped, self.exhausted, self.learned_count,
                             self.learn_method, self.bucket_source)


@dataclass
class CreditEstimator:
    """Both directions' buckets, fed by the sampler every interval (cheap enough for 0.1 s)."""

    baseline: Optional[float]               # bytes per second
    bucket: Optional[float]                 # bytes; None = no bucket (never exhausts)
    bucket_source: str = "default"
    learn: bool = True
    buckets: dict[str, Bucket] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.active:
            assert self.baseline is not None and self.bucket is not None
            for d in DIRECTIONS:
                self.buckets[d] = Bucket(self.bucket, self.baseline, bucket_source=self.bucket_source)

    @property
    def active(self) -> bool:
        return bool(self.baseline and self.bucket and self.bucket > 0)

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

    def account_gap(self, seconds: float, nbytes: dict[str, Optional[float]]) -> None:
        """Fold in a period the agent did not watch (a restart within the same boot): the kernel's
        counters tell what crossed, the clock tells what the baseline earned. Clamped like a sample."""
        for d, b in self.buckets.items():
            moved = nbytes.get(d)
            if moved is None:
                continue  # counters unusable (interface re-created): keep the saved deficit
            b.deficit = min(b.bucket, max(0.0, b.deficit + moved - b.baseline * max(0.0, seconds)))

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

    def learned_buckets(self) -> dict[str, dict[str, Any]]:
        """Per direction learned size and how, for the per-instance-type store."""
        return {d: {"bucket": b.bucket, "learned_count": b.learned_count, "learn_method": b.learn_method}
                for d, b in self.buckets.items() if b.bucket_source == "learned"}
