"""The bucket as a band and the forecast as a band (agent/models/credit_band.py; docs/credits.md)."""

from __future__ import annotations

import json
import math

import pytest

from agent.models import credit_band as cb
from agent.models.credit_model import CreditEstimator
from tests.support import credit_band_zoo as zoo
from tests.support import credit_ec2 as ce

GBIT = 1e9 / 8
HOUR = 2700 * GBIT           # r4.large: one hour of 0.75 Gbit/s


def test_the_prior_before_any_exhaustion_spans_the_public_measurements() -> None:
    band = cb.BucketBand().band(HOUR, HOUR, "default")
    assert (band.low, band.high, band.source, band.observations) == (0.2 * HOUR, 3.0 * HOUR, "default", 0)


def test_exhaustions_narrow_the_band_around_what_they_measured() -> None:
    sizes = cb.BucketBand()
    for v in (2700, 1665, 2400):
        assert sizes.observe(v * GBIT, HOUR, "learned") is False
    band = sizes.band(2200 * GBIT, HOUR, "learned")
    assert band.low == pytest.approx(0.4 * 1665 * GBIT) and band.high == pytest.approx(1.6 * 2700 * GBIT)
    assert (band.source, band.observations) == ("learned", 3)
    assert cb.learned_note(band) == "learned \u00d73"


def test_only_the_recent_exhaustions_are_kept() -> None:
    sizes = cb.BucketBand()
    for k in range(20):
        sizes.observe((1000 + k) * GBIT, HOUR, "learned")
    assert len(sizes.observations) == cb.OBSERVATIONS_KEPT and sizes.observations[-1] == 1019 * GBIT


def test_a_configured_bucket_is_the_belief_and_a_contradiction_is_counted() -> None:
    sizes = cb.BucketBand()
    assert sizes.band(HOUR, HOUR, "config").low == sizes.band(HOUR, HOUR, "config").high == HOUR
    assert sizes.observe(0.97 * HOUR, HOUR, "config") is False
    assert sizes.observe(0.5 * HOUR, HOUR, "config") is True
    band = sizes.band(HOUR, HOUR, "config")
    assert (band.low, band.high, band.source, sizes.contradictions) == (0.5 * HOUR, HOUR, "config", 1)


def test_a_size_learned_from_an_overrun_is_a_lower_bound() -> None:
    band = cb.BucketBand().band(4000 * GBIT, HOUR, "learned", lower_bound=True)
    assert band.low == 4000 * GBIT and band.high == 3.0 * HOUR


@pytest.mark.parametrize("text,want", [("", []), (None, []), ("2700 1665", [2700 * GBIT, 1665 * GBIT]),
                                       ("x 1", []), ("-5 inf 10", [10 * GBIT]), (7, [7 * GBIT])])
def test_the_saved_sizes_load_and_garbage_starts_from_the_prior(text: object, want: list[float]) -> None:
    sizes = cb.BucketBand()
    sizes.restore(text)
    assert sizes.observations == pytest.approx(want)


def test_the_sizes_survive_a_save_and_old_files_load() -> None:
    est = CreditEstimator(0.75 * GBIT, HOUR)
    est.buckets["out"].sizes.observe(1665 * GBIT, HOUR, "default")
    saved = json.loads(json.dumps(est.to_state()))
    assert saved["out"]["sizes"] == "1665"
    again = CreditEstimator(0.75 * GBIT, HOUR)
    again.restore(saved)
    assert again.buckets["out"].sizes.observations == pytest.approx([1665 * GBIT])
    old = CreditEstimator(0.75 * GBIT, HOUR)
    old.restore({d: {k: v for k, v in s.items() if k != "sizes"} for d, s in saved.items()})
    assert old.buckets["out"].sizes.observations == []
    # kept per type across boots (learned-buckets.json) with the source the size had
    assert again.learned_buckets() == {"out": {"bucket": HOUR, "learned_count": 0, "learn_method": "none",
                                               "sizes": "1665", "bucket_source": "default"}}


def test_the_band_holds_the_point_forecasts() -> None:
    """earliest <= the sooner point forecast <= ... and latest >= earliest, on a steady drain."""
    w = zoo._world(ce.SIZES[0], 1.0)
    readings = [s.reading for s in w.run(ce.steady(5 * GBIT), 120.0)[10:]]
    assert len(readings) >= 100
    for r in readings:
        assert r.exhaustion_earliest_seconds <= min(r.exhaustion_seconds, r.exhaustion_trend_seconds) + 1e-6
        assert r.exhaustion_latest_seconds >= r.exhaustion_earliest_seconds
        assert 0.0 <= r.remaining_low_ratio <= r.ratio <= r.remaining_high_ratio <= 1.0


def test_a_pause_of_a_cycle_not_yet_seen_leaves_latest_at_inf() -> None:
    band = cb.Band(0.2 * HOUR, 3 * HOUR, "default", 0)
    early, late = cb.band_forecast(band, 100 * GBIT, HOUR - 100 * GBIT, math.inf, math.inf, 9.25 * GBIT,
                                   4 * GBIT, False, False)
    assert early == pytest.approx(440 / 9.25) and math.isinf(late)
    assert cb.band_forecast(band, 0.0, HOUR, math.inf, math.inf, 0.0, 0.0, False, False) == (math.inf, math.inf)
    assert cb.band_forecast(band, HOUR, 0.0, 0.0, 0.0, 0.0, 0.0, True, True) == (0.0, 0.0)


def test_the_zoo_short() -> None:
    """A few shapes per kind at both sizes (`python -m tests.support.credit_band_zoo` runs them all): the true
    empty moment inside the band in >= 90 % of samples, a page before the cliff (>= 60 s when the drain lasts
    3 min), none on traffic at or under the baseline."""
    rows = zoo.zoo(short=True)
    misses = [r.row() for r in rows if r.drain is not None and not (
        r.coverage is not None and r.coverage >= zoo.COVERAGE_TARGET and r.lead is not None
        and r.lead > (zoo.LEAD_TARGET if r.drain >= zoo.LONG_DRAIN else 0.0))]
    assert not misses, misses
    quiet = [r.row() for r in rows if r.drain is None and "then idle" not in r.shape and (r.pages or r.low_pages)]
    assert not quiet, quiet


def test_a_fleet_belief_takes_the_fleets_spread() -> None:
    from agent.models.fleet import LearnedRecord, consensus

    recs = [LearnedRecord(iid, "out", v * GBIT, 1000.0, 0.75 * GBIT, f"k{iid}")
            for iid, v in (("i-1", 1665), ("i-2", 2700), ("i-3", 2400))]
    c = consensus(recs, min_instances=2, now=2000.0, max_age_seconds=10_000.0)
    assert c is not None and (c.low, c.bucket_bytes, c.high) == (1665 * GBIT, 2400 * GBIT, 2700 * GBIT)
    est = CreditEstimator(0.75 * GBIT, c.bucket_bytes, "fleet")
    est.set_fleet_spread((c.low, c.high))
    r = est.update(1.0, {"out": 0.0}, {"out": 0.0}, None)["out"]
    assert (r.bucket_low_bytes, r.bucket_high_bytes, r.band_source) == \
        (pytest.approx(0.4 * 1665 * GBIT), pytest.approx(1.6 * 2700 * GBIT), "fleet")
    # without the spread (an older fleet object set), the learned margins around the fleet's median
    plain = CreditEstimator(0.75 * GBIT, c.bucket_bytes, "fleet").update(1.0, {"out": 0.0}, {"out": 0.0}, None)
    assert plain["out"].bucket_low_bytes == pytest.approx(0.4 * 2400 * GBIT)
