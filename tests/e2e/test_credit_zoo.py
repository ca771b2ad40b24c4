"""The traffic zoo end to end: shapes of traffic against the real agent, a tbf shaper and a real Prometheus.

`make test` runs a representative subset of tests/support/credit_zoo.py's shapes per direction (about two
and a half minutes on a quiet 2-core machine); `make bench` runs the whole zoo and prints its table. The
targets are issue 12's, asserted with slack for a loaded machine; the exact figures are in docs/credits.md.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.conftest import require_root_tools
from tests.support import credit_zoo as cz

pytestmark = [pytest.mark.netns, pytest.mark.slow]


@pytest.fixture(scope="module")
def zoo() -> Iterator[cz.Zoo]:
    require_root_tools("ip", "tc", "ethtool", "prometheus")
    z = cz.Zoo()
    try:
        yield z
    finally:
        z.close()


def never_exhausted(res: cz.Result) -> None:
    """Traffic that never empties the shaper: no exhaustion, nothing learned, no credit alert."""
    assert res.empty is None, res.story()
    assert res.exhausted_samples == 0 and res.learned == 0, res.story()
    assert res.false_alarms == 0, (res.story(), res.alerts)


# -- out: steady, on/off drain, microbursts, bursty traffic under the baseline, a restart ------------------

def test_steady_drain_forecasts_alerts_and_clamps(zoo: cz.Zoo) -> None:
    res = cz.steady(zoo, "out")
    assert res.empty is not None and 4.0 < res.empty - res.drain_start < 8.0, res.story()  # a ~6-s drain
    # forecast within max(0.5 s, 10 %) from 1 s in (instant) and a window in (trend)
    assert (res.instant_hit or 0) >= 0.7 and (res.trend_hit or 0) >= 0.7, res.story()
    assert res.alert_lead is not None and res.alert_lead > 0, (res.story(), res.alerts)
    assert res.exhausted_samples > 0 and res.false_exhaustions == 0, res.story()
    assert res.learned == 0, res.story()                   # the model agreed with the shaper: nothing to learn


def on_off_drain(res: cz.Result) -> None:
    """Issue 12's target is 80 % of the trend forecasts within max(1 s, 15 %) (`make bench BENCH=zoo`: 100 %
    on every on/off drain); the lab's traffic is only as regular as a loaded machine lets it be
    (docs/credits.md), so here: 70 %, better than the instant forecast, never "never" once a window of the
    drain has passed, and the alert fired before empty."""
    assert res.empty is not None, res.story()
    assert (res.trend_hit or 0) >= 0.7 and (res.trend_hit or 0) > (res.instant_hit or 0), res.story()
    assert res.trend_inf == 0, res.story()
    assert res.alert_lead is not None and res.alert_lead > 0, (res.story(), res.alerts)
    assert res.false_exhaustions == 0, res.story()


def test_on_off_drain_the_trend_holds_where_the_instant_forecast_flips(zoo: cz.Zoo) -> None:
    on_off_drain(cz.on_off(zoo, "out", 0.6, 0.4))


def test_near_baseline_microbursts_shaped_at_the_peak_are_no_exhaustion(zoo: cz.Zoo) -> None:
    res = cz.microbursts(zoo, "out", 0.9, seconds=13.0)
    assert res.extra["shaped"] >= 0.5, res.story()         # the ambiguous shape: shaped most of the time
    assert res.min_ratio >= 0.9, res.story()
    never_exhausted(res)


def test_bursts_averaging_under_the_baseline_page_nobody(zoo: cz.Zoo) -> None:
    res = cz.on_off(zoo, "out", 0.2, 0.8, never_seconds=12.0)
    assert res.min_ratio >= 0.9, res.story()
    never_exhausted(res)


def test_a_drain_across_a_sigkill_continues_within_5_percent(zoo: cz.Zoo) -> None:
    """At the default save_interval (5 s): only saving on movement keeps the restart close; the trend goes on
    from its saved history."""
    res = cz.restart(zoo, "out")
    assert abs(res.extra["restart-err"]) <= 0.05, res.story()
    # the trend's history survives the restart: most of its forecasts are right from the first sample on
    assert res.extra.get("restart-trend", 0.0) >= 0.5, res.story()
    assert res.empty is not None and res.exhausted_samples > 0 and res.false_exhaustions == 0, res.story()


# -- in (through the IFB shaper): a partial bucket, another duty cycle, microbursts -----------------------

def test_in_idle_then_burst_from_a_partial_bucket(zoo: cz.Zoo) -> None:
    res = cz.idle_then_burst(zoo, "in")
    assert abs(res.extra["idle-err"]) <= 0.10, res.story()
    assert (res.instant_hit or 0) >= 0.6, res.story()
    assert res.false_exhaustions == 0 and res.learned == 0, res.story()


def test_in_on_off_drain(zoo: cz.Zoo) -> None:
    on_off_drain(cz.on_off(zoo, "in", 0.3, 0.2))


def test_in_microbursts(zoo: cz.Zoo) -> None:
    res = cz.microbursts(zoo, "in", 0.9, seconds=13.0)
    assert res.extra["shaped"] >= 0.5 and res.min_ratio >= 0.9, res.story()
    never_exhausted(res)
