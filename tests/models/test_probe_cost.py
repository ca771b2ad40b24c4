"""The one reckoning of what a test costs, shared by the probe scheduler and the responder's credit guard."""

from __future__ import annotations

from typing import Optional

import pytest

from agent.models.credit_model import CreditReading
from agent.models.probe_cost import below_floor, credit_state, crosses_floor, expected_test_bytes, over_budget

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
