"""The credit trend forecast: the net spend's slope over a window that fits the traffic, its empty and full
moments, and its history across a restart (pure; docs/credits.md, "Two forecasts", "The window rule")."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from agent.models.credit_evidence import CLAMP_RATE_SLACK
from agent.models.spend_trend import TREND_MAX_POINTS, SpendTrend

INF = math.inf

# Seconds of history the trend's slope is fitted to: a fifth of the shortest drain measured on EC2
# (docs/credits.md, "forecast_window default: 60 s").
DEFAULT_FORECAST_WINDOW = 60.0
# A net rate under this share of the baseline is flat: its forecast would be over 10,000 times what the
# baseline takes to earn the credit left (docs/credits.md, "Two forecasts").
TREND_FLAT_FRACTION = 1e-4
# The share of the spend's excursion above its fitted line that the trend's forecast takes off the credit
# left: a bursty drain empties at a burst's top, not where the line does (docs/credits.md, "Two forecasts").
EXCURSION_WEIGHT = 0.5
# The trend's forecast is the sooner of its own and the median of the empty moments predicted over this
# share of the window, which cuts a bursty drain's late wobble (docs/credits.md, "Two forecasts").
MOMENT_SMOOTHING_FRACTION = 1.0 / 3.0
# The window rule (docs/credits.md, "The window rule"): the slope is fitted over this many of the traffic's
# own cycles (burst onset to burst onset), at least forecast_window and at most the drain's age, up to
# LONGEST_FACTOR windows (an hour at the EC2 default). The history is kept finely over the last
# WINDOW_MAX_FACTOR windows (one point a second on EC2) and coarsely over the rest.
CYCLES_PER_WINDOW = 4.0
WINDOW_MAX_FACTOR = 5.0
LONGEST_FACTOR = 60.0
# Forecast a cyclic drain by its last cycle's swing around the line (tests switch it off to measure the line
# and its excursion alone).
CYCLE_REPLAY = True
# A burst begins when the net spend rate rises through its mean by more than this share of the baseline,
# having been under it by as much: jitter within it is not a cycle.
CYCLE_BAND = 0.1
# Burst onsets kept: the cycle is their median spacing.
CYCLE_ONSETS_KEPT = 9
# Trend points saved in credits.json per direction, spread over the history (docs/credits.md, "Persistence").
TREND_SAVED_POINTS = 48
TREND_SAVED_COARSE = 24

@dataclass
class TrendForecast:
    """The net spend on the bucket's own clock, its fitted slope over a window that fits the traffic's cycle,
    and the empty moments it predicted (docs/credits.md, "Two forecasts", "The window rule")."""

    window: float = DEFAULT_FORECAST_WINDOW     # the shortest window ([credits] forecast_window)
    clock: float = 0.0                      # seconds of samples seen: the trend's time axis
    net: float = 0.0                        # bytes - baseline x seconds, unclamped: the trend's values
    drain_start: float = 0.0                # the clock at the deficit's low point since last full or empty
    _low: float = 0.0                       # and that low point (bytes)
    # the net spend at two resolutions: the last WINDOW_MAX_FACTOR windows finely, LONGEST_FACTOR coarsely
    trend: SpendTrend = field(init=False, repr=False)
    coarse: SpendTrend = field(init=False, repr=False)
    # (clock, predicted empty moment) of the recent samples whose forecast was a finite drain
    moments: deque[tuple[float, float]] = field(init=False, repr=False)
    # when the spend rate last rose through its mean (a burst began), newest last
    onsets: deque[float] = field(init=False, repr=False)
    _below: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.trend = SpendTrend(WINDOW_MAX_FACTOR * self.window)
        self.coarse = SpendTrend(LONGEST_FACTOR * self.window)
        self.moments = deque()
        self.onsets = deque(maxlen=CYCLE_ONSETS_KEPT)

    def advance(self, dt: float, net_bytes: float, baseline: float = 0.0) -> None:
        # The net spend, not the deficit: the deficit stops at full and is pinned while exhausted, which
        # would bend the slope where the traffic did not change.
        if dt > 0:
            self._watch_cycle(net_bytes / dt, baseline)
        self.clock += dt
        self.net += net_bytes
        self.trend.add(self.clock, self.net)
        self.coarse.add(self.clock, self.net)

    def note_level(self, deficit: float, bucket: float) -> None:
        """The bucket's deficit after this sample. The drain began at its low point since the bucket was last
        full or empty: from there on the deficit has only risen overall (docs/credits.md, "The window rule")."""
        if deficit <= self._low or deficit <= 0.0 or deficit >= bucket:
            self._low, self.drain_start = deficit, self.clock

    def drain_pace(self, deficit: float) -> float:
        """The drain's mean net rate (bytes/s) since it began at its low point; 0 before one began."""
        age = self.clock - self.drain_start
        if age <= 0.0 or not math.isfinite(self._low):
            return 0.0
        return max(0.0, deficit - self._low) / age

    def _watch_cycle(self, net_rate: float, baseline: float) -> None:
        """Note a burst's onset: the net spend rate rising through its mean (the slope over the current
        span) after having been under it, by more than CYCLE_BAND of the baseline either way."""
        span = self.span()
        mean = self._fit(span).slope(span)
        if mean is None:
            return
        # A burst spends above both the mean and the baseline: from idle, the first burst of a drain is one.
        level, band = max(mean, 0.0), CYCLE_BAND * baseline
        if net_rate < level - band:
            self._below = True
        elif net_rate > level + band and self._below:
            self._below = False
            self.onsets.append(self.clock)

    def longest(self) -> float:
        """The longest window now: the drain's age, at least forecast_window and at most LONGEST_FACTOR of it.
        A fit over cycles reaches no further back than the drain began, where the pace before it would pull
        the slope towards the idle's (docs/credits.md, "The window rule")."""
        return min(LONGEST_FACTOR * self.window, max(self.window, self.clock - self.drain_start))

    def cycle(self) -> Optional[float]:
        """The traffic's cycle in seconds: the median time between the burst onsets within the longest
        window; None without two of them there."""
        recent = [t for t in self.onsets if t >= self.clock - self.longest()]
        if len(recent) < 2:
            return None
        gaps = sorted(b - a for a, b in zip(recent, recent[1:]))
        mid = len(gaps) // 2
        return gaps[mid] if len(gaps) % 2 else (gaps[mid - 1] + gaps[mid]) / 2

    def span(self) -> float:
        """The window the slope is fitted over: CYCLES_PER_WINDOW of the traffic's cycles, at least
        forecast_window and at most longest() (docs/credits.md, "The window rule")."""
        period = self.cycle()
        if period is None or CYCLES_PER_WINDOW <= 0:
            return self.window
        return min(self.longest(), max(self.window, CYCLES_PER_WINDOW * period))

    def _fit(self, span: float) -> SpendTrend:
        """The finer of the two histories that holds `span`."""
        return self.trend if span <= self.trend.history + 1e-9 else self.coarse

    def set_window(self, seconds: float) -> None:
        self.window = seconds
        self.trend.set_history(WINDOW_MAX_FACTOR * seconds)
        self.coarse.set_history(LONGEST_FACTOR * seconds)

    def restart(self) -> None:
        self.net = 0.0
        self.drain_start, self._low = self.clock, INF     # the next note_level() sets both
        self.trend.reset()
        self.coarse.reset()
        self.moments.clear()
        self.onsets.clear()
        self._below = False

    def forecasts(self, baseline: float, remaining: float, missing: float, exhausted: bool) -> tuple[float, float]:
        """(seconds to empty, seconds to full) at the net spend rate over the span."""
        span = self.span()
        fit = self._fit(span)
        slope = fit.slope(span)
        flat = TREND_FLAT_FRACTION * baseline
        if slope is None:
            slope = 0.0
        if exhausted:
            exhaustion = 0.0
        elif remaining <= 0:
            # Empty without a confirmed clamp (no shaping source): empty unless the traffic is clearly under
            # the baseline (rule 3's slack keeps the figure from flipping on a rate a hair under it).
            exhaustion = 0.0 if slope >= -CLAMP_RATE_SLACK * baseline else INF
        elif slope <= flat:
            exhaustion = INF
        else:
            # Traffic with a cycle: the line plus the last cycle's swing around it, phase by phase (the empty
            # moment falls in a burst). Else between the fitted line's crossing and the burst tops';
            # remaining / slope on a steady drain.
            period = self.cycle()
            ahead = fit.crossing(slope, span, period, remaining,
                                 last_cycle=span < CYCLES_PER_WINDOW * period - 1e-9) \
                if CYCLE_REPLAY and period is not None and span >= period else None
            exhaustion = ahead if ahead is not None else \
                max(0.0, remaining - EXCURSION_WEIGHT * fit.excursion(slope, span)) / slope
        exhaustion = self._smoothed(exhaustion, span)
        if missing <= 0:
            refill = 0.0
        else:
            refill = missing / -slope if slope < -flat else INF
        return exhaustion, refill

    def _smoothed(self, exhaustion: float, window: float) -> float:
        """The sooner of `exhaustion` and the median of the empty moments predicted over the last
        MOMENT_SMOOTHING_FRACTION of the window, as seconds from now; 0 and +Inf pass through and start
        it anew. O(entries in the span), at most about TREND_MAX_POINTS."""
        if exhaustion <= 0.0 or math.isinf(exhaustion):
            self.moments.clear()
            return exhaustion
        span = MOMENT_SMOOTHING_FRACTION * window
        # A sample within the newest entry's slot replaces it (the slot keeps the time it opened), so the
        # span holds about TREND_MAX_POINTS entries at any sampling rate and window.
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

    # -- persistence (docs/credits.md, "Persistence") ----------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """What a restart needs to fit its first sample: the fine history decimated to TREND_SAVED_POINTS and
        the coarse one before it to TREND_SAVED_COARSE, as "seconds-before-the-newest:kB-after-it" pairs in one
        string (the state file's size budget); the burst onsets and the drain's start likewise."""
        fine = self.trend.decimated(TREND_SAVED_POINTS)
        if not fine:
            return {}
        older = [p for p in self.coarse.points if p[0] < fine[0][0]]
        step = max(1.0, len(older) / TREND_SAVED_COARSE)
        pts = [older[int(k * step)] for k in range(int(len(older) / step))] + fine
        t1, y1 = pts[-1]
        return {"points": " ".join(f"{round(t1 - t, 2):g}:{round((y - y1) / 1e3)}" for t, y in pts),
                "onsets": " ".join(f"{round(t1 - t, 2):g}" for t in self.onsets),
                "start": round(t1 - self.drain_start, 2), "low": round(self._low)}

    def restore(self, state: Any, gap: float, moved: Optional[float], baseline: float) -> bool:
        """Continue the saved history after a gap of `gap` seconds in which `moved` bytes crossed (None:
        unknowable, the history is dropped): the net spend is exact across it, only its shape within the gap
        is unknown. False when nothing usable was saved."""
        self.restart()
        if not isinstance(state, dict) or moved is None:
            return False
        try:
            pts = [(-float(a), 1e3 * float(v)) for a, v in (p.split(":") for p in str(state["points"]).split())]
            onsets = [-float(a) for a in str(state.get("onsets", "")).split()]
            start = -float(state.get("start", 0.0))
            low = float(state.get("low", INF))
        except (KeyError, TypeError, ValueError):
            return False
        if not pts or any(b[0] <= a[0] for a, b in zip(pts, pts[1:])) or pts[-1][0] != 0.0:
            return False
        gap = max(0.0, gap)
        now_y = pts[-1][1] + moved - baseline * gap
        if gap > 0:
            pts.append((gap, now_y))
        shift = self.clock - gap            # saved times are relative to the save; the newest point is now
        self.net = now_y
        self.coarse.load([(t + shift, y) for t, y in pts if t >= pts[-1][0] - self.coarse.history])
        self.trend.load([(t + shift, y) for t, y in pts if t >= pts[-1][0] - self.trend.history])
        self.onsets.extend(t + shift for t in onsets)
        self.drain_start, self._low = start + shift, low
        return True
