"""The one reckoning of what a test costs, shared by the probe scheduler and the responder's credit guard."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from agent.config import ProbeConfig
from agent.models.catalogue import load_catalogue
from agent.models.credit_model import CreditReading
from agent.models.probe_cost import (
    COST_LINE,
    below_floor,
    burstable,
    credit_state,
    crosses_floor,
    expected_test_bytes,
    hourly_cost,
    median_burstable,
    over_budget,
    rate_cap,
    stream_bitrate,
    worst_fraction,
)

ROOT = Path(__file__).resolve().parents[2]

PEAK = 1.25e9  # 10 Gbit/s in bytes per second


@pytest.mark.parametrize(("duration", "peak", "bitrate", "streams", "nbytes", "want"), [
    (5.0, PEAK, 0, 4, 0, 6.25e9),                    # duration x peak, whatever the streams
    (5.0, PEAK, 100e6, 4, 0, 100e6 / 8 * 4 * 5),     # -b is per stream, and smaller than the peak
    (5.0, PEAK, 10e9, 4, 0, 6.25e9),                 # a -b above the peak: the shaper's peak bounds it
    (5.0, PEAK, 0, 1, 1e6, 1e6),                     # -n smaller than duration x peak
    (5.0, None, 0, 1, 0, None),                      # nothing bounds it
    (5.0, 0.0, 0, 1, 0, None),
    (5.0, None, 8e6, 2, 0, 10e6),                    # no peak: the client's rate still bounds it
    (5.0, None, 0, 1, 3e6, 3e6),
])
def test_expected_test_bytes(duration: float, peak: Optional[float], bitrate: float, streams: int,
                             nbytes: float, want: Optional[float]) -> None:
    got = expected_test_bytes(duration, peak, bitrate_bits_per_second=bitrate, streams=streams, nbytes=nbytes)
    assert got == pytest.approx(want) if want is not None else got is None


def test_floor() -> None:
    assert below_floor(49.0, 100.0, 0.5) and not below_floor(50.0, 100.0, 0.5)
    assert crosses_floor(60.0, 100.0, 11.0, 0.5) and not crosses_floor(60.0, 100.0, 10.0, 0.5)
    assert crosses_floor(5.0, 100.0, 6.0, 0.0)       # a floor of 0 still forbids emptying the bucket
    assert not crosses_floor(5.0, 100.0, 5.0, 0.0)


def test_budget() -> None:
    assert not over_budget(0.0, 10.0, 10.0)
    assert over_budget(1.0, 10.0, 10.0)              # used + expected over the budget
    assert over_budget(10.0, None, 10.0)             # spent, whatever the next test
    assert not over_budget(9.0, None, 10.0)          # unknown size: only "spent already" counts
    assert over_budget(0.0, None, 0.0)               # 0 allows nothing


def test_credit_state_takes_readings_or_pairs_and_the_lowest_card() -> None:
    def reading(d: str, remaining: Optional[float], bucket: Optional[float]) -> CreditReading:
        ratio = remaining / bucket if remaining is not None and bucket else None
        return CreditReading(d, 0.0, remaining, bucket, ratio, float("inf"), float("inf"))

    assert credit_state(None) == {}
    assert credit_state({"in": (30.0, 100.0)}) == {"in": (30.0, 100.0)}
    assert credit_state({"in": reading("in", 30.0, 100.0), "out": reading("out", None, None)}) == {
        "in": (30.0, 100.0)}
    assert credit_state({"in:0": reading("in", 90.0, 100.0), "in:1": reading("in", 10.0, 100.0)}) == {
        "in": (10.0, 100.0)}
    assert credit_state({"out": (-5.0, 100.0), "in": (1.0, float("inf"))}) == {"out": (0.0, 100.0)}


# -- what a schedule costs (docs/probe-scheduling.md, "What probes cost") ------------------------------------
M5_BASE, M5_PEAK = 0.75e9 / 8, 10e9 / 8


def test_rate_cap_and_stream_bitrate() -> None:
    assert rate_cap("baseline", M5_BASE) == M5_BASE
    assert rate_cap("baseline", None) is None and rate_cap("baseline", 0.0) is None
    assert rate_cap("peak", M5_BASE) is None
    assert stream_bitrate(M5_BASE, 4) == 187_500_000           # 0.75 Gbit/s over 4 streams
    assert stream_bitrate(M5_BASE, 3) * 3 <= M5_BASE * 8       # rounded down: the streams stay under the cap
    assert stream_bitrate(0.01, 4) == 1                        # never 0, which iperf3 reads as "unlimited"


def test_old_defaults_cost_what_the_issue_says_on_m5_large() -> None:
    # Issue #14: 900 s, 5 s at the peak, both directions: ~7 % of a direction's refill as the prober,
    # as much again as the responder. 4 x 5 s x 10 Gbit/s = 200 Gbit of 2700 Gbit = 7.4 % per role.
    costs = hourly_cost(ProbeConfig(rate="peak"), M5_BASE, M5_PEAK)
    for d in ("in", "out"):
        c = costs[d]
        assert (c.own_probes, c.served_probes) == (4.0, 4.0)
        assert c.bytes_per_probe == pytest.approx(6.25e9)
        assert c.fraction == pytest.approx(2 * 200 / 2700)
        assert c.credit_per_probe == pytest.approx(5 * 9.25e9 / 8)   # 46.25 Gbit above the refill
    assert worst_fraction(costs) == pytest.approx(0.148, abs=1e-3)


def test_baseline_rate_costs_the_same_share_on_every_size() -> None:
    for base, peak in ((0.064, 5.0), (0.75, 10.0), (2.5, 10.0), (25.0, 25.0)):
        costs = hourly_cost(ProbeConfig(), base * 1.25e8, peak * 1.25e8)
        assert worst_fraction(costs) == pytest.approx(2 * 4 * 5 / 3600)
        assert {c.credit_per_probe for c in costs.values()} == {0.0}


def test_directions_split_between_own_and_served() -> None:
    # Probing only outward: our out bucket pays for our probes, our in bucket for the peers' (their out).
    costs = hourly_cost(ProbeConfig(directions=["out"], interval=600.0, peers_per_round=2), M5_BASE, M5_PEAK)
    assert (costs["out"].own_probes, costs["out"].served_probes) == (12.0, 0.0)
    assert (costs["in"].own_probes, costs["in"].served_probes) == (0.0, 12.0)
    assert costs["in"].bytes_per_hour == costs["out"].bytes_per_hour == pytest.approx(12 * 5 * M5_BASE)


def test_unknown_figures_give_no_fraction() -> None:
    assert worst_fraction(hourly_cost(ProbeConfig(), None, M5_PEAK)) is None   # no refill to compare with
    c = hourly_cost(ProbeConfig(rate="peak"), None, None)["out"]
    assert c.bytes_per_hour is None and c.fraction is None


def test_median_burstable_type_is_the_middle_by_baseline() -> None:
    entries = list(load_catalogue().values())
    bursting = burstable(entries)
    median = median_burstable(entries)
    assert all(e.peak_gbps > e.baseline_gbps for e in bursting)  # type: ignore[operator]
    below = sum(1 for e in bursting if (e.baseline_gbps or 0) < (median.baseline_gbps or 0))
    above = sum(1 for e in bursting if (e.baseline_gbps or 0) > (median.baseline_gbps or 0))
    assert below <= len(bursting) // 2 and above <= len(bursting) // 2
    with pytest.raises(ValueError):
        median_burstable([])


def test_default_schedule_meets_the_cost_line_on_the_median_burstable_type() -> None:
    median = median_burstable(load_catalogue().values())
    assert median.baseline_gbps is not None and median.peak_gbps is not None
    base, peak = median.baseline_gbps * 1.25e8, median.peak_gbps * 1.25e8
    worst = worst_fraction(hourly_cost(ProbeConfig(), base, peak))
    assert worst is not None and worst <= COST_LINE
    # ... which the old defaults (the same schedule at the peak) did not.
    old = worst_fraction(hourly_cost(ProbeConfig(rate="peak"), base, peak))
    assert old is not None and old > COST_LINE


def test_cost_table_in_the_docs_is_generated_from_the_defaults() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_probe_cost.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
