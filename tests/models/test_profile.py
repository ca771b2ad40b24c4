"""Which source wins for baseline, peak and bucket (table-driven), and the no-bucket sizes."""

from __future__ import annotations

from typing import Optional

import pytest

from agent.config import BandwidthConfig
from agent.models.catalogue import NetworkCard, TypeEntry, load_catalogue
from agent.models.profile import (
    DEFAULT_BUCKET_SECONDS,
    GBIT,
    BandwidthProfile,
    CardBandwidth,
    resolve_profile,
)


def entry(baseline: Optional[float], peak: Optional[float], name: str = "m5.large") -> TypeEntry:
    return TypeEntry(name, 2, "Up to 10 Gigabit", "required", False, 1, 0, (NetworkCard(0, baseline, peak),))


API = entry(0.8, 12.0)          # distinct from the catalogue's so the winner is visible
CAT = entry(0.75, 10.0)
CONF = BandwidthConfig(baseline_gbps=0.5, peak_gbps=5.0, burst_bucket_gbit=2700.0)
NONE = BandwidthConfig()

# (config, api, catalogue) -> (baseline Gbit/s, source), (peak, source), (bucket Gbit, source). The agent's
# own learned bucket is not the profile's: the credit model restores it (tests/credits/test_feed.py).
CASES = [
    ("config wins everything", CONF, API, CAT, (0.5, "config"), (5.0, "config"), (2700.0, "config")),
    ("api; default bucket = 1 h of baseline", NONE, API, CAT, (0.8, "api"), (12.0, "api"),
     (0.8 * 3600, "default")),
    ("catalogue only", NONE, None, CAT, (0.75, "catalogue"), (10.0, "catalogue"), (2700.0, "default")),
    ("api without bandwidth falls to catalogue", NONE, entry(None, None), CAT, (0.75, "catalogue"),
     (10.0, "catalogue"), (2700.0, "default")),
    ("config baseline only mixes with catalogue peak", BandwidthConfig(baseline_gbps=1.0), None, CAT,
     (1.0, "config"), (10.0, "catalogue"), (3600.0, "default")),
    ("config bucket with catalogue bandwidth", BandwidthConfig(burst_bucket_gbit=100.0), None, CAT,
     (0.75, "catalogue"), (10.0, "catalogue"), (100.0, "config")),
    ("nothing known", NONE, None, None, (None, "none"), (None, "none"), (None, "none")),
    ("peak unknown: no default bucket", BandwidthConfig(baseline_gbps=1.0), None, None,
     (1.0, "config"), (None, "none"), (None, "none")),
    ("baseline = peak: never exhausts", NONE, None, entry(100.0, 100.0), (100.0, "catalogue"),
     (100.0, "catalogue"), (None, "none")),
    ("baseline = peak ignores a config bucket", BandwidthConfig(burst_bucket_gbit=5.0), None,
     entry(25.0, 25.0), (25.0, "catalogue"), (25.0, "catalogue"), (None, "none")),
]


@pytest.mark.parametrize(("conf", "api", "cat", "baseline", "peak", "bucket"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_precedence(conf: BandwidthConfig, api: Optional[TypeEntry], cat: Optional[TypeEntry],
                    baseline: tuple, peak: tuple, bucket: tuple) -> None:
    p = resolve_profile("m5.large", conf, api, cat)

    def gbit(v: Optional[float]) -> Optional[float]:
        return None if v is None else round(v / GBIT, 9)

    assert (gbit(p.baseline_bytes_per_second), p.baseline_source) == baseline
    assert (gbit(p.peak_bytes_per_second), p.peak_source) == peak
    assert (gbit(p.bucket_bytes), p.bucket_source) == bucket
    assert p.bursts == (bucket[0] is not None and bucket[0] > 0 and peak[0] is not None
                        and baseline[0] is not None and peak[0] > baseline[0])


FLEET = 456e9

# (config, fleet) -> bucket (Gbit, source): config > fleet > default here; the agent's own learned size
# ranks between config and fleet, restored by the credit model (tests/credits/test_feed.py, docs/fleet.md)
FLEET_CASES = [
    ("fleet over the default", NONE, FLEET, (FLEET / GBIT, "fleet")),
    ("config over the fleet", BandwidthConfig(burst_bucket_gbit=100.0), FLEET, (100.0, "config")),
    ("no fleet figure: the default", NONE, None, (2700.0, "default")),
    ("a non-positive fleet figure is none", NONE, 0.0, (2700.0, "default")),
]


@pytest.mark.parametrize(("conf", "fleet", "bucket"), [c[1:] for c in FLEET_CASES],
                         ids=[c[0] for c in FLEET_CASES])
def test_fleet_precedence(conf: BandwidthConfig, fleet: Optional[float], bucket: tuple) -> None:
    p = resolve_profile("m5.large", conf, None, CAT, fleet_bucket_bytes=fleet)
    assert (round(p.bucket_bytes / GBIT, 9), p.bucket_source) == bucket     # type: ignore[operator]


def test_a_fleet_bucket_gives_no_bucket_to_a_size_that_never_exhausts() -> None:
    p = resolve_profile("m5.large", NONE, None, entry(25.0, 25.0), fleet_bucket_bytes=FLEET)
    assert p.bucket_bytes is None and p.bucket_source == "none" and p.never_exhausts


def test_units_are_bytes() -> None:
    p = resolve_profile("m5.large", NONE, None, CAT)
    assert p.baseline_bytes_per_second == 93_750_000.0       # 0.75 Gbit/s = 0.75e9 / 8 bytes/s
    assert p.peak_bytes_per_second == 1_250_000_000.0
    assert p.bucket_bytes == 93_750_000.0 * DEFAULT_BUCKET_SECONDS


def test_default_bucket_matches_seed_000_r4_large() -> None:
    """Seed 000: r4.large holds ~2700 Gbit at a 0.75 Gbit/s baseline; 1 h of baseline gives the same."""
    p = resolve_profile("r4.large", NONE, None, load_catalogue()["r4.large"])
    assert p.bucket_source == "default"
    assert p.bucket_bytes is not None and abs(p.bucket_bytes / GBIT - 2700.0) < 1e-6


def test_no_bucket_size_says_never_exhausts() -> None:
    p = resolve_profile("c6gn.16xlarge", NONE, None, load_catalogue()["c6gn.16xlarge"])
    assert p.bucket_bytes is None and p.bucket_source == "none"
    assert not p.bursts and p.never_exhausts
    q = resolve_profile("m5.large", NONE, None, CAT)
    assert q.bursts and not q.never_exhausts
    assert not BandwidthProfile().never_exhausts and not BandwidthProfile().bursts


def test_peak_below_baseline_from_mixed_sources_is_raised_with_a_note() -> None:
    p = resolve_profile("m5.large", BandwidthConfig(baseline_gbps=20.0), None, CAT)
    assert p.peak_bytes_per_second == p.baseline_bytes_per_second == 20 * GBIT
    assert p.peak_source == "config" and p.bucket_source == "none"
    assert p.notes and "below baseline" in p.notes[0]


def test_multi_card_profile_uses_card_0_and_keeps_the_rest() -> None:
    cat = TypeEntry("x.metal", 128, "2x 100 Gigabit", "required", True, 2, 0,
                    (NetworkCard(0, 100.0, 100.0), NetworkCard(1, 50.0, 100.0)))
    p = resolve_profile("x.metal", NONE, None, cat)
    assert p.baseline_bytes_per_second == 100 * GBIT and p.cards_source == "catalogue"
    assert p.cards == (CardBandwidth(0, 100 * GBIT, 100 * GBIT), CardBandwidth(1, 50 * GBIT, 100 * GBIT))
    api = TypeEntry("x.metal", 128, "2x 100 Gigabit", "required", True, 2, 0,
                    (NetworkCard(0, 90.0, 100.0), NetworkCard(1, 90.0, 100.0)))
    assert resolve_profile("x.metal", NONE, api, cat).cards_source == "api"


def test_real_multi_card_type() -> None:
    p = resolve_profile("p4d.24xlarge", NONE, None, load_catalogue()["p4d.24xlarge"])
    assert [c.network_card for c in p.cards] == [0, 1, 2, 3]
    assert p.baseline_bytes_per_second == 100 * GBIT and p.never_exhausts
