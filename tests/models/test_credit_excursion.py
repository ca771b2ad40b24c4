"""The trend forecast's excursion: a bursty drain empties when a burst's top reaches the credit left, not
where the fitted line does (docs/credits.md, "Two forecasts")."""

from __future__ import annotations

import statistics

import pytest

from agent.models import credit_trend as cm
from agent.models.credit_model import CreditEstimator
from agent.models.spend_trend import SpendTrend
from tests.models.credit_world import MBIT, Demand, Shaper, World, idle, on_off, steady

BASE, PEAK, BUCKET = 100 * MBIT, 300 * MBIT, 150e6     # the lab's profile
FULL_SPEED = 10 * PEAK
WEIGHT = cm.EXCURSION_WEIGHT


def test_excursion_of_a_line_is_zero_and_of_a_staircase_its_step() -> None:
    line = SpendTrend(10.0)
    for i in range(50):
        line.add(0.2 * i, 1e6 * i)
    slope = line.slope()
    assert slope is not None and line.excursion(slope) == pytest.approx(0.0, abs=1e-3)
    # a staircase: +1 MB at every whole second, flat between; sampled at 0.1 s, ending just before a step
    stairs = SpendTrend(10.0)
    for i in range(100):
        stairs.add(0.1 * i, 1e6 * (i // 10))
    slope = stairs.slope()
    assert slope is not None and slope == pytest.approx(1e6, rel=0.05)
    # now at the flat end of a step, below the line: the tops ran ~0.9 step above where it is now
    assert stairs.excursion(slope) == pytest.approx(0.9e6, rel=0.15)


def errors(weight: float, on: float, off: float, monkeypatch: pytest.MonkeyPatch) -> tuple[float, float]:
    """(share within max(1 s, 15 %), median signed error) of the trend forecasts from 3.5 s into an on/off
    drain to 1 s before empty, at lab scale with a 3-s window."""
    monkeypatch.setattr(cm, "EXCURSION_WEIGHT", weight)
    # a fixed 3-s window and no cycle replay: the excursion on its own (docs/credits.md, "The window rule")
    monkeypatch.setattr(cm, "CYCLES_PER_WINDOW", 0.0)
    monkeypatch.setattr(cm, "CYCLE_REPLAY", False)
    w = World(CreditEstimator(BASE, BUCKET, forecast_window=3.0), Shaper(BASE, PEAK, BUCKET))
    w.run(idle(), 4.0)
    start = w.t
    samples, empty = w.run_until_empty(on_off(FULL_SPEED, on, off) if off else steady(FULL_SPEED), 60)
    sel = [s for s in samples if s.t - start >= 3.5 and s.t <= empty - 1.0]
    errs = [s.t + s.reading.exhaustion_trend_seconds - empty for s in sel]
    hits = [abs(e) <= max(1.0, 0.15 * (empty - s.t)) for e, s in zip(errs, sel)]
    return sum(hits) / len(hits), statistics.median(errs)


def test_half_the_excursion_centres_a_bursty_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.5 s on / 0.5 s off: the line alone is late (the bucket empties in a burst before the average
    reaches it); half the excursion brings the forecasts in, the full one overshoots (early)."""
    _, late = errors(0.0, 0.5, 0.5, monkeypatch)
    hit, median = errors(WEIGHT, 0.5, 0.5, monkeypatch)
    _, early = errors(1.0, 0.5, 0.5, monkeypatch)
    assert late > 0.55
    assert hit >= 0.95 and 0.0 < median < late - 0.1
    assert early < median


def ramped_on_off(rate: float, on: float, off: float, ramp: float) -> Demand:
    """On/off where each burst climbs to `rate` over `ramp` seconds, as TCP's window does after an idle
    pause (the lab's on/off drains look like this)."""
    def demand(t: float, dt: float) -> float:
        phase = t % (on + off)
        return min(rate, rate * phase / ramp) * dt if phase < on else 0.0
    return demand


def test_the_moments_median_cuts_the_late_wobble(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.5 s on / 0.5 s off with a 0.2-s climb (the lab's TCP bursts): the fitted slope and excursion wobble
    with the phase, each sample's own moment lands up to 2 s late; the sooner of it and the median of the
    last third of a window's moments cuts that tail and brings every forecast within the target."""
    def run(fraction: float) -> tuple[float, float]:
        monkeypatch.setattr(cm, "MOMENT_SMOOTHING_FRACTION", fraction)
        monkeypatch.setattr(cm, "CYCLES_PER_WINDOW", 0.0)     # a fixed window and the line alone, as above
        monkeypatch.setattr(cm, "CYCLE_REPLAY", False)
        w = World(CreditEstimator(BASE, BUCKET, forecast_window=3.0), Shaper(BASE, PEAK, BUCKET))
        w.run(idle(), 4.0)
        start = w.t
        samples, empty = w.run_until_empty(ramped_on_off(1.3 * PEAK, 0.5, 0.5, 0.2), 80)
        sel = [s for s in samples if s.t - start >= 3.5 and s.t <= empty - 1.0]
        errs = sorted(s.t + s.reading.exhaustion_trend_seconds - empty for s in sel)
        hits = sum(abs(s.t + s.reading.exhaustion_trend_seconds - empty) <= max(1.0, 0.15 * (empty - s.t))
                   for s in sel) / len(sel)
        return hits, errs[9 * len(errs) // 10]

    shipped = cm.MOMENT_SMOOTHING_FRACTION
    hit_raw, late_raw = run(0.0)
    hit, late = run(shipped)
    assert hit_raw < 0.95 and late_raw > 1.5
    assert hit >= 0.99 and late < late_raw - 0.5
