"""The trend behind the credit forecast: a least-squares slope of the net spend over a sliding window (pure)."""

from __future__ import annotations

import math
from collections import deque
from typing import Optional

INF = math.inf

# At most this many (time, net spend) points per window (older samples are thinned to an even spacing), so
# memory and the occasional full re-sum stay bounded at 10 Hz and long windows alike.
TREND_MAX_POINTS = 240
# The fit needs this many points; until the window has filled it uses what it has (since start).
TREND_MIN_POINTS = 3


class SpendTrend:
    """Least-squares slope of the net spend over the last `window` seconds: O(1) per sample, bounded memory.

    Points are (t, net bytes so far). Each sample replaces the newest point until that point is
    `window / max_points` old, then a new one starts, so at most about `max_points` points are kept at any
    sampling rate. The sums are kept relative to an origin that moves to the oldest point every
    `max_points` appends (a full re-sum: amortised O(1)), so rounding cannot build up over days."""

    def __init__(self, window: float, max_points: int = TREND_MAX_POINTS) -> None:
        self.points: deque[tuple[float, float]] = deque()
        self.max_points = max_points
        self.window = window
        self._opened = -INF                 # when the newest point's slot started
        self._appends = 0
        self._t0 = 0.0
        self._y0 = 0.0
        self._sx = self._sy = self._sxx = self._sxy = 0.0

    def set_window(self, window: float) -> None:
        self.window = window

    def _add(self, t: float, y: float, sign: float) -> None:
        x, v = t - self._t0, y - self._y0
        self._sx += sign * x
        self._sy += sign * v
        self._sxx += sign * x * x
        self._sxy += sign * x * v

    def _resum(self) -> None:
        self._t0, self._y0 = self.points[0] if self.points else (0.0, 0.0)
        self._sx = self._sy = self._sxx = self._sxy = 0.0
        for t, y in self.points:
            self._add(t, y, 1.0)
        self._appends = 0

    def add(self, t: float, y: float) -> None:
        spacing = self.window / self.max_points
        if self.points and t - self._opened < spacing:
            self._add(*self.points.pop(), -1.0)
        else:
            self._opened = t
            self._appends += 1
        self.points.append((t, y))
        self._add(t, y, 1.0)
        while len(self.points) > TREND_MIN_POINTS and self.points[0][0] < t - self.window - 1e-9:
            self._add(*self.points.popleft(), -1.0)
        if self._appends >= self.max_points:
            self._resum()

    def slope(self) -> Optional[float]:
        """Net bytes per second over the window (negative: earning credit); None: too few points."""
        n = len(self.points)
        if n < TREND_MIN_POINTS:
            return None
        den = n * self._sxx - self._sx * self._sx
        if den <= 1e-12 * n * self._sxx or den <= 0:
            return None
        return (n * self._sxy - self._sx * self._sy) / den

    def excursion(self, slope: float) -> float:
        """How far the net spend has run above its fitted line (of `slope`) within the window, beyond where it
        is now: max(residual) - residual now, >= 0. A bursty drain's spend is a staircase around its trend
        line; the bucket empties the first time the staircase's top reaches the credit left, this much sooner
        than the line does (docs/credits.md, "Two forecasts"). O(points), at most TREND_MAX_POINTS."""
        n = len(self.points)
        if n < TREND_MIN_POINTS:
            return 0.0
        mx, mv = self._sx / n, self._sy / n
        top = -INF
        for t, y in self.points:
            top = max(top, (y - self._y0) - (mv + slope * ((t - self._t0) - mx)))
        t, y = self.points[-1]
        return max(0.0, top - ((y - self._y0) - (mv + slope * ((t - self._t0) - mx))))

    def reset(self) -> None:
        self.points.clear()
        self._opened = -INF
        self._resum()
