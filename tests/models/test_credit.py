"""The credit bucket model, driven by a simulated EC2 shaper (pure: no I/O, no clock)."""

from __future__ import annotations

import math

import pytest

from agent.models.credit_model import CreditEstimator

BASE, PEAK, BUCKET = 100.0, 1000.0, 9000.0  # bytes/s, bytes/s, bytes


class World:
    """The real shaper: a token bucket of `bucket` bytes refilled at BASE; demand served up to PEAK
    while tokens last, then BASE. Returns (bytes moved, shaped?) per step."""

    def __init__(self, bucket: float = BUCKET) -> None:
        self.bucket, self.tokens = bucket, bucket

    def step(self, dt: float, demand: float) -> tuple[float, bool]:
        # Every byte spends a token; tokens accrue at BASE up to the bucket (tbf's semantics).
        self.tokens = min(self.bucket, self.tokens + BASE * dt)
        want = demand * dt
        moved = min(want, PEAK * dt, self.tokens)
        self.tokens -= moved
        return moved, want > moved


def drive(est: CreditEstimator, world: World, demand: float, seconds: float, dt: float = 0.1,
          shaping: bool = True) -> dict:
    readings = {}
    for _ in range(int(round(seconds / dt))):
        moved, shaped = world.step(dt, demand)
        rate = moved / dt
        readings = est.update(dt, {"out": moved, "in": 0.0}, {"out": rate, "in": 0.0},
                              {"out": int(shaped), "in": 0} if shaping else None)
    return readings


def test_full_at_start_and_forecast_at_full_speed() -> None:
    est = CreditEstimator(BASE, BUCKET)
    r = drive(est, World(), PEAK, 1.0)["out"]
    assert r.remaining_bytes == pytest.approx(BUCKET - (PEAK - BASE) * 1.0)
    assert r.exhaustion_seconds == pytest.approx(r.remaining_bytes / (PEAK - BASE))
    assert r.ratio == pytest.approx(r.remaining_bytes / BUCKET)
    assert r.refill_seconds == math.inf
    assert drive(est, World(), 0.0, 0.1)["in"].exhaustion_seconds == math.inf


def test_never_above_bucket_nor_below_zero_and_refill_time() -> None:
    est = CreditEstimator(BASE, BUCKET)
    w = World()
    r = drive(est, w, PEAK, 30.0)["out"]
    assert r.remaining_bytes == 0.0 and r.exhausted
    r = drive(est, w, 50.0, 10.0)["out"]                      # below baseline: earning 50 B/s
    assert r.remaining_bytes == pytest.approx(500.0, rel=0.02)
    assert r.refill_seconds == pytest.approx((BUCKET - 500.0) / 50.0, rel=0.02)
    r = drive(est, w, 0.0, 500.0)["out"]
    assert r.remaining_bytes == BUCKET and r.refill_seconds == 0.0


def test_learns_a_bucket_twice_too_large_on_the_first_exhaustion() -> None:
    est = CreditEstimator(BASE, 2 * BUCKET)
    r = drive(est, World(), PEAK, 20.0)["out"]
    assert r.learned_count == 1 and r.learn_method == "exhaustion" and r.bucket_source == "learned"
    assert r.bucket_bytes == pytest.approx(BUCKET, rel=0.05)
    assert r.remaining_bytes == 0.0


def test_grows_a_bucket_too_small_while_traffic_runs_unshaped() -> None:
    est = CreditEstimator(BASE, BUCKET / 3)
    w = World()
    r = drive(est, w, PEAK, 5.0)["out"]                       # model empty after ~3.3 s, world still bursting
    assert r.learn_method == "unshaped_overrun" and r.learned_count == 1
    r = drive(est, w, PEAK, 10.0)["out"]                      # the real exhaustion settles it
    assert r.learn_method == "exhaustion" and r.learned_count == 1
    assert r.bucket_bytes == pytest.approx(BUCKET, rel=0.05)


def test_shaping_at_the_peak_is_not_an_exhaustion() -> None:
    est = CreditEstimator(BASE, BUCKET)
    for _ in range(20):                                       # shaped (demand above peak) but rate at peak
        r = est.update(0.1, {"out": PEAK * 0.1}, {"out": PEAK}, {"out": 5})["out"]
    assert not r.exhausted and r.learned_count == 0


def test_no_shaping_source_keeps_the_configured_bucket() -> None:
    est = CreditEstimator(BASE, BUCKET / 3)
    r = drive(est, World(), PEAK, 20.0, shaping=False)["out"]
    assert r.bucket_bytes == BUCKET / 3 and r.learned_count == 0 and r.remaining_bytes == 0.0


def test_learning_off_never_changes_the_size() -> None:
    est = CreditEstimator(BASE, 2 * BUCKET, learn=False)
    r = drive(est, World(), PEAK, 20.0)["out"]
    assert r.bucket_bytes == 2 * BUCKET and r.exhausted and r.remaining_bytes == 0.0


def test_no_bucket_means_never_exhausts() -> None:
    est = CreditEstimator(BASE, None)
    r = est.update(1.0, {"out": 5 * BASE}, {"out": 5 * BASE}, None)["out"]
    assert r.remaining_bytes is None and r.ratio is None and r.exhaustion_seconds == math.inf


def test_state_round_trip_and_gap_accounting() -> None:
    est = CreditEstimator(BASE, BUCKET)
    drive(est, World(), PEAK, 4.0)
    saved = est.to_state()
    again = CreditEstimator(BASE, BUCKET)
    again.restore(saved)
    assert again.buckets["out"].deficit == pytest.approx(est.buckets["out"].deficit)
    # 10 s down while 500 bytes crossed: deficit falls by the baseline earned, rises by the bytes
    before = again.buckets["out"].deficit
    again.account_gap(10.0, {"out": 500.0, "in": None})
    assert again.buckets["out"].deficit == pytest.approx(before + 500.0 - BASE * 10.0)
