"""PpsCeilingModel: learning the ceiling from sustained PPS drops, never from bandwidth shaping or one-off
bursts; persistence; the issue 22 targets on simulated shapers at lab and EC2 time scales."""

from __future__ import annotations

import random

import pytest

from agent.models.pps import (
    PpsCeilingModel,
    bandwidth_explains,
    near_ceiling,
)


def shaper(ceiling: float, offered: list[float], dt: float, burst: float, seed: int = 3
           ) -> list[tuple[float, int]]:
    """A token-bucket packet limiter (nft `limit rate over`, or EC2's PPS allowance): per sample of `dt`,
    the offered packets (±5 % jitter) -> (passed, dropped)."""
    rng = random.Random(seed)
    tokens = burst
    out = []
    for rate in offered:
        want = rate * dt * (1 + rng.uniform(-0.05, 0.05))
        avail = tokens + ceiling * dt
        passed = min(want, avail)
        tokens = min(burst, avail - passed)
        out.append((passed, int(want - passed)))
    return out


@pytest.mark.parametrize("ceiling,dt,burst", [(2_000.0, 0.2, 5.0), (500_000.0, 1.0, 50_000.0)])
def test_learns_the_ceiling_within_ten_percent(ceiling: float, dt: float, burst: float) -> None:
    offered = [0.3 * ceiling] * 10 + [1.6 * ceiling] * 20 + [0.3 * ceiling] * 10 + [2.5 * ceiling] * 15
    m = PpsCeilingModel()
    r = None
    for passed, dropped in shaper(ceiling, offered, dt, burst):
        r = m.observe(dt, passed, dropped, bandwidth_explained=False)
    assert r is not None and r.ceiling is not None and r.source == "learned"
    assert abs(r.ceiling - ceiling) / ceiling <= 0.10, r
    assert r.learned_count == 2
    assert r.headroom_ratio == pytest.approx(r.pps / r.ceiling)


def test_no_ceiling_when_bandwidth_shaping_explains_the_drops() -> None:
    ceiling, dt = 2_000.0, 0.2
    m = PpsCeilingModel()
    for passed, dropped in shaper(ceiling, [3 * ceiling] * 50, dt, 5.0):
        r = m.observe(dt, passed, dropped, bandwidth_explained=bandwidth_explains(True, None))
        assert r.explained_by_bandwidth
    assert r.ceiling is None and r.learned_count == 0 and r.exceeded_total > 0
    # near the baseline without the counter rising explains it too
    assert bandwidth_explains(False, 0.97) and not bandwidth_explains(False, 0.5)
    assert not bandwidth_explains(False, None)


def test_one_off_bursts_teach_nothing() -> None:
    m = PpsCeilingModel()
    for i in range(100):
        # a burst every 5th sample drops packets in that sample only; the average rate is far under the ceiling
        r = m.observe(1.0, 1_000.0, 50 if i % 5 == 0 else 0, False)
    assert r.ceiling is None and r.learned_count == 0
    # two samples in a row are still a burst
    m.observe(1.0, 900.0, 40, False)
    r = m.observe(1.0, 900.0, 40, False)
    assert r.ceiling is None


def test_a_trickle_of_drops_is_not_a_ceiling() -> None:
    m = PpsCeilingModel()
    for _ in range(20):
        r = m.observe(1.0, 100_000.0, 3, False)    # 3 drops out of 100,000 passed: microbursts
    assert r.ceiling is None


def test_an_episode_interrupted_by_bandwidth_shaping_starts_again() -> None:
    m = PpsCeilingModel()
    for bw in (False, False, True, False, False):
        r = m.observe(1.0, 1000.0, 500, bw)
    assert r.ceiling is None
    r = m.observe(1.0, 1000.0, 500, False)
    assert r.ceiling == pytest.approx(1000.0) and r.learned_count == 1


def test_ceiling_is_the_largest_recent_episode_and_near_ceiling() -> None:
    m = PpsCeilingModel()
    for rate in (800.0, 1000.0, 900.0):
        for _ in range(4):
            m.observe(1.0, rate, 100, False)
        m.observe(1.0, 10.0, 0, False)
    r = m.observe(1.0, 950.0, 0, False)
    assert r.ceiling == pytest.approx(1000.0) and r.learned_count == 3
    assert near_ceiling(r) and not near_ceiling(m.observe(1.0, 500.0, 0, False))


def test_state_round_trip() -> None:
    m = PpsCeilingModel()
    for _ in range(4):
        m.observe(0.5, 600.0, 100, False)
    n = PpsCeilingModel()
    n.restore(m.to_state())
    r = n.observe(1.0, 600.0, 0, False)
    assert r.ceiling == pytest.approx(1200.0) and r.source == "restored" and r.learned_count == 1
    bad = PpsCeilingModel()
    bad.restore({"candidates": ["x", -1, float("nan"), True], "learned_count": "2"})
    assert bad.ceiling is None and bad.source == "none" and bad.learned_count == 0
