"""Persistence arithmetic (pure): the gap a restart folds in errs towards fewer credits; how far the estimate
has moved since a save."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.models.credit_model import SAVE_MOVEMENT_FRACTION, CreditEstimator, gap_deficit

BASE, PEAK, BUCKET = 100.0, 300.0, 1200.0       # bytes/s, bytes/s, bytes: the lab's shape, in small units


@pytest.mark.parametrize("d0, seconds, moved, want, why", [
    # a full bucket idle for 30 s, then 2 s at the peak just before the restart: the refill while full is
    # lost, the burst spent (PEAK - BASE) x 2 (the old accounting, spread evenly, said "still full")
    (0.0, 30.0, 2 * PEAK, 2 * (PEAK - BASE), "idle at full, burst last"),
    # mid-drain at the peak the whole gap: exact either way
    (600.0, 1.5, 1.5 * PEAK, 600.0 + 1.5 * (PEAK - BASE), "continuous drain"),
    # a partial bucket and a long idle gap: refilled to full, nothing crossed
    (600.0, 60.0, 0.0, 0.0, "refilled while down"),
    # more bytes than the peak allows in the gap (several interfaces, or a peak a little off): spread
    (100.0, 1.0, 2 * PEAK, 100.0 + 2 * PEAK - BASE, "more than the peak"),
    # a clock that went backwards (it does not: CLOCK_BOOTTIME) is no gap
    (500.0, -3.0, 0.0, 500.0, "no time"),
])
def test_gap_takes_the_refill_first_and_the_bytes_last_at_the_peak(d0: float, seconds: float, moved: float,
                                                                   want: float, why: str) -> None:
    assert gap_deficit(d0, seconds, moved, BASE, PEAK) == pytest.approx(want), why


def test_without_a_peak_the_bytes_are_spread_over_the_gap() -> None:
    """The old accounting (no peak known): D0 + M - baseline x G, never below 0."""
    assert gap_deficit(600.0, 4.0, 300.0, BASE, None) == pytest.approx(600.0 + 300.0 - 400.0)
    assert gap_deficit(0.0, 30.0, 600.0, BASE, None) == 0.0


def simulate(d0: float, chunks: list[tuple[float, float]]) -> float:
    """What a real bucket's deficit ends at: `chunks` of (seconds, rate) in order, at fine steps, clamped
    at full (0) like the shaper (the empty end is the account_gap caller's clamp)."""
    d = d0
    for seconds, rate in chunks:
        steps = max(1, int(seconds / 0.01))
        for _ in range(steps):
            d = max(0.0, d + (rate - BASE) * seconds / steps)
    return d


@settings(max_examples=200, deadline=None)
@given(d0=st.floats(0, BUCKET), chunks=st.lists(st.tuples(st.floats(0.01, 5.0), st.floats(0.0, PEAK)),
                                                min_size=1, max_size=8))
def test_no_order_of_the_bytes_leaves_fewer_credits_than_the_accounting(d0: float,
                                                                        chunks: list[tuple[float, float]]) -> None:
    """Whatever the traffic did while the agent was down (any rates up to the peak, in any order), the real
    deficit is at most what the accounting says: the restart never claims credit the bucket may not hold."""
    seconds = sum(s for s, _ in chunks)
    moved = sum(s * r for s, r in chunks)
    assert simulate(d0, chunks) <= gap_deficit(d0, seconds, moved, BASE, PEAK) + 1e-6 * BUCKET
    # and the accounting is itself one of those orders (idle first, then the same bytes at the peak)
    t = moved / PEAK
    assert simulate(d0, [(seconds - t, 0.0), (t, PEAK)]) == pytest.approx(
        gap_deficit(d0, seconds, moved, BASE, PEAK), abs=1e-6 * BUCKET + (PEAK - BASE) * 0.01)


def test_account_gap_clamps_to_the_bucket_and_skips_unknown_counters() -> None:
    est = CreditEstimator(BASE, BUCKET)
    est.buckets["out"].deficit = 1000.0
    est.buckets["in"].deficit = 700.0
    est.account_gap(2.0, {"out": 2 * PEAK, "in": None}, PEAK)
    assert est.buckets["out"].deficit == BUCKET            # 1000 + 400 spent: empty, not below
    assert est.buckets["in"].deficit == 700.0              # counters unusable: the saved deficit stays


def test_movement_since_a_save() -> None:
    est = CreditEstimator(BASE, BUCKET)
    saved = est.to_state()
    assert est.movement(saved) == 0.0
    est.buckets["in"].deficit = 0.5 * SAVE_MOVEMENT_FRACTION * BUCKET
    est.buckets["out"].deficit = 2 * SAVE_MOVEMENT_FRACTION * BUCKET
    assert est.movement(saved) == pytest.approx(2 * SAVE_MOVEMENT_FRACTION)
    est.buckets["out"].deficit = 0.0
    est.buckets["out"].bucket = 1.5 * BUCKET               # a learned size moves the estimate too
    assert est.movement(saved) == pytest.approx(0.5 / 1.5)
    assert math.isinf(est.movement({}))
