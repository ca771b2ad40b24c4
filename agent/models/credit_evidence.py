"""The exhaustion evidence rule: when shaping near the baseline is a real exhaustion, and when it ends (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# Every threshold is a share of the bucket or of the baseline, or a count of samples, so the rule reads the
# same on EC2 and in the lab; why each has its value: docs/credits.md, "Exhaustion needs evidence".
NEAR_BASELINE_LOW = 0.8                 # a shaped rate within this band around the baseline is a candidate;
NEAR_BASELINE_HIGH = 1.25               # shaping above it is at the peak, which ENA counts too
EXHAUSTION_CONFIRM_SAMPLES = 3          # candidates in a row: one sample can straddle the end of a burst
EXHAUSTION_EVIDENCE_FRACTION = 0.25     # rule 1: the drain has spent at least this share of the bucket
HIGH_WATER_TOLERANCE = 0.01             # rule 2: how far under its high-water mark the deficit may be
CLAMP_RATE_SLACK = 0.05                 # rule 3: a clamp sends at the baseline within this share of it
AGREEMENT = 0.05                        # the model agrees with an exhaustion when it holds less than this


def near_baseline(rate: float, baseline: float) -> bool:
    """Whether a rate (bytes/s) sits in the band where a clamp at the baseline would put it."""
    return NEAR_BASELINE_LOW * baseline <= rate <= NEAR_BASELINE_HIGH * baseline


class EvidenceVerdict(str, Enum):
    """What the evidence rule says of a confirmed run of shaping near the baseline."""

    EXHAUSTED = "exhausted"                 # the history could have spent the bucket
    TOO_LITTLE_SPENT = "too_little_spent"   # rule 1: the drain spent under a quarter of the bucket
    BELOW_HIGH_WATER = "below_high_water"   # rule 2: the deficit fell from its peak, so credit is left
    EARNING = "earning"                     # rule 3: the model disagrees and the traffic earns credit


@dataclass(frozen=True)
class ExhaustionEvidence:
    """The evidence rule's inputs, all in bytes, bytes/s and seconds, and its verdict
    (docs/credits.md, "Exhaustion needs evidence")."""

    bucket: float                   # the model's bucket
    baseline: float
    deficit: float                  # spent above the baseline since the bucket was last full, now
    deficit_peak: float             # the highest deficit since the bucket was last full
    run_start_deficit: float        # the deficit when the run of shaping near the baseline began
    run_seconds: float              # how long that run has lasted

    @property
    def remaining(self) -> float:
        """What the model holds: bucket - deficit, clamped to 0 .. bucket."""
        return min(self.bucket, max(0.0, self.bucket - self.deficit))

    def verdict(self) -> EvidenceVerdict:
        if self.deficit < EXHAUSTION_EVIDENCE_FRACTION * self.bucket:
            return EvidenceVerdict.TOO_LITTLE_SPENT
        if self.deficit < self.deficit_peak - HIGH_WATER_TOLERANCE * self.bucket:
            return EvidenceVerdict.BELOW_HIGH_WATER
        # Rule 3 only when the exhaustion would teach the model a new size.
        if self.remaining > AGREEMENT * self.bucket and self.run_seconds > 0:
            net = (self.deficit - self.run_start_deficit) / self.run_seconds
            if net < -CLAMP_RATE_SLACK * self.baseline:
                return EvidenceVerdict.EARNING
        return EvidenceVerdict.EXHAUSTED


@dataclass
class DrainHistory:
    """What the evidence rule reads, kept sample by sample. Not persisted: a restart takes the restored deficit
    as its own high-water mark (docs/credits.md, "Persistence")."""

    deficit_peak: float = 0.0       # the highest deficit since the bucket was last full
    run_samples: int = 0            # consecutive samples shaped near the baseline
    run_start_deficit: float = 0.0  # the deficit when that run began
    run_seconds: float = 0.0        # how long it has lasted

    def observe(self, before: float, deficit: float, dt: float, candidate: bool) -> None:
        """One sample: the deficit went from `before` to `deficit` in `dt` s; `candidate`: shaped near the
        baseline."""
        if deficit <= 0.0:
            self.deficit_peak = 0.0     # full again: the next drain starts its own history
        self.deficit_peak = max(self.deficit_peak, deficit)
        if not candidate:
            self.run_samples = 0
            return
        if self.run_samples == 0:
            self.run_start_deficit, self.run_seconds = before, 0.0
        self.run_samples += 1
        self.run_seconds += dt

    @property
    def confirmed(self) -> bool:
        """The run has lasted EXHAUSTION_CONFIRM_SAMPLES: it is weighed as a possible exhaustion."""
        return self.run_samples >= EXHAUSTION_CONFIRM_SAMPLES

    def evidence(self, bucket: float, baseline: float, deficit: float) -> ExhaustionEvidence:
        return ExhaustionEvidence(bucket, baseline, deficit, self.deficit_peak, self.run_start_deficit,
                                  self.run_seconds)

    def cap(self, bucket: float) -> None:
        """A clamp or a learned size caps the high-water mark too."""
        self.deficit_peak = min(self.deficit_peak, bucket)

    def restart(self, deficit: float) -> None:
        """The deficit was set from outside (restore, gap, new profile): its history starts there."""
        self.deficit_peak = deficit
        self.run_samples = 0


@dataclass
class HeldClamp:
    """While exhausted the deficit is pinned to the bucket; this follows the deficit the traffic would leave
    free, to tell a clamp still holding from a bucket refilling under bursty traffic (docs/credits.md,
    "Exhaustion needs evidence", "While exhausted")."""

    free_deficit: float = 0.0
    peak: float = 0.0               # the free deficit's highest value since the exhaustion began
    peak_clock: float = 0.0         # and when (the bucket's clock, seconds of samples)

    def start(self, bucket: float, clock: float) -> None:
        self.free_deficit = self.peak = bucket
        self.peak_clock = clock

    def released(self, net_bytes: float, clock: float, bucket: float, baseline: float) -> bool:
        """Account `net_bytes` (bytes - baseline x dt) at `clock`: True once the free deficit has earned
        HIGH_WATER_TOLERANCE of the bucket, since its last high point, at a rate more than CLAMP_RATE_SLACK
        under the baseline."""
        self.free_deficit = min(bucket, self.free_deficit + net_bytes)
        if self.free_deficit >= self.peak:
            self.peak, self.peak_clock = self.free_deficit, clock
            return False
        earned = self.peak - self.free_deficit
        seconds = clock - self.peak_clock
        return (earned >= HIGH_WATER_TOLERANCE * bucket and seconds > 0
                and earned / seconds > CLAMP_RATE_SLACK * baseline)
