"""The trend behind the credit forecast: least-squares slopes of the net spend over trailing windows (pure)."""

from __future__ import annotations

import bisect
import math
from array import array
from typing import Optional

INF = math.inf

# At most about this many (time, net spend) points over the history kept (older samples are thinned to an
# even spacing), so memory and the occasional full re-sum stay bounded at 10 Hz and long windows alike: at
# the EC2 default (history 300 s, docs/credits.md "The window rule") one point a second.
TREND_MAX_POINTS = 300
# The fit needs this many points; until the window has filled it uses what it has (since start).
TREND_MIN_POINTS = 3


class SpendTrend:
    """Least-squares slope of the net spend over any trailing window up to `history` seconds: O(log n) per
    fit, amortised O(1) per sample, bounded memory.

    Points are (t, net bytes so far). Each sample replaces the newest point until that point is
    `history / max_points` old, then a new one starts, so at most about `max_points` points are kept at any
    sampling rate. Each point carries the running sums up to it, so the sums of any trailing window are one
    subtraction (prefix sums). They are kept relative to an origin that moves to the oldest point every
    `max_points` appends (a full re-sum: amortised O(1)), so rounding cannot build up over days."""

    def __init__(self, history: float, max_points: int = TREND_MAX_POINTS) -> None:
        self.max_points = max_points
        self.history = history
        # Columns of C doubles (8 bytes a value, a fifth of a list of float objects): the points' times and
        # values, and the running sums of x, y, x², x·y up to and including each point.
        self._t, self._y = array("d"), array("d")
        self._sx, self._sy, self._sxx, self._sxy = array("d"), array("d"), array("d"), array("d")
        self._head = 0                      # index of the oldest point kept (older ones await compaction)
        self._opened = -INF                 # when the newest point's slot started
        self._appends = 0
        self._t0 = 0.0
        self._y0 = 0.0

    @property
    def points(self) -> list[tuple[float, float]]:
        """The points kept, oldest first (a copy)."""
        return list(zip(self._t[self._head:], self._y[self._head:]))

    def __len__(self) -> int:
        return len(self._t) - self._head

    def set_history(self, history: float) -> None:
        self.history = history

    def set_window(self, window: float) -> None:
        """For callers that fit the whole history (one window): the same as set_history."""
        self.set_history(window)

    def _columns(self) -> tuple[array, array, array, array, array, array]:
        return self._t, self._y, self._sx, self._sy, self._sxx, self._sxy

    def _push(self, t: float, y: float) -> None:
        x, v = t - self._t0, y - self._y0
        if self._t:
            sx, sy, sxx, sxy = self._sx[-1], self._sy[-1], self._sxx[-1], self._sxy[-1]
        else:
            sx = sy = sxx = sxy = 0.0
        for column, value in zip(self._columns(), (t, y, sx + x, sy + v, sxx + x * x, sxy + x * v)):
            column.append(value)

    def _clear(self) -> None:
        for column in self._columns():
            del column[:]
        self._head = 0

    def _compact(self) -> None:
        """Drop the points behind the head and re-sum from the oldest kept one as the new origin."""
        ts, ys = self._t[self._head:], self._y[self._head:]
        self._clear()
        self._t0, self._y0 = (ts[0], ys[0]) if ts else (0.0, 0.0)
        for t, y in zip(ts, ys):
            self._push(t, y)
        self._appends = 0

    def add(self, t: float, y: float) -> None:
        spacing = self.history / self.max_points
        if len(self) and t - self._opened < spacing - 1e-9:
            for column in self._columns():
                column.pop()
        else:
            self._opened = t
            self._appends += 1
        self._push(t, y)
        while len(self) > TREND_MIN_POINTS and self._t[self._head] < t - self.history - 1e-9:
            self._head += 1
        if self._appends >= self.max_points:
            self._compact()

    def _start(self, window: float) -> int:
        """Index of the oldest point within `window` seconds of the newest (at least TREND_MIN_POINTS back)."""
        if not len(self):
            return self._head
        i = bisect.bisect_left(self._t, self._t[-1] - window - 1e-9, self._head)
        return max(self._head, min(i, len(self._t) - TREND_MIN_POINTS))

    def _window_sums(self, i: int) -> tuple[int, float, float, float, float]:
        sx, sy, sxx, sxy = self._sx[-1], self._sy[-1], self._sxx[-1], self._sxy[-1]
        if i > 0:                           # the running sums start at the columns' first point, kept or not
            k = i - 1
            sx, sy, sxx, sxy = sx - self._sx[k], sy - self._sy[k], sxx - self._sxx[k], sxy - self._sxy[k]
        return len(self._t) - i, sx, sy, sxx, sxy

    def slope(self, window: Optional[float] = None) -> Optional[float]:
        """Net bytes per second over the last `window` seconds (default the whole history; negative: earning
        credit); None: too few points."""
        if len(self) < TREND_MIN_POINTS:
            return None
        n, sx, sy, sxx, sxy = self._window_sums(self._start(self.history if window is None else window))
        # centred: n·Σx² - (Σx)² loses everything to rounding once the origin is far behind the window
        mx = sx / n
        cxx = sxx - mx * sx
        if cxx <= 1e-12 * max(sxx, 1e-300) or cxx <= 0:
            return None
        return (sxy - mx * sy) / cxx

    def excursion(self, slope: float, window: Optional[float] = None) -> float:
        """How far the net spend has run above its fitted line (of `slope`) within the window, beyond where it
        is now: max(residual) - residual now, >= 0. A bursty drain's spend is a staircase around its trend
        line; the bucket empties the first time the staircase's top reaches the credit left, this much sooner
        than the line does (docs/credits.md, "Two forecasts"). O(points in the window), at most
        TREND_MAX_POINTS."""
        if len(self) < TREND_MIN_POINTS:
            return 0.0
        i = self._start(self.history if window is None else window)
        n, sx, sy, _, _ = self._window_sums(i)
        mx, mv = sx / n, sy / n
        t0, y0 = self._t0, self._y0
        top = -INF
        for k in range(i, len(self._t)):
            top = max(top, (self._y[k] - y0) - (mv + slope * ((self._t[k] - t0) - mx)))
        now = (self._y[-1] - y0) - (mv + slope * ((self._t[-1] - t0) - mx))
        return max(0.0, top - now)

    def crossing(self, slope: float, window: float, period: float, need: float,
                 last_cycle: bool = False) -> Optional[float]:
        """Seconds until the net spend has risen by `need` if the traffic repeats its last `period` seconds
        around the line (of `slope`) fitted over `window`: the line's rise plus the residuals one period back,
        phase by phase (docs/credits.md, "The window rule"). With `last_cycle`, a cycle rises by what the last
        one did instead of the line's slope x period: a window shorter than a few cycles holds a part-cycle,
        which bends its slope by up to the burst's share of it (issue 28: 150 s on / 150 s off read a third
        fast). None without a period of points or a rising line. O(points in one period)."""
        if need <= 0.0:
            return 0.0
        if slope <= 0.0 or period <= 0.0 or len(self) < TREND_MIN_POINTS:
            return None
        t_now = self._t[-1]
        j = bisect.bisect_left(self._t, t_now - period - 1e-9, self._head)
        if j >= len(self._t) - 2 or self._t[j] - (t_now - period) > 0.25 * period:
            return None
        y_now = self._y[-1]
        if last_cycle:
            # the net spend's rise per cycle over the whole cycles the window holds, between the points
            # around their start (a restored history is sparse)
            cycles = max(1, math.floor(window / period + 1e-9))
            per_cycle = (y_now - self._at(t_now - cycles * period)) / cycles
            t_back = t_now - period
            if per_cycle <= 0.0:
                return None
            # each phase's rise from now: the last cycle's, from the same phase on
            profile = [(self._t[k] - t_back, per_cycle - (y_now - self._y[k])) for k in range(j, len(self._t))]
            top = max(p for _, p in profile)
        else:
            i = self._start(window)
            n, sx, sy, _, _ = self._window_sums(i)
            mx, mv = sx / n, sy / n
            t0, y0 = self._t0, self._y0

            def residual(k: int) -> float:
                return (self._y[k] - y0) - (mv + slope * ((self._t[k] - t0) - mx))

            now = residual(len(self._t) - 1)
            # the residual one period back, phase 0 .. period, relative to now's: what each phase adds to the line
            residuals = [(self._t[k] - (t_now - period), residual(k) - now) for k in range(j, len(self._t))]
            top = max(p for _, p in residuals)
            per_cycle = slope * period
            profile = [(tb, slope * tb + pb) for tb, pb in residuals]
        first = max(0, math.floor((need - top) / per_cycle))
        for m in (first, first + 1):
            base = per_cycle * m
            prev: Optional[tuple[float, float]] = None     # (phase, rise) of the previous point
            for tb, rise in profile:
                fb = base + rise
                if fb >= need:
                    if prev is None or tb <= prev[0]:
                        return max(0.0, m * period + tb)
                    ta, fa = prev
                    return max(0.0, m * period + ta + (tb - ta) * (need - fa) / (fb - fa))
                prev = (tb, fb)
        return None

    def _at(self, t: float) -> float:
        """The net spend at time `t`, between the points around it (the oldest point before them)."""
        k = bisect.bisect_left(self._t, t - 1e-9, self._head)
        if k >= len(self._t):
            return self._y[-1]
        if k == self._head or self._t[k] <= t:
            return self._y[k]
        ta, ya = self._t[k - 1], self._y[k - 1]
        return ya + (self._y[k] - ya) * (t - ta) / (self._t[k] - ta)

    def reset(self) -> None:
        self._clear()
        self._opened = -INF
        self._appends = 0
        self._t0 = self._y0 = 0.0

    def decimated(self, most: int) -> list[tuple[float, float]]:
        """At most `most` of the points, evenly spread over the history and always with the newest: what a
        restart needs to fit its first sample (docs/credits.md, "Persistence")."""
        pts = self.points
        if len(pts) <= most:
            return pts
        stride = (len(pts) - 1) / (most - 1)
        return [pts[round(k * stride)] for k in range(most)]

    def load(self, points: list[tuple[float, float]]) -> None:
        """Start from saved points (oldest first), as if they had been added one by one."""
        self.reset()
        for t, y in points:
            self._opened = -INF                 # every saved point keeps its own slot
            self.add(t, y)
