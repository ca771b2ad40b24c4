"""The trend forecast: seconds to empty (and to full) at the net spend rate over `forecast_window`."""

from __future__ import annotations

import math

import pytest

from agent.config import CreditsConfig
from agent.models import credit_trend as cm
from agent.models.credit_model import CreditEstimator
from agent.models.credit_trend import DEFAULT_FORECAST_WINDOW, WINDOW_MAX_FACTOR
from agent.models.spend_trend import TREND_MAX_POINTS, SpendTrend
from tests.models.credit_world import MBIT, Shaper, World, idle, on_off, steady

BASE, PEAK, BUCKET = 100 * MBIT, 300 * MBIT, 150e6     # the lab's profile (tests/support/credit_lab.py)
LAB_WINDOW = 3.0                                        # forecast_window at lab scale
FULL_SPEED = 10 * PEAK


def world(window: float = LAB_WINDOW, direction: str = "out") -> World:
    return World(CreditEstimator(BASE, BUCKET, forecast_window=window), Shaper(BASE, PEAK, BUCKET),
                 direction=direction)


def hit_rate(samples: list, empty: float, start: float, attr: str) -> float:
    """Share of samples from 3.5 s into the drain to 1 s before empty whose forecast lands within
    max(1 s, 15 %) of the true empty moment (the target in docs/credits.md, "The traffic zoo")."""
    sel = [s for s in samples if s.t - start >= 3.5 and s.t <= empty - 1.0]
    assert len(sel) >= 10
    ok = [abs(s.t + getattr(s.reading, attr) - empty) <= max(1.0, 0.15 * (empty - s.t)) for s in sel]
    return sum(ok) / len(ok)


@pytest.mark.parametrize("on,off", [(0.6, 0.4), (0.5, 0.5), (0.3, 0.2), (0.4, 0.3)])
@pytest.mark.parametrize("direction", ["out", "in"])
def test_on_off_drain_trend_forecast_hits_the_empty_moment(on: float, off: float, direction: str) -> None:
    w = world(direction=direction)
    w.run(idle(), 4.0)                                  # a full window of a full bucket first
    start = w.t
    samples, empty = w.run_until_empty(on_off(FULL_SPEED, on, off), 60)
    assert hit_rate(samples, empty, start, "exhaustion_trend_seconds") >= 0.8
    # the instant forecast is what flips on these drains: +Inf in every pause
    assert any(math.isinf(s.reading.exhaustion_seconds) for s in samples)
    # and the trend never does once it has a window of the drain: an alert's `for:` is not reset
    assert not any(math.isinf(s.reading.exhaustion_trend_seconds) for s in samples if s.t - start >= LAB_WINDOW)


@pytest.mark.parametrize("on,off", [(1.2, 0.8), (1.0, 1.0), (2.0, 2.0), (3.0, 2.0)])
def test_the_window_rule_holds_cycles_longer_than_the_window(on: float, off: float,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Cycles of 2-5 s against the lab's 3-s forecast_window: the trend fits four of the traffic's own cycles
    (at most the drain's age) and follows the last cycle's swing, where the fixed window swung with the phase
    (docs/credits.md, "The window rule")."""
    def run() -> float:
        w = world()
        w.run(idle(), 4.0)
        start = w.t
        samples, empty = w.run_until_empty(on_off(FULL_SPEED, on, off), 60)
        return hit_rate(samples, empty, start, "exhaustion_trend_seconds")

    assert run() >= 0.8
    if on + off >= 4.0:
        monkeypatch.setattr(cm, "CYCLES_PER_WINDOW", 0.0)
        monkeypatch.setattr(cm, "CYCLE_REPLAY", False)
        assert run() < 0.5


def test_steady_drain_both_forecasts_agree_with_the_truth() -> None:
    w = world()
    w.run(idle(), 4.0)
    start = w.t
    samples, empty = w.run_until_empty(steady(FULL_SPEED), 20)
    tolerance = max(0.5, 0.1 * (empty - start))
    trend = [s for s in samples if s.t - start >= LAB_WINDOW]
    rate = [s for s in samples if s.t - start >= 1.0]    # the rate window (0.6 s) has filled
    # The drain lasts several windows: most of its samples are judged by each forecast, none by neither.
    assert len(trend) >= len(samples) // 2 and len(rate) >= len(trend), (len(samples), len(trend), len(rate))
    for s in trend:
        assert abs(s.t + s.reading.exhaustion_trend_seconds - empty) <= tolerance
    for s in rate:
        assert abs(s.t + s.reading.exhaustion_seconds - empty) <= tolerance


def test_traffic_under_the_baseline_never_forecasts_an_empty_bucket() -> None:
    w = world()
    for demand in (on_off(FULL_SPEED, 0.1, 0.4), steady(0.9 * BASE), on_off(2 * BASE, 0.4, 0.6)):
        samples = w.run(demand, 20.0)
        tail = [s for s in samples if s.t >= samples[0].t + LAB_WINDOW]
        assert len(tail) >= len(samples) // 2, (len(samples), len(tail))   # 20 s of samples, a 3-s window
        assert all(math.isinf(s.reading.exhaustion_trend_seconds) for s in tail)
        assert all(s.reading.ratio == pytest.approx(1.0, abs=0.05) for s in samples)


def test_refill_trend_after_an_exhaustion() -> None:
    w = world()
    w.run_until_empty(steady(FULL_SPEED), 10)
    w.run(steady(FULL_SPEED), 2.0)
    samples = w.run(on_off(2 * BASE, 0.2, 0.8), 6.0)     # bursty, averaging 0.4 x the baseline
    r = samples[-1].reading
    assert math.isinf(r.exhaustion_trend_seconds)
    full_at = samples[-1].t + (BUCKET - samples[-1].true_remaining) / (0.6 * BASE)
    assert samples[-1].t + r.refill_trend_seconds == pytest.approx(full_at, rel=0.10)
    assert r.refill_seconds != pytest.approx(r.refill_trend_seconds, rel=0.10)  # the instant one flips
    rest = w.run(idle(), BUCKET / BASE + 1.0)[-1].reading
    assert rest.ratio == 1.0 and rest.refill_trend_seconds == 0.0 and rest.refill_seconds == 0.0


def test_no_bucket_and_no_history() -> None:
    r = CreditEstimator(BASE, None).update(1.0, {"out": 5 * BASE}, {"out": 5 * BASE}, None)["out"]
    assert math.isinf(r.exhaustion_trend_seconds) and math.isinf(r.refill_trend_seconds)
    est = CreditEstimator(BASE, BUCKET, forecast_window=LAB_WINDOW)
    r = est.update(0.2, {"out": PEAK * 0.2}, {"out": PEAK}, None)["out"]
    assert math.isinf(r.exhaustion_trend_seconds)          # one point: no slope yet
    for _ in range(2):
        r = est.update(0.2, {"out": PEAK * 0.2}, {"out": PEAK}, None)["out"]
    assert r.exhaustion_trend_seconds == pytest.approx(r.exhaustion_seconds, rel=1e-6)  # since start


def test_the_config_default_is_the_model_default() -> None:
    assert CreditsConfig().forecast_window == DEFAULT_FORECAST_WINDOW


def test_memory_is_bounded_and_the_slope_stays_exact_over_a_long_run() -> None:
    """10 Hz for a day of samples into a 60-s window: at most TREND_MAX_POINTS points, and the running
    sums (re-based as they go) still give the exact slope of a ramp."""
    trend = SpendTrend(60.0)
    t, y = 0.0, 3.375e11                                # a one-hour r4.large bucket, in bytes
    for _ in range(86_400 * 10 // 20):                  # a 20th of a day keeps the test fast
        t += 0.1
        y += 1.15e8 * 0.1                               # 0.92 Gbit/s net
        trend.add(t, y)
    assert len(trend.points) <= TREND_MAX_POINTS + 1
    assert trend.points[-1][0] - trend.points[0][0] <= 60.0 + 1e-6
    slope = trend.slope()
    assert slope is not None and slope == pytest.approx(1.15e8, rel=1e-9)


def test_reload_changes_the_window() -> None:
    est = CreditEstimator(BASE, BUCKET, forecast_window=60.0)
    for _ in range(100):
        est.update(0.2, {"out": PEAK * 0.2}, {"out": PEAK}, None)
    est.set_forecast_window(3.0)
    est.update(0.2, {"out": PEAK * 0.2}, {"out": PEAK}, None)
    forecast = est.buckets["out"].forecast
    pts = forecast.trend.points
    # the history kept is the longest window the rule may choose; a steady drain fits the shortest
    assert pts[-1][0] - pts[0][0] <= WINDOW_MAX_FACTOR * 3.0 + 1e-6
    assert forecast.span() == 3.0


def test_the_moment_median_keeps_a_bounded_number_of_entries() -> None:
    """A long window sampled fast keeps at most about TREND_MAX_POINTS predicted moments."""
    est = CreditEstimator(BASE, 1e12, forecast_window=3600.0)
    for _ in range(20000):                              # 2000 s of 0.1-s samples draining at 2 x baseline
        est.update(0.1, {"out": 2 * BASE * 0.1, "in": 0.0}, {"out": 2 * BASE, "in": 0.0}, None)
    moments = est.buckets["out"].forecast.moments
    assert 0 < len(moments) <= TREND_MAX_POINTS + 1
    assert moments[-1][0] - moments[0][0] <= 3600.0 / 3 + 10
