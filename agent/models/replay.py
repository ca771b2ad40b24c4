"""What `burstwatch replay` tells of a traffic history: time shaped, the lowest credit, the pages the shipped
rules would have sent and the size that would have held it (pure; docs/replay.md)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from agent.models.credit_model import CreditReading
from agent.models.units import DIRECTIONS

INF = math.inf

# The shipped rules (packaging/prometheus/burstwatch.rules.yml) in Python, the one form every replayed sample and
# the band's zoo (tests/support/credit_band_zoo.py) evaluate: the horizons, the ratio and each `for:` are the
# EC2 defaults there. tests/e2e/test_replay_openmetrics.py evaluates the file itself with a real Prometheus over
# the same figures and compares the pages.
RUNNING_OUT_HORIZON = 600.0     # BurstCreditsRunningOut: the point forecasts "< 600"
EARLY_HORIZON = 180.0           # and the band's early side "< 180" while draining
RUNNING_OUT_FOR = 60.0          # its `for: 1m`
LOW_RATIO = 0.2                 # BurstCreditsLow: (remaining_low_ratio or remaining_ratio) < 0.2
LOW_FOR = 120.0                 # its `for: 2m`
# "Sustained demand" is the highest mean rate over this long: one default bucket's worth of baseline
# (agent/models/profile.py DEFAULT_BUCKET_SECONDS), so anything shorter is a burst the bucket can carry.
SUSTAINED_WINDOW = 3600.0
# The model says the shaper holds the rate at the baseline in these states (agent/models/credit_model.py
# CreditState): "exhausted" with a shaping signal, "empty" without one.
SHAPED_STATES = ("exhausted", "empty")


def running_out_value(r: CreditReading) -> float:
    """The sooner point forecast, BurstCreditsRunningOut's `(exhaustion <= trend) or trend or exhaustion`
    before its "< 600"."""
    return min(r.exhaustion_seconds, r.exhaustion_trend_seconds)


def running_out_early(r: CreditReading) -> bool:
    """The rule's band side: `exhaustion_earliest_seconds < 180 and draining == 1`."""
    return r.draining and r.exhaustion_earliest_seconds < EARLY_HORIZON


def running_out(r: CreditReading) -> bool:
    """BurstCreditsRunningOut's whole expression: the band's early side or the sooner point forecast, while
    the bucket is not exhausted (`and burstwatch_credit_exhausted == 0`)."""
    return (running_out_early(r) or running_out_value(r) < RUNNING_OUT_HORIZON) and not r.exhausted


def running_out_point(r: CreditReading) -> bool:
    """The rule before the band (the point forecasts only): what the band's zoo compares against."""
    return running_out_value(r) < RUNNING_OUT_HORIZON and not r.exhausted


def low_ratio_value(r: CreditReading) -> Optional[float]:
    """BurstCreditsLow's `burstwatch_credit_remaining_low_ratio or burstwatch_credit_remaining_ratio`."""
    return r.remaining_low_ratio if r.remaining_low_ratio is not None else r.ratio


def credits_low(r: CreditReading) -> bool:
    v = low_ratio_value(r)
    return v is not None and v < LOW_RATIO


@dataclass
class AlertRule:
    """One alert over a replay, as Prometheus evaluates it: pending while its condition holds, firing once it
    has held `for_seconds`; each pending-to-firing transition is one page."""

    name: str
    for_seconds: float
    since: Optional[float] = None
    firing: bool = False
    pages: int = 0
    first: Optional[float] = None       # when it first fired (trace time)
    fired_at: list[float] = field(default_factory=list)

    def observe(self, t: float, active: bool) -> None:
        if not active:
            self.since, self.firing = None, False
            return
        if self.since is None:
            self.since = t
        if not self.firing and t - self.since >= self.for_seconds - 1e-9:
            self.firing = True
            self.pages += 1
            self.fired_at.append(t)
            if self.first is None:
                self.first = t


@dataclass
class DirectionSummary:
    """One direction of one type over the whole trace."""

    direction: str
    shaped_seconds: float = 0.0             # the model says the shaper held the rate at the baseline
    first_shaped: Optional[float] = None
    first_signal: Optional[float] = None    # the first interval whose shaping count rose (also at the peak)
    lowest_ratio: Optional[float] = None
    lowest_at: Optional[float] = None
    lowest_remaining_bytes: Optional[float] = None
    bucket_bytes: Optional[float] = None    # at the end (learning may have moved it)
    learned: int = 0
    running_out: AlertRule = field(default_factory=lambda: AlertRule("BurstCreditsRunningOut", RUNNING_OUT_FOR))
    low: AlertRule = field(default_factory=lambda: AlertRule("BurstCreditsLow", LOW_FOR))

    def observe(self, t: float, dt: float, r: CreditReading) -> None:
        if r.state in SHAPED_STATES:
            self.shaped_seconds += dt
            if self.first_shaped is None:
                self.first_shaped = t
        if r.shaped and self.first_signal is None:
            self.first_signal = t
        if r.ratio is not None and (self.lowest_ratio is None or r.ratio < self.lowest_ratio):
            self.lowest_ratio, self.lowest_at, self.lowest_remaining_bytes = r.ratio, t, r.remaining_bytes
        self.bucket_bytes = r.bucket_bytes
        self.learned = r.learned_count
        self.running_out.observe(t, running_out(r))
        self.low.observe(t, credits_low(r))

    def to_json(self) -> dict[str, Any]:
        return {"shaped_seconds": self.shaped_seconds, "first_shaped": self.first_shaped,
                "first_shaping_signal": self.first_signal,
                "lowest_ratio": self.lowest_ratio, "lowest_at": self.lowest_at,
                "lowest_remaining_bytes": self.lowest_remaining_bytes, "bucket_bytes": self.bucket_bytes,
                "learned": self.learned,
                "pages": {a.name: {"count": a.pages, "first": a.first, "at": a.fired_at}
                          for a in (self.running_out, self.low)}}


@dataclass(frozen=True)
class Candidate:
    """A size of the family: per-direction baseline and peak (bytes/s) and its default bucket (bytes)."""

    instance_type: str
    baseline: float
    peak: float
    bucket: Optional[float]                 # None: baseline = peak, nothing to run out of


@dataclass
class SizeFit:
    """The smallest size of a family that would have held the trace: its baseline covers the sustained
    demand (the highest mean over SUSTAINED_WINDOW, either direction) and its default bucket, replayed as a
    plain token bucket, never empties (docs/replay.md, "The summary")."""

    candidates: Sequence[Candidate]
    window: float = SUSTAINED_WINDOW
    deficits: list[list[float]] = field(init=False)
    emptied: list[bool] = field(init=False)
    _recent: deque[tuple[float, float, float]] = field(init=False, repr=False)    # (dt, in, out)
    _span: float = 0.0
    _sums: list[float] = field(init=False)
    _top: list[float] = field(init=False)            # the highest mean over a full window, bytes/s
    top_rate: list[float] = field(init=False)        # the highest one-interval rate per direction
    seconds: float = 0.0
    total: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.deficits = [[0.0, 0.0] for _ in self.candidates]
        self.emptied = [False] * len(self.candidates)
        self._recent = deque()
        self._sums = [0.0, 0.0]
        self._top = [0.0, 0.0]
        self.top_rate = [0.0, 0.0]
        self.total = [0.0, 0.0]

    def observe(self, dt: float, in_bytes: float, out_bytes: float) -> None:
        if dt <= 0:
            return
        self.seconds += dt
        nbytes = (in_bytes, out_bytes)
        for k in (0, 1):
            self.total[k] += nbytes[k]
            self.top_rate[k] = max(self.top_rate[k], nbytes[k] / dt)
        for i, c in enumerate(self.candidates):
            if self.emptied[i] or c.bucket is None:
                continue
            d = self.deficits[i]
            for k in (0, 1):
                d[k] = max(0.0, d[k] + nbytes[k] - c.baseline * dt)
                if d[k] >= c.bucket:
                    self.emptied[i] = True
        # the highest mean over the window: a running sum over the intervals that end within it
        self._recent.append((dt, in_bytes, out_bytes))
        self._span += dt
        self._sums[0] += in_bytes
        self._sums[1] += out_bytes
        while self._span - self._recent[0][0] >= self.window - 1e-9:
            odt, oin, oout = self._recent.popleft()
            self._span -= odt
            self._sums[0] -= oin
            self._sums[1] -= oout
        if self._span >= self.window - 1e-9:
            for k in (0, 1):
                self._top[k] = max(self._top[k], self._sums[k] / self._span)

    @property
    def sustained(self) -> list[float]:
        """Per direction (bytes/s): the highest mean over the window; the whole trace's on a shorter one."""
        if self.seconds >= self.window - 1e-9 or self.seconds <= 0:
            return list(self._top)
        return [v / self.seconds for v in self.total]

    def smallest(self) -> Optional[Candidate]:
        need = max(self.sustained)
        for i, c in enumerate(self.candidates):
            if c.baseline >= need and not self.emptied[i]:
                return c
        return None

    def to_json(self) -> dict[str, Any]:
        best = self.smallest()
        return {"sustained_bytes_per_second": dict(zip(DIRECTIONS, self.sustained)),
                "mean_bytes_per_second": {d: (self.total[k] / self.seconds if self.seconds else 0.0)
                                          for k, d in enumerate(DIRECTIONS)},
                "smallest_size": None if best is None else best.instance_type,
                "smallest_size_baseline_bytes_per_second": None if best is None else best.baseline}


@dataclass
class TypeSummary:
    """One --type's row of the summary."""

    instance_type: str
    baseline: Optional[float]
    peak: Optional[float]
    bucket: Optional[float]
    bucket_source: str
    directions: dict[str, DirectionSummary] = field(default_factory=dict)
    fit: Optional[SizeFit] = None
    seconds: float = 0.0

    def observe(self, t: float, dt: float, readings: dict[str, CreditReading]) -> None:
        self.seconds += dt
        for d, r in readings.items():
            s = self.directions.get(d)
            if s is None:
                s = self.directions[d] = DirectionSummary(d)
            s.observe(t, dt, r)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.instance_type, "baseline_bytes_per_second": self.baseline,
                "peak_bytes_per_second": self.peak, "bucket_bytes": self.bucket, "bucket_source": self.bucket_source,
                "seconds": self.seconds,
                "directions": {d: s.to_json() for d, s in sorted(self.directions.items())},
                "fit": self.fit.to_json() if self.fit is not None else None}
