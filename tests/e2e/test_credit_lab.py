"""The credit lab end to end: the real agent beside a tbf shaper that behaves like EC2's.

Targets (issue 4) are asserted here with a little slack for a loaded CI machine; `make bench`
prints the exact figures against the targets.
"""

from __future__ import annotations

import pytest

from tests.conftest import require_root_tools
from tests.support import credit_scenarios as cs

pytestmark = [pytest.mark.netns, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _tools() -> None:
    require_root_tools("ip", "tc", "ethtool", "prometheus")


def test_out_forecast_idle_restart_and_alert_fire_before_the_clamp() -> None:
    fig = cs.forecast_idle_restart("out", with_prometheus=True)
    assert 4.0 < fig["drain_seconds"] < 8.0, fig  # the lab is scaled to a ~6 s drain
    assert abs(fig["forecast_error_seconds"]) <= 1.5 * fig["forecast_tolerance_seconds"], fig
    assert fig["exhausted_flag"] == 1.0, fig
    assert abs(fig["idle_error_ratio"]) <= 0.10, fig
    assert abs(fig["restart_error_ratio"]) <= 0.05, fig
    assert fig["alert_lead_seconds"] > 0, fig


def test_in_direction_through_an_ifb_shaper() -> None:
    fig = cs.forecast_idle_restart("in")
    assert abs(fig["forecast_error_seconds"]) <= 1.5 * fig["forecast_tolerance_seconds"], fig
    assert abs(fig["idle_error_ratio"]) <= 0.10, fig
    assert abs(fig["restart_error_ratio"]) <= 0.05, fig


def test_learns_a_bucket_twice_too_large_after_one_exhaustion() -> None:
    fig = cs.learn_bucket("out")
    assert abs(fig["learned_bucket_ratio"] - 1.0) <= 0.20, fig
    assert fig["learned_count"] == 1, fig
    assert abs(fig["forecast_error_seconds"]) <= 1.5 * fig["forecast_tolerance_seconds"], fig
